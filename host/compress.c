/* Frame compression with liblz4 and libzstd.
 *
 * The writer compresses a host data frame only where a sample says it pays,
 * as Dask's maybe_compress does, so that incompressible data costs one
 * small sample per frame. The reader checks every declared size before it
 * allocates and accepts only data that fills exactly the declared size.
 */
#include <limits.h>
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

/* Compress src[0..n) into dst (capacity cap): the compressed size, or 0 on failure. */
static size_t codec_compress(int codec, int level, const void *src, size_t n, void *dst, size_t cap)
{
    if (codec == CODEC_LZ4) {
        int r = LZ4_compress_fast(src, dst, (int)n, (int)cap, level > 1 ? level : 1);
        return r > 0 ? (size_t)r : 0;
    }
    size_t r = ZSTD_compress(dst, cap, src, n, level ? level : ZSTD_CLEVEL_DEFAULT);
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

gser_status_t gser__frames_compress(gser_frames_t *f, int method, int level, double threshold, bool *any)
{
    gser_context_t *ctx = f->ctx;
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
    int codec = method == GSER_COMPRESSION_ZSTD ? CODEC_ZSTD : CODEC_LZ4;
    if (codec == CODEC_ZSTD && (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()))
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: zstd level %d is outside %d..%d", level,
                               ZSTD_minCLevel(), ZSTD_maxCLevel());
    if (codec == CODEC_LZ4 && level < 0)
        return gser__error_set(ctx, GSER_ERR_INVALID_ARG, "gser_serialize: lz4 acceleration %d is negative", level);
    enum { SAMPLE = GSER_COMPRESS_SAMPLE_SIZE * GSER_COMPRESS_NSAMPLES };
    char *sample = NULL, *sample_out = NULL;
    gser_status_t st = GSER_OK;
    for (size_t i = 1; i < f->n && st == GSER_OK; i++) {
        const gser_frame_t *fr = &f->frames[i];
        if (fr->memory != GSER_MEMORY_HOST || fr->size < GSER_COMPRESS_MIN_SIZE || !fr->data || staged(f, fr) ||
            (codec == CODEC_LZ4 && fr->size > LZ4_MAX_INPUT_SIZE))
            continue;
        if (!sample && (!(sample = malloc(SAMPLE)) || !(sample_out = malloc(codec_bound(codec, SAMPLE))))) {
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory for a compression sample");
            break;
        }
        /* evenly spread samples (Dask's are random), the whole frame when it is small */
        const char *src = fr->data;
        size_t sn = fr->size;
        if (fr->size > SAMPLE) {
            size_t step = (fr->size - GSER_COMPRESS_SAMPLE_SIZE) / (GSER_COMPRESS_NSAMPLES - 1);
            for (size_t k = 0; k < GSER_COMPRESS_NSAMPLES; k++)
                memcpy(sample + k * GSER_COMPRESS_SAMPLE_SIZE, src + k * step, GSER_COMPRESS_SAMPLE_SIZE);
            src = sample;
            sn = SAMPLE;
        }
        if (sn < fr->size &&
            !pays(codec_compress(codec, level, src, sn, sample_out, codec_bound(codec, sn)), sn, threshold))
            continue;
        size_t cap = codec_bound(codec, fr->size);
        void *out = gser__bigbuf_alloc(cap);
        if (!out) {
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY,
                                 "gser_serialize: out of memory compressing frame %zu (%zu bytes)", i, fr->size);
            break;
        }
        size_t n = codec_compress(codec, level, fr->data, fr->size, out, cap);
        if (!pays(n, fr->size, threshold)) {
            gser__bigbuf_free(out, cap);
            continue;
        }
        out = gser__bigbuf_shrink(out, cap, n); /* compressed frames may be held long */
        if (!f->codecs && !(f->codecs = calloc(f->n, sizeof *f->codecs))) {
            gser__bigbuf_free(out, cap);
            st = gser__error_set(ctx, GSER_ERR_NO_MEMORY, "gser_serialize: out of memory");
            break;
        }
        f->codecs[i] = (frame_codec_t){.codec = (uint8_t)codec, .raw = fr->size, .buf = out, .cap = cap};
        f->frames[i].data = out;
        f->frames[i].size = n;
        *any = true;
    }
    free(sample);
    free(sample_out);
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

static const char *codec_name(int codec)
{
    return codec == CODEC_LZ4 ? "lz4" : "zstd";
}

gser_status_t gser__codec_check_size(gser_context_t *ctx, const char *what, size_t i, int codec, const void *src,
                                     size_t size, uint64_t raw)
{
    if (codec == CODEC_LZ4) {
        if (size > (size_t)LZ4_compressBound(LZ4_MAX_INPUT_SIZE) || raw > LZ4_MAX_INPUT_SIZE ||
            raw > (uint64_t)size * LZ4_MAX_RATIO)
            return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                                   "%s: frame %zu declares %llu bytes from %zu bytes of lz4, more than lz4 can produce",
                                   what, i, (unsigned long long)raw, size);
        return GSER_OK;
    }
    unsigned long long c = ZSTD_getFrameContentSize(src, size);
    if (c == ZSTD_CONTENTSIZE_ERROR)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED, "%s: frame %zu is not zstd data (no valid zstd frame header)",
                               what, i);
    if (c != ZSTD_CONTENTSIZE_UNKNOWN && c != raw)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                               "%s: frame %zu declares %llu bytes uncompressed, its zstd data says %llu", what, i,
                               (unsigned long long)raw, c);
    return GSER_OK;
}

gser_status_t gser__codec_decompress(gser_context_t *ctx, const char *what, size_t i, int codec, const void *src,
                                     size_t size, void *dst, size_t raw)
{
    size_t got;
    if (codec == CODEC_LZ4) {
        /* both fit in int: gser__codec_check_size came first */
        int r = LZ4_decompress_safe(src, dst, (int)size, (int)raw);
        if (r < 0)
            return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                                   "%s: frame %zu: lz4 data is corrupt or larger than the declared %zu bytes", what, i,
                                   raw);
        got = (size_t)r;
    } else {
        got = ZSTD_decompress(dst, raw, src, size);
        if (ZSTD_isError(got))
            return gser__error_set(
                ctx, GSER_ERR_COMPRESSED, "%s: frame %zu: zstd data %s (declared %zu bytes): %s", what, i,
                ZSTD_getErrorCode(got) == ZSTD_error_dstSize_tooSmall ? "is larger than declared" : "is corrupt", raw,
                ZSTD_getErrorName(got));
    }
    if (got != raw)
        return gser__error_set(ctx, GSER_ERR_COMPRESSED,
                               "%s: frame %zu: %s data decompresses to %zu bytes, the header says %zu", what, i,
                               codec_name(codec), got, raw);
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
    *codec = c ? c->codec : GSER_COMPRESSION_NONE;
    *wire_size = c ? c->size : msg->frames[i].size;
    return GSER_OK;
}
