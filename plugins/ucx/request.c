/* Requests: the life cycle shared by sends and receives, completion
 * callbacks, and the public request calls. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

gser_ucx_request_t *gux_req_new(gser_ucx_worker_t *w, gux_req_kind_t kind, gser_ucx_ep_t *ep,
                                const gser_ucx_op_params_t *params, bool user_holds)
{
    gser_ucx_request_t *r = w->nreq_cache ? w->req_cache[--w->nreq_cache] : malloc(sizeof *r);
    if (!r) {
        gux_fail(GSER_ERR_NO_MEMORY, "request: out of memory");
        return NULL;
    }
    /* Only the fixed part needs zeroing: the inline table, frames and head
     * are written before use (head_parse, gux_head_write). */
    memset(r, 0, offsetof(gser_ucx_request_t, table_inline));
    r->fail_why[0] = '\0';
    r->kind = kind;
    r->worker = w;
    r->ep = ep;
    r->status = GSER_INPROGRESS;
    r->read_codecs = w->announce_codecs | (w->announce_chunked ? GSER_UCX_CAP_CHUNKED : 0);
    if (params) {
        r->cb = params->cb;
        r->user_data = params->user_data;
    }
    r->user_holds = user_holds;
    gux_list_init(&r->elink);
    gux_list_init(&r->wlink);
    gux_list_init(&r->rlink);
    gux_list_push(&w->all, &r->alink);
    if (ep)
        gux_list_push(&ep->reqs, &r->elink);
    return r;
}

static void req_free(gser_ucx_request_t *r)
{
    /* Most requests own none of these: the tests keep the calls off the
     * path of every small message. */
    if (r->ucx_reqs) {
        if (r->worker)
            for (size_t i = 0; i < r->nucx_reqs; i++)
                ucp_request_free(r->ucx_reqs[i]); /* all completed: outstanding is 0 */
        free(r->ucx_reqs);
    }
    if (r->kind == GUX_REQ_RECV)
        gux_recv_release(r);
    gux_staging_release(r);
    if (r->head && r->head != r->head_inline)
        free(r->head);
    if (r->sframes) {
        free((void *)r->sframes);
        free(r->routes);
    }
    gux_list_del(&r->elink);
    gux_list_del(&r->wlink);
    gux_list_del(&r->rlink);
    gux_list_del(&r->alink);
    gser_ucx_worker_t *w = r->worker;
    if (w && w->nreq_cache < GUX_REQ_CACHE) {
        if (!w->req_cache && !(w->req_cache = malloc(GUX_REQ_CACHE * sizeof *w->req_cache))) {
            free(r);
            return;
        }
        w->req_cache[w->nreq_cache++] = r;
        return;
    }
    free(r);
}

void gux_req_release_if_idle(gser_ucx_request_t *r)
{
    if (r->status == GSER_INPROGRESS || r->user_holds || r->in_cb || r->cb_queued || r->outstanding ||
        gux_list_linked(&r->rlink) || r->stage_op)
        return;
    req_free(r);
}

void gux_req_complete(gser_ucx_request_t *r, gser_status_t st)
{
    if (r->status != GSER_INPROGRESS)
        return;
    r->status = st;
    gux_list_del(&r->wlink); /* elink stays: r->ep must stay valid (or NULL) while r lives */
    gser_ucx_worker_t *w = r->worker;
    if (!w)
        return;
    w->events++;
    if (r->kind == GUX_REQ_RECV && r->ep && r->ep->drain_until)
        w->eps_dirty = true; /* perhaps the last message the closed peer sent */
    if (r->cb) {
        r->cb_queued = true;
        gux_list_push(&w->done, &r->wlink);
    } else {
        gux_req_release_if_idle(r);
    }
}

gser_status_t gux_req_track(gser_ucx_request_t *r, ucs_status_ptr_t sp, const char *what, bool cancelable)
{
    /* The caller counted the operation in r->outstanding before starting it,
     * in case UCX completes it (callback and all) inside the call. */
    if (sp == NULL) {
        r->outstanding--;
        return GSER_OK;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        r->outstanding--;
        return GUX_CALL(what, UCS_PTR_STATUS(sp));
    }
    if (cancelable) {
        if (r->nucx_reqs == r->ucx_reqs_cap) {
            size_t cap = r->ucx_reqs_cap ? r->ucx_reqs_cap * 2 : 4;
            void **a = realloc(r->ucx_reqs, cap * sizeof *a);
            if (!a) {
                /* Keep going without it: the request can no longer be canceled
                 * early, only completed by UCX or by the worker's teardown. */
                return GSER_OK;
            }
            r->ucx_reqs = a;
            r->ucx_reqs_cap = cap;
        }
        r->ucx_reqs[r->nucx_reqs++] = sp;
    }
    return GSER_OK;
}

void gux_req_part_done(gser_ucx_request_t *r, ucs_status_t st)
{
    if (st != UCS_OK && r->first_error == UCS_OK)
        r->first_error = st;
    r->outstanding--;
    if (r->outstanding == 0 && !r->posting && r->worker && !gux_list_linked(&r->rlink))
        gux_list_push(&r->worker->ready, &r->rlink);
}

void gux_send_cb(void *ucx_req, ucs_status_t st, void *user_data)
{
    gser_ucx_request_t *r = user_data;
    ucp_request_free(ucx_req);
    if (r->ep) { /* UCX's queue to the peer moved: short heads may go at once again */
        r->ep->short_queued = false;
        if (r->ep->ucp_release) /* its UCX endpoint waits for its sends (endpoint.c) */
            r->ep->worker->eps_dirty = true;
    }
    gux_req_part_done(r, st);
}

void gux_recv_cb(void *ucx_req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)ucx_req; /* freed with the request: it may still be canceled until then */
    (void)info;
    gux_req_part_done(user_data, st);
}

void gux_ready_process(gser_ucx_worker_t *w)
{
    while (!gux_list_empty(&w->ready)) {
        gser_ucx_request_t *r = gux_container(w->ready.next, gser_ucx_request_t, rlink);
        gux_list_del(&r->rlink);
        if (r->kind == GUX_REQ_SEND)
            gux_send_ready(r);
        else
            gux_recv_ready(r);
    }
}

/* A request that ended with its endpoint: its message is why the endpoint
 * ended (the one recorded then may have been overwritten since). */
static void req_why(const gser_ucx_request_t *r)
{
    if (r->status < 0 && r->ep && r->ep->state >= GUX_EP_FAILED && r->status == r->ep->error)
        gux_fail(r->status, "%s", r->ep->why);
}

void gux_completions_run(gser_ucx_worker_t *w)
{
    while (!gux_list_empty(&w->done)) {
        gser_ucx_request_t *r = gux_container(w->done.next, gser_ucx_request_t, wlink);
        gux_list_del(&r->wlink);
        r->cb_queued = false;
        r->in_cb = true;
        req_why(r); /* the callback reads it in the last error */
        r->cb(r, r->status, r->user_data);
        r->in_cb = false;
        gux_req_release_if_idle(r);
    }
}

void gux_req_abort(gser_ucx_request_t *r, gser_status_t st)
{
    if (r->status != GSER_INPROGRESS)
        return;
    if (!r->fail_status)
        r->fail_status = st;
    gux_staging_abort(r);
    if (r->kind == GUX_REQ_SEND) {
        /* UCX still reads the caller's buffers: the send completes when the
         * endpoint's close gives them back (gux_send_ready). */
        return;
    }
    /* Our own buffers: the caller may see the end now; UCX's parts drain
     * into them later. */
    for (size_t i = 0; i < r->nucx_reqs && r->worker; i++)
        ucp_request_cancel(r->worker->ucp, r->ucx_reqs[i]);
    gux_req_complete(r, st);
}

/* ---- public request calls ------------------------------------------------------------- */

gser_status_t gser_ucx_request_query(const gser_ucx_request_t *r)
{
    return r ? r->status : GSER_ERR_INVALID_ARG;
}

static bool req_done(void *arg)
{
    return ((gser_ucx_request_t *)arg)->status != GSER_INPROGRESS;
}

gser_status_t gser_ucx_request_wait(gser_ucx_request_t *r, int timeout_ms)
{
    if (!r)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_request_wait: req is NULL");
    gser_ucx_worker_t *w = r->worker;
    if (!w)
        return r->status;
    gux_lock(w);
    gser_status_t st = gux_wait(w, req_done, r, timeout_ms);
    if (st == GSER_OK) {
        st = r->status;
        req_why(r);
    } else
        gux_fail(st, "request did not complete within %d ms", timeout_ms);
    gux_unlock(w);
    return st;
}

/* Lock held. */
static void req_cancel(gser_ucx_request_t *r)
{
    if (r->status != GSER_INPROGRESS || !r->worker)
        return;
    if (r->kind == GUX_REQ_RECV && r->stage == GUX_RECV_WAIT_HEAD) {
        gux_req_complete(r, GSER_ERR_CANCELED); /* nothing taken from the stream yet */
    } else if (r->ep) {
        gux_ep_shutdown(r->ep, GSER_ERR_CANCELED);
        gux_wait(r->worker, req_done, r, GUX_CLOSE_TIMEOUT_MS);
    } else {
        gux_req_abort(r, GSER_ERR_CANCELED);
    }
    gux_completions_run(r->worker);
}

gser_status_t gser_ucx_request_cancel(gser_ucx_request_t *r)
{
    if (!r)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_request_cancel: req is NULL");
    gser_ucx_worker_t *w = r->worker;
    if (!w)
        return GSER_OK;
    gux_lock(w);
    req_cancel(r);
    gux_unlock(w);
    return GSER_OK;
}

void gser_ucx_request_free(gser_ucx_request_t *r)
{
    if (!r)
        return;
    gser_ucx_worker_t *w = r->worker;
    if (!w) {
        r->user_holds = false;
        gux_req_release_if_idle(r);
        return;
    }
    gux_lock(w);
    req_cancel(r);
    r->user_holds = false;
    gux_req_release_if_idle(r);
    gux_unlock(w);
}

gser_ucx_ep_t *gser_ucx_request_get_ep(const gser_ucx_request_t *r)
{
    return r ? r->ep : NULL;
}
