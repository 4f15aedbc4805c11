/* libFuzzer target: the UCX transport's wire parsing from untrusted bytes —
 * the hello and the head of a message (fixed part, frame table,
 * inlined frames). Whatever the parser accepts must stay inside the bytes it
 * was given and within the limits. Seeds: tests/fuzz/corpus-ucx. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plugins/ucx/wire.h"

#define MAX_FRAMES 4096
#define MAX_BYTES ((uint64_t)1 << 30)

static gux_head_frame_t table[MAX_FRAMES + 1];
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
        }
    }
    if (total > MAX_BYTES)
        abort();
    return 0;
}
