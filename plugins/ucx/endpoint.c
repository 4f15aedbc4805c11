/* Listeners, connections, the handshake, and endpoint failure and teardown. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "internal.h"

gser_ucx_ep_t *gux_ep_lookup(gser_ucx_worker_t *w, uint32_t id)
{
    return gux_slot_get(&w->conn_ids, id);
}

/* ---- endpoint objects -------------------------------------------------------------------- */

gser_status_t gux_ep_new(gser_ucx_worker_t *w, gser_ucx_ep_t **out)
{
    if (w->broken)
        return gux_fail(w->broken, "%s", w->broken_why);
    gser_ucx_ep_t *ep = calloc(1, sizeof *ep);
    if (!ep)
        return gux_fail(GSER_ERR_NO_MEMORY, "endpoint: out of memory");
    ep->worker = w;
    ep->state = GUX_EP_CONNECTING;
    ep->ctl.io.fd = -1;
    gux_list_init(&ep->reqs);
    gux_list_init(&ep->alink);
    gser_status_t st = gux_slot_take(&w->conn_ids, ep, &ep->local_id);
    if (st) {
        free(ep);
        return st;
    }
    gux_list_push(&w->eps, &ep->wlink);
    *out = ep;
    return GSER_OK;
}

void gux_ep_admitted(gser_ucx_ep_t *ep)
{
    if (!ep->admitting)
        return;
    ep->admitting = false;
    if (ep->listener)
        ep->listener->nadmitting--;
}

void gux_ep_free(gser_ucx_ep_t *ep)
{
    gux_ep_admitted(ep);
    gux_ctl_close(ep, 0, 0);
    gux_filter_release(ep);
    /* What the peer sent that nobody read would stay with UCX until the
     * worker goes, and after 4096 reuses of the slot its id comes back. */
    if (ep->local_id)
        gux_recv_purge(ep->worker, gux_tag(ep->local_id, 0, 0), GUX_TAG_MASK_CONN);
    gux_slot_put(&ep->worker->conn_ids, ep->local_id);
    gux_list_del(&ep->wlink);
    gux_list_del(&ep->alink);
    /* Requests that outlive the endpoint no longer point at it. */
    while (!gux_list_empty(&ep->reqs)) {
        gser_ucx_request_t *r = gux_container(ep->reqs.next, gser_ucx_request_t, elink);
        gux_list_del(&r->elink);
        r->ep = NULL;
    }
    free(ep);
}

static void err_cb(void *arg, ucp_ep_h uep, ucs_status_t status)
{
    (void)uep;
    gser_ucx_ep_t *ep = arg;
    if (!ep->ucx_failed) {
        ep->ucx_failed = true;
        ep->ucx_error = status;
    }
    ep->worker->eps_dirty = true;
}

/* ---- UCX's endpoint: closed only when its tcp transport can take it ----------------------
 *
 * UCX's tcp transport (1.13.1, unchanged up to 1.22) cannot close an
 * endpoint while a send is still going out through it: uct_tcp_ep_destroy
 * then queues its goodbye (CONN_FIN) behind a send buffer that its purge
 * marked done but never emptied, so the goodbye never goes and the
 * endpoint stays registered for writing; when the peer's own goodbye (or
 * its end of the socket) arrives, UCX frees the endpoint in the read half
 * of that event and uses it in the write half, or aborts on the queued
 * goodbye (docs/ucx.md, "Closing over tcp"). So UCX's endpoint is closed
 * in steps:
 *   1. wanted closed (ucp_release): nothing new is posted on it;
 *   2. parked until UCX gave back every send posted on it (the peer read
 *      or discarded them, or the connection failed) and, on the side that
 *      discards, until the peer's messages stopped coming (a peer still
 *      sending needs this side's endpoint to finish its sends);
 *   3. flushed: a tcp flush ends when the peer acknowledged all it got,
 *      so every send buffer is empty and the goodbye goes at once;
 *   4. closed (FORCE: its lanes are idle by then).
 * An endpoint UCX reported failed is closed at once: UCX has torn its
 * lanes down itself (the path a killed peer takes, which never broke); so
 * is one without a tcp lane (shared memory has no such fault, and does not
 * notice a killed peer). A flush after the peer's bye is bounded: the
 * peer's goodbye leaves this side's endpoint send-only, which never hears
 * the flush back and which UCX destroys at once, saying nothing. */

static void close_cb(void *req, ucs_status_t status, void *user_data)
{
    (void)status;
    gser_ucx_ep_t *ep = user_data;
    ucp_request_free(req);
    ep->close_req = NULL;
    ep->worker->eps_dirty = true;
}

static void ep_ucp_close_now(gser_ucx_ep_t *ep)
{
    if (!ep->ucp)
        return;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = close_cb,
        .user_data = ep,
    };
    ucp_ep_h uep = ep->ucp;
    ep->ucp = NULL;
    ep->ucp_release = false;
    ep->ucp_closed_round = ep->worker->rounds;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(uep, &p);
    if (UCS_PTR_IS_PTR(sp))
        ep->close_req = sp;
}

static void release_flush_cb(void *req, ucs_status_t status, void *user_data)
{
    (void)status; /* failed: UCX failed the endpoint and tears its lanes down itself */
    gser_ucx_ep_t *ep = user_data;
    ucp_request_free(req);
    ep->flush_req = NULL;
    ep->ucp_flushed = true;
    ep->worker->eps_dirty = true;
}

/* Whether UCX still holds a send posted on ep. */
static bool ep_sends_held(const gser_ucx_ep_t *ep)
{
    for (const gux_list_t *n = ep->reqs.next; n != &ep->reqs; n = n->next) {
        const gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        if (r->kind == GUX_REQ_SEND && r->outstanding)
            return true;
    }
    return false;
}

/* Whether a discarded message is still being received: its sender's send
 * ends only then. */
static bool discards_running(const gser_ucx_worker_t *w)
{
    for (const gux_list_t *n = w->all.next; n != &w->all; n = n->next) {
        const gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, alink);
        if (r->stage == GUX_RECV_DISCARD && r->outstanding)
            return true;
    }
    return false;
}

/* UCX's description of ep's lanes (ucp_ep_print_info: one line per lane,
 * "<resource>:<transport>/<device>"), to free; NULL if it could not be had. */
static char *ep_lanes_text(gser_ucx_ep_t *ep)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    ucp_ep_print_info(ep->ucp, f);
    fclose(f);
    if (text && getenv("GSER_UCX_DEBUG_LANES"))
        fprintf(stderr, "gser: endpoint lanes:\n%s", text);
    return text;
}

/* Whether UCX connected ep through its tcp transport (a lane of it):
 * only that transport has the fault; over shared memory UCX does not see
 * a killed peer, and the steps would wait for it for good. */
static bool ep_on_tcp(gser_ucx_ep_t *ep)
{
    if (!ep->lanes_known && ep->wired && ep->ucp) {
        char *text = ep_lanes_text(ep);
        ep->on_tcp = !text || strstr(text, ":tcp/") != NULL; /* when in doubt: the steps are safe anywhere */
        free(text);
        ep->lanes_known = true;
    }
    return ep->on_tcp;
}

/* UCX's shared-memory transports that send through the peer's FIFO (each
 * an "mm" transport: UCX_<NAME>_FIFO_SIZE inherits UCX_MM_FIFO_SIZE). */
static const char *const fifo_tls[] = {":posix/", ":sysv/", ":xpmem/"};

/* Once UCX has connected ep (its lanes are known) and before it is ready:
 * a peer whose shared-memory FIFO size differs from this side's is refused
 * where a lane goes through shared memory, as UCX's sender indexes the
 * peer's FIFO by its own size (docs/ucx.md, section 2.4). Nothing has
 * gone through a FIFO by then: UCX 1.13 connects shared memory from the
 * worker address without a message of its own (no mm send on either side
 * before either check, counted), and the caller's first message waits for
 * the ready state. Between hosts (tcp lanes) sizes may differ. Both sides
 * check their own lanes: the server before its ready record. */
static gser_status_t fifo_check(gser_ucx_ep_t *ep)
{
    if (ep->peer.mm_fifo_size == ep->worker->mm_fifo)
        return GSER_OK;
    char *text = ep_lanes_text(ep);
    const char *tl = NULL;
    for (size_t i = 0; text && !tl && i < sizeof fifo_tls / sizeof fifo_tls[0]; i++)
        if (strstr(text, fifo_tls[i]))
            tl = fifo_tls[i];
    free(text);
    if (!text)
        return gux_fifo_mismatch(ep, "what UCX did not describe"); /* when in doubt: refused */
    if (!tl)
        return GSER_OK;
    char name[8];
    snprintf(name, sizeof name, "%.*s", (int)strlen(tl) - 2, tl + 1);
    return gux_fifo_mismatch(ep, name);
}

/* Take ep's UCX endpoint the next step towards its close (see above). */
static void ep_ucp_release_step(gser_ucx_ep_t *ep)
{
    gser_ucx_worker_t *w = ep->worker;
    if (!ep->ucp || !ep->ucp_release)
        return;
    if (ep->ucx_failed || !ep->wired || !ep_on_tcp(ep)) {
        ep_ucp_close_now(ep); /* nothing of ours goes through it */
        return;
    }
    if (ep->flush_req) {
        /* A peer that said bye closed its side first: once its goodbye is
         * in, this side's endpoint only sends, its flush never hears back,
         * and UCX destroys it at once (no goodbye of its own): safe. A
         * peer that is stopped gets no such bound (docs/ucx.md). */
        if (!ep->peer_sent_known || gux_now_ms() < ep->flush_started + GUX_RELEASE_WAIT_MS) {
            if (ep->peer_sent_known)
                w->eps_dirty = true; /* look again */
            return; /* else its callback comes back here */
        }
        ucp_request_free(ep->flush_req); /* no callback after this */
        ep->flush_req = NULL;
        ep->ucp_flushed = true;
    }
    if (!ep->ucp_flushed) {
        if (ep_sends_held(ep))
            return; /* parked: gux_send_cb comes back here */
        /* What the peer still sends is read and dropped, so that its sends
         * end before this side's goodbye (unless the caller still takes
         * the messages the peer sent whole). */
        double now = gux_now_ms();
        bool unread = ep->state == GUX_EP_CLOSED || !ep->user_owned || ep->zombie || !ep->drain;
        if (unread && !ep->drain_until && gux_recv_purge(w, gux_tag(ep->local_id, 0, 0), GUX_TAG_MASK_CONN))
            ep->last_purge = now;
        if (now < ep->last_purge + GUX_LOST_GRACE_MS || discards_running(w)) {
            w->eps_dirty = true; /* look again */
            return;
        }
        ucp_request_param_t p = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = release_flush_cb,
            .user_data = ep,
        };
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(ep->ucp, &p);
        if (UCS_PTR_IS_PTR(sp)) {
            ep->flush_req = sp;
            ep->flush_started = now;
            if (ep->peer_sent_known)
                w->eps_dirty = true;
            return;
        }
        ep->ucp_flushed = true; /* done at once, or failed (UCX failed the endpoint) */
    }
    ep_ucp_close_now(ep);
}

/* Start closing UCX's endpoint of ep (the steps above). */
static void ep_ucp_close(gser_ucx_ep_t *ep)
{
    if (!ep->ucp || ep->ucp_release)
        return;
    ep->ucp_release = true;
    ep->ucp_closed_round = ep->worker->rounds; /* nothing of ours goes out on it any more */
    /* The peer failed or left: what it sent before may still be on the
     * way (a rendezvous whose sender waits for this side's answer), and it
     * is taken and dropped before the goodbye. */
    if (ep->state == GUX_EP_FAILED)
        ep->last_purge = gux_now_ms();
    ep_ucp_release_step(ep);
}

void gux_ep_ucp_drop(gser_ucx_ep_t *ep)
{
    if (ep->flush_req) {
        ucp_request_free(ep->flush_req); /* no callback after this */
        ep->flush_req = NULL;
    }
    ep_ucp_close_now(ep);
}

/* Whether a request on ep is still running. */
static bool ep_busy(const gser_ucx_ep_t *ep)
{
    for (const gux_list_t *n = ep->reqs.next; n != &ep->reqs; n = n->next) {
        const gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        if (r->status == GSER_INPROGRESS)
            return true;
    }
    return false;
}

/* Sends UCX did not give back when it closed ep: UCX 1.13 leaves
 * rendezvous sends that wait for the peer out of its purge. The connection
 * is gone, so their bytes are not read any more; they end here with the
 * endpoint's status, and UCX's parts of them (if it ever finishes them)
 * drain into the request, which lives until then or until the worker goes. */
static void ep_abandon_sends(gser_ucx_ep_t *ep)
{
    /* A peer that failed (silent, cut off, or gone) may never take the
     * rest: its sends end now even while UCX's endpoint waits for its
     * close (endpoint.c's steps), bounded as before; UCX may still read
     * their buffers if the peer comes back (docs/ucx.md). */
    bool parked = ep->ucp && ep->ucp_release && ep->state == GUX_EP_FAILED;
    if ((ep->ucp && !parked) || ep->close_req)
        return;
    gux_list_t *n = ep->reqs.next;
    while (n != &ep->reqs) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        n = n->next;
        if (r->kind != GUX_REQ_SEND || r->status != GSER_INPROGRESS)
            continue;
        gux_staging_abandon(r);
        gux_req_complete(r, r->fail_status ? r->fail_status : ep->error);
    }
}

/* Whether UCX has given back every operation of the requests on ep:
 * those it kept when it closed ep (rendezvous sends still waiting for the
 * peer) come back only through its progress, after its close of the
 * endpoint has gone through. */
static bool ep_released(void *arg)
{
    const gser_ucx_ep_t *ep = arg;
    for (const gux_list_t *n = ep->reqs.next; n != &ep->reqs; n = n->next)
        if (gux_container(n, gser_ucx_request_t, elink)->outstanding)
            return false;
    return true;
}

static bool ep_closed(void *arg)
{
    gser_ucx_ep_t *ep = arg;
    return !ep->ucp && !ep->close_req;
}

static bool ep_quiet(void *arg)
{
    gser_ucx_ep_t *ep = arg;
    return !ep->ucp && !ep->close_req && !ep->flush_req && !ep->wireup_req && !ep_busy(ep);
}

/* Whether message msg_no is one the peer said it sent whole before it
 * closed (its bye): those are delivered. */
static bool peer_sent_it(const gser_ucx_ep_t *ep, uint32_t msg_no)
{
    return ep->peer_sent_known && (int32_t)(msg_no - ep->peer_sent) < 0;
}

/* End every request in flight on ep with st. keep_recvs: receives waiting
 * for a head stay (they may still get messages that arrived whole), and
 * so do receives halfway through a message the peer sent whole. */
static void ep_abort_reqs(gser_ucx_ep_t *ep, gser_status_t st, bool keep_recvs)
{
    gux_list_t *n = ep->reqs.next;
    while (n != &ep->reqs) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        n = n->next;
        if (r->status != GSER_INPROGRESS)
            continue;
        if (r->kind == GUX_REQ_RECV && r->stage == GUX_RECV_WAIT_HEAD) {
            if (!keep_recvs)
                gux_req_complete(r, st);
        } else if (!(keep_recvs && r->kind == GUX_REQ_RECV && ep->drain_until && peer_sent_it(ep, r->msg_no))) {
            gux_req_abort(r, st);
        }
    }
}

uint32_t gux_ep_sent_whole(const gser_ucx_ep_t *ep)
{
    uint32_t n = ep->send_seq;
    for (const gux_list_t *l = ep->reqs.next; l != &ep->reqs; l = l->next) {
        const gser_ucx_request_t *r = gux_container(l, gser_ucx_request_t, elink);
        if (r->kind == GUX_REQ_SEND && r->status == GSER_INPROGRESS && (int32_t)(r->msg_no - n) < 0)
            n = r->msg_no;
    }
    return n;
}

gser_status_t gux_ep_part_error(gser_ucx_ep_t *ep, ucs_status_t st, const char *what)
{
    if (ep && ep->state >= GUX_EP_FAILED)
        return gux_fail(ep->error, "%s: %s", what, ep->why);
    /* We cancel UCX operations only when closing: a cancel we did not ask
     * for is UCX purging an endpoint whose peer is gone (its error handler
     * may not have been handled yet). */
    if ((ep && ep->ucx_failed) || st == UCS_ERR_CANCELED)
        return gux_fail(GSER_ERR_CONNECTION, "%s: connection to the peer lost: %s", what,
                        ucs_status_string(ep && ep->ucx_failed ? ep->ucx_error : st));
    return GUX_CALL(what, st);
}

/* Keep the message that explains why ep ended, for whatever ends with it. */
static void ep_why(gser_ucx_ep_t *ep, const char *msg)
{
    snprintf(ep->why, sizeof ep->why, "%s", msg);
}

void gux_ep_fail_bye(gser_ucx_ep_t *ep, gser_status_t st, unsigned bye, uint64_t value)
{
    if (ep->state >= GUX_EP_FAILED)
        return;
    char msg[sizeof ep->why];
    snprintf(msg, sizeof msg, "%s", gser_ucx_get_last_error());
    ep_why(ep, msg[0] ? msg : gser_status_str(st));
    ep->state = GUX_EP_FAILED;
    ep->error = st;
    /* A peer that went away may have sent whole messages first: receives
     * still get those (gux_recvs_match probes once more before failing). */
    ep->drain = st == GSER_ERR_CONNECTION;
    /* A peer that closed said how many it sent (its bye): UCX's endpoint
     * stays open until they are in (they may still be in UCX's shared
     * memory queue, or arriving), bounded by the peer timeout. */
    gser_ucx_worker_t *w = ep->worker;
    if (ep->drain && !bye && ep->peer_sent_known && ep->ucp && !ep->ucx_failed) {
        unsigned ms = w->ctx->timeout_ms ? w->ctx->timeout_ms : GUX_DEFAULT_HANDSHAKE_MS;
        ep->drain_until = gux_now_ms() + ms;
        if (ep->drain_until < w->timer_next)
            w->timer_next = ep->drain_until;
    }
    w->eps_dirty = true;
    ep_abort_reqs(ep, st, ep->drain);
    gux_ctl_close(ep, bye, value); /* the peer hears why, if it still listens */
    if (bye || ep->ucx_failed || !ep->ucp)
        ep_ucp_close(ep);
    else if (!ep->drain_until)
        ep->lost_at = gux_now_ms(); /* see ep_process */
    gux_fail(st, "%s", msg);
}

void gux_ep_lost(gser_ucx_ep_t *ep, gser_status_t st)
{
    gux_ep_fail_bye(ep, st, 0, 0);
    gux_probe_start(ep->worker); /* a peer that died mid-send may have blocked the receive queue */
}

void gux_ep_fail(gser_ucx_ep_t *ep, gser_status_t st)
{
    gux_ep_fail_bye(ep, st, GUX_BYE_ERROR, (uint64_t) - (int64_t)st);
}

void gux_ep_shutdown(gser_ucx_ep_t *ep, gser_status_t st)
{
    if (ep->state < GUX_EP_FAILED) {
        ep->state = GUX_EP_CLOSED;
        ep->error = st;
        ep_why(ep, st == GSER_ERR_TIMEOUT ? "the endpoint was closed after a send timed out"
                                          : "the endpoint was closed by this side");
    }
    ep->drain = false;
    ep->drain_until = 0;
    /* The peer delivers what went out whole before it reports the close. */
    uint32_t sent = gux_ep_sent_whole(ep);
    ep_abort_reqs(ep, st, false);
    gux_ctl_close(ep, GUX_BYE_CLOSING, sent);
    ep_ucp_close(ep);
    gux_ep_admitted(ep);
    if (ep->listener) {
        gux_list_del(&ep->alink);
        ep->listener = NULL;
    }
    ep->worker->eps_dirty = true;
}

static void wireup_cb(void *req, ucs_status_t status, void *user_data)
{
    gser_ucx_ep_t *ep = user_data;
    ucp_request_free(req);
    ep->wireup_req = NULL;
    if (status == UCS_OK) {
        ep->wired = true;
    } else if (!ep->ucx_failed) {
        ep->ucx_failed = true;
        ep->ucx_error = status;
    }
    ep->worker->eps_dirty = true;
}

gser_status_t gux_ep_ucx_connect(gser_ucx_ep_t *ep, const void *addr)
{
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = err_cb, .arg = ep},
    };
    gser_status_t st = GUX_CALL("handshake: ucp_ep_create", ucp_ep_create(ep->worker->ucp, &p, &ep->ucp));
    if (st)
        return st;
    /* Ready once UCX has connected the endpoint (a flush completes then), as
     * both sides are still driving progress for the handshake: a first send
     * then completes without waiting for the peer's progress. */
    ucp_request_param_t fp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = wireup_cb,
        .user_data = ep,
    };
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(ep->ucp, &fp);
    if (UCS_PTR_IS_ERR(sp))
        return GUX_CALL("handshake: ucp_ep_flush_nbx", UCS_PTR_STATUS(sp));
    if (sp)
        ep->wireup_req = sp;
    else
        ep->wired = true;
    ep->worker->eps_dirty = true;
    return GSER_OK;
}

/* ---- listener bookkeeping ---------------------------------------------------------------- */

/* A peer's failure as accept reports it: never in the listener's own class
 * (gser_ucx_status_is_peer_error), whatever went wrong inside. */
static gser_status_t peer_status(gser_status_t st)
{
    return gser_ucx_status_is_peer_error(st) ? st : GSER_ERR_CONNECTION;
}

bool gser_ucx_status_is_peer_error(gser_status_t st)
{
    return st != GSER_OK && st != GSER_ERR_INVALID_ARG && st != GSER_ERR_STATE;
}

static void failure_push(gser_ucx_listener_t *l, gser_status_t st, const char *why)
{
    st = peer_status(st);
    if (l->nfailures == l->failures_cap) {
        size_t cap = l->failures_cap ? l->failures_cap * 2 : 4;
        gux_failure_t *f = realloc(l->failures, cap * sizeof *f);
        if (!f)
            return; /* the failure goes unreported; the connection is still cleaned up */
        l->failures = f;
        l->failures_cap = cap;
    }
    gux_failure_t *f = &l->failures[l->nfailures++];
    f->st = st;
    snprintf(f->why, sizeof f->why, "%s", why && *why ? why : gser_status_str(st));
}

/* Take the oldest failure off l's list; the thread's last error says why. */
static gser_status_t failure_pop(gser_ucx_listener_t *l)
{
    gux_failure_t f = l->failures[0];
    memmove(l->failures, l->failures + 1, --l->nfailures * sizeof *l->failures);
    return gux_fail(f.st, "accept: a connection failed its handshake (the listener goes on): %s", f.why);
}

void gux_listener_failure(gser_ucx_listener_t *l, gser_status_t st, const char *why)
{
    /* Reported from gux_eps_process (a callback must not run in the middle
     * of the socket work that found the failure). */
    failure_push(l, st, why);
    l->worker->eps_dirty = true;
}

/* Returns whether a user callback ran. */
static bool listener_report(gser_ucx_listener_t *l, gser_ucx_ep_t *ep)
{
    ep->hs_reported = true;
    ep->listener = NULL;
    if (ep->state == GUX_EP_READY) {
        l->stats.accepted++;
        if (l->cb) {
            ep->user_owned = true;
            l->cb(l, ep, GSER_OK, l->user_data);
            return true;
        }
        ep->listener = l;
        gux_list_push(&l->accepted, &ep->alink);
        return false;
    }
    l->stats.failed++;
    if (l->cb) {
        gser_status_t st = gux_fail(peer_status(ep->error),
                                    "accept: a connection failed its handshake (the listener goes on): %s", ep->why);
        l->cb(l, NULL, st, l->user_data);
        return true;
    }
    failure_push(l, ep->error, ep->why);
    return false;
}

/* Failures of handshakes that ended before an endpoint existed, to a
 * listener's callback. Returns whether one ran. */
static bool listeners_report(gser_ucx_worker_t *w)
{
    for (gux_list_t *n = w->listeners.next; n != &w->listeners; n = n->next) {
        gser_ucx_listener_t *l = gux_container(n, gser_ucx_listener_t, wlink);
        if (l->cb && l->nfailures) {
            gser_status_t st = failure_pop(l);
            l->cb(l, NULL, st, l->user_data);
            return true;
        }
    }
    return false;
}

/* Whether every message the peer sent before it closed has been received
 * or is being received from what UCX already holds. */
static bool ep_drained(const gser_ucx_ep_t *ep)
{
    if (peer_sent_it(ep, ep->heads))
        return false;
    for (const gux_list_t *n = ep->reqs.next; n != &ep->reqs; n = n->next) {
        const gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        if (r->kind == GUX_REQ_RECV && r->status == GSER_INPROGRESS && r->stage != GUX_RECV_WAIT_HEAD)
            return false;
    }
    return true;
}

/* Stop waiting for the messages the peer said it sent: they are in, UCX
 * reported the peer's end gone (nothing more will come), or the wait ran
 * out. UCX's endpoint closes. Receives still waiting or halfway through a
 * message have matched all UCX holds: what they wait for does not come.
 * Later receives still get messages that are whole in UCX's queue. */
static void ep_drain_end(gser_ucx_ep_t *ep)
{
    ep->drain_until = 0;
    ep->lost_at = gux_now_ms();
    uint32_t first = ep->heads; /* the first message not received whole */
    bool waiting = false;
    for (const gux_list_t *n = ep->reqs.next; n != &ep->reqs; n = n->next) {
        const gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        if (r->kind != GUX_REQ_RECV || r->status != GSER_INPROGRESS)
            continue;
        waiting = true;
        if (r->stage != GUX_RECV_WAIT_HEAD && (int32_t)(r->msg_no - first) < 0)
            first = r->msg_no;
    }
    if (!waiting)
        return;
    if (peer_sent_it(ep, first)) {
        size_t len = strlen(ep->why);
        snprintf(ep->why + len, sizeof ep->why - len,
                 "; of the %u messages it sent, those from number %u on did not arrive (%s)", ep->peer_sent, first,
                 ep->ucx_failed ? "UCX reported the peer's end gone" : "not within the peer timeout");
    }
    ep_abort_reqs(ep, ep->error, false);
}

/* A peer that went away without a count (it died, or failed the
 * connection) may leave a message torn: its head taken, its frames never
 * coming. Once UCX's endpoint is closed and UCX has progressed since (all
 * that had arrived is matched), such a receive fails; it would otherwise
 * wait for its timeout, or forever. */
static void ep_fail_torn(gser_ucx_ep_t *ep)
{
    if (!ep->drain || ep->drain_until || ep->ucp)
        return;
    gser_ucx_worker_t *w = ep->worker;
    gux_list_t *n = ep->reqs.next;
    while (n != &ep->reqs) {
        gser_ucx_request_t *r = gux_container(n, gser_ucx_request_t, elink);
        n = n->next;
        if (r->kind != GUX_REQ_RECV || r->status != GSER_INPROGRESS || r->stage == GUX_RECV_WAIT_HEAD)
            continue;
        uint64_t since = r->head_round > ep->ucp_closed_round ? r->head_round : ep->ucp_closed_round;
        if (w->rounds < since + 2) {
            w->eps_dirty = true; /* look again after UCX progressed */
            continue;
        }
        gux_fail(ep->error, "receive: %s; message %u had started and the rest of it did not arrive", ep->why,
                 r->msg_no);
        gux_req_abort(r, ep->error);
    }
}

/* Returns whether a user callback ran (the endpoint list may have changed). */
static bool ep_process(gser_ucx_ep_t *ep)
{
    gser_ucx_worker_t *w = ep->worker;
    /* UCX saw the peer go: the control connection may say why (a bye). */
    if (ep->state < GUX_EP_FAILED && ep->ucx_failed)
        gux_ctl_read_now(ep);
    if (ep->state < GUX_EP_FAILED && ep->ucx_failed) {
        gux_fail(GSER_ERR_CONNECTION, "connection to the peer %s lost: %s", ep->ctl.peer_name,
                 ucs_status_string(ep->ucx_error));
        gux_ep_fail(ep, GSER_ERR_CONNECTION);
        gux_probe_start(w); /* as in gux_ep_lost */
    }
    if (ep->state == GUX_EP_CONNECTING && ep->wired && !ep->fifo_checked) {
        gser_status_t st = fifo_check(ep);
        ep->fifo_checked = true;
        if (st)
            gux_ep_fail(ep, st);
    }
    /* Ready when UCX has connected both ends: the client learns of the
     * server's end from its ready record, so that both are ready when the
     * connecting call returns. */
    if (ep->state == GUX_EP_CONNECTING && ep->wired && (ep->ctl.server || ep->peer_ready)) {
        gser_status_t st = ep->ctl.server ? gux_ctl_ready(ep) : GSER_OK;
        if (st)
            gux_ep_fail(ep, st);
        else
            ep->state = GUX_EP_READY;
    }
    if (ep->drain_until && (ep_drained(ep) || ep->ucx_failed || gux_now_ms() >= ep->drain_until))
        ep_drain_end(ep);
    /* The peer left, as its control connection said: UCX's endpoint is
     * closed once UCX saw it too (closing it while UCX still handles the
     * peer's end of a transfer trips UCX 1.13's tcp transport), or after a
     * grace period when UCX does not notice (a stopped peer). */
    if (ep->state == GUX_EP_FAILED && ep->ucp && ep->lost_at) {
        if (ep->ucx_failed || gux_now_ms() >= ep->lost_at + GUX_LOST_GRACE_MS)
            ep_ucp_close(ep);
        else
            w->eps_dirty = true;
    }
    ep_ucp_release_step(ep);
    if (ep->state >= GUX_EP_FAILED) {
        ep_abandon_sends(ep);
        ep_fail_torn(ep);
    }
    if (ep->state != GUX_EP_CONNECTING)
        gux_ep_admitted(ep);
    if (ep->listener && !ep->hs_reported && ep->state != GUX_EP_CONNECTING && listener_report(ep->listener, ep))
        return true;
    if ((ep->user_owned && !ep->zombie) || ep->listener)
        return false;
    /* Ours alone: not handed out (its listener went away or its handshake
     * failed) or destroyed by the caller while UCX still held parts of it. */
    if (ep->state < GUX_EP_FAILED)
        gux_ep_shutdown(ep, GSER_ERR_CANCELED);
    if (ep->state >= GUX_EP_FAILED && ep_quiet(ep))
        gux_ep_free(ep);
    else if (!ep->ucp)
        w->eps_dirty = true; /* look again after the next progress */
    /* (a UCX endpoint on its way to its close: its steps say when to look) */
    return false;
}

void gux_eps_process(gser_ucx_worker_t *w)
{
    w->eps_dirty = false;
    while (listeners_report(w))
        ;
    gux_list_t *n = w->eps.next;
    while (n != &w->eps) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        n = n->next;
        if (ep_process(ep))
            n = w->eps.next; /* a callback ran: start over (reported endpoints are skipped) */
    }
}

/* ---- listeners --------------------------------------------------------------------------- */

static gser_status_t resolve(const char *host, uint16_t port, bool passive, struct sockaddr_storage *out,
                             socklen_t *len)
{
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    if (passive && !host)
        hints.ai_family = AF_INET;
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc || !res)
        return gux_fail(GSER_ERR_INVALID_ARG, "cannot resolve \"%s\": %s", host ? host : "*", gai_strerror(rc));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return GSER_OK;
}

gser_status_t gser_ucx_listener_create(gser_ucx_worker_t *w, const gser_ucx_listener_options_t *opts,
                                       gser_ucx_listener_t **listener_out)
{
    gser_ucx_listener_options_t o = GSER_UCX_LISTENER_OPTIONS_INIT;
    gser_status_t rst;
    if (opts && (rst = gux_struct_read("gser_ucx_listener_create", "gser_ucx_listener_options_t", &o, sizeof o, opts)))
        return rst;
    if (!w || !listener_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_listener_create: bad argument");
    gux_error_clear();
    struct sockaddr_storage sa;
    socklen_t salen;
    gser_status_t st = resolve(o.address, o.port, true, &sa, &salen);
    if (st)
        return st;
    gser_ucx_listener_t *l = calloc(1, sizeof *l);
    if (!l)
        return gux_fail(GSER_ERR_NO_MEMORY, "listener: out of memory");
    l->worker = w;
    l->io.fd = -1;
    l->cb = o.accept_cb;
    l->user_data = o.user_data;
    l->stats.size = sizeof l->stats;
    gux_list_init(&l->accepted);
    gux_list_init(&l->pending);
    gux_lock(w);
    /* UCX comes first: its network devices follow this address. */
    if ((st = gux_worker_ucx(w, (const struct sockaddr *)&sa)) || (st = gux_ctl_listen(l, (struct sockaddr *)&sa, salen)))
        goto fail;
    gux_list_push(&w->listeners, &l->wlink);
    gux_unlock(w);
    *listener_out = l;
    return GSER_OK;
fail:
    gux_unlock(w);
    free(l);
    return st;
}

uint16_t gser_ucx_listener_get_port(const gser_ucx_listener_t *l)
{
    return l ? l->port : 0;
}

gser_status_t gser_ucx_listener_get_stats(const gser_ucx_listener_t *l, gser_ucx_listener_stats_t *out)
{
    if (!l || !out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_listener_get_stats: NULL argument");
    gux_lock(l->worker);
    gser_ucx_listener_stats_t s = l->stats;
    s.pending = l->npending + l->nadmitting;
    gux_unlock(l->worker);
    return gux_struct_write("gser_ucx_listener_get_stats", "out", "GSER_UCX_LISTENER_STATS_INIT", out, &s, sizeof s);
}

static bool accept_ready(void *arg)
{
    gser_ucx_listener_t *l = arg;
    return !gux_list_empty(&l->accepted) || l->nfailures || l->worker->broken;
}

gser_status_t gser_ucx_listener_accept(gser_ucx_listener_t *l, int timeout_ms, gser_ucx_ep_t **ep_out)
{
    if (!l || !ep_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_listener_accept: bad argument");
    gser_ucx_worker_t *w = l->worker;
    gux_lock(w);
    gux_error_clear();
    gser_status_t st = gux_wait(w, accept_ready, l, timeout_ms);
    if (st) {
        gux_fail(st, "accept: no connection within %d ms", timeout_ms);
        goto out;
    }
    if (l->nfailures) {
        st = failure_pop(l);
        goto out;
    }
    if (gux_list_empty(&l->accepted)) { /* only a failed worker ends the wait with neither */
        st = gux_fail(GSER_ERR_STATE, "accept: the listener's worker failed for good: %s", w->broken_why);
        goto out;
    }
    gser_ucx_ep_t *ep = gux_container(l->accepted.next, gser_ucx_ep_t, alink);
    gux_list_del(&ep->alink);
    ep->listener = NULL;
    ep->user_owned = true;
    *ep_out = ep;
out:
    gux_unlock(w);
    return st;
}

void gser_ucx_listener_destroy(gser_ucx_listener_t *l)
{
    if (!l)
        return;
    gser_ucx_worker_t *w = l->worker;
    gux_lock(w);
    gux_ctl_unlisten(l);
    /* Endpoints accepted but not taken, and handshakes still running. */
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->listener == l) {
            gux_list_del(&ep->alink);
            ep->admitting = false;
            ep->listener = NULL;
            ep->hs_reported = true;
            w->eps_dirty = true;
        }
    }
    gux_list_del(&l->wlink);
    free(l->failures);
    free(l);
    gux_unlock(w);
}

/* ---- connecting -------------------------------------------------------------------------- */

gser_status_t gser_ucx_ep_connect_nb(gser_ucx_worker_t *w, const char *host, uint16_t port, gser_ucx_ep_t **ep_out)
{
    if (!w || !host || !ep_out || port == 0)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_connect_nb: bad argument");
    gux_error_clear();
    struct sockaddr_storage sa;
    socklen_t salen;
    gser_status_t st = resolve(host, port, false, &sa, &salen);
    if (st)
        return st;
    char name[300];
    snprintf(name, sizeof name, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    gux_lock(w);
    gser_ucx_ep_t *ep;
    if ((st = gux_worker_ucx(w, NULL)) || (st = gux_ep_new(w, &ep)))
        goto out;
    ep->user_owned = true;
    if ((st = gux_ctl_connect(ep, (struct sockaddr *)&sa, salen, name))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gser_ucx_get_last_error());
        gux_unlock(w);
        gser_ucx_ep_destroy(ep);
        return gux_fail(st, "%s", msg);
    }
    *ep_out = ep;
out:
    gux_unlock(w);
    return st;
}

static bool ep_settled(void *arg)
{
    return ((gser_ucx_ep_t *)arg)->state != GUX_EP_CONNECTING;
}

gser_status_t gser_ucx_ep_connect(gser_ucx_worker_t *w, const char *host, uint16_t port, int timeout_ms,
                                  gser_ucx_ep_t **ep_out)
{
    gser_ucx_ep_t *ep;
    gser_status_t st = gser_ucx_ep_connect_nb(w, host, port, &ep);
    if (st)
        return st;
    gux_lock(w);
    st = gux_wait(w, ep_settled, ep, timeout_ms);
    if (st)
        gux_fail(st, "connect to %s:%u: no handshake within %d ms", host, port, timeout_ms);
    else if (ep->state != GUX_EP_READY)
        st = gux_fail(ep->error, "%s", ep->why);
    gux_unlock(w);
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", gser_ucx_get_last_error());
        gser_ucx_ep_destroy(ep);
        return gux_fail(st, "%s", msg);
    }
    *ep_out = ep;
    return GSER_OK;
}

gser_status_t gser_ucx_ep_get_status(const gser_ucx_ep_t *ep)
{
    if (!ep)
        return GSER_ERR_INVALID_ARG;
    switch (ep->state) {
    case GUX_EP_CONNECTING:
        return GSER_INPROGRESS;
    case GUX_EP_READY:
        return GSER_OK;
    default:
        /* The reason in words too: which side lacks the secret, ... */
        return ep->why[0] ? gux_fail(ep->error, "%s", ep->why) : ep->error;
    }
}

gser_status_t gser_ucx_ep_get_peer_info(const gser_ucx_ep_t *ep, gser_ucx_peer_info_t *info)
{
    if (!ep || !info)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_get_peer_info: bad argument");
    if (!ep->peer_known)
        return gux_fail(GSER_ERR_STATE, "gser_ucx_ep_get_peer_info: the handshake is not done");
    gser_ucx_peer_info_t p = ep->peer;
    p.size = sizeof p;
    return gux_struct_write("gser_ucx_ep_get_peer_info", "info", "GSER_UCX_PEER_INFO_INIT", info, &p, sizeof p);
}

/* ---- compression ------------------------------------------------------------------------- */

bool gux_host_is_local(const char *host, const char *local)
{
    if (!host || !*host)
        return false;
    if (local && *local && strcmp(host, local) == 0)
        return true;
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) != 1)
        return false;
    static const unsigned char loop6[16] = {[15] = 1};
    static const unsigned char mapped[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(a, loop6, 16) == 0 || (memcmp(a, mapped, 12) == 0 && a[12] == 127);
}

int gux_ep_codec(const gser_ucx_ep_t *ep)
{
    const gser_ucx_worker_t *w = ep->worker;
    if (!ep->peer_known || ep->peer.gser_wire_version < 3)
        return GSER_COMPRESSION_NONE; /* the peer reads no compressed frame */
    uint32_t both = w->announce_codecs & ep->peer.caps & GUX_CODECS;
    int mode = ep->compression_set ? ep->compression : w->compression;
    if (mode == GSER_UCX_COMPRESSION_DEFAULT)
        mode = gux_host_is_local(ep->peer.peer_host, ep->peer.local_host) ? GSER_UCX_COMPRESSION_NONE
                                                                        : GSER_UCX_COMPRESSION_AUTO;
    switch (mode) {
    case GSER_UCX_COMPRESSION_AUTO:
        /* the link's last decision (link.c), while its codec is still on */
        if (ep->link.decided)
            return ep->link.last == GSER_COMPRESSION_LZ4 && (both & GSER_UCX_CAP_LZ4)    ? GSER_COMPRESSION_LZ4
                   : ep->link.last == GSER_COMPRESSION_ZSTD && (both & GSER_UCX_CAP_ZSTD) ? GSER_COMPRESSION_ZSTD
                                                                                          : GSER_COMPRESSION_NONE;
        return (both & GSER_UCX_CAP_LZ4) ? GSER_COMPRESSION_LZ4
               : (both & GSER_UCX_CAP_ZSTD) ? GSER_COMPRESSION_ZSTD
                                            : GSER_COMPRESSION_NONE;
    case GSER_UCX_COMPRESSION_LZ4:
        return (both & GSER_UCX_CAP_LZ4) ? GSER_COMPRESSION_LZ4 : GSER_COMPRESSION_NONE;
    case GSER_UCX_COMPRESSION_ZSTD:
        return (both & GSER_UCX_CAP_ZSTD) ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_NONE;
    default:
        return GSER_COMPRESSION_NONE;
    }
}

void gux_worker_set_announce_codecs(gser_ucx_worker_t *w, uint32_t codecs)
{
    w->announce_codecs = codecs & GUX_CODECS;
}

void gux_worker_set_announce_chunked(gser_ucx_worker_t *w, bool on)
{
    w->announce_chunked = on;
}

bool gux_ep_chunked(const gser_ucx_ep_t *ep)
{
    const gser_ucx_worker_t *w = ep->worker;
    return ep->peer_known && w->announce_chunked && (ep->peer.caps & GSER_UCX_CAP_CHUNKED) &&
           w->zchunk_min != SIZE_MAX;
}

gser_status_t gser_ucx_ep_get_chunk_stats(const gser_ucx_ep_t *ep, gser_ucx_chunk_stats_t *out)
{
    if (!ep || !out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_get_chunk_stats: NULL argument");
    gser_ucx_worker_t *w = ep->worker;
    gux_lock(w);
    gser_ucx_chunk_stats_t s = ep->zstats;
    gux_unlock(w);
    s.size = sizeof s;
    return gux_struct_write("gser_ucx_ep_get_chunk_stats", "out", "GSER_UCX_CHUNK_STATS_INIT", out, &s, sizeof s);
}

void gux_worker_set_announce_gser_version(gser_ucx_worker_t *w, uint32_t version)
{
    w->announce_gser_version = version ? version : GSER_WIRE_VERSION;
}

gser_status_t gser_ucx_ep_set_compression(gser_ucx_ep_t *ep, int compression)
{
    if (!ep || (unsigned)compression > GSER_UCX_COMPRESSION_ZSTD)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_set_compression: %s",
                        ep ? "not a gser_ucx_compression_t" : "endpoint is NULL");
    gux_lock(ep->worker);
    ep->compression = compression;
    ep->compression_set = true;
    gux_unlock(ep->worker);
    return GSER_OK;
}

gser_status_t gser_ucx_ep_get_compression(const gser_ucx_ep_t *ep, int *codec_out)
{
    if (!ep || !codec_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_get_compression: bad argument");
    if (!ep->peer_known)
        return gux_fail(GSER_ERR_STATE, "gser_ucx_ep_get_compression: the handshake is not done");
    *codec_out = gux_ep_codec(ep);
    return GSER_OK;
}

gser_ucx_worker_t *gser_ucx_ep_get_worker(const gser_ucx_ep_t *ep)
{
    return ep ? ep->worker : NULL;
}

/* ---- closing ----------------------------------------------------------------------------- */

/* UCX tears a connection down in its progress: give it a few rounds so
 * that the peer hears of it even if this worker goes idle now. */
static void settle(gser_ucx_worker_t *w)
{
    double end = gux_now_ms() + GUX_SETTLE_MS;
    unsigned quiet = 0;
    while (quiet < 8 && gux_now_ms() < end)
        quiet = gux_progress(w) ? 0 : quiet + 1;
}

typedef struct flush_wait {
    const gser_ucx_ep_t *ep;
    bool done;
} flush_wait_t;

static void flush_cb(void *req, ucs_status_t status, void *user_data)
{
    (void)req;
    (void)status;
    ((flush_wait_t *)user_data)->done = true;
}

static bool flushed_or_gone(void *arg)
{
    const flush_wait_t *f = arg;
    return f->done || f->ep->state != GUX_EP_READY;
}

/* Before hanging up with nothing in flight: what was sent reaches the
 * peer. A send completes when UCX took its bytes, and on tcp the last ones
 * may still be in UCX's buffers, which closing drops; UCX's tcp flush
 * waits for the peer's acknowledgement. Bounded; cut short when the peer
 * leaves. With sends in flight there is no flush: they are canceled, and
 * a flush would wait for them. */
static void ep_flush_sent(gser_ucx_ep_t *ep)
{
    gser_ucx_worker_t *w = ep->worker;
    if (ep->state != GUX_EP_READY || ep_busy(ep) || !ep->ucp)
        return;
    flush_wait_t f = {ep, false};
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = flush_cb,
        .user_data = &f,
    };
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(ep->ucp, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        char keep[512];
        snprintf(keep, sizeof keep, "%s", gser_ucx_get_last_error());
        GUX_CALL("close: ucp_ep_flush_nbx", UCS_PTR_STATUS(sp)); /* the hang-up goes on */
        gux_fail(GSER_OK, "%s", keep);
        return;
    }
    if (sp) {
        gux_wait(w, flushed_or_gone, &f, GUX_CLOSE_TIMEOUT_MS);
        ucp_request_free(sp); /* no callback after this, done or not */
    }
}

/* Close ep, the worker locked: what was sent flushed when nothing is in
 * flight, the rest canceled, and what UCX kept of the sends given back
 * (each wait bounded). */
static void ep_close_locked(gser_ucx_worker_t *w, gser_ucx_ep_t *ep)
{
    ep_flush_sent(ep);
    /* A peer that failed (or went silent) does not take the rest of what
     * was sent: its UCX endpoint closes later, in the worker's progress. */
    bool failed = ep->state == GUX_EP_FAILED;
    gux_ep_shutdown(ep, GSER_ERR_CANCELED);
    /* Sends complete once UCX hands their buffers back: the peer takes
     * them, or the connection fails; bounded, then they end canceled while
     * UCX's endpoint waits on (docs/ucx.md, "Closing over tcp"). */
    gux_wait(w, ep_closed, ep, failed ? GUX_SETTLE_MS : GUX_RELEASE_WAIT_MS);
    /* A healthy peer that took nothing more within the bound (one in this
     * thread, not driven): closed at once, as before issue 38, so that
     * the sends end with UCX done with their buffers. The fault needs that
     * peer to close its side while this one's goodbye is stuck: the risk
     * left (docs/ucx.md). A failed peer's sends ended already; its UCX
     * endpoint keeps to its steps. */
    if (!failed && ep->ucp) {
        ep_ucp_close_now(ep);
        gux_wait(w, ep_closed, ep, GUX_CLOSE_TIMEOUT_MS);
    }
    ep_abandon_sends(ep);
    gux_wait(w, ep_quiet, ep, ep->ucp ? 0 : GUX_CLOSE_TIMEOUT_MS);
    /* What UCX kept of the sends comes back before the endpoint goes, so
     * that nothing of it stays with the worker (bounded: a peer that does
     * not progress, its shared-memory queue full, holds it until it runs). */
    gux_wait(w, ep_released, ep, ep->ucp ? 0 : GUX_RELEASE_WAIT_MS);
    settle(w);
    gux_completions_run(w);
}

gser_status_t gser_ucx_ep_close(gser_ucx_ep_t *ep)
{
    if (!ep)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_close: ep is NULL");
    gser_ucx_worker_t *w = ep->worker;
    gux_lock(w);
    ep_close_locked(w, ep);
    gux_unlock(w);
    return GSER_OK;
}

void gser_ucx_ep_destroy(gser_ucx_ep_t *ep)
{
    if (!ep)
        return;
    gser_ucx_worker_t *w = ep->worker;
    gux_lock(w);
    ep_close_locked(w, ep);
    ep->user_owned = false;
    if (ep_quiet(ep)) {
        gux_ep_free(ep);
    } else {
        ep->zombie = true; /* UCX still holds parts of it: freed when it lets go */
        w->eps_dirty = true;
    }
    gux_unlock(w);
}
