/* A cache of host receive buffers. Allocating (and page-faulting) a fresh
 * buffer for every large received frame costs as much as moving it, so the
 * buffers of frames a message released go back here and are reused by later
 * frames of a similar size. Buffers outlive the worker when messages do: the
 * cache is reference counted, one count per buffer out plus one for the
 * worker, and releases may come from any thread. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Frames below this come from malloc directly: it is fast for them. */
#define POOL_MIN ((size_t)64 << 10)
/* Size classes: four per power of two, so at most a quarter is wasted. */
#define POOL_CLASSES 260
/* Before each buffer, a cache line saying where it goes back to. */
#define POOL_HDR GUX_FRAME_ALIGN

typedef struct pool_hdr {
    gux_pool_t *pool; /* NULL: a plain buffer */
    unsigned cls;
} pool_hdr_t;

typedef struct pool_buf {
    struct pool_buf *next;
} pool_buf_t;

struct gux_pool {
    pthread_mutex_t lock;
    atomic_size_t refs;
    bool closed;
    size_t max_cached;
    size_t cached;
    pool_buf_t *free[POOL_CLASSES];
};

/* The class of a size, and the capacity of buffers of that class. */
static unsigned size_class(size_t size, size_t *cap)
{
    unsigned lg = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
    size_t base = (size_t)1 << lg;
    size_t quarter = base >> 2;
    size_t step = (size - base + quarter - 1) / quarter; /* 0..4 */
    *cap = base + step * quarter;
    return lg * 4 + (unsigned)step;
}

static size_t class_cap(unsigned cls)
{
    size_t base = (size_t)1 << (cls / 4);
    return base + (cls % 4) * (base >> 2);
}

gux_pool_t *gux_pool_create(size_t max_cached)
{
    gux_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->refs, 1);
    p->max_cached = max_cached;
    return p;
}

static void pool_free_all(gux_pool_t *p)
{
    for (unsigned c = 0; c < POOL_CLASSES; c++) {
        while (p->free[c]) {
            pool_buf_t *b = p->free[c];
            p->free[c] = b->next;
            free((char *)b - POOL_HDR);
        }
    }
    p->cached = 0;
}

static void pool_unref(gux_pool_t *p)
{
    if (atomic_fetch_sub(&p->refs, 1) != 1)
        return;
    pool_free_all(p);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void gux_pool_close(gux_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    p->closed = true;
    pool_free_all(p);
    pthread_mutex_unlock(&p->lock);
    pool_unref(p);
}

static void pool_release(void *data, void *arg)
{
    (void)arg;
    pool_hdr_t *h = (pool_hdr_t *)((char *)data - POOL_HDR);
    gux_pool_t *p = h->pool;
    if (!p) {
        free(h);
        return;
    }
    unsigned cls = h->cls;
    size_t cap = class_cap(cls);
    pthread_mutex_lock(&p->lock);
    if (!p->closed && p->cached + cap <= p->max_cached) {
        pool_buf_t *b = data;
        b->next = p->free[cls];
        p->free[cls] = b;
        p->cached += cap;
        h = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    if (h)
        free(h);
    pool_unref(p);
}

gser_status_t gux_pool_frame(gux_pool_t *p, size_t size, gser_frame_t *out)
{
    size_t cap = size;
    unsigned cls = 0;
    bool pooled = p && size >= POOL_MIN;
    if (pooled) {
        cls = size_class(size, &cap);
        pthread_mutex_lock(&p->lock);
        pool_buf_t *b = p->free[cls];
        if (b) {
            p->free[cls] = b->next;
            p->cached -= cap;
        }
        pthread_mutex_unlock(&p->lock);
        if (b) {
            atomic_fetch_add(&p->refs, 1);
            *out = (gser_frame_t){.data = b, .size = size, .memory = GSER_MEMORY_HOST, .release = pool_release};
            return GSER_OK;
        }
    }
    size_t rounded = (cap + GUX_FRAME_ALIGN - 1) & ~(size_t)(GUX_FRAME_ALIGN - 1);
    if (rounded < cap || rounded > SIZE_MAX - POOL_HDR)
        return gux_fail(GSER_ERR_NO_MEMORY, "receive: a %zu-byte frame is too large", size);
    void *raw = NULL;
    if (posix_memalign(&raw, GUX_FRAME_ALIGN, POOL_HDR + (rounded ? rounded : GUX_FRAME_ALIGN)))
        return gux_fail(GSER_ERR_NO_MEMORY, "receive: cannot allocate a %zu-byte frame", size);
    pool_hdr_t *h = raw;
    h->pool = pooled ? p : NULL;
    h->cls = cls;
    if (pooled)
        atomic_fetch_add(&p->refs, 1);
    *out = (gser_frame_t){.data = (char *)raw + POOL_HDR, .size = size, .memory = GSER_MEMORY_HOST,
                          .release = pool_release};
    return GSER_OK;
}
