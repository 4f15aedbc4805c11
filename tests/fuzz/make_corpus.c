/* Writes the seed corpus for fuzz_decode: a few flattened messages that
 * between them use every marker. Run from the repository root:
 *   build-fuzz/tests/fuzz/make_corpus tests/fuzz/corpus */
#include <stdio.h>

#include "fuzz_common.h"

#define CK(x)                                                                                                \
    do {                                                                                                     \
        if ((x) != GSER_OK) {                                                                                \
            fprintf(stderr, "%s: %s\n", #x, gser_context_last_error(ctx));                                  \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)

static int write_msg(gser_context_t *ctx, gser_msg_t *m, const char *dir, const char *name)
{
    gser_frames_t *f;
    CK(gser_serialize(ctx, m, NULL, &f));
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    if (!out)
        return 1;
    CK(gser_flat_write_file(gser_frames_array(f), gser_frames_count(f), out));
    fclose(out);
    gser_frames_destroy(f);
    return 0;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    gser_context_options_t o = {0};
    o.inline_max = 32;
    o.array_min = 4;
    gser_context_t *ctx;
    if (gser_context_create(&o, &ctx) || fuzz_register(ctx))
        return 1;
    gser_msg_t *m;
    gser_value_t *root, *v, *l, *t, *k;

    /* 1: scalars of every kind in a map with mixed keys */
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_map(m, &root));
    CK(gser_msg_new_cstr(m, "op", &k));
    CK(gser_msg_new_cstr(m, "compute", &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_new_int(m, -3, &k));
    CK(gser_msg_new_uint(m, 18446744073709551615ull, &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_new_float(m, 2.5, &k));
    CK(gser_msg_new_bool(m, true, &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_new_nil(m, &k));
    CK(gser_msg_new_bytes(m, "\x00\x01\x02", 3, &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_set_root(m, root));
    if (write_msg(ctx, m, dir, "scalars.gser"))
        return 1;
    gser_msg_destroy(m);

    /* 2: lists, tuples and arrays (inline and framed) */
    static const double dbl[64] = {1.5, 2.5, 3.5, 4.5};
    static const unsigned char bools[8] = {1, 0, 1, 1, 0, 0, 1, 0};
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_list(m, &root));
    CK(gser_msg_new_tuple(m, &t));
    CK(gser_list_append_int(t, 1));
    CK(gser_list_append_cstr(t, "two"));
    CK(gser_list_append(root, t));
    CK(gser_msg_new_array(m, GSER_KIND_FLOAT, dbl, 64, 0, &v));
    CK(gser_list_append(root, v));
    CK(gser_msg_new_array(m, GSER_KIND_BOOL, bools, 8, GSER_ARRAY_TUPLE, &v));
    CK(gser_list_append(root, v));
    CK(gser_msg_new_list(m, &l));
    for (int i = 0; i < 6; i++)
        CK(gser_list_append_uint(l, (uint64_t)i * 1000));
    CK(gser_list_append(root, l));
    CK(gser_msg_set_root(m, root));
    if (write_msg(ctx, m, dir, "lists.gser"))
        return 1;
    gser_msg_destroy(m);

    /* 3: buffers and a typed object */
    static int32_t grid[4][4];
    static unsigned char payload[48] = "fuzz blob payload";
    int64_t shape[2] = {4, 4};
    fuzz_blob_t blob = {7, sizeof payload, payload};
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_map(m, &root));
    gser_buffer_desc_t d = {0};
    d.data = grid;
    d.nbytes = sizeof grid;
    d.dtype = GSER_DTYPE_INT32;
    d.ndim = 2;
    d.shape = shape;
    CK(gser_msg_new_buffer(m, &d, &v));
    CK(gser_map_put_cstr(root, "grid", v));
    d.nbytes = 8;
    d.ndim = 0;
    CK(gser_msg_new_buffer(m, &d, &v));
    CK(gser_map_put_cstr(root, "small", v));
    CK(gser_msg_new_object(m, "fuzz.blob", &blob, &v));
    CK(gser_map_put_cstr(root, "obj", v));
    CK(gser_msg_set_root(m, root));
    if (write_msg(ctx, m, dir, "objects.gser"))
        return 1;
    gser_msg_destroy(m);
    gser_context_destroy(ctx);
    return 0;
}
