/* gser_serialize_flat: a message straight into its flattened form.
 *
 * The host family's device buffers are not gathered on the device and
 * staged (host/pack.c leaves their copies for here): one scatter batch
 * copies each from the device straight into its place in the flattened
 * buffer, which is registered with the device for the time of the copy (on
 * a GPU the kernel writes host memory through the mapping: one trip over
 * the bus, no staging, no second copy).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

gser_status_t gser_serialize_flat(gser_context_t *ctx, const gser_msg_t *msg, const gser_serialize_options_t *opts,
                                  gser_flat_alloc_fn alloc, void *alloc_arg, size_t *written)
{
    if (!ctx || !alloc || !written)
        return ctx ? gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize_flat: NULL allocator or output")
                   : GSER_ERR_INVALID_ARG;
    gser_frames_t *f;
    gser_status_t st = gser__serialize(ctx, msg, opts, true, &f);
    if (st)
        return st;
    size_t total = 0, done = 0;
    size_t *offsets = NULL;
    unsigned char *dst = NULL;
    st = gser__flat_size_open(f->frames, f->n, &total);
    if (st) {
        gser__error_set(ctx, st, "gser_serialize_flat: %s",
                        st == GSER_ERR_UNSUPPORTED ? "device frames have no flattened form (use the host family)"
                                                   : "the frames have no flattened form");
        goto out;
    }
    if (!(offsets = malloc(f->n * sizeof *offsets)) || !(dst = alloc(alloc_arg, total))) {
        st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize_flat: out of memory for %zu bytes", total);
        goto out;
    }
    if ((st = gser__flat_write_open(f->frames, f->n, dst, total, offsets, &done)))
        goto out;
    if (f->ndeferred) {
        devl_t *dl = ctx->devl;
        /* the alignment gaps between packed buffers, which no copy writes */
        size_t frame = SIZE_MAX, end = 0;
        for (size_t i = 0; i < f->ndeferred; i++) {
            const pack_copy_t *c = &f->deferred[i];
            if (c->group != frame)
                frame = c->group, end = 0;
            if (c->offset > end)
                memset(dst + offsets[frame] + end, 0, c->offset - end);
            end = c->offset + c->size;
        }
        devl_arrays_t a;
        devl_batch_t *batch = NULL;
        bool registered;
        if ((st = devl_host_register(dl, dst, total, &registered))) {
            st = gser__ctxdev_fail(ctx, st, "gser_serialize_flat: registering the flattened buffer with the device");
            goto out;
        }
        st = devl_batch_create(dl, f->ndeferred, true, &batch, &a);
        if (st == GSER_OK) {
            for (size_t i = 0; i < f->ndeferred; i++) {
                const pack_copy_t *c = &f->deferred[i];
                a.src[i] = c->src;
                a.dst[i] = dst + offsets[c->group] + c->offset;
                a.size[i] = c->size;
            }
            st = devl_batch_run(dl, batch, NULL, f->stream);
            gser_status_t rst = devl_event_record(dl, f->event, f->stream);
            if (rst == GSER_OK)
                rst = devl_event_sync(dl, f->event);
            else
                devl_stream_sync(dl, f->stream);
            if (st == GSER_OK)
                st = rst;
        }
        devl_batch_release(dl, batch);
        if (registered)
            devl_host_unregister(dl, dst);
        if (st) {
            st = gser__ctxdev_fail(ctx, st, "gser_serialize_flat: copying device buffers to the host");
            goto out;
        }
    }
    *written = done;
out:
    free(offsets);
    gser_frames_destroy(f); /* waits for any device work first */
    return st;
}
