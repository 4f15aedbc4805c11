/* One msgpack unit straight into gser values, in one pass, with gser's limits.
 *
 * msgpack-c's own unpack template (the one msgpack_unpack is built from) is
 * instantiated with callbacks that make the gser values themselves: no
 * msgpack_object tree, no second pass. Before anything is allocated for a
 * container, its declared count is charged to the node budget and to the
 * bytes the input can hold, so a five-byte lie cannot make us allocate; a
 * container gets exactly the room its count declares.
 *
 * gser's markers are arrays whose first item is an empty ext: a tuple turns
 * the array into a tuple; a buffer, array or object marker collects its
 * fields, which are finished into the value they describe when the last one
 * arrives (the decoder's finish_marker). The template keeps the containers being
 * filled on its stack; paths for errors and traces are read from there, only
 * when one is needed.
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack/object.h>
#include <msgpack/unpack.h>
#include <msgpack/unpack_define.h>

#include "decode.h"

/* msgpack-c's own unpacker allows this many open containers; so do we
 * (GSER_DEPTH_MAX leaves room for the markers' inner arrays). */
_Static_assert(MSGPACK_EMBED_STACK_SIZE == 32, "gser's depth limit assumes msgpack-c's 32 open containers");
_Static_assert(GSER_DEPTH_MAX + 2 <= MSGPACK_EMBED_STACK_SIZE, "the depth limit exceeds the parser's stack");

/* What a callback returns when it failed (u->st holds the status); the
 * template returns -1 (an invalid byte) and -2 (too many open containers)
 * of its own. */
enum { MP_FAILED = -10 };

/* ---- the template, declared: callbacks are defined once its stack is ---------------- */

#define msgpack_unpack_struct(name) struct gser_mp##name
#define msgpack_unpack_func(ret, name) static ret gser_mp##name
#define msgpack_unpack_callback(name) cb##name
#define msgpack_unpack_object gser_value_t *
#define msgpack_unpack_user mp_unit_t

static inline gser_value_t *cb_root(mp_unit_t *u);
static inline int cb_uint8(mp_unit_t *u, uint8_t d, gser_value_t **o);
static inline int cb_uint16(mp_unit_t *u, uint16_t d, gser_value_t **o);
static inline int cb_uint32(mp_unit_t *u, uint32_t d, gser_value_t **o);
static inline int cb_uint64(mp_unit_t *u, uint64_t d, gser_value_t **o);
static inline int cb_int8(mp_unit_t *u, int8_t d, gser_value_t **o);
static inline int cb_int16(mp_unit_t *u, int16_t d, gser_value_t **o);
static inline int cb_int32(mp_unit_t *u, int32_t d, gser_value_t **o);
static inline int cb_int64(mp_unit_t *u, int64_t d, gser_value_t **o);
static inline int cb_float(mp_unit_t *u, float d, gser_value_t **o);
static inline int cb_double(mp_unit_t *u, double d, gser_value_t **o);
static inline int cb_nil(mp_unit_t *u, gser_value_t **o);
static inline int cb_true(mp_unit_t *u, gser_value_t **o);
static inline int cb_false(mp_unit_t *u, gser_value_t **o);
static inline int cb_array(mp_unit_t *u, unsigned int n, gser_value_t **o);
static inline int cb_array_item(mp_unit_t *u, gser_value_t **c, gser_value_t *o);
static inline int cb_map(mp_unit_t *u, unsigned int n, gser_value_t **o);
static inline int cb_map_item(mp_unit_t *u, gser_value_t **c, gser_value_t *k, gser_value_t *v);
static inline int cb_str(mp_unit_t *u, const char *b, const char *p, unsigned int l, gser_value_t **o);
static inline int cb_bin(mp_unit_t *u, const char *b, const char *p, unsigned int l, gser_value_t **o);
static inline int cb_ext(mp_unit_t *u, const char *b, const char *p, unsigned int l, gser_value_t **o);

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

typedef struct gser_mp_context mp_ctx_t;
typedef struct gser_mp_stack mp_stack_t;

/* The user data is the template context's first member, and a container's
 * value its stack entry's: the open containers are read from there. */
_Static_assert(offsetof(mp_ctx_t, user) == 0, "the unit is the template context's first member");
_Static_assert(offsetof(mp_stack_t, obj) == 0, "a container's value is its stack entry's first member");

static inline mp_stack_t *open_at(const mp_unit_t *u, size_t level)
{
    return &((mp_ctx_t *)(void *)u)->stack[level];
}

/* ---- paths, errors, traces ---------------------------------------------------------- */

void gser__mp_unit_path(const mp_unit_t *u, path_t *p)
{
    *p = u->d->path;
    for (size_t i = 0; i < u->open && p->len < GSER_PATH_MAX; i++) {
        const mp_stack_t *s = open_at(u, i);
        const gser_value_t *c = s->obj;
        if (c->kind == GSER_KIND_MAP)
            p->seg[p->len++] = (path_seg_t){.key = s->ct == MSGPACK_CT_MAP_VALUE ? s->map_key : NULL,
                                            .index = c->u.map->len};
        else
            p->seg[p->len++] = (path_seg_t){.key = NULL, .index = c->u.list->len};
    }
}

gser_status_t gser__mp_unit_fail(mp_unit_t *u, gser_status_t st, const char *fmt, ...)
{
    path_t p;
    gser__mp_unit_path(u, &p);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    gser__path_vmessage(&p, ": ", msg, sizeof msg, fmt, ap);
    va_end(ap);
    u->st = st;
    return gser__error_set(u->d->ctx, st, "%s: %s", u->d->what, msg);
}

static void trace_flush(mp_unit_t *u)
{
    if (u->pending[0]) {
        gser__trace_line(u->d->trace, "deserialize %s", u->pending);
        u->pending[0] = '\0';
    }
}

static void trace_vformat(mp_unit_t *u, char *buf, size_t cap, const char *fmt, va_list ap)
{
    path_t p;
    gser__mp_unit_path(u, &p);
    gser__path_vmessage(&p, "  ", buf, cap, fmt, ap);
}

void gser__mp_unit_trace(mp_unit_t *u, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    trace_vformat(u, msg, sizeof msg, fmt, ap);
    va_end(ap);
    trace_flush(u);
    gser__trace_line(u->d->trace, "deserialize %s", msg);
}

/* A list's line waits for its first item: the array may be a marker, or a
 * tuple (the kind is rewritten in place then). */
static void trace_list(mp_unit_t *u, unsigned int n)
{
    trace_flush(u);
    path_t p;
    char path[256];
    gser__mp_unit_path(u, &p);
    gser__path_format(&p, path, sizeof path);
    int at = snprintf(u->pending, sizeof u->pending, "%s  ", path);
    u->pending_kind = at > 0 && (size_t)at < sizeof u->pending - 32 ? (size_t)at : 0;
    snprintf(u->pending + u->pending_kind, sizeof u->pending - u->pending_kind, "list n=%u", n);
}

/* Values inside a marker's fields, and map keys, are not traced. */
static void trace_value(mp_unit_t *u, const gser_value_t *v)
{
    for (size_t i = 0; i < u->open; i++) {
        const mp_stack_t *s = open_at(u, i);
        if (s->ct == MSGPACK_CT_MAP_KEY && i + 1 == u->open)
            return;
        if (s->obj->kind != GSER_KIND_MAP && s->obj->u.list->marker != MARK_NONE &&
            s->obj->u.list->marker != MARK_MUST)
            return;
    }
    char s[80];
    gser__scalar_format(v, s, sizeof s);
    gser__mp_unit_trace(u, "%s %s", gser_kind_str((gser_kind_t)v->kind), s);
}

/* ---- the callbacks --------------------------------------------------------------------- */

static int nomem(mp_unit_t *u)
{
    gser__mp_unit_fail(u, GSER_ERR_NO_MEMORY, "out of memory");
    return MP_FAILED;
}

static inline int push(mp_unit_t *u, gser_value_t *v, gser_value_t **o)
{
    if (!v)
        return nomem(u);
    *o = v;
    if (__builtin_expect(u->trace, 0))
        trace_value(u, v);
    return 0;
}

static inline gser_value_t *cb_root(mp_unit_t *u)
{
    (void)u;
    return NULL;
}

static inline int cb_uint64(mp_unit_t *u, uint64_t d, gser_value_t **o)
{
    /* a msgpack integer above INT64_MAX is a uint (wire-format.md 4.1) */
    gser_value_t *v = gser__msg_value(u->msg, d <= (uint64_t)INT64_MAX ? GSER_KIND_INT : GSER_KIND_UINT);
    if (v)
        v->u.u = d;
    return push(u, v, o);
}

static inline int cb_int64(mp_unit_t *u, int64_t d, gser_value_t **o)
{
    gser_value_t *v = gser__msg_value(u->msg, GSER_KIND_INT);
    if (v)
        v->u.i = d;
    return push(u, v, o);
}

/* Every narrower integer is an int. */
#define GSER_MP_NARROW(name, T)                                                                                      \
    static inline int cb_##name(mp_unit_t *u, T d, gser_value_t **o)                                                 \
    {                                                                                                                \
        return cb_int64(u, d, o);                                                                                    \
    }
GSER_MP_NARROW(uint8, uint8_t)
GSER_MP_NARROW(uint16, uint16_t)
GSER_MP_NARROW(uint32, uint32_t)
GSER_MP_NARROW(int8, int8_t)
GSER_MP_NARROW(int16, int16_t)
GSER_MP_NARROW(int32, int32_t)

static inline int cb_double(mp_unit_t *u, double d, gser_value_t **o)
{
    gser_value_t *v = gser__msg_value(u->msg, GSER_KIND_FLOAT);
    if (v)
        v->u.f = d;
    return push(u, v, o);
}

static inline int cb_float(mp_unit_t *u, float d, gser_value_t **o)
{
    return cb_double(u, d, o);
}

static inline int cb_nil(mp_unit_t *u, gser_value_t **o)
{
    return push(u, &u->msg->nil, o);
}

static inline int cb_bool(mp_unit_t *u, bool b, gser_value_t **o)
{
    gser_value_t *v = gser__msg_value(u->msg, GSER_KIND_BOOL);
    if (v)
        v->u.b = b;
    return push(u, v, o);
}

static inline int cb_true(mp_unit_t *u, gser_value_t **o)
{
    return cb_bool(u, true, o);
}

static inline int cb_false(mp_unit_t *u, gser_value_t **o)
{
    return cb_bool(u, false, o);
}

static inline int cb_str(mp_unit_t *u, const char *b, const char *p, unsigned int l, gser_value_t **o)
{
    (void)b;
    return push(u, gser__msg_str_value(u->msg, p, l), o);
}

static inline int cb_bin(mp_unit_t *u, const char *b, const char *p, unsigned int l, gser_value_t **o)
{
    (void)b;
    gser_value_t *v = gser__msg_value(u->msg, GSER_KIND_BYTES);
    if (v) {
        v->u.s.ptr = p;
        v->u.s.len = l;
    }
    return push(u, v, o);
}

/* l counts the type byte: the template never passes 0. A uint is the only
 * ext that is a value; an empty one starts a marker, which its array checks. */
static inline int cb_ext(mp_unit_t *u, const char *b, const char *p, unsigned int l, gser_value_t **o)
{
    (void)b;
    int8_t type = (int8_t)*p;
    if (l == 1) {
        u->ext.kind = MP_KIND_EXT;
        u->ext.u.i = type;
        *o = &u->ext;
        return 0;
    }
    if (type != GSER_EXT_UINT || l != 9) {
        gser__mp_unit_fail(u, GSER_ERR_FORMAT, "ext type %d of %u bytes where a value was expected", type, l - 1);
        return MP_FAILED;
    }
    gser_value_t *v = gser__msg_value(u->msg, GSER_KIND_UINT);
    if (v) {
        memcpy(&v->u.u, p + 1, 8); /* little-endian host: checked in internal.h */
        v->flags = VF_EXT_UINT;
    }
    return push(u, v, o);
}

/* A container declares n items: each must fit in the budget and in the bytes. */
static inline int charge(mp_unit_t *u, uint64_t n)
{
    if (n > u->bytes_left) {
        gser__mp_unit_fail(u, GSER_ERR_TRUNCATED, "%s declares more items than it holds (%llu items, %zu bytes left)",
                           u->unit, (unsigned long long)n, u->bytes_left);
        return MP_FAILED;
    }
    if (n > u->d->nodes_left) {
        gser__mp_unit_fail(u, GSER_ERR_LIMIT_NODES, "%s has more items than the limit of %zu", u->unit,
                           u->d->lim.max_nodes);
        return MP_FAILED;
    }
    u->d->nodes_left -= n;
    u->bytes_left -= n;
    return 0;
}

static int too_deep(mp_unit_t *u)
{
    gser__mp_unit_fail(u, GSER_ERR_LIMIT_DEPTH, "%s nests deeper than the limit of %zu", u->unit, u->d->lim.max_depth);
    return MP_FAILED;
}

/* What a new container's parent allows: 0, or the marker state the new
 * container gets (MARK_FIELD inside a marker, MARK_MUST at the depth
 * limit); MP_FAILED when the parent allows no container here. */
static inline int container_ok(mp_unit_t *u, unsigned int n, bool map, uint8_t *mark)
{
    *mark = MARK_NONE;
    if (u->open) {
        const mp_stack_t *s = open_at(u, u->open - 1);
        if (s->ct == MSGPACK_CT_MAP_KEY) {
            gser__mp_unit_fail(u, GSER_ERR_FORMAT, "map key %zu is not a scalar", s->obj->u.map->len);
            return MP_FAILED;
        }
        uint8_t pm = s->obj->kind == GSER_KIND_MAP ? MARK_NONE : s->obj->u.list->marker;
        if (pm == MARK_MUST)
            return too_deep(u);
        if (pm != MARK_NONE) {
            /* a marker's shape, strides or reference: an array of integers */
            if (pm == MARK_FIELD || map) {
                gser__mp_unit_fail(u, GSER_ERR_FORMAT, "a marker field holds a %s", map ? "map" : "nested array");
                return MP_FAILED;
            }
            *mark = MARK_FIELD;
            return 0;
        }
    }
    if (n && u->depth + u->open + 1 > u->d->lim.max_depth) {
        if (map)
            return too_deep(u);
        *mark = MARK_MUST;
    }
    return 0;
}

static inline int cb_array(mp_unit_t *u, unsigned int n, gser_value_t **o)
{
    uint8_t mark;
    if (charge(u, n) || container_ok(u, n, false, &mark))
        return MP_FAILED;
    /* the value, its list and exactly n item slots: one allocation */
    gser_value_t *v = gser__msg_alloc(u->msg, sizeof *v + sizeof(gser_list_t) + (size_t)n * sizeof(gser_value_t *),
                                      alignof(gser_value_t));
    if (!v)
        return nomem(u);
    gser_list_t *l = (gser_list_t *)(v + 1);
    *v = (gser_value_t){.kind = GSER_KIND_LIST, .msg = u->msg, .u.list = l};
    *l = (gser_list_t){.mode = LIST_BOXED, .items = (gser_value_t **)(l + 1), .items_cap = n, .marker = mark};
    if (__builtin_expect(u->trace, 0) && mark != MARK_FIELD)
        trace_list(u, n);
    *o = v;
    u->open += n != 0;
    return 0;
}

static inline int cb_array_item(mp_unit_t *u, gser_value_t **c, gser_value_t *o)
{
    gser_value_t *cv = *c;
    gser_list_t *l = cv->u.list;
    if (__builtin_expect(o->kind == MP_KIND_EXT, 0)) {
        int type = (int)o->u.i;
        if (l->len || cv->kind == GSER_KIND_TUPLE || l->marker == MARK_FIELD) {
            gser__mp_unit_fail(u, GSER_ERR_FORMAT, "ext type %d of 0 bytes where a value was expected", type);
            return MP_FAILED;
        }
        if (type == GSER_EXT_TUPLE) {
            cv->kind = GSER_KIND_TUPLE; /* the ext itself is not an element */
            if (u->pending[0])
                snprintf(u->pending + u->pending_kind, sizeof u->pending - u->pending_kind, "tuple n=%zu",
                         l->items_cap - 1);
        } else if (type == GSER_EXT_BUFFER || type == GSER_EXT_ARRAY || type == GSER_EXT_OBJECT) {
            l->marker = (uint8_t)type; /* the fields follow; the marker traces itself */
            u->pending[0] = '\0';
        } else {
            gser__mp_unit_fail(u, GSER_ERR_FORMAT, "unknown marker ext type %d", type);
            return MP_FAILED;
        }
    } else {
        if (__builtin_expect(l->marker == MARK_MUST, 0))
            return too_deep(u);
        l->items[l->len++] = o;
    }
    if (((mp_stack_t *)(void *)c)->count > 1)
        return 0;
    /* the last item: the template closes the array next */
    u->open--;
    if (l->marker == MARK_BUFFER || l->marker == MARK_ARRAY || l->marker == MARK_OBJECT) {
        gser_status_t st = u->d->finish_marker(u, cv);
        if (st) {
            u->st = st;
            return MP_FAILED;
        }
    }
    return 0;
}

static inline int cb_map(mp_unit_t *u, unsigned int n, gser_value_t **o)
{
    uint8_t mark;
    if (charge(u, 2 * (uint64_t)n) || container_ok(u, n, true, &mark))
        return MP_FAILED;
    gser_value_t *v = gser__msg_alloc(u->msg, sizeof *v + sizeof(gser_map_t) + (size_t)n * sizeof(gser_pair_t),
                                      alignof(gser_value_t));
    if (!v)
        return nomem(u);
    gser_map_t *m = (gser_map_t *)(v + 1);
    *v = (gser_value_t){.kind = GSER_KIND_MAP, .msg = u->msg, .u.map = m};
    *m = (gser_map_t){.len = 0, .cap = n, .pairs = (gser_pair_t *)(m + 1)};
    if (__builtin_expect(u->trace, 0))
        gser__mp_unit_trace(u, "map n=%u", n);
    *o = v;
    u->open += n != 0;
    return 0;
}

static inline int cb_map_item(mp_unit_t *u, gser_value_t **c, gser_value_t *k, gser_value_t *v)
{
    gser_map_t *m = (*c)->u.map;
    if (__builtin_expect(k->kind > GSER_KIND_BYTES, 0)) { /* an ext: containers were refused as they began */
        gser__mp_unit_fail(u, GSER_ERR_FORMAT, "map key %zu is not a scalar", m->len);
        return MP_FAILED;
    }
    if (__builtin_expect(v->kind == MP_KIND_EXT, 0)) {
        gser__mp_unit_fail(u, GSER_ERR_FORMAT, "ext type %d of 0 bytes where a value was expected", (int)v->u.i);
        return MP_FAILED;
    }
    m->pairs[m->len].key = k;
    m->pairs[m->len].value = v;
    m->len++;
    if (((mp_stack_t *)(void *)c)->count == 1)
        u->open--;
    return 0;
}

/* ---- entry point ---------------------------------------------------------------------------- */

gser_status_t gser__mp_parse_unit(dec_t *d, const unsigned char *p, size_t len, size_t depth, size_t fbase, size_t fn,
                                  bool whole, const char *unit, size_t off0, gser_value_t **out, size_t *used)
{
    mp_ctx_t ctx;
    mp_unit_t *u = &ctx.user;
    gser_mp_init(&ctx);
    /* field by field: the pending trace line is not worth zeroing */
    u->d = d;
    u->msg = d->msg;
    u->unit = unit;
    u->depth = depth;
    u->open = 0;
    u->fbase = fbase;
    u->fn = fn;
    u->st = GSER_OK;
    u->trace = d->trace != NULL;
    u->pending[0] = '\0';
    if (len == 0)
        return gser__mp_unit_fail(u, GSER_ERR_TRUNCATED, "%s is empty at byte %zu", unit, off0);
    if (depth > d->lim.max_depth)
        return gser__mp_unit_fail(u, GSER_ERR_LIMIT_DEPTH, "%s nests deeper than the limit of %zu", unit,
                                  d->lim.max_depth);
    if (d->nodes_left == 0)
        return gser__mp_unit_fail(u, GSER_ERR_LIMIT_NODES, "%s has more items than the limit", unit);
    d->nodes_left--; /* the unit's own object */
    u->bytes_left = len - 1;
    size_t off = 0;
    int r = gser_mp_execute(&ctx, (const char *)p, len, &off);
    if (u->trace)
        trace_flush(u);
    if (r == 1 && whole && off != len)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "%s has trailing bytes at byte %zu of %zu", unit, off0 + off,
                                  off0 + len);
    if (r == 1 && ctx.stack[0].obj->kind == MP_KIND_EXT)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "ext type %d of 0 bytes where a value was expected",
                                  (int)ctx.stack[0].obj->u.i);
    if (r == 1) {
        *out = ctx.stack[0].obj;
        if (used)
            *used = off;
        return GSER_OK;
    }
    if (r == MP_FAILED)
        return u->st;
    /* the template's own refusals: where the unit stops */
    if (r == 0)
        return gser__mp_unit_fail(u, GSER_ERR_TRUNCATED, "%s ends early at byte %zu of %zu", unit, off0 + off,
                                  off0 + len);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return gser__mp_unit_fail(u, GSER_ERR_LIMIT_DEPTH, "%s nests deeper than the limit at byte %zu of %zu", unit,
                                  off0 + off, off0 + len);
    return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "%s holds an invalid byte at byte %zu of %zu", unit, off0 + off,
                              off0 + len);
}
