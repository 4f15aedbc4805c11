/* libFuzzer target: a flattened gser message from untrusted bytes.
 *
 * Decodes the input twice (rebuilding objects, and keeping them serialized),
 * walks what decoded, and re-serializes it: any crash, sanitizer report or
 * leak is a bug. Run: fuzz_decode -max_total_time=60 tests/fuzz/corpus */
#include <stdint.h>

#include "fuzz_common.h"

static gser_context_t *ctx;
static gser_context_t *dev_ctx; /* the emulated device backend: restore and scatter paths */

/* Touch every value so that bad pointers or lengths show up under ASan. */
static unsigned walk(gser_msg_t *msg, gser_value_t *v, int depth)
{
    unsigned h = (unsigned)gser_value_get_kind(v);
    if (depth > 64)
        return h;
    gser_kind_t ek;
    const void *data;
    size_t count;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    const char *s;
    size_t n;
    switch (gser_value_get_kind(v)) {
    case GSER_KIND_STR:
        gser_value_get_str(v, &s, &n);
        for (size_t i = 0; i < n; i++)
            h = h * 31 + (unsigned char)s[i];
        break;
    case GSER_KIND_BYTES:
        gser_value_get_bytes(v, &data, &n);
        for (size_t i = 0; i < n; i++)
            h = h * 31 + ((const unsigned char *)data)[i];
        break;
    case GSER_KIND_BUFFER: {
        /* Every byte the elements span, and the first and last element. */
        int64_t off;
        size_t span;
        if (gser_value_get_buffer(v, &d) || gser_buffer_get_span(&d, &off, &span))
            abort();
        const unsigned char *bytes = span ? (const unsigned char *)d.data + off : NULL;
        unsigned char *copy = NULL;
        if (d.memory == GSER_MEMORY_DEVICE) {
            /* Through the backend, as a user would read device memory. */
            copy = malloc(span ? span : 1);
            if (!copy || gser_device_memcpy(gser_msg_get_context(msg), copy, GSER_MEMORY_HOST, bytes, d.memory, span,
                                            NULL) != GSER_OK)
                abort();
            bytes = copy;
        }
        for (size_t i = 0; i < span; i++)
            h = h * 31 + bytes[i];
        if (span && d.strides) {
            size_t es = gser_dtype_size(d.dtype);
            int64_t last = -off; /* element 0, then the element of the highest indices */
            h += bytes[last] + bytes[last + (int64_t)es - 1];
            for (uint32_t k = 0; k < d.ndim; k++)
                last += (d.shape[k] - 1) * d.strides[k];
            h += bytes[last] + bytes[last + (int64_t)es - 1];
        }
        free(copy);
        break;
    }
    case GSER_KIND_LIST:
    case GSER_KIND_TUPLE:
        if (gser_list_get_array(v, &ek, &data, &count) == GSER_OK) {
            size_t es = ek == GSER_KIND_BOOL ? 1 : 8;
            for (size_t i = 0; i < count * es; i++)
                h = h * 31 + ((const unsigned char *)data)[i];
        }
        for (size_t i = 0; i < gser_value_get_len(v) && i < 64; i++) {
            gser_value_t *e;
            if (gser_list_get(v, i, &e) == GSER_OK)
                h += walk(msg, e, depth + 1);
        }
        break;
    case GSER_KIND_MAP:
        for (size_t i = 0; i < gser_value_get_len(v); i++) {
            gser_value_t *k, *e;
            gser_map_get_at(v, i, &k, &e);
            h += walk(msg, k, depth + 1) + walk(msg, e, depth + 1);
        }
        break;
    case GSER_KIND_SERIALIZED: {
        gser_value_t *tree;
        if (gser_value_decode_serialized(msg, v, &tree) == GSER_OK)
            h += walk(msg, tree, depth + 1);
        break;
    }
    default: break;
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx) {
        ctx = fuzz_context(NULL);
        dev_ctx = fuzz_context("emulated");
    }
    {
        /* Buffers that were device memory at the sender go back to the
         * (emulated) device, then every device buffer is scattered. */
        gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
        o.flags = GSER_DESERIALIZE_RESTORE_DEVICE | GSER_DESERIALIZE_SCATTER | GSER_DESERIALIZE_ALLOW_UNKNOWN;
        gser_msg_t *msg = NULL;
        if (gser_deserialize_flat(dev_ctx, data, size, NULL, NULL, &o, &msg) == GSER_OK) {
            volatile unsigned h = walk(msg, gser_msg_get_root(msg), 0);
            (void)h;
            gser_msg_destroy(msg);
        }
    }
    static const unsigned flags[] = {0, GSER_DESERIALIZE_KEEP_SERIALIZED | GSER_DESERIALIZE_ALLOW_UNKNOWN};
    for (int i = 0; i < 2; i++) {
        gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
        o.flags = flags[i];
        gser_msg_t *msg = NULL;
        if (gser_deserialize_flat(ctx, data, size, NULL, NULL, &o, &msg) != GSER_OK)
            continue;
        volatile unsigned h = walk(msg, gser_msg_get_root(msg), 0);
        (void)h;
        gser_frames_t *f = NULL;
        /* written again plain, then compressed (the codec chosen by the input) */
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.compression = i == 0 ? GSER_COMPRESSION_NONE : size & 1 ? GSER_COMPRESSION_LZ4 : GSER_COMPRESSION_ZSTD;
        if (gser_serialize(ctx, msg, &so, &f) == GSER_OK) {
            size_t len;
            unsigned char *buf = fuzz_flatten(f, &len);
            if (buf) {
                gser_msg_t *again = NULL;
                /* What gser wrote, gser must read. */
                if (gser_deserialize_flat(ctx, buf, len, NULL, NULL, &o, &again))
                    abort();
                gser_msg_destroy(again);
                free(buf);
            }
            gser_frames_destroy(f);
        }
        gser_msg_destroy(msg);
    }
    return 0;
}
