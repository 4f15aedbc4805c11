/* Device memory that a deserialized message owns (uploads of host frames,
 * scattered buffers, the plans of its scatters) and the event that says it
 * is ready. Freed when the message is destroyed, after that event. */
#include <string.h>

#include "internal.h"

static gser_status_t msgdev_get(gser_msg_t *m, void *stream, msg_device_t **out)
{
    if (!m->dev) {
        msg_device_t *md = gser__msg_alloc(m, sizeof *md, alignof(msg_device_t));
        if (!md)
            return GSER_ERR_NO_MEMORY;
        memset(md, 0, sizeof *md);
        md->stream = stream;
        m->dev = md;
    }
    *out = m->dev;
    return GSER_OK;
}

gser_status_t gser__msgdev_alloc(gser_msg_t *m, void *stream, size_t size, bool pinned, void **ptr)
{
    devl_t *dl = m->ctx->devl;
    msg_device_t *md;
    if (msgdev_get(m, stream, &md) ||
        gser__arena_vec_reserve(&m->arena, (void **)&md->res, &md->cap, sizeof *md->res, md->nres + 1))
        return GSER_ERR_NO_MEMORY;
    void *p = NULL;
    gser_status_t st = pinned ? devl_pinned_alloc(dl, size, &p) : devl_alloc(dl, size, stream, &p);
    if (st)
        return st;
    md->res[md->nres++] = (msg_res_t){.ptr = p, .size = size, .pinned = pinned};
    *ptr = p;
    return GSER_OK;
}

gser_status_t gser__msgdev_batch(gser_msg_t *m, void *stream, size_t n, devl_batch_t **batch, devl_arrays_t *arrays)
{
    msg_device_t *md;
    if (msgdev_get(m, stream, &md) || gser__arena_vec_reserve(&m->arena, (void **)&md->batches, &md->cap_batches,
                                                              sizeof *md->batches, md->nbatches + 1))
        return GSER_ERR_NO_MEMORY;
    gser_status_t st = devl_batch_create(m->ctx->devl, n, true, batch, arrays);
    if (st == GSER_OK)
        md->batches[md->nbatches++] = *batch;
    return st;
}

gser_status_t gser__msgdev_record(gser_msg_t *m, void **event)
{
    devl_t *dl = m->ctx->devl;
    msg_device_t *md = m->dev;
    gser_status_t st;
    if (!md->event && (st = devl_event_create(dl, &md->event)))
        return st;
    if ((st = devl_event_record(dl, md->event, md->stream)))
        return st;
    *event = md->event;
    return GSER_OK;
}

void gser__msgdev_release(gser_msg_t *m)
{
    msg_device_t *md = m->dev;
    devl_t *dl = m->ctx->devl;
    if (!md || !dl)
        return;
    if (md->event)
        devl_event_sync(dl, md->event);
    for (size_t i = md->nbatches; i-- > 0;)
        devl_batch_release(dl, md->batches[i]);
    for (size_t i = md->nres; i-- > 0;) {
        if (md->res[i].pinned)
            devl_pinned_free(dl, md->res[i].ptr, md->res[i].size);
        else
            devl_free(dl, md->res[i].ptr, md->res[i].size, md->stream);
    }
    devl_event_destroy(dl, md->event);
    m->dev = NULL;
}
