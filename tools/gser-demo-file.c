/* gser-demo-file: build a realistic control message, serialize it, write it to a
 * file in the flattened form, read it back and check that it round-trips.
 *
 *   gser-demo-file [--out FILE] [--n ELEMENTS]
 *
 * The message: a Dask-like task message with a 1,000,000-element float list,
 * a priority tuple, a nested map of worker addresses and a host buffer.
 * Inspect the file afterwards with `gser-inspect FILE`.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gser/gser.h>

#define CHECK(call)                                                                                          \
    do {                                                                                                     \
        gser_status_t st_ = (call);                                                                          \
        if (st_ != GSER_OK) {                                                                                \
            fprintf(stderr, "gser-demo-file: %s failed: %s: %s\n", #call, gser_status_str(st_),                  \
                    gser_context_get_last_error(ctx));                                                           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
    const char *out = "gser-demo-file.gser";
    size_t n = 1000000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc)
            n = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: gser-demo-file [--out FILE] [--n ELEMENTS]\n");
            return 2;
        }
    }

    gser_context_t *ctx;
    if (gser_context_create(NULL, &ctx) != GSER_OK)
        return 1;
    gser_msg_t *msg;
    CHECK(gser_msg_create(ctx, &msg));

    double t0 = now_ms();
    gser_value_t *root, *v, *prio, *who_has, *addrs, *nbytes, *data, *config, *retry;
    CHECK(gser_msg_new_map(msg, &root));
    CHECK(gser_msg_new_cstr(msg, "compute-task", &v));
    CHECK(gser_map_put_cstr(root, "op", v));
    CHECK(gser_msg_new_cstr(msg, "('sum-aggregate-5c1f', 17)", &v));
    CHECK(gser_map_put_cstr(root, "key", v));
    CHECK(gser_msg_new_tuple(msg, &prio));
    CHECK(gser_list_append_int(prio, 0));
    CHECK(gser_list_append_int(prio, 4));
    CHECK(gser_list_append_int(prio, -12));
    CHECK(gser_map_put_cstr(root, "priority", prio));
    CHECK(gser_msg_new_float(msg, 0.25, &v));
    CHECK(gser_map_put_cstr(root, "duration", v));
    CHECK(gser_msg_new_map(msg, &who_has));
    CHECK(gser_msg_new_map(msg, &nbytes));
    for (int i = 0; i < 3; i++) {
        char key[32], addr[48];
        snprintf(key, sizeof key, "('x-part', %d)", i);
        CHECK(gser_msg_new_list(msg, &addrs));
        for (int w = 0; w < 2; w++) {
            snprintf(addr, sizeof addr, "tcp://10.0.0.%d:%d", 1 + (i + w) % 4, 40000 + w);
            CHECK(gser_list_append_cstr(addrs, addr));
        }
        CHECK(gser_map_put_cstr(who_has, key, addrs));
        CHECK(gser_msg_new_int(msg, 8000000 + i, &v));
        CHECK(gser_map_put_cstr(nbytes, key, v));
    }
    CHECK(gser_map_put_cstr(root, "who_has", who_has));
    CHECK(gser_map_put_cstr(root, "nbytes", nbytes));

    CHECK(gser_msg_new_list(msg, &data));
    for (size_t i = 0; i < n; i++)
        CHECK(gser_list_append_float(data, 1.5));
    CHECK(gser_map_put_cstr(root, "data", data));

    /* A 64x64 int32 image, borrowed (zero-copy). */
    static int32_t image[64][64];
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 64; c++)
            image[r][c] = r * 64 + c;
    int64_t shape[2] = {64, 64};
    gser_buffer_desc_t desc = GSER_BUFFER_DESC_INIT;
    desc.data = image;
    desc.nbytes = sizeof image;
    desc.dtype = GSER_DTYPE_INT32;
    desc.ndim = 2;
    desc.shape = shape;
    CHECK(gser_msg_new_buffer(msg, &desc, &v));
    CHECK(gser_map_put_cstr(root, "image", v));

    CHECK(gser_msg_new_map(msg, &config));
    CHECK(gser_msg_new_map(msg, &retry));
    CHECK(gser_msg_new_int(msg, 3, &v));
    CHECK(gser_map_put_cstr(retry, "attempts", v));
    CHECK(gser_msg_new_bool(msg, true, &v));
    CHECK(gser_map_put_cstr(retry, "backoff", v));
    CHECK(gser_map_put_cstr(config, "retry", retry));
    CHECK(gser_msg_new_nil(msg, &v));
    CHECK(gser_map_put_cstr(config, "resources", v));
    CHECK(gser_map_put_cstr(root, "config", config));
    CHECK(gser_msg_set_root(msg, root));
    double t_build = now_ms() - t0;

    t0 = now_ms();
    gser_frames_t *frames;
    CHECK(gser_serialize(ctx, msg, NULL, &frames));
    double t_ser = now_ms() - t0;
    const gser_frame_t *fr = gser_frames_get_array(frames);
    size_t nf = gser_frames_get_count(frames);

    FILE *f = fopen(out, "wb");
    if (!f) {
        perror(out);
        return 2;
    }
    CHECK(gser_flat_write_file(fr, nf, f));
    if (fclose(f) != 0) {
        perror(out);
        return 2;
    }
    size_t flat;
    CHECK(gser_flat_size(fr, nf, &flat));

    /* Read it back and compare with what was sent. */
    f = fopen(out, "rb");
    if (!f) {
        perror(out);
        return 2;
    }
    t0 = now_ms();
    gser_msg_t *back;
    CHECK(gser_deserialize_fd(ctx, fileno(f), NULL, &back));
    double t_read = now_ms() - t0;
    fclose(f);
    bool same = gser_value_equal(gser_msg_get_root(msg), gser_msg_get_root(back));

    printf("gser-demo-file: built a control message with a %zu-element float list in %.2f ms\n", n, t_build);
    printf("  serialized in %.3f ms: header %zu bytes + %zu data frames\n", t_ser, fr[0].size, nf - 1);
    for (size_t i = 1; i < nf; i++)
        printf("    frame %zu: %zu bytes %s\n", i, fr[i].size, gser_memory_str(fr[i].memory));
    printf("  wrote %s (%zu bytes), read it back in %.3f ms: %s\n", out, flat, t_read,
           same ? "round trip verified" : "ROUND TRIP MISMATCH");

    gser_msg_destroy(back);
    gser_frames_destroy(frames);
    gser_msg_destroy(msg);
    gser_context_destroy(ctx);
    return same ? 0 : 1;
}
