/* Sending a message: one tagged send for the head (fixed part, frame table,
 * header and small frames), one per large frame, and staged chunks for
 * device frames a UCX without device support cannot read. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A large send of r completed: the link's rate counts it (link.c), each
 * of r's timed sends as their average length. */
static void send_cb_timed(void *ucx_req, ucs_status_t st, void *user_data)
{
    gser_ucx_request_t *r = user_data;
    if (r->ep && r->link_parts && st == UCS_OK)
        gux_ep_link_done(r->ep, r->link_bytes / r->link_parts, gux_now_ms());
    gux_send_cb(ucx_req, st, user_data);
}

/* Start one tagged send for r; large host sends are timed for the link. */
static gser_status_t post_send(gser_ucx_request_t *r, const void *buf, size_t len, uint64_t tag,
                               ucs_memory_type_t mem)
{
    bool timed = !r->link_whole && len >= GUX_LINK_PART_MIN && mem == UCS_MEMORY_TYPE_HOST;
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .cb.send = timed ? send_cb_timed : gux_send_cb,
        .user_data = r,
        .memory_type = mem,
    };
    gux_link_t *l = &r->ep->link;
    if (timed) {
        r->link_bytes += len;
        r->link_parts++;
        gux_link_posted(l, gux_now_ms(), !l->decided || l->last == GSER_COMPRESSION_NONE);
    }
    r->outstanding++;
    ucs_status_ptr_t sp = ucp_tag_send_nbx(r->ep->ucp, buf, len, tag, &p);
    if (timed && !UCS_PTR_IS_PTR(sp)) { /* done at once (or failed): no rate, a codec run's time */
        r->link_bytes -= len;
        r->link_parts--;
        gux_link_at_once(l, len, gux_now_ms(), UCS_PTR_STATUS(sp) == UCS_OK);
    }
    return gux_req_track(r, sp, "send: ucp_tag_send_nbx", false);
}

/* r's sends, timed as one, completed (ok) or not: the link's rate counts
 * them as a send of their bytes. */
static void send_whole_done(gser_ucx_request_t *r, bool ok)
{
    size_t n = r->link_whole;
    r->link_whole = 0;
    if (!n || !r->ep)
        return;
    if (ok)
        gux_ep_link_done(r->ep, n, gux_now_ms());
    else
        gux_link_at_once(&r->ep->link, n, gux_now_ms(), false);
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
        send_whole_done(r, false);
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
    send_whole_done(r, st == GSER_OK);
    if (r->link_run && r->ep)
        gux_link_run_req_done(&r->ep->link, r->link_run, st == GSER_OK, gux_now_ms());
    gux_req_complete(r, st);
}

/* The route of each frame and the head's length (gux_head_plan under the
 * worker's policy); *staged when a frame goes through staging, which
 * needs the worker's device backend. */
static gser_status_t send_plan(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes, uint8_t *routes,
                               size_t *head_len, bool *staged, int zcodec, bool *zchunked)
{
    gser_ucx_worker_t *w = ep->worker;
    gux_route_policy_t pol = {
        .inline_max = w->inline_max,
        .inline_budget = w->inline_budget,
        .device_direct = (w->ctx->caps & ep->peer.caps & GSER_UCX_CAP_CUDA) != 0,
        /* compressed chunks only to a peer that reads them, with a codec it reads */
        .zchunk_min = zcodec != GSER_COMPRESSION_NONE && gux_ep_chunked(ep) ? w->zchunk_min : 0,
    };
    gser_status_t st = gux_head_plan(frames, nframes, &pol, routes, head_len);
    if (st)
        return st;
    for (size_t i = 0; i < nframes; i++) {
        *staged |= routes[i] == GUX_ROUTE_STAGED;
        *zchunked |= routes[i] == GUX_ROUTE_ZCHUNKED;
    }
    if (*staged && !w->have_device)
        return gux_fail(GSER_ERR_NO_DEVICE, "send: device frames need the worker's gser_ctx with a device backend "
                                            "(this UCX cannot read device memory)");
    return GSER_OK;
}

/* Staging runs later, from progress: r keeps a copy of the frames and the
 * routes (*routes handed over when malloc'd, else copied) and counts the
 * staging as one more outstanding part. */
static gser_status_t send_start_staging(gser_ucx_request_t *r, const gser_frame_t *frames, size_t nframes,
                                        uint8_t **routes, uint8_t *routes_stack)
{
    gser_frame_t *copy = malloc(nframes * sizeof *copy);
    if (!copy)
        return gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory");
    memcpy(copy, frames, nframes * sizeof *copy);
    r->sframes = copy;
    r->nframes = nframes;
    if (*routes == routes_stack) {
        if ((r->routes = malloc(nframes)))
            memcpy(r->routes, *routes, nframes);
    } else {
        r->routes = *routes;
        *routes = routes_stack;
    }
    if (!r->routes)
        return gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory");
    r->outstanding++; /* the staging part, done when its last chunk is */
    gux_staging_advance(r);
    return GSER_OK;
}

/* What one send posts: the head's form and bytes, and each frame's route. */
typedef struct {
    bool short_head; /* the frame itself past its magic: no head to write, no other frame */
    bool staged;     /* a frame goes through staging */
    bool sent;       /* the short head went out at once */
    bool zchunked;   /* a frame goes in compressed chunks (through the staging part too) */
    int zcodec, zlevel; /* their codec and level; NONE: no frame does */
    const void *head;
    size_t head_len;
    uint8_t *routes; /* routes_stack or malloc'd; unread for a short head */
    uint8_t routes_stack[64];
} send_job_t;

/* The bytes a raw message whose frames are each too small to time (under
 * GUX_LINK_PART_MIN) sends in all, head included, where that is enough to
 * time its sends as one; else 0 (a large frame is timed itself; device
 * frames and staged or chunked ones are not, or are timed by staging). A
 * message of a DataFrame's pieces is hundreds of frames of 10-60 KB, the
 * first ones inlined into its head: with only the head timed (which the
 * socket takes at once), the link of a 400,000-row shuffle at 100 Mbit/s
 * was never measured and every message went raw to measure it
 * (BENCHMARKS.md, 2026-12-07). */
static size_t send_whole_bytes(const gser_frame_t *frames, size_t nframes, const send_job_t *job)
{
    if (job->short_head || job->staged || job->zchunked)
        return 0;
    size_t n = job->head_len;
    for (size_t i = 1; i < nframes; i++) {
        if (job->routes[i] != GUX_ROUTE_TAG)
            continue;
        if (frames[i].memory != GSER_MEMORY_HOST || frames[i].size >= GUX_LINK_PART_MIN)
            return 0;
        n += frames[i].size;
    }
    return n >= GUX_LINK_PART_MIN ? n : 0;
}

/* GSER_ERR_INVALID_ARG naming the first frame that sets a reserved field. */
static gser_status_t frames_reserved_check(const gser_frame_t *frames, size_t nframes)
{
    for (size_t i = 0; frames && i < nframes; i++)
        for (size_t k = 0; k < sizeof frames[i].reserved / sizeof frames[i].reserved[0]; k++)
            if (frames[i].reserved[k])
                return gux_fail(GSER_ERR_INVALID_ARG,
                                "gser_ucx_ep_send_nb: frame %zu sets reserved[%zu], which must be zero", i, k);
    return GSER_OK;
}

/* GSER_OK when ep can send, else why not: the handshake runs or it ended. */
static gser_status_t send_ep_ready(const gser_ucx_ep_t *ep)
{
    if (ep->state == GUX_EP_READY)
        return GSER_OK;
    return ep->state == GUX_EP_CONNECTING ? gux_fail(GSER_ERR_STATE, "send: the handshake is not done")
                                          : gux_fail(ep->error, "send: %s", ep->why);
}

/* Try a short head out before there is a request: job->sent when it went,
 * ep->short_queued when UCX's queue is full (it is posted then). */
static gser_status_t send_short_try(gser_ucx_ep_t *ep, const gser_frame_t *frame, send_job_t *job)
{
    job->head = (const unsigned char *)frame->data + GUX_SHORT_PREFIX_LEN;
    job->head_len = frame->size - GUX_SHORT_PREFIX_LEN;
    /* UCX sends a short message at once or not at all (a full queue), and
     * the peer waits for nothing else. In a stream that fills the queue,
     * the next ones are posted without the try until a posted send
     * completes. */
    ucs_status_t us = ep->short_queued ? UCS_ERR_NO_RESOURCE : short_send_now(ep, job->head, job->head_len);
    if (us == UCS_OK)
        job->sent = true;
    else if (us == UCS_ERR_NO_RESOURCE)
        ep->short_queued = true;
    else
        return GUX_CALL("send: ucp_tag_send_nbx", us);
    return GSER_OK;
}

/* Decide the head's form; a short one is tried out at once, a full one gets
 * its routes and length planned (routes malloc'd past the stack's 64). */
static gser_status_t send_prepare(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes, send_job_t *job)
{
    job->short_head = gux_short_fits(frames, nframes);
    if (job->short_head)
        return send_short_try(ep, &frames[0], job);
    if (nframes > sizeof job->routes_stack && !(job->routes = malloc(nframes)))
        return gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory");
    return send_plan(ep, frames, nframes, job->routes, &job->head_len, &job->staged, job->zcodec, &job->zchunked);
}

/* A send request on ep numbered as its next message. Without memory for
 * it, a short head that went out already tears the stream. */
static gser_status_t send_req_new(gser_ucx_ep_t *ep, const gser_ucx_op_params_t *params, bool user_holds,
                                  const send_job_t *job, gser_ucx_request_t **out)
{
    gser_ucx_request_t *r = gux_req_new(ep->worker, GUX_REQ_SEND, ep, params, user_holds);
    if (!r) {
        if (job->sent) { /* out, but not reported as sent */
            ep->send_seq++;
            gux_ep_fail(ep, GSER_ERR_NO_MEMORY);
        }
        return GSER_ERR_NO_MEMORY;
    }
    r->msg_no = ep->send_seq;
    r->seq = ep->send_seq & GUX_SEQ_MASK;
    *out = r;
    return GSER_OK;
}

/* Write a full head into r (its inline buffer or a malloc'd one) and point
 * job->head at it; a short head is the frame already. */
static gser_status_t send_head_write(gser_ucx_request_t *r, const gser_frame_t *frames, size_t nframes,
                                     send_job_t *job)
{
    if (job->short_head)
        return GSER_OK;
    size_t len = job->head_len;
    r->head = len <= GUX_HEAD_INLINE ? r->head_inline : malloc(len);
    if (!r->head)
        return gux_fail(GSER_ERR_NO_MEMORY, "send: out of memory for a %zu-byte head", len);
    r->head_len = len;
    gux_head_write(frames, nframes, job->routes, r->seq, job->staged ? (uint32_t)r->worker->chunk : 0, r->head, len);
    if (job->zchunked) {
        gux_head_set_zchunks(r->head, nframes, job->routes, job->zcodec, (uint32_t)r->worker->zchunk);
        r->zcodec = job->zcodec;
        r->zlevel = job->zlevel;
    }
    job->head = r->head;
    return GSER_OK;
}

/* Post the head unless it went out already; on an error nothing went out. */
static gser_status_t send_head_post(gser_ucx_request_t *r, const send_job_t *job)
{
    if (job->sent)
        return GSER_OK;
    gser_ucx_ep_t *ep = r->ep;
    gser_status_t st = post_send(r, job->head, job->head_len,
                                 gux_tag(ep->peer_id, job->short_head ? GUX_KIND_SHORT : GUX_KIND_HEAD, r->seq),
                                 UCS_MEMORY_TYPE_HOST);
    if (!st && job->short_head && r->outstanding == 0)
        ep->short_queued = false; /* it went at once: the queue has room again */
    return st;
}

/* Post the frames that travel apart, then start staging; on an error part
 * of the message may be out. */
static gser_status_t send_frames_post(gser_ucx_request_t *r, const gser_frame_t *frames, size_t nframes,
                                      send_job_t *job)
{
    gser_status_t st = GSER_OK;
    uint64_t ftag = gux_tag(r->ep->peer_id, GUX_KIND_FRAME, r->seq);
    for (size_t i = 1; i < nframes && !st; i++) {
        if (job->routes[i] != GUX_ROUTE_TAG)
            continue;
        ucs_memory_type_t mem = frames[i].memory == GSER_MEMORY_DEVICE ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
        st = post_send(r, frames[i].data, frames[i].size, ftag, mem);
    }
    if (!st && (job->staged || job->zchunked))
        st = send_start_staging(r, frames, nframes, &job->routes, job->routes_stack);
    return st;
}

/* gser_ucx_ep_send_nb; with zcodec (not NONE) large host frames go in
 * compressed chunks when the peer reads them. */
static gser_status_t send_nb(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                             const gser_ucx_op_params_t *params, gser_ucx_request_t **req_out, int zcodec, int zlevel)
{
    gser_ucx_op_params_t p_ = GSER_UCX_OP_PARAMS_INIT;
    gser_status_t st;
    if ((st = gux_op_params("gser_ucx_ep_send_nb", &params, &p_)) || (st = frames_reserved_check(frames, nframes)) ||
        (st = gux_op_check("gser_ucx_ep_send_nb", ep && frames && nframes, req_out != NULL, params)))
        return st;
    gser_ucx_worker_t *w = ep->worker;
    send_job_t job = {.short_head = false, .zcodec = zcodec, .zlevel = zlevel};
    job.routes = job.routes_stack;
    gser_ucx_request_t *r = NULL;

    gux_lock(w);
    gux_error_clear();
    if ((st = send_ep_ready(ep)) || (st = send_prepare(ep, frames, nframes, &job)) ||
        (st = send_req_new(ep, params, req_out != NULL, &job, &r)) ||
        (st = send_head_write(r, frames, nframes, &job)))
        goto out;
    size_t bytes = 0;
    for (size_t i = 0; i < nframes; i++)
        bytes += frames[i].size;
    r->link_run = gux_link_run_join(&ep->link, bytes, job.zchunked);
    /* (raw only: compressed sends set no rate, and timed they would mix the
     * raw probes' windows, which then measured nothing) */
    if (!ep->link.decided || ep->link.last == GSER_COMPRESSION_NONE)
        if ((r->link_whole = send_whole_bytes(frames, nframes, &job)))
            gux_link_posted(&ep->link, gux_now_ms(), true);
    r->posting = true;
    if ((st = send_head_post(r, &job))) /* nothing went out: the endpoint is as it was */
        goto out;
    ep->send_seq++;
    if (!job.short_head)
        st = send_frames_post(r, frames, nframes, &job);
    r->posting = false;
    if (st) {
        /* The head went out but not the whole message: the stream is torn. */
        r->fail_status = st;
        gux_ep_fail(ep, st);
    }
    if (r->link_whole && r->outstanding == 0) { /* all taken at once: no rate */
        gux_link_at_once(&ep->link, r->link_whole, gux_now_ms(), !st);
        r->link_whole = 0;
    }
    if (r->outstanding == 0)
        gux_send_ready(r);
    if (req_out)
        *req_out = r;
    r = NULL;
    st = GSER_OK;
out:
    if (r) {
        if (r->link_run) /* nothing went out: the run it joined times nothing */
            gux_link_run_req_done(&ep->link, r->link_run, false, gux_now_ms());
        send_whole_done(r, false);
        r->status = st;
        r->user_holds = false;
        r->cb = NULL;
        gux_req_release_if_idle(r);
    }
    if (job.routes != job.routes_stack)
        free(job.routes);
    gux_unlock(w);
    return st;
}

gser_status_t gser_ucx_ep_send_nb(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                                  const gser_ucx_op_params_t *params, gser_ucx_request_t **req_out)
{
    return send_nb(ep, frames, nframes, params, req_out, GSER_COMPRESSION_NONE, 0);
}

/* gser_ucx_ep_send, with send_nb's zcodec. */
static gser_status_t send_wait(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes, int timeout_ms,
                               int zcodec, int zlevel, bool decided)
{
    gser_ucx_request_t *r;
    gser_status_t st = send_nb(ep, frames, nframes, NULL, &r, zcodec, zlevel);
    if (st)
        return st;
    if (decided) /* the whole message is posted: its request times it */
        gser_ucx_ep_mark_posted(ep);
    st = gser_ucx_request_wait(r, timeout_ms);
    if (st == GSER_ERR_TIMEOUT) {
        gser_ucx_worker_t *w = ep->worker;
        gux_lock(w);
        /* Half a message may be out: close, and wait until UCX gives the
         * caller's buffers back before returning. */
        gux_ep_shutdown(ep, GSER_ERR_TIMEOUT);
        gux_wait(w, NULL, NULL, 0);
        gux_unlock(w);
        gser_ucx_request_wait(r, GUX_CLOSE_TIMEOUT_MS);
        st = gux_fail(GSER_ERR_TIMEOUT, "send: not completed within %d ms; the endpoint was closed", timeout_ms);
    }
    gser_ucx_request_free(r);
    return st;
}

gser_status_t gser_ucx_ep_send(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes, int timeout_ms)
{
    return send_wait(ep, frames, nframes, timeout_ms, GSER_COMPRESSION_NONE, 0, false);
}

/* The codec a message sent on ep is serialized with: the endpoint's
 * negotiated one unless the caller's options name one the peer has;
 * *link_aware when the endpoint's link decides it per message. */
static gser_status_t gux_send_codec(gser_ucx_ep_t *ep, gser_serialize_options_t *so, bool *link_aware)
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
        *link_aware = gux_ep_link_aware(ep);
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

/* Serialize msg for a link-aware endpoint: raw first (the frames borrow
 * the buffers: only the header is written) and, when the link's choice for
 * these frames is raw, *f is that; else so->compression is the choice and
 * *f stays NULL: the caller serializes with it. chunked: frames of
 * zchunk_min or more would go in chunks, pipelined. */
static gser_status_t send_link_serialize(gser_ucx_ep_t *ep, gser_context_t *ctx, const gser_msg_t *msg,
                                         gser_serialize_options_t *so, bool chunked, gser_frames_t **f)
{
    gser_ucx_worker_t *w = ep->worker;
    gser_serialize_options_t raw = *so;
    raw.compression = GSER_COMPRESSION_NONE;
    gser_frames_t *rf = NULL;
    gser_status_t st = gser_serialize(ctx, msg, &raw, &rf);
    if (st)
        return gux_fail(st, "serialize: %s", gser_context_get_last_error(ctx));
    if ((st = gser_frames_wait(rf))) {
        gux_fail(st, "serialize: device work failed: %s", gser_context_get_last_error(ctx));
        gser_frames_destroy(rf);
        return st;
    }
    const gser_frame_t *fr = gser_frames_get_array(rf);
    size_t n = gser_frames_get_count(rf);
    bool pipelined = false, any = false;
    for (size_t i = 1; i < n; i++) {
        bool host = fr[i].memory == GSER_MEMORY_HOST && fr[i].size >= GSER_COMPRESS_MIN_SIZE;
        any |= host;
        pipelined |= host && chunked && fr[i].size >= w->zchunk_min;
    }
    /* zstd at its fast level 1 unless the worker names one (lz4: acceleration 1, its default) */
    if (!so->compression_level)
        so->compression_level = 1;
    int codec = GSER_COMPRESSION_NONE; /* nothing to compress without a large host frame */
    if (any && (st = gser_ucx_ep_choose_compression(ep, fr, n, pipelined, so->compression_level, &codec))) {
        gser_frames_destroy(rf);
        return st;
    }
    so->compression = codec;
    if (codec == GSER_COMPRESSION_NONE)
        *f = rf;
    else
        gser_frames_destroy(rf);
    return GSER_OK;
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
    bool link_aware = false;
    if ((st = gux_send_codec(ep, &so, &link_aware)))
        return st;
    gser_ucx_worker_t *w = ep->worker;
    gux_lock(w);
    bool chunked = gux_ep_chunked(ep);
    gux_unlock(w);
    gser_frames_t *f = NULL;
    if (link_aware && (st = send_link_serialize(ep, ctx, msg, &so, chunked, &f)))
        return st;
    /* Frames the endpoint sends in compressed chunks, pipelined with the
     * sending, are left uncompressed by the serializer. */
    int zcodec = GSER_COMPRESSION_NONE;
    if (chunked && (so.compression == GSER_COMPRESSION_LZ4 || so.compression == GSER_COMPRESSION_ZSTD)) {
        zcodec = so.compression;
        size_t max = w->zchunk_min - 1; /* zchunk_min >= 1: 0 means the default */
        if (!so.compression_max_size || so.compression_max_size > max)
            so.compression_max_size = max;
    }
    if (!f && (st = gser_serialize(ctx, msg, &so, &f)))
        return gux_fail(st, "serialize: %s", gser_context_get_last_error(ctx));
    if ((st = gser_frames_wait(f))) {
        gux_fail(st, "serialize: device work failed: %s", gser_context_get_last_error(ctx));
        goto out;
    }
    st = send_wait(ep, gser_frames_get_array(f), gser_frames_get_count(f), timeout_ms, zcodec, so.compression_level,
                   link_aware);
out:
    gser_frames_destroy(f);
    return st;
}
