/* Lets the C++ tests run a copy plan straight on a context's backend. */
#include "device/backend.h"
#include "host/internal.h"

gser_status_t test_copy_plan(gser_context_t *ctx, const gser_chunk_t *chunks, size_t n);

gser_status_t test_copy_plan(gser_context_t *ctx, const gser_chunk_t *chunks, size_t n)
{
    if (!ctx->backend)
        return GSER_ERR_NO_DEVICE;
    return ctx->backend->copy_plan(ctx->bstate, chunks, n, NULL);
}
