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

// The frames' flattened form in a temporary file, flushed, at its start;
// nullptr if it could not be written.
FILE *flat_tmpfile(const gser_frames_t *frames)
{
    FILE *f = tmpfile();
    if (f && (gser_flat_write_file(gser_frames_get_array(frames), gser_frames_get_count(frames), f) != GSER_OK ||
              fflush(f) != 0)) {
        fclose(f);
        return nullptr;
    }
    if (f)
        rewind(f);
    return f;
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

    FILE *f = flat_tmpfile(frames.get());
    ASSERT_NE(f, nullptr);
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

// ---- writing with writev, reading into the final buffer or a mapping -------

namespace {

// n buffer frames of sizes 1, 2, ..., n (odd sizes: padding between them).
MsgPtr many_frames(gser_context_t *ctx, size_t n, std::vector<std::vector<unsigned char>> &keep)
{
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    gser_value_t *root, *v;
    gser_msg_new_list(m, &root);
    keep.resize(n);
    for (size_t i = 0; i < n; i++) {
        keep[i].resize(300 + i);
        for (size_t j = 0; j < keep[i].size(); j++)
            keep[i][j] = (unsigned char)(i * 7 + j);
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = keep[i].data();
        d.nbytes = keep[i].size();
        EXPECT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
        EXPECT_EQ(gser_list_append(root, v), GSER_OK);
    }
    gser_msg_set_root(m, root);
    return MsgPtr(m);
}

// A message of one buffer of n bytes (a frame of its own).
MsgPtr big_buffer(gser_context_t *ctx, std::vector<unsigned char> &bytes)
{
    for (size_t j = 0; j < bytes.size(); j++)
        bytes[j] = (unsigned char)(j * 13 + 5);
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_msg_create(ctx, &m), GSER_OK);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = bytes.data();
    d.nbytes = bytes.size();
    gser_value_t *v;
    EXPECT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    gser_msg_set_root(m, v);
    return MsgPtr(m);
}

gser_status_t read_fd_flags(gser_context_t *ctx, int fd, unsigned flags, MsgPtr *out = nullptr)
{
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = flags;
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize_fd(ctx, fd, &o, &m);
    if (out)
        out->reset(m);
    else
        gser_msg_destroy(m);
    return st;
}

gser_status_t read_flat(gser_context_t *ctx, const std::string &bytes)
{
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize_flat(ctx, bytes.data(), bytes.size(), nullptr, nullptr, nullptr, &m);
    gser_msg_destroy(m);
    return st;
}

gser_status_t read_pipe(gser_context_t *ctx, const std::string &bytes)
{
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    std::thread writer([&bytes, fd = p[1]] {
        for (size_t off = 0; off < bytes.size();) {
            ssize_t w = write(fd, bytes.data() + off, bytes.size() - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
    });
    gser_status_t st = read_fd(ctx, p[0]);
    close(p[0]); // a reader that stops early makes the writer's next write fail
    writer.join();
    return st;
}

const void *buffer_data(gser_msg_t *m)
{
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    EXPECT_EQ(gser_value_get_buffer(gser_msg_get_root(m), &d), GSER_OK);
    return d.data;
}

} // namespace

TEST(FlatFd, WritevCarriesMoreFramesThanOneCallTakes)
{
    // 1500 frames with padding: more iovecs than one writev takes, through a
    // pipe whose reader is slower than the writer (short writes).
    auto ctx = make_ctx();
    std::vector<std::vector<unsigned char>> keep;
    auto m = many_frames(ctx.get(), 1500, keep);
    auto frames = serialize(ctx.get(), m.get());
    ASSERT_EQ(gser_frames_get_count(frames.get()), 1501u);
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    gser_status_t wst = GSER_ERR_STATE;
    std::thread writer([&, fd = p[1]] {
        wst = gser_flat_write_fd(gser_frames_get_array(frames.get()), 1501, fd);
        close(fd);
    });
    MsgPtr back;
    ASSERT_EQ(read_fd(ctx.get(), p[0], &back), GSER_OK) << gser_context_get_last_error(ctx.get());
    writer.join();
    close(p[0]);
    EXPECT_EQ(wst, GSER_OK);
    EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back.get())));

    // The same bytes as the in-memory form, through every writer.
    auto flat = flatten(frames.get());
    TmpFile f("");
    ASSERT_EQ(gser_flat_write_fd(gser_frames_get_array(frames.get()), 1501, f.fd), GSER_OK);
    std::vector<unsigned char> got(flat.size() + 1);
    ASSERT_EQ(pread(f.fd, got.data(), got.size(), 0), (ssize_t)flat.size());
    got.resize(flat.size());
    EXPECT_EQ(got, flat);
    std::vector<unsigned char> pieces;
    size_t calls = 0;
    auto sink = [](void *arg, const void *data, size_t size) -> gser_status_t {
        auto *st = static_cast<std::pair<std::vector<unsigned char> *, size_t *> *>(arg);
        EXPECT_GT(size, 0u) << "no empty pieces";
        st->first->insert(st->first->end(), (const unsigned char *)data, (const unsigned char *)data + size);
        (*st->second)++;
        return GSER_OK;
    };
    std::pair<std::vector<unsigned char> *, size_t *> arg(&pieces, &calls);
    ASSERT_EQ(gser_flat_write_sink(gser_frames_get_array(frames.get()), 1501, sink, &arg), GSER_OK);
    EXPECT_EQ(pieces, flat);
    EXPECT_GT(calls, 1501u) << "frame by frame, from the frames' own memory";
    auto fail = [](void *, const void *, size_t) -> gser_status_t { return GSER_ERR_IO; };
    EXPECT_EQ(gser_flat_write_sink(gser_frames_get_array(frames.get()), 1501, fail, nullptr), GSER_ERR_IO);
    EXPECT_EQ(gser_flat_write_sink(gser_frames_get_array(frames.get()), 1501, nullptr, nullptr), GSER_ERR_INVALID_ARG);
}

TEST(FlatFd, AFullDiskIsAnIoErrorWithErrnoSet)
{
    int fd = open("/dev/full", O_WRONLY);
    if (fd < 0)
        GTEST_SKIP() << "no /dev/full";
    auto ctx = make_ctx();
    std::vector<double> vals(1000, 2.0);
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    errno = 0;
    EXPECT_EQ(gser_flat_write_fd(gser_frames_get_array(frames.get()), gser_frames_get_count(frames.get()), fd),
              GSER_ERR_IO);
    EXPECT_EQ(errno, ENOSPC);
    close(fd);
}

TEST(FlatFd, MappedFilesAreViewedNotRead)
{
    auto ctx = make_ctx();
    std::vector<unsigned char> bytes((size_t)3 << 20); // past the size read into a mapping
    auto m = big_buffer(ctx.get(), bytes);
    auto frames = serialize(ctx.get(), m.get());
    std::string flat = flat_string(frames.get());
    // The message starts at an offset that is not a page boundary.
    std::string junk(4096 + 8, 'j');
    TmpFile f(junk + flat);
    for (unsigned flags : {0u, (unsigned)GSER_DESERIALIZE_MMAP}) {
        SCOPED_TRACE(flags);
        ASSERT_EQ(lseek(f.fd, (off_t)junk.size(), SEEK_SET), (off_t)junk.size());
        MsgPtr back;
        ASSERT_EQ(read_fd_flags(ctx.get(), f.fd, flags, &back), GSER_OK) << gser_context_get_last_error(ctx.get());
        EXPECT_EQ(f.offset(), (off_t)(junk.size() + flat.size())) << "the offset ends past the message";
        EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(back.get())));
        // The frame's first byte, changed in the file: a mapping sees it, a
        // message that was read does not.
        auto *p = static_cast<const unsigned char *>(buffer_data(back.get()));
        size_t at = (size_t)(p - static_cast<const unsigned char *>(gser_msg_get_frames(back.get(), nullptr)[0].data)) +
                    junk.size() + 16 + 8 * 2; // frame 0 starts after the prefix and a table of 2
        unsigned char x = (unsigned char)(p[0] ^ 0xff);
        ASSERT_EQ(pwrite(f.fd, &x, 1, (off_t)at), 1);
        EXPECT_EQ(p[0] == x, flags == GSER_DESERIALIZE_MMAP);
        x ^= 0xff;
        ASSERT_EQ(pwrite(f.fd, &x, 1, (off_t)at), 1);
        // The values are writable: a mapping is private (the file stays).
        const_cast<unsigned char *>(p)[1] ^= 0x55;
        unsigned char in_file = 0;
        ASSERT_EQ(pread(f.fd, &in_file, 1, (off_t)at + 1), 1);
        EXPECT_EQ(in_file, bytes[1]);
        EXPECT_NE(p[1], bytes[1]);
    }
    // A pipe with the flag is read as without it.
    EXPECT_EQ(read_pipe(ctx.get(), flat), GSER_OK);
}

TEST(FlatFd, FilesPipesAndMappingsFailAsTheInMemoryDecoder)
{
    auto ctx = make_ctx();
    std::vector<double> vals(700);
    for (size_t i = 0; i < vals.size(); i++)
        vals[i] = (double)i;
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    const std::string good = flat_string(frames.get());
    std::vector<std::string> cases;
    for (size_t n = 0; n < good.size(); n += (n < 64 ? 1 : 37))
        cases.push_back(good.substr(0, n)); // truncated
    const size_t ntrunc = cases.size();
    cases.push_back(good + std::string(8, '\0')); // oversized
    cases.push_back(good + "x");
    for (size_t i = 0; i < good.size(); i += 11) { // corrupted
        std::string bad = good;
        bad[i] = (char)(bad[i] ^ 0x5a);
        cases.push_back(bad);
    }
    std::string huge = good;
    size_t nfr = gser_frames_get_count(frames.get());
    huge[16 + 8 * (nfr - 1) + 7] = 0x7f; // the last frame declares about 2^63 bytes
    cases.push_back(huge);
    size_t failures = 0;
    for (size_t c = 0; c < cases.size(); c++) {
        SCOPED_TRACE(c);
        const std::string &bytes = cases[c];
        gser_status_t want = read_flat(ctx.get(), bytes);
        failures += want != GSER_OK;
        TmpFile f(bytes);
        EXPECT_EQ(read_fd(ctx.get(), f.fd), want) << gser_context_get_last_error(ctx.get());
        lseek(f.fd, 0, SEEK_SET);
        EXPECT_EQ(read_fd_flags(ctx.get(), f.fd, GSER_DESERIALIZE_MMAP), want) << gser_context_get_last_error(ctx.get());
        // A stream has no end to compare with: the bytes after a message are the next one's.
        if (bytes.size() <= good.size()) {
            EXPECT_EQ(read_pipe(ctx.get(), bytes), want) << gser_context_get_last_error(ctx.get());
        }
    }
    EXPECT_GT(failures, ntrunc + 2); // every truncation, the oversized ones, some corruptions
}

TEST(FlatFd, GetNeedWalksThePrefixTheTableAndTheMessage)
{
    auto ctx = make_ctx();
    std::vector<double> vals(64, 1.0);
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    const std::string flat = flat_string(frames.get());
    size_t n = gser_frames_get_count(frames.get());
    uint64_t need = 0;
    ASSERT_EQ(gser_flat_get_need(ctx.get(), nullptr, 0, nullptr, &need), GSER_OK);
    EXPECT_EQ(need, 8u);
    ASSERT_EQ(gser_flat_get_need(ctx.get(), flat.data(), 8, nullptr, &need), GSER_OK);
    EXPECT_EQ(need, 16u);
    ASSERT_EQ(gser_flat_get_need(ctx.get(), flat.data(), 16, nullptr, &need), GSER_OK);
    EXPECT_EQ(need, 16 + 8 * n);
    ASSERT_EQ(gser_flat_get_need(ctx.get(), flat.data(), 16 + 8 * n, nullptr, &need), GSER_OK);
    EXPECT_EQ(need, flat.size());
    ASSERT_EQ(gser_flat_get_need(ctx.get(), flat.data(), flat.size(), nullptr, &need), GSER_OK);
    EXPECT_EQ(need, flat.size());
    EXPECT_EQ(gser_flat_get_need(ctx.get(), "\x89GSEX", 5, nullptr, &need), GSER_ERR_BAD_MAGIC);
    gser_limits_t lim = GSER_LIMITS_INIT;
    lim.max_bytes = 100;
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.limits = &lim;
    EXPECT_EQ(gser_flat_get_need(ctx.get(), flat.data(), 16 + 8 * n, &o, &need), GSER_ERR_LIMIT_BYTES);
    EXPECT_EQ(need, flat.size()) << "unchanged on failure";
}

TEST(FlatFd, LargeBuffersAreReusedOnceFreedAndWhatIsKeptIsBounded)
{
    // Messages above 32 MiB are read into mappings; a freed one is kept and
    // the next load that fits takes it (already faulted in), up to 128 MiB
    // kept in all.
    auto ctx = make_ctx();
    std::vector<double> vals((40u << 20) / sizeof(double));
    for (size_t i = 0; i < vals.size(); i++)
        vals[i] = (double)i;
    auto m = sample(ctx.get(), vals);
    auto frames = serialize(ctx.get(), m.get());
    FILE *f = flat_tmpfile(frames.get());
    ASSERT_NE(f, nullptr);
    auto load = [&]() {
        EXPECT_EQ(fseek(f, 0, SEEK_SET), 0);
        gser_msg_t *back = nullptr;
        EXPECT_EQ(gser_deserialize_fd(ctx.get(), fileno(f), nullptr, &back), GSER_OK)
            << gser_context_get_last_error(ctx.get());
        return MsgPtr(back);
    };
    gser_bigbuf_stats_reset();
    gser_bigbuf_stats_t st;
    {
        auto a = load();
        ASSERT_TRUE(a);
        EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(a.get())));
        gser_bigbuf_stats_get(&st);
        EXPECT_EQ(st.mapped, 1u);
        EXPECT_EQ(st.kept_bytes, 0u);
    }
    gser_bigbuf_stats_get(&st);
    EXPECT_GE(st.kept_bytes, vals.size() * sizeof(double)) << "freed with its message, and kept";
    {
        auto b = load();
        ASSERT_TRUE(b);
        EXPECT_TRUE(gser_value_equal(gser_msg_get_root(m.get()), gser_msg_get_root(b.get())))
            << "a kept buffer's old bytes are all overwritten";
        gser_bigbuf_stats_get(&st);
        EXPECT_EQ(st.mapped, 1u);
        EXPECT_EQ(st.reused, 1u);
        EXPECT_EQ(st.kept_bytes, 0u);
    }
    std::vector<MsgPtr> many;
    for (int i = 0; i < 5; i++)
        many.push_back(load()); // one reused, four mapped
    many.clear();
    gser_bigbuf_stats_get(&st);
    EXPECT_EQ(st.mapped + st.reused, 7u);
    EXPECT_GT(st.kept_bytes, 0u);
    EXPECT_LE(st.kept_bytes, (size_t)128 << 20) << "five 42 MiB buffers freed, at most 128 MiB kept";
    gser_bigbuf_stats_reset();
    gser_bigbuf_stats_get(&st);
    EXPECT_EQ(st.kept_bytes, 0u);
    fclose(f);
}
