/* The emulated device backend: "device" memory is host memory, copies are
 * memcpy, events are always complete, and copy plans run the kernel's own
 * per-lane code on the CPU. CI has no GPU; this is how every device code path
 * of the library still runs there. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "copy_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_POISON 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_POISON 1
#endif
#endif

#ifdef EMU_POISON
/* Under AddressSanitizer, emulated device memory is poisoned except while a
 * backend operation works on it. Host code that dereferences a device
 * pointer -- which on a GPU would fault or read garbage -- then fails in CI
 * instead of passing by accident. Every live allocation is registered (sorted
 * by address) with a count of the operations that have it open, so that
 * concurrent operations on one allocation do not poison it under each other. */
#include <pthread.h>
#include <sanitizer/asan_interface.h>

typedef struct emu_alloc_rec {
    char *base;
    size_t size;
    unsigned open;
} emu_alloc_rec_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static emu_alloc_rec_t *g_recs;
static size_t g_n, g_cap;

/* GSER_EMULATED_POISON=0 turns it off, for tests that stand in for a CUDA
 * consumer by reading emulated device memory directly (the Python tests). */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_poison;

static void poison_init(void)
{
    const char *v = getenv("GSER_EMULATED_POISON");
    g_poison = !(v && strcmp(v, "0") == 0);
}

static bool poison_on(void)
{
    pthread_once(&g_once, poison_init);
    return g_poison;
}

/* Index of the first record whose base is above p. Lock held. */
static size_t rec_upper(const void *p)
{
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((const char *)p < g_recs[mid].base)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The record of the allocation holding p, or NULL (host memory). Lock held. */
static emu_alloc_rec_t *rec_find(const void *p)
{
    size_t i = rec_upper(p);
    if (i == 0)
        return NULL;
    emu_alloc_rec_t *r = &g_recs[i - 1];
    return (const char *)p < r->base + r->size ? r : NULL;
}

static bool rec_add(char *base, size_t size)
{
    if (!poison_on())
        return true;
    pthread_mutex_lock(&g_lock);
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 64;
        emu_alloc_rec_t *n = realloc(g_recs, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g_lock);
            return false;
        }
        g_recs = n;
        g_cap = cap;
    }
    size_t i = rec_upper(base);
    memmove(&g_recs[i + 1], &g_recs[i], (g_n - i) * sizeof *g_recs);
    g_recs[i] = (emu_alloc_rec_t){base, size, 0};
    g_n++;
    ASAN_POISON_MEMORY_REGION(base, size);
    pthread_mutex_unlock(&g_lock);
    return true;
}

static void rec_del(char *base)
{
    if (!poison_on())
        return;
    pthread_mutex_lock(&g_lock);
    emu_alloc_rec_t *r = rec_find(base);
    if (r) {
        ASAN_UNPOISON_MEMORY_REGION(r->base, r->size);
        size_t i = (size_t)(r - g_recs);
        memmove(&g_recs[i], &g_recs[i + 1], (g_n - i - 1) * sizeof *g_recs);
        g_n--;
    }
    pthread_mutex_unlock(&g_lock);
}

/* An operation starts (open) or ends (close) its work on the memory at p. */
static void dev_open(const void *p)
{
    if (!poison_on())
        return;
    pthread_mutex_lock(&g_lock);
    emu_alloc_rec_t *r = rec_find(p);
    if (r && r->open++ == 0)
        ASAN_UNPOISON_MEMORY_REGION(r->base, r->size);
    pthread_mutex_unlock(&g_lock);
}

static void dev_close(const void *p)
{
    if (!poison_on())
        return;
    pthread_mutex_lock(&g_lock);
    emu_alloc_rec_t *r = rec_find(p);
    if (r && --r->open == 0)
        ASAN_POISON_MEMORY_REGION(r->base, r->size);
    pthread_mutex_unlock(&g_lock);
}
#else
static bool rec_add(char *base, size_t size)
{
    (void)base;
    (void)size;
    return true;
}
static void rec_del(char *base)
{
    (void)base;
}
static void dev_open(const void *p)
{
    (void)p;
}
static void dev_close(const void *p)
{
    (void)p;
}
#endif

struct devl_bstate {
    int ordinal;
};

static gser_status_t emu_open(int ordinal, devl_bstate_t **state)
{
    devl_bstate_t *s = malloc(sizeof *s);
    if (!s)
        return GSER_ERR_NO_MEMORY;
    s->ordinal = ordinal;
    *state = s;
    return GSER_OK;
}

static void emu_close(devl_bstate_t *s)
{
    free(s);
}

/* 256-byte aligned like cudaMalloc; never NULL, even for 0 bytes. */
static gser_status_t host_alloc(size_t size, void **ptr, size_t *rounded_out)
{
    size_t rounded = (size + 255) & ~(size_t)255;
    if (rounded < size)
        return GSER_ERR_NO_MEMORY;
    if (!rounded)
        rounded = 256;
    void *p = aligned_alloc(256, rounded);
    if (!p)
        return GSER_ERR_NO_MEMORY;
    *ptr = p;
    *rounded_out = rounded;
    return GSER_OK;
}

static gser_status_t emu_alloc(devl_bstate_t *s, size_t size, void *stream, void **ptr)
{
    (void)s;
    (void)stream;
    void *p;
    size_t rounded;
    gser_status_t st = host_alloc(size, &p, &rounded);
    if (st)
        return st;
    if (!rec_add(p, rounded)) {
        free(p);
        return GSER_ERR_NO_MEMORY;
    }
    *ptr = p;
    return GSER_OK;
}

static void emu_free(devl_bstate_t *s, void *ptr, size_t size, void *stream)
{
    (void)s;
    (void)size;
    (void)stream;
    rec_del(ptr);
    free(ptr);
}

/* Pinned memory is host memory: host code may touch it, so it is never poisoned. */
static gser_status_t emu_pinned_alloc(devl_bstate_t *s, size_t size, void **ptr)
{
    (void)s;
    size_t rounded;
    return host_alloc(size, ptr, &rounded);
}

static void emu_pinned_free(devl_bstate_t *s, void *ptr, size_t size)
{
    (void)s;
    (void)size;
    free(ptr);
}

static gser_status_t emu_memcpy(devl_bstate_t *s, void *dst, const void *src, size_t n, devl_dir_t kind,
                                void *stream)
{
    (void)s;
    (void)stream;
    if (!n)
        return GSER_OK;
    bool dev_src = kind == DEVL_D2H || kind == DEVL_D2D, dev_dst = kind == DEVL_H2D || kind == DEVL_D2D;
    if (dev_src)
        dev_open(src);
    if (dev_dst)
        dev_open(dst);
    memmove(dst, src, n);
    if (dev_dst)
        dev_close(dst);
    if (dev_src)
        dev_close(src);
    return GSER_OK;
}

static gser_status_t emu_ok(devl_bstate_t *s, void *x)
{
    (void)s;
    (void)x;
    return GSER_OK;
}

static gser_status_t emu_event_create(devl_bstate_t *s, void **event)
{
    (void)s;
    /* Any unique non-NULL handle will do. */
    void *e = malloc(1);
    if (!e)
        return GSER_ERR_NO_MEMORY;
    *event = e;
    return GSER_OK;
}

static gser_status_t emu_event_record(devl_bstate_t *s, void *event, void *stream)
{
    (void)s;
    (void)event;
    (void)stream;
    return GSER_OK;
}

static gser_status_t emu_stream_wait_event(devl_bstate_t *s, void *stream, void *event)
{
    (void)s;
    (void)stream;
    (void)event;
    return GSER_OK;
}

static void emu_event_destroy(devl_bstate_t *s, void *event)
{
    (void)s;
    free(event);
}

static gser_status_t emu_copy_plan(devl_bstate_t *s, const devl_chunk_t *chunks, size_t nchunks, void *stream)
{
    (void)s;
    (void)stream;
    for (size_t c = 0; c < nchunks; c++) {
        dev_open(chunks[c].src);
        dev_open(chunks[c].dst);
        for (unsigned lane = 0; lane < GSER_LANES; lane++)
            gser_run_chunk_lane(&chunks[c], lane);
        dev_close(chunks[c].dst);
        dev_close(chunks[c].src);
    }
    return GSER_OK;
}

/* The Arrow helpers, on the CPU. Unsigned arithmetic: offsets are checked
 * by the caller, and a bad one must wrap, not be undefined behaviour. */
static gser_status_t emu_rebase_offsets(devl_bstate_t *s, void *dst, const void *src, size_t count,
                                        unsigned width, void *stream)
{
    (void)s;
    (void)stream;
    dev_open(src);
    dev_open(dst);
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
    dev_close(dst);
    dev_close(src);
    return GSER_OK;
}

static gser_status_t emu_copy_bits(devl_bstate_t *s, void *dst, const void *src, uint64_t src_bit,
                                   uint64_t nbits, void *stream)
{
    (void)s;
    (void)stream;
    dev_open(src);
    dev_open(dst);
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
    dev_close(dst);
    dev_close(src);
    return GSER_OK;
}

static const char *emu_last_error(devl_bstate_t *s)
{
    (void)s;
    return "";
}

static gser_status_t emu_check_offsets(devl_bstate_t *s, const void *offsets, size_t count, unsigned width,
                                       uint64_t end, void *stream, uint32_t *verdict)
{
    (void)s;
    (void)stream;
    uint32_t v = 0;
    int64_t prev = 0;
    dev_open(offsets);
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
    dev_close(offsets);
    *verdict = v;
    return GSER_OK;
}

const devl_backend_t devl_backend_emulated = {
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
