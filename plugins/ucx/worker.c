/* Transport contexts and workers: UCX initialisation, progress, the event
 * file descriptor and bounded waits. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
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

double gux_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- context ----------------------------------------------------------------- */

/* Set a UCX configuration value unless the user's environment already did. */
static gser_status_t config_default(ucp_config_t *cfg, const char *name, const char *value, bool override)
{
    char env[128];
    snprintf(env, sizeof env, "UCX_%s", name);
    if (!override && getenv(env))
        return GSER_OK;
    return GUX_CALL("ucp_config_modify", ucp_config_modify(cfg, name, value));
}

/* Whether the transport list may include posix or sysv (UCX warns about
 * settings for transports it does not load). */
static bool may_use_shm(const char *tls)
{
    if (!tls)
        tls = getenv("UCX_TLS");
    if (!tls || tls[0] == '^')
        return true;
    const char *names[] = {"all", "sm", "shm", "posix", "sysv", "mm"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i]);
        for (const char *p = tls; (p = strstr(p, names[i])); p += n)
            if ((p == tls || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
                return true;
    }
    return false;
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
    ucp_config_t *cfg = NULL;
    gser_ucx_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_context_create: out of memory");
    if ((st = GUX_CALL("ucp_config_read", ucp_config_read(NULL, NULL, &cfg))))
        goto fail_ctx;
    if (o.transports && (st = config_default(cfg, "TLS", o.transports, true)))
        goto fail_cfg;
    char ka[32];
    snprintf(ka, sizeof ka, "%ums", o.peer_timeout_ms ? o.peer_timeout_ms : GUX_DEFAULT_PEER_TIMEOUT_MS);
    if ((st = config_default(cfg, "KEEPALIVE_INTERVAL", ka, o.peer_timeout_ms != 0)))
        goto fail_cfg;
    /* Endpoints use peer error handling (a dead peer must fail what is
     * pending, not hang it); UCX's shared-memory transports take part in
     * that only when asked. */
    if (may_use_shm(o.transports) && !getenv("UCX_POSIX_ERROR_HANDLING") && !getenv("UCX_SYSV_ERROR_HANDLING") &&
        (st = config_default(cfg, "MM_ERROR_HANDLING", "y", false))) /* posix and sysv share it */
        goto fail_cfg;
    /* Endpoints connected through a listener get tcp's put emulation, which
     * UCX then picks for rendezvous: slower than its active-message
     * rendezvous on tcp, and for local peers it takes large messages off
     * shared memory. Without it the lanes are those of address-connected
     * endpoints (what ucx_perftest measures). */
    if (!getenv("UCX_TCP_PUT_ENABLE") && (st = config_default(cfg, "PUT_ENABLE", "n", false))) /* tcp's */
        goto fail_cfg;

    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 1,
        .name = "gser",
    };
    if ((st = GUX_CALL("ucp_init", ucp_init(&params, cfg, &ctx->ucp))))
        goto fail_cfg;
    ucp_config_release(cfg);

    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES | UCP_ATTR_FIELD_REQUEST_SIZE};
    if ((st = GUX_CALL("ucp_context_query", ucp_context_query(ctx->ucp, &attr))))
        goto fail_ucp;
    /* memory_types is a bitmask indexed by ucs_memory_type_t. */
    if (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA))
        ctx->caps |= GSER_UCX_CAP_CUDA;
    ctx->ucp_request_size = attr.request_size;
    *ctx_out = ctx;
    return GSER_OK;

fail_ucp:
    ucp_cleanup(ctx->ucp);
    free(ctx);
    return st;
fail_cfg:
    ucp_config_release(cfg);
fail_ctx:
    free(ctx);
    return st;
}

void gser_ucx_context_destroy(gser_ucx_context_t *ctx)
{
    if (!ctx)
        return;
    ucp_cleanup(ctx->ucp);
    free(ctx);
}

uint32_t gser_ucx_context_get_caps(const gser_ucx_context_t *ctx)
{
    return ctx ? ctx->caps : 0;
}

/* ---- worker -------------------------------------------------------------------- */

void gux_lock(gser_ucx_worker_t *w)
{
    if (w->mt)
        pthread_mutex_lock(&w->lock);
}

void gux_unlock(gser_ucx_worker_t *w)
{
    if (w->mt)
        pthread_mutex_unlock(&w->lock);
}

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

gser_status_t gser_ucx_worker_create(gser_ucx_context_t *ctx, const gser_ucx_worker_options_t *opts,
                                     gser_ucx_worker_t **worker_out)
{
    gser_ucx_worker_options_t o = GSER_UCX_WORKER_OPTIONS_INIT;
    gser_limits_t ol = GSER_LIMITS_INIT;
    gser_status_t rst;
    if (opts && (rst = gux_struct_read("gser_ucx_worker_create", "gser_ucx_worker_options_t", &o, sizeof o, opts)))
        return rst;
    if (o.limits && (rst = gux_struct_read("gser_ucx_worker_create", "gser_limits_t", &ol, sizeof ol, o.limits)))
        return rst;
    if (!ctx || !worker_out || (unsigned)o.thread_mode > GSER_UCX_THREAD_MULTI || o.staging_depth == 1)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_create: bad argument (staging_depth must be 0 or >= 2)");
    if (o.staging_chunk > UINT32_MAX)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_create: staging_chunk must fit in 32 bits");
    gux_error_clear();

    gser_status_t st;
    gser_ucx_worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_worker_create: out of memory");
    w->ctx = ctx;
    w->efd = -1;
    w->blocking_sleep = o.blocking_sleep;
    w->gser_ctx = o.gser_ctx;
    /* Unset limits follow the gser context's, so that a message it would
     * refuse is refused here before anything is allocated for it. */
    gser_limits_t lim = {.size = sizeof(gser_limits_t), .max_frames = GUX_DEFAULT_MAX_FRAMES, .max_bytes = GUX_DEFAULT_MAX_BYTES};
    if (o.gser_ctx)
        gser_context_get_limits(o.gser_ctx, &lim);
    w->max_frames = ol.max_frames ? ol.max_frames : lim.max_frames;
    w->max_bytes = ol.max_bytes ? ol.max_bytes : lim.max_bytes;
    w->inline_budget = o.inline_budget ? o.inline_budget : GUX_DEFAULT_INLINE_BUDGET;
    w->inline_max = o.inline_max ? o.inline_max : GUX_DEFAULT_INLINE_MAX;
    if (w->inline_max > w->inline_budget)
        w->inline_max = w->inline_budget;
    w->chunk = o.staging_chunk ? o.staging_chunk : GUX_DEFAULT_CHUNK;
    w->depth = o.staging_depth ? o.staging_depth : GUX_DEFAULT_DEPTH;
    w->announce_version = GSER_UCX_WIRE_VERSION;
    gux_list_init(&w->eps);
    gux_list_init(&w->listeners);
    gux_list_init(&w->recvs);
    gux_list_init(&w->ready);
    gux_list_init(&w->done);
    gux_list_init(&w->all);

    if (o.thread_mode == GSER_UCX_THREAD_MULTI) {
        pthread_mutexattr_t ma;
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE); /* callbacks may call back in */
        int rc = pthread_mutex_init(&w->lock, &ma);
        pthread_mutexattr_destroy(&ma);
        if (rc) {
            st = gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_worker_create: pthread_mutex_init failed (%d)", rc);
            goto fail_w;
        }
        w->mt = true;
    }

    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME,
        .thread_mode = thread_mode(o.thread_mode),
        .name = "gser",
    };
    if ((st = GUX_CALL("ucp_worker_create", ucp_worker_create(ctx->ucp, &wp, &w->ucp))))
        goto fail_lock;
    if ((st = GUX_CALL("ucp_worker_get_efd", ucp_worker_get_efd(w->ucp, &w->efd))))
        goto fail_ucp;
    w->pool = gux_pool_create(o.recv_cache_bytes ? o.recv_cache_bytes : GUX_DEFAULT_RECV_CACHE,
                              o.recv_cache_bytes == 1 ? 0
                              : o.recv_cache_max_bytes ? o.recv_cache_max_bytes
                                                       : default_cache_max());
    if (!w->pool) {
        st = gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_worker_create: out of memory");
        goto fail_ucp;
    }
    if ((st = gux_staging_create(w))) {
        gux_pool_close(w->pool);
        goto fail_ucp;
    }
    *worker_out = w;
    return GSER_OK;

fail_ucp:
    ucp_worker_destroy(w->ucp);
fail_lock:
    if (w->mt)
        pthread_mutex_destroy(&w->lock);
fail_w:
    free(w);
    return st;
}

static bool teardown_done(void *arg)
{
    gser_ucx_worker_t *w = arg;
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->close_req || ep->hs_pending)
            return false;
    }
    /* Parts of requests that already ended (sends UCX kept when it closed
     * their endpoint) are not waited for: the worker's end takes them. */
    for (gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        if (r->status == GSER_INPROGRESS)
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
        gux_ep_shutdown(gux_container(n, gser_ucx_ep_t, wlink), GSER_ERR_CANCELED, true);
    /* receives from any endpoint that never matched */
    while (!gux_list_empty(&w->recvs))
        gux_req_complete(gux_container(w->recvs.next, gser_ucx_request_t, wlink), GSER_ERR_CANCELED);
    gux_wait(w, teardown_done, w, GUX_CLOSE_TIMEOUT_MS);
    gux_completions_run(w);

    gux_staging_destroy(w);
    /* Give UCX back the requests it still runs for us: they make no more
     * callbacks, and UCX insists on getting them before its worker goes. */
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->close_req)
            ucp_request_free(ep->close_req);
        ep->close_req = NULL;
    }
    for (gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        for (size_t i = 0; i < r->nucx_reqs; i++)
            ucp_request_free(r->ucx_reqs[i]);
        r->nucx_reqs = 0;
    }
    /* After this no UCX callback can run; whatever UCX still held is ours. */
    ucp_worker_destroy(w->ucp);
    w->ucp = NULL;
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
    free(w->conn_reqs);
    free(w->slots);
    free(w->slot_gen);
    gux_unlock(w);
    if (w->mt)
        pthread_mutex_destroy(&w->lock);
    free(w);
}

unsigned gux_progress(gser_ucx_worker_t *w)
{
    unsigned n = ucp_worker_progress(w->ucp);
    if (w->nconn_reqs)
        gux_conn_reqs_process(w);
    gux_ready_process(w);
    n += gux_recvs_match(w);
    if (w->staging)
        n += gux_staging_progress(w);
    gux_ready_process(w);
    /* After the data that arrived before a failure has been matched. */
    if (w->eps_dirty)
        gux_eps_process(w);
    gux_ready_process(w);
    n += w->events;
    w->events = 0;
    gux_completions_run(w);
    return n;
}

gser_status_t gser_ucx_worker_get_cache_stats(gser_ucx_worker_t *w, gser_ucx_cache_stats_t *out)
{
    if (!w || !out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_get_cache_stats: NULL argument");
    gser_ucx_cache_stats_t s = GSER_UCX_CACHE_STATS_INIT;
    gux_pool_stats(w->pool, &s);
    if (gser_struct_write(out, &s, sizeof s))
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_get_cache_stats: out->size is 0: use GSER_UCX_CACHE_STATS_INIT");
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

/* Lock held. */
static gser_status_t arm(gser_ucx_worker_t *w)
{
    /* Work we queued ourselves, and device copies of staged frames, do not
     * show on the fd. */
    if (!gux_list_empty(&w->ready) || !gux_list_empty(&w->done) || w->nconn_reqs || w->eps_dirty ||
        gux_staging_copying(w))
        return GSER_INPROGRESS;
    ucs_status_t s = ucp_worker_arm(w->ucp);
    if (s == UCS_ERR_BUSY)
        return GSER_INPROGRESS;
    return GUX_CALL("ucp_worker_arm", s);
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
}

gser_status_t gux_wait(gser_ucx_worker_t *w, bool (*done)(void *arg), void *arg, int timeout_ms)
{
    double deadline = timeout_ms < 0 ? 0 : gux_now_ms() + timeout_ms;
    unsigned idle = 0;
    for (unsigned round = 1;; round++) {
        if (done && done(arg))
            return GSER_OK;
        unsigned n = gux_progress(w);
        if (done ? done(arg) : n > 0)
            return GSER_OK;
        idle = n ? 0 : idle + 1;
        bool sleep = !n && (w->blocking_sleep || idle > GUX_SPIN_ROUNDS);
        /* Reading the clock costs as much as a progress round: while
         * polling, look at it every few rounds only. */
        if (sleep || round % 16 == 0) {
            double left = timeout_ms < 0 ? 1e9 : deadline - gux_now_ms();
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
