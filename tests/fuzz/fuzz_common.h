/* The type the fuzz target and the corpus generator share: "fuzz.blob" is a
 * map {"n": int, "data": buffer} in the host family. */
#ifndef GSER_FUZZ_COMMON_H
#define GSER_FUZZ_COMMON_H

#include <stdlib.h>
#include <string.h>

#include <gser/gser.h>

typedef struct fuzz_blob {
    int64_t n;
    size_t len;
    unsigned char *data;
} fuzz_blob_t;

static gser_status_t fuzz_blob_ser(gser_context_t *ctx, const void *obj, gser_writer_t *w, void *ud)
{
    (void)ctx;
    (void)ud;
    const fuzz_blob_t *b = obj;
    gser_msg_t *m = gser_writer_get_msg(w);
    gser_value_t *map, *v;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = b->data;
    d.nbytes = b->len;
    gser_status_t st;
    if ((st = gser_msg_new_map(m, &map)) || (st = gser_msg_new_int(m, b->n, &v)) ||
        (st = gser_map_put_cstr(map, "n", v)) || (st = gser_msg_new_buffer(m, &d, &v)) ||
        (st = gser_map_put_cstr(map, "data", v)))
        return st;
    return gser_writer_set_root(w, map);
}

static gser_status_t fuzz_blob_de(gser_context_t *ctx, gser_reader_t *r, void **out, void *ud)
{
    (void)ctx;
    (void)ud;
    gser_value_t *n, *data;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    gser_value_t *t = gser_reader_get_tree(r);
    fuzz_blob_t *b = calloc(1, sizeof *b);
    if (!b)
        return GSER_ERR_NO_MEMORY;
    if (gser_map_find_cstr(t, "n", &n) || gser_map_find_cstr(t, "data", &data) || gser_value_get_int(n, &b->n) ||
        gser_value_get_buffer(data, &d) || d.memory != GSER_MEMORY_HOST || d.strides) {
        free(b);
        return gser_reader_fail(r, GSER_ERR_FORMAT, "fuzz.blob needs n and a contiguous host data buffer");
    }
    b->len = d.nbytes;
    b->data = malloc(d.nbytes ? d.nbytes : 1);
    if (!b->data) {
        free(b);
        return GSER_ERR_NO_MEMORY;
    }
    if (d.nbytes)
        memcpy(b->data, d.data, d.nbytes);
    *out = b;
    return GSER_OK;
}

static void fuzz_blob_destroy(void *obj, void *ud)
{
    (void)ud;
    fuzz_blob_t *b = obj;
    free(b->data);
    free(b);
}

static gser_status_t fuzz_register(gser_context_t *ctx)
{
    gser_type_options_t to = GSER_TYPE_OPTIONS_INIT;
    to.destroy = fuzz_blob_destroy;
    gser_status_t st = gser_type_register(ctx, "fuzz.blob", 2, &to);
    return st ? st : gser_type_add_family(ctx, "fuzz.blob", "host", fuzz_blob_ser, fuzz_blob_de);
}

/* A context for a fuzz target: no trace, limits that keep one input quick,
 * fuzz.blob registered; backend NULL for the default one. Aborts if it
 * cannot be made. */
static inline gser_context_t *fuzz_context(const char *backend)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    o.device_backend = backend;
    static gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_nodes = 100000;
    lim.max_bytes = 1 << 24;
    o.limits = &lim;
    gser_context_t *ctx = NULL;
    if (gser_context_create(&o, &ctx) || fuzz_register(ctx))
        abort();
    return ctx;
}

/* The frames f flattened into a malloc'd buffer of *len bytes, or NULL when
 * gser_flat_size refuses them. What gser sized it must write: aborts if not. */
static inline unsigned char *fuzz_flatten(const gser_frames_t *f, size_t *len)
{
    size_t need, w = 0;
    if (gser_flat_size(gser_frames_get_array(f), gser_frames_get_count(f), &need) != GSER_OK)
        return NULL;
    unsigned char *buf = malloc(need ? need : 1);
    if (!buf || gser_flat_write(gser_frames_get_array(f), gser_frames_get_count(f), buf, need, &w) != GSER_OK)
        abort();
    *len = w;
    return buf;
}

#endif
