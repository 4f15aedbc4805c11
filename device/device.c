/* The public device API and the choice of backend; everything here goes
 * through the context's backend table. */
#include <stdlib.h>
#include <string.h>

#include "../host/internal.h"
#include "backend.h"

struct gser_event {
    gser_context_t *ctx;
    void *handle;
};

/* ---- choosing and opening a backend --------------------------------------- */

static gser_status_t backend_alloc(void *user, size_t size, void *stream, void **ptr)
{
    gser_context_t *ctx = user;
    return ctx->backend->alloc(ctx->bstate, size, stream, ptr);
}

static void backend_free(void *user, void *ptr, size_t size, void *stream)
{
    gser_context_t *ctx = user;
    ctx->backend->free(ctx->bstate, ptr, size, stream);
}

static gser_status_t backend_pinned_alloc(void *user, size_t size, void *stream, void **ptr)
{
    (void)stream;
    gser_context_t *ctx = user;
    return ctx->backend->pinned_alloc(ctx->bstate, size, ptr);
}

static void backend_pinned_free(void *user, void *ptr, size_t size, void *stream)
{
    (void)stream;
    gser_context_t *ctx = user;
    ctx->backend->pinned_free(ctx->bstate, ptr, size);
}

gser_status_t device_open(gser_context_t *ctx, const gser_context_options_t *o)
{
    const char *name = o->device_backend;
    if (!name || !*name)
        name = getenv("GSER_DEVICE");
    bool automatic = !name || !*name || strcmp(name, "auto") == 0;
    const gser_backend_t *b = NULL;
    if (automatic) {
#ifdef GSER_HAVE_CUDA
        b = &gser_backend_cuda;
#endif
    } else if (strcmp(name, "emulated") == 0) {
        b = &gser_backend_emulated;
    } else if (strcmp(name, "cuda") == 0) {
#ifdef GSER_HAVE_CUDA
        b = &gser_backend_cuda;
#else
        return error_set(ctx, GSER_ERR_NO_DEVICE,
                         "gser_context_create: device backend \"cuda\" asked for, but this build has no CUDA");
#endif
    } else if (strcmp(name, "none") != 0) {
        return error_set(ctx, GSER_ERR_INVALID_ARG,
                         "gser_context_create: unknown device backend \"%s\" (cuda, emulated, none, auto)", name);
    }
    ctx->device = o->device;
    ctx->pack_max = o->pack_max ? o->pack_max : GSER_DEFAULT_PACK_MAX;
    ctx->backend = NULL;
    ctx->bstate = NULL;
    if (b) {
        gser_status_t st = b->open(o->device, &ctx->bstate);
        if (st != GSER_OK) {
            if (automatic)
                return GSER_OK; /* no GPU here: no device backend, not an error */
            return error_set(ctx, st, "gser_context_create: device backend \"%s\" (device %d) cannot be used: %s",
                             b->name, o->device, gser_status_str(st));
        }
        ctx->backend = b;
    }
    gser_status_t st = GSER_OK;
    if (o->device_allocator)
        st = struct_read(ctx, "gser_context_create", "gser_allocator_t", &ctx->dev_alloc, sizeof ctx->dev_alloc,
                         o->device_allocator);
    else
        ctx->dev_alloc = (gser_allocator_t){sizeof(gser_allocator_t), backend_alloc, backend_free, ctx};
    if (st == GSER_OK && o->pinned_allocator)
        st = struct_read(ctx, "gser_context_create", "gser_allocator_t", &ctx->pin_alloc, sizeof ctx->pin_alloc,
                         o->pinned_allocator);
    else if (st == GSER_OK)
        ctx->pin_alloc = (gser_allocator_t){sizeof(gser_allocator_t), backend_pinned_alloc, backend_pinned_free, ctx};
    if (st) {
        device_close(ctx);
        return st;
    }
    if (!ctx->dev_alloc.alloc || !ctx->dev_alloc.free || !ctx->pin_alloc.alloc || !ctx->pin_alloc.free) {
        device_close(ctx);
        return error_set(ctx, GSER_ERR_INVALID_ARG, "gser_context_create: an allocator lacks alloc or free");
    }
    return GSER_OK;
}

void device_close(gser_context_t *ctx)
{
    if (ctx->backend)
        ctx->backend->close(ctx->bstate);
    ctx->backend = NULL;
    ctx->bstate = NULL;
}

gser_status_t device_need(gser_context_t *ctx, const char *what)
{
    if (ctx->backend)
        return GSER_OK;
    return error_set(ctx, GSER_ERR_NO_DEVICE,
                     "%s: device memory needs a device backend, and this context has none "
                     "(set gser_context_options_t.device_backend or GSER_DEVICE to \"cuda\" or \"emulated\")",
                     what);
}

gser_status_t device_fail(gser_context_t *ctx, gser_status_t st, const char *what)
{
    const char *detail = ctx->backend ? ctx->backend->last_error(ctx->bstate) : "";
    return error_set(ctx, st, "%s: %s%s%s", what, gser_status_str(st), *detail ? ": " : "", detail);
}

/* ---- the public API --------------------------------------------------------------- */

const char *gser_context_get_device_backend(const gser_context_t *ctx)
{
    return ctx && ctx->backend ? ctx->backend->name : "none";
}

bool gser_context_has_device(const gser_context_t *ctx)
{
    return ctx && ctx->backend;
}

gser_status_t gser_device_alloc(gser_context_t *ctx, size_t size, void *stream, void **ptr)
{
    if (!ctx || !ptr)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = device_need(ctx, "gser_device_alloc");
    if (st)
        return st;
    void *p = NULL;
    st = ctx->dev_alloc.alloc(ctx->dev_alloc.user, size, stream, &p);
    if (st != GSER_OK || (!p && size))
        return error_set(ctx, st ? st : GSER_ERR_NO_MEMORY, "gser_device_alloc: %zu bytes: allocation failed", size);
    *ptr = p;
    return GSER_OK;
}

void gser_device_free(gser_context_t *ctx, void *ptr, size_t size, void *stream)
{
    if (ctx && ptr && ctx->backend)
        ctx->dev_alloc.free(ctx->dev_alloc.user, ptr, size, stream);
}

gser_status_t gser_pinned_alloc(gser_context_t *ctx, size_t size, void **ptr)
{
    if (!ctx || !ptr)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = device_need(ctx, "gser_pinned_alloc");
    if (st)
        return st;
    void *p = NULL;
    st = ctx->pin_alloc.alloc(ctx->pin_alloc.user, size, NULL, &p);
    if (st != GSER_OK || (!p && size))
        return error_set(ctx, st ? st : GSER_ERR_NO_MEMORY, "gser_pinned_alloc: %zu bytes: allocation failed", size);
    *ptr = p;
    return GSER_OK;
}

void gser_pinned_free(gser_context_t *ctx, void *ptr, size_t size)
{
    if (ctx && ptr && ctx->backend)
        ctx->pin_alloc.free(ctx->pin_alloc.user, ptr, size, NULL);
}

static copy_kind_t copy_kind(gser_memory_t dst, gser_memory_t src)
{
    if (src == GSER_MEMORY_DEVICE)
        return dst == GSER_MEMORY_DEVICE ? COPY_D2D : COPY_D2H;
    return dst == GSER_MEMORY_DEVICE ? COPY_H2D : COPY_H2H;
}

gser_status_t device_copy(gser_context_t *ctx, void *dst, gser_memory_t dst_memory, const void *src,
                          gser_memory_t src_memory, size_t n, void *stream)
{
    if (n == 0)
        return GSER_OK;
    copy_kind_t k = copy_kind(dst_memory, src_memory);
    if (k == COPY_H2H && !ctx->backend) {
        memmove(dst, src, n);
        return GSER_OK;
    }
    gser_status_t st = device_need(ctx, "gser_device_memcpy");
    if (st)
        return st;
    st = ctx->backend->memcpy(ctx->bstate, dst, src, n, k, stream);
    return st ? device_fail(ctx, st, "gser_device_memcpy") : GSER_OK;
}

gser_status_t gser_device_memcpy(gser_context_t *ctx, void *dst, gser_memory_t dst_memory, const void *src,
                                 gser_memory_t src_memory, size_t n, void *stream)
{
    if (!ctx || (n && (!dst || !src)))
        return GSER_ERR_INVALID_ARG;
    return device_copy(ctx, dst, dst_memory, src, src_memory, n, stream);
}

gser_status_t gser_stream_wait(gser_context_t *ctx, void *stream)
{
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = device_need(ctx, "gser_stream_wait");
    if (st)
        return st;
    st = ctx->backend->stream_sync(ctx->bstate, stream);
    return st ? device_fail(ctx, st, "gser_stream_wait") : GSER_OK;
}

gser_status_t gser_event_create(gser_context_t *ctx, gser_event_t **event)
{
    if (!ctx || !event)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = device_need(ctx, "gser_event_create");
    if (st)
        return st;
    gser_event_t *e = malloc(sizeof *e);
    if (!e)
        return error_set(ctx, GSER_ERR_NO_MEMORY, "gser_event_create: out of memory");
    e->ctx = ctx;
    st = ctx->backend->event_create(ctx->bstate, &e->handle);
    if (st) {
        free(e);
        return device_fail(ctx, st, "gser_event_create");
    }
    *event = e;
    return GSER_OK;
}

gser_status_t gser_event_record(gser_event_t *event, void *stream)
{
    if (!event)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = event->ctx;
    gser_status_t st = ctx->backend->event_record(ctx->bstate, event->handle, stream);
    return st ? device_fail(ctx, st, "gser_event_record") : GSER_OK;
}

gser_status_t gser_event_query(gser_event_t *event)
{
    if (!event)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = event->ctx;
    gser_status_t st = ctx->backend->event_query(ctx->bstate, event->handle);
    return st < 0 ? device_fail(ctx, st, "gser_event_query") : st;
}

gser_status_t gser_event_wait(gser_event_t *event)
{
    if (!event)
        return GSER_ERR_INVALID_ARG;
    gser_context_t *ctx = event->ctx;
    gser_status_t st = ctx->backend->event_sync(ctx->bstate, event->handle);
    return st ? device_fail(ctx, st, "gser_event_wait") : GSER_OK;
}

gser_status_t gser_stream_order_after(gser_context_t *ctx, void *stream, const gser_event_t *event)
{
    if (!ctx || !event)
        return GSER_ERR_INVALID_ARG;
    if (event->ctx != ctx)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "gser_stream_order_after: the event belongs to another context");
    gser_status_t st = ctx->backend->stream_wait_event(ctx->bstate, stream, event->handle);
    return st ? device_fail(ctx, st, "gser_stream_order_after") : GSER_OK;
}

gser_status_t gser_stream_order_after_handle(gser_context_t *ctx, void *stream, void *event_handle)
{
    if (!ctx || !event_handle)
        return GSER_ERR_INVALID_ARG;
    gser_status_t st = device_need(ctx, "gser_stream_order_after_handle");
    if (st)
        return st;
    st = ctx->backend->stream_wait_event(ctx->bstate, stream, event_handle);
    return st ? device_fail(ctx, st, "gser_stream_order_after_handle") : GSER_OK;
}

void *gser_event_get_handle(const gser_event_t *event)
{
    return event ? event->handle : NULL;
}

void gser_event_destroy(gser_event_t *event)
{
    if (!event)
        return;
    event->ctx->backend->event_destroy(event->ctx->bstate, event->handle);
    free(event);
}

/* ---- the Arrow helpers ------------------------------------------------------------ */

static bool ranges_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

gser_status_t gser_device_check_offsets(gser_context_t *ctx, const void *offsets, size_t count, size_t width,
                                        uint64_t end, void *stream, uint32_t *verdict)
{
    static const char what[] = "gser_device_check_offsets";
    if (!ctx || !verdict)
        return GSER_ERR_INVALID_ARG;
    if (width != 4 && width != 8)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: width %zu (4 or 8 bytes)", what, width);
    if (count == 0) {
        *verdict = 0;
        return GSER_OK;
    }
    if (!offsets || count > SIZE_MAX / width || (uintptr_t)offsets % width)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL, misaligned or too many offsets", what);
    gser_status_t st = device_need(ctx, what);
    if (st)
        return st;
    uint32_t v = 0;
    st = ctx->backend->check_offsets(ctx->bstate, offsets, count, (unsigned)width, end, stream, &v);
    if (st)
        return device_fail(ctx, st, what);
    *verdict = v;
    return GSER_OK;
}

gser_status_t gser_device_rebase_offsets(gser_context_t *ctx, void *dst, const void *src, size_t count, size_t width,
                                         void *stream)
{
    static const char what[] = "gser_device_rebase_offsets";
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (width != 4 && width != 8)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: width %zu (4 or 8 bytes)", what, width);
    if (count == 0)
        return GSER_OK;
    if (!dst || !src || count > SIZE_MAX / width)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL buffer or too many offsets", what);
    /* The kernel loads whole offsets: misaligned ones would fault on a GPU. */
    if ((uintptr_t)dst % width || (uintptr_t)src % width)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: buffers must be aligned to %zu bytes", what, width);
    if (ranges_overlap(dst, count * width, src, count * width))
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: source and destination overlap", what);
    gser_status_t st = device_need(ctx, what);
    if (st)
        return st;
    st = ctx->backend->rebase_offsets(ctx->bstate, dst, src, count, (unsigned)width, stream);
    return st ? device_fail(ctx, st, what) : GSER_OK;
}

gser_status_t gser_device_copy_bits(gser_context_t *ctx, void *dst, const void *src, uint64_t src_bit_offset,
                                    uint64_t nbits, void *stream)
{
    static const char what[] = "gser_device_copy_bits";
    if (!ctx)
        return GSER_ERR_INVALID_ARG;
    if (nbits == 0)
        return GSER_OK;
    if (!dst || !src || src_bit_offset > UINT64_MAX - 7 - nbits)
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL buffer or bit range too large", what);
    uint64_t first = src_bit_offset / 8, end = (src_bit_offset + nbits + 7) / 8;
    if (ranges_overlap(dst, (size_t)((nbits + 7) / 8), (const char *)src + first, (size_t)(end - first)))
        return error_set(ctx, GSER_ERR_INVALID_ARG, "%s: source and destination overlap", what);
    gser_status_t st = device_need(ctx, what);
    if (st)
        return st;
    st = ctx->backend->copy_bits(ctx->bstate, dst, src, src_bit_offset, nbits, stream);
    return st ? device_fail(ctx, st, what) : GSER_OK;
}
