/* gser-bench-arrow: a dataframe between two processes over UCX, gser's packed
 * message against the per-buffer way, in the same run.
 *
 *   gser-bench-arrow [--json] [--quick] [--memory auto|device|host]
 *
 * Tables of ~1 GiB (--quick: ~32 MiB) with 512 and with 8 columns (int64,
 * float64 with nulls, utf8, list<int32> in turn). gser: the table is one
 * message (serialize + send, the receiver rebuilds the ArrowDeviceArray).
 * Per-buffer (what cuDF plus Dask's UCX comm do): every buffer of every
 * column is its own message with one frame, one send each and one receive
 * allocation each. Both measured from the first send to the receiver's
 * answer after the last byte; median of repetitions. Device tables (a GPU,
 * or --memory device with GSER_DEVICE=emulated) use the device family
 * (staged through pinned buffers with Debian's UCX); host tables the host
 * family.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gser/arrow.h>
#include <gser/gser.h>
#include <gser/ucx.h>

#include "../tools/demo_table.h"
#include "bench_util.h"

#define TIMEOUT_MS 120000

static const char *op_of(gser_context_t *ctx, gser_msg_t *m, int64_t *n)
{
    gser_value_t *v;
    const char *op;
    CK(ctx, gser_map_find_cstr(gser_msg_get_root(m), "op", &v));
    CK(ctx, gser_value_get_str(v, &op, NULL));
    if (n && gser_map_find_cstr(gser_msg_get_root(m), "n", &v) == GSER_OK)
        gser_value_get_int(v, n);
    return op;
}

static void send_op(gser_context_t *ctx, gser_ucx_ep_t *ep, const char *op, int64_t n)
{
    gser_msg_t *m;
    gser_value_t *root, *v;
    CK(ctx, gser_msg_create(ctx, &m));
    CK(ctx, gser_msg_new_map(m, &root));
    CK(ctx, gser_msg_new_cstr(m, op, &v));
    CK(ctx, gser_map_put_cstr(root, "op", v));
    CK(ctx, gser_msg_new_int(m, n, &v));
    CK(ctx, gser_map_put_cstr(root, "n", v));
    CK(ctx, gser_msg_set_root(m, root));
    CKU(gser_ucx_ep_send_msg(ep, ctx, m, NULL, TIMEOUT_MS));
    gser_msg_destroy(m);
}

/* The receiver: a table message is rebuilt and released; "bufs" n is followed
 * by n one-buffer messages; each answered with "ack" after the last byte. */
static int receiver(int port_pipe)
{
    who = "gser-bench-arrow receiver";
    gser_context_t *ctx = make_ctx();
    gser_ucx_context_t *uc;
    gser_ucx_worker_t *w;
    make_worker(ctx, &uc, &w);
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = "127.0.0.1";
    gser_ucx_listener_t *l;
    CKU(gser_ucx_listener_create(w, &lo, &l));
    uint16_t port = gser_ucx_listener_get_port(l);
    if (write(port_pipe, &port, sizeof port) != sizeof port)
        die("write", GSER_ERR_IO, strerror(errno));
    close(port_pipe);
    gser_ucx_ep_t *ep;
    ep = accept_peer(l, TIMEOUT_MS);
    for (;;) {
        gser_msg_t *m;
        double tr = bench_now_us();
        CKU(gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &m));
        if (getenv("GSER_BENCH_PHASES"))
            fprintf(stderr, "receiver: recv_msg returned after %.1f ms\n", (bench_now_us() - tr) / 1e3);
        int64_t n = 0;
        const char *op = op_of(ctx, m, &n);
        if (!strcmp(op, "done")) {
            gser_msg_destroy(m);
            break;
        }
        if (!strcmp(op, "table")) {
            gser_value_t *t;
            struct ArrowDeviceArray da;
            struct ArrowSchema schema;
            CK(ctx, gser_map_find_cstr(gser_msg_get_root(m), "table", &t));
            double t0 = bench_now_us();
            CK(ctx, gser_arrow_take_value(t, NULL, &da, &schema));
            da.array.release(&da.array);
            schema.release(&schema);
            if (getenv("GSER_BENCH_PHASES"))
                fprintf(stderr, "receiver: take + release %.1f ms\n", (bench_now_us() - t0) / 1e3);
        } else { /* "bufs": n messages of one buffer each follow, all kept
                  * until the last arrived, as a receiver rebuilding the table
                  * must (cuDF's deserialize needs every frame) */
            gser_msg_t **kept = calloc((size_t)n, sizeof *kept);
            if (!kept)
                die("calloc", GSER_ERR_NO_MEMORY, NULL);
            for (int64_t i = 0; i < n; i++)
                CKU(gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &kept[i]));
            for (int64_t i = 0; i < n; i++)
                gser_msg_destroy(kept[i]);
            free(kept);
        }
        gser_msg_destroy(m);
        send_op(ctx, ep, "ack", 0);
    }
    gser_ucx_ep_destroy(ep);
    gser_ucx_listener_destroy(l);
    gser_ucx_worker_destroy(w);
    gser_ucx_context_destroy(uc);
    gser_context_destroy(ctx);
    return 0;
}

/* Every buffer of the table, with its size, for the per-buffer way. */
typedef struct buf {
    const void *p;
    size_t n;
} buf_t;

static void add(buf_t **v, size_t *nv, const void *p, size_t n)
{
    if (!p || !n)
        return;
    *v = realloc(*v, (*nv + 1) * sizeof **v);
    (*v)[(*nv)++] = (buf_t){p, n};
}

static void table_buffers(gser_context_t *ctx, bool device, const struct ArrowDeviceArray *da,
                          const struct ArrowSchema *schema, buf_t **v, size_t *nv)
{
    for (int64_t c = 0; c < da->array.n_children; c++) {
        const struct ArrowArray *a = da->array.children[c];
        const char *f = schema->children[c]->format;
        int64_t rows = a->length;
        add(v, nv, a->buffers[0], (size_t)(rows + 7) / 8);
        if (!strcmp(f, "l") || !strcmp(f, "g")) {
            add(v, nv, a->buffers[1], (size_t)rows * 8);
            continue;
        }
        add(v, nv, a->buffers[1], (size_t)(rows + 1) * 4);
        int32_t last;
        CK(ctx, gser_device_memcpy(ctx, &last, GSER_MEMORY_HOST, (const int32_t *)a->buffers[1] + rows,
                                   device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST, 4, NULL));
        if (device)
            CK(ctx, gser_stream_wait(ctx, NULL));
        if (!strcmp(f, "u"))
            add(v, nv, a->buffers[2], (size_t)last);
        else
            add(v, nv, a->children[0]->buffers[1], (size_t)last * 4);
    }
}

static double sender_case(int cols, int64_t rows, bool device, bool json, int reps)
{
    int p[2];
    if (pipe(p) != 0)
        die("pipe", GSER_ERR_IO, strerror(errno));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        close(p[0]);
        int rc = receiver(p[1]);
        fflush(stdout);
        _exit(rc);
    }
    close(p[1]);
    uint16_t port = 0;
    if (read(p[0], &port, sizeof port) != sizeof port)
        die("the receiver did not start", GSER_ERR_CONNECTION, NULL);
    close(p[0]);

    who = "gser-bench-arrow";
    gser_context_t *ctx = make_ctx();
    gser_ucx_context_t *uc;
    gser_ucx_worker_t *w;
    make_worker(ctx, &uc, &w);
    gser_ucx_ep_t *ep;
    CKU(gser_ucx_ep_connect(w, "127.0.0.1", port, TIMEOUT_MS, &ep));
    struct ArrowDeviceArray da;
    struct ArrowSchema schema;
    make_table(ctx, device, rows, cols, &da, &schema);
    buf_t *bufs = NULL;
    size_t nbufs = 0, bytes = 0;
    table_buffers(ctx, device, &da, &schema, &bufs, &nbufs);
    for (size_t i = 0; i < nbufs; i++)
        bytes += bufs[i].n;
    const char *family[] = {device ? "device" : "host"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = family;
    so.nfamilies = 1;

    double *tg = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
    size_t frames_per_msg = 0;
    for (int r = -1; r < reps; r++) { /* one warm-up round */
        /* gser: the whole table is one message */
        double t0 = bench_now_us();
        gser_msg_t *m;
        gser_value_t *root, *v;
        CK(ctx, gser_msg_create(ctx, &m));
        CK(ctx, gser_msg_new_map(m, &root));
        CK(ctx, gser_msg_new_cstr(m, "table", &v));
        CK(ctx, gser_map_put_cstr(root, "op", v));
        CK(ctx, gser_arrow_new_value(m, &da, &schema, NULL, &v));
        CK(ctx, gser_map_put_cstr(root, "table", v));
        CK(ctx, gser_msg_set_root(m, root));
        gser_frames_t *f;
        CK(ctx, gser_serialize(ctx, m, &so, &f));
        CK(ctx, gser_frames_wait(f));
        frames_per_msg = gser_frames_get_count(f);
        double t_ser = bench_now_us() - t0;
        CKU(gser_ucx_ep_send(ep, gser_frames_get_array(f), gser_frames_get_count(f), TIMEOUT_MS));
        double t_send = bench_now_us() - t0;
        gser_msg_t *ack;
        CKU(gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &ack));
        double t = bench_now_us() - t0;
        if (getenv("GSER_BENCH_PHASES"))
            fprintf(stderr, "gser: serialize %.1f ms, send done %.1f ms, acked %.1f ms\n", t_ser / 1e3, t_send / 1e3,
                    t / 1e3);
        gser_msg_destroy(ack);
        gser_frames_destroy(f);
        gser_msg_destroy(m);
        if (r >= 0)
            tg[r] = t;

        /* per buffer: one message, one frame, one send for each buffer */
        t0 = bench_now_us();
        send_op(ctx, ep, "bufs", (int64_t)nbufs);
        for (size_t i = 0; i < nbufs; i++) {
            gser_msg_t *bm;
            gser_value_t *bv;
            gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
            d.data = bufs[i].p;
            d.nbytes = bufs[i].n;
            d.memory = device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST;
            CK(ctx, gser_msg_create(ctx, &bm));
            CK(ctx, gser_msg_new_buffer(bm, &d, &bv));
            CK(ctx, gser_msg_set_root(bm, bv));
            gser_serialize_options_t one = so;
            one.pack_max = 1; /* a frame of its own, never packed */
            one.inline_max = 1;
            CKU(gser_ucx_ep_send_msg(ep, ctx, bm, &one, TIMEOUT_MS));
            gser_msg_destroy(bm);
        }
        CKU(gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &ack));
        t = bench_now_us() - t0;
        gser_msg_destroy(ack);
        if (r >= 0)
            tb[r] = t;
    }
    send_op(ctx, ep, "done", 0);
    qsort(tg, (size_t)reps, sizeof(double), bench_cmp_double);
    qsort(tb, (size_t)reps, sizeof(double), bench_cmp_double);
    double g = tg[reps / 2] / 1e3, b = tb[reps / 2] / 1e3;
    char name[64], note[200];
    snprintf(name, sizeof name, "arrow_%dcol_%s", cols, device ? "device" : "host");
    snprintf(note, sizeof note, "%.0f MB, %zu buffers: gser %.2f GB/s in %zu frames, per-buffer %.2f GB/s; speedup %.2fx",
             bytes / 1e6, nbufs, bytes / (g * 1e6), frames_per_msg - 1, bytes / (b * 1e6), b / g);
    bench_result_t res = {name, g, "ms", "per-buffer messages (ms)", b, cols >= 512 ? "<= 0.5" : "<= 1", note};
    bench_print(&res, json);

    free(tg);
    free(tb);
    free(bufs);
    da.array.release(&da.array);
    schema.release(&schema);
    gser_ucx_ep_destroy(ep);
    gser_ucx_worker_destroy(w);
    gser_ucx_context_destroy(uc);
    gser_context_destroy(ctx);
    int status;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the receiver failed", GSER_ERR_CONNECTION, NULL);
    return b / g;
}

int main(int argc, char **argv)
{
    bool json = false, quick = false;
    const char *memory = "auto";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--memory") && i + 1 < argc)
            memory = argv[++i];
        else {
            fprintf(stderr, "usage: gser-bench-arrow [--json] [--quick] [--memory auto|device|host]\n");
            return 2;
        }
    }
    who = "gser-bench-arrow";
    gser_context_t *probe = make_ctx();
    bool device = !strcmp(memory, "device") ||
                  (!strcmp(memory, "auto") && !strcmp(gser_context_get_device_backend(probe), "cuda"));
    gser_context_destroy(probe);
    /* ~12 bytes per row and column on average for these four kinds */
    const double target = quick ? 32e6 : 1.07e9;
    const int reps = quick ? 1 : 3;
    if (!json)
        printf("%-22s %12s %-4s  %-34s %12s  %-15s %s\n", "case", "value", "unit", "anchor", "anchor", "ratio",
               "target");
    sender_case(512, (int64_t)(target / (512 * 12.0)), device, json, reps);
    sender_case(8, (int64_t)(target / (8 * 12.0)), device, json, reps);
    return 0;
}
