/* Link-aware compression (docs/ucx.md 4.5): an endpoint times its large
 * sends to learn the rate its link gives, times each codec on a sample of
 * what it sends, and per message picks what moves it fastest: raw, or
 * compressed with lz4 or zstd, whole or in chunks pipelined with the wire. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lz4.h>
#include <zstd.h>

#include "internal.h"

/* A codec is chosen only when the model says it saves this much of the raw
 * time: within it, raw costs no CPU on either side. */
#define GUX_LINK_MARGIN 0.03
/* A codec's time on a sample (a few cached kilobytes, on a quiet core)
 * times this is its time on a message's data (BENCHMARKS.md, 2026-12-05:
 * lz4 sampled at 1.2-1.5 GB/s moved 64 MiB messages at 0.5 GB/s). */
#define GUX_LINK_CPU_FACTOR 1.5
/* A send-rate measurement closes after this much busy time (or when no
 * timed send is left in flight) with at least GUX_LINK_WIN_BYTES. */
#define GUX_LINK_WIN_MS 20.0
#define GUX_LINK_WIN_BYTES ((double)(1u << 20))
/* Weight of a new rate measurement: a link that gets busy shows within a
 * few windows. */
#define GUX_LINK_RATE_ALPHA 0.3
/* Weight of a new codec speed (small samples time noisily); the ratio is
 * the last sample's (the data is what changes it). */
#define GUX_LINK_SPEED_ALPHA 0.5
/* Codecs are timed again on a message after this long. */
#define GUX_LINK_SAMPLE_MS 100.0
/* While compressing, one message goes raw to measure the raw rate again:
 * after GUX_LINK_PROBE_EVERY compressed ones, and after at least
 * GUX_LINK_PROBE_MS or GUX_LINK_PROBE_COST times what the model says the
 * probe costs over the codec (so that probes cost at most about 2 %). */
#define GUX_LINK_PROBE_EVERY 4u
#define GUX_LINK_PROBE_MS 1000.0
#define GUX_LINK_PROBE_COST 50.0
/* What a worker remembers of a peer host stays good this long. */
#define GUX_LINK_HOST_MS 60000.0

enum { SAMPLE_PIECE = GSER_COMPRESS_SAMPLE_SIZE, SAMPLE_PIECES = GSER_COMPRESS_NSAMPLES };

/* (no libm: the static library's consumers do not link it) */
static double dmax(double a, double b)
{
    return a > b ? a : b;
}

static int codec_index(int codec)
{
    return codec == GSER_COMPRESSION_LZ4 ? 0 : codec == GSER_COMPRESSION_ZSTD ? 1 : -1;
}

double gux_link_time(const gux_link_model_t *m, int codec, size_t bytes, size_t chunk)
{
    if (!(m->rate > 0))
        return -1;
    double b = (double)bytes;
    if (codec == GSER_COMPRESSION_NONE)
        return b / m->rate;
    int i = codec_index(codec);
    if (i < 0 || !m->codec[i].known)
        return -1;
    double c = GUX_LINK_CPU_FACTOR * m->codec[i].ctime, d = GUX_LINK_CPU_FACTOR * m->codec[i].dtime;
    double w = m->codec[i].ratio / m->rate;
    if (!chunk || bytes <= chunk)
        return b * (c + w + d); /* compressed, sent, decompressed in turn */
    /* n chunks: compressing (here), the wire and decompressing (there)
     * overlap, and the slowest sets the pace; the first chunk's
     * compression and the last one's decompression fill and drain the
     * pipe. */
    double n = (double)(bytes / chunk + (bytes % chunk != 0)), k = b / n;
    double tc = k * c, tw = k * w, td = k * d;
    return (n - 1) * dmax(dmax(tc, td), tw) + tc + tw + td;
}

int gux_link_choose(const gux_link_model_t *m, size_t bytes, size_t chunk, uint32_t allowed, double *times)
{
    static const int codecs[2] = {GSER_COMPRESSION_LZ4, GSER_COMPRESSION_ZSTD};
    static const uint32_t bits[2] = {GSER_UCX_CAP_LZ4, GSER_UCX_CAP_ZSTD};
    double t[3] = {gux_link_time(m, GSER_COMPRESSION_NONE, bytes, chunk), 0, 0};
    for (int i = 0; i < 2; i++)
        t[i + 1] = (allowed & bits[i]) ? gux_link_time(m, codecs[i], bytes, chunk) : 0;
    if (times)
        memcpy(times, t, sizeof t);
    if (t[0] < 0) /* the link is not measured yet: raw, which measures it */
        return GSER_COMPRESSION_NONE;
    int best = GSER_COMPRESSION_NONE;
    double best_t = t[0] * (1 - GUX_LINK_MARGIN);
    for (int i = 0; i < 2; i++)
        if (t[i + 1] > 0 && t[i + 1] < best_t) {
            best = codecs[i];
            best_t = t[i + 1];
        }
    return best;
}

void gux_link_add_rate(gux_link_t *l, double rate, bool raw)
{
    if (!(rate > 0) || !isfinite(rate))
        return;
    l->rate_samples++;
    if (!raw) {
        /* A compressed send's wire may have waited on either end's CPU, and
         * its smaller sends complete as the socket's buffers take them
         * (measured: 0.24-3.9 GB/s over links of 0.12-1.6): kept for the
         * stats, never the link's rate. */
        l->zrate = l->zrate > 0 ? (1 - GUX_LINK_RATE_ALPHA) * l->zrate + GUX_LINK_RATE_ALPHA * rate : rate;
        return;
    }
    l->m.rate = l->m.rate > 0 ? (1 - GUX_LINK_RATE_ALPHA) * l->m.rate + GUX_LINK_RATE_ALPHA * rate : rate;
}

void gux_link_add_codec(gux_link_t *l, int codec, double ratio, double ctime, double dtime)
{
    int i = codec_index(codec);
    if (i < 0 || !(ratio > 0) || !(ctime > 0) || !(dtime > 0))
        return;
    if (ratio > 1)
        ratio = 1; /* frames that do not shrink are sent as they are */
    if (l->m.codec[i].known) {
        ctime = (1 - GUX_LINK_SPEED_ALPHA) * l->m.codec[i].ctime + GUX_LINK_SPEED_ALPHA * ctime;
        dtime = (1 - GUX_LINK_SPEED_ALPHA) * l->m.codec[i].dtime + GUX_LINK_SPEED_ALPHA * dtime;
    }
    l->m.codec[i].known = true;
    l->m.codec[i].ratio = ratio;
    l->m.codec[i].ctime = ctime;
    l->m.codec[i].dtime = dtime;
}

void gux_link_posted(gux_link_t *l, double now_ms, bool raw)
{
    if (l->inflight++ == 0)
        l->busy_since = now_ms;
    l->win_kind |= raw ? 1 : 2;
}

void gux_link_done(gux_link_t *l, size_t len, double now_ms)
{
    if (l->inflight)
        l->inflight--;
    l->win_bytes += (double)len;
    double busy = now_ms - l->busy_since;
    if (l->inflight && busy < GUX_LINK_WIN_MS)
        return;
    /* busy time so far counts; time with nothing in flight (the sender
     * compressing or idle) does not */
    l->win_ms += busy > 0 ? busy : 0;
    l->busy_since = now_ms;
    if (l->win_bytes >= GUX_LINK_WIN_BYTES && l->win_ms > 0) {
        if (l->win_kind == 1 || l->win_kind == 2) /* raw and compressed mixed: neither's rate */
            gux_link_add_rate(l, l->win_bytes / (l->win_ms / 1e3), l->win_kind == 1);
        l->win_bytes = 0;
        l->win_ms = 0;
        l->win_kind = l->inflight ? l->win_kind : 0;
    }
}

/* Share what ep learnt with the worker's next endpoints to the same host
 * (put), or start from what an earlier one learnt (get). */
static void link_host(gser_ucx_ep_t *ep, bool put, double now)
{
    gser_ucx_worker_t *w = ep->worker;
    const char *host = ep->peer.peer_host;
    if (!host[0])
        return;
    gux_link_host_t *slot = NULL, *oldest = &w->link_hosts[0];
    for (int i = 0; i < GUX_LINK_HOSTS; i++) {
        gux_link_host_t *h = &w->link_hosts[i];
        if (h->at > 0 && strcmp(h->host, host) == 0)
            slot = h;
        if (h->at < oldest->at)
            oldest = h;
    }
    if (!put) {
        if (slot && now - slot->at < GUX_LINK_HOST_MS)
            ep->link.m = slot->m;
        return;
    }
    if (!(ep->link.m.rate > 0))
        return;
    if (!slot) {
        slot = oldest;
        snprintf(slot->host, sizeof slot->host, "%s", host);
    }
    slot->m = ep->link.m;
    slot->at = now;
}

bool gux_ep_link_aware(const gser_ucx_ep_t *ep)
{
    const gser_ucx_worker_t *w = ep->worker;
    if (!ep->peer_known || ep->peer.gser_wire_version < 3 || !(w->announce_codecs & ep->peer.caps & GUX_CODECS))
        return false;
    int mode = ep->compression_set ? ep->compression : w->compression;
    if (mode == GSER_UCX_COMPRESSION_DEFAULT)
        return !gux_host_is_local(ep->peer.peer_host, ep->peer.local_host);
    return mode == GSER_UCX_COMPRESSION_AUTO;
}

/* ---- sampling ---------------------------------------------------------------------------- */

/* The host frames a codec may compress: as gser_serialize picks them. */
static bool candidate(const gser_frame_t *f)
{
    return f->memory == GSER_MEMORY_HOST && f->data && f->size >= GSER_COMPRESS_MIN_SIZE;
}

/* SAMPLE_PIECES pieces spread evenly over the candidates' bytes (total),
 * as if they were one buffer, into out. */
static void sample_gather(const gser_frame_t *frames, size_t nframes, size_t total, char *out)
{
    size_t step = (total - SAMPLE_PIECE) / (SAMPLE_PIECES - 1);
    size_t i = 0, base = 0; /* frame i starts at byte base of the whole */
    for (size_t k = 0; k < SAMPLE_PIECES; k++) {
        size_t at = k * step, want = SAMPLE_PIECE;
        char *dst = out + k * SAMPLE_PIECE;
        while (want) {
            while (i < nframes && (!candidate(&frames[i]) || at >= base + frames[i].size)) {
                if (candidate(&frames[i]))
                    base += frames[i].size;
                i++;
            }
            if (i == nframes)
                return; /* not reached: at + want <= total */
            size_t off = at - base, n = frames[i].size - off;
            if (n > want)
                n = want;
            memcpy(dst, (const char *)frames[i].data + off, n);
            dst += n;
            at += n;
            want -= n;
        }
    }
}

typedef struct {
    bool ok;
    double ratio, ctime, dtime;
} codec_sample_t;

/* Time codec (index 0 lz4, 1 zstd at level) on the sample: compress, then
 * decompress what it made. */
static codec_sample_t sample_time(int i, int level, const char *src, size_t n, char *z, size_t zcap, char *back)
{
    codec_sample_t s = {0};
    double t0, t1, t2;
    size_t zn;
    if (i == 0) {
        t0 = gux_now_ms();
        int r = LZ4_compress_default(src, z, (int)n, (int)zcap);
        t1 = gux_now_ms();
        if (r <= 0 || LZ4_decompress_safe(z, back, r, (int)n) != (int)n)
            return s;
        t2 = gux_now_ms();
        zn = (size_t)r;
    } else {
        ZSTD_CCtx *cc = ZSTD_createCCtx();
        ZSTD_DCtx *dc = ZSTD_createDCtx();
        if (!cc || !dc) {
            ZSTD_freeCCtx(cc);
            ZSTD_freeDCtx(dc);
            return s;
        }
        t0 = gux_now_ms();
        size_t r = ZSTD_compressCCtx(cc, z, zcap, src, n, level ? level : ZSTD_CLEVEL_DEFAULT);
        t1 = gux_now_ms();
        bool good = !ZSTD_isError(r) && ZSTD_decompressDCtx(dc, back, n, z, r) == n;
        t2 = gux_now_ms();
        ZSTD_freeCCtx(cc);
        ZSTD_freeDCtx(dc);
        if (!good)
            return s;
        zn = r;
    }
    /* the clock's resolution is far below a sample's time; keep it positive */
    s.ctime = dmax(t1 - t0, 1e-6) / 1e3 / (double)n;
    s.dtime = dmax(t2 - t1, 1e-6) / 1e3 / (double)n;
    s.ratio = (double)zn / (double)n;
    s.ok = true;
    return s;
}

gser_status_t gser_ucx_ep_choose_compression(gser_ucx_ep_t *ep, const gser_frame_t *frames, size_t nframes,
                                             bool pipelined, int zstd_level, int *codec_out)
{
    if (!ep || !codec_out || (nframes && !frames))
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_choose_compression: bad argument");
    gser_ucx_worker_t *w = ep->worker;
    size_t total = 0;
    for (size_t i = 0; i < nframes; i++)
        if (candidate(&frames[i]))
            total += frames[i].size;
    gux_lock(w);
    if (!ep->peer_known) {
        gux_unlock(w);
        return gux_fail(GSER_ERR_STATE, "gser_ucx_ep_choose_compression: the handshake is not done");
    }
    if (!gux_ep_link_aware(ep) || total < GUX_LINK_MSG_MIN) {
        *codec_out = gux_ep_codec(ep);
        gux_unlock(w);
        return GSER_OK;
    }
    uint32_t both = w->announce_codecs & ep->peer.caps & GUX_CODECS;
    double now = gux_now_ms();
    bool sample = ep->link.sampled_at == 0 || now - ep->link.sampled_at >= GUX_LINK_SAMPLE_MS;
    size_t chunk = pipelined ? w->zchunk : 0;
    gux_unlock(w);

    /* The codecs are timed without the lock: the worker goes on meanwhile. */
    codec_sample_t cs[2] = {{0}, {0}};
    if (sample) {
        size_t n = SAMPLE_PIECE * SAMPLE_PIECES;
        size_t zcap = ZSTD_compressBound(n) > (size_t)LZ4_compressBound((int)n) ? ZSTD_compressBound(n)
                                                                               : (size_t)LZ4_compressBound((int)n);
        char *buf = malloc(2 * n + zcap);
        if (buf) {
            sample_gather(frames, nframes, total, buf);
            for (int i = 0; i < 2; i++)
                if (both & (i ? GSER_UCX_CAP_ZSTD : GSER_UCX_CAP_LZ4))
                    cs[i] = sample_time(i, zstd_level, buf, n, buf + 2 * n, zcap, buf + n);
            free(buf);
        }
    }

    gux_lock(w);
    gux_link_t *l = &ep->link;
    if (!l->decided && !(l->m.rate > 0))
        link_host(ep, false, now); /* an earlier endpoint to this host measured it */
    if (sample) {
        l->sampled_at = now;
        l->samples++;
        for (int i = 0; i < 2; i++)
            if (cs[i].ok)
                gux_link_add_codec(l, i ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_LZ4, cs[i].ratio, cs[i].ctime,
                                   cs[i].dtime);
    }
    int codec = gux_link_choose(&l->m, total, chunk, both, l->estimate);
    if (!l->decided)
        l->probed_at = now;
    if (codec != GSER_COMPRESSION_NONE) {
        /* Compressed sends do not measure the link: raw goes now and then
         * to measure it again, the more rarely the more that costs. */
        double best = l->estimate[codec == GSER_COMPRESSION_LZ4 ? 1 : 2];
        double wait = dmax(GUX_LINK_PROBE_MS, GUX_LINK_PROBE_COST * (l->estimate[0] - best) * 1e3);
        if (++l->since_probe >= GUX_LINK_PROBE_EVERY && now - l->probed_at >= wait) {
            codec = GSER_COMPRESSION_NONE;
            l->since_probe = 0;
            l->probed_at = now;
            l->probes++;
        }
    }
    l->last = codec;
    l->decided = true;
    l->decisions++;
    link_host(ep, true, now);
    gux_unlock(w);
    *codec_out = codec;
    return GSER_OK;
}

gser_status_t gser_ucx_ep_get_link_stats(const gser_ucx_ep_t *ep, gser_ucx_link_stats_t *out)
{
    if (!ep || !out)
        return gux_fail(GSER_ERR_INVALID_ARG, "gser_ucx_ep_get_link_stats: NULL argument");
    gser_ucx_worker_t *w = ep->worker;
    gser_ucx_link_stats_t s = {.size = sizeof s};
    gux_lock(w);
    const gux_link_t *l = &ep->link;
    s.link_aware = gux_ep_link_aware(ep);
    s.codec = ep->peer_known ? gux_ep_codec(ep) : GSER_COMPRESSION_NONE;
    s.send_rate = l->m.rate;
    for (int i = 0; i < 2; i++)
        if (l->m.codec[i].known) {
            s.ratio[i] = l->m.codec[i].ratio;
            s.compress_rate[i] = 1 / l->m.codec[i].ctime;
            s.decompress_rate[i] = 1 / l->m.codec[i].dtime;
        }
    memcpy(s.estimate, l->estimate, sizeof s.estimate);
    s.decisions = l->decisions;
    s.samples = l->samples;
    s.rate_samples = l->rate_samples;
    s.probes = l->probes;
    gux_unlock(w);
    return gux_struct_write("gser_ucx_ep_get_link_stats", "out", "GSER_UCX_LINK_STATS_INIT", out, &s, sizeof s);
}
