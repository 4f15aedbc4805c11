/* gser_serialize: the value tree -> one msgpack header (msgpack-c) + frames.
 *
 * One pass over the tree. Buffers and large scalar arrays become frames that
 * point at the caller's memory; typed objects are dispatched to the first
 * family in the caller's list that their type supports, and their sub-trees
 * are encoded into a sub-header kept as msgpack bin, so that a receiver can
 * forward them without decoding (docs/wire-format.md).
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack/pack_define.h>
#include <msgpack/timestamp.h>

#include "internal.h"
#include "mpsink.h"

/* The version a message without compressed frames is written in: what
 * readers of version 2 read. */
#define WIRE_VERSION_PLAIN 2

#undef msgpack_pack_ext

static inline void pk_str_with_body(obuf_t *pk, const void *b, size_t l)
{
    pk_str(pk, l);
    pk_str_body(pk, b, l);
}

static inline void pk_bin_with_body(obuf_t *pk, const void *b, size_t l)
{
    pk_bin(pk, l);
    pk_bin_body(pk, b, l);
}

static inline void pk_ext_with_body(obuf_t *pk, const void *b, size_t l, int8_t type)
{
    pk_ext(pk, l, type);
    pk_ext_body(pk, b, l);
}

/* ---- encoder state ---------------------------------------------------------- */

typedef struct enc {
    gser_context_t *ctx;
    gser_frames_t *out;
    int fam[GSER_MAX_FAMILIES];
    size_t nfam;
    size_t inline_max;
    bool narrow_ints; /* int arrays as narrow as their items (gser_serialize_options_t) */
    size_t array_min;
    size_t max_depth;
    FILE *trace;
    /* The path of the value being encoded: kept as the tree is walked only
     * when tracing; otherwise gathered, innermost first, as a failure
     * returns through the containers (no cost until something fails). */
    path_t path;
    bool failed;      /* err holds the message of a failure */
    char err[1024];
    char cb_err[512]; /* set by gser_writer_fail */
    /* device buffers */
    int buffer_family; /* GSER_FAMILY_DEVICE or _HOST: the first of them in the list; -1 if neither */
    bool to_host;      /* this scope's device buffers go to host frames (the host family) */
    packer_t pack;
    int group; /* packed frame of the current object scope, -1 if none yet */
} enc_t;

struct gser_writer {
    enc_t *enc;
    int family;
    gser_value_t *root;
};

static gser_status_t enc_value(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t depth, size_t base);
static inline __attribute__((always_inline)) bool enc_scalar(obuf_t *pk, const gser_value_t *v);
static void families_list(const enc_t *e, char *buf, size_t cap);

static gser_status_t enc_fail(enc_t *e, gser_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Note the message of a failure; gser_serialize sets it as the context's
 * detailed error, after the path, once the failure has returned to it. */
static gser_status_t enc_fail(enc_t *e, gser_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (e->trace) /* the path is there already */
        gser__path_vmessage(&e->path, ": ", e->err, sizeof e->err, fmt, ap);
    else
        vsnprintf(e->err, sizeof e->err, fmt, ap);
    va_end(ap);
    e->failed = true;
    if (!e->trace)
        e->path.len = 0; /* the segments come now, innermost first */
    return st;
}

/* A failure returns through the slot seg of a container. */
static gser_status_t enc_unwind(enc_t *e, gser_status_t st, path_seg_t seg)
{
    if (e->failed && !e->trace && e->path.len < GSER_PATH_MAX)
        e->path.seg[e->path.len++] = seg;
    return st;
}

/* The context's detailed error for a failure noted by enc_fail. */
static gser_status_t enc_report(enc_t *e, gser_status_t st)
{
    if (!e->failed)
        return st;
    if (e->trace)
        return gser__error_set(e->ctx, st, "%s", e->err);
    for (size_t i = 0, j = e->path.len; i + 1 < j; i++, j--) { /* gathered innermost first */
        path_seg_t t = e->path.seg[i];
        e->path.seg[i] = e->path.seg[j - 1];
        e->path.seg[j - 1] = t;
    }
    char path[256];
    gser__path_format(&e->path, path, sizeof path);
    return gser__error_set(e->ctx, st, "%s: %s", path, e->err);
}

static void enc_trace(enc_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void enc_trace(enc_t *e, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    gser__path_vmessage(&e->path, "  ", msg, sizeof msg, fmt, ap);
    va_end(ap);
    gser__trace_line(e->trace, "serialize %s", msg);
}

static gser_status_t scratch_msg(enc_t *e, gser_msg_t **out)
{
    if (!e->out->scratch && gser_msg_create(e->ctx, &e->out->scratch) != GSER_OK)
        return GSER_ERR_NO_MEMORY;
    *out = e->out->scratch;
    return GSER_OK;
}

static void pack_marker(obuf_t *pk, int type, size_t nfields)
{
    pk_array(pk, nfields + 1);
    pk_ext(pk, 0, (int8_t)type);
}

/* Bytes of a buffer or array: inline bin when small host memory, else a
 * frame reference [frame - base, offset, nbytes]. *where says which, for
 * traces: written only when tracing is on (formatting it for every buffer
 * would cost more than the rest of its encoding). */
static gser_status_t enc_data(enc_t *e, obuf_t *pk, const void *data, size_t nbytes, gser_memory_t mem,
                              int32_t device, size_t base, char *where, size_t where_cap)
{
    if (nbytes == 0 || (mem == GSER_MEMORY_HOST && nbytes < e->inline_max)) {
        pk_bin_with_body(pk, data, nbytes);
        if (e->trace)
            snprintf(where, where_cap, "inline");
        return GSER_OK;
    }
    size_t idx, off = 0;
    if (mem == GSER_MEMORY_DEVICE && (e->to_host || nbytes < e->pack.pack_max)) {
        if (gser__packer_add(&e->pack, e->out, &e->group, e->to_host, data, nbytes, &idx, &off))
            return enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory planning the packed frame");
        if (e->trace)
            snprintf(where, where_cap, "frame %zu %s packed +%zu", idx, e->to_host ? "host" : "device", off);
    } else {
        gser_frame_t fr = {
            .data = data, .size = nbytes, .memory = mem, .device = mem == GSER_MEMORY_DEVICE ? device : 0};
        idx = e->out->n;
        if (gser__frames_push(e->out, &fr))
            return enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory for the frame table");
        if (e->trace)
            snprintf(where, where_cap, "frame %zu %s", idx, gser_memory_str(mem));
    }
    pk_array(pk, 3);
    pk_uint64(pk, idx - base);
    pk_uint64(pk, off);
    pk_uint64(pk, nbytes);
    return GSER_OK;
}

static void enc_uint(obuf_t *pk, uint64_t u)
{
    unsigned char le[8];
    memcpy(le, &u, 8); /* little-endian host: checked in internal.h */
    pk_ext_with_body(pk, le, 8, GSER_EXT_UINT);
}

static void enc_scalar_bits(obuf_t *pk, gser_kind_t kind, const void *p)
{
    switch (kind) {
    case GSER_KIND_BOOL:
        if (*(const unsigned char *)p)
            pk_true(pk);
        else
            pk_false(pk);
        break;
    case GSER_KIND_INT: {
        int64_t i;
        memcpy(&i, p, 8);
        pk_int64(pk, i);
        break;
    }
    case GSER_KIND_UINT: {
        uint64_t u;
        memcpy(&u, p, 8);
        enc_uint(pk, u);
        break;
    }
    default: {
        double d;
        memcpy(&d, p, 8);
        pk_double(pk, d);
        break;
    }
    }
}

static const char *const kind_c_type[] = {
    [GSER_KIND_BOOL] = "bool", [GSER_KIND_INT] = "int", [GSER_KIND_UINT] = "uint", [GSER_KIND_FLOAT] = "float"};

/* The narrowest of int8/16/32 that holds every item of an int array (its
 * element size: 1, 2 or 4), or 8. */
static size_t int_width(const int64_t *v, size_t n)
{
    int64_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    if (lo >= INT8_MIN && hi <= INT8_MAX)
        return 1;
    if (lo >= INT16_MIN && hi <= INT16_MAX)
        return 2;
    return lo >= INT32_MIN && hi <= INT32_MAX ? 4 : 8;
}

static void int_narrow(const int64_t *v, size_t n, size_t es, void *out)
{
    if (es == 1)
        for (size_t i = 0; i < n; i++)
            ((int8_t *)out)[i] = (int8_t)v[i];
    else if (es == 2)
        for (size_t i = 0; i < n; i++)
            ((int16_t *)out)[i] = (int16_t)v[i];
    else
        for (size_t i = 0; i < n; i++)
            ((int32_t *)out)[i] = (int32_t)v[i];
}

/* Int arrays narrower than this many bytes as int64 stay int64 under
 * narrow_ints: below Dask's (and gser's) smallest compressed frame there is
 * no compression to spare, and the copy and the reader's widening cost more
 * than the bytes saved (the family's 1,000-item rows measured it). */
#define NARROW_MIN_BYTES GSER_COMPRESS_MIN_SIZE

static gser_status_t enc_array(enc_t *e, obuf_t *pk, bool tuple, gser_kind_t kind, const void *data,
                               size_t count, size_t base)
{
    size_t es = gser__scalar_kind_size(kind);
    unsigned code = (unsigned)kind;
    /* Ints as narrow as their range (wire-format 4.6): fewer bytes to send,
     * and nothing left for a transport's compression to find in the high
     * zero bytes (Dask compresses int64 frames ~2:1, which costs more than
     * it saves on a fast link). The items come back as int64 either way. */
    if (kind == GSER_KIND_INT && e->narrow_ints && count * 8 >= NARROW_MIN_BYTES &&
        (es = int_width(data, count)) < 8) {
        code = GSER_ARRAY_INT8 + (es == 1 ? 0 : es == 2 ? 1 : 2);
        void *narrow;
        gser_msg_t *scratch;
        if (scratch_msg(e, &scratch) || !(narrow = gser__msg_alloc(scratch, count * es, 16)))
            return enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory narrowing an int array");
        int_narrow(data, count, es, narrow);
        data = narrow;
    }
    size_t nbytes = count * es;
    char where[64];
    pack_marker(pk, GSER_EXT_ARRAY, 4);
    pk_uint8(pk, tuple ? 1 : 0);
    pk_uint8(pk, (uint8_t)code);
    pk_uint64(pk, count);
    gser_status_t st = enc_data(e, pk, data, nbytes, GSER_MEMORY_HOST, 0, base, where, sizeof where);
    if (st == GSER_OK && e->trace)
        enc_trace(e, "%s array<%s%s> n=%zu bytes=%zu %s", tuple ? "tuple" : "list", kind_c_type[kind],
                  code == GSER_ARRAY_INT8    ? "8"
                  : code == GSER_ARRAY_INT16 ? "16"
                  : code == GSER_ARRAY_INT32 ? "32"
                                             : "",
                  count, nbytes, where);
    return st;
}

/* If a boxed list holds only scalars of one array kind, pack them into
 * contiguous memory that lives as long as the frames. */
static gser_status_t list_try_pack(enc_t *e, const gser_list_t *l, gser_kind_t *kind, void **data)
{
    *data = NULL;
    gser_kind_t k = (gser_kind_t)l->items[0]->kind;
    if (!gser__kind_is_array_elem(k))
        return GSER_OK;
    for (size_t i = 1; i < l->len; i++)
        if (l->items[i]->kind != k)
            return GSER_OK;
    size_t es = gser__scalar_kind_size(k);
    gser_msg_t *scratch;
    unsigned char *p;
    if (scratch_msg(e, &scratch) || !(p = gser__msg_alloc(scratch, l->len * es, 16)))
        return enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory converting a list to an array");
    for (size_t i = 0; i < l->len; i++) {
        if (k == GSER_KIND_BOOL)
            p[i] = l->items[i]->u.b;
        else
            memcpy(p + 8 * i, &l->items[i]->u, 8);
    }
    *kind = k;
    *data = p;
    return GSER_OK;
}

/* Trace element i of an array-backed list written element by element. */
static void trace_unboxed(enc_t *e, const gser_list_t *l, size_t i)
{
    gser_value_t tmp = {.kind = (uint8_t)l->arr_kind};
    if (l->arr_kind == GSER_KIND_BOOL)
        tmp.u.b = ((const unsigned char *)l->arr)[i] != 0;
    else
        memcpy(&tmp.u, (const char *)l->arr + 8 * i, 8);
    char s[80];
    gser__scalar_format(&tmp, s, sizeof s);
    e->path.seg[e->path.len++] = (path_seg_t){.key = NULL, .index = i};
    enc_trace(e, "%s %s", gser_kind_str(l->arr_kind), s);
    e->path.len--;
}

static gser_status_t enc_list(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t depth, size_t base)
{
    const gser_list_t *l = v->u.list;
    bool tuple = v->kind == GSER_KIND_TUPLE;
    if (l->mode == LIST_ARRAY && (l->explicit_array || l->len >= e->array_min))
        return enc_array(e, pk, tuple, l->arr_kind, l->arr, l->len, base);
    if (l->mode == LIST_BOXED && l->len && l->len >= e->array_min) {
        gser_kind_t k;
        void *data;
        gser_status_t st = list_try_pack(e, l, &k, &data);
        if (st)
            return st;
        if (data)
            return enc_array(e, pk, tuple, k, data, l->len, base);
    }
    if (e->trace)
        enc_trace(e, "%s n=%zu", tuple ? "tuple" : "list", l->len);
    pk_array(pk, l->len + (tuple ? 1 : 0));
    if (tuple)
        pk_ext(pk, 0, GSER_EXT_TUPLE);
    if (depth + 1 > e->max_depth && l->len)
        return enc_fail(e, GSER_ERR_LIMIT_DEPTH, "nesting deeper than %zu levels (is there a cycle?)", e->max_depth);
    if (l->mode == LIST_ARRAY) {
        size_t es = gser__scalar_kind_size(l->arr_kind);
        for (size_t i = 0; i < l->len; i++) {
            enc_scalar_bits(pk, l->arr_kind, (const char *)l->arr + i * es);
            if (e->trace)
                trace_unboxed(e, l, i);
        }
        return GSER_OK;
    }
    for (size_t i = 0; i < l->len; i++) {
        const gser_value_t *it = l->items[i];
        if (!e->trace && enc_scalar(pk, it)) /* most items: no recursion, no path */
            continue;
        if (e->trace)
            e->path.seg[e->path.len++] = (path_seg_t){.key = NULL, .index = i};
        gser_status_t st = enc_value(e, pk, it, depth + 1, base);
        if (e->trace)
            e->path.len--;
        if (st)
            return enc_unwind(e, st, (path_seg_t){.key = NULL, .index = i});
    }
    return GSER_OK;
}

static gser_status_t enc_map(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t depth, size_t base)
{
    const gser_map_t *m = v->u.map;
    if (e->trace)
        enc_trace(e, "map n=%zu", m->len);
    if (depth + 1 > e->max_depth && m->len)
        return enc_fail(e, GSER_ERR_LIMIT_DEPTH, "nesting deeper than %zu levels (is there a cycle?)", e->max_depth);
    pk_map(pk, m->len);
    for (size_t i = 0; i < m->len; i++) {
        const gser_pair_t *pair = &m->pairs[i];
        enc_scalar(pk, pair->key); /* gser_map_put admits scalars only */
        if (!e->trace && enc_scalar(pk, pair->value))
            continue;
        if (e->trace)
            e->path.seg[e->path.len++] = (path_seg_t){.key = pair->key, .index = i};
        gser_status_t st = enc_value(e, pk, pair->value, depth + 1, base);
        if (e->trace)
            e->path.len--;
        if (st)
            return enc_unwind(e, st, (path_seg_t){.key = pair->key, .index = i});
    }
    return GSER_OK;
}

static gser_status_t enc_buffer(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t base)
{
    const gser_buffer_t *b = v->u.buf;
    const gser_buffer_desc_t *d = &b->desc;
    char where[96];
    if (d->memory == GSER_MEMORY_DEVICE && d->nbytes) {
        if (e->buffer_family < 0) {
            char fams[256];
            families_list(e, fams, sizeof fams);
            return enc_fail(e, GSER_ERR_NO_SERIALIZER,
                            "a device buffer needs the family \"device\" or \"host\"; families are [%s]", fams);
        }
        if (gser__packer_wait_for(&e->pack, d->stream, d->event))
            return enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory");
    }
    /* [marker, dtype, shape, data, origin] and, for any layout but C order,
     * strides: the data is then the span the elements cover. */
    pack_marker(pk, GSER_EXT_BUFFER, d->strides ? 5 : 4);
    pk_uint8(pk, (uint8_t)d->dtype);
    if (d->ndim) {
        pk_array(pk, d->ndim);
        for (uint32_t i = 0; i < d->ndim; i++)
            pk_int64(pk, d->shape[i]);
    } else {
        pk_nil(pk);
    }
    const char *span = b->first ? (const char *)d->data - b->first : d->data;
    gser_status_t st = enc_data(e, pk, span, b->span, d->memory, d->device, base, where, sizeof where);
    pk_uint8(pk, (uint8_t)d->memory); /* where the buffer lived at the sender */
    if (d->strides) {
        pk_array(pk, d->ndim);
        for (uint32_t i = 0; i < d->ndim; i++)
            pk_int64(pk, d->strides[i]);
    }
    if (st == GSER_OK && e->trace) {
        char layout[160];
        gser__layout_format(d, b->span, layout, sizeof layout);
        enc_trace(e, "buffer %s ndim=%u bytes=%zu%s %s%s", gser_dtype_str(d->dtype), d->ndim, d->nbytes, layout,
                  where, d->memory == GSER_MEMORY_DEVICE ? " (from device)" : "");
    }
    return st;
}

/* [marker, type, family, version, base, nframes, sub-header]: the sub-header
 * is the object's own msgpack tree as bin, so it can be forwarded untouched. */
static void pack_object(obuf_t *pk, const char *type, const char *family, uint32_t version, size_t rel_base,
                        size_t nframes, const void *sub, size_t sub_len)
{
    pack_marker(pk, GSER_EXT_OBJECT, 6);
    pk_str_with_body(pk, type, strlen(type));
    pk_str_with_body(pk, family, strlen(family));
    pk_uint32(pk, version);
    pk_uint64(pk, rel_base);
    pk_uint64(pk, nframes);
    pk_bin_with_body(pk, sub, sub_len);
}

static void families_list(const enc_t *e, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < e->nfam && len < cap; i++) {
        int n = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", e->ctx->families[e->fam[i]]);
        if (n < 0)
            break;
        len += (size_t)n;
    }
}

static gser_status_t enc_object(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t depth, size_t base)
{
    const gser_type_t *t = v->u.obj->type;
    int f = -1;
    for (size_t i = 0; i < e->nfam && f < 0; i++)
        if (t->fam[e->fam[i]].serialize)
            f = e->fam[i];
    if (f < 0) {
        char fams[256];
        families_list(e, fams, sizeof fams);
        return enc_fail(e, GSER_ERR_NO_SERIALIZER, "type \"%s\" has no serializer for families [%s]", t->name, fams);
    }
    if (depth + 1 > e->max_depth)
        return enc_fail(e, GSER_ERR_LIMIT_DEPTH, "nesting deeper than %zu levels (is there a cycle?)", e->max_depth);

    gser_writer_t w = {.enc = e, .family = f, .root = NULL};
    e->cb_err[0] = '\0';
    gser_status_t st = t->fam[f].serialize(e->ctx, v->u.obj->obj, &w, t->user_data);
    if (st != GSER_OK || !w.root) {
        bool no_root = st == GSER_OK;
        if (st >= GSER_OK)
            st = GSER_ERR_CALLBACK;
        return enc_fail(e, st, "type \"%s\", family \"%s\": serializer failed: %s", t->name, e->ctx->families[f],
                        e->cb_err[0] ? e->cb_err : no_root ? "it set no root" : gser_status_str(st));
    }

    char initial[512];
    obuf_t sub;
    obuf_init(&sub, initial, sizeof initial);
    size_t first = e->out->n;
    int outer_group = e->group;
    bool outer_to_host = e->to_host;
    e->group = -1; /* the object's device buffers get a packed frame of its own */
    if (f == GSER_FAMILY_HOST || f == GSER_FAMILY_DEVICE)
        e->to_host = f == GSER_FAMILY_HOST; /* a host serializer's sub-tree is all host frames */
    st = enc_value(e, &sub, w.root, depth + 1, first);
    e->group = outer_group;
    e->to_host = outer_to_host;
    if (st == GSER_OK && sub.oom)
        st = enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory encoding the object");
    if (st == GSER_OK) {
        size_t nframes = e->out->n - first;
        pack_object(pk, t->name, e->ctx->families[f], t->version, first - base, nframes, sub.p, sub.len);
        if (e->trace)
            enc_trace(e, "object type=%s family=%s version=%u frames=%zu sub-header=%zu bytes", t->name,
                      e->ctx->families[f], t->version, nframes, sub.len);
    }
    obuf_free(&sub);
    return st;
}

static gser_status_t enc_serialized(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t base)
{
    const gser_serialized_t *s = v->u.ser;
    size_t first = e->out->n;
    for (size_t i = 0; i < s->nframes; i++) {
        gser_frame_t fr = s->frames[i];
        fr.release = NULL;
        fr.release_arg = NULL;
        if (gser__frames_push(e->out, &fr))
            return enc_fail(e, GSER_ERR_NO_MEMORY, "out of memory for the frame table");
    }
    pack_object(pk, s->type_name, s->family, s->version, first - base, s->nframes, s->header, s->header_len);
    if (e->trace) {
        char qt[GSER_QUOTED_MAX], qf[GSER_QUOTED_MAX]; /* the names came from a peer */
        gser__quote_format(s->type_name, strlen(s->type_name), qt, sizeof qt);
        gser__quote_format(s->family, strlen(s->family), qf, sizeof qf);
        enc_trace(e, "serialized type=%s family=%s version=%u frames=%zu sub-header=%zu bytes (forwarded)", qt, qf,
                  s->version, s->nframes, s->header_len);
    }
    return GSER_OK;
}

/* Scalars (also map keys, which are never traced on their own); false for
 * anything else. */
static inline __attribute__((always_inline)) bool enc_scalar(obuf_t *pk, const gser_value_t *v)
{
    switch ((gser_kind_t)v->kind) {
    case GSER_KIND_NIL: pk_nil(pk); return true;
    case GSER_KIND_BOOL:
        if (v->u.b)
            pk_true(pk);
        else
            pk_false(pk);
        return true;
    case GSER_KIND_INT: pk_int64(pk, v->u.i); return true;
    case GSER_KIND_UINT: enc_uint(pk, v->u.u); return true;
    case GSER_KIND_FLOAT: pk_double(pk, v->u.f); return true;
    case GSER_KIND_STR: pk_str_with_body(pk, v->u.s.ptr, v->u.s.len); return true;
    case GSER_KIND_BYTES: pk_bin_with_body(pk, v->u.s.ptr, v->u.s.len); return true;
    default: return false;
    }
}

static gser_status_t enc_value(enc_t *e, obuf_t *pk, const gser_value_t *v, size_t depth, size_t base)
{
    switch ((gser_kind_t)v->kind) {
    case GSER_KIND_LIST:
    case GSER_KIND_TUPLE: return enc_list(e, pk, v, depth, base);
    case GSER_KIND_MAP: return enc_map(e, pk, v, depth, base);
    case GSER_KIND_BUFFER: return enc_buffer(e, pk, v, base);
    case GSER_KIND_OBJECT: return enc_object(e, pk, v, depth, base);
    case GSER_KIND_SERIALIZED: return enc_serialized(e, pk, v, base);
    default: break;
    }
    if (!enc_scalar(pk, v))
        return enc_fail(e, GSER_ERR_INVALID_ARG, "value of unknown kind %d", v->kind);
    if (e->trace) {
        char s[80];
        gser__scalar_format(v, s, sizeof s);
        enc_trace(e, "%s %s", gser_kind_str((gser_kind_t)v->kind), s);
    }
    return GSER_OK;
}

/* ---- public ----------------------------------------------------------------------- */

gser_msg_t *gser_writer_get_msg(gser_writer_t *w)
{
    gser_msg_t *m = NULL;
    if (w && scratch_msg(w->enc, &m) != GSER_OK)
        return NULL;
    return m;
}

gser_status_t gser_writer_set_root(gser_writer_t *w, gser_value_t *tree)
{
    if (!w || !tree)
        return GSER_ERR_INVALID_ARG;
    if (w->root)
        return GSER_ERR_STATE;
    w->root = tree;
    return GSER_OK;
}

const char *gser_writer_get_family(const gser_writer_t *w)
{
    return w ? w->enc->ctx->families[w->family] : NULL;
}

void *gser_writer_get_stream(const gser_writer_t *w)
{
    return w ? w->enc->pack.stream : NULL;
}

gser_status_t gser_writer_fail(gser_writer_t *w, gser_status_t status, const char *fmt, ...)
{
    if (!w || !fmt)
        return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->enc->cb_err, sizeof w->enc->cb_err, fmt, ap);
    va_end(ap);
    return status;
}

static gser_status_t resolve_families(enc_t *e, const gser_serialize_options_t *o)
{
    if (!o || !o->families) {
        e->fam[0] = GSER_FAMILY_DEVICE;
        e->fam[1] = GSER_FAMILY_HOST;
        e->nfam = 2;
        return GSER_OK;
    }
    if (o->nfamilies == 0 || o->nfamilies > GSER_MAX_FAMILIES)
        return gser__error_set(e->ctx, GSER_ERR_INVALID_ARG, "gser_serialize: %zu families given (1..%d allowed)",
                               o->nfamilies, GSER_MAX_FAMILIES);
    for (size_t i = 0; i < o->nfamilies; i++) {
        const char *name = o->families[i];
        int f = name ? gser__context_find_family(e->ctx, name, strlen(name)) : -1;
        if (f < 0)
            return gser__error_set(e->ctx, GSER_ERR_UNKNOWN_FAMILY, "gser_serialize: family \"%s\" is not registered",
                                   name ? name : "(null)");
        e->fam[i] = f;
    }
    e->nfam = o->nfamilies;
    return GSER_OK;
}

static int first_buffer_family(const enc_t *e)
{
    for (size_t i = 0; i < e->nfam; i++)
        if (e->fam[i] == GSER_FAMILY_DEVICE || e->fam[i] == GSER_FAMILY_HOST)
            return e->fam[i];
    return -1;
}

gser_status_t gser__serialize(gser_context_t *ctx, const gser_msg_t *msg, const gser_serialize_options_t *opts,
                             bool defer, gser_frames_t **frames_out)
{
    if (!ctx || !msg || !frames_out)
        return ctx ? gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: NULL message or output")
                   : GSER_ERR_INVALID_ARG;
    gser__context_freeze(ctx);

    gser_serialize_options_t o_ = GSER_SERIALIZE_OPTIONS_INIT;
    gser_status_t st;
    if (opts && (st = gser__struct_read(ctx, "gser_serialize", "gser_serialize_options_t", &o_, sizeof o_, opts)))
        return st;
    opts = &o_;
    enc_t e;
    e.ctx = ctx;
    e.path.len = 0;
    e.failed = false;
    e.trace = ctx->trace;
    e.inline_max = opts->inline_max ? opts->inline_max : ctx->inline_max;
    e.array_min = opts->array_min ? opts->array_min : ctx->array_min;
    e.narrow_ints = opts->narrow_ints;
    e.max_depth = ctx->limits.max_depth;
    st = resolve_families(&e, opts);
    if (st)
        return st;
    e.buffer_family = first_buffer_family(&e);
    e.to_host = e.buffer_family == GSER_FAMILY_HOST;
    e.group = -1;
    gser__packer_init(&e.pack, ctx, opts->pack_max ? opts->pack_max : ctx->pack_max, opts->stream);
    e.pack.defer_host = defer;

    gser_frames_t *f = GSER_REUSE ? atomic_exchange_explicit(&ctx->spare_frames, NULL, memory_order_acquire) : NULL;
    if (!f && !(f = malloc(sizeof *f))) {
        gser__packer_free(&e.pack);
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory");
    }
    f->ctx = ctx;
    f->event = f->stream = f->dev_mem = f->pinned = NULL;
    f->dev_size = f->pinned_size = 0;
    f->batch = NULL;
    f->deferred = NULL;
    f->ndeferred = 0;
    f->frames = f->inline_frames;
    f->cap = GSER_FRAMES_INLINE;
    f->n = 1; /* [0] is the header, filled in last */
    f->header = NULL;
    f->scratch = NULL;
    f->codecs = NULL;
    e.out = f;

    obuf_t hdr;
    obuf_init(&hdr, f->header_inline, sizeof f->header_inline);
    obuf_t *pk = &hdr;
    pk_array(pk, 4);
    pk_ext_with_body(pk, "GSER", 4, GSER_EXT_MAGIC);
    pk_uint32(pk, WIRE_VERSION_PLAIN); /* made 3 below if a frame is compressed */
    st = enc_report(&e, enc_value(&e, pk, msg->root, 1, 1));
    if (st == GSER_OK)
        st = gser__packer_finish(&e.pack, f); /* sizes of packed frames are known now */
    gser__packer_free(&e.pack);
    bool compressed = false;
    if (st == GSER_OK && opts->compression)
        st = gser__frames_compress(f, opts, &compressed);
    if (st == GSER_OK) {
        if (compressed)
            hdr.p[7] = GSER_WIRE_VERSION; /* the positive fixint after the 7-byte magic */
        pk_array(pk, f->n - 1);
        for (size_t i = 1; i < f->n; i++) {
            const frame_codec_t *c = f->codecs && f->codecs[i].codec ? &f->codecs[i] : NULL;
            pk_array(pk, c ? 5 : 3);
            pk_uint64(pk, f->frames[i].size);
            pk_uint8(pk, (uint8_t)f->frames[i].memory);
            pk_int32(pk, f->frames[i].device);
            if (c) {
                pk_uint8(pk, c->codec);
                pk_uint64(pk, c->raw);
            }
        }
        if (hdr.oom)
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory for the header");
    }
    if (st) {
        obuf_free(&hdr);
        gser_frames_destroy(f);
        return st;
    }
    f->header = hdr.heap ? hdr.p : NULL;
    f->header_len = hdr.len;
    f->frames[0] = (gser_frame_t){.data = hdr.p, .size = hdr.len, .memory = GSER_MEMORY_HOST};
    if (e.trace) {
        gser__trace_line(e.trace, "serialize header %zu bytes, %zu data frames", hdr.len, f->n - 1);
        for (size_t i = 1; i < f->n; i++)
            if (f->codecs && f->codecs[i].codec)
                gser__trace_line(e.trace, "serialize frame %zu %s %zu bytes, %s of %zu bytes", i,
                                 gser_memory_str(f->frames[i].memory), f->frames[i].size,
                                 gser__codec_name(f->codecs[i].codec), f->codecs[i].raw);
            else
                gser__trace_line(e.trace, "serialize frame %zu %s %zu bytes", i, gser_memory_str(f->frames[i].memory),
                                 f->frames[i].size);
    }
    *frames_out = f;
    return GSER_OK;
}

gser_status_t gser_serialize(gser_context_t *ctx, const gser_msg_t *msg, const gser_serialize_options_t *opts,
                             gser_frames_t **frames_out)
{
    return gser__serialize(ctx, msg, opts, false, frames_out);
}

gser_status_t gser_frames_wait(const gser_frames_t *frames)
{
    if (!frames)
        return GSER_ERR_INVALID_ARG;
    if (!frames->event)
        return GSER_OK;
    gser_context_t *ctx = frames->ctx;
    gser_status_t st = devl_event_sync(ctx->devl, frames->event);
    return st ? gser__ctxdev_fail(ctx, st, "gser_frames_wait") : GSER_OK;
}

gser_status_t gser_frames_query(const gser_frames_t *frames)
{
    if (!frames)
        return GSER_ERR_INVALID_ARG;
    if (!frames->event)
        return GSER_OK;
    gser_context_t *ctx = frames->ctx;
    gser_status_t st = devl_event_query(ctx->devl, frames->event);
    return st < 0 ? gser__ctxdev_fail(ctx, st, "gser_frames_query") : st;
}

void gser_frames_destroy(gser_frames_t *frames)
{
    if (!frames)
        return;
    /* The tests keep the calls off the path of small host messages. */
    if (frames->ctx->devl)
        gser__packer_release(frames);
    if (frames->frames != frames->inline_frames)
        free(frames->frames);
    if (frames->header)
        free(frames->header);
    if (frames->scratch)
        gser_msg_destroy(frames->scratch);
    gser__frames_codecs_free(frames);
    free(frames->deferred);
    gser_frames_t *none = NULL;
    if (!GSER_REUSE || !atomic_compare_exchange_strong_explicit(&frames->ctx->spare_frames, &none, frames,
                                                                memory_order_release, memory_order_relaxed))
        free(frames);
}
