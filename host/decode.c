/* gser_deserialize: header + frames -> a value tree, for untrusted input.
 *
 * Every msgpack unit (the header's root, each object's sub-header) is parsed
 * straight into values by msgpack-c's unpack template under gser's limits
 * (mpparse.c); gser's markers are finished here as their last field
 * arrives, with every frame reference and size checked. The frame table is
 * checked once the root is parsed, before any type's deserializer runs.
 * Values point into the frames where they can (bytes, buffers, arrays).
 */
#include <stdlib.h>
#include <string.h>

#include "decode.h"

struct gser_reader {
    dec_t *dec;
    gser_value_t *tree;
    uint32_t version;
    const char *family;
};

/* An object to rebuild once the frame table is checked. */
struct dec_object {
    gser_value_t *v; /* an object value whose obj is still NULL */
    const unsigned char *sub;
    size_t sub_len;
    size_t depth, first, nframes;
    const gser_type_t *type;
    int fam;
    uint32_t version;
    path_t path;
};

static gser_status_t dec_fail(dec_t *d, gser_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static gser_status_t dec_fail(dec_t *d, gser_status_t st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    gser__path_vmessage(&d->path, ": ", msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gser__error_set(d->ctx, st, "%s: %s", d->what, msg);
}

static void dec_trace(dec_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void dec_trace(dec_t *d, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    gser__path_vmessage(&d->path, "  ", msg, sizeof msg, fmt, ap);
    va_end(ap);
    gser__trace_line(d->trace, "deserialize %s", msg);
}

static gser_status_t nomem(dec_t *d)
{
    return dec_fail(d, GSER_ERR_NO_MEMORY, "out of memory");
}

static gser_status_t dec_device_flush(dec_t *d);

/* ---- marker fields: values made by the parser -------------------------------------- */

/* A msgpack positive integer (not a uint that came as an ext). */
static bool get_u64(const gser_value_t *v, uint64_t *out)
{
    if (v->kind == GSER_KIND_INT && v->u.i >= 0) {
        *out = (uint64_t)v->u.i;
        return true;
    }
    if (v->kind == GSER_KIND_UINT && !(v->flags & VF_EXT_UINT)) {
        *out = v->u.u;
        return true;
    }
    return false;
}

static bool get_i64(const gser_value_t *v, int64_t *out)
{
    if (v->kind != GSER_KIND_INT)
        return false;
    *out = v->u.i;
    return true;
}

/* An array field (shape, strides, reference) of n items. */
static bool get_ints(const gser_value_t *v, size_t n)
{
    return v->kind == GSER_KIND_LIST && v->u.list->len == n;
}

static bool get_str(const gser_value_t *v, size_t max, const char **s, size_t *len)
{
    if (v->kind != GSER_KIND_STR || v->u.s.len == 0 || v->u.s.len > max || memchr(v->u.s.ptr, '\0', v->u.s.len))
        return false;
    *s = v->u.s.ptr;
    *len = v->u.s.len;
    return true;
}

static size_t dtype_align(size_t es)
{
    return es > 16 ? 16 : es; /* element sizes are powers of two */
}

/* The length a data field declares: a bin's, or a reference's third field. */
static bool data_len(const gser_value_t *v, uint64_t *len)
{
    if (v->kind == GSER_KIND_BYTES) {
        *len = v->u.s.len;
        return true;
    }
    return get_ints(v, 3) && get_u64(v->u.list->items[2], len);
}

/* Data of a buffer or array: inline bin or [frame, offset, nbytes] within
 * the unit's frames. *raw points at the bytes as they are (in the header or
 * the frame); *frame is the frame's index, or SIZE_MAX. */
static gser_status_t dec_data(mp_unit_t *u, const gser_value_t *v, size_t nbytes, const void **raw, size_t *frame,
                              char *where, size_t where_cap)
{
    dec_t *d = u->d;
    *frame = SIZE_MAX;
    if (v->kind == GSER_KIND_BYTES) {
        if (v->u.s.len != nbytes)
            return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "inline data has %zu bytes, %zu expected", v->u.s.len,
                                      nbytes);
        *raw = v->u.s.ptr;
        snprintf(where, where_cap, "inline");
        return GSER_OK;
    }
    uint64_t rel, off, len;
    if (!get_ints(v, 3) || !get_u64(v->u.list->items[0], &rel) || !get_u64(v->u.list->items[1], &off) ||
        !get_u64(v->u.list->items[2], &len))
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "data is neither bin nor a [frame, offset, nbytes] reference");
    if (len != nbytes)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "reference covers %llu bytes, %zu expected",
                                  (unsigned long long)len, nbytes);
    if (rel >= u->fn)
        return gser__mp_unit_fail(u, GSER_ERR_FRAME, "frame reference %llu is outside this object's %zu frames",
                                  (unsigned long long)rel, u->fn);
    const gser_frame_t *f = &d->frames[u->fbase + rel];
    if (off > f->size || len > f->size - off) /* the numbers as sent: their sum may wrap */
        return gser__mp_unit_fail(u, GSER_ERR_FRAME, "%llu bytes at offset %llu are outside frame %zu of %zu bytes",
                                  (unsigned long long)len, (unsigned long long)off, u->fbase + rel + 1, f->size);
    if (len && !f->data)
        return gser__mp_unit_fail(u, GSER_ERR_FRAME, "frame %zu has no data", u->fbase + rel + 1);
    *raw = (const char *)f->data + off;
    *frame = u->fbase + (size_t)rel;
    snprintf(where, where_cap, "frame %zu %s", u->fbase + rel + 1, gser_memory_str(f->memory));
    return GSER_OK;
}

/* Host bytes usable as a typed pointer: copied when not aligned to align. */
static gser_status_t host_aligned(dec_t *d, const void *raw, size_t nbytes, size_t align, const void **data)
{
    if (nbytes && ((uintptr_t)raw & (align - 1))) {
        void *copy = gser__msg_alloc(d->msg, nbytes, 16);
        if (!copy)
            return nomem(d);
        memcpy(copy, raw, nbytes);
        raw = copy;
    }
    *data = raw;
    return GSER_OK;
}

/* A buffer that lived on a device at the sender but came in host memory:
 * put it back, uploading its whole frame once (or just it, if inline). */
static gser_status_t restore_device(dec_t *d, const void *raw, size_t nbytes, size_t frame, void **dev)
{
    gser_context_t *ctx = d->ctx;
    gser_status_t st = gser__ctxdev_need(ctx, d->what);
    if (st)
        return st;
    const void *src = raw;
    size_t size = nbytes, off = 0;
    if (frame != SIZE_MAX) {
        if (!d->uploaded) {
            d->uploaded = gser__msg_alloc(d->msg, d->nframes * sizeof *d->uploaded, alignof(void *));
            if (!d->uploaded)
                return nomem(d);
            memset(d->uploaded, 0, d->nframes * sizeof *d->uploaded);
        }
        off = (size_t)((const char *)raw - (const char *)d->frames[frame].data);
        if (d->uploaded[frame]) {
            *dev = (char *)d->uploaded[frame] + off;
            return GSER_OK;
        }
        src = d->frames[frame].data;
        size = d->frames[frame].size;
    }
    void *p;
    if ((st = gser__msgdev_alloc(d->msg, d->stream, size, false, &p)))
        return dec_fail(d, st, "allocating %zu bytes of device memory failed", size);
    void *event;
    if ((st = devl_memcpy(ctx->devl, p, src, size, DEVL_H2D, d->stream)) || (st = gser__msgdev_record(d->msg, &event)))
        return gser__ctxdev_fail(ctx, st, "gser_deserialize: copying a frame to the device");
    if (frame != SIZE_MAX)
        d->uploaded[frame] = p;
    *dev = (char *)p + off;
    return GSER_OK;
}

static gser_status_t note_dev_val(dec_t *d, gser_value_t *v)
{
    if (d->ndev_vals == d->cap_dev_vals &&
        gser__arena_vec_reserve(&d->msg->arena, (void **)&d->dev_vals, &d->cap_dev_vals, sizeof *d->dev_vals,
                                d->ndev_vals + 1))
        return nomem(d);
    d->dev_vals[d->ndev_vals++] = v;
    return GSER_OK;
}

/* ---- markers ------------------------------------------------------------------- */

/* The strides field of a buffer marker: ndim byte strides whose elements'
 * span is found (0 and the bytes of the shape for C order). *strides is set
 * to NULL for C order, which the receiver sees the same as no strides. */
static gser_status_t dec_strides(mp_unit_t *u, const gser_value_t *v, const int64_t *shape, uint32_t ndim, size_t es,
                                 int64_t *store, const int64_t **strides, size_t *first, size_t *span)
{
    if (u->d->version < 2)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT,
                                  "buffer strides need wire format version 2, the header is version %u", u->d->version);
    if (ndim == 0)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer has strides but no shape");
    if (!get_ints(v, ndim))
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer strides are not an array of %u integers, one per dim",
                                  ndim);
    for (uint32_t k = 0; k < ndim; k++)
        if (!get_i64(v->u.list->items[k], &store[k]))
            return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer stride %u is not a 64-bit integer", k);
    uint32_t bad = gser__layout_span(ndim, shape, store, es, first, span);
    if (bad)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT,
                                  "buffer strides[%u] = %lld: the elements span more than 2^63 - 1 bytes", bad - 1,
                                  (long long)store[bad - 1]);
    *strides = gser__layout_is_c(ndim, shape, store, es) ? NULL : store;
    return GSER_OK;
}

/* The shape field of a buffer marker: nil (*ndim 0) or 1..GSER_MAX_NDIM
 * non-negative dims whose elements (es bytes each) hold at most 2^63 - 1
 * bytes, *total. */
static gser_status_t dec_shape(mp_unit_t *u, const gser_value_t *v, size_t es, int64_t *shape, uint32_t *ndim,
                               uint64_t *total)
{
    *ndim = 0;
    *total = es;
    if (v->kind == GSER_KIND_NIL)
        return GSER_OK;
    if (v->kind != GSER_KIND_LIST)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer shape is neither nil nor an array");
    size_t n = v->u.list->len;
    if (n == 0 || n > GSER_MAX_NDIM)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer shape has %zu dims (1..%d allowed)", n, GSER_MAX_NDIM);
    for (uint32_t i = 0; i < (uint32_t)n; i++) {
        uint64_t ext;
        if (!get_u64(v->u.list->items[i], &ext) || ext > INT64_MAX)
            return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer shape dim %u is not a non-negative integer", i);
        /* numpy's limit, and what a signed size can hold */
        if (ext && *total > INT64_MAX / ext)
            return gser__mp_unit_fail(u, GSER_ERR_FORMAT,
                                      "buffer shape dim %u: the elements hold more than 2^63 - 1 bytes", i);
        *total *= ext;
        shape[i] = (int64_t)ext;
    }
    *ndim = (uint32_t)n;
    return GSER_OK;
}

/* The length of a buffer's data field checked against its shape (and, with
 * laid_out, the span its strides cover): *span is the bytes the data holds. */
static gser_status_t dec_buffer_len(mp_unit_t *u, const gser_value_t *data, gser_dtype_t dtype, size_t es,
                                    uint32_t ndim, uint64_t total, bool laid_out, size_t strided_span, size_t *span)
{
    /* the data's length comes from the data: a bin's size or the reference's
     * length; with strides it is the span the elements cover */
    uint64_t len;
    if (!data_len(data, &len))
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT,
                                  "buffer data is neither bin nor a [frame, offset, nbytes] reference");
    if (len > SIZE_MAX)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer too large");
    if (laid_out) {
        if (len != strided_span)
            return gser__mp_unit_fail(u, GSER_ERR_FORMAT,
                                      "buffer data holds %llu bytes, its shape and strides span %zu",
                                      (unsigned long long)len, strided_span);
    } else if (ndim ? total != len : len % es != 0) {
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer of %s holds %llu bytes, its shape says %llu",
                                  gser_dtype_str(dtype), (unsigned long long)len,
                                  (unsigned long long)(ndim ? total : len - len % es));
    }
    *span = (size_t)len;
    return GSER_OK;
}

/* Where a buffer's span bytes at raw end up: uploaded back to the device it
 * came from (GSER_DESERIALIZE_RESTORE_DEVICE), copied when misaligned on the
 * host, or used where they are. *mem, *device and *copied say which. */
static gser_status_t dec_buffer_place(dec_t *d, const void *raw, size_t span, size_t frame, uint64_t origin,
                                      size_t es, const void **data, gser_memory_t *mem, int32_t *device, bool *copied)
{
    gser_status_t st;
    *mem = frame != SIZE_MAX ? d->frames[frame].memory : GSER_MEMORY_HOST;
    *device = frame != SIZE_MAX ? d->frames[frame].device : d->ctx->ordinal;
    *copied = false;
    if (span == 0 && origin == GSER_MEMORY_DEVICE) {
        *mem = GSER_MEMORY_DEVICE; /* an empty device buffer travels inline; it is still one */
        raw = NULL;
    }
    if (*mem == GSER_MEMORY_HOST && origin == GSER_MEMORY_DEVICE && (d->flags & GSER_DESERIALIZE_RESTORE_DEVICE) &&
        span) {
        void *dev = NULL;
        if ((st = restore_device(d, raw, span, frame, &dev)))
            return st;
        *data = dev;
        *mem = GSER_MEMORY_DEVICE;
        *device = d->ctx->ordinal;
        *copied = true;
        return GSER_OK;
    }
    if (*mem == GSER_MEMORY_HOST)
        return host_aligned(d, raw, span, dtype_align(es), data);
    *data = raw;
    return GSER_OK;
}

/* [ext(4), dtype, shape, data, origin(, strides)]: f are the fields after the ext. */
static gser_status_t dec_buffer(mp_unit_t *u, gser_value_t *v, gser_value_t *const *f, size_t nf)
{
    dec_t *d = u->d;
    uint64_t dtype;
    if ((nf != 4 && nf != 5) || !get_u64(f[0], &dtype) || dtype >= GSER_DTYPE_COUNT)
        return gser__mp_unit_fail(
            u, GSER_ERR_FORMAT,
            "buffer marker needs [marker, dtype, shape, data, origin(, strides)] with a known dtype");
    size_t es = gser_dtype_size((gser_dtype_t)dtype);
    int64_t shape[GSER_MAX_NDIM];
    uint32_t ndim;
    uint64_t total;
    gser_status_t st = dec_shape(u, f[1], es, shape, &ndim, &total);
    if (st)
        return st;
    int64_t stride_store[GSER_MAX_NDIM];
    const int64_t *strides = NULL;
    size_t first = 0, span = (size_t)total;
    bool laid_out = nf == 5;
    if (laid_out && (st = dec_strides(u, f[4], shape, ndim, es, stride_store, &strides, &first, &span)))
        return st;
    if ((st = dec_buffer_len(u, f[2], (gser_dtype_t)dtype, es, ndim, total, laid_out, span, &span)))
        return st;
    size_t nbytes = laid_out ? (size_t)total : span;
    uint64_t origin;
    if (!get_u64(f[3], &origin) || origin > GSER_MEMORY_DEVICE)
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "buffer origin is not 0 (host) or 1 (device)");
    const void *raw, *data = NULL;
    size_t frame;
    char where[64];
    if ((st = dec_data(u, f[2], span, &raw, &frame, where, sizeof where)))
        return st;
    gser_memory_t mem;
    int32_t device;
    bool copied;
    if ((st = dec_buffer_place(d, raw, span, frame, origin, es, &data, &mem, &device, &copied)))
        return st;
    gser_buffer_desc_t desc = {.size = sizeof desc,
                               .data = first ? (const char *)data + first : data,
                               .nbytes = nbytes,
                               .dtype = (gser_dtype_t)dtype,
                               .ndim = ndim,
                               .shape = shape,
                               .memory = mem,
                               .device = device,
                               .strides = strides};
    if (!gser__buffer_value(d->msg, v, &desc, first, span))
        return nomem(d);
    if (mem == GSER_MEMORY_DEVICE && span && (copied || (d->flags & GSER_DESERIALIZE_SCATTER)) &&
        (st = note_dev_val(d, v)))
        return st;
    if (d->trace) {
        char layout[160];
        gser__layout_format(&desc, span, layout, sizeof layout);
        gser__mp_unit_trace(u, "buffer %s ndim=%u bytes=%zu%s %s%s%s", gser_dtype_str(desc.dtype), ndim, desc.nbytes,
                            layout, where, origin == GSER_MEMORY_DEVICE ? " (from device)" : "",
                            copied ? " -> device" : "");
    }
    return GSER_OK;
}

/* [ext(5), container, kind, count, data] */
static gser_status_t dec_array(mp_unit_t *u, gser_value_t *v, gser_value_t *const *f, size_t nf)
{
    dec_t *d = u->d;
    uint64_t container, kind, count;
    size_t es = 0;
    if (nf == 4 && get_u64(f[1], &kind)) {
        if (kind >= GSER_ARRAY_INT8 && kind <= GSER_ARRAY_INT32) /* narrow ints: 1, 2, 4 bytes */
            es = (size_t)1 << (kind - GSER_ARRAY_INT8);
        else if (kind <= GSER_KIND_FLOAT)
            es = gser__scalar_kind_size((gser_kind_t)kind);
    }
    if (es == 0 || !get_u64(f[0], &container) || container > 1 || !get_u64(f[2], &count))
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT,
                                  "array marker needs [marker, 0|1, bool|int|uint|float|int8|int16|int32 kind, "
                                  "count, data]");
    if (count > SIZE_MAX / (kind >= GSER_ARRAY_INT8 ? 8 : es)) /* narrow ints are widened to 8 bytes */
        return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "array of %llu elements is too large", (unsigned long long)count);
    size_t nbytes = (size_t)count * es;
    const void *raw, *data = NULL;
    size_t frame;
    char where[64];
    gser_status_t st = dec_data(u, f[3], nbytes, &raw, &frame, where, sizeof where);
    if (st)
        return st;
    if (frame != SIZE_MAX && d->frames[frame].memory != GSER_MEMORY_HOST)
        return gser__mp_unit_fail(u, GSER_ERR_FRAME, "array data is in %s memory, arrays live in host memory",
                                  gser_memory_str(d->frames[frame].memory));
    if (kind >= GSER_ARRAY_INT8) {
        /* widened to the int64 items of the value model, in the message's
         * memory (bounded by the limits' max_expansion like any other) */
        int64_t *wide = gser__msg_alloc(d->msg, (size_t)count * 8, 16);
        if (!wide)
            return nomem(d);
        const unsigned char *b = raw;
        for (size_t i = 0; i < (size_t)count; i++) {
            if (es == 1) {
                wide[i] = (int8_t)b[i];
            } else if (es == 2) {
                int16_t x;
                memcpy(&x, b + 2 * i, 2);
                wide[i] = x;
            } else {
                int32_t x;
                memcpy(&x, b + 4 * i, 4);
                wide[i] = x;
            }
        }
        data = wide;
    } else if ((st = host_aligned(d, raw, nbytes, es, &data))) {
        return st;
    }
    if (kind == GSER_KIND_BOOL) {
        const unsigned char *b = data;
        for (size_t i = 0; i < nbytes; i++)
            if (b[i] > 1)
                return gser__mp_unit_fail(u, GSER_ERR_FORMAT, "bool array element %zu is %u, not 0 or 1", i, b[i]);
    }
    /* the marker's array becomes the list, backed by the data (borrowed) */
    gser_list_t *l = v->u.list;
    *l = (gser_list_t){.mode = LIST_ARRAY,
                       .arr_kind = kind >= GSER_ARRAY_INT8 ? GSER_KIND_INT : (gser_kind_t)kind,
                       .explicit_array = true,
                       .arr_borrowed = true,
                       .len = (size_t)count,
                       .arr = (void *)data};
    v->kind = container ? GSER_KIND_TUPLE : GSER_KIND_LIST;
    if (d->trace)
        gser__mp_unit_trace(u, "%s array<%s%s> n=%zu bytes=%zu %s", container ? "tuple" : "list",
                            gser_kind_str(l->arr_kind),
                            kind == GSER_ARRAY_INT8    ? "8"
                            : kind == GSER_ARRAY_INT16 ? "16"
                            : kind == GSER_ARRAY_INT32 ? "32"
                                                       : "",
                            (size_t)count, nbytes, where);
    return GSER_OK;
}

static void run_destroy(void *arg)
{
    gser_value_t *v = arg;
    if (v->flags & VF_OWNED)
        v->u.obj->type->destroy(v->u.obj->obj, v->u.obj->type->user_data);
}

/* Decode an object's sub-header and hand it to its type's deserializer. */
static gser_status_t rebuild(dec_t *d, const dec_object_t *o)
{
    path_t outer = d->path;
    bool defer = d->defer;
    d->path = o->path; /* the sub-tree's paths, and this object's errors, start at the object */
    d->defer = false;  /* the frame table is checked by now */
    const gser_type_t *t = o->type;
    gser_value_t *tree = NULL;
    gser_status_t st = gser__mp_parse_unit(d, o->sub, o->sub_len, o->depth + 1, o->first, o->nframes, true,
                                           "sub-header", 0, &tree, NULL);
    /* The deserializer must see its buffers as they will be: scattered,
     * restored, and with the event of the copies. */
    if (st == GSER_OK)
        st = dec_device_flush(d);
    gser_reader_t r = {.dec = d, .tree = tree, .version = o->version, .family = d->ctx->families[o->fam]};
    void *obj = NULL;
    if (st == GSER_OK) {
        d->cb_err[0] = '\0';
        st = t->fam[o->fam].deserialize(d->ctx, &r, &obj, t->user_data);
        if (st != GSER_OK) {
            if (st > GSER_OK)
                st = GSER_ERR_CALLBACK;
            st = dec_fail(d, st, "type \"%s\", family \"%s\": deserializer failed: %s", t->name, r.family,
                          d->cb_err[0] ? d->cb_err : gser_status_str(st));
        }
    }
    if (st == GSER_OK) {
        gser_value_t *v = o->v;
        v->u.obj->obj = obj;
        if (t->destroy && gser__arena_on_release(&d->msg->arena, run_destroy, v)) {
            t->destroy(obj, t->user_data);
            st = nomem(d);
        } else if (t->destroy) {
            v->flags |= VF_OWNED;
        }
    }
    if (st == GSER_OK && d->trace)
        dec_trace(d, "object type=%s family=%s version=%u frames=%zu sub-header=%zu bytes", t->name, r.family,
                  o->version, o->nframes, o->sub_len);
    d->path = outer;
    d->defer = defer;
    return st;
}

/* The fields of an object marker, as read from the wire. */
typedef struct obj_marker {
    const char *tname, *fname;
    size_t tlen, flen;
    uint64_t version, nfr;
    size_t first;             /* its first frame among the message's */
    const unsigned char *sub; /* its sub-header */
    size_t sub_len;
    size_t depth; /* the marker's own value depth */
} obj_marker_t;

/* Read the six fields after an object marker's ext into *m; its frames must
 * be within those the unit may use. */
static gser_status_t obj_marker_read(mp_unit_t *u, gser_value_t *const *f, size_t nf, obj_marker_t *m)
{
    uint64_t rel;
    if (nf != 6 || !get_str(f[0], GSER_TYPE_NAME_MAX, &m->tname, &m->tlen) ||
        !get_str(f[1], GSER_FAMILY_NAME_MAX, &m->fname, &m->flen) || !get_u64(f[2], &m->version) ||
        m->version > UINT32_MAX || !get_u64(f[3], &rel) || !get_u64(f[4], &m->nfr) || f[5]->kind != GSER_KIND_BYTES)
        return gser__mp_unit_fail(
            u, GSER_ERR_FORMAT,
            "object marker needs [marker, type, family, version, frame base, frame count, sub-header]");
    if (rel > u->fn || m->nfr > u->fn - rel) /* the numbers as sent: their sum may wrap */
        return gser__mp_unit_fail(u, GSER_ERR_FRAME,
                                  "object frame base %llu and frame count %llu are outside the %zu frames it may use",
                                  (unsigned long long)rel, (unsigned long long)m->nfr, u->fn);
    m->first = u->fbase + (size_t)rel;
    m->sub = (const unsigned char *)f[5]->u.s.ptr;
    m->sub_len = f[5]->u.s.len;
    m->depth = u->depth + u->open;
    return GSER_OK;
}

/* Pass-through: nothing of the object is decoded, but its sub-header must
 * still be well-formed msgpack within the limits, and its sub-tree starts at
 * depth + 1 (wire-format.md 4.7). A sub-header walked already with its
 * enclosing object's is not walked again. */
static gser_status_t obj_check_kept(mp_unit_t *u, const obj_marker_t *m)
{
    dec_t *d = u->d;
    char qt[GSER_QUOTED_MAX];
    if (m->depth + 1 > d->lim.max_depth) {
        gser__quote_format(m->tname, m->tlen, qt, sizeof qt);
        return gser__mp_unit_fail(u, GSER_ERR_LIMIT_DEPTH, "the sub-tree of type %s is deeper than the limit of %zu",
                                  qt, d->lim.max_depth);
    }
    if (d->checked)
        return GSER_OK;
    size_t used, off;
    const char *why;
    gser_status_t st =
        gser__mp_check(m->sub, m->sub_len, d->lim.max_depth - m->depth + 1, &d->nodes_left, &used, &off, &why);
    if (st == GSER_OK && used != m->sub_len) {
        st = GSER_ERR_FORMAT;
        off = used;
        why = "has trailing bytes";
    }
    if (st) {
        gser__quote_format(m->tname, m->tlen, qt, sizeof qt);
        return gser__mp_unit_fail(u, st, "sub-header of type %s %s at byte %zu of %zu", qt, why, off, m->sub_len);
    }
    return GSER_OK;
}

/* Make v a serialized value that keeps the object's sub-header and frames
 * as they came (GSER_DESERIALIZE_KEEP_SERIALIZED, or a type not known here). */
static gser_status_t obj_keep(mp_unit_t *u, gser_value_t *v, const obj_marker_t *m)
{
    dec_t *d = u->d;
    gser_status_t st = obj_check_kept(u, m);
    if (st)
        return st;
    gser_serialized_t *s = gser__msg_alloc(d->msg, sizeof *s, alignof(gser_serialized_t));
    gser_frame_t *frs =
        s && m->nfr ? gser__msg_alloc(d->msg, (size_t)m->nfr * sizeof *frs, alignof(gser_frame_t)) : NULL;
    if (!s || (m->nfr && !frs))
        return nomem(d);
    s->type_name = gser__msg_strdup(d->msg, m->tname, m->tlen);
    s->family = gser__msg_strdup(d->msg, m->fname, m->flen);
    if (!s->type_name || !s->family)
        return nomem(d);
    s->version = (uint32_t)m->version;
    s->header = m->sub;
    s->header_len = m->sub_len;
    for (size_t i = 0; i < m->nfr; i++) {
        frs[i] = d->frames[m->first + i];
        frs[i].release = NULL;
        frs[i].release_arg = NULL;
    }
    s->frames = frs;
    s->nframes = (size_t)m->nfr;
    s->depth = m->depth;
    v->kind = GSER_KIND_SERIALIZED;
    v->u.ser = s;
    if (d->trace) {
        char qt[GSER_QUOTED_MAX], qf[GSER_QUOTED_MAX];
        gser__quote_format(m->tname, m->tlen, qt, sizeof qt);
        gser__quote_format(m->fname, m->flen, qf, sizeof qf);
        gser__mp_unit_trace(u, "serialized type=%s family=%s version=%u frames=%zu sub-header=%zu bytes (kept)", qt, qf,
                            s->version, s->nframes, m->sub_len);
    }
    return GSER_OK;
}

/* The message's version of type t must be one this build can read. */
static gser_status_t obj_check_version(mp_unit_t *u, const gser_type_t *t, uint64_t version)
{
    if (version >= t->min_read_version && version <= t->version)
        return GSER_OK;
    if (t->min_read_version == t->version)
        return gser__mp_unit_fail(u, GSER_ERR_VERSION, "type \"%s\" is version %llu in the message, version %u here",
                                  t->name, (unsigned long long)version, t->version);
    return gser__mp_unit_fail(u, GSER_ERR_VERSION,
                              "type \"%s\" is version %llu in the message, versions %u..%u can be read here", t->name,
                              (unsigned long long)version, t->min_read_version, t->version);
}

/* Rebuild the object now, or, in the header's root, queue it until the
 * frame table is checked. */
static gser_status_t obj_rebuild_or_defer(dec_t *d, const dec_object_t *o)
{
    if (!d->defer)
        return rebuild(d, o);
    if (d->nlater == d->cap_later) {
        size_t cap = d->cap_later ? 2 * d->cap_later : 4;
        dec_object_t *nl = realloc(d->later, cap * sizeof *nl);
        if (!nl)
            return nomem(d);
        d->later = nl;
        d->cap_later = cap;
    }
    d->later[d->nlater++] = *o;
    return GSER_OK;
}

/* [ext(6), type, family, version, base, count, sub-header]: kept as it came,
 * or rebuilt by its type's deserializer. */
static gser_status_t dec_object(mp_unit_t *u, gser_value_t *v, gser_value_t *const *f, size_t nf)
{
    dec_t *d = u->d;
    obj_marker_t m = {0};
    gser_status_t st = obj_marker_read(u, f, nf, &m);
    if (st)
        return st;
    const gser_type_t *t = gser__context_find_type(d->ctx, m.tname, m.tlen);
    int fam = gser__context_find_family(d->ctx, m.fname, m.flen);
    bool can_rebuild = t && fam >= 0 && t->fam[fam].deserialize;
    if (!(d->flags & GSER_DESERIALIZE_KEEP_SERIALIZED) && !can_rebuild &&
        !(d->flags & GSER_DESERIALIZE_ALLOW_UNKNOWN)) {
        char qt[GSER_QUOTED_MAX], qf[GSER_QUOTED_MAX]; /* names from the wire, escaped for messages */
        gser__quote_format(m.tname, m.tlen, qt, sizeof qt);
        if (!t)
            return gser__mp_unit_fail(u, GSER_ERR_UNKNOWN_TYPE, "type %s is not registered", qt);
        gser__quote_format(m.fname, m.flen, qf, sizeof qf);
        return gser__mp_unit_fail(u, GSER_ERR_NO_SERIALIZER, "type %s has no deserializer for family %s", qt, qf);
    }
    if ((d->flags & GSER_DESERIALIZE_KEEP_SERIALIZED) || !can_rebuild)
        return obj_keep(u, v, &m);
    if ((st = obj_check_version(u, t, m.version)))
        return st;
    gser_object_t *ob = gser__msg_alloc(d->msg, sizeof *ob, alignof(gser_object_t));
    if (!ob)
        return nomem(d);
    *ob = (gser_object_t){.type = t, .obj = NULL};
    v->kind = GSER_KIND_OBJECT;
    v->u.obj = ob;
    dec_object_t o = {.v = v,
                      .sub = m.sub,
                      .sub_len = m.sub_len,
                      .depth = m.depth,
                      .first = m.first,
                      .nframes = (size_t)m.nfr,
                      .type = t,
                      .fam = fam,
                      .version = (uint32_t)m.version};
    gser__mp_unit_path(u, &o.path);
    return obj_rebuild_or_defer(d, &o);
}

static gser_status_t dec_marker(mp_unit_t *u, gser_value_t *v)
{
    gser_list_t *l = v->u.list;
    uint8_t marker = l->marker;
    l->marker = MARK_NONE;
    switch (marker) {
    case MARK_BUFFER: return dec_buffer(u, v, l->items, l->len);
    case MARK_ARRAY: return dec_array(u, v, l->items, l->len);
    default: return dec_object(u, v, l->items, l->len);
    }
}

/* ---- reader ------------------------------------------------------------------------- */

gser_value_t *gser_reader_get_tree(gser_reader_t *r)
{
    return r ? r->tree : NULL;
}

uint32_t gser_reader_get_version(const gser_reader_t *r)
{
    return r ? r->version : 0;
}

const char *gser_reader_get_family(const gser_reader_t *r)
{
    return r ? r->family : NULL;
}

gser_msg_t *gser_reader_get_msg(gser_reader_t *r)
{
    return r ? r->dec->msg : NULL;
}

void *gser_reader_get_stream(const gser_reader_t *r)
{
    return r ? r->dec->stream : NULL;
}

unsigned gser_reader_get_flags(const gser_reader_t *r)
{
    return r ? r->dec->flags : 0;
}

gser_status_t gser_reader_fail(gser_reader_t *r, gser_status_t status, const char *fmt, ...)
{
    if (!r || !fmt)
        return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->dec->cb_err, sizeof r->dec->cb_err, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- device work after the tree is built ------------------------------------------------ */

/* With GSER_DESERIALIZE_SCATTER every device buffer gets an allocation of its
 * own, filled by one copy plan (one kernel); then one event marks the end of
 * the device work so far and every buffer gser copied carries it. Runs once
 * at the end, and before a type's deserializer if it has buffers pending. */
static gser_status_t dec_device_flush(dec_t *d)
{
    size_t first = d->flushed, n = d->ndev_vals - first;
    if (n == 0)
        return GSER_OK;
    gser_context_t *ctx = d->ctx;
    gser_value_t **vals = d->dev_vals + first;
    gser_status_t st;
    if (d->flags & GSER_DESERIALIZE_SCATTER) {
        devl_batch_t *b;
        devl_arrays_t a;
        if ((st = gser__msgdev_batch(d->msg, d->stream, n, &b, &a)))
            return gser__ctxdev_fail(ctx, st, "gser_deserialize: planning the scatter kernel");
        for (size_t i = 0; i < n; i++) {
            const gser_buffer_t *buf = vals[i]->u.buf; /* its span is what is copied */
            if ((st = gser__msgdev_alloc(d->msg, d->stream, buf->span, false, &a.dst[i])))
                return gser__error_set(ctx, st,
                                       "%s: allocating %zu bytes of device memory for a scattered buffer failed",
                                       d->what, buf->span);
            a.src[i] = (const char *)buf->desc.data - buf->first;
            a.size[i] = buf->span;
        }
        if ((st = devl_batch_run(ctx->devl, b, NULL, d->stream)))
            return gser__ctxdev_fail(ctx, st, "gser_deserialize: the scatter kernel");
        for (size_t i = 0; i < n; i++)
            vals[i]->u.buf->desc.data = (char *)a.dst[i] + vals[i]->u.buf->first;
    }
    void *event;
    if ((st = gser__msgdev_record(d->msg, &event)))
        return gser__ctxdev_fail(ctx, st, "gser_deserialize: recording the message's event");
    for (size_t i = 0; i < n; i++)
        vals[i]->u.buf->desc.event = event;
    d->flushed = d->ndev_vals;
    return GSER_OK;
}

/* ---- public ---------------------------------------------------------------------------- */

static const unsigned char magic[] = {0x94, 0xd6, GSER_EXT_MAGIC, 'G', 'S', 'E', 'R'};

/* A msgpack integer at p[0..len): its bytes, 0 if it is not one, SIZE_MAX if
 * it is cut short. *neg for a negative one (*v then holds it as int64). */
static size_t mp_int(const unsigned char *p, size_t len, uint64_t *v, bool *neg)
{
    if (len == 0)
        return SIZE_MAX;
    unsigned c = p[0];
    *neg = false;
    if (c <= 0x7f || c >= 0xe0) { /* fixints */
        *v = (uint64_t)(int64_t)(c <= 0x7f ? (int)c : (int)(int8_t)c);
        *neg = c >= 0xe0;
        return 1;
    }
    if (c < 0xcc || c > 0xd3)
        return 0;
    unsigned w = 1u << (c & 3); /* uint8..64 (cc..cf), int8..64 (d0..d3) */
    if (len < 1 + (size_t)w)
        return SIZE_MAX;
    uint64_t x = 0;
    for (unsigned i = 0; i < w; i++)
        x = (x << 8) | p[1 + i];
    if (c >= 0xd0 && w < 8 && (x >> (8 * w - 1)))
        x |= ~(uint64_t)0 << (8 * w); /* sign-extend */
    *neg = c >= 0xd0 && (int64_t)x < 0;
    *v = x;
    return 1 + w;
}

/* A msgpack array's count at p[0..len), as mp_int. */
static size_t mp_array(const unsigned char *p, size_t len, uint64_t *n)
{
    if (len == 0)
        return SIZE_MAX;
    if (p[0] >= 0x90 && p[0] <= 0x9f) {
        *n = p[0] & 0x0f;
        return 1;
    }
    if (p[0] != 0xdc && p[0] != 0xdd)
        return 0;
    unsigned w = p[0] == 0xdc ? 2 : 4;
    if (len < 1 + (size_t)w)
        return SIZE_MAX;
    uint64_t x = 0;
    for (unsigned i = 0; i < w; i++)
        x = (x << 8) | p[1 + i];
    *n = x;
    return 1 + w;
}

static gser_status_t header_short(dec_t *d, size_t at, size_t len)
{
    return gser__error_set(d->ctx, GSER_ERR_TRUNCATED, "%s: header ends early at byte %zu of %zu", d->what, at, len);
}

static gser_status_t dec_table(dec_t *d, const unsigned char *p, size_t at, size_t len);

/* A compressed frame's entry: a known codec, a host frame, and two more
 * items charged to the node budget. */
static gser_status_t dec_table_codec(dec_t *d, size_t i, uint64_t codec, uint64_t mem, uint64_t raw)
{
    if (d->nodes_left < 2)
        return gser__error_set(d->ctx, GSER_ERR_LIMIT_NODES, "%s: the frame table has more items than the limit",
                               d->what);
    d->nodes_left -= 2;
    if (codec == CODEC_NONE || codec > CODEC_MAX)
        return gser__error_set(d->ctx, GSER_ERR_FORMAT,
                               "%s: frame %zu has unknown codec %llu (1 lz4, 2 zstd, 3 lz4 chunks, 4 zstd chunks)",
                               d->what, i + 1, (unsigned long long)codec);
    if (mem != GSER_MEMORY_HOST)
        return gser__error_set(d->ctx, GSER_ERR_FORMAT, "%s: frame %zu is compressed but not host memory", d->what,
                               i + 1);
    if (raw == 0 || raw > SIZE_MAX)
        return gser__error_set(d->ctx, GSER_ERR_FORMAT, "%s: frame %zu is compressed with an uncompressed size of %llu",
                               d->what, i + 1, (unsigned long long)raw);
    if (!d->codecs) {
        if (!(d->codecs = gser__msg_alloc(d->msg, d->nframes * sizeof *d->codecs, alignof(frame_codec_t))))
            return nomem(d);
        memset(d->codecs, 0, d->nframes * sizeof *d->codecs);
    }
    d->codecs[i] = (frame_codec_t){.codec = (uint8_t)codec, .raw = (size_t)raw, .size = d->wire[i].size};
    return GSER_OK;
}

/* Decompress the compressed frames into buffers of their own, every
 * declared size checked against the limits and the codec before anything is
 * allocated; the root is then parsed against those. */
static gser_status_t dec_inflate(dec_t *d, size_t header_size)
{
    uint64_t total = header_size;
    for (size_t i = 0; i < d->nframes; i++) {
        uint64_t n = d->codecs[i].codec ? d->codecs[i].raw : d->wire[i].size;
        if (n > d->lim.max_bytes - total)
            return gser__error_set(d->ctx, GSER_ERR_LIMIT_BYTES,
                                   "%s: frame %zu declares %llu bytes uncompressed, more than the limit of %llu bytes "
                                   "for the message",
                                   d->what, i + 1, (unsigned long long)n, (unsigned long long)d->lim.max_bytes);
        total += n;
        if (!d->codecs[i].codec)
            continue;
        if (d->wire[i].memory != GSER_MEMORY_HOST)
            return gser__error_set(d->ctx, GSER_ERR_FRAME, "%s: frame %zu is compressed but was given in %s memory",
                                   d->what, i + 1, gser_memory_str(d->wire[i].memory));
        gser_status_t st =
            gser__codec_check_size(d->ctx, d->what, i + 1, &d->codecs[i], d->wire[i].data, d->wire[i].size);
        if (st)
            return st;
    }
    gser_frame_t *fr = gser__msg_alloc(d->msg, d->nframes * sizeof *fr, alignof(gser_frame_t));
    if (!fr)
        return nomem(d);
    for (size_t i = 0; i < d->nframes; i++)
        fr[i] = d->wire[i];
    d->frames = fr; /* from here on the failure path frees what has a buf */
    for (size_t i = 0; i < d->nframes; i++) {
        frame_codec_t *c = &d->codecs[i];
        if (!c->codec)
            continue;
        void *buf = gser__bigbuf_alloc(c->raw);
        if (!buf)
            return gser__error_set(d->ctx, GSER_ERR_NO_MEMORY,
                                   "%s: out of memory for frame %zu (%zu bytes uncompressed)", d->what, i + 1, c->raw);
        c->buf = buf;
        gser_status_t st =
            gser__codec_decompress(d->ctx, d->what, i + 1, c, d->wire[i].data, d->wire[i].size, buf);
        if (st)
            return st;
        fr[i] = (gser_frame_t){.data = buf,
                               .size = c->raw,
                               .memory = GSER_MEMORY_HOST,
                               .device = d->wire[i].device,
                               .release = gser__bigbuf_release,
                               .release_arg = (void *)(uintptr_t)c->raw};
        if (d->trace)
            gser__trace_line(d->trace, "deserialize frame %zu %s %zu bytes -> %zu bytes", i + 1,
                             gser__codec_name(c->codec), d->wire[i].size, c->raw);
    }
    return GSER_OK;
}

/* Version 3: the frame table (after the root) says which frames are
 * compressed, and the root's references are checked against the
 * decompressed sizes, so the root is walked to find the table first. */
static gser_status_t dec_prescan(dec_t *d, const unsigned char *p, size_t at, size_t len, size_t hdr_size,
                                 size_t *table_at)
{
    /* Only the end of the root is wanted here: a root the walk cannot get
     * through is parsed as in version 2, and the parse says what is wrong. */
    size_t nodes = SIZE_MAX, used = 0, err_off = 0;
    const char *why = "";
    gser_status_t st = gser__mp_check(p + at, len - at, SIZE_MAX, &nodes, &used, &err_off, &why);
    if (st)
        return GSER_OK;
    if ((st = dec_table(d, p, at + used, len)))
        return st;
    *table_at = at + used;
    return d->codecs ? dec_inflate(d, hdr_size) : GSER_OK;
}

/* The frame table at p[at..len): exactly one [size, memory, device] per data
 * frame given, sizes equal to theirs, and nothing after it. */
static gser_status_t dec_table(dec_t *d, const unsigned char *p, size_t at, size_t len)
{
    gser_status_t st;
    uint64_t n;
    size_t k = mp_array(p + at, len - at, &n);
    if (k == SIZE_MAX)
        return header_short(d, at, len);
    if (k == 0 || n != d->nframes)
        return gser__error_set(d->ctx, GSER_ERR_FRAME, "%s: header lists %llu data frames, %zu were given", d->what,
                               k ? (unsigned long long)n : 0ull, d->nframes);
    if (1 + 4 * n > d->nodes_left)
        return gser__error_set(d->ctx, GSER_ERR_LIMIT_NODES, "%s: the frame table has more items than the limit",
                               d->what);
    d->nodes_left -= 1 + 4 * n;
    at += k;
    for (size_t i = 0; i < d->nframes; i++) {
        uint64_t three, size, mem, dev, codec = 0, raw = 0;
        bool neg, neg_size, neg_mem, neg_codec = false, neg_raw = false;
        size_t a = mp_array(p + at, len - at, &three), b = 0, c = 0, e = 0, g = 1, h = 1;
        /* version 3: [size, memory, device, codec, uncompressed size] for a compressed frame */
        bool five = a != 0 && a != SIZE_MAX && three == 5 && d->version >= 3;
        if (a != 0 && a != SIZE_MAX && (three == 3 || five)) {
            b = mp_int(p + at + a, len - at - a, &size, &neg_size);
            if (b != 0 && b != SIZE_MAX) {
                c = mp_int(p + at + a + b, len - at - a - b, &mem, &neg_mem);
                if (c != 0 && c != SIZE_MAX)
                    e = mp_int(p + at + a + b + c, len - at - a - b - c, &dev, &neg);
            }
            if (five && e != 0 && e != SIZE_MAX) {
                size_t o = at + a + b + c + e;
                g = mp_int(p + o, len - o, &codec, &neg_codec);
                if (g != 0 && g != SIZE_MAX)
                    h = mp_int(p + o + g, len - o - g, &raw, &neg_raw);
            }
        }
        if (a == SIZE_MAX || b == SIZE_MAX || c == SIZE_MAX || e == SIZE_MAX || g == SIZE_MAX || h == SIZE_MAX)
            return header_short(d, at, len);
        /* The memory kind is the sender's; the frame may arrive elsewhere (a
         * file, a host staging buffer), so only its form is checked. */
        if (a == 0 || (three != 3 && !five) || b == 0 || c == 0 || e == 0 || g == 0 || h == 0 || neg_size ||
            neg_mem || neg_codec || neg_raw || mem > GSER_MEMORY_DEVICE ||
            (neg ? (int64_t)dev < INT32_MIN : dev > INT32_MAX))
            return gser__error_set(d->ctx, GSER_ERR_FORMAT, "%s: frame table entry %zu is not [size, memory, device]%s",
                                   d->what, i + 1, d->version >= 3 ? " or [size, memory, device, codec, size]" : "");
        if (five && (st = dec_table_codec(d, i, codec, mem, raw)))
            return st;
        if (size != d->wire[i].size)
            return gser__error_set(d->ctx, GSER_ERR_FRAME, "%s: frame %zu has %zu bytes, the header says %llu", d->what,
                                   i + 1, d->wire[i].size, (unsigned long long)size);
        at += a + b + c + e + (five ? g + h : 0);
    }
    if (at != len)
        return gser__error_set(d->ctx, GSER_ERR_FORMAT, "%s: header has trailing bytes at byte %zu of %zu", d->what, at,
                               len);
    return GSER_OK;
}

/* [ext(1, "GSER"), version, root, frame table]: the magic and the version,
 * the root (objects in it wait), the table, then the objects. */
static gser_status_t dec_header(dec_t *d, const gser_frame_t *hdr, gser_value_t **root)
{
    const unsigned char *p = hdr->data;
    size_t len = hdr->size;
    /* A constant length lets the compiler compare in place of a call. */
    if (len >= sizeof magic ? memcmp(p, magic, sizeof magic) != 0 : memcmp(p, magic, len) != 0)
        return gser__error_set(d->ctx, GSER_ERR_BAD_MAGIC, "%s: frame 0 is not a gser header (no \"GSER\" magic)",
                               d->what);
    if (len < sizeof magic)
        return gser__error_set(d->ctx, GSER_ERR_TRUNCATED, "%s: header of %zu bytes ends inside the magic", d->what,
                               len);
    uint64_t version = 0;
    bool neg = false;
    size_t at = sizeof magic, k;
    if (len > at && p[at] <= 0x7f) /* every version so far is a positive fixint */
        version = p[at], k = 1;
    else
        k = mp_int(p + at, len - at, &version, &neg);
    if (k == SIZE_MAX)
        return header_short(d, at, len);
    if (k == 0 || neg || version < GSER_WIRE_VERSION_MIN || version > GSER_WIRE_VERSION)
        return gser__error_set(d->ctx, GSER_ERR_WIRE_VERSION,
                               "%s: header is wire format version %llu, this build reads versions %d..%d", d->what,
                               k ? (unsigned long long)version : 0ull, GSER_WIRE_VERSION_MIN, GSER_WIRE_VERSION);
    d->version = (uint32_t)version;
    if (d->nodes_left < 4)
        return gser__error_set(d->ctx, GSER_ERR_LIMIT_NODES, "%s: the header has more items than the limit", d->what);
    d->nodes_left -= 4; /* the header array and its magic, version and table */
    at += k;
    size_t used, table_at = 0;
    gser_status_t st;
    if (d->version >= 3 && (st = dec_prescan(d, p, at, len, hdr->size, &table_at)))
        return st;
    d->defer = true;
    st = gser__mp_parse_unit(d, p + at, len - at, 1, 0, d->nframes, false, "header", at, root, &used);
    d->defer = false;
    if (st == GSER_OK && table_at && at + used != table_at) /* the walk and the parse disagree: never expected */
        st = gser__error_set(d->ctx, GSER_ERR_FORMAT, "%s: header root ends at byte %zu, its walk at %zu", d->what,
                             at + used, table_at);
    else if (st == GSER_OK && !table_at && (st = dec_table(d, p, at + used, len)) == GSER_OK && d->codecs)
        st = gser__error_set(d->ctx, GSER_ERR_FORMAT,
                             "%s: header has compressed frames but its root could not be walked", d->what);
    for (size_t i = 0; st == GSER_OK && i < d->nlater; i++)
        st = rebuild(d, &d->later[i]);
    return st;
}

static gser_status_t check_frames(gser_context_t *ctx, const char *what, const gser_frame_t *frames, size_t nframes,
                                  const gser_limits_t *lim)
{
    if (!frames || nframes == 0)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: no frames (frame 0 is the header)", what);
    if (nframes - 1 > lim->max_frames)
        return gser__error_set(ctx, GSER_ERR_LIMIT_FRAMES, "%s: %zu data frames, the limit is %zu", what, nframes - 1,
                               lim->max_frames);
    uint64_t total = 0;
    for (size_t i = 0; i < nframes; i++) {
        if (frames[i].size && !frames[i].data)
            return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: frame %zu has %zu bytes but no data", what, i,
                                   frames[i].size);
        if (frames[i].memory != GSER_MEMORY_HOST && frames[i].memory != GSER_MEMORY_DEVICE)
            return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: frame %zu has unknown memory kind %d", what, i,
                                   (int)frames[i].memory);
        for (size_t r = 0; r < sizeof frames[i].reserved / sizeof frames[i].reserved[0]; r++)
            if (frames[i].reserved[r])
                return gser__error_set(ctx, GSER_ERR_INVALID_ARG,
                                       "%s: frame %zu sets reserved[%zu], which must be zero in this version", what, i,
                                       r);
        if (frames[i].size > lim->max_bytes - total)
            return gser__error_set(ctx, GSER_ERR_LIMIT_BYTES, "%s: frames hold more than the limit of %llu bytes", what,
                                   (unsigned long long)lim->max_bytes);
        total += frames[i].size;
    }
    if (frames[0].memory != GSER_MEMORY_HOST)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: the header (frame 0) must be in host memory", what);
    return GSER_OK;
}

gser_status_t gser__dopts_read(const gser_context_t *ctx, const char *what, const gser_deserialize_options_t *opts,
                               gser_deserialize_options_t *o, gser_limits_t *lim)
{
    gser_status_t st;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    if (opts && (st = gser__struct_read(ctx, what, "gser_deserialize_options_t", o, sizeof *o, opts)))
        return st;
    if (!o->limits) {
        *lim = ctx->limits;
        return GSER_OK;
    }
    gser_limits_t l = GSER_LIMITS_INIT;
    if ((st = gser__struct_read(ctx, what, "gser_limits_t", &l, sizeof l, o->limits)))
        return st;
    gser__limits_resolve(&l, lim);
    return GSER_OK;
}

/* A decoder for msg; the caller sets frames, flags and limits. */
static void dec_init(dec_t *d, gser_context_t *ctx, gser_msg_t *msg, const char *what)
{
    /* field by field: the path and the error buffer are not worth zeroing */
    d->ctx = ctx;
    d->msg = msg;
    d->flags = 0;
    d->frames = NULL;
    d->nframes = 0;
    d->trace = NULL;
    d->path.len = 0;
    d->what = what;
    d->finish_marker = dec_marker;
    d->version = GSER_WIRE_VERSION;
    d->checked = d->defer = false;
    d->later = NULL;
    d->nlater = d->cap_later = 0;
    d->stream = NULL;
    d->uploaded = NULL;
    d->dev_vals = NULL;
    d->ndev_vals = d->cap_dev_vals = d->flushed = 0;
    d->wire = NULL;
    d->codecs = NULL;
}

gser_status_t gser_deserialize(gser_context_t *ctx, const gser_frame_t *frames, size_t nframes,
                               const gser_deserialize_options_t *opts, gser_msg_t **msg_out)
{
    static const char what[] = "gser_deserialize";
    if (!ctx || !msg_out)
        return ctx ? gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_deserialize: NULL output") : GSER_ERR_INVALID_ARG;
    gser__context_freeze(ctx);
    dec_t d;
    dec_init(&d, ctx, NULL, what);
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    gser_status_t st = gser__dopts_read(ctx, what, opts, &o, &d.lim);
    if (st)
        return st;
    d.flags = o.flags;
    st = check_frames(ctx, what, frames, nframes, &d.lim);
    if (st)
        return st;
    d.frames = d.wire = frames + 1;
    d.nframes = nframes - 1;
    d.nodes_left = d.lim.max_nodes;
    d.trace = ctx->trace;
    d.stream = o.stream;
    if ((d.flags & (GSER_DESERIALIZE_SCATTER | GSER_DESERIALIZE_RESTORE_DEVICE)) && (st = gser__ctxdev_need(ctx, what)))
        return st;
    if ((st = gser_msg_create(ctx, &d.msg)))
        return st;
    /* What the decoded message may cost: the limits' multiple of its size. */
    uint64_t size = 0;
    for (size_t i = 0; i < nframes; i++)
        size += frames[i].size; /* at most max_bytes each, checked above */
    uint64_t budget = size > (UINT64_MAX - GSER_EXPANSION_ALLOWANCE) / d.lim.max_expansion
                          ? UINT64_MAX
                          : size * d.lim.max_expansion + GSER_EXPANSION_ALLOWANCE;
    d.msg->arena.budget = budget > SIZE_MAX ? 0 : (size_t)budget;

    if (d.trace) {
        gser__trace_line(d.trace, "deserialize header %zu bytes, %zu data frames", frames[0].size, nframes - 1);
        for (size_t i = 1; i < nframes; i++)
            gser__trace_line(d.trace, "deserialize frame %zu %s %zu bytes", i, gser_memory_str(frames[i].memory),
                             frames[i].size);
    }
    gser_value_t *root = NULL;
    st = dec_header(&d, &frames[0], &root);
    free(d.later);
    if (st == GSER_OK && d.ndev_vals != d.flushed) /* device buffers are rare: no call for the rest */
        st = dec_device_flush(&d);
    if (st && d.msg->arena.over)
        st = gser__error_set(ctx, GSER_ERR_LIMIT_BYTES,
                             "%s: decoding takes more than %llu bytes of memory for a message of %llu bytes "
                             "(max_expansion %llu times its size, plus %llu)",
                             what, (unsigned long long)budget, (unsigned long long)size,
                             (unsigned long long)d.lim.max_expansion, (unsigned long long)GSER_EXPANSION_ALLOWANCE);
    d.msg->arena.budget = 0; /* what the caller adds to the message is its own */
    gser_frame_t *copy = NULL;
    if (st == GSER_OK) {
        copy = gser__msg_alloc(d.msg, nframes * sizeof *copy, alignof(gser_frame_t));
        if (!copy)
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_deserialize: out of memory");
    }
    if (st == GSER_OK) {
        copy[0] = frames[0];
        for (size_t i = 1; i < nframes; i++) /* one or two, mostly: copied in place of a call */
            copy[i] = d.frames[i - 1];
        d.msg->frames = copy;
        d.msg->nframes = nframes; /* from now on the message owns frames with a release */
        d.msg->codecs = d.codecs;
        /* a compressed frame handed over is not needed past its decompressed copy */
        for (size_t i = 0; d.codecs && i < d.nframes; i++)
            if (d.codecs[i].codec && d.wire[i].release)
                d.wire[i].release((void *)d.wire[i].data, d.wire[i].release_arg);
    }
    if (st) {
        for (size_t i = 0; d.codecs && i < d.nframes; i++)
            gser__bigbuf_free(d.codecs[i].buf, d.codecs[i].raw);
        gser_msg_destroy(d.msg);
        return st;
    }
    d.msg->root = root;
    *msg_out = d.msg;
    return GSER_OK;
}

gser_status_t gser_value_decode_serialized(gser_msg_t *msg, const gser_value_t *v, gser_value_t **tree)
{
    if (!msg || !v || !tree)
        return GSER_ERR_INVALID_ARG;
    if (v->kind != GSER_KIND_SERIALIZED)
        return GSER_ERR_TYPE_MISMATCH;
    const gser_serialized_t *s = v->u.ser;
    dec_t d;
    dec_init(&d, msg->ctx, msg, "gser_value_decode_serialized");
    d.flags = GSER_DESERIALIZE_KEEP_SERIALIZED;
    d.lim = msg->ctx->limits;
    d.frames = s->frames;
    d.nframes = s->nframes;
    d.nodes_left = d.lim.max_nodes;
    d.checked = true; /* its nested sub-headers were walked when it was kept */
    /* a kept sub-header was valid where it came from: it is read as this
     * build's version; its tree starts below the object's depth there */
    return gser__mp_parse_unit(&d, s->header, s->header_len, s->depth + 1, 0, s->nframes, true, "sub-header", 0, tree,
                               NULL);
}

gser_status_t gser_msg_wait(const gser_msg_t *msg)
{
    if (!msg)
        return GSER_ERR_INVALID_ARG;
    if (!msg->dev || !msg->dev->event)
        return GSER_OK;
    gser_context_t *ctx = msg->ctx;
    gser_status_t st = devl_event_sync(ctx->devl, msg->dev->event);
    return st ? gser__ctxdev_fail(ctx, st, "gser_msg_wait") : GSER_OK;
}

gser_status_t gser_msg_take_frame(gser_msg_t *msg, size_t i, gser_frame_t *frame)
{
    if (!msg || !frame)
        return GSER_ERR_INVALID_ARG;
    if (i >= msg->nframes)
        return GSER_ERR_OUT_OF_RANGE;
    gser_frame_t *f = (gser_frame_t *)&msg->frames[i]; /* the message's own copy */
    if (!f->release)
        return gser__error_set(msg->ctx, GSER_ERR_STATE, "gser_msg_take_frame: the message does not own frame %zu", i);
    *frame = *f;
    f->release = NULL;
    f->release_arg = NULL;
    return GSER_OK;
}

const gser_frame_t *gser_msg_get_frames(const gser_msg_t *msg, size_t *nframes)
{
    if (nframes)
        *nframes = msg ? msg->nframes : 0;
    return msg ? msg->frames : NULL;
}
