/* gser-bench-host: the host path against anchors measured in the same run.
 *
 *   gser-bench-host [--json] [--quick]
 *
 * list_f64_1m       serialize + deserialize of a built 1,000,000-float list vs memcpy of 8 MB
 * list_f64_1m_flat  the same through the flattened form (bytes for a file or socket) vs memcpy
 * control_msg       build + serialize + deserialize of a scheduler message vs msgpack-c pack + unpack
 * control_msg_deserialize  gser_deserialize alone (and the destroy) vs msgpack_unpack of the same message
 * host_buffer_1m/1g serialize + deserialize of one host buffer vs memcpy of it (must not grow with size)
 * compress_*_64m    serialize with compression + flatten + deserialize (decompress) of one 64 MiB
 *                   frame, compressible (sorted int64 keys) or random, vs memcpy of the same bytes;
 *                   auto on random data vs no compression through the same path; a frame half
 *                   keys, half a counter (16 MiB runs), lz4 at threshold 0.3 (as the spill store
 *                   writes) whole vs in 1 MiB chunks (alternated)
 *
 * --quick uses small sizes and few repetitions: it checks the benchmark runs,
 * its numbers mean nothing.
 *
 * --phases N runs the control message N times, each phase in a function of
 * its own, for callgrind's --toggle-collect (bench/callgrind-control.sh
 * prints instructions per message and phase).
 */
#include <msgpack.h>

#include <gser/gser.h>

#include "bench_util.h"

#define CK(x)                                                                                                \
    do {                                                                                                     \
        gser_status_t st_ = (x);                                                                             \
        if (st_ != GSER_OK) {                                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, gser_status_str(st_),                    \
                    gser_context_get_last_error(g_ctx));                                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static gser_context_t *g_ctx;
static volatile unsigned long long g_sink;

/* ---- memcpy anchor --------------------------------------------------------- */

typedef struct copy_arg {
    void *dst;
    const void *src;
    size_t n;
} copy_arg_t;

static void run_memcpy(void *p)
{
    copy_arg_t *a = p;
    memcpy(a->dst, a->src, a->n);
    g_sink += ((unsigned char *)a->dst)[a->n / 2];
}

static double memcpy_us(size_t n, int reps)
{
    copy_arg_t a = {malloc(n), malloc(n), n};
    if (!a.dst || !a.src)
        abort();
    memset(a.dst, 1, n); /* fault the pages in: measure the copy, not the kernel */
    memset((void *)a.src, 2, n);
    double t = bench_median_us(run_memcpy, &a, 2, reps);
    free(a.dst);
    free((void *)a.src);
    return t;
}

/* ---- serialize + deserialize of a built message ---------------------------------- */

static void roundtrip(gser_msg_t *msg)
{
    gser_frames_t *f;
    gser_msg_t *back;
    CK(gser_serialize(g_ctx, msg, NULL, &f));
    CK(gser_deserialize(g_ctx, gser_frames_get_array(f), gser_frames_get_count(f), NULL, &back));
    g_sink += gser_value_get_len(gser_msg_get_root(back));
    gser_msg_destroy(back);
    gser_frames_destroy(f);
}

static void run_roundtrip(void *p)
{
    roundtrip(p);
}

/* Through bytes: serialize, flatten into a buffer, parse it back. */
typedef struct flat_arg {
    gser_msg_t *msg;
    unsigned char *buf;
    size_t cap;
} flat_arg_t;

static void run_flat(void *p)
{
    flat_arg_t *a = p;
    gser_frames_t *f;
    gser_msg_t *back;
    size_t w;
    CK(gser_serialize(g_ctx, a->msg, NULL, &f));
    CK(gser_flat_write(gser_frames_get_array(f), gser_frames_get_count(f), a->buf, a->cap, &w));
    CK(gser_deserialize_flat(g_ctx, a->buf, w, NULL, NULL, NULL, &back));
    g_sink += gser_value_get_len(gser_msg_get_root(back));
    gser_msg_destroy(back);
    gser_frames_destroy(f);
}

/* ---- the 1,000,000-float list ---------------------------------------------------- */

static gser_msg_t *build_list(size_t n)
{
    gser_msg_t *m;
    gser_value_t *l;
    CK(gser_msg_create(g_ctx, &m));
    CK(gser_msg_new_list(m, &l));
    for (size_t i = 0; i < n; i++)
        CK(gser_list_append_float(l, 1.5));
    CK(gser_msg_set_root(m, l));
    return m;
}

static void run_build_list(void *p)
{
    gser_msg_t *m = build_list(*(size_t *)p);
    gser_msg_destroy(m);
}

typedef struct elem_arg {
    size_t n;
    msgpack_sbuffer sb;
} elem_arg_t;

/* msgpack-c encoding the same list element by element (what a generic
 * encoder, or Dask's msgpack path, does). */
static void run_elementwise(void *p)
{
    elem_arg_t *a = p;
    msgpack_sbuffer_clear(&a->sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &a->sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, a->n);
    for (size_t i = 0; i < a->n; i++)
        msgpack_pack_double(&pk, 1.5);
    g_sink += a->sb.size;
}

/* ---- the control message ------------------------------------------------------------- */

#define NKEYS 4
static const char *const ctl_keys[NKEYS] = {"('x-part', 0)", "('x-part', 1)", "('x-part', 2)", "('x-part', 3)"};
static const char *const ctl_addrs[2] = {"tcp://10.0.0.1:40000", "tcp://10.0.0.2:40001"};

/* The message as a program writes it: keys in its source are literals
 * (borrowed), the task keys and addresses are its data (copied). */
static gser_msg_t *build_control(void)
{
    gser_msg_t *m;
    gser_value_t *root, *v, *prio, *who, *addrs, *nbytes;
    CK(gser_msg_create(g_ctx, &m));
    CK(gser_msg_new_map(m, &root));
    CK(gser_msg_new_cstr(m, "compute-task", &v));
    CK(GSER_MAP_PUT_LITERAL(root, "op", v));
    CK(gser_msg_new_cstr(m, "('sum-aggregate-5c1f', 17)", &v));
    CK(GSER_MAP_PUT_LITERAL(root, "key", v));
    CK(gser_msg_new_tuple(m, &prio));
    CK(gser_list_append_int(prio, 0));
    CK(gser_list_append_int(prio, 4));
    CK(gser_list_append_int(prio, -12));
    CK(GSER_MAP_PUT_LITERAL(root, "priority", prio));
    CK(gser_msg_new_float(m, 0.25, &v));
    CK(GSER_MAP_PUT_LITERAL(root, "duration", v));
    CK(gser_msg_new_map(m, &who));
    CK(gser_msg_new_map(m, &nbytes));
    for (int i = 0; i < NKEYS; i++) {
        CK(gser_msg_new_list(m, &addrs));
        CK(gser_list_append_cstr(addrs, ctl_addrs[0]));
        CK(gser_list_append_cstr(addrs, ctl_addrs[1]));
        CK(gser_map_put_cstr(who, ctl_keys[i], addrs));
        CK(gser_msg_new_int(m, 8000000 + i, &v));
        CK(gser_map_put_cstr(nbytes, ctl_keys[i], v));
    }
    CK(GSER_MAP_PUT_LITERAL(root, "who_has", who));
    CK(GSER_MAP_PUT_LITERAL(root, "nbytes", nbytes));
    CK(gser_msg_set_root(m, root));
    return m;
}

static void run_control_gser(void *p)
{
    (void)p;
    gser_msg_t *m = build_control();
    roundtrip(m);
    gser_msg_destroy(m);
}

/* Deserialize alone: the frames of one control message, decoded again and again. */
static const gser_frame_t *g_ctl_frames;
static size_t g_ctl_nframes;

static void run_control_deserialize(void *p)
{
    (void)p;
    gser_msg_t *back;
    CK(gser_deserialize(g_ctx, g_ctl_frames, g_ctl_nframes, NULL, &back));
    g_sink += gser_value_get_len(gser_msg_get_root(back));
    gser_msg_destroy(back);
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void pack_control(msgpack_sbuffer *sb);

/* msgpack-c's unpack of msgpack-c's bytes of the message (a zone per call). */
static void unpack_control(const msgpack_sbuffer *sb)
{
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    if (msgpack_unpack_next(&up, sb->data, sb->size, &off) != MSGPACK_UNPACK_SUCCESS)
        abort();
    g_sink += up.data.via.map.size;
    msgpack_unpacked_destroy(&up);
}

static void run_control_msgpack(void *p)
{
    (void)p;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_control(&sb);
    unpack_control(&sb);
    msgpack_sbuffer_destroy(&sb);
}

/* Unpack alone, of the same bytes again and again. */
static msgpack_sbuffer g_ctl_sb;

static void run_control_unpack(void *p)
{
    (void)p;
    unpack_control(&g_ctl_sb);
}

static void pack_control(msgpack_sbuffer *sb)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 6);
    pack_cstr(&pk, "op");
    pack_cstr(&pk, "compute-task");
    pack_cstr(&pk, "key");
    pack_cstr(&pk, "('sum-aggregate-5c1f', 17)");
    pack_cstr(&pk, "priority");
    msgpack_pack_array(&pk, 3);
    msgpack_pack_int64(&pk, 0);
    msgpack_pack_int64(&pk, 4);
    msgpack_pack_int64(&pk, -12);
    pack_cstr(&pk, "duration");
    msgpack_pack_double(&pk, 0.25);
    pack_cstr(&pk, "who_has");
    msgpack_pack_map(&pk, NKEYS);
    for (int i = 0; i < NKEYS; i++) {
        pack_cstr(&pk, ctl_keys[i]);
        msgpack_pack_array(&pk, 2);
        pack_cstr(&pk, ctl_addrs[0]);
        pack_cstr(&pk, ctl_addrs[1]);
    }
    pack_cstr(&pk, "nbytes");
    msgpack_pack_map(&pk, NKEYS);
    for (int i = 0; i < NKEYS; i++) {
        pack_cstr(&pk, ctl_keys[i]);
        msgpack_pack_int64(&pk, 8000000 + i);
    }
}

/* Many calls per sample, so the clock's resolution does not matter. */
typedef struct batch_arg {
    void (*fn)(void *);
    int n;
} batch_arg_t;

static void run_batch(void *p)
{
    batch_arg_t *b = p;
    for (int i = 0; i < b->n; i++)
        b->fn(NULL);
}

/* ---- one host buffer ------------------------------------------------------------------- */

static gser_msg_t *buffer_msg(const void *data, size_t n)
{
    gser_msg_t *m;
    gser_value_t *v;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = data;
    d.nbytes = n;
    d.dtype = GSER_DTYPE_UINT8;
    CK(gser_msg_create(g_ctx, &m));
    CK(gser_msg_new_buffer(m, &d, &v));
    CK(gser_msg_set_root(m, v));
    return m;
}

static void bench_buffer(const char *name, size_t n, int reps, bool json)
{
    unsigned char *data = malloc(n);
    if (!data)
        abort();
    memset(data, 3, n);
    gser_msg_t *m = buffer_msg(data, n);
    /* The received buffer must be the sender's bytes, not a copy. */
    gser_frames_t *f;
    gser_msg_t *back;
    gser_buffer_desc_t got = GSER_BUFFER_DESC_INIT;
    CK(gser_serialize(g_ctx, m, NULL, &f));
    CK(gser_deserialize(g_ctx, gser_frames_get_array(f), gser_frames_get_count(f), NULL, &back));
    CK(gser_value_get_buffer(gser_msg_get_root(back), &got));
    if (got.data != data) {
        fprintf(stderr, "%s: the received buffer is a copy\n", name);
        exit(1);
    }
    gser_msg_destroy(back);
    gser_frames_destroy(f);
    double t = bench_median_us(run_roundtrip, m, 3, reps * 10);
    double anchor = memcpy_us(n, reps);
    char note[64];
    snprintf(note, sizeof note, "value target < 50 us: %s", t < 50 ? "ok" : "MISSED");
    bench_result_t r = {name, t, "us", "memcpy of the same bytes (us)", anchor, n > (1u << 20) ? "<= 0.001" : "<= 1",
                        note};
    bench_print(&r, json);
    gser_msg_destroy(m);
    free(data);
}

static void bench_lists(size_t n, int reps, bool quick, bool json);
static void bench_control(bool quick, bool json);

/* ---- compressed frames ------------------------------------------------------------------ */

typedef struct zflat_arg {
    gser_msg_t *msg;
    int compression;
    size_t chunk; /* compression_chunk_size */
    double threshold;
    unsigned char *buf;
    size_t cap;
    size_t wire; /* frame bytes as carried, from the last run */
} zflat_arg_t;

/* Serialize (compressing) + flatten into a buffer (what a link or a file
 * carries) + deserialize (decompressing into the message's own frame). */
static void run_zflat(void *p)
{
    zflat_arg_t *a = p;
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.compression = a->compression;
    so.compression_chunk_size = a->chunk;
    so.compression_threshold = a->threshold;
    gser_frames_t *f;
    gser_msg_t *back;
    size_t w;
    CK(gser_serialize(g_ctx, a->msg, &so, &f));
    CK(gser_flat_write(gser_frames_get_array(f), gser_frames_get_count(f), a->buf, a->cap, &w));
    a->wire = w;
    gser_frames_destroy(f);
    CK(gser_deserialize_flat(g_ctx, a->buf, w, NULL, NULL, NULL, &back));
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    CK(gser_value_get_buffer(gser_msg_get_root(back), &d));
    g_sink += ((const unsigned char *)d.data)[d.nbytes / 2];
    gser_msg_destroy(back);
}

/* Medians of run_zflat with settings 0 and 1 (compression, chunk),
 * measured alternately so that the load of a shared machine falls on both. */
static void zflat_pairs(zflat_arg_t *a, const int comp[2], const size_t chunk[2], int pairs, double med[2],
                        size_t wire[2])
{
    enum { PAIRS = 15 };
    double t[2][PAIRS];
    if (pairs > PAIRS)
        pairs = PAIRS;
    for (int k = -1; k < pairs; k++) { /* k = -1 warms up */
        for (int c = 0; c < 2; c++) {
            a->compression = comp[c];
            a->chunk = chunk[c];
            double t0 = bench_now_us();
            run_zflat(a);
            double dt = bench_now_us() - t0;
            if (k >= 0)
                t[c][k] = dt;
            wire[c] = a->wire;
        }
    }
    for (int c = 0; c < 2; c++) {
        qsort(t[c], (size_t)pairs, sizeof(double), bench_cmp_double);
        med[c] = t[c][pairs / 2];
    }
}

static void bench_compress(bool quick, bool json)
{
    const size_t n = quick ? (size_t)1 << 20 : (size_t)64 << 20;
    const int reps = quick ? 3 : 7;
    int64_t *keys = malloc(n);
    uint64_t *noise = malloc(n);
    if (!keys || !noise)
        abort();
    for (size_t i = 0; i < n / 8; i++)
        keys[i] = (int64_t)(i / 16); /* sorted keys with repeats, as a shuffle's index column */
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64: incompressible */
        noise[i] = x;
    }
    double t_copy = memcpy_us(n, reps);
    zflat_arg_t a = {NULL, 0, 0, 0, NULL, n + n / 64 + 4096, 0};
    a.buf = malloc(a.cap);
    if (!a.buf)
        abort();
    memset(a.buf, 0, a.cap);
    static const struct {
        const char *name;
        int compression;
        bool random;
    } rows[] = {
        {"compress_lz4_64m", GSER_COMPRESSION_LZ4, false},
        {"compress_zstd_64m", GSER_COMPRESSION_ZSTD, false},
        {"compress_none_64m", GSER_COMPRESSION_NONE, false},
        {"compress_lz4_64m_random", GSER_COMPRESSION_LZ4, true},
        {"compress_zstd_64m_random", GSER_COMPRESSION_ZSTD, true},
    };
    char note[160];
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        a.msg = buffer_msg(rows[r].random ? (const void *)noise : (const void *)keys, n);
        a.compression = rows[r].compression;
        double t = bench_median_us(run_zflat, &a, 1, reps);
        snprintf(note, sizeof note, "%.0f MB/s; carried %zu of %zu bytes (%.3f)", n / t, a.wire, n,
                 (double)a.wire / (double)n);
        bench_result_t br = {rows[r].name, t, "us", "memcpy of the same bytes (us)", t_copy, NULL, note};
        bench_print(&br, json);
        gser_msg_destroy(a.msg);
    }
    /* auto must cost nothing where it does not pay: the same path without
     * compression as the anchor, the two measured alternately so that the
     * load of a shared machine falls on both */
    a.msg = buffer_msg(noise, n);
    int pairs = quick ? 3 : 15;
    double med[2];
    size_t wire[2];
    zflat_pairs(&a, (const int[2]){GSER_COMPRESSION_NONE, GSER_COMPRESSION_AUTO}, (const size_t[2]){0, 0}, pairs,
                med, wire);
    snprintf(note, sizeof note, "throughput auto / none = %.3f (target >= 0.95)", med[0] / med[1]);
    bench_result_t ba = {"compress_auto_64m_random", med[1], "us", "no compression, same path (us)", med[0],
                         "<= 1.053", note};
    bench_print(&ba, json);
    gser_msg_destroy(a.msg);
    /* a frame whose parts differ, as a block of dataframe columns (sorted
     * keys that shrink to 0.06, a counter that shrinks only to 0.5) at the
     * spill store's 0.3: whole, lz4 runs over the counter too; in chunks,
     * only over the keys */
    int64_t *mixed = malloc(n);
    if (!mixed)
        abort();
    size_t run = n / 8 / 4;
    for (size_t i = 0; i < n / 8; i++)
        mixed[i] = (i / run) % 2 ? (int64_t)i : keys[i];
    a.msg = buffer_msg(mixed, n);
    a.threshold = 0.3;
    zflat_pairs(&a, (const int[2]){GSER_COMPRESSION_LZ4, GSER_COMPRESSION_LZ4}, (const size_t[2]){0, 1u << 20}, pairs,
                med, wire);
    snprintf(note, sizeof note, "carried %zu bytes (%.3f) in chunks, %zu (%.3f) whole", wire[1],
             (double)wire[1] / (double)n, wire[0], (double)wire[0] / (double)n);
    bench_result_t bm = {"compress_lz4_64m_mixed_chunks", med[1], "us", "the same frame compressed whole (us)", med[0],
                         NULL, note};
    bench_print(&bm, json);
    gser_msg_destroy(a.msg);
    a.threshold = 0;
    free(mixed);
    free(a.buf);
    free(keys);
    free(noise);
}

/* ---- phases, for callgrind ---------------------------------------------------------------- */

__attribute__((noinline)) gser_msg_t *phase_build(void);
__attribute__((noinline)) gser_frames_t *phase_serialize(gser_msg_t *m);
__attribute__((noinline)) void phase_deserialize(gser_frames_t *f);
__attribute__((noinline)) void phase_destroy(gser_msg_t *m, gser_frames_t *f);
__attribute__((noinline)) void anchor_pack(msgpack_sbuffer *sb);
__attribute__((noinline)) void anchor_unpack(msgpack_sbuffer *sb);

gser_msg_t *phase_build(void)
{
    return build_control();
}

gser_frames_t *phase_serialize(gser_msg_t *m)
{
    gser_frames_t *f;
    CK(gser_serialize(g_ctx, m, NULL, &f));
    return f;
}

void phase_deserialize(gser_frames_t *f)
{
    g_ctl_frames = gser_frames_get_array(f);
    g_ctl_nframes = gser_frames_get_count(f);
    run_control_deserialize(NULL); /* and the destroy of what it made */
}

void phase_destroy(gser_msg_t *m, gser_frames_t *f)
{
    gser_frames_destroy(f);
    gser_msg_destroy(m);
}

void anchor_pack(msgpack_sbuffer *sb)
{
    msgpack_sbuffer_init(sb);
    pack_control(sb);
}

void anchor_unpack(msgpack_sbuffer *sb)
{
    unpack_control(sb);
    msgpack_sbuffer_destroy(sb);
}

static void run_phases(long n)
{
    for (long i = 0; i < n; i++) {
        gser_msg_t *m = phase_build();
        gser_frames_t *f = phase_serialize(m);
        phase_deserialize(f);
        phase_destroy(m, f);
        msgpack_sbuffer sb;
        anchor_pack(&sb);
        anchor_unpack(&sb);
    }
}

int main(int argc, char **argv)
{
    bool json = false, quick = false;
    const char *only = NULL;
    long phases = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--phases") == 0 && i + 1 < argc)
            phases = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: gser-bench-host [--json] [--quick] [--only list|control|buffer|compress] [--phases N]\n");
            return 2;
        }
    }
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = -1;
    if (gser_context_create(&o, &g_ctx) != GSER_OK)
        return 1;
    if (phases > 0) {
        run_phases(phases);
        gser_context_destroy(g_ctx);
        return 0;
    }
    const size_t n = quick ? 10000 : 1000000;
    const int reps = quick ? 3 : 21;

    if (!json)
        printf("%-22s %12s %-4s  %-34s %12s  %-15s %s\n", "case", "value", "unit", "anchor", "anchor", "ratio",
               "target");
    if (!only || strcmp(only, "list") == 0)
        bench_lists(n, reps, quick, json);
    if (!only || strcmp(only, "control") == 0)
        bench_control(quick, json);
    if (!only || strcmp(only, "buffer") == 0) {
        bench_buffer("host_buffer_1m", (size_t)1 << 20, reps, json);
        bench_buffer("host_buffer_1g", quick ? (size_t)1 << 22 : (size_t)1 << 30, quick ? 3 : 5, json);
    }
    if (!only || strcmp(only, "compress") == 0)
        bench_compress(quick, json);
    gser_context_destroy(g_ctx);
    return 0;
}

static void bench_lists(size_t n, int reps, bool quick, bool json)
{
    /* list_f64_1m */
    double t_build = bench_median_us(run_build_list, (void *)&n, 1, quick ? 3 : 11);
    gser_msg_t *list = build_list(n);
    double t_rt = bench_median_us(run_roundtrip, list, 3, reps * 10);
    double t_copy = memcpy_us(n * 8, reps);
    elem_arg_t ea = {n, {0}};
    msgpack_sbuffer_init(&ea.sb);
    double t_elem = bench_median_us(run_elementwise, &ea, 1, reps);
    msgpack_sbuffer_destroy(&ea.sb);
    char note[160];
    snprintf(note, sizeof note, "build %.0f us; vs msgpack-c element-wise encode %.0f us: ratio %.5f", t_build,
             t_elem, t_rt / t_elem);
    bench_result_t r1 = {"list_f64_1m", t_rt, "us", "memcpy 8 MB (us)", t_copy, "<= 2", note};
    bench_print(&r1, json);
    if (json) {
        bench_result_t r1b = {"list_f64_1m_vs_msgpack_elementwise", t_rt, "us", "msgpack-c element-wise encode (us)",
                              t_elem, "<= 0.5", NULL};
        bench_print(&r1b, json);
        bench_result_t r1c = {"list_f64_1m_build", t_build, "us", "memcpy 8 MB (us)", t_copy, "<= 30", NULL};
        bench_print(&r1c, json);
    }

    /* list_f64_1m_flat */
    flat_arg_t fa = {list, NULL, n * 8 + 4096};
    fa.buf = malloc(fa.cap);
    if (!fa.buf)
        abort();
    memset(fa.buf, 0, fa.cap);
    double t_flat = bench_median_us(run_flat, &fa, 2, reps);
    bench_result_t r2 = {"list_f64_1m_flat", t_flat, "us", "memcpy 8 MB (us)", t_copy, "<= 2",
                         "serialize + flatten into bytes + parse"};
    bench_print(&r2, json);
    free(fa.buf);
    gser_msg_destroy(list);
}

static void bench_control(bool quick, bool json)
{
    char note[160];
    batch_arg_t bg = {run_control_gser, 1000}, bm = {run_control_msgpack, 1000};
    double t_g = bench_median_us(run_batch, &bg, 1, quick ? 3 : 15) / bg.n;
    double t_m = bench_median_us(run_batch, &bm, 1, quick ? 3 : 15) / bm.n;
    snprintf(note, sizeof note, "%.0f messages/s (msgpack-c: %.0f/s)", 1e6 / t_g, 1e6 / t_m);
    bench_result_t r3 = {"control_msg", t_g, "us", "msgpack-c pack + unpack (us)", t_m, "<= 2", note};
    bench_print(&r3, json);

    /* deserialize alone */
    gser_msg_t *m = build_control();
    gser_frames_t *f;
    CK(gser_serialize(g_ctx, m, NULL, &f));
    g_ctl_frames = gser_frames_get_array(f);
    g_ctl_nframes = gser_frames_get_count(f);
    msgpack_sbuffer_init(&g_ctl_sb);
    pack_control(&g_ctl_sb);
    batch_arg_t bd = {run_control_deserialize, 1000}, bu = {run_control_unpack, 1000};
    double t_d = bench_median_us(run_batch, &bd, 1, quick ? 3 : 15) / bd.n;
    double t_u = bench_median_us(run_batch, &bu, 1, quick ? 3 : 15) / bu.n;
    snprintf(note, sizeof note, "header %zu bytes, msgpack-c's %zu", g_ctl_frames[0].size, g_ctl_sb.size);
    bench_result_t r4 = {"control_msg_deserialize", t_d, "us", "msgpack_unpack (us)", t_u, "<= 1.5", note};
    bench_print(&r4, json);
    msgpack_sbuffer_destroy(&g_ctl_sb);
    gser_frames_destroy(f);
    gser_msg_destroy(m);
}
