// The flattened form: layout, files, descriptors, ownership.
#include <cstdio>
#include <fcntl.h>
#include <string>
#include <thread>
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

// Empty input, in every form: a specific error, and (under the sanitizers)
// no null pointer handed to the C library on the way.
TEST(Flat, EmptyInputIsBadMagicEverywhere)
{
    auto ctx = make_ctx();
    gser_msg_t *back = nullptr;
    // An empty regular file (nothing is read, so no buffer exists).
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(gser_deserialize_fd(ctx.get(), fileno(f), nullptr, &back), GSER_ERR_BAD_MAGIC);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("empty input"), std::string::npos)
        << gser_context_get_last_error(ctx.get());
    fclose(f);
    // /dev/null: a character device that ends at once.
    int fd = open("/dev/null", O_RDONLY);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(gser_deserialize_fd(ctx.get(), fd, nullptr, &back), GSER_ERR_BAD_MAGIC);
    close(fd);
    // Memory: no bytes, with and without a pointer.
    static const unsigned char none[1] = {0};
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), nullptr, 0, nullptr, nullptr, nullptr, &back), GSER_ERR_BAD_MAGIC);
    EXPECT_EQ(gser_deserialize_flat(ctx.get(), none, 0, nullptr, nullptr, nullptr, &back), GSER_ERR_BAD_MAGIC);
    EXPECT_EQ(back, nullptr);
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

// ---- reading from descriptors: the prefix and the size table first ----------

namespace {

// A flattened prefix and size table for frames of these sizes (no frames).
std::string prefix_of(const std::vector<uint64_t> &sizes)
{
    std::string p("\x89GSER\r\n\x1a\x01\x00\x00\x00", 12);
    uint32_t n = (uint32_t)sizes.size();
    p.append(reinterpret_cast<const char *>(&n), 4); // little-endian host
    for (uint64_t s : sizes)
        p.append(reinterpret_cast<const char *>(&s), 8);
    return p;
}

struct TmpFile {
    std::string path;
    int fd = -1;
    explicit TmpFile(const std::string &bytes, off_t size = 0)
    {
        char tmpl[] = "/tmp/gser-flat-XXXXXX";
        fd = mkstemp(tmpl);
        path = tmpl;
        EXPECT_EQ(write(fd, bytes.data(), bytes.size()), (ssize_t)bytes.size());
        if (size) {
            EXPECT_EQ(ftruncate(fd, size), 0); // sparse: no disk, no memory
        }
        lseek(fd, 0, SEEK_SET);
    }
    ~TmpFile()
    {
        close(fd);
        unlink(path.c_str());
    }
    off_t offset() const { return lseek(fd, 0, SEEK_CUR); }
};

gser_status_t read_fd(gser_context_t *ctx, int fd, MsgPtr *out = nullptr)
{
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize_fd(ctx, fd, nullptr, &m);
    if (out)
        out->reset(m);
    else
        gser_msg_destroy(m);
    return st;
}

std::string flat_string(const gser_frames_t *f)
{
    auto v = flatten(f);
    return std::string(v.begin(), v.end());
}

} // namespace

TEST(FlatFd, HugeAndEndlessInputsStopAtTheirPrefix)
{
    auto ctx = make_ctx();
    // /dev/zero never ends: the magic is wrong after 8 bytes.
    int z = open("/dev/zero", O_RDONLY);
    ASSERT_GE(z, 0);
    EXPECT_EQ(read_fd(ctx.get(), z), GSER_ERR_BAD_MAGIC);
    close(z);

    // A 4 GiB sparse file of zeros: 8 bytes read.
    TmpFile zeros("", (off_t)4 << 30);
    EXPECT_EQ(read_fd(ctx.get(), zeros.fd), GSER_ERR_BAD_MAGIC);
    EXPECT_EQ(zeros.offset(), 8);

    // A valid prefix whose table promises 8 GiB in a 4 GiB file: refused
    // after the table, before a frame is read or allocated for.
    TmpFile lying(prefix_of({(uint64_t)8 << 30}), (off_t)4 << 30);
    EXPECT_EQ(read_fd(ctx.get(), lying.fd), GSER_ERR_TRUNCATED);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("needs 8589934616 bytes, the file holds 4294967296"),
              std::string::npos)
        << gser_context_get_last_error(ctx.get());
    EXPECT_EQ(lying.offset(), 24) << "the prefix and the size table, nothing more";

    // A table past the context's byte limit: refused at the table.
    TmpFile over(prefix_of({(uint64_t)1 << 41}));
    EXPECT_EQ(read_fd(ctx.get(), over.fd), GSER_ERR_LIMIT_BYTES);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("frame 0 declares 2199023255552 bytes"),
              std::string::npos)
        << gser_context_get_last_error(ctx.get());
}

TEST(FlatFd, APipeThatLiesCostsOnlyWhatItSent)
{
    // The table promises a 512 GiB header (below the 1 TiB limit); 100 kB
    // follow, then the writer hangs up. The reader's memory grows with what
    // arrives: no 512 GiB allocation (under ASan that would abort the test).
    auto ctx = make_ctx();
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    std::thread writer([fd = p[1]] {
        std::string bytes = prefix_of({(uint64_t)512 << 30}) + std::string(100000, 'x');
        for (size_t off = 0; off < bytes.size();) {
            ssize_t w = write(fd, bytes.data() + off, bytes.size() - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
    });
    EXPECT_EQ(read_fd(ctx.get(), p[0]), GSER_ERR_TRUNCATED);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("ends after 100024 bytes, its size table says "
                                                                     "549755813912"),
              std::string::npos)
        << gser_context_get_last_error(ctx.get());
    writer.join();
    close(p[0]);
}

TEST(FlatFd, StreamsCarryMessagesBackToBackAndFilesHoldExactlyOne)
{
    auto ctx = make_ctx();
    std::vector<double> a(100, 1.0), b(50, 2.0);
    auto ma = sample(ctx.get(), a), mb = sample(ctx.get(), b);
    auto fa = serialize(ctx.get(), ma.get()), fb = serialize(ctx.get(), mb.get());
    std::string two = flat_string(fa.get()) + flat_string(fb.get());
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    ASSERT_LT(two.size(), 65536u);
    ASSERT_EQ(write(p[1], two.data(), two.size()), (ssize_t)two.size());
    close(p[1]);
    MsgPtr first, second;
    ASSERT_EQ(read_fd(ctx.get(), p[0], &first), GSER_OK) << gser_context_get_last_error(ctx.get());
    ASSERT_EQ(read_fd(ctx.get(), p[0], &second), GSER_OK) << gser_context_get_last_error(ctx.get());
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(ma.get()), gser_msg_get_root(first.get())));
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(mb.get()), gser_msg_get_root(second.get())));
    EXPECT_EQ(read_fd(ctx.get(), p[0]), GSER_ERR_BAD_MAGIC) << "then the stream is empty";
    close(p[0]);

    // A file is one message: bytes after it are an error, found without reading them.
    TmpFile file(two);
    EXPECT_EQ(read_fd(ctx.get(), file.fd), GSER_ERR_FORMAT);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx.get())).find("trailing bytes in the file"), std::string::npos)
        << gser_context_get_last_error(ctx.get());
}
