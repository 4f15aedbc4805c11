// Shared helpers for the host tests: RAII handles, a context fixture, and a
// small registered type ("test.blob") with frames in its sub-tree.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gser/extension.h>
#include <gser/gser.h>
#include <gser/testing.h>

#define GSER_EXPECT(ctx, expected, expr)                                                                    \
    do {                                                                                                    \
        gser_status_t st_ = (expr);                                                                         \
        EXPECT_EQ(st_, (expected)) << #expr << " -> " << gser_status_str(st_) << ": "                       \
                                   << gser_context_get_last_error(ctx);                                         \
    } while (0)

#define GSER_OK_OR_FAIL(ctx, expr)                                                                          \
    do {                                                                                                    \
        gser_status_t st_ = (expr);                                                                         \
        ASSERT_EQ(st_, GSER_OK) << #expr << " -> " << gser_status_str(st_) << ": "                          \
                                << gser_context_get_last_error(ctx);                                            \
    } while (0)

struct MsgDeleter {
    void operator()(gser_msg_t *m) const { gser_msg_destroy(m); }
};
struct FramesDeleter {
    void operator()(gser_frames_t *f) const { gser_frames_destroy(f); }
};
struct CtxDeleter {
    void operator()(gser_context_t *c) const { gser_context_destroy(c); }
};
using MsgPtr = std::unique_ptr<gser_msg_t, MsgDeleter>;
using FramesPtr = std::unique_ptr<gser_frames_t, FramesDeleter>;
using CtxPtr = std::unique_ptr<gser_context_t, CtxDeleter>;

inline CtxPtr make_ctx(const gser_context_options_t *base = nullptr)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    if (base)
        o = *base;
    if (o.trace == 0)
        o.trace = -1; // tests decide about tracing explicitly
    gser_context_t *c = nullptr;
    EXPECT_EQ(gser_context_create(&o, &c), GSER_OK);
    return CtxPtr(c);
}

// The test type: an id, a name and a vector of doubles (sent as a buffer).
struct Blob {
    int64_t id = 0;
    std::string name;
    std::vector<double> data;
};

struct BlobStats {
    int serialized = 0;
    int deserialized = 0;
    int destroyed = 0;
};

inline gser_status_t blob_serialize(gser_context_t *, const void *obj, gser_writer_t *w, void *ud)
{
    auto *b = static_cast<const Blob *>(obj);
    if (ud)
        static_cast<BlobStats *>(ud)->serialized++;
    gser_msg_t *m = gser_writer_get_msg(w);
    gser_value_t *map, *v;
    gser_status_t st;
    if ((st = gser_msg_new_map(m, &map)) || (st = gser_msg_new_int(m, b->id, &v)) ||
        (st = gser_map_put_cstr(map, "id", v)) || (st = gser_msg_new_str(m, b->name.data(), b->name.size(), &v)) ||
        (st = gser_map_put_cstr(map, "name", v)))
        return st;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = b->data.data();
    d.nbytes = b->data.size() * sizeof(double);
    d.dtype = GSER_DTYPE_FLOAT64;
    if ((st = gser_msg_new_buffer(m, &d, &v)) || (st = gser_map_put_cstr(map, "data", v)))
        return st;
    if (b->id < 0)
        return gser_writer_fail(w, GSER_ERR_INVALID_ARG, "blob id %lld is negative", (long long)b->id);
    return gser_writer_set_root(w, map);
}

inline gser_status_t blob_deserialize(gser_context_t *, gser_reader_t *r, void **out, void *ud)
{
    gser_value_t *t = gser_reader_get_tree(r);
    gser_value_t *id, *name, *data;
    if (gser_map_find_cstr(t, "id", &id) || gser_map_find_cstr(t, "name", &name) ||
        gser_map_find_cstr(t, "data", &data))
        return gser_reader_fail(r, GSER_ERR_FORMAT, "blob needs id, name and data");
    auto b = std::make_unique<Blob>();
    const char *s;
    size_t n;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    if (gser_value_get_int(id, &b->id) || gser_value_get_str(name, &s, &n) || gser_value_get_buffer(data, &d) ||
        d.strides)
        return gser_reader_fail(r, GSER_ERR_FORMAT, "blob fields have the wrong kinds");
    b->name.assign(s, n);
    b->data.resize(d.nbytes / sizeof(double));
    if (d.nbytes)
        std::memcpy(b->data.data(), d.data, d.nbytes);
    if (ud)
        static_cast<BlobStats *>(ud)->deserialized++;
    *out = b.release();
    return GSER_OK;
}

inline void blob_destroy(void *obj, void *ud)
{
    if (ud)
        static_cast<BlobStats *>(ud)->destroyed++;
    delete static_cast<Blob *>(obj);
}

// Register "test.blob" with the given families.
inline void register_blob(gser_context_t *ctx, BlobStats *stats, std::vector<const char *> families,
                          uint32_t version = 1, uint32_t min_read = 0)
{
    gser_type_options_t to = GSER_TYPE_OPTIONS_INIT;
    to.destroy = blob_destroy;
    to.user_data = stats;
    to.min_read_version = min_read;
    ASSERT_EQ(gser_type_register(ctx, "test.blob", version, &to), GSER_OK) << gser_context_get_last_error(ctx);
    for (const char *f : families)
        ASSERT_EQ(gser_type_add_family(ctx, "test.blob", f, blob_serialize, blob_deserialize), GSER_OK)
            << gser_context_get_last_error(ctx);
}

inline FramesPtr serialize(gser_context_t *ctx, gser_msg_t *msg, const gser_serialize_options_t *o = nullptr)
{
    gser_frames_t *f = nullptr;
    gser_status_t st = gser_serialize(ctx, msg, o, &f);
    EXPECT_EQ(st, GSER_OK) << gser_status_str(st) << ": " << gser_context_get_last_error(ctx);
    return FramesPtr(f);
}

inline MsgPtr deserialize(gser_context_t *ctx, const gser_frames_t *f, unsigned flags = 0)
{
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = flags;
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize(ctx, gser_frames_get_array(f), gser_frames_get_count(f), &o, &m);
    EXPECT_EQ(st, GSER_OK) << gser_status_str(st) << ": " << gser_context_get_last_error(ctx);
    return MsgPtr(m);
}

inline std::vector<unsigned char> flatten(const gser_frames_t *f)
{
    size_t n = 0, w = 0;
    EXPECT_EQ(gser_flat_size(gser_frames_get_array(f), gser_frames_get_count(f), &n), GSER_OK);
    std::vector<unsigned char> buf(n);
    EXPECT_EQ(gser_flat_write(gser_frames_get_array(f), gser_frames_get_count(f), buf.data(), n, &w), GSER_OK);
    EXPECT_EQ(w, n);
    return buf;
}

inline std::string header_bytes(const gser_frames_t *f)
{
    const gser_frame_t &h = gser_frames_get_array(f)[0];
    return std::string(static_cast<const char *>(h.data), h.size);
}

// A message whose root is the typed object "test.blob" (registered by the caller).
inline MsgPtr blob_msg(gser_context_t *ctx, Blob *blob)
{
    gser_msg_t *m = nullptr;
    gser_value_t *v = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    EXPECT_EQ(gser_msg_new_object(m, "test.blob", blob, &v), GSER_OK);
    gser_msg_set_root(m, v);
    return MsgPtr(m);
}

// A context that traces to f.
inline CtxPtr make_trace_ctx(FILE *f)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace = 1;
    o.trace_stream = f;
    return make_ctx(&o);
}

// Everything written to f so far (a tmpfile used as a trace stream).
inline std::string read_all(FILE *f)
{
    fflush(f);
    rewind(f);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        out.append(buf, n);
    return out;
}

class CtxTest : public ::testing::Test {
  protected:
    void SetUp() override { ctx_ = make_ctx(); }
    gser_context_t *ctx() { return ctx_.get(); }
    MsgPtr new_msg()
    {
        gser_msg_t *m = nullptr;
        EXPECT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
        return MsgPtr(m);
    }
    CtxPtr ctx_;
};
