/* Receiving an Arrow table: the deserializer of both families checks the
 * sub-tree (untrusted input) into a flat node list; gser_arrow_take_value
 * then hands it out as ArrowDeviceArray + ArrowSchema.
 *
 * Ownership: every exported ArrowArray node holds a reference on one keeper,
 * which owns what the buffers point into: the frames taken from the message
 * (zero-copy), and one host or device block for what had to be copied. The
 * keeper goes when the last node is released, whichever that is (children
 * may be moved out of their parent and released later, as the C Data
 * Interface allows). The schema is a deep copy of its own.
 */
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct rnode {
    const char *format; /* in the message, NUL-terminated */
    const char *name;   /* NULL = none */
    const void *metadata;
    size_t metadata_len;
    int64_t flags;
    arrow_fmt_t fmt;
    int32_t parent, slot; /* slot: child index, -1 dictionary, -2 root */
    int32_t n_children, first_child, end, dictionary;
    int64_t length, null_count;
    gser_value_t *bufs[3]; /* NULL = absent */
} rnode_t;

typedef struct arrow_recv {
    uint32_t magic; /* ARROW_MAGIC_RECV */
    bool taken;
    int32_t device_type; /* the sender's */
    bool host_family;    /* sent with the "host" family */
    gser_context_t *ctx;
    gser_msg_t *msg;
    size_t n;
    rnode_t nodes[];
} arrow_recv_t;

void arrow_recv_destroy(void *obj, void *user_data)
{
    (void)user_data;
    free(obj);
}

/* ---- errors ------------------------------------------------------------------------- */

static void describe(const arrow_recv_t *rx, int32_t i, char *buf, size_t cap)
{
    int32_t chain[ARROW_MAX_DEPTH + 2];
    int depth = 0;
    for (int32_t j = i; j >= 0 && rx->nodes[j].slot != -2 && depth < ARROW_MAX_DEPTH + 2; j = rx->nodes[j].parent)
        chain[depth++] = j;
    const char *format = rx->nodes[i].format ? rx->nodes[i].format : "?";
    if (depth == 0) {
        snprintf(buf, cap, "the table (format \"%s\")", format);
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "column \"");
    for (int d = depth - 1; d >= 0 && len < cap; d--) {
        const rnode_t *n = &rx->nodes[chain[d]];
        const char *sep = d == depth - 1 ? "" : ".";
        int k = n->slot == -1                ? snprintf(buf + len, cap - len, "%s<dictionary>", sep)
                : n->name && *n->name        ? snprintf(buf + len, cap - len, "%s%s", sep, n->name)
                                             : snprintf(buf + len, cap - len, "%s[%d]", sep, (int)n->slot);
        if (k < 0)
            return;
        len += (size_t)k;
    }
    if (len < cap)
        snprintf(buf + len, cap - len, "\" (format \"%s\")", format);
}

typedef struct rctx {
    gser_reader_t *r;
    arrow_recv_t *rx;
    gser_value_t *schema, *array;
} rctx_t;

static gser_status_t rfail(rctx_t *rc, int32_t i, gser_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static gser_status_t rfail(rctx_t *rc, int32_t i, gser_status_t st, const char *fmt, ...)
{
    char where[320], what[320];
    if (i >= 0)
        describe(rc->rx, i, where, sizeof where);
    else
        snprintf(where, sizeof where, "the table");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return gser_reader_fail(rc->r, st, "%s: %s", where, what);
}

/* ---- reading the sub-tree ------------------------------------------------------------- */

static bool get_field(gser_value_t *list, size_t i, gser_value_t **out)
{
    return gser_list_get(list, i, out) == GSER_OK;
}

static bool get_cstr(const gser_value_t *v, const char **s)
{
    size_t len;
    if (gser_value_get_str(v, s, &len) != GSER_OK || strlen(*s) != len)
        return false; /* no NUL inside: it becomes a C string */
    return true;
}

static gser_status_t parse_schema(rctx_t *rc, int32_t parent, int32_t slot, int depth, size_t *next)
{
    arrow_recv_t *rx = rc->rx;
    if (*next >= rx->n)
        return rfail(rc, parent, GSER_ERR_FORMAT, "the schema has fewer nodes than its children need");
    int32_t i = (int32_t)(*next)++;
    rnode_t *n = &rx->nodes[i];
    n->parent = parent;
    n->slot = slot;
    n->first_child = n->dictionary = -1;
    gser_value_t *node, *v;
    if (!get_field(rc->schema, (size_t)i, &node) ||
        (gser_value_get_kind(node) != GSER_KIND_LIST && gser_value_get_kind(node) != GSER_KIND_TUPLE) ||
        gser_value_get_len(node) != SN_COUNT_)
        return rfail(rc, parent, GSER_ERR_FORMAT, "schema node %d is not a list of %d fields", (int)i, SN_COUNT_);
    if (!get_field(node, SN_FORMAT, &v) || !get_cstr(v, &n->format))
        return rfail(rc, parent, GSER_ERR_FORMAT, "schema node %d has no format string", (int)i);
    if (depth > ARROW_MAX_DEPTH)
        return rfail(rc, i, GSER_ERR_LIMIT_DEPTH, "types nest deeper than %d levels", ARROW_MAX_DEPTH);
    if (!get_field(node, SN_NAME, &v) || (gser_value_get_kind(v) != GSER_KIND_NIL && !get_cstr(v, &n->name)))
        return rfail(rc, i, GSER_ERR_FORMAT, "the name is neither nil nor a string");
    if (arrow_fmt_parse(n->format, &n->fmt) != GSER_OK)
        return rfail(rc, i, GSER_ERR_UNSUPPORTED, "type \"%s\" is not supported", n->format);
    int64_t nc;
    bool has_dict;
    if (!get_field(node, SN_FLAGS, &v) || gser_value_get_int(v, &n->flags) != GSER_OK)
        return rfail(rc, i, GSER_ERR_FORMAT, "the flags are not an integer");
    if (!get_field(node, SN_METADATA, &v))
        return rfail(rc, i, GSER_ERR_FORMAT, "no metadata field");
    if (gser_value_get_kind(v) != GSER_KIND_NIL) {
        size_t size;
        if (gser_value_get_bytes(v, &n->metadata, &n->metadata_len) != GSER_OK ||
            !arrow_metadata_size(n->metadata, n->metadata_len, &size) || size != n->metadata_len)
            return rfail(rc, i, GSER_ERR_FORMAT, "the metadata is malformed");
    }
    if (!get_field(node, SN_NCHILDREN, &v) || gser_value_get_int(v, &nc) != GSER_OK || nc < 0 ||
        (uint64_t)nc > rx->n - *next || (n->fmt.n_children >= 0 && nc != n->fmt.n_children))
        return rfail(rc, i, GSER_ERR_FORMAT, "bad number of children");
    if (!get_field(node, SN_HAS_DICT, &v) || gser_value_get_bool(v, &has_dict) != GSER_OK ||
        (has_dict && !n->fmt.is_index))
        return rfail(rc, i, GSER_ERR_FORMAT, "bad dictionary flag");
    n->n_children = (int32_t)nc;
    for (int32_t c = 0; c < n->n_children; c++) {
        if (c == 0)
            rx->nodes[i].first_child = (int32_t)*next;
        gser_status_t st = parse_schema(rc, i, c, depth + 1, next);
        if (st)
            return st;
    }
    if (has_dict) {
        rx->nodes[i].dictionary = (int32_t)*next;
        gser_status_t st = parse_schema(rc, i, -1, depth + 1, next);
        if (st)
            return st;
    }
    n = &rx->nodes[i];
    n->end = (int32_t)*next;
    if (n->fmt.is_map) {
        const rnode_t *e = &rx->nodes[n->first_child];
        if (strcmp(e->format, "+s") != 0 || e->n_children != 2)
            return rfail(rc, i, GSER_ERR_FORMAT, "a map's child must be a struct of two");
    }
    return GSER_OK;
}

/* A buffer field: nil (absent) or a buffer value of exactly nbytes. */
static gser_status_t get_buffer(rctx_t *rc, int32_t i, gser_value_t *node, int b, bool required,
                                uint64_t nbytes, gser_buffer_desc_t *d)
{
    gser_value_t *v;
    memset(d, 0, sizeof *d);
    d->size = sizeof *d;
    if (!get_field(node, AN_BUFFERS + (size_t)b, &v))
        return rfail(rc, i, GSER_ERR_FORMAT, "buffer %d is missing", b);
    if (gser_value_get_kind(v) == GSER_KIND_NIL) {
        if (required)
            return rfail(rc, i, GSER_ERR_FORMAT, "buffer %d is nil", b);
        return GSER_OK;
    }
    if (gser_value_get_buffer(v, d) != GSER_OK)
        return rfail(rc, i, GSER_ERR_FORMAT, "buffer %d is not a buffer", b);
    if (d->strides) /* Arrow buffers are plain bytes: a layout is a lie */
        return rfail(rc, i, GSER_ERR_FORMAT, "buffer %d has strides", b);
    if (d->nbytes != nbytes)
        return rfail(rc, i, GSER_ERR_FORMAT, "buffer %d holds %zu bytes, %llu expected", b, d->nbytes,
                     (unsigned long long)nbytes);
    rc->rx->nodes[i].bufs[b] = v;
    return GSER_OK;
}

/* Offsets are checked as the sender checked them: from 0, never decreasing,
 * ending at the size of what they index; in host memory here, in device
 * memory by one pass on the device. */
static gser_status_t check_host_offsets(rctx_t *rc, int32_t i, const gser_buffer_desc_t *d, uint32_t w,
                                        int64_t len, uint64_t end)
{
    if (d->memory != GSER_MEMORY_HOST) {
        /* A peer's device offsets are checked on the device (one pass, one
         * word back): a consumer's kernels must not read past the data. */
        gser_msg_t *m = gser_reader_get_msg(rc->r);
        uint32_t verdict = 0;
        gser_status_t st = gser_device_check_offsets(gser_msg_get_context(m), d->data, (size_t)len + 1, w, end,
                                                     gser_reader_get_stream(rc->r), &verdict);
        if (st)
            return rfail(rc, i, st, "checking the offsets on the device failed");
        if (verdict)
            return rfail(rc, i, GSER_ERR_FORMAT, "offsets %s%s%s (the data has %llu)",
                         verdict & GSER_OFFSETS_FIRST ? "do not start at 0; " : "",
                         verdict & GSER_OFFSETS_DECREASE ? "decrease; " : "",
                         verdict & GSER_OFFSETS_LAST ? "do not end at the data's size" : "", (unsigned long long)end);
        return GSER_OK;
    }
    int64_t first = arrow_offset_at(d->data, w, 0);
    if (first != 0)
        return rfail(rc, i, GSER_ERR_FORMAT, "offsets start at %lld, not 0", (long long)first);
    int64_t k = arrow_first_decrease(d->data, w, 0, len + 1);
    if (k >= 0)
        return rfail(rc, i, GSER_ERR_FORMAT, "offset %lld is less than offset %lld", (long long)k, (long long)(k - 1));
    int64_t prev = arrow_offset_at(d->data, w, len);
    if ((uint64_t)prev != end)
        return rfail(rc, i, GSER_ERR_FORMAT, "offsets end at %lld, the data has %llu", (long long)prev,
                     (unsigned long long)end);
    return GSER_OK;
}

static gser_status_t parse_array(rctx_t *rc, int32_t i)
{
    rnode_t *n = &rc->rx->nodes[i];
    const arrow_fmt_t *f = &n->fmt;
    gser_value_t *node, *v;
    if (!get_field(rc->array, (size_t)i, &node) ||
        (gser_value_get_kind(node) != GSER_KIND_LIST && gser_value_get_kind(node) != GSER_KIND_TUPLE) ||
        gser_value_get_len(node) != (size_t)(AN_BUFFERS + f->n_buffers))
        return rfail(rc, i, GSER_ERR_FORMAT, "array node is not a list of %d fields", AN_BUFFERS + f->n_buffers);
    if (!get_field(node, AN_LENGTH, &v) || gser_value_get_int(v, &n->length) != GSER_OK || n->length < 0 ||
        !get_field(node, AN_NULL_COUNT, &v) || gser_value_get_int(v, &n->null_count) != GSER_OK ||
        n->null_count < -1 || n->null_count > n->length)
        return rfail(rc, i, GSER_ERR_FORMAT, "bad length or null count");
    return GSER_OK;
}

static gser_status_t check_array(rctx_t *rc, int32_t i)
{
    rnode_t *n = &rc->rx->nodes[i];
    const arrow_fmt_t *f = &n->fmt;
    gser_value_t *node;
    get_field(rc->array, (size_t)i, &node);
    uint64_t len = (uint64_t)n->length, bits = (len + 7) / 8;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT, off = GSER_BUFFER_DESC_INIT;
    gser_status_t st;
    if (f->n_buffers) {
        if ((st = get_buffer(rc, i, node, 0, false, bits, &d)))
            return st;
        if (!n->bufs[0] && n->null_count > 0)
            return rfail(rc, i, GSER_ERR_FORMAT, "%lld nulls but no validity bitmap", (long long)n->null_count);
    }
    const rnode_t *child = n->first_child >= 0 ? &rc->rx->nodes[n->first_child] : NULL;
    switch (f->layout) {
    case LAYOUT_NULL: break;
    case LAYOUT_BOOL: return get_buffer(rc, i, node, 1, true, bits, &d);
    case LAYOUT_FIXED:
        if (len > UINT64_MAX / f->width)
            return rfail(rc, i, GSER_ERR_FORMAT, "too long");
        return get_buffer(rc, i, node, 1, true, len * f->width, &d);
    case LAYOUT_VARLEN:
    case LAYOUT_LIST: {
        if ((st = get_buffer(rc, i, node, 1, true, (len + 1) * f->width, &off)))
            return st;
        uint64_t end;
        if (f->layout == LAYOUT_VARLEN) {
            gser_value_t *bv;
            get_field(node, AN_BUFFERS + 2, &bv);
            if (gser_value_get_buffer(bv, &d) != GSER_OK)
                return rfail(rc, i, GSER_ERR_FORMAT, "buffer 2 is not a buffer");
            if ((st = get_buffer(rc, i, node, 2, true, d.nbytes, &d)))
                return st;
            end = d.nbytes;
        } else {
            end = (uint64_t)child->length;
        }
        return check_host_offsets(rc, i, &off, f->width, n->length, end);
    }
    case LAYOUT_FIXED_LIST:
        if (f->list_size && len > (uint64_t)INT64_MAX / (uint64_t)f->list_size)
            return rfail(rc, i, GSER_ERR_FORMAT, "too long");
        if ((uint64_t)child->length != len * (uint64_t)f->list_size)
            return rfail(rc, i, GSER_ERR_FORMAT, "the child has %lld rows, %llu expected", (long long)child->length,
                         (unsigned long long)(len * (uint64_t)f->list_size));
        break;
    case LAYOUT_STRUCT:
        for (int32_t c = n->first_child, k = 0; k < n->n_children; k++, c = rc->rx->nodes[c].end)
            if (rc->rx->nodes[c].length != n->length)
                return rfail(rc, i, GSER_ERR_FORMAT, "child %d has %lld rows, the struct %lld", (int)k,
                             (long long)rc->rx->nodes[c].length, (long long)n->length);
        break;
    }
    return GSER_OK;
}

gser_status_t arrow_deserialize(gser_context_t *ctx, gser_reader_t *r, void **obj_out, void *user_data)
{
    (void)user_data;
    gser_value_t *tree = gser_reader_get_tree(r);
    gser_value_t *dev, *schema, *array;
    int64_t device_type;
    if (gser_value_get_kind(tree) != GSER_KIND_MAP || gser_map_find_cstr(tree, ARROW_KEY_DEVICE, &dev) ||
        gser_value_get_int(dev, &device_type) || device_type < INT32_MIN || device_type > INT32_MAX ||
        gser_map_find_cstr(tree, ARROW_KEY_SCHEMA, &schema) || gser_value_get_kind(schema) != GSER_KIND_LIST ||
        gser_map_find_cstr(tree, ARROW_KEY_ARRAY, &array) || gser_value_get_kind(array) != GSER_KIND_LIST)
        return gser_reader_fail(r, GSER_ERR_FORMAT, "the sub-tree is not {device, schema, array}");
    size_t n = gser_value_get_len(schema);
    if (n == 0 || n != gser_value_get_len(array) || n > (size_t)INT32_MAX)
        return gser_reader_fail(r, GSER_ERR_FORMAT, "%zu schema nodes and %zu array nodes", n,
                                gser_value_get_len(array));
    arrow_recv_t *rx = calloc(1, sizeof *rx + n * sizeof(rnode_t));
    if (!rx)
        return gser_reader_fail(r, GSER_ERR_NO_MEMORY, "out of memory");
    rx->magic = ARROW_MAGIC_RECV;
    rx->device_type = (int32_t)device_type;
    rx->host_family = strcmp(gser_reader_get_family(r), "host") == 0;
    rx->ctx = ctx;
    rx->msg = gser_reader_get_msg(r);
    rx->n = n;
    rctx_t rc = {.r = r, .rx = rx, .schema = schema, .array = array};
    size_t next = 0;
    gser_status_t st = parse_schema(&rc, -1, -2, 0, &next);
    if (st == GSER_OK && next != n)
        st = gser_reader_fail(r, GSER_ERR_FORMAT, "the schema has %zu nodes, the tree uses %zu", n, next);
    /* lengths first (a parent checks its children's), then the buffers */
    for (size_t i = 0; i < n && st == GSER_OK; i++)
        st = parse_array(&rc, (int32_t)i);
    for (size_t i = 0; i < n && st == GSER_OK; i++)
        st = check_array(&rc, (int32_t)i);
    if (st) {
        free(rx);
        return st;
    }
    *obj_out = rx;
    return GSER_OK;
}

/* ---- the keeper ------------------------------------------------------------------------ */

typedef struct keeper {
    atomic_long refs;
    gser_context_t *ctx;
    void *stream;
    gser_frame_t *frames; /* taken from the message */
    size_t nframes;
    void *host_block;
    void *dev_block;
    size_t dev_size;
    gser_event_t *event; /* ours, or NULL */
    void *event_handle;  /* what sync_event points at */
} keeper_t;

static void keeper_unref(keeper_t *k)
{
    if (atomic_fetch_sub(&k->refs, 1) != 1)
        return;
    for (size_t i = 0; i < k->nframes; i++)
        if (k->frames[i].release)
            k->frames[i].release((void *)k->frames[i].data, k->frames[i].release_arg);
    free(k->frames);
    free(k->host_block);
    if (k->dev_block)
        gser_device_free(k->ctx, k->dev_block, k->dev_size, k->stream);
    gser_event_destroy(k->event);
    free(k);
}

/* ---- exported arrays ------------------------------------------------------------------- */

typedef struct array_priv {
    keeper_t *keeper;
    const void *buffers[3];
    struct ArrowArray **child_ptrs;
    struct ArrowArray *children;
    struct ArrowArray dictionary;
} array_priv_t;

static void release_array(struct ArrowArray *a)
{
    if (!a || !a->release)
        return;
    array_priv_t *p = a->private_data;
    for (int64_t c = 0; c < a->n_children; c++)
        if (p->child_ptrs[c]->release) /* NULL: moved out, released by its new owner */
            p->child_ptrs[c]->release(p->child_ptrs[c]);
    if (a->dictionary && a->dictionary->release)
        a->dictionary->release(a->dictionary);
    keeper_unref(p->keeper);
    free(p);
    a->release = NULL;
    a->private_data = NULL;
}

typedef struct take {
    arrow_recv_t *rx;
    keeper_t *keeper;
    const void **ptrs; /* per node, 3 buffer slots: the final pointers */
} take_t;

static gser_status_t build_array(take_t *t, int32_t i, struct ArrowArray *out)
{
    const rnode_t *n = &t->rx->nodes[i];
    size_t nc = (size_t)n->n_children;
    array_priv_t *p = malloc(sizeof *p + nc * (sizeof(struct ArrowArray) + sizeof(struct ArrowArray *)));
    if (!p)
        return GSER_ERR_NO_MEMORY;
    memset(p, 0, sizeof *p);
    p->keeper = t->keeper;
    p->children = (struct ArrowArray *)(p + 1);
    p->child_ptrs = (struct ArrowArray **)(p->children + nc);
    for (int b = 0; b < 3; b++)
        p->buffers[b] = t->ptrs[3 * (size_t)i + (size_t)b];
    size_t built = 0;
    gser_status_t st = GSER_OK;
    for (int32_t c = n->first_child; built < nc; built++, c = t->rx->nodes[c].end) {
        p->child_ptrs[built] = &p->children[built];
        if ((st = build_array(t, c, &p->children[built])))
            break;
    }
    if (st == GSER_OK && n->dictionary >= 0 && (st = build_array(t, n->dictionary, &p->dictionary)) == GSER_OK)
        built = nc + 1;
    if (st) {
        for (size_t c = 0; c < built && c < nc; c++)
            p->children[c].release(&p->children[c]);
        free(p);
        return st;
    }
    atomic_fetch_add(&t->keeper->refs, 1);
    *out = (struct ArrowArray){.length = n->length,
                               .null_count = n->null_count,
                               .offset = 0,
                               .n_buffers = n->fmt.n_buffers,
                               .n_children = (int64_t)nc,
                               .buffers = p->buffers,
                               .children = nc ? p->child_ptrs : NULL,
                               .dictionary = n->dictionary >= 0 ? &p->dictionary : NULL,
                               .release = release_array,
                               .private_data = p};
    return GSER_OK;
}

/* ---- exported schemas (deep copies, independent of everything) ------------------------- */

typedef struct schema_priv {
    struct ArrowSchema **child_ptrs;
    struct ArrowSchema *children;
    struct ArrowSchema dictionary;
} schema_priv_t;

static void release_schema(struct ArrowSchema *s)
{
    if (!s || !s->release)
        return;
    schema_priv_t *p = s->private_data;
    for (int64_t c = 0; c < s->n_children; c++)
        if (p->child_ptrs[c]->release)
            p->child_ptrs[c]->release(p->child_ptrs[c]);
    if (s->dictionary && s->dictionary->release)
        s->dictionary->release(s->dictionary);
    free(p);
    s->release = NULL;
    s->private_data = NULL;
}

static gser_status_t build_schema(const arrow_recv_t *rx, int32_t i, struct ArrowSchema *out)
{
    const rnode_t *n = &rx->nodes[i];
    size_t nc = (size_t)n->n_children;
    size_t flen = strlen(n->format) + 1, nlen = n->name ? strlen(n->name) + 1 : 0;
    schema_priv_t *p = malloc(sizeof *p + nc * (sizeof(struct ArrowSchema) + sizeof(struct ArrowSchema *)) + flen +
                              nlen + n->metadata_len);
    if (!p)
        return GSER_ERR_NO_MEMORY;
    memset(p, 0, sizeof *p);
    p->children = (struct ArrowSchema *)(p + 1);
    p->child_ptrs = (struct ArrowSchema **)(p->children + nc);
    char *format = (char *)(p->child_ptrs + nc), *name = format + flen, *meta = name + nlen;
    memcpy(format, n->format, flen);
    if (n->name)
        memcpy(name, n->name, nlen);
    if (n->metadata)
        memcpy(meta, n->metadata, n->metadata_len);
    size_t built = 0;
    gser_status_t st = GSER_OK;
    for (int32_t c = n->first_child; built < nc; built++, c = rx->nodes[c].end) {
        p->child_ptrs[built] = &p->children[built];
        if ((st = build_schema(rx, c, &p->children[built])))
            break;
    }
    if (st == GSER_OK && n->dictionary >= 0)
        st = build_schema(rx, n->dictionary, &p->dictionary);
    if (st) {
        for (size_t c = 0; c < built && c < nc; c++)
            p->children[c].release(&p->children[c]);
        free(p);
        return st;
    }
    *out = (struct ArrowSchema){.format = format,
                                .name = n->name ? name : NULL,
                                .metadata = n->metadata ? meta : NULL,
                                .flags = n->flags,
                                .n_children = (int64_t)nc,
                                .children = nc ? p->child_ptrs : NULL,
                                .dictionary = n->dictionary >= 0 ? &p->dictionary : NULL,
                                .release = release_schema,
                                .private_data = p};
    return GSER_OK;
}

/* ---- taking the table ---------------------------------------------------------------- */

/* Where a buffer's bytes are: a frame (one region per frame, moved or taken
 * whole) or loose memory (header bytes, copies the message made). */
enum { ACT_VIEW, ACT_TAKE, ACT_COPY };

typedef struct region {
    const unsigned char *src;
    size_t size;
    gser_memory_t mem;
    size_t frame; /* index in the message's frames, or SIZE_MAX */
    int act;
    unsigned char *dst;
} region_t;

typedef struct frame_ix {
    uintptr_t start, end;
    size_t index;
} frame_ix_t;

static int cmp_frame_ix(const void *a, const void *b)
{
    const frame_ix_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* The data frame (index >= 1) holding [p, p + n) in memory mem, or SIZE_MAX. */
static size_t find_frame(const frame_ix_t *ix, size_t nix, const gser_frame_t *frames, const void *p, size_t n,
                         gser_memory_t mem)
{
    uintptr_t a = (uintptr_t)p;
    size_t lo = 0, hi = nix;
    while (lo < hi) { /* the last frame starting at or before p: frames do not overlap */
        size_t mid = lo + (hi - lo) / 2;
        if (ix[mid].start <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return SIZE_MAX;
    const frame_ix_t *f = &ix[lo - 1];
    if (a < f->end && n <= f->end - a && frames[f->index].memory == mem)
        return f->index;
    return SIZE_MAX;
}

/* What a zero-length buffer points at, on every device type: the C Data
 * Interface allows NULL there, but Arrow's own exporter never hands it out
 * (older consumers dereference it), and neither does this one. Never read
 * or written: its length is 0 wherever it appears. */
static _Alignas(64) const unsigned char empty_region[1];

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* What one gser_arrow_take_value call works with, made by plan_init and
 * freed by plan_cleanup (the keeper stays when the arrays hold it). */
typedef struct take_plan {
    arrow_recv_t *rx;
    gser_context_t *ctx;
    gser_arrow_take_options_t o;
    const gser_frame_t *frames;
    size_t nf;
    size_t nslots;       /* 3 buffer slots per node */
    const void **ptrs;   /* per slot: where its bytes end up */
    size_t *slot_region; /* per slot: its region, or SIZE_MAX */
    region_t *regions;
    size_t nreg;
    frame_ix_t *ix; /* the data frames by address */
    size_t nix;
    size_t *frame_region; /* per frame: its region, or SIZE_MAX */
    keeper_t *k;
    bool any_dev, any_host;
    void *core_event;  /* the message's device event, if a buffer has it */
    int64_t device_id; /* of the device buffers as received */
    gser_memory_t target;
    size_t copy_bytes;  /* the block every copied region goes to */
    bool device_copies; /* some copy is queued on the stream */
} take_plan_t;

/* Allocate the plan's tables and the keeper; GSER_ERR_NO_MEMORY leaves what
 * was made for plan_cleanup. */
static gser_status_t plan_init(take_plan_t *p, arrow_recv_t *rx, const gser_arrow_take_options_t *o)
{
    *p = (take_plan_t){.rx = rx, .ctx = rx->ctx, .o = *o, .nslots = rx->n * 3};
    p->frames = gser_msg_get_frames(rx->msg, &p->nf);
    size_t nf1 = p->nf ? p->nf : 1;
    p->ptrs = calloc(p->nslots, sizeof *p->ptrs);
    p->slot_region = malloc(p->nslots * sizeof *p->slot_region);
    p->regions = malloc(p->nslots * sizeof *p->regions);
    p->ix = malloc(nf1 * sizeof *p->ix);
    p->frame_region = malloc(nf1 * sizeof *p->frame_region);
    p->k = calloc(1, sizeof *p->k);
    if (p->k) {
        atomic_init(&p->k->refs, 1); /* ours until the end */
        p->k->ctx = p->ctx;
        p->k->stream = o->stream;
    }
    if (!p->ptrs || !p->slot_region || !p->regions || !p->ix || !p->frame_region || !p->k)
        return GSER_ERR_NO_MEMORY;
    return GSER_OK;
}

static void plan_cleanup(take_plan_t *p)
{
    if (p->k)
        keeper_unref(p->k);
    free(p->ptrs);
    free(p->slot_region);
    free(p->regions);
    free(p->ix);
    free(p->frame_region);
}

/* Index the data frames by address, to tell which one a buffer points into. */
static void plan_index_frames(take_plan_t *p)
{
    for (size_t i = 1; i < p->nf; i++) {
        p->frame_region[i] = SIZE_MAX;
        if (p->frames[i].size && p->frames[i].data)
            p->ix[p->nix++] =
                (frame_ix_t){(uintptr_t)p->frames[i].data, (uintptr_t)p->frames[i].data + p->frames[i].size, i};
    }
    qsort(p->ix, p->nix, sizeof *p->ix, cmp_frame_ix);
}

/* Group the buffers into regions: one per frame they lie in, one per loose
 * buffer; note whether any is on the device or the host. */
static void plan_regions(take_plan_t *p)
{
    for (size_t s = 0; s < p->nslots; s++) {
        p->slot_region[s] = SIZE_MAX;
        const gser_value_t *bv = p->rx->nodes[s / 3].bufs[s % 3];
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        if (!bv || gser_value_get_buffer(bv, &d) != GSER_OK || d.nbytes == 0)
            continue;
        if (d.memory == GSER_MEMORY_DEVICE) {
            p->any_dev = true;
            p->device_id = d.device;
            if (d.event)
                p->core_event = d.event;
        } else {
            p->any_host = true;
        }
        size_t f = find_frame(p->ix, p->nix, p->frames, d.data, d.nbytes, d.memory);
        if (f != SIZE_MAX && p->frame_region[f] != SIZE_MAX) {
            p->slot_region[s] = p->frame_region[f];
        } else {
            region_t *rg = &p->regions[p->nreg];
            if (f != SIZE_MAX)
                *rg = (region_t){p->frames[f].data, p->frames[f].size, d.memory, f, ACT_VIEW, NULL};
            else
                *rg = (region_t){d.data, d.nbytes, d.memory, SIZE_MAX, ACT_VIEW, NULL};
            if (f != SIZE_MAX)
                p->frame_region[f] = p->nreg;
            p->slot_region[s] = p->nreg++;
        }
        p->ptrs[s] = d.data; /* rebased onto the region's new place by plan_copy */
    }
}

/* Where the table goes: the caller's choice, else where its bytes are, else
 * (no bytes at all) where the family and the sender put it.
 * GSER_ERR_NO_DEVICE when that is a device the context does not have. */
static gser_status_t plan_target(take_plan_t *p)
{
    const arrow_recv_t *rx = p->rx;
    if (p->o.flags & GSER_ARROW_TO_HOST)
        p->target = GSER_MEMORY_HOST;
    else if (p->o.flags & GSER_ARROW_TO_DEVICE)
        p->target = GSER_MEMORY_DEVICE;
    else if (p->any_dev || p->any_host)
        p->target = p->any_dev ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST;
    else
        p->target = !rx->host_family &&
                            (rx->device_type == ARROW_DEVICE_CUDA || rx->device_type == ARROW_DEVICE_CUDA_MANAGED) &&
                            gser_context_has_device(p->ctx)
                        ? GSER_MEMORY_DEVICE
                        : GSER_MEMORY_HOST;
    if (p->target == GSER_MEMORY_DEVICE && !gser_context_has_device(p->ctx))
        return GSER_ERR_NO_DEVICE;
    return GSER_OK;
}

/* Decide for each region whether the arrays view it, take its frame or copy
 * it, and size the copies' block. */
static gser_status_t plan_actions(take_plan_t *p)
{
    size_t ntake = 0;
    for (size_t g = 0; g < p->nreg; g++) {
        region_t *rg = &p->regions[g];
        if (rg->mem != p->target)
            rg->act = ACT_COPY;
        else if (p->o.flags & GSER_ARROW_BORROW)
            rg->act = ACT_VIEW;
        else if (rg->frame != SIZE_MAX && p->frames[rg->frame].release)
            rg->act = ACT_TAKE;
        else
            rg->act = ACT_COPY; /* the message would free it, or it is the caller's */
        if (rg->act == ACT_COPY) {
            p->copy_bytes += align64(rg->size);
            p->device_copies |= rg->mem == GSER_MEMORY_DEVICE || p->target == GSER_MEMORY_DEVICE;
        }
        ntake += rg->act == ACT_TAKE;
    }
    if (ntake && !(p->k->frames = calloc(ntake, sizeof *p->k->frames)))
        return GSER_ERR_NO_MEMORY;
    return GSER_OK;
}

/* One block for every copy, in the target memory (the keeper's); then the
 * copies, done when this returns; then every slot's pointer at its bytes'
 * final place. */
static gser_status_t plan_copy(take_plan_t *p)
{
    gser_status_t st;
    keeper_t *k = p->k;
    unsigned char *block = NULL;
    if (p->copy_bytes) {
        if (p->target == GSER_MEMORY_HOST) {
            if (!(k->host_block = aligned_alloc(64, p->copy_bytes)))
                return GSER_ERR_NO_MEMORY;
            block = k->host_block;
        } else {
            if ((st = gser_device_alloc(p->ctx, p->copy_bytes, p->o.stream, &k->dev_block)))
                return st;
            k->dev_size = p->copy_bytes;
            block = k->dev_block;
        }
    }
    /* Copies out of device memory gser_deserialize filled (restored or
     * scattered buffers) start after its copies: its event is the message's,
     * on its stream, so wait for it here rather than guess the stream. */
    if (p->copy_bytes && p->core_event && (st = gser_msg_wait(p->rx->msg)))
        return st;
    size_t at = 0;
    for (size_t g = 0; g < p->nreg; g++) {
        region_t *rg = &p->regions[g];
        if (rg->act != ACT_COPY) {
            rg->dst = (unsigned char *)rg->src;
            continue;
        }
        rg->dst = block + at;
        at += align64(rg->size);
        if ((st = gser_device_memcpy(p->ctx, rg->dst, p->target, rg->src, rg->mem, rg->size, p->o.stream)))
            return st;
    }
    /* The message may free the sources once this returns. */
    if (p->device_copies && (st = gser_stream_wait(p->ctx, p->o.stream)))
        return st;
    for (size_t s = 0; s < p->nslots; s++)
        if (p->slot_region[s] != SIZE_MAX) {
            const region_t *rg = &p->regions[p->slot_region[s]];
            p->ptrs[s] = rg->dst + ((const unsigned char *)p->ptrs[s] - rg->src);
        } else if (p->rx->nodes[s / 3].bufs[s % 3]) {
            p->ptrs[s] = empty_region; /* a buffer the array has, with no bytes */
        }
    return GSER_OK;
}

/* The sync_event of device arrays: an event after everything (a cudaEvent_t
 * with CUDA; the emulated backend's work is queued all the same, so its
 * arrays get one too), or the message's own when the arrays borrow it. NULL
 * for host arrays. */
static gser_status_t plan_sync_event(take_plan_t *p, void **sync_event)
{
    keeper_t *k = p->k;
    *sync_event = NULL;
    if (p->target != GSER_MEMORY_DEVICE)
        return GSER_OK;
    if ((p->o.flags & GSER_ARROW_BORROW) && !p->copy_bytes && p->core_event) {
        k->event_handle = p->core_event; /* the message's, alive as long as it is */
    } else {
        gser_status_t st;
        if ((st = gser_event_create(p->ctx, &k->event)) || (st = gser_event_record(k->event, p->o.stream)))
            return st;
        k->event_handle = gser_event_get_handle(k->event);
    }
    *sync_event = &k->event_handle;
    return GSER_OK;
}

/* The keeper takes the frames the arrays keep from the message; nothing can
 * fail any more when this runs. */
static void plan_take_frames(take_plan_t *p)
{
    keeper_t *k = p->k;
    for (size_t g = 0; g < p->nreg; g++)
        if (p->regions[g].act == ACT_TAKE &&
            gser_msg_take_frame(p->rx->msg, p->regions[g].frame, &k->frames[k->nframes]) == GSER_OK)
            k->nframes++;
}

/* The received table of v, or NULL when v holds none. */
static arrow_recv_t *recv_of(gser_value_t *v)
{
    const char *type;
    void *obj;
    if (gser_value_get_object(v, &type, &obj) != GSER_OK || strcmp(type, GSER_ARROW_TYPE) != 0 || !obj ||
        ((arrow_recv_t *)obj)->magic != ARROW_MAGIC_RECV)
        return NULL;
    return obj;
}

gser_status_t gser_arrow_take_value(gser_value_t *v, const gser_arrow_take_options_t *opts,
                                    struct ArrowDeviceArray *out_array, struct ArrowSchema *out_schema)
{
    if (!v || !out_array || !out_schema)
        return GSER_ERR_INVALID_ARG;
    arrow_recv_t *rx = recv_of(v);
    if (!rx)
        return GSER_ERR_TYPE_MISMATCH;
    gser_arrow_take_options_t o = GSER_ARROW_TAKE_OPTIONS_INIT;
    gser_status_t st;
    if (opts && (st = gser_context_struct_read(rx->ctx, "gser_arrow_take_value", "gser_arrow_take_options_t", &o,
                                               sizeof o, opts)))
        return st;
    if ((o.flags & GSER_ARROW_TO_DEVICE) && (o.flags & GSER_ARROW_TO_HOST))
        return GSER_ERR_INVALID_ARG;
    if (rx->taken)
        return GSER_ERR_STATE;

    take_plan_t p;
    struct ArrowSchema schema;
    struct ArrowArray root;
    bool schema_built = false;
    void *sync_event = NULL;
    if ((st = plan_init(&p, rx, &o)))
        goto out;
    plan_index_frames(&p);
    plan_regions(&p);
    if ((st = plan_target(&p)) || (st = plan_actions(&p)) || (st = plan_copy(&p)) ||
        (st = plan_sync_event(&p, &sync_event)))
        goto out;
    /* Device memory copied here is the context's GPU; views keep their
     * frames' (a transport's frames are the receiving context's GPU too). */
    if (p.copy_bytes && p.target == GSER_MEMORY_DEVICE)
        p.device_id = gser_context_get_device_ordinal(p.ctx);
    take_t t = {.rx = rx, .keeper = p.k, .ptrs = p.ptrs};
    if ((st = build_schema(rx, 0, &schema)))
        goto out;
    schema_built = true;
    if ((st = build_array(&t, 0, &root)))
        goto out;

    plan_take_frames(&p);
    rx->taken = true;
    *out_schema = schema;
    *out_array = (struct ArrowDeviceArray){
        .array = root,
        .device_id = p.target == GSER_MEMORY_DEVICE ? p.device_id : -1,
        .device_type = p.target == GSER_MEMORY_DEVICE ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU,
        .sync_event = sync_event,
    };
out:
    if (st && schema_built)
        schema.release(&schema);
    plan_cleanup(&p); /* on success the arrays hold their own references on the keeper */
    return st;
}
