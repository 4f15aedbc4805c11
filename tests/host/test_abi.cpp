// The versioned structs: a caller compiled against an older, smaller struct,
// or a newer, larger one, keeps working; and per-context error messages.
//
// An "older caller" is played by a heap block of exactly the bytes that
// caller's struct had: under AddressSanitizer, a library that read or wrote
// past the caller's size would fault here.
#include <cstddef>
#include <cstdlib>
#include <thread>

#include "host/common.hpp"

namespace {

// A struct of `bytes` bytes holding the first `bytes` of *full, with size set to them.
template <typename T>
T *older(const T &full, size_t bytes)
{
    auto *p = static_cast<unsigned char *>(std::malloc(bytes));
    std::memcpy(p, &full, bytes);
    std::memcpy(p, &bytes, sizeof bytes);
    return reinterpret_cast<T *>(p);
}

// A struct with `extra` bytes after this build's, all zero except byte `poke` (if any).
template <typename T>
std::vector<unsigned char> newer(const T &full, size_t extra, long poke = -1)
{
    std::vector<unsigned char> v(sizeof(T) + extra, 0);
    std::memcpy(v.data(), &full, sizeof(T));
    size_t n = v.size();
    std::memcpy(v.data(), &n, sizeof n);
    if (poke >= 0)
        v[sizeof(T) + (size_t)poke] = 1;
    return v;
}

struct FreeDeleter {
    void operator()(void *p) const { std::free(p); }
};

} // namespace

using Abi = CtxTest;

TEST_F(Abi, OlderCallersWithSmallerOptionStructsAreReadOnlyAsFarAsTheyGo)
{
    // An older caller of gser_serialize that knew nothing past pack_max: the
    // stream it never set is not read (it would be garbage) and defaults.
    gser_serialize_options_t full = GSER_SERIALIZE_OPTIONS_INIT;
    full.array_min = 4;
    std::memset(&full.stream, 0xab, sizeof full.stream);
    std::unique_ptr<gser_serialize_options_t, FreeDeleter> so(
        older(full, offsetof(gser_serialize_options_t, stream)));

    auto m = new_msg();
    gser_value_t *list;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_list(m.get(), &list));
    for (int i = 0; i < 4; i++)
        GSER_OK_OR_FAIL(ctx(), gser_list_append_int(list, i));
    GSER_OK_OR_FAIL(ctx(), gser_msg_set_root(m.get(), list));
    gser_frames_t *f = nullptr;
    GSER_OK_OR_FAIL(ctx(), gser_serialize(ctx(), m.get(), so.get(), &f));
    FramesPtr fp(f);
    EXPECT_EQ(gser_frames_get_event(f), nullptr) << "no device work: the unread stream was not used";

    // Deserialize options that stop before limits; context options that stop before trace.
    gser_deserialize_options_t dfull = GSER_DESERIALIZE_OPTIONS_INIT;
    dfull.flags = GSER_DESERIALIZE_ALLOW_UNKNOWN;
    std::unique_ptr<gser_deserialize_options_t, FreeDeleter> dso(
        older(dfull, offsetof(gser_deserialize_options_t, limits)));
    gser_msg_t *back = nullptr;
    GSER_OK_OR_FAIL(ctx(), gser_deserialize(ctx(), gser_frames_get_array(f), gser_frames_get_count(f), dso.get(),
                                            &back));
    MsgPtr bp(back);
    EXPECT_EQ(gser_value_get_len(gser_msg_get_root(back)), 4u);

    gser_context_options_t cfull = GSER_CONTEXT_OPTIONS_INIT;
    cfull.inline_max = 1;
    std::memset(&cfull.trace, 0xff, sizeof cfull.trace);
    std::unique_ptr<gser_context_options_t, FreeDeleter> co(older(cfull, offsetof(gser_context_options_t, trace)));
    gser_context_t *c = nullptr;
    ASSERT_EQ(gser_context_create(co.get(), &c), GSER_OK) << gser_context_get_last_error(nullptr);
    gser_context_destroy(c);

    // Just the size field: every option defaults.
    std::unique_ptr<gser_context_options_t, FreeDeleter> bare(older(cfull, sizeof(size_t)));
    ASSERT_EQ(gser_context_create(bare.get(), &c), GSER_OK) << gser_context_get_last_error(nullptr);
    gser_context_destroy(c);
}

// A caller built before gser_buffer_desc_t had strides makes C-order buffers,
// reads them, and is refused a strided one it would misread.
TEST_F(Abi, CallersFromBeforeStridesNeverMisreadALayout)
{
    auto m = new_msg();
    double data[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3}, strides[2] = {8, 16};
    gser_buffer_desc_t full = GSER_BUFFER_DESC_INIT;
    full.data = data;
    full.nbytes = sizeof data;
    full.dtype = GSER_DTYPE_FLOAT64;
    full.ndim = 2;
    full.shape = shape;
    full.strides = strides; // past the old caller's struct: never read
    const size_t old_size = offsetof(gser_buffer_desc_t, strides);
    std::unique_ptr<gser_buffer_desc_t, FreeDeleter> old(older(full, old_size));
    gser_value_t *c, *f;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), old.get(), &c));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &full, &f));

    gser_buffer_desc_t zero = GSER_BUFFER_DESC_INIT;
    std::unique_ptr<gser_buffer_desc_t, FreeDeleter> out(older(zero, old_size));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_buffer(c, out.get()));
    EXPECT_EQ(out->data, (const void *)data);
    out.reset(older(zero, old_size));
    EXPECT_EQ(gser_value_get_buffer(f, out.get()), GSER_ERR_UNSUPPORTED);
    EXPECT_EQ(out->data, nullptr) << "nothing written";
    gser_buffer_desc_t now = GSER_BUFFER_DESC_INIT;
    GSER_OK_OR_FAIL(ctx(), gser_value_get_buffer(f, &now));
    ASSERT_NE(now.strides, nullptr);
    EXPECT_EQ(now.strides[1], 16);
    int64_t off;
    size_t span;
    out.reset(older(full, old_size));
    GSER_OK_OR_FAIL(ctx(), gser_buffer_get_span(out.get(), &off, &span));
    EXPECT_EQ(span, sizeof data) << "an old caller's buffer is C order";
}

TEST_F(Abi, OlderCallersGetOutputStructsFilledOnlyUpToTheirSize)
{
    auto m = new_msg();
    double data[4] = {1, 2, 3, 4};
    gser_buffer_desc_t in = GSER_BUFFER_DESC_INIT;
    in.data = data;
    in.nbytes = sizeof data;
    in.dtype = GSER_DTYPE_FLOAT64;
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &in, &v));

    // A caller whose gser_buffer_desc_t ended after nbytes.
    const size_t old_size = offsetof(gser_buffer_desc_t, dtype);
    gser_buffer_desc_t zero = GSER_BUFFER_DESC_INIT;
    std::unique_ptr<gser_buffer_desc_t, FreeDeleter> out(older(zero, old_size));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_buffer(v, out.get()));
    size_t got_size;
    std::memcpy(&got_size, out.get(), sizeof got_size);
    EXPECT_EQ(got_size, old_size) << "the caller's size is kept";
    EXPECT_EQ(out->data, (const void *)data);
    EXPECT_EQ(out->nbytes, sizeof data);

    // A newer caller: the bytes past this build's struct are zeroed.
    auto big = newer(zero, 24);
    std::memset(big.data() + sizeof(gser_buffer_desc_t), 0x5a, 24);
    GSER_OK_OR_FAIL(ctx(), gser_value_get_buffer(v, reinterpret_cast<gser_buffer_desc_t *>(big.data())));
    for (size_t i = 0; i < 24; i++)
        EXPECT_EQ(big[sizeof(gser_buffer_desc_t) + i], 0) << "byte " << i << " past this build's struct";

    // And limits, the output of gser_context_get_limits.
    gser_limits_t lfull = GSER_LIMITS_INIT;
    std::unique_ptr<gser_limits_t, FreeDeleter> lim(older(lfull, offsetof(gser_limits_t, max_frames)));
    GSER_OK_OR_FAIL(ctx(), gser_context_get_limits(ctx(), lim.get()));
    EXPECT_EQ(lim->max_depth, (size_t)GSER_DEPTH_MAX);
}

TEST_F(Abi, NewerCallersAreAcceptedUnlessTheySetFieldsThisBuildDoesNotKnow)
{
    auto m = new_msg();
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), 1, &v));
    GSER_OK_OR_FAIL(ctx(), gser_msg_set_root(m.get(), v));
    gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;

    auto zeros = newer(so, 32);
    gser_frames_t *f = nullptr;
    GSER_OK_OR_FAIL(ctx(), gser_serialize(ctx(), m.get(),
                                          reinterpret_cast<const gser_serialize_options_t *>(zeros.data()), &f));
    gser_frames_destroy(f);

    auto set = newer(so, 32, 17);
    f = nullptr;
    EXPECT_EQ(gser_serialize(ctx(), m.get(), reinterpret_cast<const gser_serialize_options_t *>(set.data()), &f),
              GSER_ERR_UNSUPPORTED);
    EXPECT_EQ(f, nullptr);
    std::string err = gser_context_get_last_error(ctx());
    EXPECT_NE(err.find("gser_serialize_options_t.size"), std::string::npos) << err;
    EXPECT_NE(err.find(gser_version_str()), std::string::npos) << err;
}

TEST_F(Abi, StructsNotInitialisedWithTheirMacroAreRefusedByName)
{
    auto m = new_msg();
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), 1, &v));
    GSER_OK_OR_FAIL(ctx(), gser_msg_set_root(m.get(), v));

    gser_serialize_options_t so{}; // zeroed by hand: size 0
    gser_frames_t *f = nullptr;
    EXPECT_EQ(gser_serialize(ctx(), m.get(), &so, &f), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("GSER_*_INIT"), std::string::npos);

    gser_buffer_desc_t d{};
    d.data = "x";
    d.nbytes = 1;
    EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("gser_buffer_desc_t.size is 0"),
              std::string::npos);

    gser_context_options_t co{};
    gser_context_t *c = nullptr;
    EXPECT_EQ(gser_context_create(&co, &c), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(c, nullptr);
    EXPECT_NE(std::string(gser_context_get_last_error(nullptr)).find("GSER_CONTEXT_OPTIONS_INIT"), std::string::npos);

    gser_limits_t lim{};
    EXPECT_EQ(gser_context_get_limits(ctx(), &lim), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(lim.max_depth, 0u) << "nothing written";
}

// Libraries with error text of their own (gser::ucx) word a versioned struct
// that cannot be read the way the core does.
TEST(StructReadDescribe, NamesTheCallTheStructAndWhatIsWrong)
{
    struct mine {
        size_t size;
        int a;
    } dst;
    char buf[256];
    mine zeroed{};
    EXPECT_EQ(gser_struct_read(&dst, sizeof dst, &zeroed), GSER_ERR_INVALID_ARG);
    gser_struct_read_describe(GSER_ERR_INVALID_ARG, "lib_call", "lib_opts_t", &zeroed, sizeof dst, buf, sizeof buf);
    EXPECT_STREQ(buf, "lib_call: lib_opts_t.size is 0: initialise the struct with its GSER_*_INIT macro");

    struct newer {
        size_t size;
        int a;
        int pad;
        uint64_t b;
    } n{sizeof(newer), 1, 0, 2};
    EXPECT_EQ(gser_struct_read(&dst, sizeof dst, &n), GSER_ERR_UNSUPPORTED);
    gser_struct_read_describe(GSER_ERR_UNSUPPORTED, "lib_call", "lib_opts_t", &n, sizeof dst, buf, sizeof buf);
    std::string text = buf;
    EXPECT_EQ(text.rfind("lib_call: lib_opts_t.size is " + std::to_string(sizeof(newer)), 0), 0u) << text;
    EXPECT_NE(text.find("knows " + std::to_string(sizeof(mine)) + " bytes"), std::string::npos) << text;
    EXPECT_NE(text.find(gser_version_str()), std::string::npos) << text;

    char small[8];
    memset(small, 'x', sizeof small);
    gser_struct_read_describe(GSER_ERR_UNSUPPORTED, "lib_call", "lib_opts_t", &n, sizeof dst, small, sizeof small);
    EXPECT_STREQ(small, "lib_cal"); // cut to the buffer, and terminated
}

TEST_F(Abi, FramesRefuseReservedFieldsSetByANewerCaller)
{
    auto m = new_msg();
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), 1, &v));
    GSER_OK_OR_FAIL(ctx(), gser_msg_set_root(m.get(), v));
    gser_frames_t *f = nullptr;
    GSER_OK_OR_FAIL(ctx(), gser_serialize(ctx(), m.get(), nullptr, &f));
    FramesPtr fp(f);
    std::vector<gser_frame_t> fr(gser_frames_get_array(f), gser_frames_get_array(f) + gser_frames_get_count(f));
    fr[0].reserved[3] = 1;
    gser_msg_t *back = nullptr;
    EXPECT_EQ(gser_deserialize(ctx(), fr.data(), fr.size(), nullptr, &back), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("reserved[3]"), std::string::npos);
    fr[0].reserved[3] = 0;
    GSER_OK_OR_FAIL(ctx(), gser_deserialize(ctx(), fr.data(), fr.size(), nullptr, &back));
    gser_msg_destroy(back);
}

// Each context keeps one message per thread: using any number of other
// contexts never loses one, and threads never see each other's.
TEST(ContextErrors, MessagesNeverVanishAndStayPerThread)
{
    std::vector<CtxPtr> ctxs;
    for (int i = 0; i < 40; i++)
        ctxs.push_back(make_ctx());
    for (int i = 0; i < 40; i++)
        gser_context_fail(ctxs[i].get(), GSER_ERR_FORMAT, "context %d failed", i);
    for (int i = 0; i < 40; i++)
        EXPECT_EQ(std::string(gser_context_get_last_error(ctxs[i].get())), "context " + std::to_string(i) + " failed");

    std::string other_before, other_after;
    std::thread t([&] {
        other_before = gser_context_get_last_error(ctxs[0].get());
        gser_context_fail(ctxs[0].get(), GSER_ERR_FORMAT, "from the other thread");
        other_after = gser_context_get_last_error(ctxs[0].get());
    });
    t.join();
    EXPECT_EQ(other_before, "") << "a thread does not see another thread's message";
    EXPECT_EQ(other_after, "from the other thread");
    EXPECT_EQ(std::string(gser_context_get_last_error(ctxs[0].get())), "context 0 failed");
}
