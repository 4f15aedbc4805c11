/* One msgpack unit into msgpack-c objects, in one pass, with gser's limits.
 *
 * msgpack_unpack() allocates an array's elements from its declared count
 * before reading them and has no limits, so it could only be given input that
 * mp_check had walked first, and each call set up a zone (a malloc and a free).
 * Here msgpack-c's own unpack template -- the one msgpack_unpack is built
 * from -- is instantiated with callbacks that charge every declared count to
 * the node budget and to the bytes the input can hold before allocating, and
 * that take the objects from a scratch area reused for the whole message.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack/object.h>
#include <msgpack/unpack.h>
#include <msgpack/unpack_define.h>

#include "internal.h"

/* msgpack-c's own unpacker allows this many open containers; so do we
 * (GSER_DEPTH_MAX leaves room for the markers' inner arrays). */
_Static_assert(MSGPACK_EMBED_STACK_SIZE == 32, "gser's depth limit assumes msgpack-c's 32 open containers");
_Static_assert(GSER_DEPTH_MAX + 2 <= MSGPACK_EMBED_STACK_SIZE, "the depth limit exceeds the parser's stack");

/* Errors our callbacks return; the template returns -1 (an invalid byte) and
 * -2 (too many open containers) of its own. */
enum { MP_E_NODES = -10, MP_E_SHORT = -11, MP_E_NOMEM = -12 };

/* ---- scratch -------------------------------------------------------------------------- */

typedef struct mp_block {
    struct mp_block *next;
    size_t cap;
    _Alignas(16) unsigned char data[];
} mp_block_t;

#define MP_BLOCK_MIN 16384

void mp_scratch_init(mp_scratch_t *s)
{
    s->base = s->local;
    s->cap = sizeof s->local;
    s->used = 0;
    s->blocks = NULL;
}

void mp_scratch_free(mp_scratch_t *s)
{
    mp_scratch_release(s, (mp_mark_t){.base = s->local, .cap = sizeof s->local, .used = 0, .blocks = NULL});
}

mp_mark_t mp_scratch_mark(const mp_scratch_t *s)
{
    return (mp_mark_t){.base = s->base, .cap = s->cap, .used = s->used, .blocks = s->blocks};
}

void mp_scratch_release(mp_scratch_t *s, mp_mark_t m)
{
    while (s->blocks != m.blocks) {
        mp_block_t *b = s->blocks;
        s->blocks = b->next;
        free(b);
    }
    s->base = m.base;
    s->cap = m.cap;
    s->used = m.used;
}

static void *scratch_alloc(mp_scratch_t *s, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    if (bytes <= s->cap - s->used) {
        void *p = s->base + s->used;
        s->used += bytes;
        return p;
    }
    size_t cap = s->cap * 2 > MP_BLOCK_MIN ? s->cap * 2 : MP_BLOCK_MIN;
    if (cap < bytes)
        cap = bytes;
    mp_block_t *b = malloc(sizeof *b + cap);
    if (!b)
        return NULL;
    b->next = s->blocks;
    b->cap = cap;
    s->blocks = b;
    s->base = b->data;
    s->cap = cap;
    s->used = bytes;
    return b->data;
}

/* ---- the template's callbacks --------------------------------------------------------- */

typedef struct mp_user {
    mp_scratch_t *scratch;
    size_t *nodes_left;
    size_t bytes_left; /* every declared item takes at least one byte of its own */
} mp_user_t;

/* A container declares n items: each must fit in the budget and in the bytes,
 * so a five-byte lie cannot make us allocate. */
static inline int charge(mp_user_t *u, uint64_t n)
{
    if (n > u->bytes_left)
        return MP_E_SHORT;
    if (n > *u->nodes_left)
        return MP_E_NODES;
    *u->nodes_left -= n;
    u->bytes_left -= n;
    return 0;
}

static inline msgpack_object cb_root(mp_user_t *u)
{
    (void)u;
    msgpack_object o = {.type = MSGPACK_OBJECT_NIL};
    return o;
}

#define GSER_MP_UINT(name, T)                                                                                        \
    static inline int cb_##name(mp_user_t *u, T d, msgpack_object *o)                                                \
    {                                                                                                                \
        (void)u;                                                                                                     \
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;                                                                   \
        o->via.u64 = d;                                                                                              \
        return 0;                                                                                                    \
    }
#define GSER_MP_INT(name, T)                                                                                         \
    static inline int cb_##name(mp_user_t *u, T d, msgpack_object *o)                                                \
    {                                                                                                                \
        (void)u;                                                                                                     \
        if (d >= 0) {                                                                                                \
            o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;                                                               \
            o->via.u64 = (uint64_t)d;                                                                                \
        } else {                                                                                                     \
            o->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;                                                               \
            o->via.i64 = d;                                                                                          \
        }                                                                                                            \
        return 0;                                                                                                    \
    }
GSER_MP_UINT(uint8, uint8_t)
GSER_MP_UINT(uint16, uint16_t)
GSER_MP_UINT(uint32, uint32_t)
GSER_MP_UINT(uint64, uint64_t)
GSER_MP_INT(int8, int8_t)
GSER_MP_INT(int16, int16_t)
GSER_MP_INT(int32, int32_t)
GSER_MP_INT(int64, int64_t)

static inline int cb_float(mp_user_t *u, float d, msgpack_object *o)
{
    (void)u;
    o->type = MSGPACK_OBJECT_FLOAT32;
    o->via.f64 = d;
    return 0;
}

static inline int cb_double(mp_user_t *u, double d, msgpack_object *o)
{
    (void)u;
    o->type = MSGPACK_OBJECT_FLOAT64;
    o->via.f64 = d;
    return 0;
}

static inline int cb_nil(mp_user_t *u, msgpack_object *o)
{
    (void)u;
    o->type = MSGPACK_OBJECT_NIL;
    return 0;
}

static inline int cb_true(mp_user_t *u, msgpack_object *o)
{
    (void)u;
    o->type = MSGPACK_OBJECT_BOOLEAN;
    o->via.boolean = true;
    return 0;
}

static inline int cb_false(mp_user_t *u, msgpack_object *o)
{
    (void)u;
    o->type = MSGPACK_OBJECT_BOOLEAN;
    o->via.boolean = false;
    return 0;
}

static inline int cb_array(mp_user_t *u, unsigned int n, msgpack_object *o)
{
    int r = charge(u, n);
    if (r)
        return r;
    o->type = MSGPACK_OBJECT_ARRAY;
    o->via.array.size = 0;
    o->via.array.ptr = NULL;
    if (n && !(o->via.array.ptr = scratch_alloc(u->scratch, (size_t)n * sizeof(msgpack_object))))
        return MP_E_NOMEM;
    return 0;
}

static inline int cb_array_item(mp_user_t *u, msgpack_object *c, msgpack_object o)
{
    (void)u;
    c->via.array.ptr[c->via.array.size++] = o;
    return 0;
}

static inline int cb_map(mp_user_t *u, unsigned int n, msgpack_object *o)
{
    int r = charge(u, 2 * (uint64_t)n);
    if (r)
        return r;
    o->type = MSGPACK_OBJECT_MAP;
    o->via.map.size = 0;
    o->via.map.ptr = NULL;
    if (n && !(o->via.map.ptr = scratch_alloc(u->scratch, (size_t)n * sizeof(msgpack_object_kv))))
        return MP_E_NOMEM;
    return 0;
}

static inline int cb_map_item(mp_user_t *u, msgpack_object *c, msgpack_object k, msgpack_object v)
{
    (void)u;
    c->via.map.ptr[c->via.map.size].key = k;
    c->via.map.ptr[c->via.map.size].val = v;
    c->via.map.size++;
    return 0;
}

static inline int cb_str(mp_user_t *u, const char *b, const char *p, unsigned int l, msgpack_object *o)
{
    (void)u;
    (void)b;
    o->type = MSGPACK_OBJECT_STR;
    o->via.str.ptr = p;
    o->via.str.size = l;
    return 0;
}

static inline int cb_bin(mp_user_t *u, const char *b, const char *p, unsigned int l, msgpack_object *o)
{
    (void)u;
    (void)b;
    o->type = MSGPACK_OBJECT_BIN;
    o->via.bin.ptr = p;
    o->via.bin.size = l;
    return 0;
}

/* l counts the type byte: the template never passes 0. */
static inline int cb_ext(mp_user_t *u, const char *b, const char *p, unsigned int l, msgpack_object *o)
{
    (void)u;
    (void)b;
    o->type = MSGPACK_OBJECT_EXT;
    o->via.ext.type = (int8_t)*p;
    o->via.ext.ptr = p + 1;
    o->via.ext.size = l - 1;
    return 0;
}

#define msgpack_unpack_struct(name) struct gser_mp##name
#define msgpack_unpack_func(ret, name) static ret gser_mp##name
#define msgpack_unpack_callback(name) cb##name
#define msgpack_unpack_object msgpack_object
#define msgpack_unpack_user mp_user_t

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#endif
#include <msgpack/unpack_template.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* ---- entry point -------------------------------------------------------------------------- */

gser_status_t mp_unpack(mp_scratch_t *s, const unsigned char *p, size_t len, size_t *nodes_left, msgpack_object *out,
                        size_t *err_off, const char **why)
{
    *err_off = 0;
    if (len == 0) {
        *why = "is empty";
        return GSER_ERR_TRUNCATED;
    }
    if (*nodes_left == 0) {
        *why = "has more items than the limit";
        return GSER_ERR_LIMIT_NODES;
    }
    (*nodes_left)--; /* the unit's own object */
    struct gser_mp_context ctx;
    gser_mp_init(&ctx);
    ctx.user = (mp_user_t){.scratch = s, .nodes_left = nodes_left, .bytes_left = len - 1};
    size_t off = 0;
    int r = gser_mp_execute(&ctx, (const char *)p, len, &off);
    *err_off = off;
    switch (r) {
    case 1:
        if (off != len) {
            *why = "has trailing bytes";
            return GSER_ERR_FORMAT;
        }
        *out = gser_mp_data(&ctx);
        return GSER_OK;
    case 0: *why = "ends early"; return GSER_ERR_TRUNCATED;
    case MP_E_SHORT: *why = "declares more items than it holds"; return GSER_ERR_TRUNCATED;
    case MP_E_NODES: *why = "has more items than the limit"; return GSER_ERR_LIMIT_NODES;
    case MP_E_NOMEM: *why = "cannot be parsed: out of memory"; return GSER_ERR_NO_MEMORY;
    case MSGPACK_UNPACK_NOMEM_ERROR: *why = "nests deeper than the limit"; return GSER_ERR_LIMIT_DEPTH;
    default: *why = "holds an invalid byte"; return GSER_ERR_FORMAT;
    }
}
