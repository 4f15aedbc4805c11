/* The emulated device backend: "device" memory is host memory, and the
 * device is a worker thread. Without a GPU, this is how every device code
 * path of the library still runs -- and how code that forgets to wait for
 * the device fails, as it would on a GPU:
 *
 * - Streams really queue work. Work on a stream runs, on the worker, only
 *   once someone waits for it (stream or event sync), asks about it (an
 *   event query, which answers "not yet" the first time), or a stream that
 *   waits for it runs; or when the backend closes. Host code that reads a
 *   result before waiting sees what was there before: fresh device and
 *   pinned memory is filled with 0xDB, so that is never the right answer.
 * - Copies follow CUDA's rules for pageable memory: host-to-device reads the
 *   source before returning, device-to-host and host-to-host return once
 *   done; with pinned host memory both sides are read and written when the
 *   copy runs.
 * - Memory is freed in stream order, so freeing what queued work still reads
 *   is a use after free under AddressSanitizer; and there device memory is
 *   poisoned except while an operation works on it, so host code that
 *   dereferences a device pointer fails with use-after-poison.
 *
 * Streams and events are process-wide (like a GPU's), shared by every
 * context with this backend; the worker starts with the first piece of work
 * and stops when the last context closes, after draining every stream.
 * Copy batches run the kernel's own per-lane code (copy_impl.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gser/testing.h"
#include "copy_impl.h"
#include "pincache.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define EMU_FILL 0xDB
/* Stream-ordered frees queued on one stream release its work past this many
 * bytes, so that a loop that never waits does not hold memory forever. */
#define EMU_FREE_PENDING_MAX ((size_t)64 << 20)
/* The warps the emulated GPU has resident (sizes the tiles, as on a GPU). */
#define EMU_RESIDENT_WARPS 64

/* ---- allocations: what is device memory, what is pinned ------------------------------------- */

typedef struct emu_rec {
    char *base;
    size_t size;
    bool pinned;
    unsigned open; /* operations working on it (device memory is unpoisoned while > 0) */
} emu_rec_t;

static pthread_mutex_t g_rec_lock = PTHREAD_MUTEX_INITIALIZER;
static emu_rec_t *g_recs; /* sorted by base */
static size_t g_nrecs, g_caprecs;

#ifdef EMU_ASAN
/* GSER_EMULATED_POISON=0 turns the poisoning off, for tests that stand in
 * for a CUDA consumer by reading emulated device memory directly. */
static pthread_once_t g_poison_once = PTHREAD_ONCE_INIT;
static bool g_poison;

static void poison_init(void)
{
    const char *v = getenv("GSER_EMULATED_POISON");
    g_poison = !(v && strcmp(v, "0") == 0);
}
#endif

static void poison(emu_rec_t *r, bool on)
{
#ifdef EMU_ASAN
    pthread_once(&g_poison_once, poison_init);
    if (!r->pinned && g_poison) {
        if (on)
            ASAN_POISON_MEMORY_REGION(r->base, r->size);
        else
            ASAN_UNPOISON_MEMORY_REGION(r->base, r->size);
    }
#else
    (void)r;
    (void)on;
#endif
}

/* Index of the first record whose base is above p. Lock held. */
static size_t rec_upper(const void *p)
{
    size_t lo = 0, hi = g_nrecs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((const char *)p < g_recs[mid].base)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The record holding [p, p + n), or NULL. Lock held. */
static emu_rec_t *rec_find(const void *p, size_t n)
{
    size_t i = rec_upper(p);
    if (i == 0)
        return NULL;
    emu_rec_t *r = &g_recs[i - 1];
    return (const char *)p < r->base + r->size && n <= (size_t)(r->base + r->size - (const char *)p) ? r : NULL;
}

static bool rec_add(char *base, size_t size, bool pinned)
{
    pthread_mutex_lock(&g_rec_lock);
    if (g_nrecs == g_caprecs) {
        size_t cap = g_caprecs ? 2 * g_caprecs : 64;
        emu_rec_t *n = realloc(g_recs, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g_rec_lock);
            return false;
        }
        g_recs = n;
        g_caprecs = cap;
    }
    size_t i = rec_upper(base);
    memmove(&g_recs[i + 1], &g_recs[i], (g_nrecs - i) * sizeof *g_recs);
    g_recs[i] = (emu_rec_t){base, size, pinned, 0};
    g_nrecs++;
    poison(&g_recs[i], true);
    pthread_mutex_unlock(&g_rec_lock);
    return true;
}

static void rec_del(char *base)
{
    pthread_mutex_lock(&g_rec_lock);
    emu_rec_t *r = rec_find(base, 0);
    if (r && r->base == base) {
        poison(r, false);
        size_t i = (size_t)(r - g_recs);
        memmove(&g_recs[i], &g_recs[i + 1], (g_nrecs - i - 1) * sizeof *g_recs);
        g_nrecs--;
    }
    pthread_mutex_unlock(&g_rec_lock);
}

static bool is_pinned(const void *p, size_t n)
{
    pthread_mutex_lock(&g_rec_lock);
    emu_rec_t *r = rec_find(p, n);
    bool pinned = r && r->pinned;
    pthread_mutex_unlock(&g_rec_lock);
    return pinned;
}

/* Memory the backend allocated as device memory. */
static bool is_device(const void *p)
{
    pthread_mutex_lock(&g_rec_lock);
    emu_rec_t *r = rec_find(p, 0);
    bool dev = r && !r->pinned;
    pthread_mutex_unlock(&g_rec_lock);
    return dev;
}

/* The copy counters of gser/testing.h. */
static _Atomic uint64_t g_stats[6];
enum { ST_D2H_OPS, ST_D2H_COPIES, ST_D2H_BYTES, ST_D2D_OPS, ST_D2D_COPIES, ST_D2D_BYTES };

void gser_device_stats_get(gser_device_stats_t *out)
{
    if (out)
        *out = (gser_device_stats_t){atomic_load(&g_stats[0]), atomic_load(&g_stats[1]), atomic_load(&g_stats[2]),
                                     atomic_load(&g_stats[3]), atomic_load(&g_stats[4]), atomic_load(&g_stats[5])};
}

void gser_device_stats_reset(void)
{
    for (size_t i = 0; i < 6; i++)
        atomic_store(&g_stats[i], 0);
}

/* Count the copies of an op: what it wrote into host and into device memory. */
static void count_copies(uint64_t h_copies, uint64_t h_bytes, uint64_t d_copies, uint64_t d_bytes)
{
    if (h_copies) {
        atomic_fetch_add(&g_stats[ST_D2H_OPS], 1);
        atomic_fetch_add(&g_stats[ST_D2H_COPIES], h_copies);
        atomic_fetch_add(&g_stats[ST_D2H_BYTES], h_bytes);
    }
    if (d_copies) {
        atomic_fetch_add(&g_stats[ST_D2D_OPS], 1);
        atomic_fetch_add(&g_stats[ST_D2D_COPIES], d_copies);
        atomic_fetch_add(&g_stats[ST_D2D_BYTES], d_bytes);
    }
}

/* An operation starts (open) or ends (close) its work on the memory at p. */
static void dev_open(const void *p)
{
    pthread_mutex_lock(&g_rec_lock);
    emu_rec_t *r = rec_find(p, 0);
    if (r && r->open++ == 0)
        poison(r, false);
    pthread_mutex_unlock(&g_rec_lock);
}

static void dev_close(const void *p)
{
    pthread_mutex_lock(&g_rec_lock);
    emu_rec_t *r = rec_find(p, 0);
    if (r && --r->open == 0)
        poison(r, true);
    pthread_mutex_unlock(&g_rec_lock);
}

/* 256-byte aligned like cudaMalloc, never NULL (even for 0 bytes), and
 * filled with EMU_FILL: fresh memory never holds the right answer. */
static gser_status_t host_alloc(size_t size, bool pinned, void **ptr)
{
    size_t rounded = (size + 255) & ~(size_t)255;
    if (rounded < size)
        return GSER_ERR_NO_MEMORY;
    if (!rounded)
        rounded = 256;
    void *p = aligned_alloc(256, rounded);
    if (!p)
        return GSER_ERR_NO_MEMORY;
    memset(p, EMU_FILL, rounded);
    if (!rec_add(p, rounded, pinned)) {
        free(p);
        return GSER_ERR_NO_MEMORY;
    }
    *ptr = p;
    return GSER_OK;
}

static void host_free(void *p)
{
    rec_del(p);
    free(p);
}

/* ---- the queue ---------------------------------------------------------------------------------- */

typedef enum emu_kind {
    OP_COPY,   /* memmove, device sides opened */
    OP_XFER,   /* a batch of copies (copy_impl.h) */
    OP_REBASE,
    OP_BITS,
    OP_CHECK,
    OP_WAIT,   /* until another stream reaches a point */
    OP_FREE,
} emu_kind_t;

typedef struct emu_stream emu_stream_t;

typedef struct emu_op {
    struct emu_op *next;
    uint64_t seq;
    emu_kind_t kind;
    void *owned; /* freed after the op ran: snapshots the op reads */
    union {
        struct {
            void *dst;
            const void *src;
            size_t n;
            bool dev_dst, dev_src;
        } copy;
        devl_xfer_t xfer;
        struct {
            void *dst;
            const void *src;
            size_t count;
            unsigned width;
        } rebase;
        struct {
            void *dst;
            const void *src;
            uint64_t src_bit, nbits;
        } bits;
        struct {
            const void *offsets;
            size_t count;
            unsigned width;
            uint64_t end;
            uint32_t *verdict;
        } check;
        struct {
            emu_stream_t *target;
            uint64_t seq;
        } wait;
        void *free_ptr;
    } u;
} emu_op_t;

struct emu_stream {
    const void *key; /* the caller's handle; per-thread default streams: a thread's key */
    emu_op_t *head, *tail;
    uint64_t enqueued, released, done;
    size_t free_pending; /* bytes of queued frees */
};

typedef struct emu_event {
    emu_stream_t *stream; /* where it was last recorded; NULL: never */
    uint64_t seq;
    uint64_t epoch;       /* streams of an earlier epoch are gone: complete */
} emu_event_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work; /* the worker: something may be runnable */
    pthread_cond_t done; /* waiters: an op finished */
    unsigned refs;       /* open backends */
    bool worker_on, stop;
    pthread_t worker;
    emu_stream_t **streams;
    size_t nstreams, cap;
    uint64_t epoch;
} g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false, false, 0, NULL, 0, 0,
       1};

/* A per-thread default stream's key: one address per thread. */
static _Thread_local char g_thread_key;

static void run(emu_op_t *op);

/* Lock held. */
static emu_stream_t *stream_get(void *handle)
{
    const void *key = handle ? (const void *)handle : (const void *)&g_thread_key;
    for (size_t i = 0; i < g.nstreams; i++)
        if (g.streams[i]->key == key)
            return g.streams[i];
    if (g.nstreams == g.cap) {
        size_t cap = g.cap ? 2 * g.cap : 16;
        emu_stream_t **n = realloc(g.streams, cap * sizeof *n);
        if (!n)
            return NULL;
        g.streams = n;
        g.cap = cap;
    }
    emu_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->key = key;
    g.streams[g.nstreams++] = s;
    return s;
}

/* Let s run up to seq, and whatever its waits need. Lock held. */
static void release(emu_stream_t *s, uint64_t seq)
{
    if (seq <= s->released)
        return;
    uint64_t from = s->released;
    s->released = seq;
    s->free_pending = 0;
    for (emu_op_t *op = s->head; op && op->seq <= seq; op = op->next)
        if (op->seq > from && op->kind == OP_WAIT)
            release(op->u.wait.target, op->u.wait.seq);
    pthread_cond_signal(&g.work);
}

static bool runnable(const emu_stream_t *s)
{
    const emu_op_t *op = s->head;
    if (!op || op->seq > s->released)
        return false;
    return op->kind != OP_WAIT || op->u.wait.target->done >= op->u.wait.seq;
}

static void *worker_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g.lock);
    size_t next = 0;
    for (;;) {
        emu_op_t *op = NULL;
        emu_stream_t *s = NULL;
        for (size_t k = 0; k < g.nstreams && !op; k++) {
            s = g.streams[(next + k) % g.nstreams];
            if (runnable(s)) {
                op = s->head;
                s->head = op->next;
                if (!s->head)
                    s->tail = NULL;
                next = (next + k + 1) % g.nstreams;
            }
        }
        if (!op) {
            if (g.stop)
                break;
            pthread_cond_wait(&g.work, &g.lock);
            continue;
        }
        pthread_mutex_unlock(&g.lock);
        run(op);
        pthread_mutex_lock(&g.lock);
        s->done = op->seq;
        free(op->owned);
        free(op);
        pthread_cond_broadcast(&g.done);
    }
    pthread_mutex_unlock(&g.lock);
    return NULL;
}

/* A fork leaves the child without the worker (and maybe with a lock held by
 * a thread that is gone): take the locks around fork, start over in the child. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&g.lock);
    pthread_mutex_lock(&g_rec_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&g_rec_lock);
    pthread_mutex_unlock(&g.lock);
}

static void fork_child(void)
{
    pthread_mutex_unlock(&g_rec_lock);
    pthread_mutex_unlock(&g.lock);
    g.worker_on = false;
}

static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void atfork_init(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Lock held. */
static gser_status_t worker_ensure(void)
{
    if (g.worker_on)
        return GSER_OK;
    g.stop = false;
    if (pthread_create(&g.worker, NULL, worker_main, NULL) != 0)
        return GSER_ERR_NO_MEMORY;
    g.worker_on = true;
    return GSER_OK;
}

/* Queue op on the stream handle; *s_out and the op's seq for a caller that
 * waits for it. Takes op (freed on failure). */
static gser_status_t enqueue(void *handle, emu_op_t *op, emu_stream_t **s_out)
{
    pthread_mutex_lock(&g.lock);
    emu_stream_t *s = stream_get(handle);
    gser_status_t st = s ? worker_ensure() : GSER_ERR_NO_MEMORY;
    if (st) {
        pthread_mutex_unlock(&g.lock);
        free(op->owned);
        free(op);
        return st;
    }
    op->seq = ++s->enqueued;
    op->next = NULL;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    if (op->kind == OP_FREE && s->free_pending >= EMU_FREE_PENDING_MAX) {
        s->free_pending = 0;
        release(s, op->seq);
    }
    if (s_out)
        *s_out = s;
    pthread_mutex_unlock(&g.lock);
    return GSER_OK;
}

static emu_op_t *op_new(emu_kind_t kind)
{
    emu_op_t *op = calloc(1, sizeof *op);
    if (op)
        op->kind = kind;
    return op;
}

/* Block until s has run up to seq. Lock held. */
static void wait_locked(emu_stream_t *s, uint64_t seq)
{
    release(s, seq);
    while (s->done < seq)
        pthread_cond_wait(&g.done, &g.lock);
}


/* ---- running ops (on the worker) -------------------------------------------------------------- */

/* Positions of a batch, in blocks as the device computes them. */
static gser_status_t xfer_positions(const devl_xfer_t *x, uint64_t **local, uint64_t **block)
{
    size_t nb = (x->n + DEVL_SCAN_BLOCK - 1) / DEVL_SCAN_BLOCK;
    uint64_t *l = malloc((x->n + nb) * sizeof *l);
    if (!l)
        return GSER_ERR_NO_MEMORY;
    devl_scan_cpu(x->size, x->n, x->pad_align, l, l + x->n);
    *local = l;
    *block = l + x->n;
    return GSER_OK;
}

static void run_xfer(const devl_xfer_t *x)
{
    bool dev_arrays = x->where == DEVL_ARRAYS_DEVICE;
    if (dev_arrays) {
        dev_open(x->src);
        dev_open(x->size);
        if (x->dst)
            dev_open(x->dst);
    }
    uint64_t *local, *block;
    if (xfer_positions(x, &local, &block) == GSER_OK) {
        devl_plan_t p = {.src = x->src, .dst = x->dst, .size = x->size, .pos_local = local, .pos_block = block,
                         .n = x->n, .base = x->base, .total = x->total,
                         .tile = devl_tile_bytes(x->total, EMU_RESIDENT_WARPS), .pad_align = x->pad_align};
        /* Every buffer it touches is opened for the run (the poisoning). */
        uint64_t hc = 0, hb = 0, dc = 0, db = 0;
        bool base_dev = !x->dst && is_device(x->base);
        for (size_t i = 0; i < x->n; i++) {
            if (x->size[i]) {
                bool to_dev = x->dst ? is_device(x->dst[i]) : base_dev;
                *(to_dev ? &dc : &hc) += 1;
                *(to_dev ? &db : &hb) += x->size[i];
            }
            dev_open(x->src[i]);
            dev_open(x->dst ? x->dst[i] : x->base);
        }
        count_copies(hc, hb, dc, db);
        /* A memcpy per buffer at the positions the device computes: the
         * kernel's lane-by-lane steps (devl_run_plan_cpu, which the CUDA
         * logic tests run) would make every emulated copy several times
         * slower than the memory allows. */
        for (size_t j = 0; j < x->n; j++) {
            unsigned char *d = x->dst ? x->dst[j] : x->base + devl_pos(&p, NULL, j);
            if (x->size[j])
                memcpy(d, x->src[j], x->size[j]);
            memset(d + x->size[j], 0, devl_pad(x->size[j], x->pad_align));
        }
        for (size_t i = 0; i < x->n; i++) {
            dev_close(x->dst ? x->dst[i] : x->base);
            dev_close(x->src[i]);
        }
        free(local);
    }
    if (dev_arrays) {
        if (x->dst)
            dev_close(x->dst);
        dev_close(x->size);
        dev_close(x->src);
    }
}

/* The Arrow helpers, on the CPU. Unsigned arithmetic: offsets are checked
 * by the caller, and a bad one must wrap, not be undefined behaviour. */
static void run_rebase(void *dst, const void *src, size_t count, unsigned width)
{
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
}

static void run_bits(void *dst, const void *src, uint64_t src_bit, uint64_t nbits)
{
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
}

static uint32_t run_check(const void *offsets, size_t count, unsigned width, uint64_t end)
{
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
    return v;
}

static void run(emu_op_t *op)
{
    switch (op->kind) {
    case OP_COPY:
        if (op->u.copy.dev_src)
            dev_open(op->u.copy.src);
        if (op->u.copy.dev_dst)
            dev_open(op->u.copy.dst);
        memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
        if (op->u.copy.dev_src)
            count_copies(!op->u.copy.dev_dst, op->u.copy.dev_dst ? 0 : op->u.copy.n, op->u.copy.dev_dst,
                         op->u.copy.dev_dst ? op->u.copy.n : 0);
        if (op->u.copy.dev_dst)
            dev_close(op->u.copy.dst);
        if (op->u.copy.dev_src)
            dev_close(op->u.copy.src);
        break;
    case OP_XFER: run_xfer(&op->u.xfer); break;
    case OP_REBASE:
        dev_open(op->u.rebase.src);
        dev_open(op->u.rebase.dst);
        run_rebase(op->u.rebase.dst, op->u.rebase.src, op->u.rebase.count, op->u.rebase.width);
        dev_close(op->u.rebase.dst);
        dev_close(op->u.rebase.src);
        break;
    case OP_BITS:
        dev_open(op->u.bits.src);
        dev_open(op->u.bits.dst);
        run_bits(op->u.bits.dst, op->u.bits.src, op->u.bits.src_bit, op->u.bits.nbits);
        dev_close(op->u.bits.dst);
        dev_close(op->u.bits.src);
        break;
    case OP_CHECK:
        dev_open(op->u.check.offsets);
        *op->u.check.verdict = run_check(op->u.check.offsets, op->u.check.count, op->u.check.width, op->u.check.end);
        dev_close(op->u.check.offsets);
        break;
    case OP_WAIT: break;
    case OP_FREE: host_free(op->u.free_ptr); break;
    }
}

/* ---- the backend table ------------------------------------------------------------------------- */

struct devl_bstate {
    int ordinal;
    devl_pincache_t pins;
};

static gser_status_t emu_open(int ordinal, devl_bstate_t **state)
{
    devl_bstate_t *s = malloc(sizeof *s);
    if (!s)
        return GSER_ERR_NO_MEMORY;
    s->ordinal = ordinal;
    devl_pincache_init(&s->pins, DEVL_PIN_BUDGET);
    pthread_once(&g_atfork_once, atfork_init);
    pthread_mutex_lock(&g.lock);
    g.refs++;
    pthread_mutex_unlock(&g.lock);
    *state = s;
    return GSER_OK;
}

static void release_pinned(void *p, size_t size)
{
    (void)size;
    host_free(p);
}

/* The last one out runs everything still queued, stops the worker and
 * forgets the streams (events recorded on them count as complete). */
static void emu_close(devl_bstate_t *s)
{
    pthread_mutex_lock(&g.lock);
    if (--g.refs == 0) {
        for (size_t i = 0; i < g.nstreams; i++)
            if (g.worker_on)
                wait_locked(g.streams[i], g.streams[i]->enqueued);
        if (g.worker_on) {
            g.stop = true;
            pthread_cond_signal(&g.work);
            pthread_mutex_unlock(&g.lock);
            pthread_join(g.worker, NULL);
            pthread_mutex_lock(&g.lock);
            g.worker_on = false;
        }
        for (size_t i = 0; i < g.nstreams; i++) {
            for (emu_op_t *op = g.streams[i]->head, *next; op; op = next) { /* only after a fork */
                next = op->next;
                free(op->owned);
                free(op);
            }
            free(g.streams[i]);
        }
        free(g.streams);
        g.streams = NULL;
        g.nstreams = g.cap = 0;
        g.epoch++;
    }
    pthread_mutex_unlock(&g.lock);
    devl_pincache_drain(&s->pins, release_pinned);
    free(s);
}

static gser_status_t emu_alloc(devl_bstate_t *s, size_t size, void *stream, void **ptr)
{
    (void)s;
    (void)stream; /* usable at once, which is at least as soon as stream order needs */
    return host_alloc(size, false, ptr);
}

static void emu_free(devl_bstate_t *s, void *ptr, size_t size, void *stream)
{
    (void)s;
    emu_op_t *op = op_new(OP_FREE);
    if (!op) {
        /* Out of memory: wait for the stream instead of ordering behind it. */
        pthread_mutex_lock(&g.lock);
        emu_stream_t *st = stream_get(stream);
        if (st && g.worker_on)
            wait_locked(st, st->enqueued);
        pthread_mutex_unlock(&g.lock);
        host_free(ptr);
        return;
    }
    op->u.free_ptr = ptr;
    pthread_mutex_lock(&g.lock);
    emu_stream_t *st = stream_get(stream);
    if (st)
        st->free_pending += size;
    pthread_mutex_unlock(&g.lock);
    enqueue(stream, op, NULL);
}

/* Pinned memory is host memory (never poisoned), recycled like CUDA's. */
static gser_status_t pinned_new(void *arg, size_t csize, void **ptr)
{
    (void)arg;
    return host_alloc(csize, true, ptr);
}

static void pinned_release(void *arg, void *ptr)
{
    (void)arg;
    host_free(ptr);
}

static gser_status_t emu_pinned_alloc(devl_bstate_t *s, size_t size, void **ptr)
{
    return devl_pincache_alloc(&s->pins, size, pinned_new, NULL, ptr);
}

static void emu_pinned_free(devl_bstate_t *s, void *ptr, size_t size)
{
    devl_pincache_free(&s->pins, ptr, size, pinned_release, NULL);
}

static gser_status_t emu_memcpy(devl_bstate_t *s, void *dst, const void *src, size_t n, devl_dir_t kind,
                                void *stream)
{
    (void)s;
    if (!n)
        return GSER_OK;
    emu_op_t *op = op_new(OP_COPY);
    if (!op)
        return GSER_ERR_NO_MEMORY;
    op->u.copy.dst = dst;
    op->u.copy.src = src;
    op->u.copy.n = n;
    op->u.copy.dev_src = kind == DEVL_D2H || kind == DEVL_D2D;
    op->u.copy.dev_dst = kind == DEVL_H2D || kind == DEVL_D2D;
    bool sync = kind == DEVL_H2H || (kind == DEVL_D2H && !is_pinned(dst, n));
    if (kind == DEVL_H2D && !is_pinned(src, n)) {
        /* Pageable source: staged now, as CUDA does, so the caller may reuse it. */
        if (!(op->owned = malloc(n))) {
            free(op);
            return GSER_ERR_NO_MEMORY;
        }
        memcpy(op->owned, src, n);
        op->u.copy.src = op->owned;
    }
    emu_stream_t *st;
    uint64_t seq;
    gser_status_t rc = enqueue(stream, op, &st);
    if (rc)
        return rc;
    if (sync) {
        pthread_mutex_lock(&g.lock);
        seq = st->enqueued; /* this copy or later: waiting for more is harmless */
        wait_locked(st, seq);
        pthread_mutex_unlock(&g.lock);
    }
    return GSER_OK;
}

static gser_status_t emu_stream_sync(devl_bstate_t *s, void *stream)
{
    (void)s;
    pthread_mutex_lock(&g.lock);
    emu_stream_t *st = stream_get(stream);
    if (st && st->enqueued > st->done)
        wait_locked(st, st->enqueued);
    pthread_mutex_unlock(&g.lock);
    return st ? GSER_OK : GSER_ERR_NO_MEMORY;
}

static gser_status_t emu_event_create(devl_bstate_t *s, void **event)
{
    (void)s;
    emu_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return GSER_ERR_NO_MEMORY;
    *event = e;
    return GSER_OK;
}

static gser_status_t emu_event_record(devl_bstate_t *s, void *event, void *stream)
{
    (void)s;
    emu_event_t *e = event;
    pthread_mutex_lock(&g.lock);
    emu_stream_t *st = stream_get(stream);
    if (st) {
        e->stream = st;
        e->seq = st->enqueued;
        e->epoch = g.epoch;
    }
    pthread_mutex_unlock(&g.lock);
    return st ? GSER_OK : GSER_ERR_NO_MEMORY;
}

/* The stream an event waits for, or NULL when it is complete. Lock held. */
static emu_stream_t *event_pending(const emu_event_t *e)
{
    if (!e->stream || e->epoch != g.epoch || e->stream->done >= e->seq)
        return NULL;
    return e->stream;
}

static gser_status_t emu_event_query(devl_bstate_t *s, void *event)
{
    (void)s;
    emu_event_t *e = event;
    pthread_mutex_lock(&g.lock);
    emu_stream_t *st = event_pending(e);
    if (st)
        release(st, e->seq); /* "not yet" now; done once the worker gets there */
    pthread_mutex_unlock(&g.lock);
    return st ? GSER_INPROGRESS : GSER_OK;
}

static gser_status_t emu_event_sync(devl_bstate_t *s, void *event)
{
    (void)s;
    emu_event_t *e = event;
    pthread_mutex_lock(&g.lock);
    emu_stream_t *st = event_pending(e);
    if (st)
        wait_locked(st, e->seq);
    pthread_mutex_unlock(&g.lock);
    return GSER_OK;
}

static gser_status_t emu_stream_wait_event(devl_bstate_t *s, void *stream, void *event)
{
    (void)s;
    emu_event_t *e = event;
    pthread_mutex_lock(&g.lock);
    emu_stream_t *target = event_pending(e);
    uint64_t seq = e->seq;
    pthread_mutex_unlock(&g.lock);
    if (!target)
        return GSER_OK;
    emu_op_t *op = op_new(OP_WAIT);
    if (!op)
        return GSER_ERR_NO_MEMORY;
    op->u.wait.target = target;
    op->u.wait.seq = seq;
    return enqueue(stream, op, NULL);
}

static void emu_event_destroy(devl_bstate_t *s, void *event)
{
    (void)s;
    free(event); /* waits on it were queued with their stream and point, not the event */
}

static gser_status_t emu_stream_create(devl_bstate_t *s, void **stream)
{
    (void)s;
    void *key = malloc(1); /* a unique handle; its stream is made on first use */
    if (!key)
        return GSER_ERR_NO_MEMORY;
    *stream = key;
    return GSER_OK;
}

static void emu_stream_destroy(devl_bstate_t *s, void *stream)
{
    /* Like cudaStreamDestroy: queued work still runs. The key is not reused
     * while its stream exists, so it is freed only after that work. */
    emu_stream_sync(s, stream);
    pthread_mutex_lock(&g.lock);
    for (size_t i = 0; i < g.nstreams; i++)
        if (g.streams[i]->key == stream)
            g.streams[i]->key = &g; /* matches no handle; kept for waits that still name it */
    pthread_mutex_unlock(&g.lock);
    free(stream);
}

/* Any host memory is a place copies may write here. */
static gser_status_t emu_host_register(devl_bstate_t *s, void *ptr, size_t size, bool *done)
{
    (void)s;
    (void)ptr;
    (void)size;
    *done = false;
    return GSER_OK;
}

static void emu_host_unregister(devl_bstate_t *s, void *ptr)
{
    (void)s;
    (void)ptr;
}

static gser_status_t emu_xfer(devl_bstate_t *s, const devl_xfer_t *x, void *stream)
{
    (void)s;
    if (x->n == 0 || x->total == 0)
        return GSER_OK;
    if (x->where == DEVL_ARRAYS_HOST && x->n > DEVL_FEW)
        return GSER_ERR_INVALID_ARG;
    emu_op_t *op = op_new(OP_XFER);
    if (!op)
        return GSER_ERR_NO_MEMORY;
    op->u.xfer = *x;
    if (x->where == DEVL_ARRAYS_HOST) {
        /* Kernel parameters: taken now. */
        size_t n = x->n, w = x->dst ? 3 : 2;
        unsigned char *a = malloc(n * w * 8);
        if (!a) {
            free(op);
            return GSER_ERR_NO_MEMORY;
        }
        memcpy(a, x->src, n * 8);
        memcpy(a + n * 8, x->size, n * 8);
        if (x->dst)
            memcpy(a + 2 * n * 8, x->dst, n * 8);
        op->owned = a;
        op->u.xfer.src = (const unsigned char *const *)a;
        op->u.xfer.size = (const uint64_t *)(a + n * 8);
        op->u.xfer.dst = x->dst ? (unsigned char *const *)(a + 2 * n * 8) : NULL;
    }
    return enqueue(stream, op, NULL);
}

static gser_status_t emu_rebase_offsets(devl_bstate_t *s, void *dst, const void *src, size_t count, unsigned width,
                                        void *stream)
{
    (void)s;
    emu_op_t *op = op_new(OP_REBASE);
    if (!op)
        return GSER_ERR_NO_MEMORY;
    op->u.rebase.dst = dst;
    op->u.rebase.src = src;
    op->u.rebase.count = count;
    op->u.rebase.width = width;
    return enqueue(stream, op, NULL);
}

static gser_status_t emu_copy_bits(devl_bstate_t *s, void *dst, const void *src, uint64_t src_bit, uint64_t nbits,
                                   void *stream)
{
    (void)s;
    emu_op_t *op = op_new(OP_BITS);
    if (!op)
        return GSER_ERR_NO_MEMORY;
    op->u.bits.dst = dst;
    op->u.bits.src = src;
    op->u.bits.src_bit = src_bit;
    op->u.bits.nbits = nbits;
    return enqueue(stream, op, NULL);
}

static gser_status_t emu_check_offsets(devl_bstate_t *s, const void *offsets, size_t count, unsigned width,
                                       uint64_t end, void *stream, uint32_t *verdict)
{
    (void)s;
    uint32_t v = 0;
    emu_op_t *op = op_new(OP_CHECK);
    if (!op)
        return GSER_ERR_NO_MEMORY;
    op->u.check.offsets = offsets;
    op->u.check.count = count;
    op->u.check.width = width;
    op->u.check.end = end;
    op->u.check.verdict = &v;
    emu_stream_t *st;
    gser_status_t rc = enqueue(stream, op, &st);
    if (rc)
        return rc;
    pthread_mutex_lock(&g.lock);
    wait_locked(st, st->enqueued); /* the answer comes back: the call waits, as on a GPU */
    pthread_mutex_unlock(&g.lock);
    *verdict = v;
    return GSER_OK;
}

static const char *emu_last_error(devl_bstate_t *s)
{
    (void)s;
    return "";
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
    .stream_sync = emu_stream_sync,
    .host_register = emu_host_register,
    .host_unregister = emu_host_unregister,
    .event_create = emu_event_create,
    .event_record = emu_event_record,
    .event_query = emu_event_query,
    .event_sync = emu_event_sync,
    .stream_wait_event = emu_stream_wait_event,
    .event_destroy = emu_event_destroy,
    .xfer = emu_xfer,
    .stream_create = emu_stream_create,
    .stream_destroy = emu_stream_destroy,
    .last_error = emu_last_error,
    .rebase_offsets = emu_rebase_offsets,
    .copy_bits = emu_copy_bits,
    .check_offsets = emu_check_offsets,
};
