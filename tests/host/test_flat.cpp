// The flattened form: layout, files, descriptors, ownership.
#include <cstdio>
#include <unistd.h>

#include "host/common.hpp"

namespace {

MsgPtr sample(gser_context_t *ctx, std::vector<double> &vals)
{
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    gser_value_t *root, *v;
    gser_msg_new_map(m, &root);
    gser_msg_new_array(m, GSER_KIND_FLOAT, vals.data(), vals.size(), 0, &v);
    gser_map_put_cstr(root, "vals", v);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    static const char odd[13] = "thirteen....";
    d.data = odd;
    d.nbytes = 13; // not a multiple of 8: padding follows it
    gser_msg_new_buffer(m, &d, &v);
    gser_map_put_cstr(root, "odd", v);
    gser_msg_set_root(m, root);
    return MsgPtr(m);
}

uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

} // namespace

TEST(Flat, LayoutIsTheDocumentedOne)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.inline_max = 8; // so the 13-byte buffer is a frame
    auto ctx = make_ctx(&o);
    std::vector<double> vals(100, 4.0);
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 3u);
    auto flat = flatten(frames.get());
    const unsigned char magic[8] = {0x89, 'G', 'S', 'E', 'R', 0x0d, 0x0a, 0x1a};
    ASSERT_GE(flat.size(), 16u);
    EXPECT_EQ(std::memcmp(flat.data(), magic, 8), 0);
    EXPECT_EQ(flat[8] | flat[9] << 8, 1) << "version 1, little-endian";
    EXPECT_EQ(flat[10] | flat[11] << 8, 0) << "flags";
    EXPECT_EQ(flat[12] | flat[13] << 8 | flat[14] << 16 | flat[15] << 24, 3);
    size_t off = 16 + 8 * 3;
    for (size_t i = 0; i < 3; i++) {
        const gser_frame_t &f = gser_frames_get_array(frames.get())[i];
        EXPECT_EQ(le64(&flat[16 + 8 * i]), f.size);
        EXPECT_EQ(off % 8, 0u) << "frames start 8-byte aligned";
        EXPECT_EQ(std::memcmp(&flat[off], f.data, f.size), 0);
        off += f.size;
        while (off % 8) {
            EXPECT_EQ(flat[off], 0) << "zero padding";
            off++;
        }
    }
    EXPECT_EQ(off, flat.size());

    // Parsing it back is zero-copy: the array points into the flat buffer.
    gser_msg_t *back = nullptr;
    ASSERT_EQ(gser_deserialize_flat(ctx.get(), flat.data(), flat.size(), nullptr, nullptr, nullptr, &back), GSER_OK);
    gser_value_t *v;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(back), "vals", &v), GSER_OK);
    gser_kind_t k;
    const void *data;
    size_t count;
    ASSERT_EQ(gser_list_get_array(v, &k, &data, &count), GSER_OK);
    EXPECT_GE(static_cast<const unsigned char *>(data), flat.data());
    EXPECT_LT(static_cast<const unsigned char *>(data), flat.data() + flat.size());
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back)));
    size_t nfr = 0;
    const gser_frame_t *fr = gser_msg_get_frames(back, &nfr);
    EXPECT_EQ(nfr, 3u);
    EXPECT_EQ(fr[2].size, 13u);
    gser_msg_destroy(back);

    // Too small a destination is an error, not an overflow.
    size_t w = 0;
    EXPECT_EQ(gser_flat_write(gser_frames_get_array(frames.get()), 3, flat.data(), flat.size() - 1, &w),
              GSER_ERR_INVALID_ARG);
}

TEST(Flat, FilesAndDescriptors)
{
    auto ctx = make_ctx();
    std::vector<double> vals(5000);
    for (size_t i = 0; i < vals.size(); i++)
        vals[i] = (double)i / 3.0;
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());

    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gser_flat_write_file(gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), f), GSER_OK);
    fflush(f);
    rewind(f);
    gser_msg_t *back = nullptr;
    ASSERT_EQ(gser_deserialize_fd(ctx.get(), fileno(f), nullptr, &back), GSER_OK) << gser_context_get_last_error(ctx.get());
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back)));
    gser_msg_destroy(back);
    fclose(f);

    int p[2];
    ASSERT_EQ(pipe(p), 0);
    size_t size = 0;
    ASSERT_EQ(gser_flat_size(gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), &size), GSER_OK);
    ASSERT_LT(size, 65536u) << "fits in the pipe buffer";
    ASSERT_EQ(gser_flat_write_fd(gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), p[1]), GSER_OK);
    close(p[1]);
    ASSERT_EQ(gser_deserialize_fd(ctx.get(), p[0], nullptr, &back), GSER_OK) << gser_context_get_last_error(ctx.get());
    close(p[0]);
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back)));
    gser_msg_destroy(back);

    // An empty input is not a message.
    ASSERT_EQ(pipe(p), 0);
    close(p[1]);
    EXPECT_EQ(gser_deserialize_fd(ctx.get(), p[0], nullptr, &back), GSER_ERR_BAD_MAGIC);
    close(p[0]);
    EXPECT_EQ(gser_deserialize_fd(ctx.get(), -1, nullptr, &back), GSER_ERR_INVALID_ARG);
}

static void release_flat(void *data, void *arg)
{
    auto *calls = static_cast<std::vector<const void *> *>(arg);
    calls->push_back(data);
}

TEST(Flat, OwnershipOfTheBufferPassesOnSuccessOnly)
{
    auto ctx = make_ctx();
    std::vector<double> vals(64, 1.0);
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    auto flat = flatten(frames.get());
    std::vector<const void *> calls;
    gser_msg_t *back = nullptr;
    ASSERT_EQ(gser_deserialize_flat(ctx.get(), flat.data(), flat.size(), release_flat, &calls, nullptr, &back),
              GSER_OK);
    EXPECT_TRUE(calls.empty());
    gser_msg_destroy(back);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0], flat.data());
    calls.clear();
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), flat.data(), flat.size() - 8, release_flat, &calls, nullptr, &back),
              GSER_ERR_TRUNCATED);
    EXPECT_TRUE(calls.empty());
}

TEST(Flat, PrefixErrorsAreSpecific)
{
    auto ctx = make_ctx();
    std::vector<double> vals(64, 1.0);
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    auto flat = flatten(frames.get());
    gser_msg_t *back = nullptr;
    auto bad = flat;
    bad[8] = 2;
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), bad.data(), bad.size(), nullptr, nullptr, nullptr, &back),
              GSER_ERR_WIRE_VERSION);
    bad = flat;
    bad[10] = 1;
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), bad.data(), bad.size(), nullptr, nullptr, nullptr, &back),
              GSER_ERR_FORMAT);
    bad = flat;
    bad[12] = 0;
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), bad.data(), bad.size(), nullptr, nullptr, nullptr, &back),
              GSER_ERR_FORMAT);
    bad = flat;
    bad[15] = 0x7f; // 2 billion frames
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), bad.data(), bad.size(), nullptr, nullptr, nullptr, &back),
              GSER_ERR_LIMIT_FRAMES);
    bad = flat;
    bad[0] = 'X';
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), bad.data(), bad.size(), nullptr, nullptr, nullptr, &back),
              GSER_ERR_BAD_MAGIC);
    EXPECT_EQ(back, nullptr);
}
