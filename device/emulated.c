/* The emulated device backend: "device" memory is host memory, copies are
 * memcpy, events are always complete, and copy plans run the kernel's own
 * per-lane code on the CPU. CI has no GPU; this is how every device code path
 * of the library still runs there. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "copy_impl.h"

struct gser_backend_state {
    int device;
};

static gser_status_t emu_open(int device, gser_backend_state_t **state)
{
    gser_backend_state_t *s = malloc(sizeof *s);
    if (!s)
        return GSER_ERR_NO_MEMORY;
    s->device = device;
    *state = s;
    return GSER_OK;
}

static void emu_close(gser_backend_state_t *s)
{
    free(s);
}

static gser_status_t emu_alloc(gser_backend_state_t *s, size_t size, void *stream, void **ptr)
{
    (void)s;
    (void)stream;
    /* 256-byte aligned like cudaMalloc; never NULL, even for 0 bytes. */
    size_t rounded = (size + 255) & ~(size_t)255;
    if (rounded < size)
        return GSER_ERR_NO_MEMORY;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p)
        return GSER_ERR_NO_MEMORY;
    *ptr = p;
    return GSER_OK;
}

static void emu_free(gser_backend_state_t *s, void *ptr, size_t size, void *stream)
{
    (void)s;
    (void)size;
    (void)stream;
    free(ptr);
}

static gser_status_t emu_pinned_alloc(gser_backend_state_t *s, size_t size, void **ptr)
{
    return emu_alloc(s, size, NULL, ptr);
}

static void emu_pinned_free(gser_backend_state_t *s, void *ptr, size_t size)
{
    emu_free(s, ptr, size, NULL);
}

static gser_status_t emu_memcpy(gser_backend_state_t *s, void *dst, const void *src, size_t n, copy_kind_t kind,
                                void *stream)
{
    (void)s;
    (void)kind;
    (void)stream;
    if (n)
        memmove(dst, src, n);
    return GSER_OK;
}

static gser_status_t emu_ok(gser_backend_state_t *s, void *x)
{
    (void)s;
    (void)x;
    return GSER_OK;
}

static gser_status_t emu_event_create(gser_backend_state_t *s, void **event)
{
    (void)s;
    /* Any unique non-NULL handle will do. */
    void *e = malloc(1);
    if (!e)
        return GSER_ERR_NO_MEMORY;
    *event = e;
    return GSER_OK;
}

static gser_status_t emu_event_record(gser_backend_state_t *s, void *event, void *stream)
{
    (void)s;
    (void)event;
    (void)stream;
    return GSER_OK;
}

static gser_status_t emu_stream_wait_event(gser_backend_state_t *s, void *stream, void *event)
{
    (void)s;
    (void)stream;
    (void)event;
    return GSER_OK;
}

static void emu_event_destroy(gser_backend_state_t *s, void *event)
{
    (void)s;
    free(event);
}

static gser_status_t emu_copy_plan(gser_backend_state_t *s, const gser_chunk_t *chunks, size_t nchunks, void *stream)
{
    (void)s;
    (void)stream;
    for (size_t c = 0; c < nchunks; c++)
        for (unsigned lane = 0; lane < GSER_LANES; lane++)
            gser_run_chunk_lane(&chunks[c], lane);
    return GSER_OK;
}

static const char *emu_last_error(gser_backend_state_t *s)
{
    (void)s;
    return "";
}

const gser_backend_t gser_backend_emulated = {
    .name = "emulated",
    .open = emu_open,
    .close = emu_close,
    .alloc = emu_alloc,
    .free = emu_free,
    .pinned_alloc = emu_pinned_alloc,
    .pinned_free = emu_pinned_free,
    .memcpy = emu_memcpy,
    .stream_sync = emu_ok,
    .event_create = emu_event_create,
    .event_record = emu_event_record,
    .event_query = emu_ok,
    .event_sync = emu_ok,
    .stream_wait_event = emu_stream_wait_event,
    .event_destroy = emu_event_destroy,
    .copy_plan = emu_copy_plan,
    .last_error = emu_last_error,
};
