/* Sending an Arrow table: gser_arrow_new_value and the serializer of both
 * families.
 *
 * The table's type tree is walked once into a flat list of nodes in
 * pre-order (node, its children, then its dictionary); each node gets the
 * rows it must send (its slice) from its parent. Nodes are then processed
 * level by level: every string and list column of a level that lives in
 * device memory needs its first and last offset on the host (to size its
 * data, and its child's slice), and those small reads are issued together,
 * then waited for once, before the level is processed. Buffers travel as
 * gser buffer values: zero-copy views of the caller's memory where the rows
 * line up, compacted copies (bitmaps shifted to bit 0, offsets rebased to 0)
 * where the array is sliced. The sub-tree is plugins/arrow/README.md's.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct arrow_send {
    uint32_t magic; /* ARROW_MAGIC_SEND */
    const struct ArrowDeviceArray *array;
    const struct ArrowSchema *schema;
    void *stream;
    unsigned flags; /* GSER_ARROW_CHECK_OFFSETS */
} arrow_send_t;

enum { SLOT_ROOT = -2, SLOT_DICT = -1 };

typedef struct snode {
    const struct ArrowSchema *schema;
    const struct ArrowArray *array;
    arrow_fmt_t fmt;
    int32_t parent;
    int32_t slot; /* index among the parent's children, SLOT_DICT or SLOT_ROOT */
    int32_t depth;
    int32_t first_child; /* index of the first child; the others follow in pre-order */
    int32_t end;         /* one past the last node of its subtree: the next sibling */
    int32_t dictionary;  /* index of its dictionary, or -1 */
    int64_t off, len;    /* the rows to send, in the array's own indexing */
    bool whole;          /* off/len is the array's own range: its null_count holds */
    int64_t first, last; /* VARLEN/LIST: offsets[off], offsets[off + len] */
    unsigned char *read; /* device VARLEN/LIST: where the offsets read arrive */
    bool read_all;       /* ... all len + 1 of them, or just the first and last */
    unsigned char *bits; /* device, a sub-range with nulls: its validity bytes, read to count them */
} snode_t;

typedef struct sctx {
    gser_context_t *ctx;
    gser_writer_t *w;
    gser_msg_t *m;
    bool device;       /* the buffers are device memory */
    int32_t device_id;
    void *event;       /* the table's sync_event (cudaEvent_t), carried by every buffer it lends */
    void *stream;
    unsigned flags;
    snode_t *nodes;
    size_t n, cap;
    int32_t max_depth;
    gser_value_t *schema_list, *array_list;
} sctx_t;

/* Small device reads: whole offsets buffers up to this size, else two offsets. */
#define READ_ALL_MAX 256

/* ---- errors naming the column ------------------------------------------------------ */

/* "column \"a.b\" (format \"+l\")", or "the table (format \"+s\")" for the root. */
static void describe(const sctx_t *sc, int32_t i, char *buf, size_t cap)
{
    int32_t chain[ARROW_MAX_DEPTH + 2];
    int depth = 0;
    for (int32_t j = i; j >= 0 && sc->nodes[j].slot != SLOT_ROOT && depth < ARROW_MAX_DEPTH + 2; j = sc->nodes[j].parent)
        chain[depth++] = j;
    const char *format = sc->nodes[i].schema && sc->nodes[i].schema->format ? sc->nodes[i].schema->format : "?";
    if (depth == 0) {
        snprintf(buf, cap, "the table (format \"%s\")", format);
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "column \"");
    for (int d = depth - 1; d >= 0 && len < cap; d--) {
        const snode_t *n = &sc->nodes[chain[d]];
        const char *sep = d == depth - 1 ? "" : ".";
        int k;
        if (n->slot == SLOT_DICT)
            k = snprintf(buf + len, cap - len, "%s<dictionary>", sep);
        else if (n->schema && n->schema->name && *n->schema->name)
            k = snprintf(buf + len, cap - len, "%s%s", sep, n->schema->name);
        else
            k = snprintf(buf + len, cap - len, "%s[%d]", sep, (int)n->slot);
        if (k < 0)
            return;
        len += (size_t)k;
    }
    if (len < cap)
        snprintf(buf + len, cap - len, "\" (format \"%s\")", format);
}

static gser_status_t fail(sctx_t *sc, int32_t i, gser_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static gser_status_t fail(sctx_t *sc, int32_t i, gser_status_t st, const char *fmt, ...)
{
    char where[320], what[320];
    describe(sc, i, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return gser_writer_fail(sc->w, st, "%s: %s", where, what);
}

/* ---- collecting the nodes ----------------------------------------------------------- */

static gser_status_t push_node(sctx_t *sc, int32_t parent, int32_t slot, int32_t depth, int32_t *index)
{
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 16;
        snode_t *nn = realloc(sc->nodes, cap * sizeof *nn);
        if (!nn)
            return gser_writer_fail(sc->w, GSER_ERR_NO_MEMORY, "out of memory");
        sc->nodes = nn;
        sc->cap = cap;
    }
    if (sc->n >= INT32_MAX)
        return gser_writer_fail(sc->w, GSER_ERR_LIMIT_NODES, "too many columns");
    *index = (int32_t)sc->n;
    sc->nodes[sc->n++] = (snode_t){.parent = parent, .slot = slot, .depth = depth, .first_child = -1,
                                   .dictionary = -1};
    return GSER_OK;
}

static gser_status_t collect(sctx_t *sc, const struct ArrowSchema *schema, const struct ArrowArray *array,
                             int32_t parent, int32_t slot, int32_t depth)
{
    int32_t i = 0;
    gser_status_t st = push_node(sc, parent, slot, depth, &i);
    if (st)
        return st;
    snode_t *n = &sc->nodes[i];
    n->schema = schema;
    n->array = array;
    if (depth > ARROW_MAX_DEPTH)
        return fail(sc, i, GSER_ERR_LIMIT_DEPTH, "types nest deeper than %d levels", ARROW_MAX_DEPTH);
    if (!schema || !array)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "the %s is NULL", schema ? "array" : "schema");
    if (!schema->release || !array->release)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "the %s's release callback is NULL (released already?)",
                    schema->release ? "array" : "schema");
    if (!schema->format)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "the format string is NULL");
    if (arrow_fmt_parse(schema->format, &n->fmt) != GSER_OK)
        return fail(sc, i, GSER_ERR_UNSUPPORTED, "type \"%s\" is not supported", schema->format);
    if (array->length < 0 || array->offset < 0 || array->null_count < -1)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "negative %s (%lld)",
                    array->length < 0 ? "length" : array->offset < 0 ? "offset" : "null_count",
                    (long long)(array->length < 0   ? array->length
                                : array->offset < 0 ? array->offset
                                                    : array->null_count));
    if (array->offset > INT64_MAX - array->length)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "offset + length overflows");
    if (array->n_buffers != n->fmt.n_buffers)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "n_buffers is %lld, the format has %d", (long long)array->n_buffers,
                    n->fmt.n_buffers);
    if (array->n_buffers && !array->buffers)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "buffers is NULL");
    if (schema->n_children < 0 || array->n_children != schema->n_children ||
        (n->fmt.n_children >= 0 && schema->n_children != n->fmt.n_children))
        return fail(sc, i, GSER_ERR_INVALID_ARG, "n_children is %lld in the schema and %lld in the array%s",
                    (long long)schema->n_children, (long long)array->n_children,
                    n->fmt.n_children >= 0 ? (n->fmt.n_children ? ", the format has 1" : ", the format has none")
                                           : "");
    if (schema->n_children && (!schema->children || !array->children))
        return fail(sc, i, GSER_ERR_INVALID_ARG, "children is NULL");
    if (schema->metadata) {
        size_t size;
        if (!arrow_metadata_size((const unsigned char *)schema->metadata, SIZE_MAX, &size) || size > UINT32_MAX)
            return fail(sc, i, GSER_ERR_INVALID_ARG, "the metadata is malformed (a negative count or length)");
    }
    if (n->fmt.is_map) {
        const struct ArrowSchema *entries = schema->children[0];
        if (!entries || !entries->format || strcmp(entries->format, "+s") != 0 || entries->n_children != 2)
            return fail(sc, i, GSER_ERR_INVALID_ARG, "a map's child must be a struct of two (key, value)");
    }
    if (!schema->dictionary != !array->dictionary)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "the dictionary is set in the %s only",
                    schema->dictionary ? "schema" : "array");
    if (schema->dictionary && !n->fmt.is_index)
        return fail(sc, i, GSER_ERR_INVALID_ARG, "dictionary indices must be an integer type");
    if (depth > sc->max_depth)
        sc->max_depth = depth;
    int64_t nchildren = schema->n_children;
    for (int64_t c = 0; c < nchildren; c++) {
        if (c == 0)
            sc->nodes[i].first_child = (int32_t)sc->n;
        if ((st = collect(sc, schema->children[c], array->children[c], i, (int32_t)c, depth + 1)))
            return st;
    }
    if (schema->dictionary) {
        sc->nodes[i].dictionary = (int32_t)sc->n;
        if ((st = collect(sc, schema->dictionary, array->dictionary, i, SLOT_DICT, depth + 1)))
            return st;
    }
    sc->nodes[i].end = (int32_t)sc->n;
    return GSER_OK;
}

/* ---- buffers ------------------------------------------------------------------------ */

/* Device memory the serializer made: freed with the frames' scratch message,
 * after the frames' device work (gser_frames_destroy waits for it first). */
typedef struct dev_alloc {
    gser_context_t *ctx;
    size_t size;
    void *stream;
} dev_alloc_t;

static void release_dev(void *data, void *arg)
{
    dev_alloc_t *a = arg;
    gser_device_free(a->ctx, data, a->size, a->stream);
    free(a);
}

static void release_host(void *data, void *arg)
{
    (void)arg;
    free(data);
}

static gser_status_t append_buffer(sctx_t *sc, int32_t i, gser_value_t *node, const gser_buffer_desc_t *d)
{
    gser_value_t *v;
    gser_status_t st = gser_msg_new_buffer(sc->m, d, &v);
    if (st == GSER_OK)
        st = gser_list_append(node, v);
    if (st)
        return fail(sc, i, st, "adding a buffer: %s", gser_context_get_last_error(sc->ctx));
    return GSER_OK;
}

/* A view of the caller's bytes (zero-copy). */
static gser_status_t add_view(sctx_t *sc, int32_t i, gser_value_t *node, int b, const void *data, size_t nbytes)
{
    gser_buffer_desc_t d = {.size = sizeof(gser_buffer_desc_t), .data = nbytes ? data : NULL,
                            .nbytes = nbytes,
                            .dtype = arrow_buffer_dtype(&sc->nodes[i].fmt, b),
                            .memory = sc->device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST,
                            .device = sc->device_id};
    if (sc->device) {
        d.event = sc->event;
        d.stream = sc->stream;
    }
    return append_buffer(sc, i, node, &d);
}

/* A buffer of nbytes the serializer fills: *data is where (device or host
 * memory, like the table). Owned by the scratch message once appended. */
static gser_status_t add_owned(sctx_t *sc, int32_t i, int b, size_t nbytes, void **data, gser_buffer_desc_t *d)
{
    *d = (gser_buffer_desc_t){.size = sizeof(gser_buffer_desc_t), .nbytes = nbytes,
                              .dtype = arrow_buffer_dtype(&sc->nodes[i].fmt, b),
                              .memory = sc->device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST,
                              .device = sc->device_id};
    void *p = NULL;
    if (sc->device) {
        dev_alloc_t *a = malloc(sizeof *a);
        if (!a)
            return fail(sc, i, GSER_ERR_NO_MEMORY, "out of memory");
        gser_status_t st = gser_device_alloc(sc->ctx, nbytes, sc->stream, &p);
        if (st) {
            free(a);
            return fail(sc, i, st, "allocating %zu bytes of device memory for a compacted buffer: %s", nbytes,
                        gser_context_get_last_error(sc->ctx));
        }
        *a = (dev_alloc_t){sc->ctx, nbytes, sc->stream};
        d->release = release_dev;
        d->release_arg = a;
        d->stream = sc->stream; /* the packing waits for the compaction queued here */
    } else {
        if (!(p = malloc(nbytes ? nbytes : 1)))
            return fail(sc, i, GSER_ERR_NO_MEMORY, "out of memory");
        d->release = release_host;
    }
    d->data = p;
    *data = p;
    return GSER_OK;
}

static gser_status_t commit_owned(sctx_t *sc, int32_t i, gser_value_t *node, gser_buffer_desc_t *d)
{
    gser_value_t *v;
    gser_status_t st = gser_msg_new_buffer(sc->m, d, &v);
    if (st) {
        /* not owned by the message: give it back here */
        if (d->release)
            d->release((void *)d->data, d->release_arg);
        return fail(sc, i, st, "adding a buffer: %s", gser_context_get_last_error(sc->ctx));
    }
    if ((st = gser_list_append(node, v)))
        return fail(sc, i, st, "out of memory");
    return GSER_OK;
}

/* Bits [off, off + len) of a bitmap as a bitmap starting at bit 0: a view
 * when off is a multiple of 8, else shifted into a buffer of our own. */
static gser_status_t add_bits(sctx_t *sc, int32_t i, gser_value_t *node, int b, const void *bitmap, int64_t off,
                              int64_t len)
{
    size_t nbytes = (size_t)((len + 7) / 8);
    if (len == 0)
        return add_view(sc, i, node, b, NULL, 0);
    if (off % 8 == 0)
        return add_view(sc, i, node, b, (const unsigned char *)bitmap + off / 8, nbytes);
    void *p = NULL;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    gser_status_t st = add_owned(sc, i, b, nbytes, &p, &d);
    if (st)
        return st;
    if (sc->device) {
        if ((st = gser_device_copy_bits(sc->ctx, p, bitmap, (uint64_t)off, (uint64_t)len, sc->stream))) {
            d.release((void *)d.data, d.release_arg);
            return fail(sc, i, st, "shifting a bitmap on the device: %s", gser_context_get_last_error(sc->ctx));
        }
    } else {
        arrow_host_copy_bits(p, bitmap, (uint64_t)off, (uint64_t)len);
    }
    return commit_owned(sc, i, node, &d);
}

/* ---- offsets ------------------------------------------------------------------------- */

/* The first and last offset sent are what sizing the data needs: they are
 * always checked. Those between only with GSER_ARROW_CHECK_OFFSETS (or when
 * they were read anyway): the sender never reads through them, and the
 * receiver checks every offset it is given. */
static gser_status_t check_bounds(sctx_t *sc, int32_t i, int64_t first, int64_t last)
{
    snode_t *n = &sc->nodes[i];
    if (first < 0)
        return fail(sc, i, GSER_ERR_OUT_OF_RANGE, "offset %lld is negative (%lld)", (long long)n->off,
                    (long long)first);
    if (last < first)
        return fail(sc, i, GSER_ERR_OUT_OF_RANGE, "offset %lld (%lld) is less than offset %lld (%lld)",
                    (long long)(n->off + n->len), (long long)last, (long long)n->off, (long long)first);
    n->first = first;
    n->last = last;
    return GSER_OK;
}

/* Every offset in [from, from + count) of base, in host memory. */
static gser_status_t check_all_host(sctx_t *sc, int32_t i, const void *base, int64_t from, int64_t count)
{
    snode_t *n = &sc->nodes[i];
    uint32_t w = n->fmt.width;
    int64_t k = arrow_first_decrease(base, w, from, count);
    if (k >= 0)
        return fail(sc, i, GSER_ERR_OUT_OF_RANGE, "offset %lld (%lld) is less than offset %lld (%lld)",
                    (long long)(n->off + k), (long long)arrow_offset_at(base, w, from + k),
                    (long long)(n->off + k - 1), (long long)arrow_offset_at(base, w, from + k - 1));
    return GSER_OK;
}

/* Check offsets[off..off+len] and set n->first, n->last. */
static gser_status_t check_offsets(sctx_t *sc, int32_t i)
{
    snode_t *n = &sc->nodes[i];
    uint32_t w = n->fmt.width;
    const void *offs = n->array->buffers[1];
    if (!offs) {
        if (n->len == 0) { /* some producers leave an empty array's offsets out */
            n->first = n->last = 0;
            return GSER_OK;
        }
        return fail(sc, i, GSER_ERR_INVALID_ARG, "buffer 1 (offsets) is NULL");
    }
    bool all = sc->flags & GSER_ARROW_CHECK_OFFSETS;
    gser_status_t st;
    if (!sc->device) {
        if ((st = check_bounds(sc, i, arrow_offset_at(offs, w, n->off), arrow_offset_at(offs, w, n->off + n->len))))
            return st;
        return all ? check_all_host(sc, i, offs, n->off, n->len + 1) : GSER_OK;
    }
    if (n->read_all) { /* all of them are on the host already: check them */
        if ((st = check_bounds(sc, i, arrow_offset_at(n->read, w, 0), arrow_offset_at(n->read, w, n->len))))
            return st;
        return check_all_host(sc, i, n->read, 0, n->len + 1);
    }
    if ((st = check_bounds(sc, i, arrow_offset_at(n->read, w, 0), arrow_offset_at(n->read, w, 1))) || !all)
        return st;
    /* One pass on the device. It checks that they start at 0 and end at
     * end as well: the end is known, the start need not be 0. */
    uint32_t verdict = 0;
    const unsigned char *dev = (const unsigned char *)offs + (size_t)n->off * w;
    if ((st = gser_device_check_offsets(sc->ctx, dev, (size_t)n->len + 1, w, (uint64_t)n->last, sc->stream,
                                        &verdict)))
        return fail(sc, i, st, "checking offsets on the device: %s", gser_context_get_last_error(sc->ctx));
    if (verdict & GSER_OFFSETS_DECREASE)
        return fail(sc, i, GSER_ERR_OUT_OF_RANGE, "offsets %lld..%lld decrease somewhere (checked on the device)",
                    (long long)n->off, (long long)(n->off + n->len));
    return GSER_OK;
}

/* The offsets of the rows sent, starting at 0: a view when they do already. */
static gser_status_t add_offsets(sctx_t *sc, int32_t i, gser_value_t *node)
{
    snode_t *n = &sc->nodes[i];
    uint32_t w = n->fmt.width;
    size_t nbytes = (size_t)(n->len + 1) * w;
    const void *offs = n->array->buffers[1];
    if (!offs) { /* an empty array without offsets: send the one offset it has */
        static const int64_t zero = 0;
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        void *p;
        gser_status_t st = add_owned(sc, i, 1, w, &p, &d);
        if (st)
            return st;
        if ((st = gser_device_memcpy(sc->ctx, p, d.memory, &zero, GSER_MEMORY_HOST, w, sc->stream))) {
            d.release((void *)d.data, d.release_arg);
            return fail(sc, i, st, "writing an offset: %s", gser_context_get_last_error(sc->ctx));
        }
        return commit_owned(sc, i, node, &d);
    }
    const unsigned char *src = (const unsigned char *)offs + (size_t)n->off * w;
    if (n->first == 0)
        return add_view(sc, i, node, 1, src, nbytes);
    void *p;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    gser_status_t st = add_owned(sc, i, 1, nbytes, &p, &d);
    if (st)
        return st;
    if (sc->device) {
        if ((st = gser_device_rebase_offsets(sc->ctx, p, src, (size_t)n->len + 1, w, sc->stream))) {
            d.release((void *)d.data, d.release_arg);
            return fail(sc, i, st, "rebasing offsets on the device: %s", gser_context_get_last_error(sc->ctx));
        }
    } else if (w == 4) {
        uint32_t *out = p, base;
        memcpy(&base, src, 4);
        for (int64_t k = 0; k <= n->len; k++) {
            uint32_t v;
            memcpy(&v, src + 4 * k, 4);
            out[k] = v - base;
        }
    } else {
        uint64_t *out = p, base;
        memcpy(&base, src, 8);
        for (int64_t k = 0; k <= n->len; k++) {
            uint64_t v;
            memcpy(&v, src + 8 * k, 8);
            out[k] = v - base;
        }
    }
    return commit_owned(sc, i, node, &d);
}

static bool needs_offsets(const snode_t *n)
{
    return (n->fmt.layout == LAYOUT_VARLEN || n->fmt.layout == LAYOUT_LIST) && n->array->buffers[1];
}

/* A part of a column with nulls has a null count of its own, which the
 * producer's null_count (for the whole column) does not give. */
static bool needs_null_count(const snode_t *n)
{
    return !n->whole && n->len && n->fmt.layout != LAYOUT_NULL && n->array->null_count != 0 &&
           n->array->buffers[0];
}

static size_t bits_bytes(const snode_t *n)
{
    return (size_t)((n->off + n->len + 7) / 8 - n->off / 8);
}

/* Issue a level's device reads together, then wait for them once:
 * - string and list columns: the C Data Interface carries no buffer sizes,
 *   so the size of a column's data (and its child's rows) is
 *   offsets[off + len] - offsets[off]; in device memory that is a small
 *   device-to-host read (two offsets, or all of them when that is as cheap);
 * - parts of columns with nulls (the children of a sliced table): their
 *   validity bytes, to count the nulls on the host (1/8 byte a row). */
static gser_status_t read_level(sctx_t *sc, int32_t depth, void **pinned, size_t *pinned_size)
{
    size_t need = 0;
    for (size_t i = 0; i < sc->n; i++) {
        snode_t *n = &sc->nodes[i];
        if (n->depth != depth)
            continue;
        if (needs_offsets(n)) {
            n->read_all = (uint64_t)(n->len + 1) * n->fmt.width <= READ_ALL_MAX;
            need += READ_ALL_MAX;
        }
        if (needs_null_count(n))
            need += (bits_bytes(n) + 63) & ~(size_t)63;
    }
    if (need == 0)
        return GSER_OK;
    if (need > *pinned_size) {
        gser_pinned_free(sc->ctx, *pinned, *pinned_size);
        *pinned = NULL;
        *pinned_size = 0;
        gser_status_t st = gser_pinned_alloc(sc->ctx, need, pinned);
        if (st)
            return gser_writer_fail(sc->w, st, "allocating pinned memory to read offsets: %s",
                                    gser_context_get_last_error(sc->ctx));
        *pinned_size = need;
    }
    unsigned char *at = *pinned;
    for (size_t i = 0; i < sc->n; i++) {
        snode_t *n = &sc->nodes[i];
        if (n->depth != depth)
            continue;
        if (needs_null_count(n)) {
            size_t nb = bits_bytes(n);
            n->bits = at;
            gser_status_t st = gser_device_memcpy(sc->ctx, at, GSER_MEMORY_HOST,
                                                  (const unsigned char *)n->array->buffers[0] + n->off / 8,
                                                  GSER_MEMORY_DEVICE, nb, sc->stream);
            if (st)
                return fail(sc, (int32_t)i, st, "reading a validity bitmap from the device: %s",
                            gser_context_get_last_error(sc->ctx));
            at += (nb + 63) & ~(size_t)63;
        }
        if (!needs_offsets(n))
            continue;
        uint32_t w = n->fmt.width;
        const unsigned char *offs = (const unsigned char *)n->array->buffers[1] + (size_t)n->off * w;
        gser_status_t st;
        n->read = at;
        if (n->read_all) {
            st = gser_device_memcpy(sc->ctx, at, GSER_MEMORY_HOST, offs, GSER_MEMORY_DEVICE,
                                    (size_t)(n->len + 1) * w, sc->stream);
        } else {
            st = gser_device_memcpy(sc->ctx, at, GSER_MEMORY_HOST, offs, GSER_MEMORY_DEVICE, w, sc->stream);
            if (st == GSER_OK)
                st = gser_device_memcpy(sc->ctx, at + w, GSER_MEMORY_HOST, offs + (size_t)n->len * w,
                                        GSER_MEMORY_DEVICE, w, sc->stream);
        }
        if (st)
            return fail(sc, (int32_t)i, st, "reading offsets from the device: %s", gser_context_get_last_error(sc->ctx));
        at += READ_ALL_MAX;
    }
    gser_status_t st = gser_stream_wait(sc->ctx, sc->stream);
    if (st)
        return gser_writer_fail(sc->w, st, "waiting for offsets read from the device: %s",
                                gser_context_get_last_error(sc->ctx));
    return GSER_OK;
}

/* ---- one node ------------------------------------------------------------------------ */

/* Give child c the rows [off, off + len) of its own indexing (relative to its
 * offset), after checking they exist. */
static gser_status_t slice_child(sctx_t *sc, int32_t i, int32_t c, int64_t off, int64_t len)
{
    snode_t *ch = &sc->nodes[c];
    const struct ArrowArray *a = ch->array;
    if (off < 0 || len < 0 || off > a->length || len > a->length - off)
        return fail(sc, i, GSER_ERR_OUT_OF_RANGE, "rows %lld..%lld of child %d are needed, it has %lld",
                    (long long)off, (long long)(off + len), (int)ch->slot, (long long)a->length);
    ch->off = a->offset + off;
    ch->len = len;
    ch->whole = off == 0 && len == a->length;
    return GSER_OK;
}

static gser_status_t new_list(sctx_t *sc, gser_value_t **out)
{
    gser_status_t st = gser_msg_new_list(sc->m, out);
    return st ? gser_writer_fail(sc->w, st, "out of memory") : GSER_OK;
}

static gser_status_t add_schema_node(sctx_t *sc, int32_t i)
{
    const struct ArrowSchema *s = sc->nodes[i].schema;
    gser_msg_t *m = sc->m;
    gser_value_t *node, *v;
    gser_status_t st = new_list(sc, &node);
    if (st)
        return st;
    if ((st = gser_msg_new_cstr(m, s->format, &v)) || (st = gser_list_append(node, v)))
        goto oom;
    if (s->name)
        st = gser_msg_new_cstr(m, s->name, &v) ? GSER_ERR_NO_MEMORY : gser_list_append(node, v);
    else
        st = gser_list_append_nil(node);
    if (st || (st = gser_list_append_int(node, s->flags)))
        goto oom;
    if (s->metadata) {
        size_t size = 0;
        arrow_metadata_size((const unsigned char *)s->metadata, SIZE_MAX, &size); /* checked in collect */
        if ((st = gser_msg_new_bytes(m, s->metadata, size, &v)) || (st = gser_list_append(node, v)))
            goto oom;
    } else if ((st = gser_list_append_nil(node))) {
        goto oom;
    }
    if ((st = gser_list_append_int(node, s->n_children)) || (st = gser_list_append_bool(node, s->dictionary != NULL)) ||
        (st = gser_list_append(sc->schema_list, node)))
        goto oom;
    return GSER_OK;
oom:
    return fail(sc, i, GSER_ERR_NO_MEMORY, "out of memory");
}

static gser_status_t process(sctx_t *sc, int32_t i, gser_value_t *node)
{
    snode_t *n = &sc->nodes[i];
    const struct ArrowArray *a = n->array;
    const arrow_fmt_t *f = &n->fmt;
    int64_t off = n->off, len = n->len;
    gser_status_t st;

    /* Rows and nulls. A sub-range of a column with nulls has a null count
     * of its own, counted on the host (device bitmaps were read for it). */
    int64_t nulls = f->layout == LAYOUT_NULL ? len : a->null_count;
    const void *validity = f->n_buffers ? a->buffers[0] : NULL;
    if (f->layout != LAYOUT_NULL) {
        if (n->whole && nulls > len)
            return fail(sc, i, GSER_ERR_INVALID_ARG, "null_count %lld is larger than the length %lld",
                        (long long)nulls, (long long)len);
        if (!validity) {
            if (n->whole && nulls > 0)
                return fail(sc, i, GSER_ERR_INVALID_ARG, "null_count is %lld but the validity bitmap is NULL",
                            (long long)nulls);
            nulls = 0;
        } else if (!n->whole && nulls != 0) {
            nulls = len == 0        ? 0
                    : sc->device ? len - (int64_t)arrow_host_count_bits(n->bits, (uint64_t)(off % 8), (uint64_t)len)
                                 : len - (int64_t)arrow_host_count_bits(validity, (uint64_t)off, (uint64_t)len);
        }
    }
    if ((st = gser_list_append_int(node, len)) || (st = gser_list_append_int(node, nulls)))
        return fail(sc, i, GSER_ERR_NO_MEMORY, "out of memory");

    /* Buffer 0: validity, only when there are (or may be) nulls. */
    if (f->n_buffers) {
        if (nulls == 0 && gser_list_append_nil(node))
            return fail(sc, i, GSER_ERR_NO_MEMORY, "out of memory");
        if (nulls != 0 && (st = add_bits(sc, i, node, 0, validity, off, len)))
            return st;
    }
    switch (f->layout) {
    case LAYOUT_NULL:
    case LAYOUT_STRUCT:
        break;
    case LAYOUT_BOOL:
        if (!a->buffers[1] && len)
            return fail(sc, i, GSER_ERR_INVALID_ARG, "buffer 1 (values) is NULL");
        if ((st = add_bits(sc, i, node, 1, a->buffers[1], off, len)))
            return st;
        break;
    case LAYOUT_FIXED: {
        if (!a->buffers[1] && len)
            return fail(sc, i, GSER_ERR_INVALID_ARG, "buffer 1 (values) is NULL");
        if ((uint64_t)(off + len) > SIZE_MAX / f->width)
            return fail(sc, i, GSER_ERR_INVALID_ARG, "the column is larger than memory");
        const unsigned char *data = a->buffers[1] ? (const unsigned char *)a->buffers[1] + (size_t)off * f->width : NULL;
        if ((st = add_view(sc, i, node, 1, data, (size_t)len * f->width)))
            return st;
        break;
    }
    case LAYOUT_VARLEN:
    case LAYOUT_LIST:
        if ((st = check_offsets(sc, i)) || (st = add_offsets(sc, i, node)))
            return st;
        if (f->layout == LAYOUT_VARLEN) {
            size_t nbytes = (size_t)(n->last - n->first);
            if (!a->buffers[2] && nbytes)
                return fail(sc, i, GSER_ERR_INVALID_ARG, "buffer 2 (data) is NULL");
            const unsigned char *data = a->buffers[2] ? (const unsigned char *)a->buffers[2] + n->first : NULL;
            if ((st = add_view(sc, i, node, 2, data, nbytes)))
                return st;
        }
        break;
    case LAYOUT_FIXED_LIST:
        break;
    }

    /* The children's rows. */
    int32_t c = n->first_child;
    for (int64_t k = 0; k < n->schema->n_children; k++) {
        switch (f->layout) {
        case LAYOUT_LIST: st = slice_child(sc, i, c, n->first, n->last - n->first); break;
        case LAYOUT_FIXED_LIST:
            if (f->list_size && (off + len) > INT64_MAX / f->list_size)
                return fail(sc, i, GSER_ERR_OUT_OF_RANGE, "rows times the list size overflow");
            st = slice_child(sc, i, c, off * f->list_size, len * f->list_size);
            break;
        default: st = slice_child(sc, i, c, off, len); break;
        }
        if (st)
            return st;
        c = sc->nodes[c].end; /* the next child follows this one's subtree */
    }
    if (n->dictionary >= 0) {
        snode_t *dn = &sc->nodes[n->dictionary];
        dn->off = dn->array->offset;
        dn->len = dn->array->length;
        dn->whole = true;
    }
    return GSER_OK;
}

/* ---- the serializer ------------------------------------------------------------------ */

gser_status_t arrow_serialize(gser_context_t *ctx, const void *obj, gser_writer_t *w, void *user_data)
{
    (void)user_data;
    const arrow_send_t *in = obj;
    if (!in || in->magic != ARROW_MAGIC_SEND)
        return gser_writer_fail(w, GSER_ERR_TYPE_MISMATCH,
                                "not a table made by gser_arrow_new_value (a received table is sent again by "
                                "taking it and making a new value)");
    const struct ArrowDeviceArray *da = in->array;
    sctx_t sc = {.ctx = ctx, .w = w, .m = gser_writer_get_msg(w), .stream = in->stream, .flags = in->flags, .device_id = 0};
    if (!sc.m)
        return gser_writer_fail(w, GSER_ERR_NO_MEMORY, "out of memory");
    switch (da->device_type) {
    case ARROW_DEVICE_CPU: break; /* CPU arrays have no sync_event to wait for */
    case ARROW_DEVICE_CUDA_HOST:
        if (da->sync_event)
            return gser_writer_fail(w, GSER_ERR_UNSUPPORTED,
                                    "the table is pinned host memory with a sync_event, which gser cannot wait "
                                    "for on the host yet");
        break;
    case ARROW_DEVICE_CUDA:
    case ARROW_DEVICE_CUDA_MANAGED:
        sc.device = true;
        sc.device_id = (int32_t)da->device_id;
        sc.event = da->sync_event ? *(void *const *)da->sync_event : NULL;
        if (!gser_context_has_device(ctx))
            return gser_writer_fail(w, GSER_ERR_NO_DEVICE,
                                    "the table is in device memory (device type %d) and the context has no device "
                                    "backend",
                                    (int)da->device_type);
        break;
    default:
        return gser_writer_fail(w, GSER_ERR_UNSUPPORTED, "device type %d is not supported (CPU, CUDA, CUDA_HOST, "
                                "CUDA_MANAGED are)", (int)da->device_type);
    }

    /* The table may still be being written on the producer's stream (libcudf
     * records sync_event after its kernels): every read and kernel below goes
     * on sc.stream, which waits for it first. The packing waits for it too,
     * through the event each buffer carries. */
    gser_status_t st;
    if (sc.event && (st = gser_stream_order_after_handle(ctx, sc.stream, sc.event)))
        return gser_writer_fail(w, st, "waiting for the table's sync_event: %s", gser_context_get_last_error(ctx));
    st = collect(&sc, in->schema, &da->array, -1, SLOT_ROOT, 0);
    gser_value_t *root = NULL, *v;
    void *pinned = NULL;
    size_t pinned_size = 0;
    gser_value_t **wire = NULL;
    if (st)
        goto out;
    snode_t *r = &sc.nodes[0];
    r->off = r->array->offset;
    r->len = r->array->length;
    r->whole = true;

    /* The sub-tree: {"device": type, "schema": [nodes], "array": [nodes]}. */
    if ((st = gser_msg_new_map(sc.m, &root)) || (st = gser_msg_new_int(sc.m, da->device_type, &v)) ||
        (st = gser_map_put_cstr(root, ARROW_KEY_DEVICE, v)) || (st = gser_msg_new_list(sc.m, &sc.schema_list)) ||
        (st = gser_map_put_cstr(root, ARROW_KEY_SCHEMA, sc.schema_list)) ||
        (st = gser_msg_new_list(sc.m, &sc.array_list)) || (st = gser_map_put_cstr(root, ARROW_KEY_ARRAY, sc.array_list))) {
        st = gser_writer_fail(w, GSER_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    /* Array nodes go in pre-order, but are filled level by level. */
    if (!(wire = malloc(sc.n * sizeof *wire))) {
        st = gser_writer_fail(w, GSER_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < sc.n; i++) {
        if ((st = add_schema_node(&sc, (int32_t)i)) || (st = new_list(&sc, &wire[i])))
            goto out;
        if ((st = gser_list_append(sc.array_list, wire[i]))) {
            st = gser_writer_fail(w, GSER_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
    }
    for (int32_t d = 0; d <= sc.max_depth; d++) {
        if (sc.device && (st = read_level(&sc, d, &pinned, &pinned_size)))
            goto out;
        for (size_t i = 0; i < sc.n; i++)
            if (sc.nodes[i].depth == d && (st = process(&sc, (int32_t)i, wire[i])))
                goto out;
    }
    if ((st = gser_writer_set_root(w, root)))
        st = gser_writer_fail(w, st, "setting the root");
out:
    free(wire);
    if (pinned)
        gser_pinned_free(ctx, pinned, pinned_size);
    free(sc.nodes);
    return st;
}

/* ---- the value ------------------------------------------------------------------------ */

gser_status_t gser_arrow_new_value(gser_msg_t *msg, const struct ArrowDeviceArray *array,
                                 const struct ArrowSchema *schema, const gser_arrow_send_options_t *opts,
                                 gser_value_t **out)
{
    if (!msg || !array || !schema || !out)
        return GSER_ERR_INVALID_ARG;
    gser_arrow_send_options_t o = GSER_ARROW_SEND_OPTIONS_INIT;
    gser_status_t st;
    if (opts && (st = gser_context_struct_read(gser_msg_get_context(msg), "gser_arrow_new_value",
                                               "gser_arrow_send_options_t", &o, sizeof o, opts)))
        return st;
    /* The object lives in the message: a copied host buffer is message memory
     * that needs no cleanup of its own (it is not linked into the tree). */
    arrow_send_t s = {.magic = ARROW_MAGIC_SEND, .array = array, .schema = schema, .stream = o.stream,
                      .flags = o.flags};
    gser_buffer_desc_t d = {.size = sizeof(gser_buffer_desc_t), .data = &s, .nbytes = sizeof s, .flags = GSER_BUFFER_COPY};
    gser_value_t *holder, *v;
    st = gser_msg_new_buffer(msg, &d, &holder);
    if (st)
        return st;
    gser_value_get_buffer(holder, &d);
    if ((st = gser_msg_new_object(msg, GSER_ARROW_TYPE, (void *)d.data, &v)))
        return st;
    *out = v;
    return GSER_OK;
}
