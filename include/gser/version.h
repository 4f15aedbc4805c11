/* gser — the version, written here once: CMake reads it from this file. */
#ifndef GSER_VERSION_H
#define GSER_VERSION_H

#define GSER_VERSION_MAJOR 0
#define GSER_VERSION_MINOR 2
#define GSER_VERSION_PATCH 0

/** MAJOR * 10000 + MINOR * 100 + PATCH, for #if checks. */
#define GSER_VERSION_NUMBER (GSER_VERSION_MAJOR * 10000 + GSER_VERSION_MINOR * 100 + GSER_VERSION_PATCH)

#endif /* GSER_VERSION_H */
