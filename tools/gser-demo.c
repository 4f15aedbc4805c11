/* gser-demo: move a dataframe from one worker to another, the main job.
 *
 *   gser-demo [--rows N] [--cols C] [--iters K] [--family device|host]
 *             [--memory auto|device|host] [--role both|send|recv] [--host ADDR]
 *             [--port P] [--save FILE]
 *
 * A receiver and a sender (two processes; --role both forks them on
 * 127.0.0.1) connect over UCX. The sender builds a synthetic table of C
 * columns (int64, float64 with nulls, utf8 strings, list<int32>, in turn) and
 * N rows, on the GPU when one is present and in host memory otherwise, and
 * ships it K times as an Arrow C Device Data table inside a gser message with
 * (--memory device puts it in device memory with any device backend, e.g.
 * GSER_DEVICE=emulated, so the device path runs without a GPU)
 * the column checksums. The receiver rebuilds the table, recomputes every
 * checksum, and only then answers with its verdict and how long checking
 * took; the sender prints each transfer's time without that check (and GB/s
 * over the transfer alone) and the check's time on its own. Exit status 0
 * only if every column of every transfer verified. Across two nodes: run --role recv
 * --port P on one and --role send --host ADDR --port P on the other.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gser/arrow.h>
#include <gser/gser.h>
#include <gser/ucx.h>

#include "demo_table.h"

#define TIMEOUT_MS 60000

typedef struct opts {
    int64_t rows;
    int cols;
    int iters;
    const char *family;
    const char *memory;
    const char *role;
    const char *host;
    unsigned port;
    const char *save;
} opts_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- the two roles ---------------------------------------------------------------- */

static int run_receiver(const opts_t *o, int port_pipe)
{
    who = "gser-demo receiver";
    gser_context_t *ctx = make_ctx();
    gser_ucx_context_t *uc;
    gser_ucx_worker_t *w;
    make_worker(ctx, &uc, &w);
    gser_ucx_listener_options_t lo = GSER_UCX_LISTENER_OPTIONS_INIT;
    lo.address = o->host;
    lo.port = (uint16_t)o->port;
    gser_ucx_listener_t *l;
    CKU(gser_ucx_listener_create(w, &lo, &l));
    uint16_t port = gser_ucx_listener_get_port(l);
    if (port_pipe >= 0) {
        if (write(port_pipe, &port, sizeof port) != sizeof port)
            die("write", GSER_ERR_IO, strerror(errno));
        close(port_pipe);
    } else {
        printf("%s: listening on %s:%u\n", who, o->host ? o->host : "*", port);
        fflush(stdout);
    }
    gser_ucx_ep_t *ep;
    ep = accept_peer(l, TIMEOUT_MS);
    int failures = 0, iters = 0;
    for (;;) {
        gser_msg_t *msg;
        gser_status_t st = gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &msg);
        if (st != GSER_OK)
            die("gser_ucx_ep_recv_msg", st, *gser_ucx_get_last_error() ? gser_ucx_get_last_error() : gser_context_get_last_error(ctx));
        gser_value_t *root = gser_msg_get_root(msg), *v, *sums, *table;
        const char *op;
        CK(ctx, gser_map_find_cstr(root, "op", &v));
        CK(ctx, gser_value_get_str(v, &op, NULL));
        bool done = !strcmp(op, "done");
        struct ArrowDeviceArray da;
        struct ArrowSchema schema;
        int bad = 0;
        double verify_s = 0;
        if (!done) {
            /* Take the table, then check every column against the sender's
             * checksums -- before answering, so that the sender's clock
             * stops only once the table is known to be right. */
            CK(ctx, gser_map_find_cstr(root, "table", &table));
            CK(ctx, gser_arrow_take_value(table, NULL, &da, &schema));
            double t = now_s();
            bool device = da.device_type == ARROW_DEVICE_CUDA;
            gser_kind_t k;
            const void *expect;
            size_t n;
            CK(ctx, gser_map_find_cstr(root, "checksums", &sums));
            CK(ctx, gser_list_get_array(sums, &k, &expect, &n));
            bad = (int64_t)n != da.array.n_children;
            for (int64_t c = 0; !bad && c < da.array.n_children; c++)
                if (column_checksum(ctx, device, da.array.children[c], schema.children[c]->format) !=
                    ((const uint64_t *)expect)[c]) {
                    fprintf(stderr, "%s: transfer %d: column %" PRId64 " (%s) differs\n", who, iters + 1, c,
                            schema.children[c]->name);
                    bad++;
                }
            verify_s = now_s() - t;
            failures += bad != 0;
            iters++;
        }
        /* The answer: this table's verdict and how long checking it took
         * (the sender leaves that out of the transfer time); to "done", the
         * totals. */
        gser_msg_t *ack;
        gser_value_t *aroot;
        CK(ctx, gser_msg_create(ctx, &ack));
        CK(ctx, gser_msg_new_map(ack, &aroot));
        CK(ctx, gser_msg_new_int(ack, done ? iters - failures : !bad, &v));
        CK(ctx, gser_map_put_cstr(aroot, "verified", v));
        CK(ctx, gser_msg_new_int(ack, done ? failures : bad != 0, &v));
        CK(ctx, gser_map_put_cstr(aroot, "failed", v));
        CK(ctx, gser_msg_new_float(ack, verify_s, &v));
        CK(ctx, gser_map_put_cstr(aroot, "verify_s", v));
        CK(ctx, gser_msg_set_root(ack, aroot));
        CKU(gser_ucx_ep_send_msg(ep, ctx, ack, NULL, TIMEOUT_MS));
        gser_msg_destroy(ack);
        if (!done) {
            da.array.release(&da.array);
            schema.release(&schema);
        }
        gser_msg_destroy(msg);
        if (done)
            break;
    }
    printf("%s: %d transfers received, %d verified, %d failed\n", who, iters, iters - failures, failures);
    gser_ucx_ep_destroy(ep);
    gser_ucx_listener_destroy(l);
    gser_ucx_worker_destroy(w);
    gser_ucx_context_destroy(uc);
    gser_context_destroy(ctx);
    return failures ? 1 : 0;
}

static int run_sender(const opts_t *o, const char *host, unsigned port)
{
    who = "gser-demo sender";
    gser_context_t *ctx = make_ctx();
    bool device = !strcmp(o->memory, "device") ||
                  (!strcmp(o->memory, "auto") && gser_context_has_device(ctx) && !strcmp(gser_context_get_device_backend(ctx), "cuda"));
    if (device && !gser_context_has_device(ctx))
        die("--memory device", GSER_ERR_NO_DEVICE, "no device backend (set GSER_DEVICE=cuda or emulated)");
    gser_ucx_context_t *uc;
    gser_ucx_worker_t *w;
    make_worker(ctx, &uc, &w);
    gser_ucx_ep_t *ep;
    CKU(gser_ucx_ep_connect(w, host, (uint16_t)port, TIMEOUT_MS, &ep));
    gser_ucx_peer_info_t peer = GSER_UCX_PEER_INFO_INIT;
    CKU(gser_ucx_ep_get_peer_info(ep, &peer));

    double t0 = now_s();
    struct ArrowDeviceArray da;
    struct ArrowSchema schema;
    make_table(ctx, device, o->rows, o->cols, &da, &schema);
    uint64_t *sums = malloc((size_t)o->cols * 8);
    for (int c = 0; c < o->cols; c++)
        sums[c] = column_checksum(ctx, device, da.array.children[c], schema.children[c]->format);
    double t_build = now_s() - t0;

    gser_msg_t *msg;
    gser_value_t *root, *v;
    CK(ctx, gser_msg_create(ctx, &msg));
    CK(ctx, gser_msg_new_map(msg, &root));
    CK(ctx, gser_msg_new_cstr(msg, "table", &v));
    CK(ctx, gser_map_put_cstr(root, "op", v));
    CK(ctx, gser_msg_new_array(msg, GSER_KIND_UINT, sums, (size_t)o->cols, 0, &v));
    CK(ctx, gser_map_put_cstr(root, "checksums", v));
    CK(ctx, gser_arrow_new_value(msg, &da, &schema, NULL, &v));
    CK(ctx, gser_map_put_cstr(root, "table", v));
    CK(ctx, gser_msg_set_root(msg, root));
    const char *families[2] = {o->family, NULL};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = families;
    so.nfamilies = 1;

    gser_frames_t *frames;
    CK(ctx, gser_serialize(ctx, msg, &so, &frames));
    CK(ctx, gser_frames_wait(frames));
    const gser_frame_t *fr = gser_frames_get_array(frames);
    size_t nf = gser_frames_get_count(frames), bytes = 0, dev_frames = 0;
    for (size_t i = 0; i < nf; i++) {
        bytes += fr[i].size;
        dev_frames += fr[i].memory == GSER_MEMORY_DEVICE;
    }
    const char *path = dev_frames == 0                        ? "host memory (host family)"
                       : (peer.caps & GSER_UCX_CAP_CUDA) != 0 ? "device direct (UCX reads CUDA memory)"
                                                              : "device, staged through pinned host buffers";
    printf("%s: table %" PRId64 " rows x %d columns (", who, o->rows, o->cols);
    for (int k = 0; k < COL_KINDS && k < o->cols; k++)
        printf("%s%s", k ? ", " : "", col_kind_name[k]);
    printf(") in %s memory, built in %.1f ms\n", device ? (strcmp(gser_context_get_device_backend(ctx), "cuda") ? "emulated device" : "GPU") : "host", t_build * 1e3);
    printf("%s: one message = header %zu bytes + %zu data frames, %.2f MB in all; path: %s\n", who, fr[0].size,
           nf - 1, bytes / 1e6, path);
    if (o->save) {
        FILE *f = fopen(o->save, "wb");
        if (!f || gser_flat_write_file(fr, nf, f) != GSER_OK || fclose(f) != 0)
            fprintf(stderr, "%s: cannot save %s (device frames are not flattened; use --family host)\n", who,
                    o->save);
        else
            printf("%s: saved one message to %s (look inside: gser-inspect %s)\n", who, o->save, o->save);
    }

    /* Each transfer: send, then wait for the receiver's answer, which comes
     * once it has the table, deserialized, taken and verified. The transfer
     * time is that round trip less the receiver's verification time, which
     * is printed on its own; GB/s are over the transfer alone. */
    double total = 0, best = 1e30, verify_total = 0, last_progress = now_s();
    int64_t failed_transfers = 0;
    for (int i = 0; i < o->iters; i++) {
        double t = now_s();
        CKU(gser_ucx_ep_send(ep, fr, nf, TIMEOUT_MS));
        gser_msg_t *ack;
        CKU(gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &ack));
        t = now_s() - t;
        int64_t failed = 1;
        double verify_s = 0;
        gser_value_t *fv;
        if (gser_map_find_cstr(gser_msg_get_root(ack), "failed", &fv) == GSER_OK)
            gser_value_get_int(fv, &failed);
        if (gser_map_find_cstr(gser_msg_get_root(ack), "verify_s", &fv) == GSER_OK)
            gser_value_get_float(fv, &verify_s);
        gser_msg_destroy(ack);
        failed_transfers += failed != 0;
        if (verify_s > 0 && verify_s < t)
            t -= verify_s;
        total += t;
        verify_total += verify_s;
        best = t < best ? t : best;
        if (o->iters <= 10 || now_s() - last_progress > 1.0 || i + 1 == o->iters) {
            printf("%s: transfer %d/%d: %.2f ms, %.2f GB/s; receiver's verification %.2f ms (not counted)%s\n",
                   who, i + 1, o->iters, t * 1e3, bytes / t / 1e9, verify_s * 1e3,
                   failed ? "; this table FAILED verification" : "");
            last_progress = now_s();
        }
    }
    gser_frames_destroy(frames);
    gser_msg_destroy(msg);
    da.array.release(&da.array);
    schema.release(&schema);
    free(sums);

    /* Tell the receiver we are done. */
    CK(ctx, gser_msg_create(ctx, &msg));
    CK(ctx, gser_msg_new_map(msg, &root));
    CK(ctx, gser_msg_new_cstr(msg, "done", &v));
    CK(ctx, gser_map_put_cstr(root, "op", v));
    CK(ctx, gser_msg_set_root(msg, root));
    CKU(gser_ucx_ep_send_msg(ep, ctx, msg, NULL, TIMEOUT_MS));
    gser_msg_destroy(msg);
    gser_msg_t *verdict;
    CKU(gser_ucx_ep_recv_msg(ep, ctx, NULL, TIMEOUT_MS, &verdict));
    int64_t verified = 0, failures = 0;
    gser_value_t *vv;
    if (gser_map_find_cstr(gser_msg_get_root(verdict), "verified", &vv) == GSER_OK)
        gser_value_get_int(vv, &verified);
    if (gser_map_find_cstr(gser_msg_get_root(verdict), "failed", &vv) == GSER_OK)
        gser_value_get_int(vv, &failures);
    gser_msg_destroy(verdict);
    if (verified + failures != o->iters || failed_transfers != failures)
        failures++;

    printf("%s: %d transfers of %.2f MB: %.2f GB/s overall, best %.2f GB/s (the transfer alone: send until "
           "the receiver has the table taken)\n",
           who, o->iters, bytes / 1e6, o->iters * bytes / total / 1e9, bytes / best / 1e9);
    printf("%s: receiver's verification by checksum: %.2f ms a table on average, outside the times above\n", who,
           verify_total / o->iters * 1e3);
    printf("%s: receiver verified %" PRId64 " of %d transfers by checksum, every column: %s\n", who, verified,
           o->iters, failures ? "VERIFICATION FAILED" : "all correct");
    gser_ucx_ep_destroy(ep);
    gser_ucx_worker_destroy(w);
    gser_ucx_context_destroy(uc);
    gser_context_destroy(ctx);
    return failures ? 1 : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: gser-demo [--rows N] [--cols C] [--iters K] [--family device|host]\n"
                    "                 [--memory auto|device|host] [--role both|send|recv] [--host ADDR]\n"
                    "                 [--port P] [--save FILE]\n");
    return 2;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* two processes print: keep lines whole and in order */
    who = "gser-demo";
    opts_t o = {.rows = 1000000, .cols = 8, .iters = 20, .family = "device", .memory = "auto", .role = "both"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        }
        if (!val)
            return usage();
        if (!strcmp(a, "--rows"))
            o.rows = strtoll(val, NULL, 10);
        else if (!strcmp(a, "--cols"))
            o.cols = atoi(val);
        else if (!strcmp(a, "--iters"))
            o.iters = atoi(val);
        else if (!strcmp(a, "--family"))
            o.family = val;
        else if (!strcmp(a, "--memory"))
            o.memory = val;
        else if (!strcmp(a, "--role"))
            o.role = val;
        else if (!strcmp(a, "--host"))
            o.host = val;
        else if (!strcmp(a, "--port"))
            o.port = (unsigned)atoi(val);
        else if (!strcmp(a, "--save"))
            o.save = val;
        else
            return usage();
        i++;
    }
    if (o.rows < 0 || o.rows > INT32_MAX / 64 || o.cols < 1 || o.cols > 4096 || o.iters < 1 ||
        (strcmp(o.family, "device") && strcmp(o.family, "host")) ||
        (strcmp(o.memory, "auto") && strcmp(o.memory, "device") && strcmp(o.memory, "host")))
        return usage();
    if (!strcmp(o.role, "recv"))
        return run_receiver(&o, -1);
    if (!strcmp(o.role, "send")) {
        if (!o.host || !o.port)
            return usage();
        return run_sender(&o, o.host, o.port);
    }
    if (strcmp(o.role, "both"))
        return usage();

    /* Both on this machine: the receiver in a child process, on loopback. */
    o.host = "127.0.0.1";
    int p[2];
    if (pipe(p) != 0)
        die("pipe", GSER_ERR_IO, strerror(errno));
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork", GSER_ERR_IO, strerror(errno));
    if (child == 0) {
        close(p[0]);
        int rc = run_receiver(&o, p[1]);
        fflush(stdout);
        _exit(rc);
    }
    close(p[1]);
    uint16_t port = 0;
    ssize_t got = read(p[0], &port, sizeof port);
    close(p[0]);
    if (got != sizeof port) {
        waitpid(child, NULL, 0);
        die("the receiver did not start", GSER_ERR_CONNECTION, NULL);
    }
    printf("gser-demo: receiver (pid %d) listening on 127.0.0.1:%u\n", (int)child, port);
    int rc = run_sender(&o, o.host, port);
    int status = 0;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        rc = 1;
    printf("gser-demo: %s\n", rc == 0 ? "OK" : "FAILED");
    return rc;
}
