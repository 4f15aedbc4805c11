/* Device memory that a deserialized message owns (uploads of host frames,
 * scattered buffers, the copy plan) and the event that says it is ready.
 * Freed when the message is destroyed, after that event. */
#include <string.h>

#include "../host/internal.h"
#include "backend.h"

static gser_status_t msgdev_get(gser_msg_t *m, void *stream, msg_device_t **out)
{
    if (!m->dev) {
        msg_device_t *md = msg_alloc(m, sizeof *md, alignof(msg_device_t));
        if (!md)
            return GSER_ERR_NO_MEMORY;
        memset(md, 0, sizeof *md);
        md->stream = stream;
        m->dev = md;
    }
    *out = m->dev;
    return GSER_OK;
}

gser_status_t msgdev_alloc(gser_msg_t *m, void *stream, size_t size, bool pinned, void **ptr)
{
    gser_context_t *ctx = m->ctx;
    msg_device_t *md;
    if (msgdev_get(m, stream, &md) ||
        arena_vec_reserve(&m->arena, (void **)&md->res, &md->cap, sizeof *md->res, md->nres + 1))
        return GSER_ERR_NO_MEMORY;
    const gser_allocator_t *a = pinned ? &ctx->pin_alloc : &ctx->dev_alloc;
    void *p = NULL;
    gser_status_t st = a->alloc(a->user, size, pinned ? NULL : stream, &p);
    if (st != GSER_OK || (!p && size))
        return st ? st : GSER_ERR_NO_MEMORY;
    md->res[md->nres++] = (msg_res_t){.ptr = p, .size = size, .pinned = pinned};
    *ptr = p;
    return GSER_OK;
}

gser_status_t msgdev_record(gser_msg_t *m, void **event)
{
    gser_context_t *ctx = m->ctx;
    msg_device_t *md = m->dev;
    gser_status_t st;
    if (!md->event && (st = ctx->backend->event_create(ctx->bstate, &md->event)))
        return st;
    if ((st = ctx->backend->event_record(ctx->bstate, md->event, md->stream)))
        return st;
    *event = md->event;
    return GSER_OK;
}

void msgdev_release(gser_msg_t *m)
{
    msg_device_t *md = m->dev;
    gser_context_t *ctx = m->ctx;
    if (!md || !ctx->backend)
        return;
    if (md->event)
        ctx->backend->event_sync(ctx->bstate, md->event);
    for (size_t i = md->nres; i-- > 0;) {
        const gser_allocator_t *a = md->res[i].pinned ? &ctx->pin_alloc : &ctx->dev_alloc;
        a->free(a->user, md->res[i].ptr, md->res[i].size, md->res[i].pinned ? NULL : md->stream);
    }
    if (md->event)
        ctx->backend->event_destroy(ctx->bstate, md->event);
    m->dev = NULL;
}
