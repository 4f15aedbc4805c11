/* Large host buffers that are written whole right after they are allocated
 * (a file read into one, a frame decompressed or compressed into one).
 *
 * Fresh memory is what such buffers cost most: every page is faulted in and
 * zeroed by the kernel, and on a virtual machine whose free memory the host
 * has taken back, each first touch costs more again (measured: the same 2 GiB
 * of writes taking 0.5 s or 5 s of system time depending on that). The heap
 * did not keep such blocks for the next one: glibc maps a block over its
 * dynamic threshold anew, and trims a thread arena's heaps as they empty
 * (these are often allocated on the offload thread that decompresses a
 * message's parts and freed on another). Measured: every 64 MiB message
 * received in 4 MiB parts faulted in 34 MiB of its decompressed pieces
 * again, 8,700 page faults and a quarter of the receiver's CPU. So: up to
 * GSER_BIGBUF_HEAP_MAX the heap; above, an anonymous mapping advised for
 * huge pages (from 32 MiB rounded up to whole ones), and freed mappings kept (up to
 * GSER_BIGBUF_KEEP bytes in all) for the next buffer that fits, already
 * faulted in. A leaf: calls no other gser file.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gser/testing.h>

#include "internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define BIGBUF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BIGBUF_ASAN 1
#endif
#endif
#ifdef BIGBUF_ASAN
#include <sanitizer/asan_interface.h>
/* A kept mapping is poisoned: a use after free still faults under ASan. */
#define BIGBUF_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define BIGBUF_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define BIGBUF_POISON(p, n) ((void)0)
#define BIGBUF_UNPOISON(p, n) ((void)0)
#endif

#define BIGBUF_ALIGN ((size_t)2 << 20) /* a huge page */
#define BIGBUF_HUGE_MIN ((size_t)32 << 20)
#define BIGBUF_GIVE_MIN ((size_t)64 << 10) /* a tail worth a system call */
#define BIGBUF_SLOTS 32 /* a 64 MiB message's 4 MiB pieces, and room */

static struct {
    pthread_mutex_t lock;
    void *p[BIGBUF_SLOTS];
    size_t n[BIGBUF_SLOTS]; /* 0: an empty slot */
    size_t kept;            /* bytes in the slots */
    gser_bigbuf_stats_t stats;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A mapping's length for n bytes: whole huge pages from 32 MiB, where the
 * rounding is at most 6 %; below, whole pages, so that the many frames of a
 * few MiB a worker may hold cost what they hold (the kernel puts huge pages
 * only where whole ones fit inside the mapping). */
static size_t maplen(size_t n)
{
    size_t unit = n >= BIGBUF_HUGE_MIN ? BIGBUF_ALIGN : (size_t)sysconf(_SC_PAGESIZE);
    return (n + unit - 1) / unit * unit;
}

/* The whole pages of mapping p (len bytes) past its first used bytes given
 * back: a kept mapping reused holds them, and a compressed frame, far
 * smaller than the bound it was given, may be held long. */
static void give_back_tail(void *p, size_t used, size_t len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t from = (used + page - 1) / page * page;
    if (from < len && len - from >= BIGBUF_GIVE_MIN)
        (void)madvise((char *)p + from, len - from, MADV_DONTNEED);
}

/* The smallest kept mapping of at least len bytes, taken out of the pool
 * and cut to len; NULL when none fits. Called with the lock held. A
 * mapping leaves the pool unpoisoned: unmapped memory must not stay
 * poisoned for whatever is mapped there next. */
static void *pool_take(size_t len)
{
    int best = -1;
    for (int i = 0; i < BIGBUF_SLOTS; i++)
        if (pool.n[i] >= len && (best < 0 || pool.n[i] < pool.n[best]))
            best = i;
    if (best < 0)
        return NULL;
    char *p = pool.p[best];
    size_t n = pool.n[best];
    pool.n[best] = 0;
    pool.kept -= n;
    BIGBUF_UNPOISON(p, n);
    if (n > len)
        munmap(p + len, n - len); /* the tail: gser__bigbuf_free knows len only */
    return p;
}

static void *heap_alloc(size_t n)
{
    void *buf = NULL;
    return posix_memalign(&buf, 64, n ? n : 1) ? NULL : buf;
}

void *gser__bigbuf_alloc(size_t n)
{
    if (n <= GSER_BIGBUF_HEAP_MAX)
        return heap_alloc(n);
    size_t len = maplen(n);
    if (len < n)
        return NULL; /* rounding overflowed */
    pthread_mutex_lock(&pool.lock);
    void *p = pool_take(len);
    if (p)
        pool.stats.reused++;
    else
        pool.stats.mapped++;
    pthread_mutex_unlock(&pool.lock);
    if (p)
        return p; /* cut to len: it holds what a fresh one would */
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL; /* never the heap instead: the size alone says how to free */
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: refused where THP is off */
#endif
    return p;
}

void gser__bigbuf_free(void *p, size_t n)
{
    if (!p)
        return;
    if (n <= GSER_BIGBUF_HEAP_MAX) {
        free(p);
        return;
    }
    size_t len = maplen(n);
    pthread_mutex_lock(&pool.lock);
    int slot = -1;
    if (len <= GSER_BIGBUF_KEEP) {
        /* room: empty slots first, then the smallest kept mappings go */
        while (pool.kept + len > GSER_BIGBUF_KEEP) {
            int small = -1;
            for (int i = 0; i < BIGBUF_SLOTS; i++)
                if (pool.n[i] && (small < 0 || pool.n[i] < pool.n[small]))
                    small = i;
            BIGBUF_UNPOISON(pool.p[small], pool.n[small]);
            munmap(pool.p[small], pool.n[small]);
            pool.kept -= pool.n[small];
            pool.n[small] = 0;
        }
        for (int i = 0; i < BIGBUF_SLOTS && slot < 0; i++)
            if (!pool.n[i])
                slot = i;
    }
    if (slot >= 0) {
        BIGBUF_POISON(p, len);
        pool.p[slot] = p;
        pool.n[slot] = len;
        pool.kept += len;
        pool.stats.kept_bytes = pool.kept;
    }
    pthread_mutex_unlock(&pool.lock);
    if (slot < 0)
        munmap(p, len);
}

void *gser__bigbuf_shrink(void *p, size_t n, size_t used)
{
    if (used >= n)
        return p;
    if (n > GSER_BIGBUF_HEAP_MAX) {
        give_back_tail(p, used, maplen(n));
        return p;
    }
    void *q = realloc(p, used ? used : 1);
    return q ? q : p;
}

void gser__bigbuf_release(void *data, void *arg)
{
    gser__bigbuf_free(data, (size_t)(uintptr_t)arg);
}

void gser_bigbuf_stats_get(gser_bigbuf_stats_t *out)
{
    pthread_mutex_lock(&pool.lock);
    pool.stats.kept_bytes = pool.kept;
    *out = pool.stats;
    pthread_mutex_unlock(&pool.lock);
}

void gser_bigbuf_stats_reset(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.stats.mapped = pool.stats.reused = 0;
    for (int i = 0; i < BIGBUF_SLOTS; i++)
        if (pool.n[i]) {
            BIGBUF_UNPOISON(pool.p[i], pool.n[i]);
            munmap(pool.p[i], pool.n[i]);
            pool.n[i] = 0;
        }
    pool.kept = pool.stats.kept_bytes = 0;
    pthread_mutex_unlock(&pool.lock);
}
