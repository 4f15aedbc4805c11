/* The device layer behind a context, for gser-bench-device's kernel-only rows. */
#include "host/internal.h"

devl_t *bench_ctx_devl(gser_context_t *ctx);

devl_t *bench_ctx_devl(gser_context_t *ctx)
{
    return ctx->devl;
}
