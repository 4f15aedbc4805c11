/* Device frames through a UCX that cannot touch device memory: staged in
 * chunks through pinned host bounce buffers, pipelined.
 *
 * Each staged frame is cut into chunks of the worker's staging_chunk
 * bytes. A request works on its staged frames one after another, in frame
 * order (both sides agree on the order of the chunk messages that way), with
 * up to staging_depth chunks in flight:
 *
 *   send:    copy D2H into a bounce buffer -> event done -> tagged send ->
 *            send done -> the slot takes the next chunk
 *   receive: tagged receive into a bounce buffer -> copy H2D -> event done
 *            -> the slot takes the next chunk
 *
 * so the copy of chunk i+1 overlaps the transfer of chunk i. Sends go out
 * in chunk order (a chunk whose copy finished early waits for the ones
 * before it). When the receiver has no device backend the chunks land
 * directly in its host frame, without bounce buffers. Bounce buffers and
 * events come from a per-worker pool and go back to it.
 *
 * Host frames sent in compressed chunks (route 3, GSER_UCX_CAP_CHUNKED)
 * take the same pipeline, in the same frame order, with the codec in
 * place of the copies and at most GUX_ZDEPTH chunk buffers per frame:
 *
 *   send:    compress chunk i into a buffer -> tagged send (UCX progressed
 *            once) -> compress chunk i+1 while chunk i is on the wire
 *   receive: tagged receive into a buffer -> decompress into the frame
 *            (the receives of chunks i+1.. are posted meanwhile) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>

#include "internal.h"

typedef enum slot_state { SLOT_FREE = 0, SLOT_COPY = 1, SLOT_XFER = 2 } slot_state_t;

typedef struct gux_slot {
    gux_stage_op_t *op;
    slot_state_t state;
    size_t chunk;
    void *bounce; /* pinned, chunk bytes; NULL when receiving straight into host memory */
    gser_event_t *ev;
    void *ucx_req;
    bool xfer_done;
    ucs_status_t xfer_status;
    unsigned char *zbuf; /* compressed chunks: the flag byte and the chunk (malloc'd, zcap bytes) */
    size_t zcap;
    size_t zlen; /* received: the chunk message's length */
    size_t timed; /* sent: its length when the link times it (link.c), else 0 */
} gux_slot_t;

/* Chunk buffers in flight per frame sent or received in compressed chunks. */
#define GUX_ZDEPTH 3u
/* A chunk travels compressed when it shrinks to this fraction (Dask's 0.9). */
#define GUX_ZPAYS GSER_COMPRESS_THRESHOLD

struct gux_stage_op {
    gser_ucx_request_t *req;
    gux_list_t link; /* in staging->ops */
    bool send;
    size_t frame; /* frame being staged; nframes when none is left */
    char *base;   /* the frame's bytes (device memory, or host when receiving without a device) */
    size_t size, chunk, nchunks;
    size_t next_issue; /* chunks started */
    size_t next_post;  /* send: chunks handed to UCX */
    size_t done;       /* chunks finished */
    bool aborting;
    ucs_status_t error;
    size_t bounce_size; /* the peer's chunk when receiving */
    bool pooled;        /* bounce buffers of the pool's size */
    size_t stage_chunk; /* the staging chunk (op->chunk is the current frame's) */
    bool z;             /* the current frame goes in compressed chunks */
    int zcodec;         /* ... in this codec */
    unsigned depth;
    gux_slot_t slots[];
};

struct gux_staging {
    gux_list_t ops;
    void *stream; /* the staging copies' own stream: not behind the progressing thread's work */
    void **bounces; /* free pinned buffers */
    size_t nbounces, bounces_cap;
    gser_event_t **events; /* free events */
    size_t nevents, events_cap;
    ZSTD_CCtx *zc; /* zstd's contexts for compressed chunks, kept: making one per chunk costs more than */
    ZSTD_DCtx *zd; /* a 4 MiB chunk of well-compressing data takes to compress */
};

/* ---- pool -------------------------------------------------------------------------------- */

static void bounce_put(gux_stage_op_t *op, void *b);
static void event_put(gser_ucx_worker_t *w, gser_event_t *e);

gser_status_t gux_staging_create(gser_ucx_worker_t *w)
{
    /* Also without a device: staged chunks then land in host frames. */
    w->have_device = w->gser_ctx && gser_context_has_device(w->gser_ctx);
    gux_staging_t *s = calloc(1, sizeof *s);
    if (!s)
        return gux_fail(GSER_ERR_NO_MEMORY, "staging: out of memory");
    gser_status_t st;
    if (w->have_device && (st = gser_stream_create(w->gser_ctx, &s->stream))) {
        free(s);
        return gux_fail(st, "staging: cannot create a stream: %s", gser_context_get_last_error(w->gser_ctx));
    }
    gux_list_init(&s->ops);
    w->staging = s;
    return GSER_OK;
}

void gux_staging_destroy(gser_ucx_worker_t *w)
{
    gux_staging_t *s = w->staging;
    if (!s)
        return;
    /* Ops still here at teardown: let their copies finish, then drop them. */
    if (w->have_device && !gux_list_empty(&s->ops))
        gser_stream_wait(w->gser_ctx, s->stream);
    while (!gux_list_empty(&s->ops)) {
        gux_stage_op_t *op = gux_container(s->ops.next, gux_stage_op_t, link);
        for (unsigned i = 0; i < op->depth; i++) {
            bounce_put(op, op->slots[i].bounce);
            event_put(w, op->slots[i].ev);
            free(op->slots[i].zbuf);
        }
        gux_list_del(&op->link);
        op->req->stage_op = NULL;
        free(op);
    }
    for (size_t i = 0; i < s->nbounces; i++)
        gser_pinned_free(w->gser_ctx, s->bounces[i], w->chunk);
    for (size_t i = 0; i < s->nevents; i++)
        gser_event_destroy(s->events[i]);
    free(s->bounces);
    free(s->events);
    ZSTD_freeCCtx(s->zc);
    ZSTD_freeDCtx(s->zd);
    gser_stream_destroy(w->gser_ctx, s->stream);
    free(s);
    w->staging = NULL;
}

static bool push_ptr(void ***arr, size_t *n, size_t *cap, void *p)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        void **a = realloc(*arr, c * sizeof *a);
        if (!a)
            return false;
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = p;
    return true;
}

static gser_status_t bounce_get(gux_stage_op_t *op, void **out)
{
    gser_ucx_worker_t *w = op->req->worker;
    gux_staging_t *s = w->staging;
    if (op->pooled && s->nbounces) {
        *out = s->bounces[--s->nbounces];
        return GSER_OK;
    }
    gser_status_t st = gser_pinned_alloc(w->gser_ctx, op->bounce_size, out);
    if (st)
        return gux_fail(st, "staging: cannot allocate a %zu-byte pinned bounce buffer: %s", op->bounce_size,
                        gser_context_get_last_error(w->gser_ctx));
    return GSER_OK;
}

static void bounce_put(gux_stage_op_t *op, void *b)
{
    gser_ucx_worker_t *w = op->req->worker;
    gux_staging_t *s = w->staging;
    if (!b)
        return;
    if (!op->pooled || !push_ptr(&s->bounces, &s->nbounces, &s->bounces_cap, b))
        gser_pinned_free(w->gser_ctx, b, op->bounce_size);
}

static gser_status_t event_get(gser_ucx_worker_t *w, gser_event_t **out)
{
    gux_staging_t *s = w->staging;
    if (s->nevents) {
        *out = s->events[--s->nevents];
        return GSER_OK;
    }
    gser_status_t st = gser_event_create(w->gser_ctx, out);
    if (st)
        return gux_fail(st, "staging: cannot create a device event: %s", gser_context_get_last_error(w->gser_ctx));
    return GSER_OK;
}

static void event_put(gser_ucx_worker_t *w, gser_event_t *e)
{
    gux_staging_t *s = w->staging;
    if (!e)
        return;
    if (!push_ptr((void ***)&s->events, &s->nevents, &s->events_cap, e))
        gser_event_destroy(e);
}

/* ---- received device frames ---------------------------------------------------------------- */

typedef struct dev_owner {
    gser_context_t *ctx;
    size_t size;
} dev_owner_t;

/* The staging copies into a frame are done before the frame is handed out
 * (their events were waited for), so whichever stream frees it -- the
 * staging stream may be gone by then -- nothing of gser's still uses it. */
static void dev_release(void *data, void *arg)
{
    dev_owner_t *o = arg;
    gser_device_free(o->ctx, data, o->size, NULL);
    free(o);
}

gser_status_t gux_staging_device_frame(gser_ucx_worker_t *w, size_t size, int32_t device, gser_frame_t *out)
{
    (void)device; /* the sender's GPU: the frame is on ours, the context's */
    dev_owner_t *o = malloc(sizeof *o);
    if (!o)
        return gux_fail(GSER_ERR_NO_MEMORY, "receive: out of memory");
    void *p;
    gser_status_t st = gser_device_alloc(w->gser_ctx, size, w->staging->stream, &p);
    if (st) {
        free(o);
        return gux_fail(st, "receive: cannot allocate a %zu-byte device frame: %s", size,
                        gser_context_get_last_error(w->gser_ctx));
    }
    *o = (dev_owner_t){w->gser_ctx, size};
    *out = (gser_frame_t){.data = p, .size = size, .memory = GSER_MEMORY_DEVICE,
                          .device = gser_context_get_device_ordinal(w->gser_ctx), .release = dev_release,
                          .release_arg = o};
    return GSER_OK;
}

/* ---- the pipeline --------------------------------------------------------------------------- */

static void chunk_send_cb(void *ucx_req, ucs_status_t st, void *user_data)
{
    (void)ucx_req; /* freed when the slot is handled */
    gux_slot_t *s = user_data;
    s->xfer_done = true;
    s->xfer_status = st;
    gser_ucx_request_t *r = s->op->req;
    if (s->timed && st == UCS_OK && r->ep)
        gux_ep_link_done(r->ep, s->timed, gux_now_ms());
    s->timed = 0;
}

static void chunk_recv_cb(void *ucx_req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)ucx_req;
    (void)info;
    gux_slot_t *s = user_data;
    s->xfer_done = true;
    s->xfer_status = st;
}

static void zchunk_recv_cb(void *ucx_req, ucs_status_t st, const ucp_tag_recv_info_t *info, void *user_data)
{
    (void)ucx_req;
    gux_slot_t *s = user_data;
    s->xfer_done = true;
    s->xfer_status = st;
    s->zlen = st == UCS_OK && info ? info->length : 0;
}

static size_t chunk_len(const gux_stage_op_t *op, size_t chunk)
{
    size_t off = chunk * op->chunk;
    return op->size - off < op->chunk ? op->size - off : op->chunk;
}

static uint8_t frame_route(const gser_ucx_request_t *r, size_t i)
{
    return r->kind == GUX_REQ_SEND ? r->routes[i] : r->table[i].route;
}

static bool frame_staged(const gser_ucx_request_t *r, size_t i)
{
    uint8_t route = frame_route(r, i);
    return route == GUX_ROUTE_STAGED || route == GUX_ROUTE_ZCHUNKED;
}

/* Move op to its next staged frame; false when there is none. */
static bool op_next_frame(gux_stage_op_t *op)
{
    gser_ucx_request_t *r = op->req;
    size_t n = r->nframes;
    size_t i = op->frame + 1;
    while (i < n && !frame_staged(r, i))
        i++;
    op->frame = i;
    if (i >= n)
        return false;
    const gser_frame_t *f = op->send ? &r->sframes[i] : &r->frames[i];
    op->base = (char *)f->data;
    op->size = f->size;
    op->z = frame_route(r, i) == GUX_ROUTE_ZCHUNKED;
    if (op->z) {
        op->chunk = op->send ? r->worker->zchunk : r->table[i].zchunk;
        op->zcodec = op->send ? r->zcodec : r->table[i].codec;
    } else {
        op->chunk = op->stage_chunk;
    }
    op->nchunks = (op->size + op->chunk - 1) / op->chunk;
    op->next_issue = op->next_post = op->done = 0;
    return true;
}

static bool op_busy(const gux_stage_op_t *op)
{
    for (unsigned i = 0; i < op->depth; i++)
        if (op->slots[i].state != SLOT_FREE)
            return true;
    return false;
}

static void op_error(gux_stage_op_t *op, ucs_status_t st)
{
    if (op->error == UCS_OK)
        op->error = st;
    op->aborting = true;
}

static unsigned op_inflight(const gux_stage_op_t *op)
{
    unsigned n = 0;
    for (unsigned i = 0; i < op->depth; i++)
        n += op->slots[i].state != SLOT_FREE;
    return n;
}

/* A compressed chunk is bad: the request ends with st (the message names
 * frame and chunk) and the chunk receives still posted are taken back. */
static void op_zfail(gux_stage_op_t *op, gser_status_t st)
{
    gser_ucx_request_t *r = op->req;
    if (!r->fail_status) {
        /* Kept with the request: other calls may say other things before
         * the canceled receives are back and the message is rejected. */
        r->fail_status = st;
        snprintf(r->fail_why, sizeof r->fail_why, "%s", gser_ucx_get_last_error());
    }
    op_error(op, UCS_ERR_INVALID_PARAM);
    for (unsigned i = 0; i < op->depth; i++)
        if (op->slots[i].state == SLOT_XFER && op->slots[i].ucx_req && !op->slots[i].xfer_done)
            ucp_request_cancel(r->worker->ucp, op->slots[i].ucx_req);
}

/* A chunk buffer of at least n bytes in s. */
static bool zbuf_get(gux_slot_t *s, size_t n)
{
    if (s->zcap >= n)
        return true;
    free(s->zbuf);
    s->zcap = 0;
    if (!(s->zbuf = malloc(n)))
        return false;
    s->zcap = n;
    return true;
}

/* Compress src[0..n) into dst (capacity cap): the size, or 0 when it does
 * not fit (did not shrink enough) or failed. */
static size_t zcompress(gux_staging_t *st, int codec, int level, const void *src, size_t n, void *dst, size_t cap)
{
    if (codec == GSER_COMPRESSION_LZ4) {
        int r = LZ4_compress_fast(src, dst, (int)n, (int)cap, level > 1 ? level : 1);
        return r > 0 ? (size_t)r : 0;
    }
    if (!st->zc && !(st->zc = ZSTD_createCCtx()))
        return 0; /* it goes raw */
    size_t r = ZSTD_compressCCtx(st->zc, dst, cap, src, n, level ? level : ZSTD_CLEVEL_DEFAULT);
    return ZSTD_isError(r) ? 0 : r;
}

/* Compress chunk c of op's frame into s's buffer and send it; UCX is
 * progressed once so that it moves while the next chunk is compressed. */
static void zslot_send(gux_stage_op_t *op, gux_slot_t *s, size_t c)
{
    gser_ucx_request_t *r = op->req;
    gser_ucx_worker_t *w = r->worker;
    size_t len = chunk_len(op, c);
    const char *src = op->base + c * op->chunk;
    if (!zbuf_get(s, GUX_ZCHUNK_PREFIX + len)) {
        gux_fail(GSER_ERR_NO_MEMORY, "send: frame %zu, chunk %zu: out of memory for a chunk buffer", op->frame, c);
        op_error(op, UCS_ERR_NO_MEMORY);
        return;
    }
    size_t cap = (size_t)(GUX_ZPAYS * (double)len);
    size_t n = zcompress(w->staging, op->zcodec, r->zlevel, src, len, s->zbuf + GUX_ZCHUNK_PREFIX, cap);
    bool raw = n == 0 || n > cap;
    if (raw) { /* it did not shrink: it goes as it is */
        memcpy(s->zbuf + GUX_ZCHUNK_PREFIX, src, len);
        n = len;
    }
    s->zbuf[0] = (unsigned char)((raw ? GUX_ZCHUNK_RAW : 0) | (c + 1 == op->nchunks ? GUX_ZCHUNK_LAST : 0));
    s->chunk = c;
    s->xfer_done = false;
    s->xfer_status = UCS_OK;
    op->next_issue++;
    if (!r->ep || !r->ep->ucp || r->ep->ucp_release) { /* closed meanwhile: the rest is not sent */
        op_error(op, UCS_ERR_CANCELED);
        return;
    }
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
        .cb.send = chunk_send_cb,
        .user_data = s,
        .memory_type = UCS_MEMORY_TYPE_HOST,
    };
    /* large chunks are timed for the link's rate (link.c) */
    s->timed = GUX_ZCHUNK_PREFIX + n >= GUX_LINK_PART_MIN ? GUX_ZCHUNK_PREFIX + n : 0;
    if (s->timed)
        gux_link_posted(&r->ep->link, gux_now_ms(), false);
    ucs_status_ptr_t sp = ucp_tag_send_nbx(r->ep->ucp, s->zbuf, GUX_ZCHUNK_PREFIX + n,
                                           gux_tag(r->ep->peer_id, GUX_KIND_ZCHUNK, r->seq), &p);
    if (s->timed && !UCS_PTR_IS_PTR(sp)) { /* done at once (or failed): no rate, a codec run's time */
        gux_link_at_once(&r->ep->link, s->timed, gux_now_ms(), UCS_PTR_STATUS(sp) == UCS_OK);
        s->timed = 0;
    }
    op->next_post++;
    if (UCS_PTR_IS_ERR(sp)) {
        GUX_CALL("send: ucp_tag_send_nbx of a compressed chunk", UCS_PTR_STATUS(sp));
        op_error(op, UCS_PTR_STATUS(sp));
        return;
    }
    gser_ucx_chunk_stats_t *zs = &r->ep->zstats;
    zs->chunks_sent++;
    zs->chunks_compressed += !raw;
    zs->frames_sent += c == 0;
    s->ucx_req = sp;
    s->xfer_done = sp == NULL;
    s->state = SLOT_XFER;
    ucp_worker_progress(w->ucp);
}

/* Post the receive of chunk c of op's frame into s's buffer. */
static void zslot_recv(gux_stage_op_t *op, gux_slot_t *s, size_t c)
{
    gser_ucx_request_t *r = op->req;
    gser_ucx_worker_t *w = r->worker;
    size_t cap = GUX_ZCHUNK_PREFIX + chunk_len(op, c); /* longer ones are truncated by UCX: refused */
    if (!zbuf_get(s, cap)) {
        gux_fail(GSER_ERR_NO_MEMORY, "receive: frame %zu, chunk %zu: out of memory for a chunk buffer", op->frame, c);
        op_error(op, UCS_ERR_NO_MEMORY);
        return;
    }
    s->chunk = c;
    s->xfer_done = false;
    s->xfer_status = UCS_OK;
    s->zlen = 0;
    ucp_tag_recv_info_t imm;
    ucp_request_param_t p = gux_recv_param(zchunk_recv_cb, s, UCS_MEMORY_TYPE_HOST, &imm);
    /* Always through the callback, which has the chunk's length (UCX 1.13
     * does not fill imm when it completes at once); it may run before
     * ucp_tag_recv_nbx returns. */
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    ucs_status_ptr_t sp = ucp_tag_recv_nbx(w->ucp, s->zbuf, cap, gux_tag(r->ep->local_id, GUX_KIND_ZCHUNK, r->seq),
                                           GUX_TAG_MASK_ALL, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        GUX_CALL("receive: ucp_tag_recv_nbx of a compressed chunk", UCS_PTR_STATUS(sp));
        op_error(op, UCS_PTR_STATUS(sp));
        return;
    }
    s->ucx_req = sp; /* the callback may have run already: xfer_done stays as it set it */
    if (!sp)
        s->xfer_done = true;
    s->state = SLOT_XFER;
    op->next_issue++;
}

/* Chunk s->chunk arrived: check it and put it in its place in the frame,
 * decompressed to exactly its raw size. */
static void zslot_land(gux_stage_op_t *op, gux_slot_t *s)
{
    gser_ucx_request_t *r = op->req;
    size_t c = s->chunk, len = chunk_len(op, c);
    char *dst = op->base + c * op->chunk;
    if (s->xfer_status == UCS_ERR_MESSAGE_TRUNCATED) {
        gux_fail(GSER_ERR_COMPRESSED, "receive: frame %zu, chunk %zu: longer than the %zu bytes a chunk of %zu may be",
                 op->frame, c, GUX_ZCHUNK_PREFIX + len, len);
        op_zfail(op, GSER_ERR_COMPRESSED);
        return;
    }
    bool raw;
    gser_status_t st = gux_zchunk_check(s->zbuf, s->zlen, op->frame, c, op->nchunks, len, &raw);
    if (st) {
        op_zfail(op, st);
        return;
    }
    const unsigned char *src = s->zbuf + GUX_ZCHUNK_PREFIX;
    size_t n = s->zlen - GUX_ZCHUNK_PREFIX;
    bool ok;
    if (raw) {
        memcpy(dst, src, len);
        ok = true;
    } else if (op->zcodec == GSER_COMPRESSION_LZ4) {
        ok = LZ4_decompress_safe((const char *)src, dst, (int)n, (int)len) == (int)len;
    } else {
        gux_staging_t *stg = r->worker->staging;
        if (!stg->zd && !(stg->zd = ZSTD_createDCtx())) {
            gux_fail(GSER_ERR_NO_MEMORY, "receive: frame %zu, chunk %zu: out of memory for zstd", op->frame, c);
            op_zfail(op, GSER_ERR_NO_MEMORY);
            return;
        }
        size_t got = ZSTD_decompressDCtx(stg->zd, dst, len, src, n);
        ok = !ZSTD_isError(got) && got == len;
    }
    if (!ok) {
        gux_fail(GSER_ERR_COMPRESSED, "receive: frame %zu, chunk %zu: %zu bytes of %s that do not decompress to its %zu",
                 op->frame, c, n, op->zcodec == GSER_COMPRESSION_LZ4 ? "lz4" : "zstd", len);
        op_zfail(op, GSER_ERR_COMPRESSED);
        return;
    }
    gser_ucx_chunk_stats_t *zs = &r->ep->zstats;
    zs->chunks_received++;
    zs->chunks_raw_received += raw;
    zs->frames_received += c + 1 == op->nchunks;
    op->done++;
}

/* Start work on a free slot: a D2H copy (send) or a receive. */
static void slot_issue(gux_stage_op_t *op, gux_slot_t *s)
{
    if (op->z) {
        if (op->send)
            zslot_send(op, s, op->next_issue);
        else
            zslot_recv(op, s, op->next_issue);
        return;
    }
    gser_ucx_request_t *r = op->req;
    gser_ucx_worker_t *w = r->worker;
    size_t c = op->next_issue;
    size_t len = chunk_len(op, c);
    char *at = op->base + c * op->chunk;
    gser_status_t st;
    /* Device frames go through a bounce buffer; host frames (a receiver
     * without a device backend) take the chunks directly. */
    bool device = op->send || r->frames[op->frame].memory == GSER_MEMORY_DEVICE;
    if (device && ((!s->bounce && (st = bounce_get(op, &s->bounce))) || (!s->ev && (st = event_get(w, &s->ev))))) {
        op_error(op, UCS_ERR_NO_MEMORY);
        return;
    }
    s->chunk = c;
    s->xfer_done = false;
    s->xfer_status = UCS_OK;
    if (op->send) {
        if ((st = gser_device_memcpy(w->gser_ctx, s->bounce, GSER_MEMORY_HOST, at, GSER_MEMORY_DEVICE, len,
                                     w->staging->stream)) ||
            (st = gser_event_record(s->ev, w->staging->stream))) {
            gux_fail(st, "staging: device-to-host copy failed: %s", gser_context_get_last_error(w->gser_ctx));
            op_error(op, UCS_ERR_IO_ERROR);
            return;
        }
        s->state = SLOT_COPY;
        op->next_issue++;
        return;
    }
    void *dst = device ? s->bounce : at;
    ucp_tag_recv_info_t imm;
    ucp_request_param_t p = gux_recv_param(chunk_recv_cb, s, UCS_MEMORY_TYPE_HOST, &imm);
    ucs_status_ptr_t sp = ucp_tag_recv_nbx(w->ucp, dst, len, gux_tag(r->ep->local_id, GUX_KIND_CHUNK, r->seq),
                                           GUX_TAG_MASK_ALL, &p);
    if (UCS_PTR_IS_ERR(sp)) {
        GUX_CALL("staging: ucp_tag_recv_nbx", UCS_PTR_STATUS(sp));
        op_error(op, UCS_PTR_STATUS(sp));
        return;
    }
    s->ucx_req = sp;
    s->xfer_done = sp == NULL;
    s->state = SLOT_XFER;
    op->next_issue++;
}

/* Advance one slot. Returns whether anything happened. */
static bool slot_step(gux_stage_op_t *op, gux_slot_t *s)
{
    gser_ucx_request_t *r = op->req;
    gser_ucx_worker_t *w = r->worker;
    if (s->state == SLOT_XFER) {
        if (!s->xfer_done)
            return false;
        if (s->ucx_req)
            ucp_request_free(s->ucx_req);
        s->ucx_req = NULL;
        if (op->z && !op->send && !op->aborting && (s->xfer_status == UCS_OK ||
                                                    s->xfer_status == UCS_ERR_MESSAGE_TRUNCATED)) {
            s->state = SLOT_FREE;
            zslot_land(op, s);
            return true;
        }
        if (s->xfer_status != UCS_OK) {
            op_error(op, s->xfer_status);
            s->state = SLOT_FREE;
            return true;
        }
        if (!op->send && r->frames[op->frame].memory == GSER_MEMORY_DEVICE) {
            size_t len = chunk_len(op, s->chunk);
            gser_status_t st = gser_device_memcpy(w->gser_ctx, op->base + s->chunk * op->chunk, GSER_MEMORY_DEVICE,
                                                  s->bounce, GSER_MEMORY_HOST, len, w->staging->stream);
            if (!st)
                st = gser_event_record(s->ev, w->staging->stream);
            if (st) {
                gux_fail(st, "staging: host-to-device copy failed: %s", gser_context_get_last_error(w->gser_ctx));
                op_error(op, UCS_ERR_IO_ERROR);
                s->state = SLOT_FREE;
                return true;
            }
            s->state = SLOT_COPY;
            return true;
        }
        s->state = SLOT_FREE;
        op->done++;
        return true;
    }
    if (s->state == SLOT_COPY) {
        /* Sends leave in chunk order: only the next one may go. */
        if (op->send && s->chunk != op->next_post)
            return false;
        gser_status_t st = gser_event_query(s->ev);
        if (st == GSER_INPROGRESS)
            return false;
        if (st) {
            gux_fail(st, "staging: device copy failed: %s", gser_context_get_last_error(w->gser_ctx));
            op_error(op, UCS_ERR_IO_ERROR);
            s->state = SLOT_FREE;
            return true;
        }
        if (!op->send) {
            s->state = SLOT_FREE;
            op->done++;
            return true;
        }
        if (op->aborting || !r->ep || !r->ep->ucp || r->ep->ucp_release) {
            s->state = SLOT_FREE;
            return true;
        }
        ucp_request_param_t p = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE,
            .cb.send = chunk_send_cb,
            .user_data = s,
            .memory_type = UCS_MEMORY_TYPE_HOST,
        };
        ucs_status_ptr_t sp = ucp_tag_send_nbx(r->ep->ucp, s->bounce, chunk_len(op, s->chunk),
                                               gux_tag(r->ep->peer_id, GUX_KIND_CHUNK, r->seq), &p);
        op->next_post++;
        if (UCS_PTR_IS_ERR(sp)) {
            GUX_CALL("staging: ucp_tag_send_nbx", UCS_PTR_STATUS(sp));
            op_error(op, UCS_PTR_STATUS(sp));
            s->state = SLOT_FREE;
            return true;
        }
        s->ucx_req = sp;
        s->xfer_done = sp == NULL;
        s->state = SLOT_XFER;
        return true;
    }
    return false;
}

static void op_finish(gux_stage_op_t *op)
{
    gser_ucx_request_t *r = op->req;
    gser_ucx_worker_t *w = r->worker;
    for (unsigned i = 0; i < op->depth; i++) {
        bounce_put(op, op->slots[i].bounce);
        event_put(w, op->slots[i].ev);
        free(op->slots[i].zbuf);
    }
    gux_list_del(&op->link);
    ucs_status_t st = op->error;
    r->stage_op = NULL;
    free(op);
    gux_req_part_done(r, st);
}

/* Advance op as far as it goes now. */
static unsigned op_advance(gux_stage_op_t *op)
{
    unsigned n = 0;
    for (;;) {
        bool moved = false;
        if (!op->aborting && op->done == op->nchunks) {
            if (!op_next_frame(op))
                break;
            moved = true;
        }
        for (unsigned i = 0; i < op->depth; i++) {
            gux_slot_t *s = &op->slots[(op->next_post + i) % op->depth];
            if (slot_step(op, s))
                moved = true;
            if (s->state == SLOT_FREE && !op->aborting && op->next_issue < op->nchunks &&
                (!op->z || op_inflight(op) < GUX_ZDEPTH)) {
                slot_issue(op, s);
                moved = true;
            }
        }
        if (!moved)
            break;
        n++;
    }
    if ((op->aborting || op->frame >= op->req->nframes) && !op_busy(op))
        op_finish(op);
    return n;
}

gser_status_t gux_staging_advance(gser_ucx_request_t *r)
{
    gser_ucx_worker_t *w = r->worker;
    if (r->stage_op) {
        op_advance(r->stage_op);
        return GSER_INPROGRESS;
    }
    unsigned depth = w->depth;
    gux_stage_op_t *op = calloc(1, sizeof *op + depth * sizeof(gux_slot_t));
    if (!op) {
        gux_req_part_done(r, UCS_ERR_NO_MEMORY);
        return gux_fail(GSER_ERR_NO_MEMORY, "staging: out of memory");
    }
    op->req = r;
    op->send = r->kind == GUX_REQ_SEND;
    op->depth = depth;
    op->stage_chunk = op->chunk = op->send ? w->chunk : r->chunk;
    op->bounce_size = op->chunk;
    op->pooled = op->chunk == w->chunk;
    for (unsigned i = 0; i < depth; i++)
        op->slots[i].op = op;
    op->frame = 0; /* op_advance moves to the first staged frame (frame 0 is the header) */
    gux_list_push(&w->staging->ops, &op->link);
    r->stage_op = op;
    op_advance(op);
    return GSER_INPROGRESS;
}

void gux_staging_abort(gser_ucx_request_t *r)
{
    gux_stage_op_t *op = r->stage_op;
    if (!op)
        return;
    op->aborting = true;
    if (op->error == UCS_OK)
        op->error = UCS_ERR_CANCELED;
    /* Receives can be taken back; sends go when the endpoint closes. */
    for (unsigned i = 0; i < op->depth && !op->send; i++)
        if (op->slots[i].state == SLOT_XFER && op->slots[i].ucx_req)
            ucp_request_cancel(r->worker->ucp, op->slots[i].ucx_req);
}

void gux_staging_abandon(gser_ucx_request_t *r)
{
    gux_stage_op_t *op = r->stage_op;
    if (!op || !op->send)
        return;
    gux_staging_abort(r);
    /* Chunk sends UCX kept when it closed the endpoint: released (no
     * callback after this), their bounce buffers free again. */
    for (unsigned i = 0; i < op->depth; i++) {
        gux_slot_t *s = &op->slots[i];
        if (s->state == SLOT_XFER && !s->xfer_done) {
            if (s->ucx_req)
                ucp_request_free(s->ucx_req);
            s->ucx_req = NULL;
            s->xfer_done = true;
            s->xfer_status = UCS_ERR_CANCELED;
        }
    }
    op_advance(op);
}

bool gux_staging_copying(const gser_ucx_worker_t *w)
{
    if (!w->staging)
        return false;
    for (const gux_list_t *it = w->staging->ops.next; it != &w->staging->ops; it = it->next) {
        const gux_stage_op_t *op = gux_container(it, gux_stage_op_t, link);
        for (unsigned i = 0; i < op->depth; i++)
            if (op->slots[i].state == SLOT_COPY)
                return true;
    }
    return false;
}

unsigned gux_staging_progress(gser_ucx_worker_t *w)
{
    unsigned n = 0;
    gux_list_t *it = w->staging->ops.next;
    while (it != &w->staging->ops) {
        gux_stage_op_t *op = gux_container(it, gux_stage_op_t, link);
        it = it->next;
        n += op_advance(op);
    }
    return n;
}

void gux_staging_release(gser_ucx_request_t *r)
{
    /* Only reached with outstanding == 0, so the op has finished. */
    (void)r;
}
