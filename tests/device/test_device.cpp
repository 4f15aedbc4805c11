// The device layer, run over every memory backend: plain host memory, the
// emulated device (always), and CUDA when a GPU is present (skipped visibly
// otherwise).
#include <algorithm>
#include <numeric>
#include <random>

#include "host/common.hpp"

#include "device/plan.h"

namespace {

struct Backend {
    const char *name;       // "host", "emulated", "cuda"
    gser_memory_t memory;   // where the test's buffers live
};

std::ostream &operator<<(std::ostream &os, const Backend &b)
{
    return os << b.name;
}

// Device memory (or host memory for the "host" backend) owned by a test.
struct Mem {
    gser_context_t *ctx = nullptr;
    gser_memory_t memory = GSER_MEMORY_HOST;
    void *base = nullptr;
    size_t size = 0;
    Mem() = default;
    Mem(const Mem &) = delete;
    Mem &operator=(const Mem &) = delete;
    ~Mem()
    {
        if (memory == GSER_MEMORY_DEVICE)
            gser_device_free(ctx, base, size, nullptr);
        else
            free(base);
    }
};

class DeviceTest : public ::testing::TestWithParam<Backend> {
  public:
    void SetUp() override
    {
        const Backend &b = GetParam();
        gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
        o.trace = -1;
        o.device_backend = b.memory == GSER_MEMORY_DEVICE ? b.name : "none";
        o.pack_max = 4096;
        gser_context_t *c = nullptr;
        gser_status_t st = gser_context_create(&o, &c);
        if (st != GSER_OK && std::string(b.name) == "cuda")
            GTEST_SKIP() << "no usable CUDA device here: " << gser_context_get_last_error(nullptr);
        ASSERT_EQ(st, GSER_OK) << gser_context_get_last_error(nullptr);
        ctx_.reset(c);
        EXPECT_STREQ(gser_context_get_device_backend(c), b.memory == GSER_MEMORY_DEVICE ? b.name : "none");
    }

    gser_context_t *ctx() { return ctx_.get(); }
    gser_memory_t mem() const { return GetParam().memory; }

    // size bytes at an address offset bytes past an aligned allocation.
    std::unique_ptr<Mem> alloc(size_t size, size_t offset = 0)
    {
        auto m = std::make_unique<Mem>();
        m->ctx = ctx();
        m->memory = mem();
        m->size = size + offset + 64;
        if (mem() == GSER_MEMORY_DEVICE) {
            EXPECT_EQ(gser_device_alloc(ctx(), m->size, nullptr, &m->base), GSER_OK) << gser_context_get_last_error(ctx());
        } else {
            m->base = malloc(m->size);
        }
        return m;
    }

    void put(void *dst, const std::vector<unsigned char> &src)
    {
        ASSERT_EQ(gser_device_memcpy(ctx(), dst, mem(), src.data(), GSER_MEMORY_HOST, src.size(), nullptr), GSER_OK)
            << gser_context_get_last_error(ctx());
        if (mem() == GSER_MEMORY_DEVICE) {
            ASSERT_EQ(gser_stream_wait(ctx(), nullptr), GSER_OK);
        }
    }

    std::vector<unsigned char> get(const void *src, gser_memory_t from, size_t n)
    {
        std::vector<unsigned char> out(n, 0xEE);
        EXPECT_EQ(gser_device_memcpy(ctx(), out.data(), GSER_MEMORY_HOST, src, from, n, nullptr), GSER_OK)
            << gser_context_get_last_error(ctx());
        if (from == GSER_MEMORY_DEVICE) {
            EXPECT_EQ(gser_stream_wait(ctx(), nullptr), GSER_OK);
        }
        return out;
    }

    CtxPtr ctx_;
};

std::vector<unsigned char> pattern(size_t n, uint32_t seed)
{
    std::vector<unsigned char> v(n);
    std::mt19937 rng(seed);
    for (auto &b : v)
        b = (unsigned char)rng();
    return v;
}

struct Sent {
    std::unique_ptr<Mem> mem;
    void *data;
    std::vector<unsigned char> bytes;
};

// A message whose root is a list of buffers with random sizes (0 included)
// and alignments, pattern-filled, in the backend's memory.
void make_buffers(DeviceTest *t, gser_msg_t *m, std::vector<Sent> &sent, size_t count, size_t max_size,
                  uint32_t seed)
{
    std::mt19937 rng(seed);
    gser_value_t *root;
    ASSERT_EQ(gser_msg_new_list(m, &root), GSER_OK);
    for (size_t i = 0; i < count; i++) {
        size_t size = rng() % 7 == 0 ? 0 : rng() % (max_size + 1);
        size_t offset = rng() % 16;
        Sent s;
        s.mem = t->alloc(size, offset);
        s.data = (char *)s.mem->base + offset;
        s.bytes = pattern(size, seed * 1000 + (uint32_t)i);
        t->put(s.data, s.bytes);
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = s.data;
        d.nbytes = size;
        d.memory = t->mem();
        gser_value_t *v;
        ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK) << gser_context_get_last_error(t->ctx());
        ASSERT_EQ(gser_list_append(root, v), GSER_OK);
        sent.push_back(std::move(s));
    }
    ASSERT_EQ(gser_msg_set_root(m, root), GSER_OK);
}

} // namespace

TEST_P(DeviceTest, DeviceFamilyPacksSmallBuffersAndKeepsLargeOnesZeroCopy)
{
    for (uint32_t seed : {1u, 2u, 3u}) {
        gser_msg_t *m;
        ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
        MsgPtr mp(m);
        std::vector<Sent> sent;
        make_buffers(this, m, sent, 60, 9000, seed);
        auto frames = serialize(ctx(), m);
        ASSERT_TRUE(frames);
        ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
        const gser_frame_t *fr = gser_frames_get_array(frames.get());
        size_t nf = gser_frames_get_count(frames.get());
        size_t large = 0;
        for (auto &s : sent)
            large += s.bytes.size() >= 4096 || (mem() == GSER_MEMORY_HOST && s.bytes.size() >= 256);
        if (mem() == GSER_MEMORY_DEVICE) {
            // One packed frame for all small buffers plus one frame per large one.
            EXPECT_EQ(nf, 1 + 1 + large) << "seed " << seed;
            for (size_t i = 1; i < nf; i++)
                EXPECT_EQ(fr[i].memory, GSER_MEMORY_DEVICE);
            for (auto &s : sent) {
                if (s.bytes.size() < 4096)
                    continue;
                bool zero_copy = false;
                for (size_t i = 1; i < nf; i++)
                    zero_copy |= fr[i].data == s.data;
                EXPECT_TRUE(zero_copy) << "a large buffer is its own frame, not a copy";
            }
        }
        if (mem() == GSER_MEMORY_DEVICE) {
            // The packed frame holds the small buffers at 64-byte offsets and
            // zeros between them, never stale memory.
            size_t pi = 1; // the packed frame: the one that is no sent buffer
            while (pi < nf && std::any_of(sent.begin(), sent.end(), [&](const Sent &x) { return x.data == fr[pi].data; }))
                pi++;
            ASSERT_LT(pi, nf);
            const gser_frame_t &packed = fr[pi];
            auto bytes = get(packed.data, packed.memory, packed.size);
            std::vector<unsigned char> want(packed.size, 0);
            size_t off = 0;
            for (auto &sb : sent) {
                if (sb.bytes.empty() || sb.bytes.size() >= 4096)
                    continue;
                std::memcpy(&want[off], sb.bytes.data(), sb.bytes.size());
                off = (off + sb.bytes.size() + 63) / 64 * 64;
            }
            EXPECT_EQ(bytes, want) << "seed " << seed;
        }
        for (unsigned flags : {0u, (unsigned)GSER_DESERIALIZE_SCATTER}) {
            if (flags && mem() != GSER_MEMORY_DEVICE)
                continue;
            auto back = deserialize(ctx(), frames.get(), flags);
            ASSERT_TRUE(back);
            gser_value_t *root = gser_msg_get_root(back.get());
            ASSERT_EQ(gser_value_get_len(root), sent.size());
            for (size_t i = 0; i < sent.size(); i++) {
                gser_value_t *v;
                gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
                ASSERT_EQ(gser_list_get(root, i, &v), GSER_OK);
                ASSERT_EQ(gser_value_get_buffer(v, &d), GSER_OK);
                ASSERT_EQ(d.nbytes, sent[i].bytes.size());
                if (!d.nbytes)
                    continue;
                EXPECT_EQ(d.memory, mem());
                if (flags & GSER_DESERIALIZE_SCATTER) {
                    ASSERT_NE(d.event, nullptr) << "scattered buffers carry the message's event";
                    for (size_t f = 1; f < nf; f++)
                        EXPECT_FALSE(d.data >= fr[f].data && (const char *)d.data < (const char *)fr[f].data + fr[f].size)
                            << "a scattered buffer has its own allocation";
                }
                ASSERT_EQ(get(d.data, d.memory, d.nbytes), sent[i].bytes) << "buffer " << i << " seed " << seed;
            }
        }
    }
}

TEST_P(DeviceTest, PackThresholdBoundaries)
{
    for (size_t size : {4095u, 4096u}) {
        gser_msg_t *m;
        ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
        MsgPtr mp(m);
        auto buf = alloc(size);
        auto bytes = pattern(size, (uint32_t)size);
        put(buf->base, bytes);
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = buf->base;
        d.nbytes = size;
        d.memory = mem();
        gser_value_t *v;
        ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
        gser_msg_set_root(m, v);
        auto frames = serialize(ctx(), m);
        ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
        const gser_frame_t &f = gser_frames_get_array(frames.get())[1];
        if (mem() == GSER_MEMORY_DEVICE) {
            EXPECT_EQ(f.data == buf->base, size >= 4096) << size << ": packed below pack_max, zero-copy from it";
        }
        ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
        EXPECT_EQ(get(f.data, f.memory, size), bytes);
    }
}

TEST_P(DeviceTest, HostFamilyStagesDeviceBuffersInOneHostFrame)
{
    if (mem() != GSER_MEMORY_DEVICE)
        GTEST_SKIP() << "host buffers take no staging";
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    std::vector<Sent> sent;
    make_buffers(this, m, sent, 25, 20000, 7); // small and large alike
    const char *const host_only[] = {"host"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = host_only;
    so.nfamilies = 1;
    auto frames = serialize(ctx(), m, &so);
    ASSERT_TRUE(frames);
    ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u) << "every device buffer in one pinned host frame";
    EXPECT_EQ(gser_frames_get_array(frames.get())[1].memory, GSER_MEMORY_HOST);

    // Through bytes, as a file would carry it.
    auto flat = flatten(frames.get());
    gser_msg_t *h = nullptr;
    ASSERT_EQ(gser_deserialize_flat(ctx(), flat.data(), flat.size(), nullptr, nullptr, nullptr, &h), GSER_OK);
    MsgPtr hp(h);
    gser_deserialize_options_t restore = GSER_DESERIALIZE_OPTIONS_INIT;
    restore.flags = GSER_DESERIALIZE_RESTORE_DEVICE;
    gser_msg_t *dv = nullptr;
    ASSERT_EQ(gser_deserialize_flat(ctx(), flat.data(), flat.size(), nullptr, nullptr, &restore, &dv), GSER_OK)
        << gser_context_get_last_error(ctx());
    MsgPtr dp(dv);
    for (size_t i = 0; i < sent.size(); i++) {
        gser_value_t *v;
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        ASSERT_EQ(gser_list_get(gser_msg_get_root(h), i, &v), GSER_OK);
        ASSERT_EQ(gser_value_get_buffer(v, &d), GSER_OK);
        if (!d.nbytes) {
            EXPECT_EQ(d.memory, GSER_MEMORY_DEVICE) << "an empty device buffer stays a device buffer";
            continue;
        }
        EXPECT_EQ(d.memory, GSER_MEMORY_HOST) << "rebuilt in host memory";
        ASSERT_EQ(std::vector<unsigned char>((const unsigned char *)d.data, (const unsigned char *)d.data + d.nbytes),
                  sent[i].bytes);
        ASSERT_EQ(gser_list_get(gser_msg_get_root(dv), i, &v), GSER_OK);
        ASSERT_EQ(gser_value_get_buffer(v, &d), GSER_OK);
        if (!d.nbytes)
            continue;
        EXPECT_EQ(d.memory, GSER_MEMORY_DEVICE) << "or back on the device";
        EXPECT_NE(d.event, nullptr);
        ASSERT_EQ(get(d.data, d.memory, d.nbytes), sent[i].bytes) << i;
    }
}

// gser_serialize_flat writes what gser_serialize and gser_flat_write write,
// byte for byte, with each device buffer copied once, by one batch, straight
// into the flattened buffer: no device staging, no second copy.
static void *vec_alloc(void *arg, size_t size)
{
    auto *v = static_cast<std::vector<unsigned char> *>(arg);
    v->assign(size, 0xAB); // not zeros: the gaps must be written
    return v->data();
}

TEST_P(DeviceTest, SerializeFlatCopiesEachDeviceBufferOnceIntoItsPlace)
{
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    std::vector<Sent> sent;
    make_buffers(this, m, sent, 40, 20000, 11);
    // A compressible host buffer beside them: compressed, while the device
    // buffers' frame (not written yet when frames are compressed) is not.
    std::vector<unsigned char> zeros(1 << 16, 0);
    gser_buffer_desc_t hd = GSER_BUFFER_DESC_INIT;
    hd.data = zeros.data();
    hd.nbytes = zeros.size();
    gser_value_t *hv;
    ASSERT_EQ(gser_msg_new_buffer(m, &hd, &hv), GSER_OK);
    ASSERT_EQ(gser_list_append(gser_msg_get_root(m), hv), GSER_OK);
    const char *const host_only[] = {"host"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = host_only;
    so.nfamilies = 1;
    so.compression = GSER_COMPRESSION_LZ4;
    auto frames = serialize(ctx(), m, &so);
    ASSERT_TRUE(frames);
    ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
    auto want = flatten(frames.get());
    frames.reset();

    size_t n_dev = 0, dev_bytes = 0;
    for (const Sent &s : sent)
        if (!s.bytes.empty())
            n_dev++, dev_bytes += s.bytes.size();
    bool counted = std::string(GetParam().name) == "emulated";
    gser_device_stats_reset();
    std::vector<unsigned char> got;
    size_t written = 0;
    ASSERT_EQ(gser_serialize_flat(ctx(), m, &so, vec_alloc, &got, &written), GSER_OK)
        << gser_context_get_last_error(ctx());
    ASSERT_EQ(written, got.size());
    EXPECT_EQ(got, want) << "the same flattened form as serialize + flat_write";
    if (counted) {
        gser_device_stats_t st;
        gser_device_stats_get(&st);
        EXPECT_EQ(st.d2h_ops, 1u) << "one batch for the whole object";
        EXPECT_EQ(st.d2h_copies, n_dev) << "one copy per device buffer";
        EXPECT_EQ(st.d2h_bytes, dev_bytes);
        EXPECT_EQ(st.d2d_ops, 0u) << "no staging on the device";
        EXPECT_EQ(st.d2d_bytes, 0u);
    }

    // The frames path for comparison: a gather on the device, then a copy to host.
    if (counted) {
        gser_device_stats_reset();
        auto again = serialize(ctx(), m, &so);
        ASSERT_TRUE(again);
        ASSERT_EQ(gser_frames_wait(again.get()), GSER_OK);
        gser_device_stats_t st;
        gser_device_stats_get(&st);
        EXPECT_EQ(st.d2d_bytes, dev_bytes);
        EXPECT_EQ(st.d2h_ops, 1u);
    }

    // Device frames have no flattened form: a clean error, nothing allocated.
    if (mem() == GSER_MEMORY_DEVICE) {
        const char *const dev_only[] = {"device"};
        gser_serialize_options_t dso = GSER_SERIALIZE_OPTIONS_INIT;
        dso.families = dev_only;
        dso.nfamilies = 1;
        std::vector<unsigned char> none;
        EXPECT_EQ(gser_serialize_flat(ctx(), m, &dso, vec_alloc, &none, &written), GSER_ERR_UNSUPPORTED);
        EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("gser_serialize_flat"), std::string::npos);
        EXPECT_TRUE(none.empty());
    }
    EXPECT_EQ(gser_serialize_flat(ctx(), m, &so, nullptr, nullptr, &written), GSER_ERR_INVALID_ARG);
}

// A type whose serializer puts device buffers in its sub-tree.
struct DevBlob {
    void *data;
    size_t n;
    gser_memory_t memory;
};

static gser_status_t devblob_ser(gser_context_t *, const void *obj, gser_writer_t *w, void *)
{
    auto *b = static_cast<const DevBlob *>(obj);
    gser_msg_t *m = gser_writer_get_msg(w);
    gser_value_t *l, *v;
    gser_msg_new_list(m, &l);
    for (int half = 0; half < 2; half++) {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        d.data = (char *)b->data + half * (b->n / 2);
        d.nbytes = b->n / 2;
        d.memory = b->memory;
        if (gser_msg_new_buffer(m, &d, &v) || gser_list_append(l, v))
            return GSER_ERR_NO_MEMORY;
    }
    return gser_writer_set_root(w, l);
}

static gser_status_t devblob_de(gser_context_t *, gser_reader_t *r, void **out, void *)
{
    gser_value_t *v;
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    if (gser_list_get(gser_reader_get_tree(r), 0, &v) || gser_value_get_buffer(v, &d))
        return GSER_ERR_FORMAT;
    *out = new DevBlob{const_cast<void *>(d.data), d.nbytes * 2, d.memory};
    return GSER_OK;
}

TEST_P(DeviceTest, MixedMessagesWithObjectsKeepObjectFramesTogether)
{
    ASSERT_EQ(gser_type_register(ctx(), "test.devblob", 1, nullptr), GSER_OK);
    ASSERT_EQ(gser_type_add_family(ctx(), "test.devblob", "device", devblob_ser, devblob_de), GSER_OK);
    ASSERT_EQ(gser_type_add_family(ctx(), "test.devblob", "host", devblob_ser, devblob_de), GSER_OK);
    auto a = alloc(1000), b = alloc(2000);
    auto pa = pattern(1000, 11), pb = pattern(2000, 12);
    put(a->base, pa);
    put(b->base, pb);
    DevBlob blob{b->base, 2000, mem()};
    std::vector<double> host(500, 2.5);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *root, *v;
    gser_msg_new_map(m, &root);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = a->base;
    d.nbytes = 1000;
    d.memory = mem();
    gser_msg_new_buffer(m, &d, &v), gser_map_put_cstr(root, "small", v);
    gser_buffer_desc_t h = GSER_BUFFER_DESC_INIT;
    h.data = host.data();
    h.nbytes = host.size() * 8;
    h.dtype = GSER_DTYPE_FLOAT64;
    gser_msg_new_buffer(m, &h, &v), gser_map_put_cstr(root, "host", v);
    ASSERT_EQ(gser_msg_new_object(m, "test.devblob", &blob, &v), GSER_OK);
    gser_map_put_cstr(root, "obj", v);
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx(), m);
    ASSERT_TRUE(frames);
    ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);

    // A scheduler forwards the object without decoding it: the object's own
    // packed frame travels with it.
    auto kept = deserialize(ctx(), frames.get(), GSER_DESERIALIZE_KEEP_SERIALIZED);
    gser_value_t *obj;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(kept.get()), "obj", &obj), GSER_OK);
    gser_serialized_info_t info = GSER_SERIALIZED_INFO_INIT;
    ASSERT_EQ(gser_value_get_serialized(obj, &info), GSER_OK);
    EXPECT_EQ(info.nframes, mem() == GSER_MEMORY_DEVICE ? 1u : 2u)
        << "device: both halves packed in the object's own frame";
    auto fwd = serialize(ctx(), kept.get());
    EXPECT_EQ(header_bytes(fwd.get()), header_bytes(frames.get()));

    auto back = deserialize(ctx(), fwd.get());
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(back.get()), "obj", &obj), GSER_OK);
    void *p;
    ASSERT_EQ(gser_value_take_object(obj, &p), GSER_OK);
    std::unique_ptr<DevBlob> got(static_cast<DevBlob *>(p));
    EXPECT_EQ(get(got->data, got->memory, 1000), std::vector<unsigned char>(pb.begin(), pb.begin() + 1000));
    gser_value_t *small;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(back.get()), "small", &small), GSER_OK);
    gser_buffer_desc_t sd = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_value_get_buffer(small, &sd), GSER_OK);
    EXPECT_EQ(get(sd.data, sd.memory, 1000), pa);
}

TEST_P(DeviceTest, HostSerializersGetHostFramesAndDeserializersSeeFinalBuffers)
{
    if (mem() != GSER_MEMORY_DEVICE)
        GTEST_SKIP() << "about device buffers";
    // A type with only a host serializer: its device buffers are staged to
    // host frames even though the caller's list starts with "device".
    ASSERT_EQ(gser_type_register(ctx(), "test.hostblob", 1, nullptr), GSER_OK);
    ASSERT_EQ(gser_type_add_family(ctx(), "test.hostblob", "host", devblob_ser, devblob_de), GSER_OK);
    auto a = alloc(512), b = alloc(600);
    auto pa = pattern(512, 21), pb = pattern(600, 22);
    put(a->base, pa);
    put(b->base, pb);
    DevBlob blob{b->base, 600, mem()};
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *root, *v;
    gser_msg_new_list(m, &root);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = a->base;
    d.nbytes = 512;
    d.memory = mem();
    gser_msg_new_buffer(m, &d, &v), gser_list_append(root, v);
    ASSERT_EQ(gser_msg_new_object(m, "test.hostblob", &blob, &v), GSER_OK);
    gser_list_append(root, v);
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx(), m);
    ASSERT_TRUE(frames);
    ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 3u);
    EXPECT_EQ(gser_frames_get_array(frames.get())[1].memory, GSER_MEMORY_DEVICE) << "the top level's packed frame";
    EXPECT_EQ(gser_frames_get_array(frames.get())[2].memory, GSER_MEMORY_HOST) << "the host serializer's frame";

    // Receiving with SCATTER and RESTORE_DEVICE: the deserializer already sees
    // the object's buffer back on the device, in its own allocation.
    auto back = deserialize(ctx(), frames.get(), GSER_DESERIALIZE_SCATTER | GSER_DESERIALIZE_RESTORE_DEVICE);
    ASSERT_TRUE(back);
    ASSERT_EQ(gser_msg_wait(back.get()), GSER_OK);
    gser_value_t *obj;
    ASSERT_EQ(gser_list_get(gser_msg_get_root(back.get()), 1, &obj), GSER_OK);
    void *p;
    ASSERT_EQ(gser_value_take_object(obj, &p), GSER_OK);
    std::unique_ptr<DevBlob> got(static_cast<DevBlob *>(p));
    EXPECT_EQ(got->memory, GSER_MEMORY_DEVICE);
    const gser_frame_t *fr = gser_frames_get_array(frames.get());
    for (size_t i = 1; i < 3; i++)
        EXPECT_FALSE(got->data >= fr[i].data && (const char *)got->data < (const char *)fr[i].data + fr[i].size)
            << "the deserializer saw the scattered copy, not a view into frame " << i;
    EXPECT_EQ(get(got->data, got->memory, 300), std::vector<unsigned char>(pb.begin(), pb.begin() + 300));
}

// An allocator that fails the n-th allocation (device and pinned requests
// counted together), and counts what is live.
struct FailingAlloc {
    gser_context_t *real = nullptr;
    int fail_at = -1;
    int calls = 0;
    int live = 0;
    bool scribble = false; // "pinned" memory is malloc'd and overwritten when freed
    gser_status_t take(bool pinned, size_t size, void *stream, void **p)
    {
        if (calls++ == fail_at)
            return GSER_ERR_NO_MEMORY;
        if (pinned && scribble) {
            *p = malloc(size ? size : 1);
            live++;
            return GSER_OK;
        }
        gser_status_t st = pinned ? gser_pinned_alloc(real, size, p) : gser_device_alloc(real, size, stream, p);
        if (st == GSER_OK)
            live++;
        return st;
    }
    static gser_status_t alloc(void *u, size_t size, void *stream, void **p)
    {
        return static_cast<FailingAlloc *>(u)->take(false, size, stream, p);
    }
    static gser_status_t alloc_pinned(void *u, size_t size, void *stream, void **p)
    {
        return static_cast<FailingAlloc *>(u)->take(true, size, stream, p);
    }
    static void release(void *u, void *p, size_t size, void *stream)
    {
        auto *f = static_cast<FailingAlloc *>(u);
        f->live--;
        gser_device_free(f->real, p, size, stream);
    }
    static void release_pinned(void *u, void *p, size_t size, void *)
    {
        auto *f = static_cast<FailingAlloc *>(u);
        f->live--;
        if (f->scribble) {
            std::memset(p, 0xCD, size);
            free(p);
            return;
        }
        gser_pinned_free(f->real, p, size);
    }

    // A context on backend whose device and pinned memory come from here
    // (pinned requests fail the same way); this object outlives it.
    CtxPtr context(const char *backend)
    {
        dev = {sizeof dev, alloc, release, this};
        pin = {sizeof pin, alloc_pinned, release_pinned, this};
        gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
        o.trace = -1;
        o.device_backend = backend;
        o.device_allocator = &dev;
        o.pinned_allocator = &pin;
        o.pack_max = 4096;
        gser_context_t *c = nullptr;
        EXPECT_EQ(gser_context_create(&o, &c), GSER_OK);
        return CtxPtr(c);
    }
    gser_allocator_t dev{}, pin{};
};

// gser_serialize with the host family alone.
gser_status_t serialize_host_only(gser_context_t *c, gser_msg_t *m, gser_frames_t **f)
{
    const char *const host_only[] = {"host"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = host_only;
    so.nfamilies = 1;
    return gser_serialize(c, m, &so, f);
}

TEST_P(DeviceTest, AllocationFailuresAreCleanErrors)
{
    if (mem() != GSER_MEMORY_DEVICE)
        GTEST_SKIP() << "host buffers allocate no device memory";
    std::vector<Sent> sent;
    // The host family needs device staging, the pinned frame and, for more
    // than DEVL_FEW buffers, pinned memory for the copy plan.
    for (size_t count : {(size_t)10, (size_t)DEVL_FEW + 8}) {
        int needed = count > DEVL_FEW ? 3 : 2;
        for (int fail_at = 0; fail_at <= needed; fail_at++) {
            FailingAlloc fa;
            fa.real = ctx();
            fa.fail_at = fail_at;
            CtxPtr cp = fa.context(GetParam().name);
            ASSERT_TRUE(cp);
            gser_context_t *c = cp.get();
            gser_msg_t *m;
            ASSERT_EQ(gser_msg_create(c, &m), GSER_OK);
            MsgPtr mp(m);
            sent.clear();
            make_buffers(this, m, sent, count, 3000, 5);
            gser_frames_t *f = nullptr;
            gser_status_t st = serialize_host_only(c, m, &f);
            if (fail_at < needed) {
                EXPECT_EQ(st, GSER_ERR_NO_MEMORY) << fail_at;
                EXPECT_EQ(f, nullptr);
                EXPECT_NE(std::string(gser_context_get_last_error(c)).find("failed"), std::string::npos)
                    << gser_context_get_last_error(c);
            } else {
                EXPECT_EQ(st, GSER_OK) << gser_context_get_last_error(c);
                EXPECT_EQ(fa.calls, needed) << count << " buffers";
            }
            gser_frames_destroy(f);
            EXPECT_EQ(fa.live, 0) << "everything allocated was given back, fail_at " << fail_at;
        }
    }
}

// A serialize that fails after the pack kernel was queued (here: no pinned
// memory for the host frame) returns only once that kernel no longer needs
// its plan: the plan's memory is overwritten and freed as soon as it is
// given back, and the kernel runs at the latest at the wait below (under
// ASan a late read is a use after free; without, a wild copy).
TEST_P(DeviceTest, AFailedSerializeWaitsForTheWorkItQueued)
{
    if (mem() != GSER_MEMORY_DEVICE)
        GTEST_SKIP() << "host buffers queue no device work";
    std::vector<Sent> sent;
    FailingAlloc fa;
    fa.real = ctx();
    fa.fail_at = 2; // the packed frame, the plan, then the pinned host frame
    fa.scribble = true;
    CtxPtr cp = fa.context(GetParam().name);
    ASSERT_TRUE(cp);
    gser_context_t *c = cp.get();
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(c, &m), GSER_OK);
    MsgPtr mp(m);
    make_buffers(this, m, sent, DEVL_FEW + 30, 3000, 9);
    gser_frames_t *f = nullptr;
    EXPECT_EQ(serialize_host_only(c, m, &f), GSER_ERR_NO_MEMORY);
    EXPECT_EQ(f, nullptr);
    EXPECT_EQ(fa.live, 0);
    EXPECT_EQ(gser_stream_wait(c, nullptr), GSER_OK);
}

TEST_P(DeviceTest, ProducerStreamsAndEventsAreWaitedFor)
{
    if (mem() != GSER_MEMORY_DEVICE)
        GTEST_SKIP() << "host buffers have no producer stream";
    gser_event_t *ev;
    ASSERT_EQ(gser_event_create(ctx(), &ev), GSER_OK);
    auto buf = alloc(1000);
    auto bytes = pattern(1000, 99);
    // Written on the per-thread stream, then an event recorded after it.
    ASSERT_EQ(gser_device_memcpy(ctx(), buf->base, mem(), bytes.data(), GSER_MEMORY_HOST, 1000, nullptr), GSER_OK);
    ASSERT_EQ(gser_event_record(ev, nullptr), GSER_OK);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = buf->base;
    d.nbytes = 1000;
    d.memory = mem();
    d.event = gser_event_get_handle(ev);
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    gser_msg_set_root(m, v);
    auto frames = serialize(ctx(), m);
    ASSERT_NE(gser_frames_get_event(frames.get()), nullptr);
    ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
    EXPECT_EQ(gser_frames_query(frames.get()), GSER_OK);
    const gser_frame_t &f = gser_frames_get_array(frames.get())[1];
    EXPECT_EQ(get(f.data, f.memory, 1000), bytes);
    gser_event_destroy(ev);
}

TEST_P(DeviceTest, DeviceBuffersNeedADeviceFamilyAndABackend)
{
    if (mem() != GSER_MEMORY_DEVICE)
        GTEST_SKIP() << "about device buffers";
    auto buf = alloc(100);
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = buf->base;
    d.nbytes = 100;
    d.memory = GSER_MEMORY_DEVICE;
    gser_value_t *root, *v;
    gser_msg_new_map(m, &root);
    gser_msg_new_buffer(m, &d, &v);
    gser_map_put_cstr(root, "col", v);
    gser_msg_set_root(m, root);
    ASSERT_EQ(gser_family_register(ctx(), "custom"), GSER_OK);
    const char *const custom[] = {"custom"};
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
    so.families = custom;
    so.nfamilies = 1;
    gser_frames_t *f = nullptr;
    EXPECT_EQ(gser_serialize(ctx(), m, &so, &f), GSER_ERR_NO_SERIALIZER);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("$.col: a device buffer needs the family"),
              std::string::npos)
        << gser_context_get_last_error(ctx());

    // A context with no device backend cannot pack it.
    auto plain = make_ctx();
    gser_msg_t *pm;
    ASSERT_EQ(gser_msg_create(plain.get(), &pm), GSER_OK);
    MsgPtr pmp(pm);
    gser_msg_new_buffer(pm, &d, &v);
    gser_msg_set_root(pm, v);
    EXPECT_EQ(gser_serialize(plain.get(), pm, nullptr, &f), GSER_ERR_NO_DEVICE);
    EXPECT_NE(std::string(gser_context_get_last_error(plain.get())).find("device backend"), std::string::npos);
    void *p;
    EXPECT_EQ(gser_device_alloc(plain.get(), 16, nullptr, &p), GSER_ERR_NO_DEVICE);
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceTest,
                         ::testing::Values(Backend{"host", GSER_MEMORY_HOST}, Backend{"emulated", GSER_MEMORY_DEVICE},
                                           Backend{"cuda", GSER_MEMORY_DEVICE}),
                         [](const ::testing::TestParamInfo<Backend> &i) { return std::string(i.param.name); });

// ---- batches of copies and the per-lane copy, at every relative alignment ---------

class CopyPlanTest : public ::testing::TestWithParam<const char *> {
  public:
    void SetUp() override
    {
        gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
        o.device_backend = GetParam();
        gser_context_t *c = nullptr;
        if (gser_context_create(&o, &c) != GSER_OK)
            GTEST_SKIP() << GetParam() << " backend unavailable: " << gser_context_get_last_error(nullptr);
        ctx_.reset(c);
    }
    void TearDown() override
    {
        for (auto &a : allocs_)
            gser_device_free(ctx_.get(), a.first, a.second, nullptr);
    }
    void *dev(size_t n)
    {
        void *p = nullptr;
        EXPECT_EQ(gser_device_alloc(ctx_.get(), n, nullptr, &p), GSER_OK);
        allocs_.emplace_back(p, n);
        return p;
    }
    void put(void *d, const void *h, size_t n)
    {
        ASSERT_EQ(gser_device_memcpy(ctx_.get(), d, GSER_MEMORY_DEVICE, h, GSER_MEMORY_HOST, n, nullptr), GSER_OK);
    }
    std::vector<unsigned char> get(const void *d, size_t n)
    {
        std::vector<unsigned char> out(n);
        EXPECT_EQ(gser_device_memcpy(ctx_.get(), out.data(), GSER_MEMORY_HOST, d, GSER_MEMORY_DEVICE, n, nullptr),
                  GSER_OK);
        EXPECT_EQ(gser_stream_wait(ctx_.get(), nullptr), GSER_OK);
        return out;
    }

    // Sizes that cross every path: empty, bytes only, each vector width,
    // tile boundaries (1 KiB .. 64 KiB tiles), and random ones.
    static std::vector<size_t> sizes()
    {
        std::vector<size_t> v = {0, 1, 2, 3, 4, 5, 7, 13, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255,
                                 1023, 1024, 1025, 4097, 65535, 65536, 65537, 200003};
        std::mt19937 rng(2024);
        for (int i = 0; i < 20; i++)
            v.push_back(rng() % 70000);
        return v;
    }

    CtxPtr ctx_;
    std::vector<std::pair<void *, size_t>> allocs_;
};

extern "C" gser_status_t test_batch(gser_context_t *ctx, const void *const *src, void *const *dst,
                                    const uint64_t *size, size_t n, void *base);
extern "C" gser_status_t test_gather_resident(gser_context_t *ctx, const void *const *src, const uint64_t *size,
                                              size_t n, uint64_t total, void *base);

// Scatters: sources and destinations at every offset 0..15 within 16 bytes,
// many copies (the plan scanned on the device) and few (kernel parameters).
TEST_P(CopyPlanTest, ScattersCopyEveryAlignmentAndSizeExactly)
{
    auto sz = sizes();
    for (size_t count : {sz.size() * 16, (size_t)DEVL_FEW, (size_t)5}) {
        std::vector<const void *> src(count);
        std::vector<void *> dst(count);
        std::vector<uint64_t> size(count);
        std::vector<std::pair<size_t, size_t>> at;
        size_t src_total = 0, dst_total = 0;
        for (size_t i = 0; i < count; i++) {
            size[i] = sz[(i * 7) % sz.size()];
            size_t so = (src_total + 63) / 64 * 64 + i % 16, dof = (dst_total + 63) / 64 * 64 + (i / 16) % 16;
            at.emplace_back(so, dof);
            src_total = so + size[i];
            dst_total = dof + size[i] + 1;
        }
        std::vector<unsigned char> host = pattern(src_total + 64, (uint32_t)count), expect(dst_total + 64, 0xA5);
        unsigned char *ds = static_cast<unsigned char *>(dev(host.size()));
        unsigned char *dd = static_cast<unsigned char *>(dev(expect.size()));
        put(ds, host.data(), host.size());
        put(dd, expect.data(), expect.size()); // poison: every byte no copy covers stays 0xA5
        for (size_t i = 0; i < count; i++) {
            src[i] = ds + at[i].first;
            dst[i] = dd + at[i].second;
            std::memcpy(&expect[at[i].second], &host[at[i].first], size[i]);
        }
        ASSERT_EQ(test_batch(ctx_.get(), src.data(), dst.data(), size.data(), count, nullptr), GSER_OK)
            << gser_context_get_last_error(ctx_.get());
        auto got = get(dd, expect.size());
        for (size_t i = 0; i < got.size(); i++)
            ASSERT_EQ(got[i], expect[i]) << "byte " << i << ", " << count << " copies";
    }
}

// Gathers: buffers at every source alignment packed at 64-byte places with
// zeros between them, from host arrays (few and many) and from arrays that
// are in device memory already.
TEST_P(CopyPlanTest, GathersPackAtAlignedPlacesWithZeroPadding)
{
    auto sz = sizes();
    for (int resident = 0; resident < 2; resident++) {
        for (size_t count : {sz.size() * 4, (size_t)DEVL_FEW, (size_t)3}) {
            std::vector<const void *> src(count);
            std::vector<uint64_t> size(count);
            std::vector<size_t> from(count);
            size_t src_total = 0, total = 0;
            for (size_t i = 0; i < count; i++) {
                size[i] = sz[(i * 5 + 3) % sz.size()];
                from[i] = (src_total + 63) / 64 * 64 + i % 16;
                src_total = from[i] + size[i];
                total += (size[i] + 63) / 64 * 64;
            }
            std::vector<unsigned char> host = pattern(src_total + 64, (uint32_t)(count + 7));
            std::vector<unsigned char> expect(total + 128, 0xA5);
            unsigned char *ds = static_cast<unsigned char *>(dev(host.size()));
            unsigned char *base = static_cast<unsigned char *>(dev(expect.size()));
            put(ds, host.data(), host.size());
            put(base, expect.data(), expect.size());
            size_t at = 0;
            for (size_t i = 0; i < count; i++) {
                src[i] = ds + from[i];
                std::memcpy(&expect[at], &host[from[i]], size[i]);
                size_t padded = (size[i] + 63) / 64 * 64;
                std::memset(&expect[at + size[i]], 0, padded - size[i]);
                at += padded;
            }
            gser_status_t st;
            if (resident) {
                auto *dsrc = static_cast<const void **>(dev(count * sizeof(void *)));
                auto *dsize = static_cast<uint64_t *>(dev(count * sizeof(uint64_t)));
                put(dsrc, src.data(), count * sizeof(void *));
                put(dsize, size.data(), count * sizeof(uint64_t));
                st = test_gather_resident(ctx_.get(), dsrc, dsize, count, total, base);
            } else {
                st = test_batch(ctx_.get(), src.data(), nullptr, size.data(), count, base);
            }
            ASSERT_EQ(st, GSER_OK) << gser_context_get_last_error(ctx_.get());
            auto got = get(base, expect.size());
            for (size_t i = 0; i < got.size(); i++)
                ASSERT_EQ(got[i], expect[i]) << "byte " << i << ", " << count << " copies, resident " << resident;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, CopyPlanTest, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });

TEST(DeviceApi, ForeignEventHandlesCanBeWaitedFor)
{
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.device_backend = "emulated";
    gser_context_t *c = nullptr;
    ASSERT_EQ(gser_context_create(&o, &c), GSER_OK);
    CtxPtr cp(c);
    gser_event_t *ev;
    ASSERT_EQ(gser_event_create(c, &ev), GSER_OK);
    ASSERT_EQ(gser_event_record(ev, nullptr), GSER_OK);
    EXPECT_EQ(gser_stream_order_after_handle(c, nullptr, gser_event_get_handle(ev)), GSER_OK);
    EXPECT_EQ(gser_stream_order_after_handle(c, nullptr, nullptr), GSER_ERR_INVALID_ARG);
    gser_event_destroy(ev);
    auto plain = make_ctx();
    int fake;
    EXPECT_EQ(gser_stream_order_after_handle(plain.get(), nullptr, &fake), GSER_ERR_NO_DEVICE);
}

#if defined(__SANITIZE_ADDRESS__)
#define GSER_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GSER_TEST_ASAN 1
#endif
#endif

// Under AddressSanitizer the emulated backend poisons its device memory
// outside its own operations, so host code that dereferences a device
// pointer fails in CI as it would on a GPU; the backend's copies still work.
TEST(EmulatedDevice, HostCodeCannotReadDeviceMemory)
{
#ifndef GSER_TEST_ASAN
    GTEST_SKIP() << "only AddressSanitizer builds poison emulated device memory";
#else
    const char *env = std::getenv("GSER_EMULATED_POISON");
    if (env && std::string(env) == "0")
        GTEST_SKIP() << "GSER_EMULATED_POISON=0 turns the poisoning off";
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.device_backend = "emulated";
    gser_context_t *c = nullptr;
    ASSERT_EQ(gser_context_create(&o, &c), GSER_OK);
    CtxPtr cp(c);
    void *dev = nullptr;
    ASSERT_EQ(gser_device_alloc(c, 100, nullptr, &dev), GSER_OK);
    std::vector<unsigned char> in = pattern(100, 7), out(100, 0);
    ASSERT_EQ(gser_device_memcpy(c, dev, GSER_MEMORY_DEVICE, in.data(), GSER_MEMORY_HOST, 100, nullptr), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(c, out.data(), GSER_MEMORY_HOST, dev, GSER_MEMORY_DEVICE, 100, nullptr), GSER_OK);
    EXPECT_EQ(out, in);
    GTEST_FLAG_SET(death_test_style, "threadsafe"); // the backend's worker thread runs
    EXPECT_DEATH(
        {
            volatile unsigned char b = static_cast<volatile unsigned char *>(dev)[42];
            (void)b;
        },
        "use-after-poison");
    // Pinned memory is host memory (a copy into it completes in stream order).
    void *pin = nullptr;
    ASSERT_EQ(gser_pinned_alloc(c, 100, &pin), GSER_OK);
    ASSERT_EQ(gser_device_memcpy(c, pin, GSER_MEMORY_HOST, dev, GSER_MEMORY_DEVICE, 100, nullptr), GSER_OK);
    ASSERT_EQ(gser_stream_wait(c, nullptr), GSER_OK);
    EXPECT_EQ(std::memcmp(pin, in.data(), 100), 0);
    gser_pinned_free(c, pin, 100);
    gser_device_free(c, dev, 100, nullptr);
#endif
}
