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

/* The Arrow helpers, on the CPU. Unsigned arithmetic: offsets are checked
 * by the caller, and a bad one must wrap, not be undefined behaviour. */
static gser_status_t emu_rebase_offsets(gser_backend_state_t *s, void *dst, const void *src, size_t count,
                                        unsigned width, void *stream)
{
    (void)s;
    (void)stream;
    if (width == 4) {
        const uint32_t *in = src;
        uint32_t *out = dst, base = in[0];
        for (size_t i = 0; i < count; i++)
            out[i] = in[i] - base;
    } else {
        const uint64_t *in = src;
        uint64_t *out = dst, base = in[0];
        for (size_t i = 0; i < count; i++)
            out[i] = in[i] - base;
    }
    return GSER_OK;
}

static gser_status_t emu_copy_bits(gser_backend_state_t *s, void *dst, const void *src, uint64_t src_bit,
                                   uint64_t nbits, void *stream)
{
    (void)s;
    (void)stream;
    const unsigned char *in = (const unsigned char *)src + src_bit / 8;
    unsigned char *out = dst;
    unsigned shift = (unsigned)(src_bit % 8);
    uint64_t nbytes = (nbits + 7) / 8, in_bytes = (shift + nbits + 7) / 8; /* never read past the range */
    for (uint64_t j = 0; j < nbytes; j++) {
        unsigned v = in[j] >> shift;
        if (shift && j + 1 < in_bytes)
            v |= (unsigned)in[j + 1] << (8 - shift);
        if (j == nbytes - 1 && nbits % 8)
            v &= (1u << (nbits % 8)) - 1;
        out[j] = (unsigned char)v;
    }
    return GSER_OK;
}

static const char *emu_last_error(gser_backend_state_t *s)
{
    (void)s;
    return "";
}

static gser_status_t emu_check_offsets(gser_backend_state_t *s, const void *offsets, size_t count, unsigned width,
                                       uint64_t end, void *stream, uint32_t *verdict)
{
    (void)s;
    (void)stream;
    uint32_t v = 0;
    int64_t prev = 0;
    for (size_t i = 0; i < count; i++) {
        int64_t o;
        if (width == 4) {
            int32_t o32;
            memcpy(&o32, (const char *)offsets + 4 * i, 4);
            o = o32;
        } else {
            memcpy(&o, (const char *)offsets + 8 * i, 8);
        }
        if (i == 0 && o != 0)
            v |= 1u; /* GSER_OFFSETS_FIRST */
        if (i > 0 && o < prev)
            v |= 2u; /* GSER_OFFSETS_DECREASE */
        if (i + 1 == count && (o < 0 || (uint64_t)o != end))
            v |= 4u; /* GSER_OFFSETS_LAST */
        prev = o;
    }
    *verdict = v;
    return GSER_OK;
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
    .rebase_offsets = emu_rebase_offsets,
    .copy_bits = emu_copy_bits,
    .check_offsets = emu_check_offsets,
};
