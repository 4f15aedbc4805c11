/* Lets the C++ tests run a batch of copies straight on a context's device layer. */
#include "host/internal.h"

gser_status_t test_copy_batch(gser_context_t *ctx, const devl_copy_t *copies, size_t n);

gser_status_t test_copy_batch(gser_context_t *ctx, const devl_copy_t *copies, size_t n)
{
    if (!ctx->devl)
        return GSER_ERR_NO_DEVICE;
    devl_batch_t *b = NULL;
    gser_status_t st = devl_copy_batch(ctx->devl, copies, n, NULL, &b);
    devl_batch_release(ctx->devl, b);
    return st;
}
