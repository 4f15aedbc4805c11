/* Sending a message: one tagged send for the head (fixed part, frame table,
 * header and small frames), one per large frame, and staged chunks for
 * device frames a UCX without device support cannot read. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Start one tagged send for r. */
static gser_status_t post_send(gser_ucx_request_t *r, const void *buf, size_t len, uint64_t tag,
                               ucs_memory_type_t mem)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .cb.send = gux_send_cb,
        .user_data = r,
        .memory_type = mem,
    };
    r->outstanding++;
    return gux_req_track(r, ucp_tag_send_nbx(r->ep->ucp, buf, len, tag, &p), "send: ucp_tag_send_nbx", false);
}

/* Send a short head at once, or not at all (UCS_ERR_NO_RESOURCE: UCX's
 * queue to the peer is full). */
static ucs_status_t short_send_now(gser_ucx_ep_t *ep, const void *head, size_t len)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL};
    ucs_status_ptr_t sp =
        ucp_tag_send_nbx(ep->ucp, head, len, gux_tag(ep->peer_id, GUX_KIND_SHORT, ep->send_seq & GUX_SEQ_MASK), &p);
    if (!UCS_PTR_IS_PTR(sp))
        return UCS_PTR_STATUS(sp);
    ucs_status_t st; /* not expected with the flag: finished here, not left running */
    while ((st = ucp_request_check_status(sp)) == UCS_INPROGRESS)
        ucp_worker_progress(ep->worker->ucp);
    ucp_request_free(sp);
    return st;
}

void gux_send_ready(gser_ucx_request_t *r)
{
    if (r->status != GSER_INPROGRESS) {
        gux_req_release_if_idle(r);
        return;
    }
    gser_status_t st = GSER_OK;
    if (r->fail_status) {
        st = r->fail_status;
    } else if (r->first_error != UCS_OK) {
        st = gux_ep_part_error(r->ep, r->first_error, "send");
        if (r->ep) /* part of the message may be out: the stream is torn */
            gux_ep_fail(r->ep, st);
    }
    gux_req_complete(r, st);
}

gser_status_t gser_ucx_ep_send_nb(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                                  const gser_ucx_op_params_t *params, gser_ucx_request_t **req_out)
{
    gser_ucx_op_params_t p_ = GSER_UCX_OP_PARAMS_INIT;
    if (params) {
        gser_status_t pst = gux_struct_read("gser_ucx_ep_send_nb", "gser_ucx_op_params_t", &p_, sizeof p_, params);
        if (pst)
            return pst;
        params = &p_;
    }
    for (size_t i = 0; frames && i < nframes; i++)
        for (size_t k = 0; k < sizeof frames[i].reserved / sizeof frames[i].reserved[0]; k++)
            if (frames[i].reserved[k])
                return gux_fail(GSER_ERR_INVALID_ARG,
                                "gser_ucx_ep_send_nb: frame %zu sets reserved[%zu], which must be zero", i, k);
    if (!ep || !frames || nframes == 0 || (!req_out && !(params && params->cb)))
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_send_nb: bad argument (a request or a callback is needed)");
    gser_ucx_worker_t *w = ep->worker;
    gser_status_t st;
    uint8_t routes_stack[64];
    uint8_t *routes = routes_stack;
    gser_ucx_request_t *r = NULL;

    gux_lock(w);
    gux_error_clear();
    if (ep->state != GUX_EP_READY) {
        st = ep->state == GUX_EP_CONNECTING ? gux_fail(GSER_ERR_STATE, "send: the handshake is not done")
                                            : gux_fail(ep->error, "send: %s", ep->why);
        goto out;
    }
    /* A short head is the frame itself past its magic: no head to plan or
     * write, and no other frame (routes stays unread). */
    bool short_head = gux_short_fits(frames, nframes), staged = false, sent = false;
    const void *head = NULL;
    size_t head_len = 0;
    if (short_head) {
        head = (const unsigned char *)frames[0].data + GUX_SHORT_PREFIX_LEN;
        head_len = frames[0].size - GUX_SHORT_PREFIX_LEN;
        /* Out first, the request after: UCX sends a short message at once or
         * not at all (a full queue), and the peer waits for nothing else. In
         * a stream that fills the queue, the next ones are posted without
         * the try until a posted send completes. */
        ucs_status_t us = ep->short_queued ? UCS_ERR_NO_RESOURCE : short_send_now(ep, head, head_len);
        if (us == UCS_OK) {
            sent = true;
        } else if (us == UCS_ERR_NO_RESOURCE) {
            ep->short_queued = true;
        } else {
            st = GUX_CALL("send: ucp_tag_send_nbx", us);
            goto out;
        }
    } else {
        if (nframes > sizeof routes_stack && !(routes = malloc(nframes))) {
            st = gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory");
            goto out;
        }
        gux_route_policy_t pol = {
            .inline_max = w->inline_max,
            .inline_budget = w->inline_budget,
            .device_direct = (w->ctx->caps & ep->peer.caps & GSER_UCX_CAP_CUDA) != 0,
        };
        if ((st = gux_head_plan(frames, nframes, &pol, routes, &head_len)))
            goto out;
        for (size_t i = 0; i < nframes; i++)
            staged |= routes[i] == GUX_ROUTE_STAGED;
        if (staged && !w->have_device) {
            st = gux_fail(GSER_ERR_NO_DEVICE, "send: device frames need the worker's gser_ctx with a device backend "
                                              "(this UCX cannot read device memory)");
            goto out;
        }
    }

    if (!(r = gux_req_new(w, GUX_REQ_SEND, ep, params, req_out != NULL))) {
        st = GSER_ERR_NO_MEMORY;
        if (sent) { /* out, but not reported as sent: the stream is torn */
            ep->send_seq++;
            gux_ep_fail(ep, st);
        }
        goto out;
    }
    r->msg_no = ep->send_seq;
    r->seq = ep->send_seq & GUX_SEQ_MASK;
    if (!short_head) {
        r->head = head_len <= GUX_HEAD_INLINE ? r->head_inline : malloc(head_len);
        if (!r->head) {
            st = gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory for a %zu-byte head", head_len);
            goto out;
        }
        r->head_len = head_len;
        gux_head_write(frames, nframes, routes, r->seq, staged ? (uint32_t)w->chunk : 0, r->head, head_len);
        head = r->head;
    }

    r->posting = true;
    st = GSER_OK;
    if (!sent) {
        st = post_send(r, head, head_len, gux_tag(ep->peer_id, short_head ? GUX_KIND_SHORT : GUX_KIND_HEAD, r->seq),
                       UCS_MEMORY_TYPE_HOST);
        if (st) /* nothing went out: the endpoint is as it was */
            goto out;
        if (short_head && r->outstanding == 0)
            ep->short_queued = false; /* it went at once: the queue has room again */
    }
    ep->send_seq++;
    uint64_t ftag = gux_tag(ep->peer_id, GUX_KIND_FRAME, r->seq);
    for (size_t i = 1; i < nframes && !st; i++) {
        if (routes[i] != GUX_ROUTE_TAG)
            continue;
        ucs_memory_type_t mem = frames[i].memory == GSER_MEMORY_DEVICE ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
        st = post_send(r, frames[i].data, frames[i].size, ftag, mem);
    }
    if (!st && staged) {
        /* Staging runs later, from progress: it needs the frames and routes. */
        gser_frame_t *copy = malloc(nframes * sizeof *copy);
        if (!copy) {
            st = gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory");
        } else {
            memcpy(copy, frames, nframes * sizeof *copy);
            r->sframes = copy;
            r->nframes = nframes;
            if (routes == routes_stack) {
                if ((r->routes = malloc(nframes)))
                    memcpy(r->routes, routes, nframes);
            } else {
                r->routes = routes;
                routes = routes_stack;
            }
            if (!r->routes) {
                st = gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory");
            } else {
                r->outstanding++; /* the staging part, done when its last chunk is */
                gux_staging_advance(r);
            }
        }
    }
    r->posting = false;
    if (st) {
        /* The head went out but not the whole message: the stream is torn. */
        r->fail_status = st;
        gux_ep_fail(ep, st);
    }
    if (r->outstanding == 0)
        gux_send_ready(r);
    if (req_out)
        *req_out = r;
    r = NULL;
    st = GSER_OK;
out:
    if (r) {
        r->status = st;
        r->user_holds = false;
        r->cb = NULL;
        gux_req_release_if_idle(r);
    }
    if (routes != routes_stack)
        free(routes);
    gux_unlock(w);
    return st;
}

gser_status_t gser_ucx_ep_send(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes, int timeout_ms)
{
    gser_ucx_request_t *r;
    gser_status_t st = gser_ucx_ep_send_nb(ep, frames, nframes, NULL, &r);
    if (st)
        return st;
    st = gser_ucx_request_wait(r, timeout_ms);
    if (st == GSER_ERR_TIMEOUT) {
        gser_ucx_worker_t *w = ep->worker;
        gux_lock(w);
        /* Half a message may be out: close, and wait until UCX gives the
         * caller's buffers back before returning. */
        gux_ep_shutdown(ep, GSER_ERR_TIMEOUT, true);
        gux_wait(w, NULL, NULL, 0);
        gux_unlock(w);
        gser_ucx_request_wait(r, GUX_CLOSE_TIMEOUT_MS);
        st = gux_fail(GSER_ERR_TIMEOUT, "send: not completed within %d ms; the endpoint was closed", timeout_ms);
    }
    gser_ucx_request_free(r);
    return st;
}

/* The codec a message sent on ep is serialized with: the endpoint's
 * negotiated one unless the caller's options name one the peer has. */
static gser_status_t gux_send_codec(gser_ucx_ep_t *ep, gser_serialize_options_t *so)
{
    gser_ucx_worker_t *w = ep->worker;
    gux_lock(w);
    gser_status_t st = GSER_OK;
    if (!ep->peer_known) {
        st = gux_fail(GSER_ERR_STATE, "gser_ucx_ep_send_msg: the handshake is not done");
        goto out;
    }
    int mine = gux_ep_codec(ep);
    uint32_t both = ep->peer.gser_wire_version >= 3 ? w->announce_codecs & ep->peer.caps & GUX_CODECS : 0;
    switch (so->compression) {
    case GSER_COMPRESSION_NONE:
        so->compression = mine;
        if (!so->compression_level)
            so->compression_level = w->compression_level;
        break;
    case GSER_COMPRESSION_AUTO:
        so->compression = (both & GSER_UCX_CAP_LZ4) ? GSER_COMPRESSION_LZ4
                          : (both & GSER_UCX_CAP_ZSTD) ? GSER_COMPRESSION_ZSTD
                                                       : GSER_COMPRESSION_NONE;
        break;
    case GSER_COMPRESSION_LZ4:
    case GSER_COMPRESSION_ZSTD: {
        uint32_t bit = so->compression == GSER_COMPRESSION_LZ4 ? GSER_UCX_CAP_LZ4 : GSER_UCX_CAP_ZSTD;
        if (!(both & bit))
            st = gux_fail(GSER_ERR_UNSUPPORTED, "gser_ucx_ep_send_msg: the peer did not announce %s: nothing was sent",
                          bit == GSER_UCX_CAP_LZ4 ? "lz4" : "zstd");
        break;
    }
    default:
        break; /* gser_serialize names it */
    }
out:
    gux_unlock(w);
    return st;
}

gser_status_t gser_ucx_ep_send_msg(gser_ucx_ep_t *ep, gser_context_t *ctx, const gser_msg_t *msg,
                                   const gser_serialize_options_t *opts, int timeout_ms)
{
    if (!ep || !ctx || !msg)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_send_msg: bad argument");
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    gser_status_t st;
    if (opts && (st = gux_struct_read("gser_ucx_ep_send_msg", "gser_serialize_options_t", &so, sizeof so, opts)))
        return st;
    if ((st = gux_send_codec(ep, &so)))
        return st;
    gser_frames_t *f = NULL;
    st = gser_serialize(ctx, msg, &so, &f);
    if (st)
        return gux_fail(st, "serialize: %s", gser_context_get_last_error(ctx));
    if ((st = gser_frames_wait(f))) {
        gux_fail(st, "serialize: device work failed: %s", gser_context_get_last_error(ctx));
        goto out;
    }
    st = gser_ucx_ep_send(ep, gser_frames_get_array(f), gser_frames_get_count(f), timeout_ms);
out:
    gser_frames_destroy(f);
    return st;
}
