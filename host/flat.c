/* The flattened form: one byte string holding the header and all frames.
 *
 *   0   8   magic 89 'G' 'S' 'E' 'R' 0d 0a 1a
 *   8   2   version (1), little-endian
 *   10  2   flags (0)
 *   12  4   n = number of frames, header included (>= 1)
 *   16  8n  frame sizes
 *   then each frame, starting 8-byte aligned, zero-padded to 8
 *
 * See docs/wire-format.md.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

#define FLAT_VERSION 1
#define FLAT_PREFIX 16

static const unsigned char flat_magic[8] = {0x89, 'G', 'S', 'E', 'R', 0x0d, 0x0a, 0x1a};
static const unsigned char zeros[8];

static size_t pad8(size_t n)
{
    return (8 - (n & 7)) & 7;
}

static gser_status_t flat_size(const gser_frame_t *frames, size_t nframes, bool open, size_t *size_out)
{
    if (!frames || nframes == 0 || nframes > UINT32_MAX || !size_out)
        return GSER_ERR_INVALID_ARG;
    if (nframes > (SIZE_MAX - FLAT_PREFIX) / 16)
        return GSER_ERR_INVALID_ARG;
    size_t total = FLAT_PREFIX + 8 * nframes;
    for (size_t i = 0; i < nframes; i++) {
        if (frames[i].memory != GSER_MEMORY_HOST)
            return GSER_ERR_UNSUPPORTED; /* device frames need a device backend's copy first */
        if (frames[i].size && !frames[i].data && !open)
            return GSER_ERR_INVALID_ARG;
        size_t sz = frames[i].size + pad8(frames[i].size);
        if (frames[i].size > SIZE_MAX - 8 || sz > SIZE_MAX - total)
            return GSER_ERR_INVALID_ARG;
        total += sz;
    }
    *size_out = total;
    return GSER_OK;
}

gser_status_t gser_flat_size(const gser_frame_t *frames, size_t nframes, size_t *size_out)
{
    return flat_size(frames, nframes, false, size_out);
}

gser_status_t gser__flat_size_open(const gser_frame_t *frames, size_t nframes, size_t *size_out)
{
    return flat_size(frames, nframes, true, size_out);
}

static void put_le(unsigned char *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;)
        v = (v << 8) | p[i];
    return v;
}

/* The prefix and size table: FLAT_PREFIX + 8 * nframes bytes. */
static void write_prefix(unsigned char *p, const gser_frame_t *frames, size_t nframes)
{
    memcpy(p, flat_magic, 8);
    put_le(p + 8, FLAT_VERSION, 2);
    put_le(p + 10, 0, 2);
    put_le(p + 12, nframes, 4);
    for (size_t i = 0; i < nframes; i++)
        put_le(p + FLAT_PREFIX + 8 * i, frames[i].size, 8);
}

static gser_status_t flat_write(const gser_frame_t *frames, size_t nframes, void *dst, size_t cap, bool open,
                                size_t *offsets, size_t *written)
{
    size_t total;
    gser_status_t st = flat_size(frames, nframes, open, &total);
    if (st)
        return st;
    if (!dst || !written || cap < total)
        return GSER_ERR_INVALID_ARG;
    unsigned char *p = dst;
    write_prefix(p, frames, nframes);
    size_t off = FLAT_PREFIX + 8 * nframes;
    for (size_t i = 0; i < nframes; i++) {
        if (offsets)
            offsets[i] = off;
        if (frames[i].size && frames[i].data)
            memcpy(p + off, frames[i].data, frames[i].size);
        off += frames[i].size;
        memset(p + off, 0, pad8(frames[i].size));
        off += pad8(frames[i].size);
    }
    *written = off;
    return GSER_OK;
}

gser_status_t gser_flat_write(const gser_frame_t *frames, size_t nframes, void *dst, size_t cap, size_t *written)
{
    return flat_write(frames, nframes, dst, cap, false, NULL, written);
}

gser_status_t gser__flat_write_open(const gser_frame_t *frames, size_t nframes, void *dst, size_t cap,
                                    size_t *offsets, size_t *written)
{
    return flat_write(frames, nframes, dst, cap, true, offsets, written);
}

/* The prefix and size table of a message being written: on the stack for
 * up to 16 frames, else on the heap. */
typedef struct flat_prefix {
    unsigned char stack[FLAT_PREFIX + 8 * 16];
    unsigned char *p;
    size_t len;
} flat_prefix_t;

/* Check the frames (gser_flat_size's statuses) and write their prefix into
 * pf; GSER_ERR_NO_MEMORY when it does not fit on the stack and malloc fails.
 * On GSER_OK, prefix_free releases it. */
static gser_status_t prefix_make(flat_prefix_t *pf, const gser_frame_t *frames, size_t nframes)
{
    size_t total;
    gser_status_t st = gser_flat_size(frames, nframes, &total);
    if (st)
        return st;
    pf->len = FLAT_PREFIX + 8 * nframes;
    pf->p = pf->len <= sizeof pf->stack ? pf->stack : malloc(pf->len);
    if (!pf->p)
        return GSER_ERR_NO_MEMORY;
    write_prefix(pf->p, frames, nframes);
    return GSER_OK;
}

static void prefix_free(flat_prefix_t *pf)
{
    if (pf->p != pf->stack)
        free(pf->p);
}

static gser_status_t flat_emit(const gser_frame_t *frames, size_t nframes, gser_flat_sink_fn put, void *sink)
{
    flat_prefix_t pf;
    gser_status_t st = prefix_make(&pf, frames, nframes);
    if (st)
        return st;
    st = put(sink, pf.p, pf.len);
    for (size_t i = 0; st == GSER_OK && i < nframes; i++) {
        if (frames[i].size)
            st = put(sink, frames[i].data, frames[i].size);
        if (st == GSER_OK && pad8(frames[i].size))
            st = put(sink, zeros, pad8(frames[i].size));
    }
    prefix_free(&pf);
    return st;
}

/* Write all of iov[0..n), retrying short writes (a writev moves at most
 * about 2 GiB, and a pipe or socket takes what fits). */
static gser_status_t writev_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return GSER_ERR_IO;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return GSER_OK;
}

/* Batches of iovecs: the frames go from their own memory to the kernel, a
 * few system calls for the whole message, never through a copy of it. */
#define FLAT_IOV 1024

gser_status_t gser_flat_write_fd(const gser_frame_t *frames, size_t nframes, int fd)
{
    if (fd < 0)
        return GSER_ERR_INVALID_ARG;
    flat_prefix_t pf;
    gser_status_t st = prefix_make(&pf, frames, nframes);
    if (st)
        return st;
    struct iovec *iov = malloc(FLAT_IOV * sizeof *iov);
    if (!iov) {
        prefix_free(&pf);
        return GSER_ERR_NO_MEMORY;
    }
    int n = 0;
    iov[n++] = (struct iovec){.iov_base = pf.p, .iov_len = pf.len};
    for (size_t i = 0; st == GSER_OK && i < nframes; i++) {
        if (n > FLAT_IOV - 2) {
            st = writev_all(fd, iov, n);
            n = 0;
        }
        if (frames[i].size)
            iov[n++] = (struct iovec){.iov_base = (void *)frames[i].data, .iov_len = frames[i].size};
        if (pad8(frames[i].size))
            iov[n++] = (struct iovec){.iov_base = (void *)zeros, .iov_len = pad8(frames[i].size)};
    }
    if (st == GSER_OK)
        st = writev_all(fd, iov, n);
    int saved = errno; /* what the write said, for the caller */
    prefix_free(&pf);
    free(iov);
    errno = saved;
    return st;
}

static gser_status_t file_put(void *sink, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, (FILE *)sink) == n ? GSER_OK : GSER_ERR_IO;
}

gser_status_t gser_flat_write_file(const gser_frame_t *frames, size_t nframes, FILE *f)
{
    if (!f)
        return GSER_ERR_INVALID_ARG;
    return flat_emit(frames, nframes, file_put, f);
}

gser_status_t gser_flat_write_sink(const gser_frame_t *frames, size_t nframes, gser_flat_sink_fn sink, void *arg)
{
    if (!sink)
        return GSER_ERR_INVALID_ARG;
    return flat_emit(frames, nframes, sink, arg);
}

/* How far the first len bytes of a flattened message check out, in the
 * order of wire-format.md section 9: an error as soon as what is there is
 * wrong, else GSER_OK and *need, the length the message has as far as it is
 * known (the prefix until it is read, then the prefix and the size table,
 * then the whole message). Nothing past *need is looked at, so a reader of a
 * stream reads exactly *need bytes before asking again. */
static gser_status_t flat_scan(gser_context_t *ctx, const char *what, const unsigned char *p, size_t len,
                               const gser_limits_t *lim, uint64_t *need)
{
    size_t m = len < 8 ? len : 8;
    if (m && memcmp(p, flat_magic, m) != 0) /* p may be NULL when len is 0 */
        return gser__error_set(ctx, GSER_ERR_BAD_MAGIC, "%s: not a flattened gser message (bad magic)", what);
    *need = FLAT_PREFIX;
    if (len < FLAT_PREFIX)
        return GSER_OK;
    uint64_t version = get_le(p + 8, 2), flags = get_le(p + 10, 2), n = get_le(p + 12, 4);
    if (version != FLAT_VERSION)
        return gser__error_set(ctx, GSER_ERR_WIRE_VERSION, "%s: flattened format version %llu, this build reads %d",
                               what, (unsigned long long)version, FLAT_VERSION);
    if (flags != 0)
        return gser__error_set(ctx, GSER_ERR_FORMAT, "%s: unknown flags 0x%llx at byte 10", what,
                               (unsigned long long)flags);
    if (n == 0)
        return gser__error_set(ctx, GSER_ERR_FORMAT, "%s: zero frames (the header is frame 0)", what);
    if (n - 1 > lim->max_frames)
        return gser__error_set(ctx, GSER_ERR_LIMIT_FRAMES, "%s: %llu data frames, the limit is %zu", what,
                               (unsigned long long)(n - 1), lim->max_frames);
    *need = FLAT_PREFIX + 8 * n;
    if (len < *need)
        return GSER_OK;
    uint64_t bytes = 0, total = *need;
    for (size_t i = 0; i < n; i++) {
        uint64_t sz = get_le(p + FLAT_PREFIX + 8 * i, 8);
        /* checked before any frame is read: the sizes as declared */
        if (sz > lim->max_bytes - bytes || sz > UINT64_MAX - 8 - total)
            return gser__error_set(ctx, GSER_ERR_LIMIT_BYTES,
                                   "%s: frame %zu declares %llu bytes, past the limit of %llu bytes for a message",
                                   what, i, (unsigned long long)sz, (unsigned long long)lim->max_bytes);
        bytes += sz;
        total += sz + pad8((size_t)sz);
    }
    *need = total;
    return GSER_OK;
}

/* Why the len bytes at p are not a whole message of need (> len) bytes. */
static gser_status_t flat_short(gser_context_t *ctx, const char *what, const unsigned char *p, size_t len,
                                uint64_t need)
{
    if (len == 0)
        return gser__error_set(ctx, GSER_ERR_BAD_MAGIC, "%s: empty input, not a flattened gser message", what);
    if (len < FLAT_PREFIX)
        return gser__error_set(ctx, GSER_ERR_TRUNCATED, "%s: %zu bytes end inside the %d-byte prefix", what, len,
                               FLAT_PREFIX);
    uint64_t n = get_le(p + 12, 4);
    if (len < FLAT_PREFIX + 8 * n)
        return gser__error_set(ctx, GSER_ERR_TRUNCATED, "%s: the size table of %llu frames does not fit in %zu bytes",
                               what, (unsigned long long)n, len);
    return gser__error_set(ctx, GSER_ERR_TRUNCATED, "%s: the input ends after %zu bytes, its size table says %llu",
                           what, len, (unsigned long long)need);
}

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* The whole units (unit: a power of two) of a compressed frame's bytes in
 * an input of gser's own (read from a file, or a private mapping of it) are
 * handed back: its values live in the frame's decompressed buffer, and the
 * message keeps the input alive for the frames it views, which would
 * otherwise hold the compressed bytes beside their decompressed copy for as
 * long. The pages read as zero (or the file again) if touched, which
 * nothing does. */
static void flat_drop_compressed(const gser_msg_t *msg, const gser_frame_t *frames, size_t n, uintptr_t unit)
{
    if (!msg->codecs)
        return;
    for (size_t i = 1; i < n; i++) {
        if (!msg->codecs[i - 1].codec)
            continue;
        uintptr_t lo = ((uintptr_t)frames[i].data + unit - 1) & ~(unit - 1);
        uintptr_t hi = ((uintptr_t)frames[i].data + frames[i].size) & ~(unit - 1);
        if (hi > lo)
            (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}

/* The unit a read buffer hands back in. It is heap or gser__bigbuf memory,
 * advised for huge pages and recycled: whole huge pages only, since a huge
 * page cut at a compressed frame's ends is refaulted 4 KiB at a time when
 * the memory is used again (the pandas spill bench: 0.99-1.05 s with whole
 * pages, 0.63-0.65 s with whole huge pages; BENCHMARKS.md). A private file
 * mapping is not recycled: it hands back whole pages. */
#define FLAT_DROP_READ ((uintptr_t)2 << 20)

/* gser_deserialize_flat; drop: 0, or the input is gser's own and nothing
 * else reads it, and the whole units of drop bytes (a power of two) of its
 * compressed frames are handed back (flat_drop_compressed). */
static gser_status_t flat_deserialize(gser_context_t *ctx, const void *buf, size_t len, gser_release_fn release,
                                      void *release_arg, const gser_deserialize_options_t *opts, uintptr_t drop,
                                      gser_msg_t **msg_out)
{
    static const char *what = "gser_deserialize_flat";
    if (!ctx || !msg_out || (!buf && len))
        return ctx ? gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL buffer or output", what)
                   : GSER_ERR_INVALID_ARG;
    const unsigned char *p = buf;
    gser_limits_t lim = GSER_LIMITS_INIT;
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    gser_status_t st = gser__dopts_read(ctx, what, opts, &o, &lim);
    if (st)
        return st;
    uint64_t need;
    if ((st = flat_scan(ctx, what, p, len, &lim, &need)))
        return st;
    if (need > len)
        return flat_short(ctx, what, p, len, need);
    if (need < len)
        return gser__error_set(ctx, GSER_ERR_FORMAT, "%s: %zu trailing bytes after the last frame (at byte %llu)", what,
                               len - (size_t)need, (unsigned long long)need);
    size_t n = (size_t)get_le(p + 12, 4);
    gser_frame_t *frames = malloc(n * sizeof *frames);
    if (!frames)
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "%s: out of memory", what);
    size_t off = FLAT_PREFIX + 8 * n;
    for (size_t i = 0; i < n; i++) {
        size_t sz = (size_t)get_le(p + FLAT_PREFIX + 8 * i, 8);
        frames[i] = (gser_frame_t){.data = p + off, .size = sz, .memory = GSER_MEMORY_HOST};
        off += sz + pad8(sz);
    }
    gser_msg_t *msg = NULL;
    st = gser_deserialize(ctx, frames, n, opts, &msg);
    if (st == GSER_OK && drop)
        flat_drop_compressed(msg, frames, n, drop);
    free(frames);
    if (st)
        return st;
    msg->flat_release = release;
    msg->flat_arg = release_arg;
    msg->flat_data = buf;
    *msg_out = msg;
    return GSER_OK;
}

gser_status_t gser_deserialize_flat(gser_context_t *ctx, const void *buf, size_t len,
                                    gser_release_fn release, void *release_arg,
                                    const gser_deserialize_options_t *opts, gser_msg_t **msg_out)
{
    return flat_deserialize(ctx, buf, len, release, release_arg, opts, 0, msg_out);
}

/* Public front of flat_scan, for readers of streams. */
gser_status_t gser_flat_get_need(gser_context_t *ctx, const void *buf, size_t len,
                                 const gser_deserialize_options_t *opts, uint64_t *need_out)
{
    static const char *what = "gser_flat_get_need";
    if (!ctx || !need_out || (!buf && len))
        return ctx ? gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: NULL buffer or output", what)
                   : GSER_ERR_INVALID_ARG;
    gser_limits_t lim = GSER_LIMITS_INIT;
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    gser_status_t st = gser__dopts_read(ctx, what, opts, &o, &lim);
    if (st)
        return st;
    uint64_t need = 8; /* the magic first, as gser_deserialize_fd reads it */
    if (len && (st = flat_scan(ctx, what, buf, len, &lim, &need)))
        return st;
    *need_out = need;
    return GSER_OK;
}

/* From this size up, a file's message is read into its final buffer at once
 * (gser__bigbuf memory: recycled, or huge pages where the kernel allows
 * them; a fresh multi-GiB buffer faulted 4 KiB at a time costs several
 * times the read itself). */
#define FLAT_ONCE_MIN ((size_t)1 << 20)

/* Release of a mapping: data may start inside its first page, arg is the
 * length from the page start. */
static void unmap_buf(void *data, void *arg)
{
    uintptr_t base = (uintptr_t)data & ~(uintptr_t)(page_size() - 1);
    munmap((void *)base, (size_t)(uintptr_t)arg);
}

static void free_buf(void *data, void *arg)
{
    (void)arg;
    free(data);
}

/* Map the avail bytes of a regular file from offset at and deserialize them
 * in place: nothing is read until a value is used. A private mapping: the
 * values are writable, the file never changes. 1 done (st set), 0 when the
 * file cannot be mapped (read it instead). */
static int deserialize_mapped(gser_context_t *ctx, int fd, off_t at, uint64_t avail,
                              const gser_deserialize_options_t *opts, gser_msg_t **msg_out, gser_status_t *st)
{
    static const unsigned char empty[1];
    if (avail == 0) {
        *st = gser_deserialize_flat(ctx, empty, 0, NULL, NULL, opts, msg_out);
        return 1;
    }
    size_t delta = (size_t)at & (page_size() - 1);
    if (avail > SIZE_MAX - delta)
        return 0;
    size_t maplen = (size_t)avail + delta;
    void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, at - (off_t)delta);
    if (map == MAP_FAILED)
        return 0;
    *st = flat_deserialize(ctx, (unsigned char *)map + delta, (size_t)avail, unmap_buf, (void *)(uintptr_t)maplen,
                           opts, page_size(), msg_out);
    if (*st)
        munmap(map, maplen);
    else
        (void)lseek(fd, at + (off_t)avail, SEEK_SET); /* past the message, as a read leaves it */
    return 1;
}

/* Read until *len reaches want or the input ends, growing *buf as bytes
 * arrive (never past want): memory follows what the input really sent. */
static gser_status_t read_upto(gser_context_t *ctx, const char *what, int fd, unsigned char **buf, size_t *cap,
                               size_t *len, size_t want)
{
    while (*len < want) {
        if (*len == *cap) {
            size_t grow = *cap < 65536 ? 65536 : *cap;
            size_t ncap = want - *cap < grow ? want : *cap + grow;
            unsigned char *nb = realloc(*buf, ncap);
            if (!nb)
                return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "%s: out of memory after %zu bytes", what, *len);
            *buf = nb;
            *cap = ncap;
        }
        ssize_t r = read(fd, *buf + *len, *cap - *len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return gser__error_set(ctx, GSER_ERR_IO, "%s: read failed after %zu bytes: %s", what, *len,
                                   strerror(errno));
        if (r == 0)
            break;
        *len += (size_t)r;
    }
    return GSER_OK;
}

gser_status_t gser_deserialize_fd(gser_context_t *ctx, int fd, const gser_deserialize_options_t *opts,
                                  gser_msg_t **msg_out)
{
    static const char *what = "gser_deserialize_fd";
    if (!ctx || fd < 0 || !msg_out)
        return ctx ? gser__error_set(ctx, GSER_ERR_INVALID_ARG, "%s: bad descriptor or NULL output", what)
                   : GSER_ERR_INVALID_ARG;
    gser_limits_t lim = GSER_LIMITS_INIT;
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    gser_status_t st = gser__dopts_read(ctx, what, opts, &o, &lim);
    if (st)
        return st;
    /* A regular file says how much it holds: a table that promises more is
     * refused before its frames are read or allocated for. */
    struct stat sb;
    off_t at = -1;
    uint64_t avail = UINT64_MAX;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (at = lseek(fd, 0, SEEK_CUR)) >= 0)
        avail = sb.st_size > at ? (uint64_t)(sb.st_size - at) : 0;
    if ((o.flags & GSER_DESERIALIZE_MMAP) && avail != UINT64_MAX &&
        deserialize_mapped(ctx, fd, at, avail, opts, msg_out, &st))
        return st;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0, maplen = 0; /* maplen: buf is gser__bigbuf memory of that length */
    uint64_t need = 8, seen = 0; /* the magic first */
    for (;;) {
        if (need > avail && len >= FLAT_PREFIX) {
            st = gser__error_set(ctx, GSER_ERR_TRUNCATED,
                                 "%s: the message needs %llu bytes, the file holds %llu from here", what,
                                 (unsigned long long)need, (unsigned long long)avail);
            break;
        }
        if (need > SIZE_MAX) {
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "%s: a message of %llu bytes cannot be held here", what,
                                 (unsigned long long)need);
            break;
        }
        /* A file that holds the whole message: its final buffer at once, and
         * the frames read straight into it. */
        if (avail != UINT64_MAX && need > cap && need >= FLAT_ONCE_MIN) {
            unsigned char *nb = gser__bigbuf_alloc((size_t)need);
            if (!nb) {
                st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "%s: out of memory for %llu bytes", what,
                                     (unsigned long long)need);
                break;
            }
            if (len)
                memcpy(nb, buf, len);
            if (maplen) /* a size table of a million frames came first */
                gser__bigbuf_free(buf, maplen);
            else
                free(buf);
            buf = nb;
            cap = maplen = (size_t)need;
        }
        if ((st = read_upto(ctx, what, fd, &buf, &cap, &len, (size_t)(need < avail ? need : avail))))
            break;
        seen = need;
        if (len == 0) { /* an empty file or stream: nothing to scan */
            st = flat_short(ctx, what, buf, 0, seen);
            break;
        }
        if ((st = flat_scan(ctx, what, buf, len, &lim, &need)))
            break;
        if (len < seen) {
            st = flat_short(ctx, what, buf, len, seen);
            break;
        }
        if (need == seen)
            break; /* the whole message, and not a byte more */
    }
    if (st == GSER_OK && avail != UINT64_MAX && avail > len)
        st = gser__error_set(ctx, GSER_ERR_FORMAT, "%s: %llu trailing bytes in the file after the message (%zu bytes)",
                             what, (unsigned long long)(avail - len), len);
    if (st == GSER_OK)
        st = maplen ? flat_deserialize(ctx, buf, len, gser__bigbuf_release, (void *)(uintptr_t)maplen, opts,
                                       FLAT_DROP_READ, msg_out)
                    : flat_deserialize(ctx, buf, len, free_buf, NULL, opts, FLAT_DROP_READ, msg_out);
    if (st) {
        if (maplen)
            gser__bigbuf_free(buf, maplen);
        else
            free(buf);
    }
    return st;
}
