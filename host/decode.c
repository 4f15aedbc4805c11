/* gser_deserialize: header + frames -> a value tree, for untrusted input.
 *
 * Every msgpack unit (the header, each object's sub-header) is parsed by
 * msgpack-c's unpack template under gser's limits (mpparse.c), then turned
 * into values with every marker, frame reference and size checked. Values
 * point into the frames where they can (bytes, buffers, arrays).
 */
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "internal.h"
#include "../device/backend.h"

typedef struct dec {
    gser_context_t *ctx;
    gser_msg_t *msg;
    unsigned flags;
    gser_limits_t lim;
    const gser_frame_t *frames; /* data frames (the header is not among them) */
    size_t nframes;
    size_t nodes_left; /* msgpack items still allowed */
    FILE *trace;
    path_t path;
    const char *what; /* "gser_deserialize" or the inspecting call */
    uint32_t version; /* of the header's wire format */
    bool checked;     /* kept sub-headers were walked with their enclosing one's */
    char cb_err[512];
    mp_scratch_t scratch; /* the parsed msgpack objects of the units being decoded */
    /* device work (GSER_DESERIALIZE_RESTORE_DEVICE, _SCATTER) */
    void *stream;
    void **uploaded;          /* per data frame: its copy on the device, made on first use */
    gser_value_t **dev_vals;  /* device buffers that gser copied: get the event, maybe a scatter */
    size_t ndev_vals, cap_dev_vals;
    size_t flushed;           /* dev_vals before this one are done */
} dec_t;

struct gser_reader {
    dec_t *dec;
    gser_value_t *tree;
    uint32_t version;
    const char *family;
};

static gser_status_t dec_fail(dec_t *d, gser_status_t st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static gser_status_t dec_fail(dec_t *d, gser_status_t st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    path_vmessage(&d->path, ": ", msg, sizeof msg, fmt, ap);
    va_end(ap);
    return error_set(d->ctx, st, "%s: %s", d->what, msg);
}

static void dec_trace(dec_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void dec_trace(dec_t *d, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    path_vmessage(&d->path, "  ", msg, sizeof msg, fmt, ap);
    va_end(ap);
    trace_line(d->trace, "deserialize %s", msg);
}

static gser_status_t nomem(dec_t *d)
{
    return dec_fail(d, GSER_ERR_NO_MEMORY, "out of memory");
}

static gser_status_t dec_obj(dec_t *d, const msgpack_object *o, size_t depth, size_t base, size_t n,
                             gser_value_t **out);

/* ---- small readers ------------------------------------------------------------ */

static bool get_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *v = o->via.u64;
    return true;
}

/* A marker is an array whose first element is an ext with an empty payload;
 * a list may well start with a uint (an ext with 8 bytes). */
static bool is_marker(const msgpack_object *o, int *type)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 ||
        o->via.array.ptr[0].type != MSGPACK_OBJECT_EXT || o->via.array.ptr[0].via.ext.size != 0)
        return false;
    *type = o->via.array.ptr[0].via.ext.type;
    return true;
}

static size_t dtype_align(size_t es)
{
    return es > 16 ? 16 : es; /* element sizes are powers of two */
}

/* Data of a buffer or array: inline bin or [frame, offset, nbytes] within
 * this object's frames [base, base + n). *raw points at the bytes as they are
 * (in the header or the frame); *frame is the frame's index, or SIZE_MAX. */
static gser_status_t dec_data(dec_t *d, const msgpack_object *o, size_t base, size_t n, size_t nbytes,
                              const void **raw, size_t *frame, char *where, size_t where_cap)
{
    *frame = SIZE_MAX;
    if (o->type == MSGPACK_OBJECT_BIN) {
        if (o->via.bin.size != nbytes)
            return dec_fail(d, GSER_ERR_FORMAT, "inline data has %u bytes, %zu expected", o->via.bin.size, nbytes);
        *raw = o->via.bin.ptr;
        snprintf(where, where_cap, "inline");
        return GSER_OK;
    }
    uint64_t rel, off, len;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3 || !get_u64(&o->via.array.ptr[0], &rel) ||
        !get_u64(&o->via.array.ptr[1], &off) || !get_u64(&o->via.array.ptr[2], &len))
        return dec_fail(d, GSER_ERR_FORMAT, "data is neither bin nor a [frame, offset, nbytes] reference");
    if (len != nbytes)
        return dec_fail(d, GSER_ERR_FORMAT, "reference covers %llu bytes, %zu expected", (unsigned long long)len,
                        nbytes);
    if (rel >= n)
        return dec_fail(d, GSER_ERR_FRAME, "frame reference %llu is outside this object's %zu frames",
                        (unsigned long long)rel, n);
    const gser_frame_t *f = &d->frames[base + rel];
    if (off > f->size || len > f->size - off) /* the numbers as sent: their sum may wrap */
        return dec_fail(d, GSER_ERR_FRAME, "%llu bytes at offset %llu are outside frame %zu of %zu bytes",
                        (unsigned long long)len, (unsigned long long)off, base + rel + 1, f->size);
    if (len && !f->data)
        return dec_fail(d, GSER_ERR_FRAME, "frame %zu has no data", base + rel + 1);
    *raw = (const char *)f->data + off;
    *frame = base + (size_t)rel;
    snprintf(where, where_cap, "frame %zu %s", base + rel + 1, gser_memory_str(f->memory));
    return GSER_OK;
}

/* Host bytes usable as a typed pointer: copied when not aligned to align. */
static gser_status_t host_aligned(dec_t *d, const void *raw, size_t nbytes, size_t align, const void **data)
{
    if (nbytes && ((uintptr_t)raw & (align - 1))) {
        void *copy = msg_alloc(d->msg, nbytes, 16);
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
    gser_status_t st = device_need(ctx, d->what);
    if (st)
        return st;
    const void *src = raw;
    size_t size = nbytes, off = 0;
    if (frame != SIZE_MAX) {
        if (!d->uploaded) {
            d->uploaded = msg_alloc(d->msg, d->nframes * sizeof *d->uploaded, alignof(void *));
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
    if ((st = msgdev_alloc(d->msg, d->stream, size, false, &p)))
        return dec_fail(d, st, "allocating %zu bytes of device memory failed", size);
    if ((st = ctx->backend->memcpy(ctx->bstate, p, src, size, COPY_H2D, d->stream)))
        return device_fail(ctx, st, "gser_deserialize: copying a frame to the device");
    if (frame != SIZE_MAX)
        d->uploaded[frame] = p;
    *dev = (char *)p + off;
    return GSER_OK;
}

static gser_status_t note_dev_val(dec_t *d, gser_value_t *v)
{
    if (d->ndev_vals == d->cap_dev_vals &&
        arena_vec_reserve(&d->msg->arena, (void **)&d->dev_vals, &d->cap_dev_vals, sizeof *d->dev_vals,
                          d->ndev_vals + 1))
        return nomem(d);
    d->dev_vals[d->ndev_vals++] = v;
    return GSER_OK;
}

/* ---- markers ------------------------------------------------------------------- */

static bool get_i64(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT64_MAX)
        return false;
    *v = (int64_t)o->via.u64;
    return true;
}

/* The strides field of a buffer marker: ndim byte strides whose elements'
 * span is found (0 and the bytes of the shape for C order). *strides is set
 * to NULL for C order, which the receiver sees the same as no strides. */
static gser_status_t dec_strides(dec_t *d, const msgpack_object *o, const int64_t *shape, uint32_t ndim, size_t es,
                                 int64_t *store, const int64_t **strides, size_t *first, size_t *span)
{
    if (d->version < 2)
        return dec_fail(d, GSER_ERR_FORMAT, "buffer strides need wire format version 2, the header is version %u",
                        d->version);
    if (ndim == 0)
        return dec_fail(d, GSER_ERR_FORMAT, "buffer has strides but no shape");
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != ndim)
        return dec_fail(d, GSER_ERR_FORMAT, "buffer strides are not an array of %u integers, one per dim", ndim);
    for (uint32_t k = 0; k < ndim; k++)
        if (!get_i64(&o->via.array.ptr[k], &store[k]))
            return dec_fail(d, GSER_ERR_FORMAT, "buffer stride %u is not a 64-bit integer", k);
    uint32_t bad = layout_span(ndim, shape, store, es, first, span);
    if (bad)
        return dec_fail(d, GSER_ERR_FORMAT, "buffer strides[%u] = %lld: the elements span more than 2^63 - 1 bytes",
                        bad - 1, (long long)store[bad - 1]);
    *strides = layout_is_c(ndim, shape, store, es) ? NULL : store;
    return GSER_OK;
}

static gser_status_t dec_buffer(dec_t *d, const msgpack_object *o, size_t base, size_t n, gser_value_t **out)
{
    const msgpack_object *f = o->via.array.ptr;
    uint64_t dtype;
    if ((o->via.array.size != 5 && o->via.array.size != 6) || !get_u64(&f[1], &dtype) || dtype >= GSER_DTYPE_COUNT)
        return dec_fail(d, GSER_ERR_FORMAT,
                        "buffer marker needs [marker, dtype, shape, data, origin(, strides)] with a known dtype");
    size_t es = gser_dtype_size((gser_dtype_t)dtype);
    int64_t shape[GSER_MAX_NDIM];
    uint32_t ndim = 0;
    uint64_t total = es;
    if (f[2].type == MSGPACK_OBJECT_ARRAY) {
        if (f[2].via.array.size == 0 || f[2].via.array.size > GSER_MAX_NDIM)
            return dec_fail(d, GSER_ERR_FORMAT, "buffer shape has %u dims (1..%d allowed)", f[2].via.array.size,
                            GSER_MAX_NDIM);
        ndim = f[2].via.array.size;
        for (uint32_t i = 0; i < ndim; i++) {
            uint64_t ext;
            if (!get_u64(&f[2].via.array.ptr[i], &ext) || ext > INT64_MAX)
                return dec_fail(d, GSER_ERR_FORMAT, "buffer shape dim %u is not a non-negative integer", i);
            /* numpy's limit, and what a signed size can hold */
            if (ext && total > INT64_MAX / ext)
                return dec_fail(d, GSER_ERR_FORMAT, "buffer shape dim %u: the elements hold more than 2^63 - 1 bytes",
                                i);
            total *= ext;
            shape[i] = (int64_t)ext;
        }
    } else if (f[2].type != MSGPACK_OBJECT_NIL) {
        return dec_fail(d, GSER_ERR_FORMAT, "buffer shape is neither nil nor an array");
    }
    int64_t stride_store[GSER_MAX_NDIM];
    const int64_t *strides = NULL;
    size_t first = 0, span = (size_t)total;
    gser_status_t st;
    bool laid_out = o->via.array.size == 6;
    if (laid_out && (st = dec_strides(d, &f[5], shape, ndim, es, stride_store, &strides, &first, &span)))
        return st;
    /* the data's length comes from the data: a bin's size or the reference's
     * length; with strides it is the span the elements cover */
    uint64_t len;
    if (f[3].type == MSGPACK_OBJECT_BIN)
        len = f[3].via.bin.size;
    else if (f[3].type == MSGPACK_OBJECT_ARRAY && f[3].via.array.size == 3 && get_u64(&f[3].via.array.ptr[2], &len))
        ;
    else
        return dec_fail(d, GSER_ERR_FORMAT, "buffer data is neither bin nor a [frame, offset, nbytes] reference");
    if (len > SIZE_MAX)
        return dec_fail(d, GSER_ERR_FORMAT, "buffer too large");
    if (laid_out) {
        if (len != span)
            return dec_fail(d, GSER_ERR_FORMAT, "buffer data holds %llu bytes, its shape and strides span %zu",
                            (unsigned long long)len, span);
    } else if (ndim ? total != len : len % es != 0) {
        return dec_fail(d, GSER_ERR_FORMAT, "buffer of %s holds %llu bytes, its shape says %llu",
                        gser_dtype_str((gser_dtype_t)dtype), (unsigned long long)len,
                        (unsigned long long)(ndim ? total : len - len % es));
    }
    size_t nbytes = laid_out ? (size_t)total : (size_t)len;
    span = (size_t)len;
    uint64_t origin;
    if (!get_u64(&f[4], &origin) || origin > GSER_MEMORY_DEVICE)
        return dec_fail(d, GSER_ERR_FORMAT, "buffer origin is not 0 (host) or 1 (device)");
    const void *raw, *data = NULL;
    size_t frame;
    char where[64];
    if ((st = dec_data(d, &f[3], base, n, span, &raw, &frame, where, sizeof where)))
        return st;
    gser_memory_t mem = frame != SIZE_MAX ? d->frames[frame].memory : GSER_MEMORY_HOST;
    int32_t device = frame != SIZE_MAX ? d->frames[frame].device : d->ctx->device;
    bool copied = false;
    if (span == 0 && origin == GSER_MEMORY_DEVICE) {
        mem = GSER_MEMORY_DEVICE; /* an empty device buffer travels inline; it is still one */
        raw = NULL;
    }
    if (mem == GSER_MEMORY_HOST && origin == GSER_MEMORY_DEVICE && (d->flags & GSER_DESERIALIZE_RESTORE_DEVICE) &&
        span) {
        void *dev = NULL;
        if ((st = restore_device(d, raw, span, frame, &dev)))
            return st;
        data = dev;
        mem = GSER_MEMORY_DEVICE;
        device = d->ctx->device;
        copied = true;
    } else if (mem == GSER_MEMORY_HOST) {
        if ((st = host_aligned(d, raw, span, dtype_align(es), &data)))
            return st;
    } else {
        data = raw;
    }
    gser_buffer_desc_t desc = {.size = sizeof desc,
                               .data = first ? (const char *)data + first : data,
                               .nbytes = nbytes,
                               .dtype = (gser_dtype_t)dtype,
                               .ndim = ndim,
                               .shape = shape,
                               .memory = mem,
                               .device = device,
                               .strides = strides};
    if (!(*out = buffer_value(d->msg, &desc, first, span)))
        return nomem(d);
    if (mem == GSER_MEMORY_DEVICE && span && (copied || (d->flags & GSER_DESERIALIZE_SCATTER)) &&
        (st = note_dev_val(d, *out)))
        return st;
    if (d->trace) {
        char layout[160];
        layout_format(&desc, span, layout, sizeof layout);
        dec_trace(d, "buffer %s ndim=%u bytes=%zu%s %s%s%s", gser_dtype_str(desc.dtype), ndim, desc.nbytes, layout,
                  where, origin == GSER_MEMORY_DEVICE ? " (from device)" : "", copied ? " -> device" : "");
    }
    return GSER_OK;
}

static gser_status_t dec_array(dec_t *d, const msgpack_object *o, size_t base, size_t n, gser_value_t **out)
{
    const msgpack_object *f = o->via.array.ptr;
    uint64_t container, kind, count;
    if (o->via.array.size != 5 || !get_u64(&f[1], &container) || container > 1 || !get_u64(&f[2], &kind) ||
        !kind_is_array_elem((gser_kind_t)kind) || !get_u64(&f[3], &count))
        return dec_fail(d, GSER_ERR_FORMAT,
                        "array marker needs [marker, 0|1, bool|int|uint|float kind, count, data]");
    size_t es = scalar_kind_size((gser_kind_t)kind);
    if (count > SIZE_MAX / es)
        return dec_fail(d, GSER_ERR_FORMAT, "array of %llu elements is too large", (unsigned long long)count);
    size_t nbytes = (size_t)count * es;
    const void *raw, *data = NULL;
    size_t frame;
    char where[64];
    gser_status_t st = dec_data(d, &f[4], base, n, nbytes, &raw, &frame, where, sizeof where);
    if (st)
        return st;
    if (frame != SIZE_MAX && d->frames[frame].memory != GSER_MEMORY_HOST)
        return dec_fail(d, GSER_ERR_FRAME, "array data is in %s memory, arrays live in host memory",
                        gser_memory_str(d->frames[frame].memory));
    if ((st = host_aligned(d, raw, nbytes, es, &data)))
        return st;
    if (kind == GSER_KIND_BOOL) {
        const unsigned char *b = data;
        for (size_t i = 0; i < nbytes; i++)
            if (b[i] > 1)
                return dec_fail(d, GSER_ERR_FORMAT, "bool array element %zu is %u, not 0 or 1", i, b[i]);
    }
    if (value_array_wrap(d->msg, container == 1, (gser_kind_t)kind, data, (size_t)count, out))
        return nomem(d);
    if (d->trace)
        dec_trace(d, "%s array<%s> n=%zu bytes=%zu %s", container ? "tuple" : "list",
                  gser_kind_str((gser_kind_t)kind), (size_t)count, nbytes, where);
    return GSER_OK;
}

static gser_status_t dec_unit(dec_t *d, const unsigned char *p, size_t len, size_t depth, size_t base, size_t n,
                              gser_value_t **out);
static gser_status_t dec_device_flush(dec_t *d);

static bool dec_str(const msgpack_object *o, size_t max, const char **s, size_t *len)
{
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size > max ||
        memchr(o->via.str.ptr, '\0', o->via.str.size))
        return false;
    *s = o->via.str.ptr;
    *len = o->via.str.size;
    return true;
}

static void run_destroy(void *arg)
{
    gser_value_t *v = arg;
    if (v->flags & VF_OWNED)
        v->u.obj->type->destroy(v->u.obj->obj, v->u.obj->type->user_data);
}

static gser_status_t dec_object(dec_t *d, const msgpack_object *o, size_t depth, size_t base, size_t n,
                                gser_value_t **out)
{
    const msgpack_object *f = o->via.array.ptr;
    const char *tname, *fname;
    size_t tlen, flen;
    uint64_t version, rel, nfr;
    if (o->via.array.size != 7 || !dec_str(&f[1], GSER_TYPE_NAME_MAX, &tname, &tlen) ||
        !dec_str(&f[2], GSER_FAMILY_NAME_MAX, &fname, &flen) || !get_u64(&f[3], &version) ||
        version > UINT32_MAX || !get_u64(&f[4], &rel) || !get_u64(&f[5], &nfr) || f[6].type != MSGPACK_OBJECT_BIN)
        return dec_fail(d, GSER_ERR_FORMAT,
                        "object marker needs [marker, type, family, version, frame base, frame count, sub-header]");
    if (rel > n || nfr > n - rel) /* the numbers as sent: their sum may wrap */
        return dec_fail(d, GSER_ERR_FRAME, "object frame base %llu and frame count %llu are outside the %zu frames it may use",
                        (unsigned long long)rel, (unsigned long long)nfr, n);
    size_t first = base + (size_t)rel;
    const unsigned char *sub = (const unsigned char *)f[6].via.bin.ptr;
    size_t sub_len = f[6].via.bin.size;

    const gser_type_t *t = context_find_type(d->ctx, tname, tlen);
    int fam = context_find_family(d->ctx, fname, flen);
    bool can_rebuild = t && fam >= 0 && t->fam[fam].deserialize;
    char qt[GSER_QUOTED_MAX], qf[GSER_QUOTED_MAX]; /* names from the wire, escaped for messages */
    if (!(d->flags & GSER_DESERIALIZE_KEEP_SERIALIZED) && !can_rebuild &&
        !(d->flags & GSER_DESERIALIZE_ALLOW_UNKNOWN)) {
        quote_format(tname, tlen, qt, sizeof qt);
        if (!t)
            return dec_fail(d, GSER_ERR_UNKNOWN_TYPE, "type %s is not registered", qt);
        quote_format(fname, flen, qf, sizeof qf);
        return dec_fail(d, GSER_ERR_NO_SERIALIZER, "type %s has no deserializer for family %s", qt, qf);
    }
    if ((d->flags & GSER_DESERIALIZE_KEEP_SERIALIZED) || !can_rebuild) {
        /* Pass-through: nothing of the object is decoded, but its sub-header
         * must still be well-formed msgpack within the limits, and its
         * sub-tree starts at depth + 1 (wire-format.md 4.7). A sub-header
         * walked already with its enclosing object's is not walked again. */
        if (depth + 1 > d->lim.max_depth) {
            quote_format(tname, tlen, qt, sizeof qt);
            return dec_fail(d, GSER_ERR_LIMIT_DEPTH, "the sub-tree of type %s is deeper than the limit of %zu", qt,
                            d->lim.max_depth);
        }
        size_t used, off;
        const char *why;
        gser_status_t st = d->checked ? GSER_OK
                                      : mp_check(sub, sub_len, d->lim.max_depth - depth + 1, &d->nodes_left, &used,
                                                 &off, &why);
        if (st == GSER_OK && !d->checked && used != sub_len) {
            st = GSER_ERR_FORMAT;
            off = used;
            why = "has trailing bytes";
        }
        if (st) {
            quote_format(tname, tlen, qt, sizeof qt);
            return dec_fail(d, st, "sub-header of type %s %s at byte %zu of %zu", qt, why, off, sub_len);
        }
        gser_value_t *v = msg_value(d->msg, GSER_KIND_SERIALIZED);
        gser_serialized_t *s = v ? msg_alloc(d->msg, sizeof *s, alignof(gser_serialized_t)) : NULL;
        gser_frame_t *frs = s && nfr ? msg_alloc(d->msg, (size_t)nfr * sizeof *frs, alignof(gser_frame_t)) : NULL;
        if (!s || (nfr && !frs))
            return nomem(d);
        s->type_name = msg_strdup(d->msg, tname, tlen);
        s->family = msg_strdup(d->msg, fname, flen);
        if (!s->type_name || !s->family)
            return nomem(d);
        s->version = (uint32_t)version;
        s->header = sub;
        s->header_len = sub_len;
        for (size_t i = 0; i < nfr; i++) {
            frs[i] = d->frames[first + i];
            frs[i].release = NULL;
            frs[i].release_arg = NULL;
        }
        s->frames = frs;
        s->nframes = (size_t)nfr;
        s->depth = depth;
        v->u.ser = s;
        *out = v;
        if (d->trace) {
            quote_format(tname, tlen, qt, sizeof qt);
            quote_format(fname, flen, qf, sizeof qf);
            dec_trace(d, "serialized type=%s family=%s version=%u frames=%zu sub-header=%zu bytes (kept)", qt, qf,
                      s->version, s->nframes, sub_len);
        }
        return GSER_OK;
    }
    if (version < t->min_read_version || version > t->version) {
        if (t->min_read_version == t->version)
            return dec_fail(d, GSER_ERR_VERSION, "type \"%s\" is version %llu in the message, version %u here",
                            t->name, (unsigned long long)version, t->version);
        return dec_fail(d, GSER_ERR_VERSION,
                        "type \"%s\" is version %llu in the message, versions %u..%u can be read here", t->name,
                        (unsigned long long)version, t->min_read_version, t->version);
    }
    gser_value_t *tree;
    gser_status_t st = dec_unit(d, sub, sub_len, depth + 1, first, (size_t)nfr, &tree);
    if (st)
        return st;
    /* The deserializer must see its buffers as they will be: scattered,
     * restored, and with the event of the copies. */
    if ((st = dec_device_flush(d)))
        return st;
    gser_reader_t r = {.dec = d, .tree = tree, .version = (uint32_t)version, .family = d->ctx->families[fam]};
    void *obj = NULL;
    d->cb_err[0] = '\0';
    st = t->fam[fam].deserialize(d->ctx, &r, &obj, t->user_data);
    if (st != GSER_OK) {
        if (st > GSER_OK)
            st = GSER_ERR_CALLBACK;
        return dec_fail(d, st, "type \"%s\", family \"%s\": deserializer failed: %s", t->name, r.family,
                        d->cb_err[0] ? d->cb_err : gser_status_str(st));
    }
    gser_value_t *v = msg_value(d->msg, GSER_KIND_OBJECT);
    gser_object_t *ob = v ? msg_alloc(d->msg, sizeof *ob, alignof(gser_object_t)) : NULL;
    if (!ob || (t->destroy && arena_on_release(&d->msg->arena, run_destroy, v))) {
        if (t->destroy)
            t->destroy(obj, t->user_data);
        return nomem(d);
    }
    ob->type = t;
    ob->obj = obj;
    v->u.obj = ob;
    if (t->destroy)
        v->flags |= VF_OWNED;
    *out = v;
    if (d->trace)
        dec_trace(d, "object type=%s family=%s version=%llu frames=%llu sub-header=%zu bytes", t->name, r.family,
                  (unsigned long long)version, (unsigned long long)nfr, sub_len);
    return GSER_OK;
}

/* ---- plain values ------------------------------------------------------------- */

static inline __attribute__((always_inline)) gser_status_t dec_scalar(dec_t *d, const msgpack_object *o, gser_value_t **out,
                                                               bool *is_scalar)
{
    gser_msg_t *m = d->msg;
    gser_value_t *v = NULL;
    *is_scalar = true;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: *out = &m->nil; return GSER_OK;
    case MSGPACK_OBJECT_BOOLEAN:
        if ((v = msg_value(m, GSER_KIND_BOOL)))
            v->u.b = o->via.boolean;
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 <= (uint64_t)INT64_MAX) {
            if ((v = msg_value(m, GSER_KIND_INT)))
                v->u.i = (int64_t)o->via.u64;
        } else if ((v = msg_value(m, GSER_KIND_UINT))) {
            v->u.u = o->via.u64;
        }
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        if ((v = msg_value(m, GSER_KIND_INT)))
            v->u.i = o->via.i64;
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if ((v = msg_value(m, GSER_KIND_FLOAT)))
            v->u.f = o->via.f64;
        break;
    case MSGPACK_OBJECT_STR: v = msg_str_value(m, o->via.str.ptr, o->via.str.size); break;
    case MSGPACK_OBJECT_BIN:
        if ((v = msg_value(m, GSER_KIND_BYTES))) {
            v->u.s.ptr = o->via.bin.ptr;
            v->u.s.len = o->via.bin.size;
        }
        break;
    case MSGPACK_OBJECT_EXT:
        if (o->via.ext.type != GSER_EXT_UINT || o->via.ext.size != 8)
            return dec_fail(d, GSER_ERR_FORMAT, "ext type %d of %u bytes where a value was expected",
                            o->via.ext.type, o->via.ext.size);
        if ((v = msg_value(m, GSER_KIND_UINT)))
            memcpy(&v->u.u, o->via.ext.ptr, 8);
        break;
    default: *is_scalar = false; return GSER_OK;
    }
    if (!v)
        return nomem(d);
    *out = v;
    return GSER_OK;
}

static gser_status_t dec_list(dec_t *d, const msgpack_object *items, size_t count, gser_kind_t kind, size_t depth,
                              size_t base, size_t n, gser_value_t **out)
{
    gser_value_t *list;
    if (value_list_new(d->msg, kind, &list))
        return nomem(d);
    /* Boxed, as it was on the wire: only array markers give array-backed lists. */
    gser_list_t *l = list->u.list;
    if (count && arena_vec_reserve(&d->msg->arena, (void **)&l->items, &l->items_cap, sizeof(gser_value_t *), count))
        return nomem(d);
    if (d->trace)
        dec_trace(d, "%s n=%zu", gser_kind_str(kind), count);
    for (size_t i = 0; i < count; i++) {
        d->path.seg[d->path.len++] = (path_seg_t){.key = NULL, .index = i};
        gser_status_t st = dec_obj(d, &items[i], depth + 1, base, n, &l->items[i]);
        d->path.len--;
        if (st)
            return st;
        l->len++;
    }
    *out = list;
    return GSER_OK;
}

static gser_status_t dec_map(dec_t *d, const msgpack_object *o, size_t depth, size_t base, size_t n,
                             gser_value_t **out)
{
    gser_value_t *map;
    if (gser_msg_new_map(d->msg, &map))
        return nomem(d);
    gser_map_t *m = map->u.map;
    size_t count = o->via.map.size;
    if (count && arena_vec_reserve(&d->msg->arena, (void **)&m->pairs, &m->cap, sizeof(gser_pair_t), count))
        return nomem(d);
    if (d->trace)
        dec_trace(d, "map n=%zu", count);
    for (size_t i = 0; i < count; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        gser_value_t *k = NULL, *v;
        bool scalar;
        d->path.seg[d->path.len++] = (path_seg_t){.key = NULL, .index = i};
        gser_status_t st = dec_scalar(d, &kv->key, &k, &scalar);
        if (st == GSER_OK && !scalar)
            st = dec_fail(d, GSER_ERR_FORMAT, "map key %zu is not a scalar", i);
        if (st == GSER_OK) {
            d->path.seg[d->path.len - 1].key = k;
            st = dec_obj(d, &kv->val, depth + 1, base, n, &v);
        }
        d->path.len--;
        if (st)
            return st;
        m->pairs[m->len].key = k;
        m->pairs[m->len].value = v;
        m->len++;
    }
    *out = map;
    return GSER_OK;
}

static gser_status_t dec_obj(dec_t *d, const msgpack_object *o, size_t depth, size_t base, size_t n,
                             gser_value_t **out)
{
    if (depth > d->lim.max_depth)
        return dec_fail(d, GSER_ERR_LIMIT_DEPTH, "nested deeper than the limit of %zu", d->lim.max_depth);
    bool scalar;
    gser_status_t st = dec_scalar(d, o, out, &scalar);
    if (st || scalar) {
        if (st == GSER_OK && d->trace) {
            char s[80];
            scalar_format(*out, s, sizeof s);
            dec_trace(d, "%s %s", gser_kind_str((gser_kind_t)(*out)->kind), s);
        }
        return st;
    }
    if (o->type == MSGPACK_OBJECT_MAP)
        return dec_map(d, o, depth, base, n, out);
    /* an array: a list, or one of gser's markers */
    int marker;
    if (!is_marker(o, &marker))
        return dec_list(d, o->via.array.ptr, o->via.array.size, GSER_KIND_LIST, depth, base, n, out);
    switch (marker) {
    case GSER_EXT_TUPLE:
        return dec_list(d, o->via.array.ptr + 1, o->via.array.size - 1, GSER_KIND_TUPLE, depth, base, n, out);
    case GSER_EXT_BUFFER: return dec_buffer(d, o, base, n, out);
    case GSER_EXT_ARRAY: return dec_array(d, o, base, n, out);
    case GSER_EXT_OBJECT: return dec_object(d, o, depth, base, n, out);
    default: return dec_fail(d, GSER_ERR_FORMAT, "unknown marker ext type %d", marker);
    }
}

/* Parse one msgpack unit (its objects go to d->scratch). */
static gser_status_t mp_parse(dec_t *d, const unsigned char *p, size_t len, const char *what, msgpack_object *obj)
{
    size_t off;
    const char *why;
    gser_status_t st = mp_unpack(&d->scratch, p, len, &d->nodes_left, obj, &off, &why);
    if (st)
        return dec_fail(d, st, "%s %s at byte %zu of %zu", what, why, off, len);
    return GSER_OK;
}

static gser_status_t dec_unit(dec_t *d, const unsigned char *p, size_t len, size_t depth, size_t base, size_t n,
                              gser_value_t **out)
{
    mp_mark_t mark = mp_scratch_mark(&d->scratch);
    msgpack_object obj;
    gser_status_t st = mp_parse(d, p, len, "sub-header", &obj);
    if (st == GSER_OK)
        st = dec_obj(d, &obj, depth, base, n, out);
    mp_scratch_release(&d->scratch, mark);
    return st;
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
        gser_copy_t *copies = malloc(n * sizeof *copies);
        if (!copies)
            return error_set(ctx, GSER_ERR_NO_MEMORY, "%s: out of memory", d->what);
        for (size_t i = 0; i < n; i++) {
            const gser_buffer_t *b = vals[i]->u.buf; /* its span is what is copied */
            void *dst;
            if ((st = msgdev_alloc(d->msg, d->stream, b->span, false, &dst))) {
                free(copies);
                return error_set(ctx, st, "%s: allocating %zu bytes of device memory for a scattered buffer failed",
                                 d->what, b->span);
            }
            copies[i] = (gser_copy_t){(const char *)b->desc.data - b->first, dst, b->span, 0};
        }
        size_t nchunks = gser_plan_count(copies, n);
        void *table = NULL;
        st = msgdev_alloc(d->msg, d->stream, nchunks * sizeof(gser_chunk_t), true, &table);
        if (st == GSER_OK) {
            gser_plan_fill(copies, n, table);
            st = ctx->backend->copy_plan(ctx->bstate, table, nchunks, d->stream);
            if (st)
                st = device_fail(ctx, st, "gser_deserialize: the scatter kernel");
        } else {
            st = error_set(ctx, st, "%s: allocating pinned memory for the copy plan failed", d->what);
        }
        if (st == GSER_OK)
            for (size_t i = 0; i < n; i++)
                vals[i]->u.buf->desc.data = (char *)copies[i].dst + vals[i]->u.buf->first;
        free(copies);
        if (st)
            return st;
    }
    void *event;
    if ((st = msgdev_record(d->msg, &event)))
        return device_fail(ctx, st, "gser_deserialize: recording the message's event");
    for (size_t i = 0; i < n; i++)
        vals[i]->u.buf->desc.event = event;
    d->flushed = d->ndev_vals;
    return GSER_OK;
}

/* ---- public ---------------------------------------------------------------------------- */

static const unsigned char magic[] = {0x94, 0xd6, GSER_EXT_MAGIC, 'G', 'S', 'E', 'R'};

static gser_status_t dec_header(dec_t *d, const gser_frame_t *hdr, gser_value_t **root)
{
    const unsigned char *p = hdr->data;
    size_t len = hdr->size;
    size_t m = len < sizeof magic ? len : sizeof magic;
    if (memcmp(p, magic, m) != 0)
        return error_set(d->ctx, GSER_ERR_BAD_MAGIC, "%s: frame 0 is not a gser header (no \"GSER\" magic)", d->what);
    if (len < sizeof magic)
        return error_set(d->ctx, GSER_ERR_TRUNCATED, "%s: header of %zu bytes ends inside the magic", d->what, len);

    msgpack_object up;
    gser_status_t st = mp_parse(d, p, len, "header", &up);
    if (st)
        return st;
    const msgpack_object *top = up.via.array.ptr; /* the magic check proved a 4-array */
    uint64_t version = 0;
    if (!get_u64(&top[1], &version) || version < GSER_WIRE_VERSION_MIN || version > GSER_WIRE_VERSION) {
        return error_set(d->ctx, GSER_ERR_WIRE_VERSION,
                         "%s: header is wire format version %llu, this build reads versions %d..%d", d->what,
                         (unsigned long long)version, GSER_WIRE_VERSION_MIN, GSER_WIRE_VERSION);
    }
    d->version = (uint32_t)version;
    const msgpack_object *table = &top[3];
    if (table->type != MSGPACK_OBJECT_ARRAY || table->via.array.size != d->nframes) {
        return error_set(d->ctx, GSER_ERR_FRAME, "%s: header lists %u data frames, %zu were given", d->what,
                       table->type == MSGPACK_OBJECT_ARRAY ? table->via.array.size : 0, d->nframes);
    }
    for (size_t i = 0; i < d->nframes; i++) {
        const msgpack_object *e = &table->via.array.ptr[i];
        uint64_t size, mem;
        const msgpack_object *dev = e->type == MSGPACK_OBJECT_ARRAY && e->via.array.size == 3 ? &e->via.array.ptr[2] : NULL;
        /* The memory kind is the sender's; the frame may arrive elsewhere (a
         * file, a host staging buffer), so only its form is checked. */
        if (!dev || !get_u64(&e->via.array.ptr[0], &size) || !get_u64(&e->via.array.ptr[1], &mem) ||
            mem > GSER_MEMORY_DEVICE ||
            (dev->type != MSGPACK_OBJECT_POSITIVE_INTEGER && dev->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) ||
            dev->via.i64 < INT32_MIN || (dev->type == MSGPACK_OBJECT_POSITIVE_INTEGER && dev->via.u64 > INT32_MAX)) {
            return error_set(d->ctx, GSER_ERR_FORMAT, "%s: frame table entry %zu is not [size, memory, device]",
                           d->what, i + 1);
        }
        if (size != d->frames[i].size) {
            return error_set(d->ctx, GSER_ERR_FRAME, "%s: frame %zu has %zu bytes, the header says %llu", d->what,
                           i + 1, d->frames[i].size, (unsigned long long)size);
        }
    }
    return dec_obj(d, &top[2], 1, 0, d->nframes, root);
}

static gser_status_t check_frames(gser_context_t *ctx, const char *what, const gser_frame_t *frames, size_t nframes,
                                  const gser_limits_t *lim)
{
    if (!frames || nframes == 0)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: no frames (frame 0 is the header)", what);
    if (nframes - 1 > lim->max_frames)
        return error_set(ctx, GSER_ERR_LIMIT_FRAMES, "%s: %zu data frames, the limit is %zu", what, nframes - 1,
                         lim->max_frames);
    uint64_t total = 0;
    for (size_t i = 0; i < nframes; i++) {
        if (frames[i].size && !frames[i].data)
            return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: frame %zu has %zu bytes but no data", what, i,
                             frames[i].size);
        if (frames[i].memory != GSER_MEMORY_HOST && frames[i].memory != GSER_MEMORY_DEVICE)
            return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: frame %zu has unknown memory kind %d", what, i,
                             (int)frames[i].memory);
        for (size_t r = 0; r < sizeof frames[i].reserved / sizeof frames[i].reserved[0]; r++)
            if (frames[i].reserved[r])
                return error_set(ctx, GSER_ERR_INVALID_ARG,
                                 "%s: frame %zu sets reserved[%zu], which must be zero in this version", what, i, r);
        if (frames[i].size > lim->max_bytes - total)
            return error_set(ctx, GSER_ERR_LIMIT_BYTES, "%s: frames hold more than the limit of %llu bytes", what,
                             (unsigned long long)lim->max_bytes);
        total += frames[i].size;
    }
    if (frames[0].memory != GSER_MEMORY_HOST)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: the header (frame 0) must be in host memory", what);
    return GSER_OK;
}

gser_status_t dopts_read(const gser_context_t *ctx, const char *what, const gser_deserialize_options_t *opts,
                         gser_deserialize_options_t *o, gser_limits_t *lim)
{
    gser_status_t st;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    if (opts && (st = struct_read(ctx, what, "gser_deserialize_options_t", o, sizeof *o, opts)))
        return st;
    if (!o->limits) {
        *lim = ctx->limits;
        return GSER_OK;
    }
    gser_limits_t l = GSER_LIMITS_INIT;
    if ((st = struct_read(ctx, what, "gser_limits_t", &l, sizeof l, o->limits)))
        return st;
    limits_resolve(&l, lim);
    return GSER_OK;
}

gser_status_t gser_deserialize(gser_context_t *ctx, const gser_frame_t *frames, size_t nframes,
                               const gser_deserialize_options_t *opts, gser_msg_t **msg_out)
{
    if (!ctx || !msg_out)
        return ctx ? error_set(ctx, GSER_ERR_INVALID_ARG, "gser_deserialize: NULL output") : GSER_ERR_INVALID_ARG;
    context_freeze(ctx);
    dec_t d;
    d.ctx = ctx;
    d.what = "gser_deserialize";
    d.checked = false;
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    gser_status_t st = dopts_read(ctx, d.what, opts, &o, &d.lim);
    if (st)
        return st;
    d.flags = o.flags;
    st = check_frames(ctx, d.what, frames, nframes, &d.lim);
    if (st)
        return st;
    d.frames = frames + 1;
    d.nframes = nframes - 1;
    d.nodes_left = d.lim.max_nodes;
    d.trace = ctx->trace;
    d.path.len = 0;
    d.stream = o.stream;
    d.uploaded = NULL;
    d.dev_vals = NULL;
    d.ndev_vals = d.cap_dev_vals = d.flushed = 0;
    if ((d.flags & (GSER_DESERIALIZE_SCATTER | GSER_DESERIALIZE_RESTORE_DEVICE)) &&
        (st = device_need(ctx, d.what)))
        return st;
    if ((st = gser_msg_create(ctx, &d.msg)))
        return st;

    if (d.trace) {
        trace_line(d.trace, "deserialize header %zu bytes, %zu data frames", frames[0].size, nframes - 1);
        for (size_t i = 1; i < nframes; i++)
            trace_line(d.trace, "deserialize frame %zu %s %zu bytes", i, gser_memory_str(frames[i].memory),
                       frames[i].size);
    }
    gser_value_t *root;
    mp_scratch_init(&d.scratch);
    st = dec_header(&d, &frames[0], &root);
    mp_scratch_free(&d.scratch);
    if (st == GSER_OK)
        st = dec_device_flush(&d);
    gser_frame_t *copy = NULL;
    if (st == GSER_OK) {
        copy = msg_alloc(d.msg, nframes * sizeof *copy, alignof(gser_frame_t));
        if (!copy)
            st = error_set(ctx, GSER_ERR_NO_MEMORY, "gser_deserialize: out of memory");
    }
    if (st == GSER_OK) {
        memcpy(copy, frames, nframes * sizeof *copy);
        d.msg->frames = copy;
        d.msg->nframes = nframes; /* from now on the message owns frames with a release */
    }
    if (st) {
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
    d.ctx = msg->ctx;
    d.what = "gser_value_decode_serialized";
    d.version = GSER_WIRE_VERSION; /* a kept sub-header was valid where it came from */
    d.checked = true;               /* and its nested sub-headers were walked with it */
    d.msg = msg;
    d.flags = GSER_DESERIALIZE_KEEP_SERIALIZED;
    d.lim = msg->ctx->limits;
    d.frames = s->frames;
    d.nframes = s->nframes;
    d.nodes_left = d.lim.max_nodes;
    d.trace = NULL;
    d.path.len = 0;
    d.stream = NULL;
    d.uploaded = NULL;
    d.dev_vals = NULL;
    d.ndev_vals = d.cap_dev_vals = d.flushed = 0;
    mp_scratch_init(&d.scratch);
    gser_status_t st = dec_unit(&d, s->header, s->header_len, s->depth + 1, 0, s->nframes, tree);
    mp_scratch_free(&d.scratch);
    return st;
}

gser_status_t gser_msg_wait(const gser_msg_t *msg)
{
    if (!msg)
        return GSER_ERR_INVALID_ARG;
    if (!msg->dev || !msg->dev->event)
        return GSER_OK;
    gser_context_t *ctx = msg->ctx;
    gser_status_t st = ctx->backend->event_sync(ctx->bstate, msg->dev->event);
    return st ? device_fail(ctx, st, "gser_msg_wait") : GSER_OK;
}

gser_status_t gser_msg_take_frame(gser_msg_t *msg, size_t i, gser_frame_t *frame)
{
    if (!msg || !frame)
        return GSER_ERR_INVALID_ARG;
    if (i >= msg->nframes)
        return GSER_ERR_OUT_OF_RANGE;
    gser_frame_t *f = (gser_frame_t *)&msg->frames[i]; /* the message's own copy */
    if (!f->release)
        return error_set(msg->ctx, GSER_ERR_STATE, "gser_msg_take_frame: the message does not own frame %zu", i);
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
