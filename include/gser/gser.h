/* gser — GPU-aware serialization: the whole public API.
 *
 * Include this one header. See README.md for a tour and docs/ for the wire
 * format and the user guide.
 */
#ifndef GSER_GSER_H
#define GSER_GSER_H

#include "gser/context.h"
#include "gser/defs.h"
#include "gser/device.h"
#include "gser/serialize.h"
#include "gser/value.h"

#define GSER_VERSION_MAJOR 0
#define GSER_VERSION_MINOR 1
#define GSER_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/** The library's version as "MAJOR.MINOR.PATCH". */
GSER_API const char *gser_version_string(void);

#ifdef __cplusplus
}
#endif

#endif /* GSER_GSER_H */
