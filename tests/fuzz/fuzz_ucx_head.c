/* libFuzzer target: the UCX transport's wire parsing from untrusted bytes —
 * the hello and the head of a message (fixed part, frame table,
 * inlined frames), and a message whose frames all came inlined decoded as
 * a receiver decodes it (compressed frames decompressed); frames in
 * compressed chunks (route 3) are checked as parsed. Whatever the
 * parser accepts must stay inside the bytes it was given and within the
 * limits. Seeds: tests/fuzz/corpus-ucx. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gser/gser.h"
#include "plugins/ucx/wire.h"

#define MAX_FRAMES 4096
#define MAX_BYTES ((uint64_t)1 << 30)

static gux_head_frame_t table[MAX_FRAMES + 1];
static gser_context_t *ctx;
static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= GUX_HELLO_LEN) {
        gux_hello_t h;
        if (gux_hello_decode(data, &h) == GSER_OK)
            sink += h.wire_version + h.caps + h.flags + h.timeout_ms;
    }
    gux_head_info_t info;
    if (gux_head_parse_fixed(data, size, MAX_FRAMES, &info) != GSER_OK)
        return 0;
    if (info.nframes == 0 || info.nframes > MAX_FRAMES + 1)
        abort(); /* the fixed part let a frame count past the limit through */
    if (gux_head_parse_table(data, size, MAX_BYTES, &info, table) != GSER_OK)
        return 0;
    uint64_t total = 0;
    for (uint32_t i = 0; i < info.nframes; i++) {
        const gux_head_frame_t *f = &table[i];
        total += f->size;
        if (f->route == GUX_ROUTE_INLINE) {
            if (f->offset > size || f->size > size - f->offset)
                abort(); /* an inlined frame said to lie outside the head */
            for (uint64_t k = 0; k < f->size; k++)
                sink += data[f->offset + k];
        } else if (f->route == GUX_ROUTE_ZCHUNKED) {
            /* compressed chunks: what the parser accepted is in range, and
             * the chunk check (fed the head's own bytes as a chunk) takes
             * only chunks of the lengths the flags allow */
            if ((f->codec != GSER_COMPRESSION_LZ4 && f->codec != GSER_COMPRESSION_ZSTD) ||
                f->zchunk < GSER_UCX_CHUNK_MIN || f->zchunk > GSER_UCX_CHUNK_MAX || f->memory != GSER_MEMORY_HOST)
                abort();
            size_t n = (size_t)((f->size + f->zchunk - 1) / f->zchunk);
            size_t raw_len = f->size < f->zchunk ? (size_t)f->size : f->zchunk;
            bool is_raw;
            if (gux_zchunk_check(data, size, i, 0, n, raw_len, &is_raw) == GSER_OK &&
                (is_raw ? size - GUX_ZCHUNK_PREFIX != raw_len : size - GUX_ZCHUNK_PREFIX >= raw_len))
                abort();
        }
    }
    if (total > MAX_BYTES)
        abort();
    /* A message whose frames all came inlined: decode what it carries as
     * the receiver would (compressed frames included: sizes checked,
     * decompressed into buffers of the message's own). */
    static gser_frame_t frames[MAX_FRAMES + 1];
    for (uint32_t i = 0; i < info.nframes; i++) {
        if (table[i].route != GUX_ROUTE_INLINE || table[i].memory != GSER_MEMORY_HOST)
            return 0;
        frames[i] = (gser_frame_t){.data = data + table[i].offset, .size = table[i].size, .memory = GSER_MEMORY_HOST};
    }
    if (!ctx) {
        gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
        static gser_limits_t lim = GSER_LIMITS_INIT;
        o.device_backend = "none";
        o.trace = -1;
        lim.max_nodes = 100000;
        lim.max_bytes = 1 << 24;
        o.limits = &lim;
        if (gser_context_create(&o, &ctx) != GSER_OK)
            abort();
    }
    gser_msg_t *msg;
    if (gser_deserialize(ctx, frames, info.nframes, NULL, &msg) == GSER_OK) {
        for (size_t i = 1; i < info.nframes; i++) {
            int codec;
            size_t wire;
            if (gser_msg_get_frame_codec(msg, i, &codec, &wire) != GSER_OK)
                abort();
            if (codec != GSER_COMPRESSION_NONE && wire != table[i].size)
                abort(); /* the compressed size is what came */
        }
        gser_msg_destroy(msg);
    }
    return 0;
}
