/* What gser-demo and gser-bench-arrow share (demo_table.h). */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "demo_table.h"

const char *who = "gser";

gser_context_t *make_ctx(void)
{
    gser_context_t *ctx;
    if (gser_context_create(NULL, &ctx) != GSER_OK)
        die("gser_context_create", GSER_ERR_NO_DEVICE, gser_context_get_last_error(NULL));
    CK(ctx, gser_arrow_register(ctx));
    return ctx;
}

void make_worker(gser_context_t *ctx, gser_ucx_context_t **uc, gser_ucx_worker_t **w)
{
    CKU(gser_ucx_context_create(NULL, uc));
    gser_ucx_worker_options_t wo = GSER_UCX_WORKER_OPTIONS_INIT;
    wo.gser_ctx = ctx;
    CKU(gser_ucx_worker_create(*uc, &wo, w));
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

gser_ucx_ep_t *accept_peer(gser_ucx_listener_t *l, int timeout_ms)
{
    double deadline = mono_ms() + timeout_ms;
    for (;;) {
        double left = deadline - mono_ms();
        gser_ucx_ep_t *ep;
        gser_status_t st = gser_ucx_listener_accept(l, left > 0 ? (int)left : 0, &ep);
        if (st == GSER_OK)
            return ep;
        if (!gser_ucx_status_is_peer_error(st) || (st == GSER_ERR_TIMEOUT && mono_ms() >= deadline))
            die("gser_ucx_listener_accept", st, gser_ucx_get_last_error());
        fprintf(stderr, "%s: a peer failed its handshake, still listening: %s\n", who, gser_ucx_get_last_error());
    }
}

void die(const char *what, gser_status_t st, const char *detail)
{
    fprintf(stderr, "%s: %s: %s%s%s\n", who, what, gser_status_str(st), detail && *detail ? ": " : "",
            detail ? detail : "");
    exit(1);
}

/* ---- the synthetic table ---------------------------------------------------- */

const char *const col_format[COL_KINDS] = {"l", "g", "u", "+l"};
const char *const col_kind_name[COL_KINDS] = {"int64", "float64 (nulls)", "utf8", "list<int32>"};

/* Everything one ArrowArray node owns. */
typedef struct node {
    gser_context_t *ctx;
    bool device;
    const void *bufs[3];
    size_t sizes[3];
    int nbufs;
    struct ArrowArray *child_ptrs[1];
    struct ArrowArray child;
} node_t;

static void free_buf(node_t *n, int i)
{
    if (!n->bufs[i])
        return;
    if (n->device)
        gser_device_free(n->ctx, (void *)n->bufs[i], n->sizes[i], NULL);
    else
        free((void *)n->bufs[i]);
}

static void release_array(struct ArrowArray *a)
{
    node_t *n = a->private_data;
    for (int i = 0; i < n->nbufs; i++)
        free_buf(n, i);
    if (a->n_children && a->children[0]->release)
        a->children[0]->release(a->children[0]);
    free(n);
    a->release = NULL;
}

/* Host bytes, or their copy in device memory when the table lives there. */
static const void *place(gser_context_t *ctx, bool device, void *host, size_t size)
{
    if (!device || !host)
        return host;
    void *d;
    CK(ctx, gser_device_alloc(ctx, size, NULL, &d));
    CK(ctx, gser_device_memcpy(ctx, d, GSER_MEMORY_DEVICE, host, GSER_MEMORY_HOST, size, NULL));
    CK(ctx, gser_stream_wait(ctx, NULL));
    free(host);
    return d;
}

static void set_node(struct ArrowArray *a, node_t *n, int64_t len, int64_t nulls)
{
    memset(a, 0, sizeof *a);
    a->length = len;
    a->null_count = nulls;
    a->n_buffers = n->nbufs;
    a->buffers = n->bufs;
    a->release = release_array;
    a->private_data = n;
}

/* Column c (kind c % 4) of the table, rows long. */
static void make_column(gser_context_t *ctx, bool device, int c, int64_t rows, struct ArrowArray *out)
{
    node_t *n = calloc(1, sizeof *n);
    if (!n)
        die("calloc", GSER_ERR_NO_MEMORY, NULL);
    n->ctx = ctx;
    n->device = device;
    int kind = c % COL_KINDS;
    int64_t nulls = 0;
    size_t bm = (size_t)(rows + 7) / 8;
    if (kind == COL_INT64 || kind == COL_FLOAT64) {
        int64_t *v = malloc((size_t)rows * 8 + 1);
        uint8_t *valid = NULL;
        for (int64_t i = 0; i < rows; i++) {
            if (kind == COL_INT64)
                v[i] = i * 2654435761 + c;
            else
                ((double *)v)[i] = (double)i * 0.5 + c;
        }
        if (kind == COL_FLOAT64) {
            valid = malloc(bm ? bm : 1);
            memset(valid, 0xff, bm);
            for (int64_t i = 0; i < rows; i += 7, nulls++)
                valid[i / 8] &= (uint8_t)~(1u << (i % 8));
        }
        n->nbufs = 2;
        n->sizes[0] = bm;
        n->bufs[0] = place(ctx, device, valid, bm);
        n->sizes[1] = (size_t)rows * 8;
        n->bufs[1] = place(ctx, device, v, (size_t)rows * 8);
        set_node(out, n, rows, nulls);
        return;
    }
    if (kind == COL_UTF8) {
        int32_t *off = malloc((size_t)(rows + 1) * 4);
        off[0] = 0;
        for (int64_t i = 0; i < rows; i++)
            off[i + 1] = off[i] + (int32_t)snprintf(NULL, 0, "row-%" PRId64 "-c%d", i, c);
        char *chars = malloc((size_t)off[rows] + 1);
        for (int64_t i = 0; i < rows; i++) {
            char tmp[48];
            int len = snprintf(tmp, sizeof tmp, "row-%" PRId64 "-c%d", i, c);
            memcpy(chars + off[i], tmp, (size_t)len);
        }
        n->nbufs = 3;
        n->sizes[1] = (size_t)(rows + 1) * 4;
        n->sizes[2] = (size_t)off[rows];
        n->bufs[2] = place(ctx, device, chars, n->sizes[2] ? n->sizes[2] : 1);
        n->bufs[1] = place(ctx, device, off, n->sizes[1]);
        set_node(out, n, rows, 0);
        return;
    }
    /* list<int32>: row i holds i % 4 values */
    int32_t *off = malloc((size_t)(rows + 1) * 4);
    off[0] = 0;
    for (int64_t i = 0; i < rows; i++)
        off[i + 1] = off[i] + (int32_t)(i % 4);
    int32_t *vals = malloc((size_t)off[rows] * 4 + 4);
    for (int32_t j = 0; j < off[rows]; j++)
        vals[j] = j * 31 + c;
    node_t *cn = calloc(1, sizeof *cn);
    cn->ctx = ctx;
    cn->device = device;
    cn->nbufs = 2;
    cn->sizes[1] = (size_t)off[rows] * 4;
    cn->bufs[1] = place(ctx, device, vals, cn->sizes[1] ? cn->sizes[1] : 4);
    n->nbufs = 2;
    n->sizes[1] = (size_t)(rows + 1) * 4;
    int64_t nvals = off[rows];
    n->bufs[1] = place(ctx, device, off, n->sizes[1]);
    set_node(out, n, rows, 0);
    set_node(&n->child, cn, nvals, 0);
    n->child_ptrs[0] = &n->child;
    out->n_children = 1;
    out->children = n->child_ptrs;
}

typedef struct schema_node {
    struct ArrowSchema *kids[1];
    struct ArrowSchema kid;
    char name[32];
} schema_node_t;

static void release_schema(struct ArrowSchema *s)
{
    for (int64_t i = 0; i < s->n_children; i++)
        if (s->children[i]->release)
            s->children[i]->release(s->children[i]);
    free(s->private_data);
    s->release = NULL;
}

typedef struct table_node {
    struct ArrowArray **col_ptrs;
    struct ArrowArray *cols;
} table_node_t;

static void release_table(struct ArrowArray *a)
{
    table_node_t *t = a->private_data;
    for (int64_t i = 0; i < a->n_children; i++)
        if (t->cols[i].release)
            t->cols[i].release(&t->cols[i]);
    free(t->cols);
    free(t->col_ptrs);
    free(t);
    a->release = NULL;
}

typedef struct table_schema {
    struct ArrowSchema **ptrs;
    struct ArrowSchema *cols;
    schema_node_t *extra;
} table_schema_t;

static void release_table_schema(struct ArrowSchema *s)
{
    table_schema_t *t = s->private_data;
    for (int64_t i = 0; i < s->n_children; i++)
        if (t->cols[i].release)
            t->cols[i].release(&t->cols[i]);
    free(t->cols);
    free(t->ptrs);
    free(t->extra);
    free(t);
    s->release = NULL;
}

void make_table(gser_context_t *ctx, bool device, int64_t rows, int cols, struct ArrowDeviceArray *da,
                struct ArrowSchema *schema)
{
    table_node_t *t = calloc(1, sizeof *t);
    t->cols = calloc((size_t)cols, sizeof *t->cols);
    t->col_ptrs = calloc((size_t)cols, sizeof *t->col_ptrs);
    static const void *no_buffers[1] = {NULL};
    for (int c = 0; c < cols; c++) {
        make_column(ctx, device, c, rows, &t->cols[c]);
        t->col_ptrs[c] = &t->cols[c];
    }
    memset(da, 0, sizeof *da);
    da->array.length = rows;
    da->array.n_buffers = 1;
    da->array.buffers = no_buffers;
    da->array.n_children = cols;
    da->array.children = t->col_ptrs;
    da->array.release = release_table;
    da->array.private_data = t;
    da->device_type = device ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU;
    da->device_id = device ? 0 : -1;

    table_schema_t *ts = calloc(1, sizeof *ts);
    ts->cols = calloc((size_t)cols, sizeof *ts->cols);
    ts->ptrs = calloc((size_t)cols, sizeof *ts->ptrs);
    ts->extra = calloc((size_t)cols, sizeof *ts->extra);
    for (int c = 0; c < cols; c++) {
        schema_node_t *sn = &ts->extra[c];
        struct ArrowSchema *s = &ts->cols[c];
        snprintf(sn->name, sizeof sn->name, "c%d_%s", c, col_format[c % COL_KINDS]);
        s->format = col_format[c % COL_KINDS];
        s->name = sn->name;
        s->flags = ARROW_FLAG_NULLABLE;
        s->release = release_schema;
        s->private_data = NULL;
        if (c % COL_KINDS == COL_LIST) {
            sn->kid = (struct ArrowSchema){.format = "i", .name = "item", .flags = ARROW_FLAG_NULLABLE,
                                           .release = release_schema};
            sn->kids[0] = &sn->kid;
            s->n_children = 1;
            s->children = sn->kids;
        }
        ts->ptrs[c] = s;
    }
    memset(schema, 0, sizeof *schema);
    schema->format = "+s";
    schema->name = "";
    schema->n_children = cols;
    schema->children = ts->ptrs;
    schema->release = release_table_schema;
    schema->private_data = ts;
}

/* ---- checksums, the same on both sides ------------------------------------------ */

/* Mix n bytes into h a 64-bit word at a time (a multiply and a shift per
 * word); a short tail is one more word, tagged with its length, so that
 * "ab"+"c" and "a"+"bc" differ. */
static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    uint64_t tail = (uint64_t)(n - i) << 56;
    if (i < n)
        memcpy(&tail, b + i, n - i); /* little-endian: the length byte stays on top */
    h = (h ^ tail) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

/* n bytes of a buffer of the table, readable on the host: the buffer itself
 * for host memory (no copy), a host copy of it for device memory. Give it
 * back with done(). */
static const void *host_view(gser_context_t *ctx, bool device, const void *p, size_t n)
{
    if (!device)
        return p;
    void *h = malloc(n ? n : 1);
    if (!h)
        die("malloc", GSER_ERR_NO_MEMORY, NULL);
    if (n) {
        CK(ctx, gser_device_memcpy(ctx, h, GSER_MEMORY_HOST, p, GSER_MEMORY_DEVICE, n, NULL));
        CK(ctx, gser_stream_wait(ctx, NULL));
    }
    return h;
}

static void done(bool device, const void *view)
{
    if (device)
        free((void *)view);
}

/* A checksum over the column's logical values (row by row, nulls marked), so
 * that any valid layout of the same values agrees. */
uint64_t column_checksum(gser_context_t *ctx, bool device, const struct ArrowArray *a, const char *format)
{
    uint64_t h = 1469598103934665603ull;
    int64_t len = a->length, off = a->offset;
    const uint8_t *valid = NULL;
    if (a->null_count != 0 && a->buffers[0])
        valid = host_view(ctx, device, a->buffers[0], (size_t)(off + len + 7) / 8);
#define IS_VALID(i) (!valid || (valid[((i) + off) / 8] >> (((i) + off) % 8) & 1))
    if (!strcmp(format, "l") || !strcmp(format, "g")) {
        const unsigned char *v = host_view(ctx, device, (const char *)a->buffers[1] + off * 8, (size_t)len * 8);
        if (!valid)
            h = mix(h, v, (size_t)len * 8);
        else
            for (int64_t i = 0; i < len; i++)
                h = IS_VALID(i) ? mix(h, v + i * 8, 8) : mix(h, "null", 4);
        done(device, v);
    } else {
        const int32_t *o = host_view(ctx, device, (const int32_t *)a->buffers[1] + off, (size_t)(len + 1) * 4);
        if (!strcmp(format, "u")) {
            size_t nbytes = (size_t)(o[len] - o[0]);
            const char *chars = host_view(ctx, device, (const char *)a->buffers[2] + o[0], nbytes);
            for (int64_t i = 0; i < len; i++)
                h = IS_VALID(i) ? mix(h, chars + (o[i] - o[0]), (size_t)(o[i + 1] - o[i])) : mix(h, "null", 4);
            done(device, chars);
        } else {
            const struct ArrowArray *child = a->children[0];
            size_t nvals = (size_t)(o[len] - o[0]);
            const int32_t *vals =
                host_view(ctx, device, (const int32_t *)child->buffers[1] + child->offset + o[0], nvals * 4);
            for (int64_t i = 0; i < len; i++) {
                int32_t count = o[i + 1] - o[i];
                h = mix(h, &count, sizeof count);
                h = mix(h, vals + (o[i] - o[0]), (size_t)count * 4);
            }
            done(device, vals);
        }
        done(device, o);
    }
#undef IS_VALID
    done(device, valid);
    return h;
}
