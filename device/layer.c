/* The device layer: the handle the core holds (device.h), over one backend
 * table (backend.h). Allocations go through the caller's allocators or the
 * backend's own; everything else goes straight to the backend. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "device.h"
#include "plan.h"
#include <stdint.h>

struct devl {
    const devl_backend_t *b;
    devl_bstate_t *s;
    int ordinal;
    gser_allocator_t dev_alloc;
    gser_allocator_t pin_alloc;
};

/* This thread's text for the layer's last failure: the backend's words, or
 * the layer's own (what it was doing). Read by devl_error. */
static _Thread_local char last_why[320];

/* A backend status: on failure keep the backend's text for devl_error. */
static gser_status_t bk(const devl_t *dl, gser_status_t st)
{
    if (st < 0)
        snprintf(last_why, sizeof last_why, "%s", dl->b->last_error(dl->s));
    return st;
}

static gser_status_t fail(gser_status_t st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static gser_status_t fail(gser_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_why, sizeof last_why, fmt, ap);
    va_end(ap);
    return st;
}

struct devl_batch {
    size_t n;
    bool scatter;
    bool pinned; /* arrays in pinned memory, read by queued work until the event */
    void *arrays;
    size_t arrays_size;
    void *event; /* recorded after the launch, when the work reads the arrays */
};

/* ---- the backend's own allocators, behind gser_allocator_t -------------------- */

static gser_status_t own_alloc(void *user, size_t size, void *stream, void **ptr)
{
    devl_t *dl = user;
    return dl->b->alloc(dl->s, size, stream, ptr);
}

static void own_free(void *user, void *ptr, size_t size, void *stream)
{
    devl_t *dl = user;
    dl->b->free(dl->s, ptr, size, stream);
}

static gser_status_t own_pinned_alloc(void *user, size_t size, void *stream, void **ptr)
{
    (void)stream;
    devl_t *dl = user;
    return dl->b->pinned_alloc(dl->s, size, ptr);
}

static void own_pinned_free(void *user, void *ptr, size_t size, void *stream)
{
    (void)stream;
    devl_t *dl = user;
    dl->b->pinned_free(dl->s, ptr, size);
}

/* ---- opening ------------------------------------------------------------------------ */

static const char backend_names[] = "cuda, emulated, none, auto";

const char *devl_backend_names(void)
{
    return backend_names;
}

static bool is_auto(const char *name)
{
    return !name || !*name || strcmp(name, "auto") == 0;
}

bool devl_backend_known(const char *name)
{
    return is_auto(name) || strcmp(name, "cuda") == 0 || strcmp(name, "emulated") == 0 || strcmp(name, "none") == 0;
}

gser_status_t devl_open(const char *name, int ordinal, const gser_allocator_t *device_alloc,
                        const gser_allocator_t *pinned_alloc, devl_t **out, char *why, size_t why_cap)
{
    bool automatic = is_auto(name);
    const devl_backend_t *b = NULL;
    if (!devl_backend_known(name)) {
        snprintf(why, why_cap, "unknown device backend \"%s\" (%s)", name, backend_names);
        return GSER_ERR_INVALID_ARG;
    }
    if (automatic || strcmp(name, "cuda") == 0) {
#ifdef GSER_HAVE_CUDA
        b = &devl_backend_cuda;
#else
        if (!automatic) {
            snprintf(why, why_cap, "device backend \"cuda\" asked for, but this build has no CUDA");
            return GSER_ERR_NO_DEVICE;
        }
#endif
    } else if (strcmp(name, "emulated") == 0) {
        b = &devl_backend_emulated;
    }
    if (!b) {
        *out = NULL; /* "none", or automatic without CUDA */
        return GSER_OK;
    }
    devl_t *dl = calloc(1, sizeof *dl);
    if (!dl) {
        snprintf(why, why_cap, "out of memory");
        return GSER_ERR_NO_MEMORY;
    }
    gser_status_t st = b->open(ordinal, &dl->s);
    if (st != GSER_OK) {
        free(dl);
        if (automatic) {
            *out = NULL; /* no GPU here: no device backend, not an error */
            return GSER_OK;
        }
        const char *detail = b->last_error(NULL);
        snprintf(why, why_cap, "device backend \"%s\" (GPU %d) cannot be used: %s%s%s", b->name, ordinal,
                 gser_status_str(st), *detail ? ": " : "", detail);
        return st;
    }
    dl->b = b;
    dl->ordinal = ordinal;
    dl->dev_alloc = device_alloc ? *device_alloc
                                 : (gser_allocator_t){sizeof(gser_allocator_t), own_alloc, own_free, dl};
    dl->pin_alloc = pinned_alloc ? *pinned_alloc
                                 : (gser_allocator_t){sizeof(gser_allocator_t), own_pinned_alloc, own_pinned_free, dl};
    *out = dl;
    return GSER_OK;
}

void devl_close(devl_t *dl)
{
    if (!dl)
        return;
    dl->b->close(dl->s);
    free(dl);
}

const char *devl_backend_name(const devl_t *dl)
{
    return dl ? dl->b->name : "none";
}

int devl_ordinal(const devl_t *dl)
{
    return dl ? dl->ordinal : 0;
}

const char *devl_error(const devl_t *dl)
{
    (void)dl;
    return last_why;
}

/* ---- memory --------------------------------------------------------------------------- */

static gser_status_t take(const gser_allocator_t *a, size_t size, void *stream, void **ptr)
{
    void *p = NULL;
    gser_status_t st = a->alloc(a->user, size, stream, &p);
    if (st == GSER_OK && !p && size)
        st = GSER_ERR_NO_MEMORY;
    if (st)
        return fail(st, "the allocator gave no %zu bytes", size);
    *ptr = p;
    return GSER_OK;
}

gser_status_t devl_alloc(devl_t *dl, size_t size, void *stream, void **ptr)
{
    return take(&dl->dev_alloc, size, stream, ptr);
}

void devl_free(devl_t *dl, void *ptr, size_t size, void *stream)
{
    if (ptr)
        dl->dev_alloc.free(dl->dev_alloc.user, ptr, size, stream);
}

gser_status_t devl_pinned_alloc(devl_t *dl, size_t size, void **ptr)
{
    return take(&dl->pin_alloc, size, NULL, ptr);
}

void devl_pinned_free(devl_t *dl, void *ptr, size_t size)
{
    if (ptr)
        dl->pin_alloc.free(dl->pin_alloc.user, ptr, size, NULL);
}

/* ---- copies, streams, events ------------------------------------------------------------ */

gser_status_t devl_memcpy(devl_t *dl, void *dst, const void *src, size_t n, devl_dir_t dir, void *stream)
{
    return n ? bk(dl, dl->b->memcpy(dl->s, dst, src, n, dir, stream)) : GSER_OK;
}

gser_status_t devl_stream_sync(devl_t *dl, void *stream)
{
    return bk(dl, dl->b->stream_sync(dl->s, stream));
}

gser_status_t devl_host_register(devl_t *dl, void *ptr, size_t size, bool *done)
{
    *done = false;
    return bk(dl, dl->b->host_register(dl->s, ptr, size, done));
}

void devl_host_unregister(devl_t *dl, void *ptr)
{
    dl->b->host_unregister(dl->s, ptr);
}

gser_status_t devl_event_create(devl_t *dl, void **event)
{
    return bk(dl, dl->b->event_create(dl->s, event));
}

gser_status_t devl_event_record(devl_t *dl, void *event, void *stream)
{
    return bk(dl, dl->b->event_record(dl->s, event, stream));
}

gser_status_t devl_event_query(devl_t *dl, void *event)
{
    return bk(dl, dl->b->event_query(dl->s, event));
}

gser_status_t devl_event_sync(devl_t *dl, void *event)
{
    return bk(dl, dl->b->event_sync(dl->s, event));
}

gser_status_t devl_stream_wait_event(devl_t *dl, void *stream, void *event)
{
    return bk(dl, dl->b->stream_wait_event(dl->s, stream, event));
}

void devl_event_destroy(devl_t *dl, void *event)
{
    if (event)
        dl->b->event_destroy(dl->s, event);
}

/* ---- batches of copies ------------------------------------------------------------------ */

gser_status_t devl_batch_create(devl_t *dl, size_t n, bool scatter, devl_batch_t **batch, devl_arrays_t *arrays)
{
    devl_batch_t *b = calloc(1, sizeof *b);
    if (!b)
        return fail(GSER_ERR_NO_MEMORY, "out of memory");
    size_t width = scatter ? 3 : 2;
    if (n > SIZE_MAX / (8 * width)) {
        free(b);
        return fail(GSER_ERR_NO_MEMORY, "%zu copies are too many", n);
    }
    b->n = n;
    b->scatter = scatter;
    b->pinned = n > DEVL_FEW;
    b->arrays_size = n * width * 8;
    gser_status_t st = GSER_OK;
    if (b->pinned && (st = devl_pinned_alloc(dl, b->arrays_size, &b->arrays)))
        fail(st, "allocating %zu bytes of pinned memory for the copy plan failed", b->arrays_size);
    else if (!b->pinned && !(b->arrays = malloc(b->arrays_size)))
        st = fail(GSER_ERR_NO_MEMORY, "out of memory");
    if (st) {
        free(b);
        return st;
    }
    /* The layout the backends upload in one piece: src[n], size[n], dst[n]. */
    unsigned char *a = b->arrays;
    *arrays = (devl_arrays_t){(const void **)a, (uint64_t *)(a + n * 8), scatter ? (void **)(a + 2 * n * 8) : NULL};
    *batch = b;
    return GSER_OK;
}

gser_status_t devl_batch_run(devl_t *dl, devl_batch_t *b, void *base, void *stream)
{
    unsigned char *a = b->arrays;
    devl_xfer_t x = {.src = (const unsigned char *const *)a, .size = (const uint64_t *)(a + b->n * 8), .n = b->n,
                     .dst = b->scatter ? (unsigned char *const *)(a + 2 * b->n * 8) : NULL,
                     .base = base, .pad_align = b->scatter ? 0 : DEVL_PACK_ALIGN,
                     .where = b->pinned ? DEVL_ARRAYS_PINNED : DEVL_ARRAYS_HOST};
    for (size_t i = 0; i < b->n; i++)
        x.total += x.size[i] + devl_pad(x.size[i], x.pad_align);
    gser_status_t st;
    if (b->pinned && !b->event && (st = devl_event_create(dl, &b->event)))
        return st;
    if ((st = bk(dl, dl->b->xfer(dl->s, &x, stream))))
        return st;
    /* From here on the arrays may be read by queued work: the batch lives
     * until its event says so, whatever happens next. */
    if (b->pinned && (st = devl_event_record(dl, b->event, stream))) {
        dl->b->stream_sync(dl->s, stream);
        return st;
    }
    return GSER_OK;
}

void devl_batch_release(devl_t *dl, devl_batch_t *b)
{
    if (!b)
        return;
    if (b->event) {
        dl->b->event_sync(dl->s, b->event);
        dl->b->event_destroy(dl->s, b->event);
    }
    if (b->pinned)
        devl_pinned_free(dl, b->arrays, b->arrays_size);
    else
        free(b->arrays);
    free(b);
}

gser_status_t devl_gather_resident(devl_t *dl, const void *const *src, const uint64_t *size, size_t n, uint64_t total,
                                   void *base, void *stream)
{
    devl_xfer_t x = {.src = (const unsigned char *const *)src, .size = size, .n = n, .base = base, .total = total,
                     .pad_align = DEVL_PACK_ALIGN, .where = DEVL_ARRAYS_DEVICE};
    return bk(dl, dl->b->xfer(dl->s, &x, stream));
}

gser_status_t devl_stream_create(devl_t *dl, void **stream)
{
    return bk(dl, dl->b->stream_create(dl->s, stream));
}

void devl_stream_destroy(devl_t *dl, void *stream)
{
    if (stream)
        dl->b->stream_destroy(dl->s, stream);
}

/* ---- Arrow column ops -------------------------------------------------------------------- */

gser_status_t devl_rebase_offsets(devl_t *dl, void *dst, const void *src, size_t count, unsigned width, void *stream)
{
    return bk(dl, dl->b->rebase_offsets(dl->s, dst, src, count, width, stream));
}

gser_status_t devl_copy_bits(devl_t *dl, void *dst, const void *src, uint64_t src_bit, uint64_t nbits, void *stream)
{
    return bk(dl, dl->b->copy_bits(dl->s, dst, src, src_bit, nbits, stream));
}

gser_status_t devl_check_offsets(devl_t *dl, const void *offsets, size_t count, unsigned width, uint64_t end,
                                 void *stream, uint32_t *verdict)
{
    return bk(dl, dl->b->check_offsets(dl->s, offsets, count, width, end, stream, verdict));
}
