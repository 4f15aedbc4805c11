/* Frame compression with liblz4 and libzstd.
 *
 * The writer compresses a host data frame only where a sample says it pays,
 * as Dask's maybe_compress does, so that incompressible data costs one
 * small sample per frame. The reader checks every declared size before it
 * allocates and accepts only data that fills exactly the declared size.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "internal.h"

/* lz4's block format: a byte of input makes at most 255 bytes of output
 * (a match token extended by 255-byte length steps). */
#define LZ4_MAX_RATIO 255u

static size_t codec_bound(int codec, size_t n)
{
    return codec == CODEC_LZ4 ? (size_t)LZ4_compressBound((int)n) : ZSTD_compressBound(n);
}

/* zstd's contexts, one of each per thread that uses them, kept for its
 * next frame: a one-shot call allocates its context's tables (hundreds of
 * KiB), faults them in and clears them for every frame, and a Dask
 * shuffle's frames are columns of about 100 KiB. In bench_links' 100 Mbit/s
 * shuffle a quarter of the workers' zstd time went to faulting in such
 * tables (BENCHMARKS.md, 2026-12-06). A thread's contexts go with it. */
typedef struct zstd_ctxs {
    ZSTD_CCtx *c;
    ZSTD_DCtx *d;
} zstd_ctxs_t;

static pthread_key_t zstd_key;
static pthread_once_t zstd_once = PTHREAD_ONCE_INIT;
static bool zstd_key_ok;

static void zstd_ctxs_free(void *arg)
{
    zstd_ctxs_t *z = arg;
    ZSTD_freeCCtx(z->c);
    ZSTD_freeDCtx(z->d);
    free(z);
}

static void zstd_key_init(void)
{
    zstd_key_ok = pthread_key_create(&zstd_key, zstd_ctxs_free) == 0;
}

/* This thread's contexts; NULL where they cannot be had (the caller then
 * makes a one-shot call). */
static zstd_ctxs_t *zstd_ctxs(void)
{
    pthread_once(&zstd_once, zstd_key_init);
    if (!zstd_key_ok)
        return NULL;
    zstd_ctxs_t *z = pthread_getspecific(zstd_key);
    if (!z && (z = calloc(1, sizeof *z)) && pthread_setspecific(zstd_key, z) != 0) {
        free(z);
        z = NULL;
    }
    return z;
}

static ZSTD_CCtx *zstd_cctx(void)
{
    zstd_ctxs_t *z = zstd_ctxs();
    if (z && !z->c)
        z->c = ZSTD_createCCtx();
    return z ? z->c : NULL;
}

static ZSTD_DCtx *zstd_dctx(void)
{
    zstd_ctxs_t *z = zstd_ctxs();
    if (z && !z->d)
        z->d = ZSTD_createDCtx();
    return z ? z->d : NULL;
}

/* Compress src[0..n) into dst (capacity cap): the compressed size, or 0 on failure. */
static size_t codec_compress(int codec, int level, const void *src, size_t n, void *dst, size_t cap)
{
    if (codec == CODEC_LZ4) {
        int r = LZ4_compress_fast(src, dst, (int)n, (int)cap, level > 1 ? level : 1);
        return r > 0 ? (size_t)r : 0;
    }
    ZSTD_CCtx *cc = zstd_cctx();
    level = level ? level : ZSTD_CLEVEL_DEFAULT;
    size_t r = cc ? ZSTD_compressCCtx(cc, dst, cap, src, n, level) : ZSTD_compress(dst, cap, src, n, level);
    return ZSTD_isError(r) ? 0 : r;
}

static bool pays(size_t out, size_t in, double threshold)
{
    return out > 0 && (double)out <= threshold * (double)in;
}

/* Frames the host family staged from the device are written by device work
 * that may still be running, and deferred ones (data NULL) are not written
 * yet: never read here. */
static bool staged(const gser_frames_t *f, const gser_frame_t *fr)
{
    const char *p = fr->data, *lo = f->pinned;
    return lo && p >= lo && p < lo + f->pinned_size;
}

enum { SAMPLE = GSER_COMPRESS_SAMPLE_SIZE * GSER_COMPRESS_NSAMPLES };

/* What one serialize compresses with, and its sample buffers. */
typedef struct squeeze {
    int codec, level;
    double threshold;
    char *sample, *sample_out;
} squeeze_t;

/* Whether src[0..n) is worth compressing whole: evenly spread samples
 * (Dask's are random) shrink to the threshold. Data no larger than the
 * sample is, and its own compression decides. Up to
 * GSER_COMPRESS_SAMPLE_WHOLE one piece from the middle is the sample: five
 * would cost up to as much again as the data (a shuffle's frames of
 * 15-125 KB at 100 Mbit/s: the samples were a fifth of zstd's time), and
 * none would compress a frame that does not shrink whole (random float64
 * of 150 KB with zstd took twice Dask's time; BENCHMARKS.md, 2026-12-06). */
static bool sample_pays(const squeeze_t *q, const char *src, size_t n)
{
    if (n <= SAMPLE)
        return true;
    if (n <= GSER_COMPRESS_SAMPLE_WHOLE) {
        size_t piece = GSER_COMPRESS_SAMPLE_SIZE;
        return pays(codec_compress(q->codec, q->level, src + (n - piece) / 2, piece, q->sample_out,
                                   codec_bound(q->codec, piece)),
                    piece, q->threshold);
    }
    size_t step = (n - GSER_COMPRESS_SAMPLE_SIZE) / (GSER_COMPRESS_NSAMPLES - 1);
    for (size_t k = 0; k < GSER_COMPRESS_NSAMPLES; k++)
        memcpy(q->sample + k * GSER_COMPRESS_SAMPLE_SIZE, src + k * step, GSER_COMPRESS_SAMPLE_SIZE);
    return pays(codec_compress(q->codec, q->level, q->sample, SAMPLE, q->sample_out, codec_bound(q->codec, SAMPLE)),
                SAMPLE, q->threshold);
}

/* ---- chunks (codecs 3 and 4) ----
 * u32 chunk size, then one u32 per chunk: its stored size, with
 * CHUNK_STORED set for a chunk stored as it is; then the chunks. All
 * little-endian. */

#define CHUNK_STORED 0x80000000u

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static size_t chunks_count(size_t raw, size_t chunk)
{
    return raw / chunk + (raw % chunk != 0);
}

static int chunks_base(int codec)
{
    return codec == CODEC_LZ4_CHUNKS ? CODEC_LZ4 : codec == CODEC_ZSTD_CHUNKS ? CODEC_ZSTD : codec;
}

/* src[0..n) in chunks into a new buffer (*out, capacity *cap, *size bytes
 * used), each chunk compressed where its sample and itself shrink to the
 * threshold; *out NULL when no chunk did or the whole did not shrink to
 * 0.9 (or the threshold, if higher). The samples come first: a frame that
 * cannot shrink that much costs no buffer and no copy. */
static gser_status_t chunks_compress(gser_context_t *ctx, const squeeze_t *q, size_t i, const char *src, size_t n,
                                     size_t chunk, void **out, size_t *cap, size_t *size)
{
    size_t nch = chunks_count(n, chunk), last = n - (nch - 1) * chunk;
    double keep = q->threshold > GSER_COMPRESS_THRESHOLD ? q->threshold : GSER_COMPRESS_THRESHOLD;
    *out = NULL;
    bool *tried = malloc(nch);
    if (!tried)
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory sampling frame %zu", i);
    size_t promising = 0;
    for (size_t k = 0; k < nch; k++) {
        size_t len = k + 1 < nch ? chunk : last;
        if ((tried[k] = sample_pays(q, src + k * chunk, len)))
            promising += len;
    }
    if ((double)promising < (1 - keep) * (double)n || !promising) {
        free(tried);
        return GSER_OK;
    }
    size_t head = 4 + 4 * nch;
    size_t c = head + (nch - 1) * codec_bound(q->codec, chunk) + codec_bound(q->codec, last);
    unsigned char *buf = gser__bigbuf_alloc(c);
    if (!buf) {
        free(tried);
        return gser__error_set(ctx, GSER_ERR_NO_MEMORY,
                               "gser_serialize: out of memory compressing frame %zu (%zu bytes) in chunks", i, n);
    }
    wr32(buf, (uint32_t)chunk);
    size_t at = head;
    bool any = false;
    for (size_t k = 0; k < nch; k++) {
        const char *p = src + k * chunk;
        size_t len = k + 1 < nch ? chunk : last;
        /* the room left is at least this chunk's bound (which fits lz4's int) */
        size_t z = tried[k] ? codec_compress(q->codec, q->level, p, len, buf + at, codec_bound(q->codec, len)) : 0;
        if (pays(z, len, q->threshold)) {
            wr32(buf + 4 + 4 * k, (uint32_t)z);
            any = true;
        } else {
            z = len; /* a bound is never less than its input */
            memcpy(buf + at, p, len);
            wr32(buf + 4 + 4 * k, (uint32_t)len | CHUNK_STORED);
        }
        at += z;
    }
    free(tried);
    /* each kept chunk paid at the threshold; the whole must save enough to
     * be worth the copy of the chunks stored as they are */
    if (!any || !pays(at, n, keep)) {
        gser__bigbuf_free(buf, c);
        return GSER_OK;
    }
    *out = buf;
    *cap = c;
    *size = at;
    return GSER_OK;
}

gser_status_t gser__frames_compress(gser_frames_t *f, const gser_serialize_options_t *o, bool *any)
{
    gser_context_t *ctx = f->ctx;
    int method = o->compression, level = o->compression_level;
    double threshold = o->compression_threshold;
    size_t chunk = o->compression_chunk_size;
    *any = false;
    if (method == GSER_COMPRESSION_NONE)
        return GSER_OK;
    if (method < 0 || method > GSER_COMPRESSION_AUTO)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: unknown compression %d", method);
    if (threshold == 0)
        threshold = GSER_COMPRESS_THRESHOLD;
    if (!(threshold > 0 && threshold <= 1)) /* NaN too */
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: compression_threshold %g is outside (0, 1]",
                               threshold);
    if (chunk && (chunk < GSER_COMPRESS_CHUNK_MIN || chunk > GSER_COMPRESS_CHUNK_MAX))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG,
                               "gser_serialize: compression_chunk_size %zu is outside %zu..%zu (or 0: whole frames)",
                               chunk, GSER_COMPRESS_CHUNK_MIN, GSER_COMPRESS_CHUNK_MAX);
    int codec = method == GSER_COMPRESSION_ZSTD ? CODEC_ZSTD : CODEC_LZ4;
    if (codec == CODEC_ZSTD && (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: zstd level %d is outside %d..%d", level,
                               ZSTD_minCLevel(), ZSTD_maxCLevel());
    if (codec == CODEC_LZ4 && level < 0)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: lz4 acceleration %d is negative", level);
    squeeze_t q = {.codec = codec, .level = level, .threshold = threshold};
    gser_status_t st = GSER_OK;
    for (size_t i = 1; i < f->n && st == GSER_OK; i++) {
        const gser_frame_t *fr = &f->frames[i];
        bool chunked = chunk && fr->size > chunk;
        if (fr->memory != GSER_MEMORY_HOST || fr->size < GSER_COMPRESS_MIN_SIZE || !fr->data || staged(f, fr) ||
            (o->compression_max_size && fr->size > o->compression_max_size) ||
            (codec == CODEC_LZ4 && !chunked && fr->size > LZ4_MAX_INPUT_SIZE))
            continue;
        if (!q.sample && (!(q.sample = malloc(SAMPLE)) || !(q.sample_out = malloc(codec_bound(codec, SAMPLE))))) {
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory for a compression sample");
            break;
        }
        void *out = NULL;
        size_t cap = 0, n = 0;
        if (chunked) {
            if ((st = chunks_compress(ctx, &q, i, fr->data, fr->size, chunk, &out, &cap, &n)) || !out)
                continue;
        } else {
            if (!sample_pays(&q, fr->data, fr->size))
                continue;
            cap = codec_bound(codec, fr->size);
            if (!(out = gser__bigbuf_alloc(cap))) {
                st = gser__error_set(ctx, GSER_ERR_NO_MEMORY,
                                     "gser_serialize: out of memory compressing frame %zu (%zu bytes)", i, fr->size);
                break;
            }
            n = codec_compress(codec, level, fr->data, fr->size, out, cap);
            if (!pays(n, fr->size, threshold)) {
                gser__bigbuf_free(out, cap);
                continue;
            }
        }
        out = gser__bigbuf_shrink(out, cap, n); /* compressed frames may be held long */
        if (!f->codecs && !(f->codecs = calloc(f->n, sizeof *f->codecs))) {
            gser__bigbuf_free(out, cap);
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory");
            break;
        }
        f->codecs[i] = (frame_codec_t){.codec = (uint8_t)(chunked ? codec + 2 : codec),
                                       .chunk = chunked ? (uint32_t)chunk : 0,
                                       .raw = fr->size,
                                       .buf = out,
                                       .cap = cap};
        f->frames[i].data = out;
        f->frames[i].size = n;
        *any = true;
    }
    free(q.sample);
    free(q.sample_out);
    return st;
}

void gser__frames_codecs_free(gser_frames_t *f)
{
    if (!f->codecs)
        return;
    for (size_t i = 0; i < f->n; i++)
        gser__bigbuf_free(f->codecs[i].buf, f->codecs[i].cap);
    free(f->codecs);
    f->codecs = NULL;
}

const char *gser__codec_name(int codec)
{
    static const char *const names[] = {"none", "lz4", "zstd", "lz4 chunks", "zstd chunks"};
    return codec >= 0 && codec <= CODEC_MAX ? names[codec] : "an unknown codec";
}

/* Where data went wrong, formatted only then: "frame 3" or "frame 3,
 * chunk 7" (k SIZE_MAX: a whole frame). */
typedef struct where {
    size_t i, k;
    char s[64];
} where_t;

static const char *where_str(where_t *w)
{
    if (w->k == SIZE_MAX)
        snprintf(w->s, sizeof w->s, "frame %zu", w->i);
    else
        snprintf(w->s, sizeof w->s, "frame %zu, chunk %zu", w->i, w->k);
    return w->s;
}

/* One lz4 block or zstd frame (codec 1 or 2) of size bytes declaring raw. */
static gser_status_t block_check(gser_context_t *ctx, const char *what, size_t i, size_t k, int codec,
                                 const void *src, size_t size, uint64_t raw)
{
    where_t at = {.i = i, .k = k};
    if (codec == CODEC_LZ4) {
        if (size > (size_t)LZ4_compressBound(LZ4_MAX_INPUT_SIZE) || raw > LZ4_MAX_INPUT_SIZE ||
            raw > (uint64_t)size * LZ4_MAX_RATIO)
            return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                                   "%s: %s declares %llu bytes from %zu bytes of lz4, more than lz4 can produce", what,
                                   where_str(&at), (unsigned long long)raw, size);
        return GSER_OK;
    }
    unsigned long long c = ZSTD_getFrameContentSize(src, size);
    if (c == ZSTD_CONTENTSIZE_ERROR)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED, "%s: %s is not zstd data (no valid zstd frame header)", what,
                               where_str(&at));
    if (c != ZSTD_CONTENTSIZE_UNKNOWN && c != raw)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                               "%s: %s declares %llu bytes uncompressed, its zstd data says %llu", what, where_str(&at),
                               (unsigned long long)raw, c);
    return GSER_OK;
}

static gser_status_t block_decompress(gser_context_t *ctx, const char *what, size_t i, size_t k, int codec,
                                      const void *src, size_t size, void *dst, size_t raw)
{
    where_t at = {.i = i, .k = k};
    size_t got;
    if (codec == CODEC_LZ4) {
        /* both fit in int: block_check came first */
        int r = LZ4_decompress_safe(src, dst, (int)size, (int)raw);
        if (r < 0)
            return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                                   "%s: %s: lz4 data is corrupt or larger than the declared %zu bytes", what,
                                   where_str(&at), raw);
        got = (size_t)r;
    } else {
        ZSTD_DCtx *dc = zstd_dctx();
        got = dc ? ZSTD_decompressDCtx(dc, dst, raw, src, size) : ZSTD_decompress(dst, raw, src, size);
        if (ZSTD_isError(got))
            return gser__error_set(
                ctx, GSER_ERR_COMPRESSED, "%s: %s: zstd data %s (declared %zu bytes): %s", what, where_str(&at),
                ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall ? "is larger than declared" : "is corrupt", raw,
                ZSTD_getErrorName(got));
    }
    if (got != raw)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                               "%s: %s: %s data decompresses to %zu bytes, the header says %zu", what, where_str(&at),
                               gser__codec_name(codec), got, raw);
    return GSER_OK;
}

/* The chunk table of a codec-3/4 frame, checked: every chunk's stored size
 * inside the data, stored chunks exactly their size, compressed ones able
 * to make it, and nothing left over. */
static gser_status_t chunks_check(gser_context_t *ctx, const char *what, size_t i, frame_codec_t *c,
                                  const unsigned char *src, size_t size)
{
    const char *name = gser__codec_name(c->codec);
    if (size < 4)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED, "%s: frame %zu: %zu bytes of %s hold no chunk size", what,
                               i, size, name);
    size_t chunk = rd32(src);
    if (chunk < GSER_COMPRESS_CHUNK_MIN || chunk > GSER_COMPRESS_CHUNK_MAX)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED, "%s: frame %zu: %s of %zu bytes each, outside %zu..%zu",
                               what, i, name, chunk, GSER_COMPRESS_CHUNK_MIN, GSER_COMPRESS_CHUNK_MAX);
    size_t nch = chunks_count(c->raw, chunk);
    if (nch > (size - 4) / 4)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                               "%s: frame %zu: %zu bytes in %s of %zu need a table of %zu chunks, more than its %zu "
                               "bytes hold",
                               what, i, c->raw, name, chunk, nch, size);
    size_t at = 4 + 4 * nch, squeezed = 0;
    for (size_t k = 0; k < nch; k++) {
        uint32_t e = rd32(src + 4 + 4 * k);
        size_t len = k + 1 < nch ? chunk : c->raw - k * chunk, n = e & ~CHUNK_STORED;
        if (n > size - at)
            return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                                   "%s: frame %zu, chunk %zu: %zu bytes at byte %zu run past the frame's %zu", what, i,
                                   k, n, at, size);
        gser_status_t st;
        if (e & CHUNK_STORED) {
            if (n != len)
                return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                                       "%s: frame %zu, chunk %zu is stored as %zu bytes, its size is %zu", what, i, k,
                                       n, len);
        } else if ((st = block_check(ctx, what, i, k, chunks_base(c->codec), src + at, n, len))) {
            return st;
        } else {
            squeezed++;
        }
        at += n;
    }
    if (at != size)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED, "%s: frame %zu: its chunks end at byte %zu of %zu", what, i,
                               at, size);
    c->chunk = (uint32_t)chunk;
    c->nchunks = (uint32_t)nch; /* <= size / 4 */
    c->nsqueezed = (uint32_t)squeezed;
    return GSER_OK;
}

gser_status_t gser__codec_check_size(gser_context_t *ctx, const char *what, size_t i, frame_codec_t *c,
                                     const void *src, size_t size)
{
    if (c->codec == CODEC_LZ4_CHUNKS || c->codec == CODEC_ZSTD_CHUNKS)
        return chunks_check(ctx, what, i, c, src, size);
    return block_check(ctx, what, i, SIZE_MAX, c->codec, src, size, c->raw);
}

gser_status_t gser__codec_decompress(gser_context_t *ctx, const char *what, size_t i, const frame_codec_t *c,
                                     const void *src, size_t size, void *dst)
{
    if (c->codec != CODEC_LZ4_CHUNKS && c->codec != CODEC_ZSTD_CHUNKS)
        return block_decompress(ctx, what, i, SIZE_MAX, c->codec, src, size, dst, c->raw);
    const unsigned char *p = src;
    size_t at = 4 + 4 * (size_t)c->nchunks;
    for (size_t k = 0; k < c->nchunks; k++) {
        uint32_t e = rd32(p + 4 + 4 * k);
        size_t len = k + 1 < c->nchunks ? c->chunk : c->raw - k * c->chunk, n = e & ~CHUNK_STORED;
        char *out = (char *)dst + k * c->chunk;
        gser_status_t st;
        if (e & CHUNK_STORED)
            memcpy(out, p + at, n);
        else if ((st = block_decompress(ctx, what, i, k, chunks_base(c->codec), p + at, n, out, len)))
            return st;
        at += n;
    }
    return GSER_OK;
}

/* Below this, posix_memalign: a mapping costs two system calls. */

gser_status_t gser_msg_get_frame_codec(const gser_msg_t *msg, size_t i, int *codec, size_t *wire_size)
{
    if (!msg || !codec || !wire_size)
        return GSER_ERR_INVALID_ARG;
    if (i >= msg->nframes)
        return GSER_ERR_OUT_OF_RANGE;
    const frame_codec_t *c = i > 0 && msg->codecs && msg->codecs[i - 1].codec ? &msg->codecs[i - 1] : NULL;
    *codec = c ? chunks_base(c->codec) : GSER_COMPRESSION_NONE; /* wire codecs 1, 2 are LZ4, ZSTD */
    *wire_size = c ? c->size : msg->frames[i].size;
    return GSER_OK;
}

gser_status_t gser_msg_get_frame_chunks(const gser_msg_t *msg, size_t i, size_t *chunk_size, size_t *nchunks,
                                        size_t *ncompressed)
{
    if (!msg || !chunk_size || !nchunks || !ncompressed)
        return GSER_ERR_INVALID_ARG;
    if (i >= msg->nframes)
        return GSER_ERR_OUT_OF_RANGE;
    const frame_codec_t *c = i > 0 && msg->codecs ? &msg->codecs[i - 1] : NULL;
    bool chunked = c && (c->codec == CODEC_LZ4_CHUNKS || c->codec == CODEC_ZSTD_CHUNKS);
    *chunk_size = chunked ? c->chunk : 0;
    *nchunks = chunked ? c->nchunks : 0;
    *ncompressed = chunked ? c->nsqueezed : 0;
    return GSER_OK;
}
