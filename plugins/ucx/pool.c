/* A cache of host receive buffers. Allocating (and page-faulting) a fresh
 * buffer for every large received frame costs as much as moving it, so the
 * buffers of frames a message released go back here and are reused by later
 * frames of a similar size. Buffers outlive the worker when messages do: the
 * cache is reference counted, one count per buffer out plus one for the
 * worker, and releases may come from any thread. The limit grows, up to
 * grow_max, to hold the largest message seen: a worker that keeps receiving
 * 1 GiB tables gains nothing from a 256 MiB cache, since every message would
 * fault in 768 MiB of fresh pages. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

/* Frames below this come from malloc directly: it is fast for them. */
#define POOL_MIN ((size_t)64 << 10)
/* Size classes: four per power of two, so at most a quarter is wasted. */
#define POOL_CLASSES 260

/* A buffer: its bytes, and where it goes back to. Buffers of 2 MiB and more
 * are 2 MiB aligned and asked to use huge pages: the kernel copies received
 * bytes into them page by page, and so does the CPU's TLB. They are
 * mappings of their own, never heap memory: the advice stays with the
 * address range after the buffer is freed, and the heap then faults in
 * whatever it places there (numpy's arrays) 2 MiB at a time, each zeroed
 * whole once glibc gave the pages back (what such faults cost a Dask
 * worker: BENCHMARKS.md, 2026-12-06). */
typedef struct pool_buf {
    struct pool_buf *next; /* in a free list */
    gux_pool_t *pool;      /* NULL: not cached */
    unsigned cls;
    size_t maplen; /* 0: heap memory */
    void *data;
} pool_buf_t;

#define POOL_HUGE ((size_t)2 << 20)

struct gux_pool {
    pthread_mutex_t lock;
    atomic_size_t refs;
    bool closed;
    size_t max_cached;
    size_t grow_max; /* 0: the limit is fixed */
    size_t cached;
    uint64_t hits, misses;
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

gux_pool_t *gux_pool_create(size_t max_cached, size_t grow_max)
{
    gux_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    atomic_init(&p->refs, 1);
    p->max_cached = max_cached;
    p->grow_max = grow_max > max_cached ? grow_max : 0;
    return p;
}

void gux_pool_expect(gux_pool_t *p, size_t bytes)
{
    if (!p || !p->grow_max || bytes <= p->max_cached)
        return;
    pthread_mutex_lock(&p->lock);
    size_t want = bytes < p->grow_max ? bytes : p->grow_max;
    if (want > p->max_cached)
        p->max_cached = want;
    pthread_mutex_unlock(&p->lock);
}

void gux_pool_stats(gux_pool_t *p, gser_ucx_cache_stats_t *out)
{
    pthread_mutex_lock(&p->lock);
    *out = (gser_ucx_cache_stats_t){
        .cached_bytes = p->cached, .limit_bytes = p->max_cached, .hits = p->hits, .misses = p->misses};
    pthread_mutex_unlock(&p->lock);
}

static void buf_free(pool_buf_t *b)
{
    if (b->maplen)
        munmap(b->data, b->maplen);
    else
        free(b->data);
    free(b);
}

/* A mapping of len bytes (a multiple of POOL_HUGE) aligned to POOL_HUGE:
 * one that large, cut at both ends. NULL when none is to be had. */
static void *huge_map(size_t len)
{
    size_t over = len + POOL_HUGE;
    if (over < len)
        return NULL;
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    size_t head = (POOL_HUGE - (uintptr_t)p % POOL_HUGE) % POOL_HUGE;
    if (head)
        munmap(p, head);
    if (over - head > len)
        munmap(p + head + len, over - head - len);
#ifdef MADV_HUGEPAGE
    (void)madvise(p + head, len, MADV_HUGEPAGE); /* a hint: no huge pages is fine */
#endif
    return p + head;
}

static void pool_free_all(gux_pool_t *p)
{
    for (unsigned c = 0; c < POOL_CLASSES; c++) {
        while (p->free[c]) {
            pool_buf_t *b = p->free[c];
            p->free[c] = b->next;
            buf_free(b);
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
    (void)data;
    pool_buf_t *b = arg;
    gux_pool_t *p = b->pool;
    if (!p) {
        buf_free(b);
        return;
    }
    size_t cap = class_cap(b->cls);
    pool_buf_t *evicted = NULL;
    pthread_mutex_lock(&p->lock);
    if (!p->closed && cap <= p->max_cached) {
        /* The buffer just released is the likeliest to be wanted again: cached
         * buffers of other sizes make room for it, smallest first (a workload
         * that moves from 64 MiB to 256 MiB messages would otherwise fault in
         * every new one). */
        for (unsigned c = 0; c < POOL_CLASSES && p->cached + cap > p->max_cached; c++) {
            while (c != b->cls && p->free[c] && p->cached + cap > p->max_cached) {
                pool_buf_t *e = p->free[c];
                p->free[c] = e->next;
                p->cached -= class_cap(c);
                e->next = evicted;
                evicted = e;
            }
        }
        if (p->cached + cap <= p->max_cached) {
            b->next = p->free[b->cls];
            p->free[b->cls] = b;
            p->cached += cap;
            b = NULL;
        }
    }
    pthread_mutex_unlock(&p->lock);
    while (evicted) {
        pool_buf_t *e = evicted;
        evicted = e->next;
        buf_free(e);
    }
    if (b)
        buf_free(b);
    pool_unref(p);
}

gser_status_t gux_pool_frame(gux_pool_t *p, size_t size, gser_frame_t *out)
{
    size_t cap = size;
    unsigned cls = 0;
    bool pooled = p && size >= POOL_MIN;
    pool_buf_t *b = NULL;
    /* No object is larger than PTRDIFF_MAX (malloc refuses it, ASan aborts) */
    if (size > PTRDIFF_MAX)
        return gux_fail(GSER_ERR_NO_MEMORY, "receive: a %zu-byte frame is too large", size);
    if (pooled) {
        cls = size_class(size, &cap);
        if (cap < size || cap > PTRDIFF_MAX) /* the class's capacity overflowed */
            return gux_fail(GSER_ERR_NO_MEMORY, "receive: a %zu-byte frame is too large", size);
        pthread_mutex_lock(&p->lock);
        if ((b = p->free[cls])) {
            p->free[cls] = b->next;
            p->cached -= cap;
            p->hits++;
        } else {
            p->misses++;
        }
        pthread_mutex_unlock(&p->lock);
    }
    if (!b) {
        size_t align = cap >= POOL_HUGE ? POOL_HUGE : GUX_FRAME_ALIGN;
        size_t rounded = (cap + align - 1) & ~(align - 1);
        if (rounded < cap)
            return gux_fail(GSER_ERR_NO_MEMORY, "receive: a %zu-byte frame is too large", size);
        if (!(b = malloc(sizeof *b)))
            return gux_fail(GSER_ERR_NO_MEMORY, "receive: out of memory");
        b->data = NULL;
        b->maplen = align == POOL_HUGE ? rounded : 0;
        if (b->maplen ? !(b->data = huge_map(rounded))
                      : posix_memalign(&b->data, align, rounded ? rounded : align) != 0) {
            free(b);
            return gux_fail(GSER_ERR_NO_MEMORY, "receive: cannot allocate a %zu-byte frame", size);
        }
        b->pool = pooled ? p : NULL;
        b->cls = cls;
    }
    if (pooled)
        atomic_fetch_add(&p->refs, 1);
    *out = (gser_frame_t){.data = b->data, .size = size, .memory = GSER_MEMORY_HOST, .release = pool_release,
                          .release_arg = b};
    return GSER_OK;
}

gser_status_t gser_ucx_worker_alloc_host(gser_ucx_worker_t *w, size_t size, gser_frame_t *frame_out)
{
    if (!w || !frame_out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_worker_alloc_host: bad argument");
    gser_frame_t f;
    gser_status_t st = gux_pool_frame(w->pool, size, &f);
    if (st)
        return gux_fail(st, "gser_ucx_worker_alloc_host: %zu bytes: %s", size, gser_status_str(st));
    gux_pool_expect(w->pool, size); /* so that it is kept when released */
    *frame_out = f;
    return GSER_OK;
}
