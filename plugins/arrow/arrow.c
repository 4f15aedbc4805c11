/* gser_arrow_register: the type "arrow.array" in both built-in families. */
#include "internal.h"

gser_status_t gser_arrow_register(gser_context_t *ctx)
{
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    /* A received table is freed with its message unless taken. */
    gser_type_options_t o = {.size = sizeof(gser_type_options_t), .destroy = arrow_recv_destroy};
    gser_status_t st = gser_type_register(ctx, GSER_ARROW_TYPE, GSER_ARROW_TYPE_VERSION, &o);
    if (st)
        return st;
    /* One serializer for both: the core moves device buffers to host frames
     * for "host"; the receiver sees where they arrived. */
    if ((st = gser_type_add_family(ctx, GSER_ARROW_TYPE, "device", arrow_serialize, arrow_deserialize)))
        return st;
    return gser_type_add_family(ctx, GSER_ARROW_TYPE, "host", arrow_serialize, arrow_deserialize);
}
