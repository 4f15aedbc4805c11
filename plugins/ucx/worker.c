/* Transport contexts and workers: UCX initialisation, progress, the event
 * file descriptor and bounded waits. */
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Progress rounds without any event before a blocking wait sleeps on the
 * event fd: polling keeps latency low, sleeping keeps idle waits cheap. */
#define GUX_SPIN_ROUNDS 4000
/* Longest single sleep, so that a missed wakeup costs little. */
#define GUX_SLEEP_SLICE_MS 20
/* While polling, gser's own sockets are looked at once GUX_CTL_EVERY rounds
 * and GUX_CTL_GAP_MS have passed since the last look: a look is a system
 * call (epoll_wait, about half a microsecond here), as costly as a dozen
 * rounds, and control traffic (handshakes, heartbeats, a bye) can wait
 * that long. */
#define GUX_CTL_EVERY 64
#define GUX_CTL_GAP_MS 0.05
/* Requests and endpoints an arm looks at, at most, to find UCX still armed
 * (worker.c, ucx_quiet). */
#define GUX_QUIET_WALK 256
/* Epoll tags of UCX's event fd and the timer (see control.c). */
#define GUX_TAG_UCX ((uint64_t)1 << 40)
#define GUX_TAG_TIMER ((uint64_t)2 << 40)

/* ---- context ----------------------------------------------------------------- */

/* Set a UCX configuration value unless the user's environment already did. */
static gser_status_t config_default(ucp_config_t *cfg, const char *name, const char *value, bool override)
{
    char env[128], what[160];
    snprintf(env, sizeof env, "UCX_%s", name);
    if (!override && getenv(env))
        return GSER_OK;
    snprintf(what, sizeof what, "ucp_config_modify(%s=%s)", name, value);
    return GUX_CALL(what, ucp_config_modify(cfg, name, value));
}

/* A transport's key (name without the transport's prefix, "TX_SEG_SIZE" of
 * tcp's "TCP_"). UCX 1.13 takes the bare name and not the prefixed one (it
 * stores that, then warns "invalid configurations" and ignores it); later
 * releases (1.21) refuse the bare one and take the prefixed one. Found by
 * trying, never by version. */
static gser_status_t config_default_tl(ucp_config_t *cfg, const char *prefix, const char *name, const char *value)
{
    char full[96], env[128];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    snprintf(env, sizeof env, "UCX_%s", full);
    if (getenv(env))
        return GSER_OK;
    if (ucp_config_modify(cfg, name, value) == UCS_OK)
        return GSER_OK;
    return config_default(cfg, full, value, false);
}

/* Whether the transport list may include one of names (UCX warns about
 * settings for transports it does not load). */
static bool may_use(const char *tls, const char *const *names, size_t n)
{
    if (!tls)
        tls = getenv("UCX_TLS");
    if (!tls || tls[0] == '^')
        return true;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        for (const char *p = tls; (p = strstr(p, names[i])); p += len)
            if ((p == tls || p[-1] == ',') && (p[len] == '\0' || p[len] == ','))
                return true;
    }
    return false;
}

static bool may_use_shm(const char *tls)
{
    static const char *const names[] = {"all", "sm", "shm", "posix", "sysv", "mm"};
    return may_use(tls, names, sizeof names / sizeof names[0]);
}

static bool may_use_tcp(const char *tls)
{
    static const char *const names[] = {"all", "tcp"};
    return may_use(tls, names, sizeof names / sizeof names[0]);
}

/* Whether UCX may use an RDMA transport: the host has such a device and the
 * transport list may name one of UCX's verbs transports. */
static bool may_use_rdma(const char *tls)
{
    static const char *const names[] = {"all",       "ib",     "rc",       "ud",       "dc",       "rc_v",
                                        "rc_x",      "ud_v",   "ud_x",     "dc_x",     "rc_verbs", "ud_verbs",
                                        "rc_mlx5",   "ud_mlx5", "dc_mlx5", "srd"};
    DIR *d = opendir("/sys/class/infiniband");
    if (!d)
        return false;
    bool devices = false;
    for (struct dirent *e; !devices && (e = readdir(d));)
        devices = e->d_name[0] != '.';
    closedir(d);
    return devices && may_use(tls, names, sizeof names / sizeof names[0]);
}

/* The transports of a worker whose posix shared memory found no room. */
#define GUX_TLS_NO_POSIX "^posix"

/* tcp's send and receive segment size (docs/ucx.md, section 7). */
#define GUX_TCP_SEG_SIZE "512k"

/* Shared memory's FIFO length in segments, and the share of it the
 * receiver reads before it tells the sender (docs/ucx.md, section 7). */
#define GUX_MM_FIFO_SIZE 1024
#define GUX_MM_FIFO_RELEASE_FACTOR "0.0625"
/* UCX's own FIFO length (UCX_MM_FIFO_SIZE's default in 1.13 and later). */
#define GUX_UCX_MM_FIFO_SIZE 64

static bool may_use_posix(const char *tls)
{
    static const char *const names[] = {"all", "sm", "shm", "mm", "posix"};
    return may_use(tls, names, sizeof names / sizeof names[0]);
}

static bool may_use_sysv(const char *tls)
{
    static const char *const names[] = {"all", "sm", "shm", "mm", "sysv"};
    return may_use(tls, names, sizeof names / sizeof names[0]);
}

/* Whether gser sets the FIFO: shared memory may be used and the
 * environment names no FIFO size. */
static bool sets_mm_fifo(const char *tls)
{
    return may_use_shm(tls) && !getenv("UCX_MM_FIFO_SIZE") && !getenv("UCX_SYSV_FIFO_SIZE") &&
           !getenv("UCX_POSIX_FIFO_SIZE");
}

/* One transport's FIFO size as UCX reads it: its own variable, else the
 * one it inherits (UCX_MM_FIFO_SIZE), else gser's or UCX's default. *from:
 * the variable it came from (NULL: a default). */
static uint32_t mm_fifo_of(const char *var, uint32_t dflt, const char **from)
{
    const char *v = getenv(var);
    *from = var;
    if (!v) {
        v = getenv("UCX_MM_FIFO_SIZE");
        *from = "UCX_MM_FIFO_SIZE";
    }
    if (!v) {
        *from = NULL;
        return dflt;
    }
    /* UCX reads an unsigned integer ("%u"): what follows the digits is
     * ignored; a size it cannot read fails its own initialisation. */
    unsigned long n = strtoul(v, NULL, 10);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* The shared-memory FIFO size UCX ends up with in a context made for tls,
 * which the handshake carries (docs/ucx.md, sections 2 and 7). Computed
 * from the environment the way UCX reads it (UCX_POSIX_FIFO_SIZE and
 * UCX_SYSV_FIFO_SIZE inherit UCX_MM_FIFO_SIZE) and from what gser sets:
 * UCX's API has no reading back of a transport's setting short of opening
 * UCT's memory domains beside UCP's. One size is carried: where posix and
 * sysv may both be used and the environment gives them different sizes,
 * the context is refused. */
static gser_status_t mm_fifo_size(const char *tls, uint32_t *out)
{
    uint32_t dflt = sets_mm_fifo(tls) ? GUX_MM_FIFO_SIZE : GUX_UCX_MM_FIFO_SIZE;
    const char *pfrom, *sfrom;
    uint32_t posix = mm_fifo_of("UCX_POSIX_FIFO_SIZE", dflt, &pfrom);
    uint32_t sysv = mm_fifo_of("UCX_SYSV_FIFO_SIZE", dflt, &sfrom);
    bool p = may_use_posix(tls), s = may_use_sysv(tls);
    if (p && s && posix != sysv)
        return gux_fail(GSER_ERR_INVALID_ARG,
                        "gser_ucx_context_create: posix's shared-memory FIFO would hold %" PRIu32
                        " segments (%s) and sysv's %" PRIu32
                        " (%s): the handshake carries one size; set UCX_MM_FIFO_SIZE instead, alike in every process "
                        "of a host",
                        posix, pfrom ? pfrom : "the default", sysv, sfrom ? sfrom : "the default");
    *out = p || !s ? posix : sysv;
    return GSER_OK;
}

/* A UCX context with the context's settings; net_devices: UCX_NET_DEVICES
 * to use (NULL: the environment's); tls: UCX_TLS instead of the context's
 * (NULL: the context's). *fifo: its shared-memory FIFO size (mm_fifo_size). */
static gser_status_t ctx_ucp_init(const gser_ucx_context_t *ctx, const char *net_devices, const char *tls,
                                  ucp_context_h *out, uint32_t *fifo)
{
    gser_status_t st;
    ucp_config_t *cfg = NULL;
    if (!tls)
        tls = ctx->transports;
    uint32_t fifo_size = 0;
    if ((st = mm_fifo_size(tls, &fifo_size)))
        return st;
    if ((st = GUX_CALL("ucp_config_read", ucp_config_read(NULL, NULL, &cfg))))
        return st;
    if (tls && (st = config_default(cfg, "TLS", tls, true)))
        goto out;
    if (net_devices && (st = config_default(cfg, "NET_DEVICES", net_devices, true)))
        goto out;
    /* gser's heartbeats watch every connection (control.c); UCX's own
     * keepalive would only add work to every progress round. */
    if ((st = config_default(cfg, "KEEPALIVE_INTERVAL", "inf", false)))
        goto out;
    /* Endpoints use peer error handling (a dead peer must fail what is
     * pending, not hang it); UCX's shared-memory transports take part in
     * that only when asked. */
    if (may_use_shm(ctx->transports) && !getenv("UCX_POSIX_ERROR_HANDLING") && !getenv("UCX_SYSV_ERROR_HANDLING") &&
        (st = config_default(cfg, "MM_ERROR_HANDLING", "y", false))) /* posix and sysv share it */
        goto out;
    /* UCX 1.13 has no peer error handling on cma, so between processes of
     * one host a large message goes as the rendezvous's active-message
     * fragments through the receiver's FIFO (sysv or posix), which holds 64
     * segments of 8 KiB by default: 512 KiB per time both processes run. On
     * a loaded machine that is one scheduler slice each, and 256 MiB went at
     * 0.08-0.42 GB/s, mostly below tcp://, whose sockets buffer megabytes
     * between the two. 1024 segments (8 MiB, about a socket's buffer) cost
     * each worker 8 MiB more of shared memory per transport. The receiver
     * frees what it read every 64 segments (every 32 in UCX's own FIFO): at
     * UCX's half of 1024 a quiet sender waited for 4 MiB at a time (7.5-9
     * GB/s against 10.5-11.7). A user's FIFO size keeps UCX's release too.
     * UCX's sender indexes the peer's FIFO with its own size: the handshake
     * refuses peers of one host whose sizes differ (endpoint.c, fifo_check). */
    if (sets_mm_fifo(tls)) {
        char size[16];
        snprintf(size, sizeof size, "%d", GUX_MM_FIFO_SIZE);
        if ((st = config_default(cfg, "MM_FIFO_SIZE", size, false))) /* posix and sysv inherit it */
            goto out;
        if (!getenv("UCX_SYSV_FIFO_RELEASE_FACTOR") && !getenv("UCX_POSIX_FIFO_RELEASE_FACTOR") &&
            (st = config_default(cfg, "MM_FIFO_RELEASE_FACTOR", GUX_MM_FIFO_RELEASE_FACTOR, false)))
            goto out;
    }
    /* tcp's put emulation is slower than UCX's active-message rendezvous on
     * tcp, and for local peers it would take large messages off shared
     * memory. */
    if (may_use_tcp(ctx->transports) && !getenv("UCX_TCP_PUT_ENABLE") &&
        (st = config_default_tl(cfg, "TCP_", "PUT_ENABLE", "n")))
        goto out;
    /* tcp's copy-out segments bound its eager messages and the fragments of
     * its active-message rendezvous: with UCX's 8 KiB a large message takes
     * several times the send calls, and CPU, of 512 KiB (docs/ucx.md,
     * section 7). UCX refuses a send segment larger than the receive one, so
     * where the user set either, the other stays UCX's. */
    if (may_use_tcp(ctx->transports) && !getenv("UCX_TCP_TX_SEG_SIZE") && !getenv("UCX_TX_SEG_SIZE") &&
        !getenv("UCX_TCP_RX_SEG_SIZE") && !getenv("UCX_RX_SEG_SIZE") &&
        ((st = config_default_tl(cfg, "TCP_", "TX_SEG_SIZE", GUX_TCP_SEG_SIZE)) ||
         (st = config_default_tl(cfg, "TCP_", "RX_SEG_SIZE", GUX_TCP_SEG_SIZE))))
        goto out;

    /* UCX's tcp transport completes an active-message zero-copy send twice
     * when the socket fails with it halfway out (a peer killed mid-send):
     * once in its purge, once more in uct_tcp_ep_sendv (1.13.1, and still
     * in later releases), and its assertion aborts the process (docs/ucx.md,
     * section 7). Copied sends never take that path; zero copy is kept
     * where verbs transports (where it pays, and where tcp carries little)
     * may be used. */
    if (may_use_tcp(tls) && !may_use_rdma(tls) && (st = config_default(cfg, "ZCOPY_THRESH", "inf", false)))
        goto out;
    /* UCX's tcp transport takes up to 16 socket events from one epoll_wait
     * and handles them in turn. Handling one can fail the endpoint of a
     * later one (a reply sent from a receive handler on the other socket to
     * a peer just killed): UCX then hands that endpoint its stale event,
     * and its assertion aborts the process (1.13.1, and still in later
     * releases). It takes two sockets to one peer, which UCX has where a
     * peer restarted on an old port counts its connections from 0 again
     * (docs/ucx.md, section 6). One event per poll never hands out an event
     * of a failed endpoint: failing one takes its socket out of the set.
     * UCX 1.13 applies the bare name to every transport with the key (its
     * CUDA copy transports too, which then take one completion per
     * progress call; Debian's UCX has none). */
    if (may_use_tcp(tls) && (st = config_default_tl(cfg, "TCP_", "MAX_POLL", "1")))
        goto out;

    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 1,
        .name = "gser",
    };
    if (!(st = GUX_CALL("ucp_init", ucp_init(&params, cfg, out))))
        *fifo = fifo_size;
out:
    ucp_config_release(cfg);
    return st;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void ctx_free(gser_ucx_context_t *ctx)
{
    if (ctx->secret)
        memset(ctx->secret, 0, ctx->secret_len);
    free(ctx->secret);
    free(ctx->transports);
    free(ctx->net_devices);
    free(ctx);
}

gser_status_t gser_ucx_context_create(const gser_ucx_context_options_t *opts, gser_ucx_context_t **ctx_out)
{
    gser_ucx_context_options_t o = GSER_UCX_CONTEXT_OPTIONS_INIT;
    gser_status_t rst;
    if (opts && (rst = gux_struct_read("gser_ucx_context_create", "gser_ucx_context_options_t", &o, sizeof o, opts)))
        return rst;
    if (!ctx_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_context_create: ctx_out is NULL");
    gux_error_clear();

    gser_status_t st;
    gser_ucx_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_context_create: out of memory");
    ctx->timeout_ms = o.peer_timeout_ms == GSER_UCX_PEER_TIMEOUT_NONE ? 0
                      : o.peer_timeout_ms                           ? o.peer_timeout_ms
                                                                    : GUX_DEFAULT_PEER_TIMEOUT_MS;
    ctx->handshake_ms = ctx->timeout_ms ? ctx->timeout_ms : GUX_DEFAULT_HANDSHAKE_MS;
    const char *secret = o.secret ? o.secret : getenv(GSER_UCX_SECRET_ENV);
    ctx->transports = dup_or_null(o.transports);
    ctx->net_devices = dup_or_null(o.net_devices);
    if (secret && *secret) {
        ctx->secret_len = strlen(secret);
        ctx->secret = malloc(ctx->secret_len);
        if (ctx->secret)
            memcpy(ctx->secret, secret, ctx->secret_len);
    }
    if ((o.transports && !ctx->transports) || (o.net_devices && !ctx->net_devices) ||
        (secret && *secret && !ctx->secret)) {
        st = gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_context_create: out of memory");
        goto fail_ctx;
    }
    if ((st = ctx_ucp_init(ctx, ctx->net_devices, NULL, &ctx->ucp, &ctx->mm_fifo)))
        goto fail_ctx;

    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if ((st = GUX_CALL("ucp_context_query", ucp_context_query(ctx->ucp, &attr))))
        goto fail_ucp;
    /* memory_types is a bitmask indexed by ucs_memory_type_t. */
    if (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA))
        ctx->caps |= GSER_UCX_CAP_CUDA;
    ctx->caps |= GUX_CODECS | GSER_UCX_CAP_CHUNKED; /* liblz4 and libzstd are linked into every build */
    *ctx_out = ctx;
    return GSER_OK;

fail_ucp:
    ucp_cleanup(ctx->ucp);
fail_ctx:
    ctx_free(ctx);
    return st;
}

void gser_ucx_context_destroy(gser_ucx_context_t *ctx)
{
    if (!ctx)
        return;
    ucp_cleanup(ctx->ucp);
    ctx_free(ctx);
}

uint32_t gser_ucx_context_get_caps(const gser_ucx_context_t *ctx)
{
    return ctx ? ctx->caps : 0;
}

/* ---- worker -------------------------------------------------------------------- */

/* How far the receive cache may grow by default: an eighth of physical
 * memory (256 MiB when that cannot be told). */
static size_t default_cache_max(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || size <= 0)
        return GUX_DEFAULT_RECV_CACHE;
    return (size_t)pages / 8 * (size_t)size;
}

static ucs_thread_mode_t thread_mode(gser_ucx_thread_mode_t m)
{
    switch (m) {
    case GSER_UCX_THREAD_SERIALIZED:
        return UCS_THREAD_MODE_SERIALIZED;
    case GSER_UCX_THREAD_MULTI:
        return UCS_THREAD_MODE_MULTI;
    default:
        return UCS_THREAD_MODE_SINGLE;
    }
}

/* The options of a new worker, defaults filled in (the limits follow the
 * gser context's where unset, so that a message it would refuse is refused
 * here before anything is allocated for it). */
static void worker_options_set(gser_ucx_worker_t *w, const gser_ucx_worker_options_t *o, const gser_limits_t *ol)
{
    w->thread_mode = o->thread_mode;
    w->blocking_sleep = o->blocking_sleep;
    w->gser_ctx = o->gser_ctx;
    gser_limits_t lim = {.size = sizeof(gser_limits_t), .max_frames = GUX_DEFAULT_MAX_FRAMES, .max_bytes = GUX_DEFAULT_MAX_BYTES};
    if (o->gser_ctx)
        gser_context_get_limits(o->gser_ctx, &lim);
    w->max_frames = ol->max_frames ? ol->max_frames : lim.max_frames;
    w->max_bytes = ol->max_bytes ? ol->max_bytes : lim.max_bytes;
    w->head_max = gux_head_max(w->max_frames, w->max_bytes);
    w->inline_budget = o->inline_budget ? o->inline_budget : GUX_DEFAULT_INLINE_BUDGET;
    w->inline_max = o->inline_max ? o->inline_max : GUX_DEFAULT_INLINE_MAX;
    if (w->inline_max > w->inline_budget)
        w->inline_max = w->inline_budget;
    w->chunk = o->staging_chunk ? o->staging_chunk : GUX_DEFAULT_CHUNK;
    w->depth = o->staging_depth ? o->staging_depth : GUX_DEFAULT_DEPTH;
    w->announce_version = GSER_UCX_WIRE_VERSION;
    w->announce_codecs = GUX_CODECS;
    w->announce_gser_version = GSER_WIRE_VERSION;
    w->compression = o->compression;
    w->compression_level = o->compression_level;
    w->announce_chunked = true;
    w->zchunk_min = o->chunked_min ? o->chunked_min : GSER_UCX_CHUNKED_MIN_DEFAULT;
    w->zchunk = o->chunked_size ? o->chunked_size : GSER_UCX_CHUNK_MAX;
    gux_list_init(&w->eps);
    gux_list_init(&w->listeners);
    gux_list_init(&w->recvs);
    gux_list_init(&w->ready);
    gux_list_init(&w->done);
    gux_list_init(&w->all);
}

/* The lock of a worker any thread may call into at once. */
static gser_status_t worker_lock_init(gser_ucx_worker_t *w)
{
    if (w->thread_mode != GSER_UCX_THREAD_MULTI)
        return GSER_OK;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE); /* callbacks may call back in */
    int rc = pthread_mutex_init(&w->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    if (rc)
        return gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_worker_create: pthread_mutex_init failed (%d)", rc);
    w->mt = true;
    return GSER_OK;
}

/* One fd for the application's event loop: UCX's own (once the worker
 * listens or connects), the timer, and gser's sockets. */
static gser_status_t worker_fds_init(gser_ucx_worker_t *w)
{
    w->efd = epoll_create1(EPOLL_CLOEXEC);
    w->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    w->timer_next = INFINITY;
    w->timer_set = NAN;
    struct epoll_event tev = {.events = EPOLLIN, .data.u64 = GUX_TAG_TIMER};
    if (w->efd < 0 || w->tfd < 0 || epoll_ctl(w->efd, EPOLL_CTL_ADD, w->tfd, &tev) != 0)
        return gux_fail(GSER_ERR_IO, "gser_ucx_worker_create: epoll or timerfd: %s", strerror(errno));
    return GSER_OK;
}

/* The receive cache. */
static gser_status_t worker_pool_init(gser_ucx_worker_t *w, const gser_ucx_worker_options_t *o)
{
    w->pool = gux_pool_create(o->recv_cache_bytes ? o->recv_cache_bytes : GUX_DEFAULT_RECV_CACHE,
                              o->recv_cache_bytes == 1 ? 0
                              : o->recv_cache_max_bytes ? o->recv_cache_max_bytes
                                                        : default_cache_max());
    return w->pool ? GSER_OK : gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_worker_create: out of memory");
}

/* Undo whatever of the above a worker that failed to start got. */
static void worker_unwind(gser_ucx_worker_t *w)
{
    if (w->pool)
        gux_pool_close(w->pool);
    if (w->tfd >= 0)
        close(w->tfd);
    if (w->efd >= 0)
        close(w->efd);
    if (w->mt)
        pthread_mutex_destroy(&w->lock);
    free(w);
}

gser_status_t gser_ucx_worker_create(gser_ucx_context_t *ctx, const gser_ucx_worker_options_t *opts,
                                     gser_ucx_worker_t **worker_out)
{
    gser_ucx_worker_options_t o = GSER_UCX_WORKER_OPTIONS_INIT;
    gser_limits_t ol = GSER_LIMITS_INIT;
    gser_status_t st;
    if (opts && (st = gux_struct_read("gser_ucx_worker_create", "gser_ucx_worker_options_t", &o, sizeof o, opts)))
        return st;
    if (o.limits && (st = gux_struct_read("gser_ucx_worker_create", "gser_limits_t", &ol, sizeof ol, o.limits)))
        return st;
    if (!ctx || !worker_out || (unsigned)o.thread_mode > GSER_UCX_THREAD_MULTI || o.staging_depth == 1)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_create: bad argument (staging_depth must be 0 or >= 2)");
    if ((unsigned)o.compression > GSER_UCX_COMPRESSION_ZSTD)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_create: compression %d is not a gser_ucx_compression_t",
                        o.compression);
    if (o.chunked_size && (o.chunked_size < GSER_UCX_CHUNK_MIN || o.chunked_size > GSER_UCX_CHUNK_MAX))
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_create: chunked_size %zu is outside %zu..%zu (or 0)",
                        o.chunked_size, GSER_UCX_CHUNK_MIN, GSER_UCX_CHUNK_MAX);
    if (o.staging_chunk > UINT32_MAX)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_create: staging_chunk must fit in 32 bits");
    gux_error_clear();

    gser_ucx_worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_worker_create: out of memory");
    w->ctx = ctx;
    w->efd = -1;
    w->tfd = -1;
    worker_options_set(w, &o, &ol);
    if ((st = worker_lock_init(w)) || (st = worker_fds_init(w)) || (st = worker_pool_init(w, &o)) ||
        (st = gux_staging_create(w))) {
        worker_unwind(w);
        return st;
    }
    *worker_out = w;
    return GSER_OK;
}

/* The network device that has the address sa, into dev. False for a
 * wildcard address or one no interface has. */
static bool sa_device(const struct sockaddr *sa, char dev[IF_NAMESIZE])
{
    const void *ip;
    size_t iplen;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
        if (s->sin_addr.s_addr == htonl(INADDR_ANY))
            return false;
        ip = &s->sin_addr, iplen = sizeof s->sin_addr;
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_UNSPECIFIED(&s->sin6_addr))
            return false;
        ip = &s->sin6_addr, iplen = sizeof s->sin6_addr;
    } else {
        return false;
    }
    struct ifaddrs *ifs, *i;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool found = false;
    for (i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != sa->sa_family)
            continue;
        const void *a = sa->sa_family == AF_INET ? (const void *)&((const struct sockaddr_in *)i->ifa_addr)->sin_addr
                                                 : (const void *)&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (memcmp(a, ip, iplen) == 0) {
            snprintf(dev, IF_NAMESIZE, "%s", i->ifa_name);
            found = true;
        }
    }
    freeifaddrs(ifs);
    return found;
}

gser_status_t gux_worker_ucx(gser_ucx_worker_t *w, const struct sockaddr *listen)
{
    if (w->ucp)
        return GSER_OK;
    gser_status_t st;
    ucp_context_h uctx = w->ctx->ucp;
    char dev[IF_NAMESIZE];
    /* Listening on one address opens no UCX port on other interfaces,
     * unless the user named the devices. */
    bool own = listen && !w->ctx->net_devices && !getenv("UCX_NET_DEVICES") && sa_device(listen, dev);
    const char *devs = own ? dev : w->ctx->net_devices; /* the worker's context's */
    uint32_t fifo = w->ctx->mm_fifo;
    if (own && (st = ctx_ucp_init(w->ctx, dev, NULL, &uctx, &fifo)))
        return st;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME,
        .thread_mode = thread_mode(w->thread_mode),
        .name = "gser",
    };
    int ufd = -1;
    void *snap = gux_filter_before();
    if ((st = GUX_CALL("ucp_worker_create", ucp_worker_create(uctx, &wp, &w->ucp)))) {
        /* posix shared memory keeps each worker's FIFO and receive buffers
         * in /dev/shm, which a container often has 64 MiB of (Docker's and
         * Kubernetes' default): a cluster's tenth process or so finds it
         * full, and UCX fails the worker. sysv's segments live elsewhere, so
         * where the user chose no transports the worker goes without posix
         * (peers on the host then meet on sysv). */
        if ((st != GSER_ERR_NO_MEMORY && st != GSER_ERR_UNSUPPORTED) || w->ctx->transports || getenv("UCX_TLS"))
            goto fail_ctx;
        if (own)
            ucp_cleanup(uctx);
        own = false;
        if ((st = ctx_ucp_init(w->ctx, devs, GUX_TLS_NO_POSIX, &uctx, &fifo)))
            goto fail_ctx;
        own = true;
        if ((st = GUX_CALL("ucp_worker_create", ucp_worker_create(uctx, &wp, &w->ucp))))
            goto fail_ctx;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = GUX_TAG_UCX};
    if ((st = GUX_CALL("ucp_worker_get_efd", ucp_worker_get_efd(w->ucp, &ufd))))
        goto fail_worker;
    if (epoll_ctl(w->efd, EPOLL_CTL_ADD, ufd, &ev) != 0) {
        st = gux_fail(GSER_ERR_IO, "epoll_ctl: %s", strerror(errno));
        goto fail_worker;
    }
    if ((st = GUX_CALL("ucp_worker_get_address", ucp_worker_get_address(w->ucp, &w->ucp_addr, &w->ucp_addr_len))))
        goto fail_worker;
    if (w->ucp_addr_len > GUX_ADDR_MAX) {
        st = gux_fail(GSER_ERR_UNSUPPORTED, "this UCX worker's address has %zu bytes, more than %d", w->ucp_addr_len,
                      GUX_ADDR_MAX);
        ucp_worker_release_address(w->ucp, w->ucp_addr);
        w->ucp_addr = NULL;
        goto fail_worker;
    }
    w->ucp_ctx = uctx;
    w->ucp_ctx_own = own;
    w->mm_fifo = fifo;
    gux_filter_after(w, snap); /* UCX's ports admit only peers gser admitted */
    return GSER_OK;
fail_worker:
    ucp_worker_destroy(w->ucp);
    w->ucp = NULL;
fail_ctx:
    gux_filter_after(w, snap);
    if (own)
        ucp_cleanup(uctx);
    return st;
}

static bool teardown_done(void *arg)
{
    gser_ucx_worker_t *w = arg;
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->close_req || ep->wireup_req || ep->ucp)
            return false;
    }
    /* Requests end first; then UCX gives back what it kept of them (sends
     * it held when it closed their endpoint, completed by its progress):
     * what it still has when its worker goes it never calls back, never
     * returns to its pools, and warns about. */
    for (gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        if (r->status == GSER_INPROGRESS || (r->outstanding && r->stage != GUX_RECV_DISCARD))
            return false;
    }
    return true;
}

static bool discards_done(void *arg)
{
    gser_ucx_worker_t *w = arg;
    for (gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        if (r->stage == GUX_RECV_DISCARD && r->outstanding)
            return false;
    }
    return true;
}

void gser_ucx_worker_destroy(gser_ucx_worker_t *w)
{
    if (!w)
        return;
    gux_lock(w);
    while (!gux_list_empty(&w->listeners))
        gser_ucx_listener_destroy(gux_container(w->listeners.next, gser_ucx_listener_t, wlink));
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next)
        gux_ep_shutdown(gux_container(n, gser_ucx_ep_t, wlink), GSER_ERR_CANCELED);
    /* receives from any endpoint that never matched */
    while (!gux_list_empty(&w->recvs))
        gux_req_complete(gux_container(w->recvs.next, gser_ucx_request_t, wlink), GSER_ERR_CANCELED);
    gux_wait(w, teardown_done, w, GUX_CLOSE_TIMEOUT_MS);
    /* Endpoints UCX could not close in steps (sends to a peer that took
     * nothing more within the bound): closed now, and UCX gets the rounds
     * in which it gives their sends back (docs/ucx.md: the risk left). */
    bool dropped = false;
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        dropped |= ep->ucp != NULL;
        gux_ep_ucp_drop(ep);
    }
    if (dropped)
        gux_wait(w, teardown_done, w, GUX_RELEASE_WAIT_MS);
    /* Messages nobody read: taken off UCX's queue, which would warn about
     * each, and given the rounds a large one's truncated receive needs. */
    if (gux_recv_purge(w, 0, 0))
        gux_wait(w, discards_done, w, GUX_CLOSE_TIMEOUT_MS);
    gux_completions_run(w);

    gux_staging_destroy(w);
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->close_req)
            ucp_request_free(ep->close_req);
        ep->close_req = NULL;
    }
    /* Give UCX back the requests it still runs for us: they make no more
     * callbacks, and UCX insists on getting them before its worker goes. */
    for (gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        for (size_t i = 0; i < r->nucx_reqs; i++)
            ucp_request_free(r->ucx_reqs[i]);
        r->nucx_reqs = 0;
    }
    gux_probe_close(w);
    /* After this no UCX callback can run; whatever UCX still held is ours. */
    if (w->ucp) {
        if (w->ucp_addr)
            ucp_worker_release_address(w->ucp, w->ucp_addr);
        ucp_worker_destroy(w->ucp);
        w->ucp = NULL;
        if (w->ucp_ctx_own)
            ucp_cleanup(w->ucp_ctx);
    }
    while (!gux_list_empty(&w->eps))
        gux_ep_free(gux_container(w->eps.next, gser_ucx_ep_t, wlink));
    while (!gux_list_empty(&w->all)) {
        gser_ucx_request_t *r = gux_container(w->all.next, gser_ucx_request_t, alink);
        gux_list_del(&r->alink);
        gux_list_del(&r->rlink);
        gux_list_del(&r->wlink);
        r->outstanding = 0;
        r->ep = NULL;
        r->worker = NULL; /* the caller may still test and free it */
        if (r->status == GSER_INPROGRESS)
            r->status = GSER_ERR_CANCELED;
        r->cb_queued = false;
        gux_req_release_if_idle(r);
    }
    gux_pool_close(w->pool);
    for (size_t i = 0; i < w->nreq_cache; i++)
        free(w->req_cache[i]);
    free(w->req_cache);
    gux_slots_free(&w->conn_ids);
    gux_slots_free(&w->io);
    free(w->allow);
    close(w->tfd);
    close(w->efd);
    gux_unlock(w);
    if (w->mt)
        pthread_mutex_destroy(&w->lock);
    free(w);
}

/* Once GUX_CTL_EVERY rounds have passed: is a look at the sockets due? */
static bool ctl_due(gser_ucx_worker_t *w)
{
    w->ctl_rounds = 0;
    return gux_now_ms() - w->ctl_last >= GUX_CTL_GAP_MS;
}

unsigned gux_progress(gser_ucx_worker_t *w)
{
    unsigned n = 0;
    /* Sockets first: a peer's end of file must not overtake the data it
     * sent before, which UCX's progress below still takes in. */
    if (w->ctl_now || (++w->ctl_rounds >= GUX_CTL_EVERY && ctl_due(w)))
        n += gux_ctl_progress(w);
    /* The queues are looked at here before any call: most rounds find
     * them empty. */
    if (w->ucp) {
        n += ucp_worker_progress(w->ucp);
        w->rounds++;
        if (!gux_list_empty(&w->ready))
            gux_ready_process(w);
        if (!gux_list_empty(&w->recvs))
            n += gux_recvs_match(w);
        if (w->staging)
            n += gux_staging_progress(w);
    }
    if (!gux_list_empty(&w->ready))
        gux_ready_process(w);
    /* After the data that arrived before a failure has been matched. */
    if (w->eps_dirty) {
        gux_eps_process(w);
        gux_ready_process(w);
    }
    n += w->events;
    w->events = 0;
    if (!gux_list_empty(&w->done))
        gux_completions_run(w);
    return n;
}

gser_status_t gser_ucx_worker_get_cache_stats(gser_ucx_worker_t *w, gser_ucx_cache_stats_t *out)
{
    if (!w || !out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_get_cache_stats: NULL argument");
    gser_ucx_cache_stats_t s = GSER_UCX_CACHE_STATS_INIT;
    gux_pool_stats(w->pool, &s);
    return gux_struct_write("gser_ucx_worker_get_cache_stats", "out", "GSER_UCX_CACHE_STATS_INIT", out, &s, sizeof s);
}

gser_status_t gser_ucx_worker_get_status(gser_ucx_worker_t *w)
{
    if (!w)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_get_status: worker is NULL");
    gux_lock(w);
    gser_status_t st = w->broken ? gux_fail(w->broken, "%s", w->broken_why)
                       : w->probe.deadline ? GSER_INPROGRESS
                                           : GSER_OK;
    gux_unlock(w);
    return st;
}

gser_status_t gser_ucx_worker_check_queue(gser_ucx_worker_t *w)
{
    if (!w)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_check_queue: worker is NULL");
    gux_lock(w);
    gux_probe_start(w);
    gux_unlock(w);
    return GSER_OK;
}

gser_status_t gser_ucx_worker_set_check_fault(gser_ucx_worker_t *w, int on)
{
    if (!w)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_set_check_fault: worker is NULL");
    w->probe_fault = on != 0;
    return GSER_OK;
}

gser_status_t gser_ucx_worker_set_announce_version(gser_ucx_worker_t *w, uint32_t version)
{
    if (!w)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_set_announce_version: NULL worker");
    w->announce_version = version ? version : GSER_UCX_WIRE_VERSION;
    return GSER_OK;
}

unsigned gser_ucx_worker_progress(gser_ucx_worker_t *w)
{
    if (!w)
        return 0;
    gux_lock(w);
    unsigned n = gux_progress(w);
    gux_unlock(w);
    return n;
}

gser_status_t gser_ucx_worker_get_efd(gser_ucx_worker_t *w, int *fd_out)
{
    if (!w || !fd_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_get_efd: bad argument");
    *fd_out = w->efd;
    return GSER_OK;
}

/* The timer fd set to timer_next, unless it holds that deadline already
 * (one system call less per arm: most arms find it unchanged). */
static void arm_timer(gser_ucx_worker_t *w)
{
    if (w->timer_next == w->timer_set && (isinf(w->timer_next) || w->timer_next > gux_now_ms()))
        return;
    gux_ctl_arm_timer(w);
    w->timer_set = w->timer_next;
}

/* Whether nothing UCX does needs progress that its event fd would not
 * announce: no operation of a request under way (a send that UCX queued for
 * lack of resources, frames of a receive on the way) and every endpoint
 * ready, none connecting, flushing or closing. Receives waiting for a
 * message are quiet: an arrival wakes the fd. */
static bool ucx_quiet(gser_ucx_worker_t *w)
{
    /* A worker with many connections (a scheduler's) takes UCX's arm
     * rather than walk them all at every arm. */
    unsigned budget = GUX_QUIET_WALK;
    for (gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        if (r->outstanding || r->posting || !--budget)
            return false;
    }
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->state != GUX_EP_READY || ep->close_req || ep->flush_req || ep->ucp_release || !--budget)
            return false;
    }
    return true;
}

/* Lock held. */
static gser_status_t arm(gser_ucx_worker_t *w)
{
    /* Work we queued ourselves, and device copies of staged frames, do not
     * show on the fd. */
    if (!gux_list_empty(&w->ready) || !gux_list_empty(&w->done) || w->eps_dirty || w->ctl_now ||
        gux_staging_copying(w))
        return GSER_INPROGRESS;
    struct epoll_event ev;
    if (w->ucp && w->armed_ucp == w->ucp && ucx_quiet(w)) {
        /* Armed before, and the fd has not fired since: UCX is still armed
         * (what arrived since would have made the fd readable), so one
         * look at the fd replaces UCX's arm, which drains its fds (two or
         * three system calls). Every send and receive arms again, most of
         * them right after the last arm. */
        arm_timer(w);
        if (epoll_wait(w->efd, &ev, 1, 0) == 0)
            return GSER_OK;
    }
    w->armed_ucp = NULL;
    if (w->ucp) {
        ucs_status_t s = ucp_worker_arm(w->ucp);
        if (s == UCS_ERR_BUSY)
            return GSER_INPROGRESS;
        if (s != UCS_OK)
            return GUX_CALL("ucp_worker_arm", s);
    }
    arm_timer(w);
    /* Something ready already (a socket of gser's, the timer, UCX's fd):
     * work now, and the next round looks at gser's sockets. The set is
     * level-triggered, so a wake-up by a socket is seen here too: the
     * rounds between wake-ups (a send, a receive posted) need no look. */
    if (epoll_wait(w->efd, &ev, 1, 0) > 0) {
        w->ctl_now = true;
        return GSER_INPROGRESS;
    }
    w->armed_ucp = w->ucp;
    return GSER_OK;
}

gser_status_t gser_ucx_worker_arm(gser_ucx_worker_t *w)
{
    if (!w)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_arm: worker is NULL");
    gux_lock(w);
    gser_status_t st = arm(w);
    gux_unlock(w);
    return st;
}

/* Sleep on the event fd for at most ms, the lock released meanwhile. */
static void sleep_on_fd(gser_ucx_worker_t *w, double ms)
{
    if (arm(w) != GSER_OK)
        return;
    int t = ms > GUX_SLEEP_SLICE_MS ? GUX_SLEEP_SLICE_MS : (int)ms + 1;
    struct pollfd p = {.fd = w->efd, .events = POLLIN};
    gux_unlock(w);
    poll(&p, 1, t);
    gux_lock(w);
    w->ctl_now = true; /* woken: whatever woke it gets looked at in the next round */
}

gser_status_t gux_wait(gser_ucx_worker_t *w, bool (*done)(void *arg), void *arg, int timeout_ms)
{
    /* Reading the clock costs as much as a progress round: a wait over in
     * its first round (most of a small message's) never reads it, the
     * deadline counts from the end of that round, and polling looks every
     * few rounds only. A zero timeout needs no clock: 16 rounds. */
    double deadline = -1;
    unsigned idle = 0;
    for (unsigned round = 1;; round++) {
        if (done && done(arg))
            return GSER_OK;
        unsigned n = gux_progress(w);
        if (done ? done(arg) : n > 0)
            return GSER_OK;
        idle = n ? 0 : idle + 1;
        bool sleep = !n && (w->blocking_sleep || idle > GUX_SPIN_ROUNDS);
        if (sleep || round % 16 == 0 || (round == 1 && timeout_ms > 0)) {
            double left = timeout_ms < 0 ? 1e9 : 0;
            if (timeout_ms > 0) {
                double now = gux_now_ms();
                if (deadline < 0)
                    deadline = now + timeout_ms;
                left = deadline - now;
            }
            if (left <= 0)
                return GSER_ERR_TIMEOUT;
            if (sleep) {
                sleep_on_fd(w, left);
                continue;
            }
        }
        if (w->mt) {
            gux_unlock(w); /* let other threads in between rounds */
            gux_lock(w);
        }
    }
}

gser_status_t gser_ucx_worker_wait(gser_ucx_worker_t *w, int timeout_ms)
{
    if (!w)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_wait: worker is NULL");
    gux_lock(w);
    gser_status_t st = gux_wait(w, NULL, NULL, timeout_ms);
    gux_unlock(w);
    if (st == GSER_ERR_TIMEOUT)
        gux_fail(st, "gser_ucx_worker_wait: nothing happened in %d ms", timeout_ms);
    return st;
}
