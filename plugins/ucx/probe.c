/* The worker's own receive queue, checked after a peer died.
 *
 * Over shared memory every local sender writes into this worker's one
 * receive queue: it reserves a slot, copies its data in, then marks the
 * slot ready, and UCX reads the slots in order. A sender killed between
 * the reservation and the mark blocks the queue for good (UCX 1.13): no
 * message from any local peer arrives again, and nothing in UCX says so.
 * So when a peer dies, the worker sends itself a message over its own
 * address (UCX connects a worker to itself over shared memory when peer
 * error handling is on) and, if it does not arrive in time while the
 * worker progresses, fails for good, every endpoint with it, saying why.
 * docs/ucx.md, section 6. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Long and many enough that a worker only slowed down by a loaded machine
 * is never taken for a blocked one. */
#define GUX_PROBE_MS 2000
#define GUX_PROBE_ROUNDS 16

static void probe_recv_cb(void *req, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)req;
    (void)info;
    gser_ucx_worker_t *w = user_data;
    if (status == UCS_OK) {
        w->probe.got = true;
        w->timer_next = 0; /* gux_probe_timer ends the check in the next round */
        w->ctl_now = true;
    }
}

static void probe_ep_err(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    (void)status; /* its message then does not arrive: the deadline decides */
}

static void probe_release(gser_ucx_worker_t *w)
{
    gux_probe_t *p = &w->probe;
    if (p->recv_req) {
        if (!p->got)
            ucp_request_cancel(w->ucp, p->recv_req);
        ucp_request_free(p->recv_req);
        p->recv_req = NULL;
    }
    if (p->send_req) {
        ucp_request_free(p->send_req); /* no callback after this */
        p->send_req = NULL;
    }
}

/* Whether UCX loaded a shared-memory transport: only those share one
 * queue among senders. Without one there is nothing to check, and a
 * connection to the worker's own address would go over tcp, to a port the
 * admission filter closes to this host. UCX 1.13 names its resources only
 * in this print-out. */
static bool have_shm(ucp_context_h ctx)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return false; /* no check rather than a wrong one */
    ucp_context_print_info(ctx, f);
    fclose(f);
    bool yes = buf && (strstr(buf, "-- sysv/") || strstr(buf, "-- posix/"));
    free(buf);
    return yes;
}

void gux_probe_start(gser_ucx_worker_t *w)
{
    gux_probe_t *p = &w->probe;
    if (!w->ucp || w->broken || !w->ucp_addr)
        return;
    if (!p->shm_known) {
        p->shm_known = true;
        p->shm = have_shm(w->ucp_ctx);
    }
    if (!p->shm)
        return;
    if (p->deadline) {
        p->again = true; /* its message may have gone before this peer died: one more after it */
        return;
    }
    if (!p->ep) {
        ucp_ep_params_t ep = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .address = w->ucp_addr,
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = probe_ep_err, .arg = w},
        };
        if (ucp_ep_create(w->ucp, &ep, &p->ep) != UCS_OK) {
            p->ep = NULL;
            return; /* no check this time; the next peer's death tries again */
        }
    }
    probe_release(w);
    p->got = false;
    p->seq++;
    /* Connection id 0 is no endpoint's: no receive of gser's takes it. */
    uint64_t tag = gux_tag(0, GUX_KIND_PROBE, p->seq);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv = probe_recv_cb,
        .user_data = w,
    };
    ucs_status_ptr_t r = ucp_tag_recv_nbx(w->ucp, p->rbuf, sizeof p->rbuf, tag, GUX_TAG_MASK_ALL, &rp);
    if (UCS_PTR_IS_ERR(r))
        return;
    if (r == NULL)
        p->got = true;
    p->recv_req = r;
    memcpy(p->sbuf, "gser-ok", sizeof p->sbuf);
    uint64_t stag = w->probe_fault ? gux_tag(0, GUX_KIND_PROBE, p->seq + 1) : tag; /* tests: it never arrives */
    ucp_request_param_t sp = {.op_attr_mask = 0}; /* nothing waits for it: freed at the next check or the end */
    ucs_status_ptr_t s = ucp_tag_send_nbx(p->ep, p->sbuf, sizeof p->sbuf, stag, &sp);
    if (UCS_PTR_IS_ERR(s)) {
        probe_release(w);
        return;
    }
    p->send_req = s;
    p->deadline = gux_now_ms() + GUX_PROBE_MS;
    p->rounds = w->rounds;
    if (p->deadline < w->timer_next)
        w->timer_next = p->deadline;
}

/* The worker can take no message from a local peer any more: fail it for
 * good, and every endpoint. */
static void worker_break(gser_ucx_worker_t *w)
{
    w->broken = GSER_ERR_CONNECTION;
    snprintf(w->broken_why, sizeof w->broken_why,
             "this worker's shared-memory receive queue is blocked: a message it sent itself did not arrive "
             "within %u ms after a peer died (a local peer killed while it wrote into the queue blocks it for "
             "good, UCX 1.13; docs/ucx.md section 6): messages from local peers no longer arrive; use a new worker",
             GUX_PROBE_MS);
    for (gux_list_t *n = w->eps.next; n != &w->eps; n = n->next) {
        gser_ucx_ep_t *ep = gux_container(n, gser_ucx_ep_t, wlink);
        if (ep->state < GUX_EP_FAILED) {
            gux_fail(GSER_ERR_CONNECTION, "%s", w->broken_why);
            gux_ep_fail(ep, GSER_ERR_CONNECTION);
        } else if (ep->drain_until) {
            ep->drain_until = gux_now_ms(); /* what it waits for cannot come */
        }
    }
    w->eps_dirty = true;
    gux_fail(GSER_ERR_CONNECTION, "%s", w->broken_why);
}

double gux_probe_timer(gser_ucx_worker_t *w, double now)
{
    gux_probe_t *p = &w->probe;
    if (!p->deadline)
        return INFINITY;
    if (p->got) {
        p->deadline = 0;
        probe_release(w);
        if (p->again) {
            p->again = false;
            gux_probe_start(w);
            return p->deadline ? p->deadline : INFINITY;
        }
        return INFINITY;
    }
    /* Time alone is not enough: a worker nobody progressed has not read its
     * queue. */
    if (now < p->deadline || w->rounds < p->rounds + GUX_PROBE_ROUNDS)
        return now < p->deadline ? p->deadline : now + 10;
    p->deadline = 0;
    worker_break(w);
    return INFINITY;
}

void gux_probe_close(gser_ucx_worker_t *w)
{
    gux_probe_t *p = &w->probe;
    if (!w->ucp)
        return;
    probe_release(w);
    if (p->ep) {
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t c = ucp_ep_close_nbx(p->ep, &cp);
        if (UCS_PTR_IS_PTR(c)) {
            for (int i = 0; i < 100 && ucp_request_check_status(c) == UCS_INPROGRESS; i++)
                ucp_worker_progress(w->ucp);
            ucp_request_free(c);
        }
        p->ep = NULL;
    }
    p->deadline = 0;
}
