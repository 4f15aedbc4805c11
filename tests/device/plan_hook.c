/* Lets the C++ tests run batches of copies straight on a context's device layer. */
#include "host/internal.h"

gser_status_t test_batch(gser_context_t *ctx, const void *const *src, void *const *dst, const uint64_t *size, size_t n,
                         void *base);
gser_status_t test_gather_resident(gser_context_t *ctx, const void *const *src, const uint64_t *size, size_t n,
                                   uint64_t total, void *base);

/* A scatter (dst) or a gather into base, on the per-thread stream; waits. */
gser_status_t test_batch(gser_context_t *ctx, const void *const *src, void *const *dst, const uint64_t *size, size_t n,
                         void *base)
{
    if (!ctx->devl)
        return GSER_ERR_NO_DEVICE;
    devl_batch_t *b;
    devl_arrays_t a;
    gser_status_t st = devl_batch_create(ctx->devl, n, dst != NULL, &b, &a);
    if (st)
        return st;
    for (size_t i = 0; i < n; i++) {
        a.src[i] = src[i];
        a.size[i] = size[i];
        if (dst)
            a.dst[i] = dst[i];
    }
    st = devl_batch_run(ctx->devl, b, base, NULL);
    devl_batch_release(ctx->devl, b);
    if (st == GSER_OK)
        st = devl_stream_sync(ctx->devl, NULL);
    return st;
}

gser_status_t test_gather_resident(gser_context_t *ctx, const void *const *src, const uint64_t *size, size_t n,
                                   uint64_t total, void *base)
{
    if (!ctx->devl)
        return GSER_ERR_NO_DEVICE;
    gser_status_t st = devl_gather_resident(ctx->devl, src, size, n, total, base, NULL);
    return st ? st : devl_stream_sync(ctx->devl, NULL);
}
