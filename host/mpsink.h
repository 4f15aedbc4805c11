/* The growable buffer msgpack-c's pack template writes into, and the template
 * instantiated on it (pk_*): one sink for the core's encoder (host/encode.c)
 * and the Python module's direct path (plugins/python/src/direct.c), so that
 * the same calls give the same bytes in both. Include once per file, after
 * <msgpack/pack_define.h> and <msgpack/timestamp.h>. */
#ifndef GSER_HOST_MPSINK_H
#define GSER_HOST_MPSINK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"

/* ---- output sink for msgpack-c: growable, with a sticky out-of-memory flag -- */

typedef struct obuf {
    char *p;
    size_t len;
    size_t cap;
    bool oom;
    bool heap; /* p was malloc'd; else it is the caller's initial buffer */
} obuf_t;

static inline void obuf_init(obuf_t *b, char *initial, size_t cap)
{
    *b = (obuf_t){.p = initial, .cap = cap};
}

static inline void obuf_free(obuf_t *b)
{
    if (b->heap)
        free(b->p);
}

/* The slow path of obuf_write: grow (from the initial buffer to the heap). */
static inline int obuf_grow_write(obuf_t *b, const void *buf, size_t len)
{
    if (b->oom)
        return -1;
    size_t cap = b->cap;
    while (cap - b->len < len) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return -1;
        }
        cap *= 2;
    }
    char *np = b->heap ? realloc(b->p, cap) : malloc(cap);
    if (!np) {
        b->oom = true;
        return -1;
    }
    if (!b->heap)
        memcpy(np, b->p, b->len);
    b->p = np;
    b->cap = cap;
    b->heap = true;
    memcpy(b->p + b->len, buf, len);
    b->len += len;
    return 0;
}

/* A includer may force obuf_write inline (then each token's constant length
 * folds its copy to a store or two); the bytes are the same either way. */
#ifndef GSER_MPSINK_INLINE
#define GSER_MPSINK_INLINE inline
#endif

/* Appends one token (a type byte with its fixed payload, or a body). After a
 * failed growth the output is discarded (oom is checked at the end), so what
 * still fits may be written. */
static GSER_MPSINK_INLINE int obuf_write(obuf_t *b, const void *buf, size_t len)
{
    if (len > b->cap - b->len)
        return obuf_grow_write(b, buf, len);
    if (len) /* an empty body may come with a NULL pointer */
        gser__copy_short(b->p + b->len, buf, len);
    b->len += len;
    return 0;
}

/* msgpack-c's pack template (the one msgpack_pack_* are made from),
 * instantiated as pk_* to append straight into an obuf: with the sink known,
 * the compiler turns each token into a few stores instead of an indirect call.
 * The template's timestamp code calls msgpack_pack_ext by name. */
#define msgpack_pack_inline_func(name) static inline int pk##name
#define msgpack_pack_inline_func_fixint(name) static inline int pk_fix##name
#define msgpack_pack_inline_func_cint(name) static inline int pk##name
#define msgpack_pack_user obuf_t *
#define msgpack_pack_append_buffer(user, buf, len) return obuf_write(user, buf, len)
#define msgpack_pack_ext pk_ext
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include <msgpack/pack_template.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#endif
