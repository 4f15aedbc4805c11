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
#include "gser/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The version of the library loaded at run time, as "MAJOR.MINOR.PATCH"
 *  (GSER_VERSION_* are the headers' own). */
GSER_API const char *gser_version_str(void);

#ifdef __cplusplus
}
#endif

#endif /* GSER_GSER_H */
