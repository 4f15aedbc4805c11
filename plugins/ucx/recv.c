/* Receiving a message: probe for the next head from an endpoint (or any),
 * receive it, check it against the limits, allocate the frames per memory
 * kind, and receive the frames that did not travel inline. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- frame memory ------------------------------------------------------------------------ */

/* Frame 0 (the header) starts inside the head buffer, which it owns. */
static void head_release(void *data, void *arg)
{
    (void)data;
    free(arg);
}

/* Heads of up to GUX_HEAD_POOLED bytes (a small message's, whole) get a
 * buffer of exactly that size, and the process keeps one such buffer when
 * released: a stream of small messages then receives without a malloc and a
 * free each, in whichever thread the messages end. */
#define GUX_HEAD_POOLED 256
static _Atomic(unsigned char *) spare_head;

static unsigned char *head_alloc(size_t size, bool *pooled)
{
    *pooled = size <= GUX_HEAD_POOLED;
    if (!*pooled)
        return malloc(size);
    unsigned char *b = atomic_exchange_explicit(&spare_head, NULL, memory_order_acquire);
    return b ? b : malloc(GUX_HEAD_POOLED);
}

static void head_free(unsigned char *b, bool pooled)
{
    unsigned char *none = NULL;
    if (b && pooled &&
        atomic_compare_exchange_strong_explicit(&spare_head, &none, b, memory_order_release, memory_order_relaxed))
        return;
    free(b);
}

static void head_release_pooled(void *data, void *arg)
{
    (void)data;
    head_free(arg, true);
}

/* What frame 0 releases r's head buffer with. */
static gser_release_fn head_release_of(const gser_ucx_request_t *r)
{
    return r->rhead_pooled ? head_release_pooled : head_release;
}

gser_status_t gux_frame_alloc(gser_ucx_worker_t *w, size_t size, gser_memory_t *memory, int32_t device,
                              gser_frame_t *out)
{
    if (*memory == GSER_MEMORY_DEVICE && w->have_device)
        return gux_staging_device_frame(w, size, device, out);
    /* Host frames, and device frames on a worker without a device backend:
     * the bytes arrive intact in host memory and the frame says so. */
    *memory = GSER_MEMORY_HOST;
    return gux_pool_frame(w->pool, size, out);
}

void gux_recv_release(gser_ucx_request_t *r)
{
    if (r->frames) {
        bool head_owned = r->frames[0].release != NULL;
        if (!r->taken)
            for (size_t i = 0; i < r->nframes; i++)
                if (r->frames[i].release)
                    r->frames[i].release((void *)r->frames[i].data, r->frames[i].release_arg);
        if (head_owned)
            r->rhead = NULL;
        if (r->frames != r->frames_inline)
            free(r->frames);
        r->frames = NULL;
    }
    if (r->rhead) {
        head_free(r->rhead, r->rhead_pooled);
        r->rhead = NULL;
    }
    if (r->table && r->table != r->table_inline)
        free(r->table);
    r->table = NULL;
}

/* ---- posting ----------------------------------------------------------------------------- */

/* The peer closed and every message it sent whole has been taken: a head
 * that follows is of a message it canceled, never delivered. */
static bool peer_done(const gser_ucx_ep_t *ep)
{
    return ep->peer_sent_known && (int32_t)(ep->heads - ep->peer_sent) >= 0;
}


static gser_status_t post_recv(gser_ucx_request_t *r)
{
    gser_ucx_worker_t *w = r->worker;
    r->kind = GUX_REQ_RECV;
    r->stage = GUX_RECV_WAIT_HEAD;
    gux_list_push(&w->recvs, &r->wlink);
    return GSER_OK;
}

gser_status_t gser_ucx_ep_recv_nb(gser_ucx_ep_t *ep, const gser_ucx_op_params_t *params, gser_ucx_request_t **req_out)
{
    gser_ucx_op_params_t p_ = GSER_UCX_OP_PARAMS_INIT;
    gser_status_t st;
    if ((st = gux_op_params("gser_ucx_ep_recv_nb", &params, &p_)) ||
        (st = gux_op_check("gser_ucx_ep_recv_nb", ep != NULL, req_out != NULL, params)))
        return st;
    gser_ucx_worker_t *w = ep->worker;
    gux_lock(w);
    gux_error_clear();
    if (ep->state >= GUX_EP_FAILED && (!ep->drain || peer_done(ep))) {
        st = gux_fail(ep->error, "receive: %s", ep->why);
        goto out;
    }
    gser_ucx_request_t *r = gux_req_new(w, GUX_REQ_RECV, ep, params, req_out != NULL);
    if (!r) {
        st = GSER_ERR_NO_MEMORY;
        goto out;
    }
    post_recv(r);
    if (req_out)
        *req_out = r;
out:
    gux_unlock(w);
    return st;
}

gser_status_t gser_ucx_worker_recv_nb(gser_ucx_worker_t *w, const gser_ucx_op_params_t *params,
                                      gser_ucx_request_t **req_out)
{
    gser_ucx_op_params_t p_ = GSER_UCX_OP_PARAMS_INIT;
    gser_status_t st;
    if ((st = gux_op_params("gser_ucx_worker_recv_nb", &params, &p_)) ||
        (st = gux_op_check("gser_ucx_worker_recv_nb", w != NULL, req_out != NULL, params)))
        return st;
    gux_lock(w);
    gux_error_clear();
    gser_ucx_request_t *r = gux_req_new(w, GUX_REQ_RECV, NULL, params, req_out != NULL);
    if (!r) {
        st = GSER_ERR_NO_MEMORY;
        goto out;
    }
    r->any = true;
    post_recv(r);
    if (req_out)
        *req_out = r;
out:
    gux_unlock(w);
    return st;
}

/* ---- heads ------------------------------------------------------------------------------- */

static void head_cb(void *ucx_req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)info;
    ucp_request_free(ucx_req);
    gux_req_part_done(user_data, st);
}

/* The message is bad: the request ends with st and the endpoint is closed. */
static void reject(gser_ucx_request_t *r, gser_status_t st)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", gser_ucx_get_last_error());
    gser_ucx_ep_t *ep = r->ep;
    gux_req_complete(r, st); /* r may be gone after this */
    if (ep)
        gux_ep_fail(ep, st);
    gux_fail(st, "%s", msg);
}

/* Receive the head described by msg into a buffer of its size. */
static void head_start(gser_ucx_request_t *r, ucp_tag_message_h msg, const ucp_tag_recv_info_t *info)
{
    gser_ucx_worker_t *w = r->worker;
    ucp_tag_recv_info_t imm;
    ucp_request_param_t p = gux_recv_param(head_cb, r, UCS_MEMORY_TYPE_HOST, &imm);
    gser_ucx_ep_t *ep = r->ep;
    r->msg_no = ep->heads++;
    r->head_round = w->rounds;
    if (ep->drain_until || ep->state >= GUX_EP_FAILED)
        w->eps_dirty = true; /* perhaps the last message the closed peer sent, or one torn (ep_process) */
    /* A short head lands past the 7 bytes it left out, which are written
     * back in front of it once it is in (head_parse). */
    r->short_head = gux_tag_kind(info->sender_tag) == GUX_KIND_SHORT;
    r->seq = gux_tag_seq(info->sender_tag);
    size_t skip = r->short_head ? GUX_SHORT_PREFIX_LEN : 0;
    size_t len = info->length;
    uint64_t max = r->short_head ? w->max_bytes : w->head_max; /* for the bytes with the magic back */
    size_t min = r->short_head ? 1 : GUX_HEAD_FIXED;
    gser_status_t bad = len > max || len + skip > max ? GSER_ERR_LIMIT_BYTES : len < min ? GSER_ERR_TRUNCATED : GSER_OK;
    /* A head that is over the limits or too short is still taken off UCX's
     * queue, into a small buffer (UCX truncates it, never moving the rest),
     * before the endpoint is closed. */
    size_t cap = bad ? GUX_HEAD_FIXED : len;
    r->rhead = head_alloc(skip + cap, &r->rhead_pooled);
    if (!r->rhead) {
        bad = GSER_ERR_NO_MEMORY;
        cap = 0;
    }
    r->rhead_len = skip + len;
    r->stage = GUX_RECV_HEAD;
    r->outstanding++;
    gser_status_t st = gux_req_track(r, ucp_tag_msg_recv_nbx(w->ucp, r->rhead ? r->rhead + skip : NULL, cap, msg, &p),
                                     "receive: ucp_tag_msg_recv_nbx", false);
    if (bad) {
        /* Said after the receive, whose truncation is not the news. */
        const char *form = r->short_head ? " (short form)" : "";
        if (bad == GSER_ERR_LIMIT_BYTES)
            gux_fail(bad, "receive: a %zu-byte message head%s is over the limits", len, form);
        else if (bad == GSER_ERR_TRUNCATED)
            gux_fail(bad, "receive: a %zu-byte message head%s is shorter than the %zu bytes it needs", len, form, min);
        else
            gux_fail(bad, "receive: cannot allocate a %zu-byte head", len);
        r->fail_status = bad;
        reject(r, bad);
    } else if (st) {
        reject(r, st);
    } else if (r->outstanding == 0) {
        gux_recv_ready(r);
    }
}

/* Drop a message nobody can receive (its endpoint is gone). */
static void discard(gser_ucx_worker_t *w, ucp_tag_message_h msg, const ucp_tag_recv_info_t *info)
{
    gser_ucx_request_t *r = gux_req_new(w, GUX_REQ_RECV, NULL, NULL, false);
    if (!r)
        return; /* it stays in UCX's queue until the worker goes */
    r->stage = GUX_RECV_DISCARD;
    r->fail_status = GSER_ERR_CANCELED;
    r->status = GSER_ERR_CANCELED; /* nobody waits for it */
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv = head_cb,
        .user_data = r,
    };
    (void)info;
    r->rhead = malloc(GUX_HEAD_FIXED); /* truncated on purpose: the bytes do not matter */
    r->outstanding++;
    gux_req_track(r, ucp_tag_msg_recv_nbx(w->ucp, r->rhead, r->rhead ? GUX_HEAD_FIXED : 0, msg, &p),
                  "discard: ucp_tag_msg_recv_nbx", false);
    gux_req_release_if_idle(r);
}

unsigned gux_recv_purge(gser_ucx_worker_t *w, uint64_t tag, uint64_t mask)
{
    unsigned n = 0;
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg;
    while (w->ucp && (msg = ucp_tag_probe_nb(w->ucp, tag, mask, 1, &info))) {
        discard(w, msg, &info);
        n++;
    }
    return n;
}

unsigned gux_recvs_match(gser_ucx_worker_t *w)
{
    unsigned n = 0;
    gux_list_t *it = w->recvs.next;
    while (it != &w->recvs) {
        gser_ucx_request_t *r = gux_container(it, gser_ucx_request_t, wlink);
        it = it->next;
        ucp_tag_recv_info_t info;
        ucp_tag_message_h msg;
        if (r->any) {
            msg = ucp_tag_probe_nb(w->ucp, gux_tag(0, GUX_KIND_HEAD, 0), GUX_TAG_MASK_HEADS, 1, &info);
            if (!msg)
                continue;
            gser_ucx_ep_t *ep = gux_ep_lookup(w, gux_tag_conn(info.sender_tag));
            if (!ep || ep->state == GUX_EP_CLOSED || (ep->state == GUX_EP_FAILED && !ep->drain) || peer_done(ep)) {
                discard(w, msg, &info);
                it = &r->wlink; /* probe again for the same receive */
                continue;
            }
            r->ep = ep;
            gux_list_push(&ep->reqs, &r->elink);
        } else {
            gser_ucx_ep_t *ep = r->ep;
            msg = peer_done(ep) ? NULL
                                : ucp_tag_probe_nb(w->ucp, gux_tag(ep->local_id, GUX_KIND_HEAD, 0),
                                                   GUX_TAG_MASK_CONN_HEADS, 1, &info);
            if (!msg) {
                /* Everything the peer sent before it went is delivered:
                 * what UCX holds, and what a peer that closed said it sent. */
                if (ep->state >= GUX_EP_FAILED && !ep->drain_until) {
                    gux_fail(ep->error, "receive: %s", ep->why);
                    gux_req_complete(r, ep->error);
                    n++;
                }
                continue;
            }
        }
        n++;
        gux_list_del(&r->wlink);
        head_start(r, msg, &info);
        it = w->recvs.next; /* head_start may have completed others (a rejected endpoint) */
    }
    return n;
}

/* Restore a short head's magic or parse a full head's fixed part into
 * *info, and check that the message is the one due from the peer. */
static gser_status_t head_fixed(gser_ucx_request_t *r, gux_head_info_t *info)
{
    gser_ucx_ep_t *ep = r->ep;
    gser_status_t st;
    if (r->short_head) {
        /* The magic back in front; the sequence number came in the tag. */
        memcpy(r->rhead, GUX_SHORT_PREFIX, GUX_SHORT_PREFIX_LEN);
        info->seq = r->seq;
    } else if ((st = gux_head_parse_fixed(r->rhead, r->rhead_len, r->worker->max_frames, info))) {
        return st;
    }
    if (info->seq != (ep->recv_seq & GUX_SEQ_MASK))
        return gux_fail(GSER_ERR_FORMAT, "receive: message %u arrived where message %u was due", info->seq,
                        ep->recv_seq & GUX_SEQ_MASK);
    ep->recv_seq++;
    r->seq = info->seq;
    return GSER_OK;
}

/* Complete r with a short head's one frame, the buffer: nothing else is on
 * the way (no table to read, no frame to receive). */
static void head_short_complete(gser_ucx_request_t *r)
{
    r->frames = r->frames_inline;
    r->frames[0] = (gser_frame_t){.data = r->rhead, .size = r->rhead_len, .memory = GSER_MEMORY_HOST,
                                  .release = head_release_of(r), .release_arg = r->rhead};
    r->nframes = 1;
    r->stage = GUX_RECV_FRAMES;
    gux_req_complete(r, GSER_OK);
}

/* Allocate r's frame table and zeroed frames for info->nframes and read the
 * table from the head, within the worker's limits. */
static gser_status_t head_table(gser_ucx_request_t *r, gux_head_info_t *info)
{
    gser_ucx_worker_t *w = r->worker;
    size_t n = info->nframes;
    if (n <= GUX_FRAMES_INLINE) {
        r->table = r->table_inline;
        r->frames = r->frames_inline;
        memset(r->frames, 0, n * sizeof *r->frames);
    } else {
        r->table = malloc(n * sizeof *r->table);
        r->frames = calloc(n, sizeof *r->frames);
    }
    if (!r->table || !r->frames)
        return gux_fail(GSER_ERR_NO_MEMORY, "receive: out of memory for a %zu-frame table", n);
    r->nframes = n;
    gser_status_t st = gux_head_parse_table(r->rhead, r->rhead_len, w->max_bytes, info, r->table);
    if (st)
        return st;
    for (size_t i = 1; i < n; i++) {
        const gux_head_frame_t *t = &r->table[i];
        if (t->route != GUX_ROUTE_ZCHUNKED)
            continue;
        /* only what this side announced: chunks at all, and the codec */
        uint32_t bit = t->codec == GSER_COMPRESSION_LZ4 ? GSER_UCX_CAP_LZ4 : GSER_UCX_CAP_ZSTD;
        if (!(r->read_codecs & GSER_UCX_CAP_CHUNKED) || !(r->read_codecs & bit))
            return gux_fail(GSER_ERR_COMPRESSED,
                            "receive: frame %zu came in %s-compressed chunks, which this side did not announce in its "
                            "handshake",
                            i, t->codec == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd");
    }
    if (info->chunk && info->chunk > w->max_bytes)
        return gux_fail(GSER_ERR_LIMIT_BYTES, "receive: a staging chunk of %u bytes is over the limits",
                        info->chunk);
    return GSER_OK;
}

/* Point frame 0 (which owns the head buffer) and the inlined frames into
 * the head, and tell the pool how many host bytes the other frames bring. */
static void head_frames_inline(gser_ucx_request_t *r)
{
    gser_ucx_worker_t *w = r->worker;
    size_t n = r->nframes;
    for (size_t i = 0; i < n; i++) {
        const gux_head_frame_t *t = &r->table[i];
        if (t->route != GUX_ROUTE_INLINE)
            continue;
        r->frames[i] = (gser_frame_t){.data = r->rhead + t->offset, .size = (size_t)t->size,
                                      .memory = GSER_MEMORY_HOST};
    }
    r->frames[0].release = head_release_of(r);
    r->frames[0].release_arg = r->rhead;

    size_t host_bytes = 0;
    for (size_t i = 1; i < n; i++)
        if (r->table[i].route != GUX_ROUTE_INLINE && (r->table[i].memory == GSER_MEMORY_HOST || !w->have_device))
            host_bytes += (size_t)r->table[i].size; /* the table's total is within max_bytes */
    gux_pool_expect(w->pool, host_bytes);
}

/* Post the tagged receive of r's allocated frame i, as one more outstanding
 * part. */
static gser_status_t frame_recv_post(gser_ucx_request_t *r, size_t i, gser_memory_t mem, uint64_t ftag)
{
    ucp_tag_recv_info_t imm;
    ucs_memory_type_t umem = mem == GSER_MEMORY_DEVICE ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    ucp_request_param_t p = gux_recv_param(gux_recv_cb, r, umem, &imm);
    r->outstanding++;
    return gux_req_track(r,
                         ucp_tag_recv_nbx(r->worker->ucp, (void *)r->frames[i].data, r->frames[i].size, ftag,
                                          GUX_TAG_MASK_ALL, &p),
                         "receive: ucp_tag_recv_nbx", true);
}

/* Allocate the frames that do not travel inline and receive them: tagged
 * ones directly, staged ones through the staging part. Stops at the first
 * error, with frames of the message perhaps on the way. */
static gser_status_t frames_recv_post(gser_ucx_request_t *r, const gux_head_info_t *info)
{
    gser_ucx_worker_t *w = r->worker;
    uint64_t ftag = gux_tag(r->ep->local_id, GUX_KIND_FRAME, info->seq);
    bool staged = false;
    gser_status_t st = GSER_OK;
    r->posting = true;
    for (size_t i = 1; i < r->nframes && !st; i++) {
        const gux_head_frame_t *t = &r->table[i];
        if (t->route == GUX_ROUTE_INLINE)
            continue;
        gser_memory_t mem = (gser_memory_t)t->memory;
        if ((st = gux_frame_alloc(w, (size_t)t->size, &mem, t->device, &r->frames[i])))
            break;
        if (t->route == GUX_ROUTE_STAGED || t->route == GUX_ROUTE_ZCHUNKED)
            staged = true; /* both through the staging part, in frame order */
        else
            st = frame_recv_post(r, i, mem, ftag);
    }
    if (!st && staged) {
        r->chunk = info->chunk;
        r->outstanding++; /* the staging part */
        gux_staging_advance(r);
    }
    r->posting = false;
    return st;
}

/* The head is in: check it, set up the frames, receive the large ones. */
static void head_parse(gser_ucx_request_t *r)
{
    gux_head_info_t info;
    gser_status_t st = head_fixed(r, &info);
    if (!st && r->short_head) {
        head_short_complete(r);
        return;
    }
    if (!st && !(st = head_table(r, &info))) {
        head_frames_inline(r);
        r->stage = GUX_RECV_FRAMES;
        st = frames_recv_post(r, &info);
    }
    if (st) {
        /* Frames of this message may be on the way: the stream is torn. */
        reject(r, st);
        return;
    }
    if (r->outstanding == 0)
        gux_recv_ready(r);
}

void gux_recv_ready(gser_ucx_request_t *r)
{
    if (r->status != GSER_INPROGRESS) {
        gux_req_release_if_idle(r);
        return;
    }
    gser_ucx_ep_t *ep = r->ep;
    if (r->fail_status || r->first_error != UCS_OK) {
        gser_status_t st = r->fail_status;
        if (st && r->fail_why[0])
            gux_fail(st, "%s", r->fail_why);
        if (!st)
            st = gux_ep_part_error(ep, r->first_error, "receive");
        reject(r, st);
        return;
    }
    if (r->stage == GUX_RECV_HEAD)
        head_parse(r);
    else
        gux_req_complete(r, GSER_OK);
}

/* ---- handing frames over --------------------------------------------------------------------- */

static gser_status_t check_taken(const gser_ucx_request_t *r, const char *what)
{
    if (r->kind != GUX_REQ_RECV)
        return gux_fail(GSER_ERR_INVALID_ARG, "%s: not a receive", what);
    if (r->status != GSER_OK)
        return gux_fail(r->status == GSER_INPROGRESS ? GSER_ERR_STATE : r->status, "%s: the receive %s", what,
                        r->status == GSER_INPROGRESS ? "is still running" : "failed");
    if (r->taken || !r->frames)
        return gux_fail(GSER_ERR_STATE, "%s: the frames were taken already", what);
    return GSER_OK;
}

/* The header's wire version is a positive fixint after its 7-byte magic
 * (wire-format.md section 3.1). */
#define HEADER_VERSION_AT 7

gser_status_t gser_ucx_request_get_size(const gser_ucx_request_t *r, size_t *size_out, bool *compressed_out)
{
    if (!r || !size_out || !compressed_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_request_get_size: bad argument");
    gser_status_t st = check_taken(r, "gser_ucx_request_get_size");
    if (st)
        return st;
    size_t n = 0;
    for (size_t i = 0; i < r->nframes; i++)
        n += r->frames[i].size;
    const gser_frame_t *h = &r->frames[0];
    const unsigned char *p = h->data;
    *size_out = n;
    *compressed_out = h->size > HEADER_VERSION_AT && p[HEADER_VERSION_AT] >= 3 && p[HEADER_VERSION_AT] <= 0x7f;
    return GSER_OK;
}

gser_status_t gser_ucx_request_take(gser_ucx_request_t *r, gser_ucx_recv_t *out)
{
    if (!r || !out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_request_take: bad argument");
    if (out->size < sizeof out->size)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_request_take: out->size is %zu: use GSER_UCX_RECV_INIT",
                        out->size);
    gser_status_t st = check_taken(r, "gser_ucx_request_take");
    if (st)
        return st;
    if (r->frames == r->frames_inline) {
        /* The caller frees the array with gser_ucx_recv_release. */
        gser_frame_t *a = malloc(r->nframes * sizeof *a);
        if (!a)
            return gux_fail(GSER_ERR_NO_MEMORY, "gser_ucx_request_take: out of memory");
        memcpy(a, r->frames, r->nframes * sizeof *a);
        r->frames = a;
    }
    gser_ucx_recv_t res = {sizeof res, r->frames, r->nframes, r->ep};
    gser_struct_write(out, &res, sizeof res);
    r->frames = NULL;
    r->rhead = NULL;
    r->taken = true;
    return GSER_OK;
}

void gser_ucx_recv_release(gser_ucx_recv_t *recv, bool handed_over)
{
    if (!recv)
        return;
    if (!handed_over && recv->frames)
        for (size_t i = 0; i < recv->nframes; i++)
            if (recv->frames[i].release)
                recv->frames[i].release((void *)recv->frames[i].data, recv->frames[i].release_arg);
    free(recv->frames);
    recv->frames = NULL;
    recv->nframes = 0;
    recv->ep = NULL;
}

void gser_ucx_recv_finish(gser_ucx_recv_t *recv, bool handed_over)
{
    gser_ucx_recv_release(recv, handed_over);
}

/* Statuses that say the bytes themselves are bad. */
static bool malformed(gser_status_t st)
{
    switch (st) {
    case GSER_ERR_BAD_MAGIC:
    case GSER_ERR_WIRE_VERSION:
    case GSER_ERR_FORMAT:
    case GSER_ERR_TRUNCATED:
    case GSER_ERR_FRAME:
    case GSER_ERR_LIMIT_DEPTH:
    case GSER_ERR_LIMIT_NODES:
    case GSER_ERR_LIMIT_FRAMES:
    case GSER_ERR_LIMIT_BYTES:
    case GSER_ERR_COMPRESSED:
        return true;
    default:
        return false;
    }
}

/* A compressed frame must be in a codec this side announced: a peer that
 * sends another one does not follow the handshake, and its endpoint is
 * closed (by reject) as for any malformed message. Reads only the request,
 * so that it may run off the worker's thread. */
static gser_status_t check_codecs(const gser_ucx_request_t *r, size_t nframes, const gser_msg_t *msg)
{
    for (size_t i = 1; i < nframes; i++) {
        int codec;
        size_t wire;
        if (gser_msg_get_frame_codec(msg, i, &codec, &wire) || codec == GSER_COMPRESSION_NONE)
            continue;
        uint32_t bit = codec == GSER_COMPRESSION_LZ4 ? GSER_UCX_CAP_LZ4 : codec == GSER_COMPRESSION_ZSTD ? GSER_UCX_CAP_ZSTD : 0;
        if (bit && (r->read_codecs & bit))
            continue;
        const char *name = codec == GSER_COMPRESSION_LZ4 ? "lz4" : codec == GSER_COMPRESSION_ZSTD ? "zstd" : "an unknown codec";
        return gux_fail(GSER_ERR_COMPRESSED,
                        "deserialize: frame %zu came compressed with %s, a codec this side did not announce in "
                        "its handshake",
                        i, name);
    }
    return GSER_OK;
}

gser_status_t gser_ucx_request_deserialize_detached(gser_ucx_request_t *r, gser_context_t *ctx,
                                                    const gser_deserialize_options_t *opts, gser_msg_t **msg_out)
{
    if (!r || !ctx || !msg_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_request_deserialize: bad argument");
    gser_status_t st = check_taken(r, "gser_ucx_request_deserialize");
    if (st)
        return st;
    gser_msg_t *msg;
    size_t nframes = r->nframes;
    st = gser_deserialize(ctx, r->frames, nframes, opts, &msg);
    if (st)
        return gux_fail(st, "deserialize: %s", gser_context_get_last_error(ctx));
    /* The message owns the frame memory now; the frame array was copied. */
    r->taken = true;
    r->rhead = NULL;
    if ((st = check_codecs(r, nframes, msg))) {
        gser_msg_destroy(msg);
        return st;
    }
    *msg_out = msg;
    return GSER_OK;
}

gser_status_t gser_ucx_request_reject(gser_ucx_request_t *r, gser_status_t st)
{
    gser_ucx_worker_t *w = r ? r->worker : NULL;
    if (!malformed(st) || !w || !r->ep)
        return st;
    /* This thread's message says what was wrong; closing may rewrite it. */
    char why[512];
    snprintf(why, sizeof why, "%s", gser_ucx_get_last_error());
    gux_lock(w);
    gux_ep_fail(r->ep, st);
    gux_unlock(w);
    return gux_fail(st, "%s (the endpoint was closed)", why[0] ? why : gser_status_str(st));
}

gser_status_t gser_ucx_request_deserialize(gser_ucx_request_t *r, gser_context_t *ctx,
                                           const gser_deserialize_options_t *opts, gser_msg_t **msg_out)
{
    gser_status_t st = gser_ucx_request_deserialize_detached(r, ctx, opts, msg_out);
    return st ? gser_ucx_request_reject(r, st) : GSER_OK;
}

/* ---- blocking receives -------------------------------------------------------------------- */

static gser_status_t recv_wait_deserialize(gser_ucx_request_t *r, int timeout_ms, gser_context_t *ctx,
                                 const gser_deserialize_options_t *opts, gser_msg_t **msg_out, gser_ucx_ep_t **ep_out)
{
    gser_status_t st = gser_ucx_request_wait(r, timeout_ms);
    if (st == GSER_ERR_TIMEOUT) {
        /* Not started: canceled cleanly. Halfway: the endpoint is closed. */
        bool started = r->stage != GUX_RECV_WAIT_HEAD;
        gser_ucx_request_free(r);
        return gux_fail(GSER_ERR_TIMEOUT, "receive: no message within %d ms%s", timeout_ms,
                        started ? " (it had started: the endpoint was closed)" : "");
    }
    if (st == GSER_OK) {
        gser_ucx_ep_t *ep = r->ep;
        gser_msg_t *m;
        st = gser_ucx_request_deserialize(r, ctx, opts, &m);
        if (st == GSER_OK) {
            *msg_out = m;
            if (ep_out)
                *ep_out = ep;
        }
    }
    gser_ucx_request_free(r);
    return st;
}

gser_status_t gser_ucx_ep_recv_msg(gser_ucx_ep_t *ep, gser_context_t *ctx, const gser_deserialize_options_t *opts,
                                   int timeout_ms, gser_msg_t **msg_out)
{
    if (!ep || !ctx || !msg_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_recv_msg: bad argument");
    gser_ucx_request_t *r;
    gser_status_t st = gser_ucx_ep_recv_nb(ep, NULL, &r);
    if (st)
        return st;
    return recv_wait_deserialize(r, timeout_ms, ctx, opts, msg_out, NULL);
}

gser_status_t gser_ucx_worker_recv_msg(gser_ucx_worker_t *w, gser_context_t *ctx,
                                       const gser_deserialize_options_t *opts, int timeout_ms, gser_msg_t **msg_out,
                                       gser_ucx_ep_t **ep_out)
{
    if (!w || !ctx || !msg_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_recv_msg: bad argument");
    gser_ucx_request_t *r;
    gser_status_t st = gser_ucx_worker_recv_nb(w, NULL, &r);
    if (st)
        return st;
    return recv_wait_deserialize(r, timeout_ms, ctx, opts, msg_out, ep_out);
}
