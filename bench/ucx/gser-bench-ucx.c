/* gser-bench-ucx: gser's UCX transport against ucx_perftest on the same
 * transport, both measured in the same run, between two processes on
 * 127.0.0.1.
 *
 *   gser-bench-ucx [--json] [--quick] [--transport tcp|shm|all] [--device BACKEND] [--only lat|bw|link|zchunk]
 *                  [--perftest PATH] [--peer-netns NS --address ADDR --net-device DEV]
 *
 * For each transport (tcp: UCX_TLS=tcp; shm: UCX_TLS=posix,sysv,cma,self,tcp,
 * where tcp only sets connections up), with UCX_NET_DEVICES=lo:
 *
 *   ucx_<tl>_lat_8B     one-way latency of a small message (an 8-byte
 *                       payload): serialize, send, receive, deserialize, and
 *                       the same back; half the median round trip, vs
 *                       ucx_perftest tag_lat 8 B (its median)
 *   ucx_<tl>_lat_8B_frames  the same message serialized once; its frames
 *                       sent, received and sent back as received: the
 *                       transport's own part of the row above (no target:
 *                       it shows where the time goes)
 *   ucx_<tl>_lat_8B_floor   the same message between two programs that use
 *                       msgpack-c and plain UCX and nothing else, written for
 *                       speed (probe, receive, unpack; pack, send; buffers
 *                       reused), vs ucx_perftest (no target)
 *   ucx_<tl>_lat_8B_vs_floor  ucx_<tl>_lat_8B against that floor (no target)
 *   ucx_shm_cpu_8B, ucx_shm_cpu_8B_frames   the two round trips above with
 *                       both ends in this process, one thread driving both
 *                       (ns per round trip), vs the same between two plain
 *                       UCX workers: the CPU work alone, without the
 *                       transfers between cores (no target)
 *   ucx_<tl>_bw_<size>  bandwidth of a stream of messages with one frame of
 *                       <size> bytes (64 KiB, 4 MiB, 64 MiB), serialized and
 *                       deserialized each, vs ucx_perftest tag_bw <size>
 *   ucx_<tl>_rate_8B    the same with 8-byte messages: messages per second
 *   ucx_shm_bw_256MiB, ucx_shm_bw_1GiB   the same at 256 MiB and 1 GiB over
 *                       shared memory, vs ucx_perftest tag_bw; and
 *   ucx_shm_1node_256MiB, _1GiB   the same bandwidth vs one memcpy of the
 *                       same size in the same run (the limit of a one-copy
 *                       path), with ucx_perftest without peer error handling
 *                       (the one lane set with cma's one-copy get) in the note
 *
 * ucx_perftest runs with -e (peer error handling, which gser's endpoints use
 * so that a dead peer fails what is pending) and the same UCX environment, so
 * both use the same UCX lanes. With --device (default: "cuda" when a GPU is
 * there), ucx_<tl>_device_1g sends 1 GiB of device frames through the
 * staging path to a receiver with device memory, vs the slower of the pinned
 * device-to-host copy and the host transport (64 MiB) measured in this run.
 *
 * Between two nodes (bench/python/bench_links.py runs it so): --peer-netns NS
 * runs the serving side (gser's, the floor's, ucx_perftest's server) in the
 * network namespace NS (ip netns exec), listening on --address ADDR, which
 * this side connects to; --net-device DEV is UCX_NET_DEVICES on both sides
 * (default lo). --only link prints one row:
 *
 *   ucx_<tl>_link_256MiB  a stream of 256 MiB messages one way, best of 3
 *                       rounds, vs ucx_perftest tag_bw 256 MiB (best of its
 *                       rounds, alternating), which runs on UCX's own
 *                       settings: the row shows what gser's defaults for
 *                       UCX give a user who sets none
 *
 * --only zchunk prints one row, tcp only (with --peer-netns, over the link):
 *
 *   ucx_tcp_lz4_chunks_64MiB  64 MiB of sorted keys with lz4 forced, sent
 *                       with gser_ucx_ep_send_msg in compressed chunks
 *                       pipelined with the sending (docs/ucx.md 4.6) vs
 *                       the same compressed whole (chunked_min = SIZE_MAX),
 *                       medians of 5, alternating
 *
 * --quick: small counts, to check that it runs; its numbers mean nothing.
 * The child role (--serve) is internal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <msgpack.h>
#include <ucp/api/ucp.h>

#include <gser/device.h>
#include <gser/gser.h>
#include <gser/ucx.h>

#include "../bench_util.h"

#define WAIT_MS 60000

static gser_context_t *g_ctx;

#define CK(x)                                                                                                \
    do {                                                                                                     \
        gser_status_t st_ = (x);                                                                             \
        if (st_ != GSER_OK) {                                                                                \
            fprintf(stderr, "%s:%d: %s: %s | %s\n", __FILE__, __LINE__, gser_status_str(st_),               \
                    gser_ucx_get_last_error(), g_ctx ? gser_context_get_last_error(g_ctx) : "");                    \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static const char *g_self;
/* Where the serving side runs and listens (--peer-netns, --address). */
static const char *g_address = "127.0.0.1";
static const char *g_netns;
static const char *g_netdev = "lo";
#define ADDRESS_ENV "GSER_BENCH_UCX_ADDRESS"

/* The parent waits for ucx_perftest between its own measurements, for
 * seconds, without driving its worker: no peer timeout on either side. */
static const gser_ucx_context_options_t g_ucx_opts = {.size = sizeof(gser_ucx_context_options_t),
                                                      .peer_timeout_ms = GSER_UCX_PEER_TIMEOUT_NONE};

/* ---- small gser messages for control ---------------------------------------------- */

typedef struct cmd {
    char op[16];
    uint64_t n, size;
} cmd_t;

static void send_cmd(gser_ucx_ep_t *ep, const char *op, uint64_t n, uint64_t size)
{
    gser_msg_t *m;
    gser_value_t *root, *v;
    CK(gser_msg_create(g_ctx, &m));
    CK(gser_msg_new_map(m, &root));
    CK(gser_msg_new_cstr(m, op, &v));
    CK(gser_map_put_cstr(root, "op", v));
    CK(gser_msg_new_uint(m, n, &v));
    CK(gser_map_put_cstr(root, "n", v));
    CK(gser_msg_new_uint(m, size, &v));
    CK(gser_map_put_cstr(root, "size", v));
    CK(gser_msg_set_root(m, root));
    CK(gser_ucx_ep_send_msg(ep, g_ctx, m, NULL, WAIT_MS));
    gser_msg_destroy(m);
}

static void recv_cmd(gser_ucx_ep_t *ep, cmd_t *c)
{
    gser_msg_t *m;
    gser_value_t *v;
    const char *s;
    CK(gser_ucx_ep_recv_msg(ep, g_ctx, NULL, WAIT_MS, &m));
    memset(c, 0, sizeof *c);
    CK(gser_map_find_cstr(gser_msg_get_root(m), "op", &v));
    CK(gser_value_get_str(v, &s, NULL));
    snprintf(c->op, sizeof c->op, "%s", s);
    CK(gser_map_find_cstr(gser_msg_get_root(m), "n", &v));
    CK(gser_value_get_uint(v, &c->n));
    CK(gser_map_find_cstr(gser_msg_get_root(m), "size", &v));
    CK(gser_value_get_uint(v, &c->size));
    gser_msg_destroy(m);
}

/* A message with one buffer of size bytes at data (host or device memory). */
static gser_msg_t *data_msg(const void *data, size_t size, gser_memory_t mem)
{
    gser_msg_t *m;
    gser_value_t *root, *v;
    CK(gser_msg_create(g_ctx, &m));
    CK(gser_msg_new_map(m, &root));
    CK(gser_msg_new_cstr(m, "data", &v));
    CK(gser_map_put_cstr(root, "op", v));
    gser_buffer_desc_t d = {.size = sizeof(gser_buffer_desc_t), .data = data, .nbytes = size, .memory = mem};
    if (size < 256 && mem == GSER_MEMORY_HOST)
        CK(gser_msg_new_bytes(m, data, size, &v)); /* small: a bytes value in the header */
    else
        CK(gser_msg_new_buffer(m, &d, &v));
    CK(gser_map_put_cstr(root, "x", v));
    CK(gser_msg_set_root(m, root));
    return m;
}

/* ---- a small message's round trip ----------------------------------------------------- */

typedef struct rt {
    gser_frames_t *f;
    gser_ucx_request_t *s, *r;
} rt_t;

/* The first half: send m (serialized now, or its frames serialized once) and
 * post the receive of the answer. */
static void rt_send(gser_ucx_ep_t *ep, gser_msg_t *m, gser_frames_t *once, rt_t *t)
{
    t->f = once;
    if (!once)
        CK(gser_serialize(g_ctx, m, NULL, &t->f));
    CK(gser_ucx_ep_send_nb(ep, gser_frames_get_array(t->f), gser_frames_get_count(t->f), NULL, &t->s));
    CK(gser_ucx_ep_recv_nb(ep, NULL, &t->r));
}

/* The second half: the answer, deserialized unless only frames travel. */
static void rt_finish(rt_t *t, gser_frames_t *once)
{
    CK(gser_ucx_request_wait(t->r, WAIT_MS));
    if (!once) {
        gser_msg_t *got;
        CK(gser_ucx_request_deserialize(t->r, g_ctx, NULL, &got));
        gser_msg_destroy(got);
    }
    gser_ucx_request_free(t->r);
    CK(gser_ucx_request_wait(t->s, WAIT_MS));
    gser_ucx_request_free(t->s);
    if (!once)
        gser_frames_destroy(t->f);
}

/* The peer's part: receive one message and send it back, deserialized and
 * serialized again, or (frames_only) its frames as they came. */
static void echo_one(gser_ucx_ep_t *ep, bool frames_only)
{
    if (!frames_only) {
        gser_msg_t *m;
        CK(gser_ucx_ep_recv_msg(ep, g_ctx, NULL, WAIT_MS, &m));
        CK(gser_ucx_ep_send_msg(ep, g_ctx, m, NULL, WAIT_MS));
        gser_msg_destroy(m);
        return;
    }
    gser_ucx_request_t *r, *s;
    CK(gser_ucx_ep_recv_nb(ep, NULL, &r));
    CK(gser_ucx_request_wait(r, WAIT_MS));
    gser_ucx_recv_t got = GSER_UCX_RECV_INIT;
    CK(gser_ucx_request_take(r, &got));
    CK(gser_ucx_ep_send_nb(ep, got.frames, got.nframes, NULL, &s));
    CK(gser_ucx_request_wait(s, WAIT_MS));
    gser_ucx_request_free(s);
    gser_ucx_request_free(r);
    gser_ucx_recv_release(&got, false);
}

/* ---- the serving child ---------------------------------------------------------------- */

#define RECV_WINDOW 8

static int serve(const char *device_backend)
{
    gser_context_options_t co = {.size = sizeof(gser_context_options_t), .trace = -1, .device_backend = device_backend ? device_backend : "none"};
    CK(gser_context_create(&co, &g_ctx));
    gser_ucx_context_t *uctx;
    CK(gser_ucx_context_create(&g_ucx_opts, &uctx));
    gser_ucx_worker_options_t wo = {.size = sizeof(gser_ucx_worker_options_t), .gser_ctx = device_backend ? g_ctx : NULL};
    gser_ucx_worker_t *w;
    CK(gser_ucx_worker_create(uctx, &wo, &w));
    const char *addr = getenv(ADDRESS_ENV);
    gser_ucx_listener_options_t lo = {.size = sizeof(gser_ucx_listener_options_t), .address = addr ? addr : "127.0.0.1"};
    gser_ucx_listener_t *l;
    CK(gser_ucx_listener_create(w, &lo, &l));
    printf("port %u\n", gser_ucx_listener_get_port(l));
    fflush(stdout);
    gser_ucx_ep_t *ep;
    gser_status_t st;
    /* A stranger's failed handshake concerns that peer only: keep listening. */
    while ((st = gser_ucx_listener_accept(l, WAIT_MS, &ep)) != GSER_OK && st != GSER_ERR_TIMEOUT &&
           gser_ucx_status_is_peer_error(st))
        fprintf(stderr, "server: a peer failed its handshake, still listening: %s\n", gser_ucx_get_last_error());
    CK(st);
    for (;;) {
        cmd_t c;
        recv_cmd(ep, &c);
        if (strcmp(c.op, "quit") == 0)
            break;
        if (strcmp(c.op, "echo") == 0 || strcmp(c.op, "echo_frames") == 0) {
            for (uint64_t i = 0; i < c.n; i++)
                echo_one(ep, strcmp(c.op, "echo_frames") == 0);
        } else if (strcmp(c.op, "sink") == 0) {
            /* Receive and deserialize n messages, RECV_WINDOW receives posted. */
            gser_ucx_request_t *r[RECV_WINDOW] = {0};
            uint64_t posted = 0, done = 0;
            /* Large frames: as many in flight as the receive cache holds
             * (it grows to one message: every further one in flight would
             * land in fresh pages). */
            uint64_t window = c.size >= ((size_t)256 << 20) ? 1 : c.size >= ((size_t)16 << 20) ? 4 : RECV_WINDOW;
            while (done < c.n) {
                while (posted < c.n && posted - done < window)
                    CK(gser_ucx_ep_recv_nb(ep, NULL, &r[posted++ % RECV_WINDOW]));
                gser_ucx_request_t *q = r[done % RECV_WINDOW];
                CK(gser_ucx_request_wait(q, WAIT_MS));
                gser_msg_t *m;
                CK(gser_ucx_request_deserialize(q, g_ctx, NULL, &m));
                gser_msg_destroy(m);
                gser_ucx_request_free(q);
                done++;
            }
            send_cmd(ep, "ack", c.n, 0);
        }
    }
    gser_ucx_ep_destroy(ep);
    gser_ucx_listener_destroy(l);
    gser_ucx_worker_destroy(w);
    gser_ucx_context_destroy(uctx);
    gser_context_destroy(g_ctx);
    return 0;
}

/* ---- child processes --------------------------------------------------------------------- */

typedef struct proc {
    pid_t pid;
    FILE *out;
} proc_t;

static proc_t spawn(char *const argv[], bool quiet)
{
    int p[2];
    if (pipe(p))
        abort();
    proc_t c = {.pid = fork()};
    if (c.pid == 0) {
        dup2(p[1], 1);
        if (quiet)
            dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    c.out = fdopen(p[0], "r");
    return c;
}

/* A serving child: in the peer's namespace when there is one. */
static proc_t spawn_peer(char *const argv[], bool quiet)
{
    if (!g_netns)
        return spawn(argv, quiet);
    char *full[16] = {(char *)"ip", (char *)"netns", (char *)"exec", (char *)g_netns};
    size_t n = 4;
    for (size_t i = 0; argv[i] && n < 15; i++)
        full[n++] = argv[i];
    full[n] = NULL;
    return spawn(full, quiet);
}

static int reap(proc_t *c)
{
    int status = 0;
    if (c->out)
        fclose(c->out);
    c->out = NULL;
    for (int i = 0; i < 2000 && c->pid > 0; i++) {
        if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
            c->pid = -1;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        usleep(5000);
    }
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
    }
    c->pid = -1;
    return -1;
}

static uint16_t free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len))
        abort();
    close(s);
    return ntohs(a.sin_port);
}

/* ---- ucx_perftest --------------------------------------------------------------------------- */

static const char *g_perftest;

/* Run one ucx_perftest test; its CSV line's columns: iterations, median
 * latency (us), average latency, overall latency, average bandwidth (MB/s,
 * MB = 2^20), overall bandwidth, message rates. */
static bool perftest_mode(const char *test, size_t size, long iters, long warmup, bool peer_errors, double *median_us,
                          double *bw_gbs, double *rate_m)
{
    char port[16], sz[32], n[32], w[32];
    for (int attempt = 0; attempt < 3; attempt++) {
        snprintf(port, sizeof port, "%u", free_port());
        snprintf(sz, sizeof sz, "%zu", size);
        snprintf(n, sizeof n, "%ld", iters);
        snprintf(w, sizeof w, "%ld", warmup);
        /* -e: peer error handling, as gser's endpoints have it. */
        char *e = peer_errors ? (char *)"-e" : NULL;
        char *server_argv[] = {(char *)g_perftest, "-p", port, e, NULL};
        proc_t server = spawn_peer(server_argv, true);
        proc_t client = {0};
        char line[512], last[512] = "";
        for (int tries = 0; tries < 40; tries++) {
            usleep(50000);
            char *client_argv[] = {(char *)g_perftest, (char *)g_address, "-p", port, "-t", (char *)test, "-s", sz,
                                   "-n", n, "-w", w, "-f", "-v", e, NULL};
            client = spawn(client_argv, true);
            last[0] = '\0';
            while (fgets(line, sizeof line, client.out))
                if (line[0] == ' ' || (line[0] >= '0' && line[0] <= '9'))
                    snprintf(last, sizeof last, "%s", line);
            if (reap(&client) == 0 && last[0])
                break;
            last[0] = '\0';
        }
        reap(&server);
        long it;
        double med, avg, overall, avg_bw, overall_bw, avg_mr, overall_mr;
        if (last[0] && sscanf(last, " %ld,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &it, &med, &avg, &overall, &avg_bw,
                              &overall_bw, &avg_mr, &overall_mr) == 8) {
            *median_us = med;
            *bw_gbs = overall_bw * 1048576.0 / 1e9;
            *rate_m = overall_mr / 1e6;
            return true;
        }
    }
    fprintf(stderr, "ucx_perftest %s %zu failed\n", test, size);
    return false;
}

static bool perftest(const char *test, size_t size, long iters, long warmup, double *median_us, double *bw_gbs,
                     double *rate_m)
{
    return perftest_mode(test, size, iters, warmup, true, median_us, bw_gbs, rate_m);
}

/* One memcpy of size bytes between two warm buffers: the physical limit of
 * moving them within one node. Median GB/s of reps. */
static double memcpy_gbs(void *dst, const void *src, size_t size, int reps)
{
    double v[8];
    memcpy(dst, src, size); /* fault the pages in */
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now_us();
        memcpy(dst, src, size);
        v[i] = (double)size / (bench_now_us() - t0) / 1e3;
    }
    qsort(v, (size_t)reps, sizeof *v, bench_cmp_double);
    return v[reps / 2];
}

/* ---- the floor: msgpack-c over plain UCX ------------------------------------------------------ */

/* What a program does that sends msgpack messages over UCX tag messages,
 * written for speed and for messages of any size, with nothing else: msgpack-c
 * packs into one reused sbuffer and UCX sends it; the receiver probes (sizes
 * are not known in advance), receives into one reused buffer, and unpacks
 * into one reused zone (msgpack_unpack: strings and binaries point into the
 * buffer). No framing, no checks, no ordering, no error paths, no objects
 * that outlive the next message. The echo packs what it unpacked
 * (msgpack_pack_object), as gser's echo serializes what it deserialized.
 * gser's latency rows are measured against it as well as against
 * ucx_perftest, which has no codec at all. */
typedef struct floor_ucx {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    msgpack_sbuffer sb;
    msgpack_zone zone;
    char *rbuf;
    size_t rcap;
} floor_ucx_t;

static bool floor_open(floor_ucx_t *f)
{
    memset(f, 0, sizeof *f);
    msgpack_sbuffer_init(&f->sb);
    if (!msgpack_zone_init(&f->zone, 2048))
        return false;
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return false;
    ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "inf"); /* as gser's context has it */
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucs_status_t st = ucp_init(&pp, cfg, &f->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK)
        return false;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    return ucp_worker_create(f->ctx, &wp, &f->w) == UCS_OK;
}

static bool floor_connect(floor_ucx_t *f, const void *addr)
{
    ucp_ep_params_t ep_p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                            .address = addr, .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    return ucp_ep_create(f->w, &ep_p, &f->ep) == UCS_OK;
}

static bool floor_wait(floor_ucx_t *f, void *req)
{
    if (UCS_PTR_IS_ERR(req))
        return false;
    if (!req)
        return true;
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS)
        ucp_worker_progress(f->w);
    ucp_request_free(req);
    return st == UCS_OK;
}

static void floor_close(floor_ucx_t *f)
{
    if (f->ep) {
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
        floor_wait(f, ucp_ep_close_nbx(f->ep, &cp));
    }
    if (f->w)
        ucp_worker_destroy(f->w);
    if (f->ctx)
        ucp_cleanup(f->ctx);
    msgpack_zone_destroy(&f->zone);
    msgpack_sbuffer_destroy(&f->sb);
    free(f->rbuf);
}

/* Probe, then receive the whole message into f->rbuf (grown as needed). */
static bool floor_recv_raw(floor_ucx_t *f, size_t *len)
{
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg;
    while (!(msg = ucp_tag_probe_nb(f->w, 1, ~(uint64_t)0, 1, &info)))
        ucp_worker_progress(f->w);
    if (info.length > f->rcap) {
        char *b = realloc(f->rbuf, info.length);
        if (!b)
            return false;
        f->rbuf = b;
        f->rcap = info.length;
    }
    ucp_request_param_t rp = {0};
    *len = info.length;
    return floor_wait(f, ucp_tag_msg_recv_nbx(f->w, f->rbuf, info.length, msg, &rp));
}

static bool floor_send_raw(floor_ucx_t *f, const void *data, size_t len)
{
    ucp_request_param_t sp = {0};
    return floor_wait(f, ucp_tag_send_nbx(f->ep, data, len, 1, &sp));
}

/* Receive one message and unpack it: *obj lives until the next receive. */
static bool floor_recv(floor_ucx_t *f, msgpack_object *obj)
{
    size_t len, off = 0;
    if (!floor_recv_raw(f, &len))
        return false;
    msgpack_zone_clear(&f->zone);
    return msgpack_unpack(f->rbuf, len, &off, &f->zone, obj) == MSGPACK_UNPACK_SUCCESS;
}

/* Pack obj (or, if NULL, the latency rows' message) and send it. */
static bool floor_send(floor_ucx_t *f, const msgpack_object *obj)
{
    static const unsigned char payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    msgpack_sbuffer_clear(&f->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &f->sb, msgpack_sbuffer_write);
    if (obj) {
        msgpack_pack_object(&pk, *obj);
    } else {
        msgpack_pack_map(&pk, 2);
        msgpack_pack_str_with_body(&pk, "op", 2);
        msgpack_pack_str_with_body(&pk, "data", 4);
        msgpack_pack_str_with_body(&pk, "x", 1);
        msgpack_pack_bin_with_body(&pk, payload, sizeof payload);
    }
    return floor_send_raw(f, f->sb.data, f->sb.size);
}

/* The floor's serving child: its address in hex on stdout, the parent's
 * address as the first message, then n messages echoed. */
static int floor_serve(long n)
{
    floor_ucx_t f;
    ucp_address_t *addr;
    size_t alen, plen;
    if (!floor_open(&f) || ucp_worker_get_address(f.w, &addr, &alen) != UCS_OK)
        return 1;
    printf("addr ");
    for (size_t i = 0; i < alen; i++)
        printf("%02x", ((const unsigned char *)addr)[i]);
    printf("\n");
    fflush(stdout);
    ucp_worker_release_address(f.w, addr);
    bool ok = floor_recv_raw(&f, &plen) && floor_connect(&f, f.rbuf);
    msgpack_object obj;
    for (long i = 0; ok && i < n; i++)
        ok = floor_recv(&f, &obj) && floor_send(&f, &obj);
    floor_close(&f);
    return ok ? 0 : 1;
}

/* Half the median round trip of the floor's ping-pong; NAN if it fails. */
static double floor_latency_us(long n, long warmup)
{
    char count[32];
    snprintf(count, sizeof count, "%ld", n + warmup);
    char *argv[] = {(char *)g_self, "--floor-serve", count, NULL};
    proc_t child = spawn_peer(argv, false);
    floor_ucx_t f;
    ucp_address_t *addr = NULL;
    size_t alen = 0;
    char line[4096];
    unsigned char peer[2048];
    size_t plen = 0;
    bool ok = floor_open(&f) && ucp_worker_get_address(f.w, &addr, &alen) == UCS_OK && fgets(line, sizeof line, child.out) &&
              strncmp(line, "addr ", 5) == 0;
    for (const char *p = line + 5; ok && p[0] && p[0] != '\n' && plen < sizeof peer; p += 2) {
        unsigned v;
        ok = sscanf(p, "%2x", &v) == 1;
        peer[plen++] = (unsigned char)v;
    }
    ok = ok && floor_connect(&f, peer) && floor_send_raw(&f, addr, alen);
    if (addr)
        ucp_worker_release_address(f.w, addr);
    double *rtt = malloc(sizeof(double) * (size_t)n);
    msgpack_object obj;
    for (long i = 0; ok && i < n + warmup; i++) {
        double t0 = bench_now_us();
        ok = floor_send(&f, NULL) && floor_recv(&f, &obj);
        if (i >= warmup)
            rtt[i - warmup] = bench_now_us() - t0;
    }
    floor_close(&f);
    ok = reap(&child) == 0 && ok;
    double med = NAN;
    if (ok) {
        qsort(rtt, (size_t)n, sizeof *rtt, bench_cmp_double);
        med = rtt[n / 2] / 2;
    } else {
        fprintf(stderr, "the msgpack-c over UCX floor failed\n");
    }
    free(rtt);
    return med;
}

/* ---- gser's side ----------------------------------------------------------------------------- */

typedef struct conn {
    proc_t server;
    gser_ucx_context_t *uctx;
    gser_ucx_worker_t *w;
    gser_ucx_ep_t *ep;
} conn_t;

/* wo: this side's worker options (NULL: the defaults). */
static void conn_open_with(conn_t *c, const char *device_backend, const gser_ucx_worker_options_t *wo);

static void conn_open(conn_t *c, const char *device_backend)
{
    conn_open_with(c, device_backend, NULL);
}

static void conn_open_with(conn_t *c, const char *device_backend, const gser_ucx_worker_options_t *wo_in)
{
    char *argv[] = {(char *)g_self, "--serve", (char *)(device_backend ? device_backend : "-"), NULL};
    c->server = spawn_peer(argv, false);
    unsigned port = 0;
    char line[128];
    if (!fgets(line, sizeof line, c->server.out) || sscanf(line, "port %u", &port) != 1) {
        fprintf(stderr, "the serving child did not start\n");
        exit(1);
    }
    CK(gser_ucx_context_create(&g_ucx_opts, &c->uctx));
    gser_ucx_worker_options_t wo = {.size = sizeof(gser_ucx_worker_options_t)};
    if (wo_in)
        wo = *wo_in;
    wo.gser_ctx = device_backend ? g_ctx : NULL;
    CK(gser_ucx_worker_create(c->uctx, &wo, &c->w));
    CK(gser_ucx_ep_connect(c->w, g_address, (uint16_t)port, WAIT_MS, &c->ep));
}

static void conn_close(conn_t *c)
{
    send_cmd(c->ep, "quit", 0, 0);
    gser_ucx_ep_destroy(c->ep);
    if (reap(&c->server) != 0)
        fprintf(stderr, "the serving child failed\n");
    gser_ucx_worker_destroy(c->w);
    gser_ucx_context_destroy(c->uctx);
}

/* Half the median round trip of a small message, encoding included; with
 * frames_only, its frames serialized once and echoed as they arrive. */
static double gser_latency_us(conn_t *c, long n, long warmup, bool frames_only)
{
    unsigned char payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    gser_msg_t *m = data_msg(payload, sizeof payload, GSER_MEMORY_HOST);
    gser_frames_t *once = NULL;
    if (frames_only)
        CK(gser_serialize(g_ctx, m, NULL, &once));
    send_cmd(c->ep, frames_only ? "echo_frames" : "echo", (uint64_t)(n + warmup), 0);
    double *rtt = malloc(sizeof(double) * (size_t)n);
    for (long i = 0; i < n + warmup; i++) {
        double t0 = bench_now_us();
        rt_t t;
        rt_send(c->ep, m, once, &t);
        rt_finish(&t, once);
        if (i >= warmup)
            rtt[i - warmup] = bench_now_us() - t0;
    }
    qsort(rtt, (size_t)n, sizeof *rtt, bench_cmp_double);
    double med = rtt[n / 2] / 2;
    free(rtt);
    gser_frames_destroy(once);
    gser_msg_destroy(m);
    return med;
}

/* ---- both ends in this process, one thread: the CPU work alone ------------------------- */

/* Nanoseconds per round trip of 8-byte tag messages between two UCX workers
 * of one context, each receive posted before its send; NAN if UCX fails. */
static double ucx_cpu_rt_ns(long n)
{
    double ns = NAN;
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return NAN;
    ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "inf"); /* as gser's context has it */
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_context_h ctx;
    ucs_status_t st = ucp_init(&pp, cfg, &ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK)
        return NAN;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w[2] = {NULL, NULL};
    ucp_address_t *addr[2] = {NULL, NULL};
    size_t len[2];
    ucp_ep_h ep[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        if (ucp_worker_create(ctx, &wp, &w[i]) != UCS_OK || ucp_worker_get_address(w[i], &addr[i], &len[i]) != UCS_OK)
            goto out;
    for (int i = 0; i < 2; i++) {
        ucp_ep_params_t ep_p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                                .address = addr[1 - i], .err_mode = UCP_ERR_HANDLING_MODE_PEER};
        if (ucp_ep_create(w[i], &ep_p, &ep[i]) != UCS_OK)
            goto out;
    }
    char sbuf[8] = {0}, rbuf[8];
    double t0 = 0;
    for (long k = 0; k < n + n / 10; k++) {
        if (k == n / 10)
            t0 = bench_now_us();
        for (int i = 0; i < 2; i++) { /* i sends to 1 - i */
            ucp_request_param_t rp = {0}, sp = {0};
            void *r = ucp_tag_recv_nbx(w[1 - i], rbuf, sizeof rbuf, 1, ~(uint64_t)0, &rp);
            void *s = ucp_tag_send_nbx(ep[i], sbuf, sizeof sbuf, 1, &sp);
            if (UCS_PTR_IS_ERR(r) || UCS_PTR_IS_ERR(s))
                goto out;
            while ((r && ucp_request_check_status(r) == UCS_INPROGRESS) ||
                   (s && ucp_request_check_status(s) == UCS_INPROGRESS)) {
                ucp_worker_progress(w[1 - i]);
                ucp_worker_progress(w[i]);
            }
            if (r)
                ucp_request_free(r);
            if (s)
                ucp_request_free(s);
        }
    }
    ns = (bench_now_us() - t0) * 1e3 / (double)n;
out:
    for (int i = 0; i < 2; i++) {
        if (ep[i]) {
            ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
            void *c = ucp_ep_close_nbx(ep[i], &cp);
            while (UCS_PTR_IS_PTR(c) && ucp_request_check_status(c) == UCS_INPROGRESS)
                ucp_worker_progress(w[i]);
            if (UCS_PTR_IS_PTR(c))
                ucp_request_free(c);
        }
    }
    for (int i = 0; i < 2; i++) {
        if (addr[i])
            ucp_worker_release_address(w[i], addr[i]);
        if (w[i])
            ucp_worker_destroy(w[i]);
    }
    ucp_cleanup(ctx);
    return ns;
}

/* The same for gser: a client and a server endpoint on two workers here,
 * the round trip of the latency rows with the server's part in between. */
static double gser_cpu_rt_ns(long n, bool frames_only)
{
    gser_ucx_context_t *uctx;
    CK(gser_ucx_context_create(&g_ucx_opts, &uctx));
    gser_ucx_worker_options_t wo = {.size = sizeof(gser_ucx_worker_options_t)};
    gser_ucx_worker_t *sw, *cw;
    CK(gser_ucx_worker_create(uctx, &wo, &sw));
    CK(gser_ucx_worker_create(uctx, &wo, &cw));
    gser_ucx_listener_options_t lo = {.size = sizeof(gser_ucx_listener_options_t), .address = "127.0.0.1"};
    gser_ucx_listener_t *l;
    CK(gser_ucx_listener_create(sw, &lo, &l));
    gser_ucx_ep_t *cep, *sep = NULL;
    CK(gser_ucx_ep_connect_nb(cw, "127.0.0.1", gser_ucx_listener_get_port(l), &cep));
    double until = bench_now_us() + WAIT_MS * 1e3;
    while ((!sep || gser_ucx_ep_get_status(cep) == GSER_INPROGRESS) && bench_now_us() < until) {
        gser_ucx_worker_progress(sw);
        gser_ucx_worker_progress(cw);
        gser_status_t st = sep ? GSER_OK : gser_ucx_listener_accept(l, 0, &sep);
        if (st != GSER_OK && !gser_ucx_status_is_peer_error(st))
            CK(st);
    }
    if (!sep)
        CK(GSER_ERR_TIMEOUT);
    CK(gser_ucx_ep_get_status(cep));

    unsigned char payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    gser_msg_t *m = data_msg(payload, sizeof payload, GSER_MEMORY_HOST);
    gser_frames_t *once = NULL;
    if (frames_only)
        CK(gser_serialize(g_ctx, m, NULL, &once));
    double t0 = 0;
    for (long k = 0; k < n + n / 10; k++) {
        if (k == n / 10)
            t0 = bench_now_us();
        rt_t t;
        rt_send(cep, m, once, &t);
        echo_one(sep, frames_only);
        rt_finish(&t, once);
    }
    double ns = (bench_now_us() - t0) * 1e3 / (double)n;
    gser_frames_destroy(once);
    gser_msg_destroy(m);
    gser_ucx_ep_destroy(cep);
    gser_ucx_ep_destroy(sep);
    gser_ucx_listener_destroy(l);
    gser_ucx_worker_destroy(cw);
    gser_ucx_worker_destroy(sw);
    gser_ucx_context_destroy(uctx);
    return ns;
}

#define SEND_WINDOW 16

/* Send n messages with one frame of size bytes at data (window of
 * SEND_WINDOW); the receiver deserializes each and acknowledges the last. */
static double gser_stream(conn_t *c, const void *data, size_t size, gser_memory_t mem, long n)
{
    send_cmd(c->ep, "sink", (uint64_t)n, size);
    gser_msg_t *m = data_msg(data, size, mem);
    gser_ucx_request_t *req[SEND_WINDOW] = {0};
    gser_frames_t *fr[SEND_WINDOW] = {0};
    double t0 = bench_now_us();
    for (long i = 0; i < n + SEND_WINDOW; i++) {
        int k = (int)(i % SEND_WINDOW);
        if (req[k]) {
            CK(gser_ucx_request_wait(req[k], WAIT_MS));
            gser_ucx_request_free(req[k]);
            gser_frames_destroy(fr[k]);
            req[k] = NULL;
        }
        if (i < n) {
            CK(gser_serialize(g_ctx, m, NULL, &fr[k]));
            CK(gser_frames_wait(fr[k]));
            CK(gser_ucx_ep_send_nb(c->ep, gser_frames_get_array(fr[k]), gser_frames_get_count(fr[k]), NULL, &req[k]));
        }
    }
    cmd_t ack;
    recv_cmd(c->ep, &ack);
    double us = bench_now_us() - t0;
    gser_msg_destroy(m);
    return (double)size * (double)n / us / 1e3; /* GB/s */
}

/* ---- one transport ------------------------------------------------------------------------- */

static const char *size_name(size_t s)
{
    static char buf[32];
    if (s >= ((size_t)1 << 30) && s % ((size_t)1 << 30) == 0)
        snprintf(buf, sizeof buf, "%zuGiB", s >> 30);
    else if (s >= (1u << 20))
        snprintf(buf, sizeof buf, "%zuMiB", s >> 20);
    else if (s >= 1024)
        snprintf(buf, sizeof buf, "%zuKiB", s >> 10);
    else
        snprintf(buf, sizeof buf, "%zuB", s);
    return buf;
}

static void set_transport(const char *tl)
{
    setenv("UCX_NET_DEVICES", g_netdev, 1);
    if (strcmp(tl, "tcp") == 0) {
        setenv("UCX_TLS", "tcp", 1);
        unsetenv("UCX_POSIX_ERROR_HANDLING");
        unsetenv("UCX_SYSV_ERROR_HANDLING");
    } else {
        setenv("UCX_TLS", "posix,sysv,cma,self,tcp", 1);
        /* What gser's context sets for itself; ucx_perftest needs it in its environment. */
        setenv("UCX_POSIX_ERROR_HANDLING", "y", 1);
        setenv("UCX_SYSV_ERROR_HANDLING", "y", 1);
    }
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

/* Rounds of each measurement, ucx_perftest and gser alternating, so that
 * both see the same machine (other load on it drifts); medians reported. */
#define ROUNDS 5

/* Large messages between two processes on one node, against one memcpy of
 * the same size (the physical limit: a one-copy path reaches it) and
 * against ucx_perftest with and without peer error handling (UCX 1.13 uses
 * cma's one-copy get only without it: docs/ucx.md, BENCHMARKS.md). */
static void run_one_node(conn_t *c, bool quick, bool json)
{
    static const size_t sizes[] = {(size_t)256 << 20, (size_t)1 << 30};
    static const long counts[] = {12, 4};
    int rounds = quick ? 1 : 3;
    for (size_t i = 0; i < 2; i++) {
        size_t sz = quick ? (size_t)16 << 20 : sizes[i];
        long n = quick ? 2 : counts[i];
        unsigned char *buf = malloc(sz), *dst = malloc(sz);
        if (!buf || !dst) {
            fprintf(stderr, "gser-bench-ucx: no memory for %zu bytes\n", sz);
            free(buf);
            free(dst);
            return;
        }
        memset(buf, 7, sz);
        gser_stream(c, buf, sz, GSER_MEMORY_HOST, 2); /* warm-up: the receive cache grows to it */
        double gv[3], mv[3], pv[3], nv[3], unused;
        bool have_pf = true, have_nf = true;
        for (int k = 0; k < rounds; k++) {
            mv[k] = memcpy_gbs(dst, buf, sz, quick ? 1 : 5);
            have_pf &= perftest_mode("tag_bw", sz, n, 2, true, &unused, &pv[k], &unused);
            have_nf &= perftest_mode("tag_bw", sz, n, 2, false, &unused, &nv[k], &unused);
            gv[k] = gser_stream(c, buf, sz, GSER_MEMORY_HOST, n);
        }
        free(buf);
        free(dst);
        double g = median(gv, rounds);
        char name[64], anchor[96], note[160];
        snprintf(name, sizeof name, "ucx_shm_bw_%s", size_name(sz));
        snprintf(anchor, sizeof anchor, "ucx_perftest tag_bw %s, shm", size_name(sz));
        bench_result_t b = {name, g, "GB/s", anchor, have_pf ? median(pv, rounds) : NAN, ">= 0.9", NULL};
        bench_print(&b, json);
        snprintf(name, sizeof name, "ucx_shm_1node_%s", size_name(sz));
        snprintf(anchor, sizeof anchor, "one memcpy of %s", size_name(sz));
        snprintf(note, sizeof note, "ucx_perftest without peer error handling (cma, one copy): %.2f GB/s",
                 have_nf ? median(nv, rounds) : NAN);
        bench_result_t m = {name, g, "GB/s", anchor, median(mv, rounds), ">= 0.8", note};
        bench_print(&m, json);
    }
}

/* Between two nodes: 256 MiB messages one way, gser on its defaults vs
 * ucx_perftest on UCX's, best of the rounds (a shared machine only ever
 * slows a round down). */
static void run_link(const char *tl, bool quick, bool json)
{
    set_transport(tl);
    size_t sz = quick ? (size_t)16 << 20 : (size_t)256 << 20;
    long n = 2;
    int rounds = quick ? 1 : 3;
    unsigned char *buf = malloc(sz);
    if (!buf) {
        fprintf(stderr, "gser-bench-ucx: no memory for %zu bytes\n", sz);
        return;
    }
    memset(buf, 7, sz);
    conn_t c;
    conn_open(&c, NULL);
    gser_stream(&c, buf, sz, GSER_MEMORY_HOST, 1); /* warm-up: the receive cache grows to it */
    double g = 0, p = 0, bw, unused;
    bool have_pf = false;
    for (int k = 0; k < rounds; k++) {
        if (perftest("tag_bw", sz, n, 1, &unused, &bw, &unused)) {
            have_pf = true;
            p = bw > p ? bw : p;
        }
        bw = gser_stream(&c, buf, sz, GSER_MEMORY_HOST, n);
        g = bw > g ? bw : g;
    }
    conn_close(&c);
    free(buf);
    char name[64], anchor[96];
    snprintf(name, sizeof name, "ucx_%s_link_%s", tl, size_name(sz));
    snprintf(anchor, sizeof anchor, "ucx_perftest tag_bw %s, %s, UCX defaults", size_name(sz), tl);
    bench_result_t r = {name, g, "GB/s", anchor, have_pf ? p : NAN, ">= 1.1", "best of rounds, one way"};
    bench_print(&r, json);
}

/* n messages of one host frame sent with gser_ucx_ep_send_msg (the path
 * that compresses large frames in chunks as it sends them), one after the
 * other; GB/s of raw bytes up to the receiver's acknowledgement. */
static double gser_stream_msg(conn_t *c, const void *data, size_t size, long n)
{
    send_cmd(c->ep, "sink", (uint64_t)n, size);
    gser_msg_t *m = data_msg(data, size, GSER_MEMORY_HOST);
    double t0 = bench_now_us();
    for (long i = 0; i < n; i++)
        CK(gser_ucx_ep_send_msg(c->ep, g_ctx, m, NULL, WAIT_MS));
    cmd_t ack;
    recv_cmd(c->ep, &ack);
    double us = bench_now_us() - t0;
    gser_msg_destroy(m);
    return (double)size * (double)n / us / 1e3;
}

/* A large compressible frame (sorted int64 keys, 16 of each, as a shuffle's
 * index) with lz4 forced, sent in compressed chunks pipelined with the
 * sending (the default) against compressed whole before the first byte
 * leaves (chunked_min = SIZE_MAX), alternating, medians. On loopback the
 * wire is cheap, so this shows the overlap of compression, wire and
 * decompression; over a shaped link run it with --peer-netns. */
static void run_zchunk(const char *tl, bool quick, bool json)
{
    set_transport(tl);
    size_t sz = quick ? (size_t)16 << 20 : (size_t)64 << 20;
    long n = quick ? 2 : 4;
    int rounds = quick ? 1 : ROUNDS;
    int64_t *keys = malloc(sz);
    if (!keys) {
        fprintf(stderr, "gser-bench-ucx: no memory for %zu bytes\n", sz);
        return;
    }
    for (size_t i = 0; i < sz / sizeof *keys; i++)
        keys[i] = (int64_t)(i / 16) * 7919;
    gser_ucx_worker_options_t zo = {.size = sizeof(gser_ucx_worker_options_t), .compression = GSER_UCX_COMPRESSION_LZ4};
    gser_ucx_worker_options_t wo = zo;
    wo.chunked_min = SIZE_MAX;
    conn_t cz, cw;
    conn_open_with(&cz, NULL, &zo);
    conn_open_with(&cw, NULL, &wo);
    gser_stream_msg(&cz, keys, sz, 1); /* warm-up: buffers grow to the message */
    gser_stream_msg(&cw, keys, sz, 1);
    double zv[ROUNDS], wv[ROUNDS];
    for (int k = 0; k < rounds; k++) {
        wv[k] = gser_stream_msg(&cw, keys, sz, n);
        zv[k] = gser_stream_msg(&cz, keys, sz, n);
    }
    gser_ucx_chunk_stats_t zs = GSER_UCX_CHUNK_STATS_INIT;
    gser_status_t st = gser_ucx_ep_get_chunk_stats(cz.ep, &zs);
    conn_close(&cz);
    conn_close(&cw);
    free(keys);
    char name[64], anchor[96], note[128];
    snprintf(name, sizeof name, "ucx_%s_lz4_chunks_%s", tl, size_name(sz));
    snprintf(anchor, sizeof anchor, "lz4 whole frames %s, %s", size_name(sz), tl);
    snprintf(note, sizeof note, "median of %d; %llu chunks sent, %llu compressed", rounds,
             st == GSER_OK ? (unsigned long long)zs.chunks_sent : 0ull,
             st == GSER_OK ? (unsigned long long)zs.chunks_compressed : 0ull);
    bench_result_t r = {name, median(zv, rounds), "GB/s", anchor, median(wv, rounds), ">= 1.0", note};
    bench_print(&r, json);
}

static double run_transport(const char *tl, bool quick, bool json, const char *only)
{
    set_transport(tl);
    char name[64], anchor[96];
    double host_bw_64m = 0;
    int rounds = quick ? 1 : ROUNDS;
    double pv[ROUNDS], gv[ROUNDS], fv[ROUNDS], flv[ROUNDS], unused;
    bool have_pf = true;

    conn_t c;
    conn_open(&c, NULL);

    /* latency: perftest, the whole message, its frames alone, in turn */
    long lat_n = quick ? 200 : 20000;
    for (int k = 0; k < rounds && (!only || strcmp(only, "lat") == 0); k++) {
        have_pf &= perftest("tag_lat", 8, lat_n, lat_n / 10, &pv[k], &unused, &unused);
        gv[k] = gser_latency_us(&c, lat_n, lat_n / 10, false);
        fv[k] = gser_latency_us(&c, lat_n, lat_n / 10, true);
        flv[k] = floor_latency_us(lat_n, lat_n / 10);
    }
    if (!only || strcmp(only, "lat") == 0) {
        double pf = have_pf ? median(pv, rounds) : NAN;
        snprintf(anchor, sizeof anchor, "ucx_perftest tag_lat 8 B, %s", tl);
        snprintf(name, sizeof name, "ucx_%s_lat_8B", tl);
        bench_result_t r = {name, median(gv, rounds), "us", anchor, pf, "<= 2.0",
                            "median, one way, serialize and deserialize included"};
        bench_print(&r, json);
        snprintf(name, sizeof name, "ucx_%s_lat_8B_frames", tl);
        bench_result_t f = {name, median(fv, rounds), "us", anchor, pf, NULL,
                            "the row above without serialize and deserialize: the transport's part"};
        bench_print(&f, json);
        double fl = median(flv, rounds);
        snprintf(name, sizeof name, "ucx_%s_lat_8B_floor", tl);
        bench_result_t fr = {name, fl, "us", anchor, pf, NULL,
                             "msgpack-c over plain UCX, buffers reused (probe, receive, unpack; pack, send)"};
        bench_print(&fr, json);
        snprintf(name, sizeof name, "ucx_%s_lat_8B_vs_floor", tl);
        snprintf(anchor, sizeof anchor, "msgpack-c over plain UCX, %s", tl);
        bench_result_t vf = {name, median(gv, rounds), "us", anchor, fl, NULL,
                             "gser's whole message against the floor, same message"};
        bench_print(&vf, json);
    }
    /* The same two round trips with both ends in this process, driven by one
     * thread: what each costs in CPU work, without the transfers between
     * cores that dominate the rows above. Over shared memory only: over tcp
     * a send may wait for its own worker, which a one-thread echo does not
     * drive while it waits for the other. */
    if ((!only || strcmp(only, "lat") == 0) && strcmp(tl, "shm") == 0) {
        long cpu_n = quick ? 200 : 20000;
        double uv[ROUNDS], cv[ROUNDS], cf[ROUNDS];
        for (int k = 0; k < rounds; k++) {
            uv[k] = ucx_cpu_rt_ns(cpu_n);
            cv[k] = gser_cpu_rt_ns(cpu_n, false);
            cf[k] = gser_cpu_rt_ns(cpu_n, true);
        }
        snprintf(anchor, sizeof anchor, "UCX tag 8 B, 2 workers, 1 thread");
        snprintf(name, sizeof name, "ucx_%s_cpu_8B", tl);
        bench_result_t cr = {name, median(cv, rounds), "ns", anchor, median(uv, rounds), NULL,
                             "round trip, both ends in one thread: CPU work, serialize and deserialize included"};
        bench_print(&cr, json);
        snprintf(name, sizeof name, "ucx_%s_cpu_8B_frames", tl);
        bench_result_t cfr = {name, median(cf, rounds), "ns", anchor, median(uv, rounds), NULL,
                              "the same without serialize and deserialize"};
        bench_print(&cfr, json);
    }

    /* bandwidth; for 8-byte messages, the message rate */
    static const size_t sizes[] = {8, 64 << 10, 4 << 20, 64 << 20};
    static const long counts[] = {200000, 20000, 600, 40};
    static const char *targets[] = {">= 0.1", ">= 0.5", ">= 0.9", ">= 0.9"};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (only && strcmp(only, "bw") != 0)
            break;
        size_t sz = sizes[i];
        bool rate = sz == 8;
        long n = quick ? (counts[i] / 100 > 4 ? counts[i] / 100 : 4) : counts[i];
        unsigned char *buf = malloc(sz);
        memset(buf, 7, sz);
        gser_stream(&c, buf, sz, GSER_MEMORY_HOST, n / 10 + 4); /* warm-up: buffers, registrations */
        have_pf = true;
        for (int k = 0; k < rounds; k++) {
            double bw, mr;
            have_pf &= perftest("tag_bw", sz, n, n / 10 + 1, &unused, &bw, &mr);
            pv[k] = rate ? mr : bw;
            gv[k] = gser_stream(&c, buf, sz, GSER_MEMORY_HOST, n);
            if (rate)
                gv[k] = gv[k] * 1e9 / (double)sz / 1e6; /* GB/s -> million messages/s */
        }
        free(buf);
        double g = median(gv, rounds);
        if (sz == (size_t)64 << 20)
            host_bw_64m = g;
        snprintf(name, sizeof name, "ucx_%s_%s_%s", tl, rate ? "rate" : "bw", size_name(sz));
        snprintf(anchor, sizeof anchor, "ucx_perftest tag_bw %s, %s", size_name(sz), tl);
        bench_result_t b = {name, g, rate ? "Mmsg/s" : "GB/s", anchor, have_pf ? median(pv, rounds) : NAN, targets[i],
                            rate ? "each message serialized and deserialized" : NULL};
        bench_print(&b, json);
    }
    if (strcmp(tl, "shm") == 0 && (!only || strcmp(only, "bw") == 0))
        run_one_node(&c, quick, json);
    conn_close(&c);
    return host_bw_64m;
}

/* 1 GiB of device frames (16 x 64 MiB) through staging to a receiver with
 * device memory, vs the slower of the pinned copy and the host transport. */
static void run_device(const char *tl, const char *backend, double host_bw, bool quick, bool json)
{
    set_transport(tl);
    size_t frame = quick ? (size_t)4 << 20 : (size_t)64 << 20;
    long n = 16;
    void *dev, *pinned;
    CK(gser_device_alloc(g_ctx, frame, NULL, &dev));
    CK(gser_pinned_alloc(g_ctx, frame, &pinned));
    CK(gser_device_memcpy(g_ctx, dev, GSER_MEMORY_DEVICE, pinned, GSER_MEMORY_HOST, frame, NULL));
    CK(gser_stream_wait(g_ctx, NULL));
    /* The pinned device-to-host copy, as staging does it (4 MiB chunks). */
    size_t chunk = (size_t)4 << 20;
    double t0 = bench_now_us();
    for (int rep = 0; rep < 4; rep++)
        for (size_t off = 0; off < frame; off += chunk)
            CK(gser_device_memcpy(g_ctx, (char *)pinned + off, GSER_MEMORY_HOST, (char *)dev + off,
                                  GSER_MEMORY_DEVICE, chunk, NULL));
    CK(gser_stream_wait(g_ctx, NULL));
    double copy_bw = 4.0 * (double)frame / (bench_now_us() - t0) / 1e3;

    conn_t c;
    conn_open(&c, backend);
    gser_stream(&c, dev, frame, GSER_MEMORY_DEVICE, 2);
    double g = gser_stream(&c, dev, frame, GSER_MEMORY_DEVICE, n);
    conn_close(&c);
    gser_pinned_free(g_ctx, pinned, frame);
    gser_device_free(g_ctx, dev, frame, NULL);

    char name[64], anchor[128], note[128];
    snprintf(name, sizeof name, "ucx_%s_device_%s", tl, quick ? "64m" : "1g");
    double lim = copy_bw < host_bw ? copy_bw : host_bw;
    snprintf(anchor, sizeof anchor, "min(pinned D2H copy, host bw 64MiB), %s", tl);
    snprintf(note, sizeof note, "%s; pinned copy %.2f GB/s, host transport %.2f GB/s", backend, copy_bw, host_bw);
    bench_result_t r = {name, g, "GB/s", anchor, lim, ">= 0.8", note};
    bench_print(&r, json);
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    if (argc == 3 && strcmp(argv[1], "--serve") == 0)
        return serve(strcmp(argv[2], "-") == 0 ? NULL : argv[2]);
    if (argc == 3 && strcmp(argv[1], "--floor-serve") == 0)
        return floor_serve(atol(argv[2]));
    signal(SIGPIPE, SIG_IGN);
    bool json = false, quick = false;
    const char *transport = "all", *device = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--transport") == 0 && i + 1 < argc)
            transport = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--perftest") == 0 && i + 1 < argc)
            g_perftest = argv[++i];
        else if (strcmp(argv[i], "--peer-netns") == 0 && i + 1 < argc)
            g_netns = argv[++i];
        else if (strcmp(argv[i], "--address") == 0 && i + 1 < argc)
            g_address = argv[++i];
        else if (strcmp(argv[i], "--net-device") == 0 && i + 1 < argc)
            g_netdev = argv[++i];
        else {
            fprintf(stderr, "usage: gser-bench-ucx [--json] [--quick] [--transport tcp|shm|all] "
                            "[--device cuda|emulated|none] [--only lat|bw|link|zchunk] [--perftest PATH] "
                            "[--peer-netns NS --address ADDR --net-device DEV]\n");
            return 2;
        }
    }
    if (!g_perftest)
        g_perftest = "ucx_perftest";
    if (only && strcmp(only, "lat") != 0 && strcmp(only, "bw") != 0 && strcmp(only, "link") != 0 &&
        strcmp(only, "zchunk") != 0) {
        fprintf(stderr, "gser-bench-ucx: --only takes lat, bw, link or zchunk\n");
        return 2;
    }
    setenv(ADDRESS_ENV, g_address, 1); /* for the serving children */
    char *pt_argv[] = {(char *)g_perftest, "-h", NULL};
    proc_t probe = spawn(pt_argv, true);
    char line[256];
    bool found = false;
    while (fgets(line, sizeof line, probe.out))
        found |= strstr(line, "tag_bw") != NULL;
    reap(&probe);
    if (!found) {
        fprintf(stderr, "gser-bench-ucx: %s not found (apt-get install ucx-utils, or --perftest PATH); "
                        "the anchors are missing\n", g_perftest);
        return 2;
    }

    /* The device context: CUDA when a GPU is there unless told otherwise. */
    gser_context_options_t co = {.size = sizeof(gser_context_options_t), .trace = -1, .device_backend = device};
    if (gser_context_create(&co, &g_ctx) != GSER_OK) {
        co.device_backend = "none";
        CK(gser_context_create(&co, &g_ctx));
    }
    const char *backend = gser_context_get_device_backend(g_ctx);
    bool run_dev = strcmp(backend, "none") != 0 && (device || strcmp(backend, "cuda") == 0);

    if (!json)
        printf("%-22s %12s %-4s  %-34s %12s  %-15s %-14s\n", "name", "value", "unit", "anchor", "anchor value",
               "ratio", "target");
    const char *tls[] = {"tcp", "shm"};
    for (int i = 0; i < 2; i++) {
        if (strcmp(transport, "all") != 0 && strcmp(transport, tls[i]) != 0)
            continue;
        if (only && strcmp(only, "link") == 0) {
            run_link(tls[i], quick, json);
            continue;
        }
        if (only && strcmp(only, "zchunk") == 0) {
            if (strcmp(tls[i], "tcp") == 0) /* compression is for networks */
                run_zchunk(tls[i], quick, json);
            continue;
        }
        double host_bw = run_transport(tls[i], quick, json, only);
        if (run_dev && !only)
            run_device(tls[i], backend, host_bw, quick, json);
    }
    gser_context_destroy(g_ctx);
    return 0;
}
