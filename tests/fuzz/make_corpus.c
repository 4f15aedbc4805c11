/* Writes the seed corpus for fuzz_decode: a few flattened messages that
 * between them use every marker. Run from the repository root:
 *   build-fuzz/tests/fuzz/make_corpus tests/fuzz/corpus
 * (it also writes tests/fuzz/corpus-arrow, -ucx and -ucx-hello). */
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "fuzz_common.h"
#include "plugins/ucx/wire.h"
#include "tools/demo_table.h"

#undef CK /* demo_table.h's takes a context; this one reports through ctx */
#define CK(x)                                                                                                \
    do {                                                                                                     \
        if ((x) != GSER_OK) {                                                                                \
            fprintf(stderr, "%s: %s\n", #x, gser_context_get_last_error(ctx));                                  \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)

/* Serialized with the families given (NULL: the default) and compression
 * (in chunks of chunk bytes, 0: whole frames), device work waited for. */
static int write_msg_codec(gser_context_t *ctx, gser_msg_t *m, const char *const *families, int compression,
                           size_t chunk, const char *dir, const char *name)
{
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = compression;
    so.compression_chunk_size = chunk;
    so.families = families;
    so.nfamilies = families ? 1 : 0;
    gser_frames_t *f;
    CK(gser_serialize(ctx, m, &so, &f));
    CK(gser_frames_wait(f));
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    if (!out)
        return 1;
    CK(gser_flat_write_file(gser_frames_get_array(f), gser_frames_get_count(f), out));
    fclose(out);
    gser_frames_destroy(f);
    return 0;
}


/* A UCX message head (fuzz_ucx_head's seed) with every frame of a message
 * inlined, as a sender whose inline limits allow it sends one: the
 * transport fuzzer then decodes (and decompresses) what it carries. */
static int write_head_inline(const gser_frame_t *fr, size_t n, const char *dir, const char *name)
{
    gux_route_policy_t pol = {.inline_max = 1 << 20, .inline_budget = 1 << 20, .device_direct = false};
    uint8_t routes[8];
    size_t len;
    if (n > 8 || gux_head_plan(fr, n, &pol, routes, &len) != GSER_OK)
        return 1;
    unsigned char *head = calloc(1, len);
    if (!head)
        return 1;
    gux_head_write(fr, n, routes, 3, 0, head, len);
    char path[600];
    snprintf(path, sizeof path, "%s-ucx/%s", dir, name);
    FILE *out = fopen(path, "wb");
    int bad = !out || fwrite(head, 1, len, out) != len;
    if (out)
        fclose(out);
    free(head);
    return bad;
}

/* The compressed frame 1 of f made hostile: its table entry's uncompressed
 * size moved by raw_delta, its data cut by cut bytes (the sizes kept
 * consistent), or its first bytes overwritten with garbage. */
static int write_hostile(gser_context_t *ctx, gser_frames_t *f, long raw_delta, size_t cut, bool garbage,
                         const char *dir, const char *name)
{
    const gser_frame_t *fr = gser_frames_get_array(f);
    size_t n = gser_frames_get_count(f);
    int codec = 0;
    size_t raw = 0;
    msgpack_sbuffer old, new_;
    msgpack_sbuffer_init(&old);
    msgpack_sbuffer_init(&new_);
    /* the entry as the writer packs it: [size, 0, 0, codec, raw] in the shortest forms */
    for (codec = 1; codec <= 2; codec++)
        for (raw = fr[1].size + 1; raw < 40000; raw++) {
            old.size = 0;
            msgpack_packer pk;
            msgpack_packer_init(&pk, &old, msgpack_sbuffer_write);
            msgpack_pack_array(&pk, 5);
            msgpack_pack_uint64(&pk, fr[1].size);
            msgpack_pack_uint8(&pk, 0);
            msgpack_pack_int32(&pk, 0);
            msgpack_pack_uint8(&pk, (uint8_t)codec);
            msgpack_pack_uint64(&pk, raw);
            const char *h = fr[0].data;
            for (size_t at = 0; at + old.size <= fr[0].size; at++)
                if (memcmp(h + at, old.data, old.size) == 0) {
                    msgpack_packer pn;
                    msgpack_packer_init(&pn, &new_, msgpack_sbuffer_write);
                    msgpack_sbuffer_write(&new_, h, at);
                    msgpack_pack_array(&pn, 5);
                    msgpack_pack_uint64(&pn, fr[1].size - cut);
                    msgpack_pack_uint8(&pn, 0);
                    msgpack_pack_int32(&pn, 0);
                    msgpack_pack_uint8(&pn, (uint8_t)codec);
                    msgpack_pack_uint64(&pn, (uint64_t)((long)raw + raw_delta));
                    msgpack_sbuffer_write(&new_, h + at + old.size, fr[0].size - at - old.size);
                    goto found;
                }
        }
    fprintf(stderr, "%s: no compressed frame 1 in the header\n", name);
    return 1;
found:;
    gser_frame_t copy[8];
    if (n > 8)
        return 1;
    memcpy(copy, fr, n * sizeof *fr);
    copy[0].data = new_.data;
    copy[0].size = new_.size;
    copy[1].size -= cut;
    char *data = malloc(copy[1].size);
    if (!data)
        return 1;
    memcpy(data, fr[1].data, copy[1].size);
    if (garbage)
        memset(data, 0xa5, copy[1].size < 64 ? copy[1].size : 64);
    copy[1].data = data;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    if (!out)
        return 1;
    CK(gser_flat_write_file(copy, n, out));
    fclose(out);
    /* the same message in a UCX head, every frame inlined */
    char hname[256];
    snprintf(hname, sizeof hname, "head-%.*s.bin", (int)(strlen(name) - 5), name);
    if (write_head_inline(copy, n, dir, hname))
        return 1;
    free(data);
    msgpack_sbuffer_destroy(&old);
    msgpack_sbuffer_destroy(&new_);
    return 0;
}

static int write_msg_with(gser_context_t *ctx, gser_msg_t *m, const char *const *families, const char *dir,
                          const char *name)
{
    return write_msg_codec(ctx, m, families, GSER_COMPRESSION_NONE, 0, dir, name);
}

/* Write a then b (either may be empty) to path. */
static int write_bytes(const char *path, const void *a, size_t alen, const void *b, size_t blen)
{
    FILE *out = fopen(path, "wb");
    if (!out)
        return 1;
    int bad = fwrite(a, 1, alen, out) != alen || (blen && fwrite(b, 1, blen, out) != blen);
    return fclose(out) != 0 || bad;
}

static int write_msg(gser_context_t *ctx, gser_msg_t *m, const char *dir, const char *name)
{
    return write_msg_with(ctx, m, NULL, dir, name);
}

static const char *const host_only[] = {"host"};

/* A flattened header-only message whose root is n typed objects nested in
 * one another, named type (the innermost sub-header is nil): msgpack written
 * by hand from the inside out, as no serializer makes such a chain. */
static int write_nested(const char *dir, const char *name, size_t n, const char *type)
{
    size_t tl = strlen(type), cap = 64 + n * (24 + tl), len = 1;
    unsigned char *buf = malloc(cap);
    if (!buf || tl > 31)
        return 1;
    size_t at = cap - 1; /* built backwards from the end */
    buf[at] = 0xc0;
    for (size_t k = 0; k < n; k++) {
        unsigned char head[48];
        size_t h = 0;
        head[h++] = 0x97;
        head[h++] = 0xc7, head[h++] = 0x00, head[h++] = 0x06;
        head[h++] = (unsigned char)(0xa0 | tl);
        memcpy(head + h, type, tl), h += tl;
        head[h++] = 0xa4, memcpy(head + h, "host", 4), h += 4;
        head[h++] = 0x01, head[h++] = 0x00, head[h++] = 0x00;
        head[h++] = 0xc6; /* bin32 */
        for (int i = 3; i >= 0; i--)
            head[h++] = (unsigned char)(len >> (8 * i));
        at -= h;
        memcpy(buf + at, head, h);
        len += h;
    }
    static const unsigned char top[8] = {0x94, 0xd6, 0x01, 'G', 'S', 'E', 'R', GSER_WIRE_VERSION};
    gser_frame_t fr = {.size = 8 + len + 1};
    unsigned char *hdr = malloc(fr.size);
    if (!hdr)
        return 1;
    memcpy(hdr, top, 8);
    memcpy(hdr + 8, buf + at, len);
    hdr[8 + len] = 0x90; /* no data frames */
    fr.data = hdr;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    int rc = !out || gser_flat_write_file(&fr, 1, out) != GSER_OK;
    if (out)
        fclose(out);
    free(hdr);
    free(buf);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.inline_max = 32;
    o.array_min = 4;
    gser_context_t *ctx;
    if (gser_context_create(&o, &ctx) || fuzz_register(ctx))
        return 1;
    gser_msg_t *m;
    gser_value_t *root, *v, *l, *t, *k;

    /* 1: scalars of every kind in a map with mixed keys */
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_map(m, &root));
    CK(gser_msg_new_cstr(m, "op", &k));
    CK(gser_msg_new_cstr(m, "compute", &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_new_int(m, -3, &k));
    CK(gser_msg_new_uint(m, 18446744073709551615ull, &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_new_float(m, 2.5, &k));
    CK(gser_msg_new_bool(m, true, &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_new_nil(m, &k));
    CK(gser_msg_new_bytes(m, "\x00\x01\x02", 3, &v));
    CK(gser_map_put(root, k, v));
    CK(gser_msg_set_root(m, root));
    if (write_msg(ctx, m, dir, "scalars.gser"))
        return 1;
    gser_msg_destroy(m);

    /* 2: lists, tuples and arrays (inline and framed) */
    static const double dbl[64] = {1.5, 2.5, 3.5, 4.5};
    static const unsigned char bools[8] = {1, 0, 1, 1, 0, 0, 1, 0};
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_list(m, &root));
    CK(gser_msg_new_tuple(m, &t));
    CK(gser_list_append_int(t, 1));
    CK(gser_list_append_cstr(t, "two"));
    CK(gser_list_append(root, t));
    CK(gser_msg_new_array(m, GSER_KIND_FLOAT, dbl, 64, 0, &v));
    CK(gser_list_append(root, v));
    CK(gser_msg_new_array(m, GSER_KIND_BOOL, bools, 8, GSER_ARRAY_TUPLE, &v));
    CK(gser_list_append(root, v));
    CK(gser_msg_new_list(m, &l));
    for (int i = 0; i < 6; i++)
        CK(gser_list_append_uint(l, (uint64_t)i * 1000));
    CK(gser_list_append(root, l));
    CK(gser_msg_set_root(m, root));
    if (write_msg(ctx, m, dir, "lists.gser"))
        return 1;
    gser_msg_destroy(m);

    /* 3: buffers and a typed object */
    static int32_t grid[4][4];
    static unsigned char payload[48] = "fuzz blob payload";
    int64_t shape[2] = {4, 4};
    fuzz_blob_t blob = {7, sizeof payload, payload};
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_map(m, &root));
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = grid;
    d.nbytes = sizeof grid;
    d.dtype = GSER_DTYPE_INT32;
    d.ndim = 2;
    d.shape = shape;
    CK(gser_msg_new_buffer(m, &d, &v));
    CK(gser_map_put_cstr(root, "grid", v));
    d.nbytes = 8;
    d.ndim = 0;
    CK(gser_msg_new_buffer(m, &d, &v));
    CK(gser_map_put_cstr(root, "small", v));
    CK(gser_msg_new_object(m, "fuzz.blob", &blob, &v));
    CK(gser_map_put_cstr(root, "obj", v));
    CK(gser_msg_set_root(m, root));
    if (write_msg(ctx, m, dir, "objects.gser"))
        return 1;
    gser_msg_destroy(m);

    /* 3a: compressed frames, lz4 and zstd: sorted int32 keys and runs of
     * bytes (just over the 10,000-byte minimum, so that mutations reach the
     * compressed data), one frame of noise left uncompressed, a small inline
     * buffer */
    for (int c = 0; c < 2; c++) {
        static int32_t keys[2600];
        static unsigned char runs[10240], noise[10016];
        uint32_t x = 12345;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            keys[i] = (int32_t)(i / 5);
        for (size_t i = 0; i < sizeof runs; i++)
            runs[i] = (unsigned char)(i / 97 % 7);
        for (size_t i = 0; i < sizeof noise; i++)
            noise[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 24);
        CK(gser_msg_create(ctx, &m));
        CK(gser_msg_new_list(m, &root));
        const void *ptrs[] = {keys, runs, noise, "tiny"};
        size_t lens[] = {sizeof keys, sizeof runs, sizeof noise, 4};
        for (int k = 0; k < 4; k++) {
            gser_buffer_desc_t cd = GSER_BUFFER_DESC_INIT;
            cd.data = ptrs[k];
            cd.nbytes = lens[k];
            cd.dtype = k == 0 ? GSER_DTYPE_INT32 : GSER_DTYPE_UINT8;
            CK(gser_msg_new_buffer(m, &cd, &v));
            CK(gser_list_append(root, v));
        }
        CK(gser_msg_set_root(m, root));
        if (write_msg_codec(ctx, m, NULL, c ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_LZ4, 0, dir,
                            c ? "compressed-zstd.gser" : "compressed-lz4.gser"))
            return 1;
        /* in chunks of the smallest size: three per frame, the noise's stored */
        if (write_msg_codec(ctx, m, NULL, c ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_LZ4, GSER_COMPRESS_CHUNK_MIN,
                            dir, c ? "compressed-zstd-chunks.gser" : "compressed-lz4-chunks.gser"))
            return 1;
        {
            gser_serialize_options_t hs = GSER_SERIALIZE_OPTIONS_INIT;
            hs.compression = c ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_LZ4;
            gser_frames_t *hf;
            CK(gser_serialize(ctx, m, &hs, &hf));
            if (write_head_inline(gser_frames_get_array(hf), gser_frames_get_count(hf), dir,
                                  c ? "head-compressed-zstd.bin" : "head-compressed-lz4.bin"))
                return 1;
            gser_frames_destroy(hf);
        }
        /* and hostile: lying sizes, cut data, garbage */
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.compression = c ? GSER_COMPRESSION_ZSTD : GSER_COMPRESSION_LZ4;
        gser_frames_t *zf;
        CK(gser_serialize(ctx, m, &so, &zf));
        const char *tag = c ? "zstd" : "lz4";
        char name[64];
        static const struct {
            const char *what;
            long delta;
            size_t cut;
            bool garbage;
        } bad[] = {{"more", 1, 0, false}, {"less", -1, 0, false}, {"bomb", 1L << 30, 0, false},
                   {"cut", 0, 7, false}, {"garbage", 0, 0, true}};
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            snprintf(name, sizeof name, "compressed-%s-%s.gser", tag, bad[b].what);
            if (write_hostile(ctx, zf, bad[b].delta, bad[b].cut, bad[b].garbage, dir, name))
                return 1;
        }
        gser_frames_destroy(zf);
        gser_msg_destroy(m);
    }

    /* 3b: objects nested in objects, at the depth limit and past it, and
     * names that are terminal escapes */
    if (write_nested(dir, "nested-29.gser", 29, "t") || write_nested(dir, "nested-40.gser", 40, "t") ||
        write_nested(dir, "names.gser", 3, "\x1b[2J\x1b]0;x\x07"))
        return 1;

    /* 4: device buffers through the host family (origin device, one pinned
     * frame), made on the emulated device backend */
    gser_context_t *host_ctx = ctx;
    o.device_backend = "emulated";
    o.pack_max = 64;
    if (gser_context_create(&o, &ctx) || fuzz_register(ctx) || gser_arrow_register(ctx))
        return 1;
    void *dev;
    static const char bytes[200] = "device bytes, packed then staged to host";
    CK(gser_device_alloc(ctx, sizeof bytes, NULL, &dev));
    CK(gser_device_memcpy(ctx, dev, GSER_MEMORY_DEVICE, bytes, GSER_MEMORY_HOST, sizeof bytes, NULL));
    CK(gser_msg_create(ctx, &m));
    CK(gser_msg_new_list(m, &root));
    for (int i = 0; i < 3; i++) {
        gser_buffer_desc_t dd = GSER_BUFFER_DESC_INIT;
        dd.data = (const char *)dev + 40 * i;
        dd.nbytes = 40 + 13 * (size_t)i;
        dd.memory = GSER_MEMORY_DEVICE;
        CK(gser_msg_new_buffer(m, &dd, &v));
        CK(gser_list_append(root, v));
    }
    CK(gser_msg_set_root(m, root));
    if (write_msg_with(ctx, m, host_only, dir, "device.gser"))
        return 1;
    gser_msg_destroy(m);

    /* 4b: strided buffers (wire version 2): Fortran order, a broadcast and a
     * reversed view in host memory, and a Fortran-ordered device buffer
     * staged through the host family */
    {
        static const int16_t fortran[6] = {1, 4, 2, 5, 3, 6};
        static const double half = 0.5;
        static const uint8_t up[40] = {1, 2, 3, 4};
        const int64_t fshape[2] = {2, 3}, fst[2] = {2, 4}, zshape[2] = {100, 7}, zst[2] = {0, 0}, rshape[1] = {40},
                      rst[1] = {-1}, dshape[2] = {5, 8}, dst[2] = {1, 5};
        const struct {
            const void *data;
            gser_dtype_t dtype;
            size_t nbytes;
            const int64_t *shape, *strides;
            uint32_t ndim;
            gser_memory_t memory;
        } bufs[4] = {{fortran, GSER_DTYPE_INT16, 12, fshape, fst, 2, GSER_MEMORY_HOST},
                     {&half, GSER_DTYPE_FLOAT64, 5600, zshape, zst, 2, GSER_MEMORY_HOST},
                     {&up[39], GSER_DTYPE_UINT8, 40, rshape, rst, 1, GSER_MEMORY_HOST},
                     {dev, GSER_DTYPE_UINT8, 40, dshape, dst, 2, GSER_MEMORY_DEVICE}};
        CK(gser_msg_create(ctx, &m));
        CK(gser_msg_new_list(m, &root));
        for (int i = 0; i < 4; i++) {
            gser_buffer_desc_t dd = GSER_BUFFER_DESC_INIT;
            dd.data = bufs[i].data;
            dd.dtype = bufs[i].dtype;
            dd.nbytes = bufs[i].nbytes;
            dd.ndim = bufs[i].ndim;
            dd.shape = bufs[i].shape;
            dd.strides = bufs[i].strides;
            dd.memory = bufs[i].memory;
            CK(gser_msg_new_buffer(m, &dd, &v));
            CK(gser_list_append(root, v));
        }
        CK(gser_msg_set_root(m, root));
        if (write_msg_with(ctx, m, host_only, dir, "strides.gser"))
            return 1;
        gser_msg_destroy(m);
    }
    gser_device_free(ctx, dev, sizeof bytes, NULL);

    /* 5, 6: Arrow tables (fuzz_arrow's seeds, in DIR-arrow): one in host
     * memory, one in (emulated) device memory sent with the host family. */
    char adir[480];
    snprintf(adir, sizeof adir, "%s-arrow", dir);
    for (int device = 0; device < 2; device++) {
        struct ArrowDeviceArray da;
        struct ArrowSchema schema;
        make_table(ctx, device, 9, 4, &da, &schema);
        CK(gser_msg_create(ctx, &m));
        CK(gser_msg_new_map(m, &root));
        CK(gser_arrow_new_value(m, &da, &schema, NULL, &v));
        CK(gser_map_put_cstr(root, "table", v));
        CK(gser_msg_set_root(m, root));
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.families = host_only;
        so.nfamilies = 1;
        so.inline_max = 24; /* some buffers inline, some in frames */
        gser_frames_t *f;
        CK(gser_serialize(ctx, m, &so, &f));
        CK(gser_frames_wait(f));
        char path[600];
        snprintf(path, sizeof path, "%s/table-%s.gser", adir, device ? "device" : "host");
        FILE *out = fopen(path, "wb");
        if (!out)
            return 1;
        CK(gser_flat_write_file(gser_frames_get_array(f), gser_frames_get_count(f), out));
        fclose(out);
        gser_frames_destroy(f);
        gser_msg_destroy(m);
        da.array.release(&da.array);
        schema.release(&schema);
    }
    gser_context_destroy(ctx);
    gser_context_destroy(host_ctx);

    /* 7..9: UCX message heads and a hello (fuzz_ucx_head's seeds, in DIR-ucx). */
    char udir[480];
    snprintf(udir, sizeof udir, "%s-ucx", dir);
    static const char small[40] = "inlined bytes", big[16] = "tag";
    static char header[48] = "header bytes";
    const gser_frame_t frames[4] = {{header, sizeof header, GSER_MEMORY_HOST, 0, NULL, NULL},
                                    {small, sizeof small, GSER_MEMORY_HOST, 0, NULL, NULL},
                                    {big, 70000, GSER_MEMORY_HOST, 0, NULL, NULL},
                                    {big, 16, GSER_MEMORY_DEVICE, 1, NULL, NULL}};
    /* variant 2: the 70000-byte frame in compressed chunks (route 3) */
    for (int variant = 0; variant < 3; variant++) {
        gux_route_policy_t pol = {.inline_max = 8192, .inline_budget = 65536, .device_direct = variant == 1,
                                  .zchunk_min = variant == 2 ? 65536 : 0};
        uint8_t routes[4];
        size_t len;
        if (gux_head_plan(frames, 4, &pol, routes, &len) != GSER_OK)
            return 1;
        unsigned char *head = calloc(1, len);
        if (!head)
            return 1;
        gux_head_write(frames, 4, routes, 7, variant != 1 ? 4u << 20 : 0, head, len);
        if (variant == 2)
            gux_head_set_zchunks(head, 4, routes, GSER_COMPRESSION_LZ4, 1u << 20);
        char path[600];
        snprintf(path, sizeof path, "%s/head-%d.bin", udir, variant);
        FILE *out = fopen(path, "wb");
        if (!out || fwrite(head, 1, len, out) != len)
            return 1;
        fclose(out);
        free(head);
    }
    gux_hello_t hello = {GSER_UCX_WIRE_VERSION, GSER_WIRE_VERSION,
                         GSER_UCX_CAP_LZ4 | GSER_UCX_CAP_ZSTD | GSER_UCX_CAP_CHUNKED,
                         GUX_HELLO_SECRET, 10000, 1024, {7}};
    unsigned char hb[GUX_HELLO_LEN];
    gux_hello_encode(&hello, hb);
    char path[600];
    snprintf(path, sizeof path, "%s/hello.bin", udir);
    if (write_bytes(path, hb, sizeof hb, NULL, 0))
        return 1;

    /* 10..: what a client sends a listener (fuzz_ucx_hello's seeds, in DIR-ucx-hello). */
    snprintf(udir, sizeof udir, "%s-ucx-hello", dir);
    unsigned char rec[GUX_REC_LEN + GUX_MAC_LEN] = {0}; /* the longest of the three */
    gux_rec_t proof = {GUX_REC_PROOF, 0, GUX_MAC_LEN}, setup = {GUX_REC_SETUP, 0, GUX_SETUP_FIXED + 16},
              bye = {GUX_REC_BYE, GUX_BYE_CLOSING, GUX_BYE_LEN};
    gux_rec_encode(&proof, rec);
    snprintf(path, sizeof path, "%s/hello-proof.bin", udir);
    if (write_bytes(path, hb, sizeof hb, rec, GUX_REC_LEN + GUX_MAC_LEN))
        return 1;
    gux_rec_encode(&setup, rec);
    snprintf(path, sizeof path, "%s/hello-setup.bin", udir);
    if (write_bytes(path, hb, sizeof hb, rec, GUX_REC_LEN + GUX_SETUP_FIXED + 16))
        return 1;
    gux_rec_encode(&bye, rec);
    snprintf(path, sizeof path, "%s/hello-bye.bin", udir);
    if (write_bytes(path, hb, sizeof hb, rec, GUX_REC_LEN + GUX_BYE_LEN))
        return 1;
    snprintf(path, sizeof path, "%s/hello-cut.bin", udir);
    if (write_bytes(path, hb, 40, NULL, 0))
        return 1;
    hello.flags = 0;
    gux_hello_encode(&hello, hb);
    snprintf(path, sizeof path, "%s/hello-nosecret.bin", udir);
    if (write_bytes(path, hb, sizeof hb, NULL, 0))
        return 1;
    hello.wire_version = 4; /* the release before the FIFO size: refused as another version */
    hello.mm_fifo = 0;
    gux_hello_encode(&hello, hb);
    snprintf(path, sizeof path, "%s/hello-v4.bin", udir);
    if (write_bytes(path, hb, sizeof hb, NULL, 0))
        return 1;
    hello.wire_version = 99;
    gux_hello_encode(&hello, hb);
    snprintf(path, sizeof path, "%s/hello-v99.bin", udir);
    if (write_bytes(path, hb, sizeof hb, NULL, 0))
        return 1;
    static const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    snprintf(path, sizeof path, "%s/http.bin", udir);
    if (write_bytes(path, http, sizeof http - 1, NULL, 0))
        return 1;
    return 0;
}
