/* Packing device buffers while a message is serialized.
 *
 * Small device buffers (and, for the host family, all of them) are given a
 * place in a packed frame as the encoder meets them: one packed frame per
 * object scope, so that an object's frames stay its own and can be forwarded.
 * When the tree is done, one allocation holds every packed frame, and one
 * copy plan (one kernel launch) gathers the buffers into it; for the host
 * family one more copy moves it all to pinned host memory. Everything is
 * queued on the caller's stream, after the streams and events that produce
 * the buffers, and an event marks the end.
 *
 * For gser_serialize_flat (host/serflat.c) the host family's copies are
 * left in f->deferred instead, for one copy into the flattened buffer.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) & ~(a - 1);
}

void gser__packer_init(packer_t *p, gser_context_t *ctx, size_t pack_max, void *stream)
{
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->pack_max = pack_max;
    p->stream = stream;
}

void gser__packer_free(packer_t *p)
{
    if (!p->groups && !p->copies && !p->waits)
        return; /* host messages: nothing was planned */
    free(p->groups);
    free(p->copies);
    free(p->waits);
    p->groups = NULL;
    p->copies = NULL;
    p->waits = NULL;
}

static gser_status_t grow(void **v, size_t *cap, size_t n, size_t es)
{
    if (n < *cap)
        return GSER_OK;
    size_t nc = *cap ? *cap * 2 : 8;
    void *nv = realloc(*v, nc * es);
    if (!nv)
        return GSER_ERR_NO_MEMORY;
    *v = nv;
    *cap = nc;
    return GSER_OK;
}

gser_status_t gser__packer_wait_for(packer_t *p, void *stream, void *event)
{
    if (!stream && !event)
        return GSER_OK;
    for (size_t i = 0; i < p->nwaits; i++)
        if (p->waits[i].stream == stream && p->waits[i].event == event)
            return GSER_OK;
    if (grow((void **)&p->waits, &p->cap_waits, p->nwaits, sizeof *p->waits))
        return GSER_ERR_NO_MEMORY;
    p->waits[p->nwaits].stream = stream;
    p->waits[p->nwaits].event = event;
    p->nwaits++;
    p->device_work = true;
    return GSER_OK;
}

gser_status_t gser__packer_add(packer_t *p, gser_frames_t *f, int *group, bool to_host, const void *src, size_t size,
                               size_t *frame, size_t *offset)
{
    if (*group < 0) {
        if (grow((void **)&p->groups, &p->cap_groups, p->ngroups, sizeof *p->groups))
            return GSER_ERR_NO_MEMORY;
        gser_frame_t placeholder = {.memory = to_host ? GSER_MEMORY_HOST : GSER_MEMORY_DEVICE,
                                    .device = to_host ? 0 : p->ctx->ordinal};
        size_t idx = f->n;
        if (gser__frames_push(f, &placeholder))
            return GSER_ERR_NO_MEMORY;
        p->groups[p->ngroups] = (pack_group_t){.frame = idx, .bytes = 0, .to_host = to_host};
        p->any_host |= to_host;
        *group = (int)p->ngroups++;
    }
    if (grow((void **)&p->copies, &p->cap_copies, p->ncopies, sizeof *p->copies))
        return GSER_ERR_NO_MEMORY;
    pack_group_t *g = &p->groups[*group];
    size_t off = align_up(g->bytes, DEVL_PACK_ALIGN);
    if (off < g->bytes || size > SIZE_MAX - off)
        return GSER_ERR_NO_MEMORY;
    g->bytes = off + size;
    p->copies[p->ncopies++] = (pack_copy_t){.src = src, .size = size, .group = (size_t)*group, .offset = off};
    *frame = g->frame;
    *offset = off;
    p->device_work = true;
    return GSER_OK;
}

/* Make p->stream wait for every producer of the buffers. */
static gser_status_t wait_producers(packer_t *p)
{
    gser_context_t *ctx = p->ctx;
    devl_t *dl = ctx->devl;
    for (size_t i = 0; i < p->nwaits; i++) {
        gser_status_t st = GSER_OK;
        if (p->waits[i].event) {
            st = devl_stream_wait_event(dl, p->stream, p->waits[i].event);
        } else if (p->waits[i].stream != p->stream) {
            void *ev;
            st = devl_event_create(dl, &ev);
            if (st == GSER_OK) {
                st = devl_event_record(dl, ev, p->waits[i].stream);
                if (st == GSER_OK)
                    st = devl_stream_wait_event(dl, p->stream, ev);
                devl_event_destroy(dl, ev); /* released once it completes */
            }
        }
        if (st)
            return gser__ctxdev_fail(ctx, st, "gser_serialize: waiting for a buffer's stream or event");
    }
    return GSER_OK;
}

/* Give every group its start in the one allocation, each 64-byte aligned:
 * device frames first, then the host family's, so that one copy moves all
 * of the latter to pinned memory. Sets *total and *host_start. */
static void layout(packer_t *p, size_t *total_out, size_t *host_start)
{
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            *host_start = total = align_up(total, DEVL_PACK_ALIGN);
        for (size_t g = 0; g < p->ngroups; g++) {
            if (p->groups[g].to_host != (pass == 1))
                continue;
            p->groups[g].start = align_up(total, DEVL_PACK_ALIGN);
            total = p->groups[g].start + p->groups[g].bytes;
        }
    }
    *total_out = align_up(total, DEVL_PACK_ALIGN);
}

/* The pack kernel's batch: the copies in the order of their places in the
 * allocation, which is then the device layer's gather order (each place is
 * the sum of the rounded-up sizes before it). */
static gser_status_t gather(packer_t *p, gser_frames_t *f, void *dev)
{
    gser_context_t *ctx = p->ctx;
    size_t ncopies = p->ncopies;
    if (p->defer_host)
        for (size_t i = 0; i < p->ncopies; i++)
            ncopies -= p->groups[p->copies[i].group].to_host;
    if (!ncopies)
        return GSER_OK;
    devl_arrays_t a;
    gser_status_t st = devl_batch_create(ctx->devl, ncopies, false, &f->batch, &a);
    if (st)
        return gser__ctxdev_fail(ctx, st, "gser_serialize: planning the pack kernel");
    /* Copies per group, then each group's first slot in allocation order. */
    size_t *first = calloc(p->ngroups + 1, sizeof *first);
    if (!first)
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory");
    for (size_t i = 0; i < p->ncopies; i++)
        first[p->copies[i].group]++;
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t g = 0; g < p->ngroups; g++)
            if (p->groups[g].to_host == (pass == 1)) {
                size_t n = first[g];
                first[g] = at;
                at += n;
            }
    for (size_t i = 0; i < p->ncopies; i++) {
        if (p->defer_host && p->groups[p->copies[i].group].to_host)
            continue; /* after every device group in the order: no gap left */
        size_t k = first[p->copies[i].group]++;
        a.src[k] = p->copies[i].src;
        a.size[k] = p->copies[i].size;
    }
    free(first);
    if ((st = devl_batch_run(ctx->devl, f->batch, dev, p->stream)))
        return gser__ctxdev_fail(ctx, st, "gser_serialize: the pack kernel");
    return GSER_OK;
}

static gser_status_t pack(packer_t *p, gser_frames_t *f, bool *queued)
{
    gser_context_t *ctx = p->ctx;
    devl_t *dl = ctx->devl;
    gser_status_t st;
    *queued = true; /* from the producers' waits on */
    if ((st = wait_producers(p)) || !p->ncopies)
        return st;
    size_t total, host_start;
    layout(p, &total, &host_start);
    if (p->defer_host && p->any_host) {
        /* Their copies wait for the flattened buffer: only the device groups here. */
        if (!(f->deferred = malloc(p->ncopies * sizeof *f->deferred)))
            return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory");
        for (size_t i = 0; i < p->ncopies; i++)
            if (p->groups[p->copies[i].group].to_host) {
                f->deferred[f->ndeferred] = p->copies[i];
                f->deferred[f->ndeferred++].group = p->groups[p->copies[i].group].frame;
            }
        for (size_t g = 0; g < p->ngroups; g++)
            if (p->groups[g].to_host)
                f->frames[p->groups[g].frame].size = p->groups[g].bytes; /* data stays NULL */
        if (host_start == 0)
            return GSER_OK;
        total = host_start;
    }
    void *dev = NULL;
    if ((st = devl_alloc(dl, total, p->stream, &dev)))
        return gser__error_set(ctx, st,
                               "gser_serialize: allocating %zu bytes of device memory for packed frames failed", total);
    f->dev_mem = dev;
    f->dev_size = total;
    if ((st = gather(p, f, dev)))
        return st;
    void *pinned = NULL;
    if (p->any_host && !p->defer_host) {
        /* The host family: one device-to-host copy of everything it packed. */
        size_t host_size = total - host_start;
        if ((st = devl_pinned_alloc(dl, host_size, &pinned)))
            return gser__error_set(
                ctx, st, "gser_serialize: allocating %zu bytes of pinned memory for host frames failed", host_size);
        f->pinned = pinned;
        f->pinned_size = host_size;
        if ((st = devl_memcpy(dl, pinned, (char *)dev + host_start, host_size, DEVL_D2H, p->stream)))
            return gser__ctxdev_fail(ctx, st, "gser_serialize: copying packed frames to the host");
    }
    for (size_t g = 0; g < p->ngroups; g++) {
        if (p->defer_host && p->groups[g].to_host)
            continue;
        gser_frame_t *fr = &f->frames[p->groups[g].frame];
        fr->data = p->groups[g].to_host ? (char *)pinned + (p->groups[g].start - host_start)
                                        : (char *)dev + p->groups[g].start;
        fr->size = p->groups[g].bytes;
    }
    return GSER_OK;
}

gser_status_t gser__packer_finish(packer_t *p, gser_frames_t *f)
{
    if (!p->device_work)
        return GSER_OK;
    gser_context_t *ctx = p->ctx;
    gser_status_t st = gser__ctxdev_need(ctx, "gser_serialize");
    if (st)
        return st;
    devl_t *dl = ctx->devl;
    f->stream = p->stream;
    if ((st = devl_event_create(dl, &f->event)))
        return gser__ctxdev_fail(ctx, st, "gser_serialize: creating the frames' event");
    bool queued = false;
    st = pack(p, f, &queued);
    /* The event marks the end of whatever was queued, also when a later step
     * failed: gser_frames_destroy waits for it before freeing anything the
     * queued work reads or writes. */
    gser_status_t rst = queued ? devl_event_record(dl, f->event, p->stream) : GSER_OK;
    if (rst != GSER_OK) {
        devl_stream_sync(dl, p->stream);
        if (st == GSER_OK)
            st = gser__ctxdev_fail(ctx, rst, "gser_serialize: recording the frames' event");
    }
    return st;
}

/* Called by gser_frames_destroy: wait for the device work, then free. */
void gser__packer_release(gser_frames_t *f)
{
    devl_t *dl = f->ctx->devl;
    if (!dl)
        return;
    if (f->event)
        devl_event_sync(dl, f->event);
    devl_batch_release(dl, f->batch);
    devl_pinned_free(dl, f->pinned, f->pinned_size);
    devl_free(dl, f->dev_mem, f->dev_size, f->stream);
    devl_event_destroy(dl, f->event);
    f->event = f->pinned = f->dev_mem = NULL;
    f->batch = NULL;
}
