// Strided buffers: any numpy / __cuda_array_interface__ layout (Fortran
// order, negative, zero and arbitrary strides) travels as the memory span its
// elements cover and comes back as element 0 and the strides.
#include <climits>

#include "host/common.hpp"
#include "host/craft.hpp"

namespace {

using Dims = std::vector<int64_t>;

gser_buffer_desc_t layout(const void *elem0, gser_dtype_t dtype, const Dims &shape, const Dims *strides)
{
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    size_t n = gser_dtype_size(dtype);
    for (int64_t e : shape)
        n *= (size_t)e;
    d.data = elem0;
    d.nbytes = n;
    d.dtype = dtype;
    d.ndim = (uint32_t)shape.size();
    d.shape = shape.data();
    d.strides = strides ? strides->data() : nullptr;
    return d;
}

// Element idx of a host buffer as the receiver sees it (C order when it has
// no strides).
template <class T> T elem(const gser_buffer_desc_t &d, const Dims &idx)
{
    int64_t off = 0, c = (int64_t)sizeof(T);
    for (uint32_t k = d.ndim; k-- > 0;) {
        off += idx[k] * (d.strides ? d.strides[k] : c);
        c *= d.shape[k];
    }
    T v;
    std::memcpy(&v, static_cast<const char *>(d.data) + off, sizeof v);
    return v;
}

Dims dims(const int64_t *p, uint32_t n)
{
    return p ? Dims(p, p + n) : Dims();
}

class Strides : public CtxTest {
  protected:
    // Serialize root with everything of inline_max bytes or more in frames.
    FramesPtr send(gser_msg_t *m, gser_value_t *root, size_t inline_max = 256)
    {
        gser_msg_set_root(m, root);
        gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
        so.inline_max = inline_max;
        return serialize(ctx(), m, &so);
    }
    gser_buffer_desc_t got(const MsgPtr &back)
    {
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        EXPECT_EQ(gser_value_get_buffer(gser_msg_get_root(back.get()), &d), GSER_OK);
        return d;
    }
};

} // namespace

TEST_F(Strides, FortranOrderTravelsAsItsMemoryAndComesBackFortran)
{
    // a[i, j] = 10 i + j, column-major: the frame is the caller's memory.
    std::vector<double> base(30 * 40);
    for (int64_t i = 0; i < 30; i++)
        for (int64_t j = 0; j < 40; j++)
            base[(size_t)(i + 30 * j)] = 10.0 * (double)i + (double)j;
    Dims shape{30, 40}, strides{8, 240};
    auto m = new_msg();
    gser_buffer_desc_t d = layout(base.data(), GSER_DTYPE_FLOAT64, shape, &strides);
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    auto frames = send(m.get(), v);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
    const gser_frame_t &f = gser_frames_get_array(frames.get())[1];
    EXPECT_EQ(f.data, base.data()) << "zero-copy: the frame is the array's memory";
    EXPECT_EQ(f.size, base.size() * 8);

    auto back = deserialize(ctx(), frames.get());
    gser_buffer_desc_t r = got(back);
    EXPECT_EQ(r.data, base.data()) << "and the receiver's element 0 is in the frame";
    EXPECT_EQ(dims(r.shape, r.ndim), shape);
    EXPECT_EQ(dims(r.strides, r.ndim), strides) << "Fortran order comes back Fortran order";
    EXPECT_EQ(r.nbytes, base.size() * 8);
    for (int64_t i = 0; i < 30; i += 7)
        for (int64_t j = 0; j < 40; j += 3)
            ASSERT_EQ(elem<double>(r, {i, j}), 10.0 * (double)i + (double)j) << i << "," << j;

    // Equality is by element: the same values in C order are equal, others not.
    std::vector<double> c(30 * 40);
    for (size_t i = 0; i < c.size(); i++)
        c[i] = 10.0 * (double)(i / 40) + (double)(i % 40);
    gser_buffer_desc_t cd = layout(c.data(), GSER_DTYPE_FLOAT64, shape, nullptr);
    gser_value_t *cv;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &cd, &cv));
    EXPECT_TRUE(gser_value_equal(v, gser_msg_get_root(back.get())));
    EXPECT_TRUE(gser_value_equal(cv, gser_msg_get_root(back.get())));
    c[41] = -1;
    EXPECT_FALSE(gser_value_equal(cv, gser_msg_get_root(back.get())));
}

TEST_F(Strides, NegativeStridesAndViewsTravelAsTheSpanTheyCover)
{
    // a = base[::-2, 1::3] of an int32 10 x 12 array: rows 9, 7, .., 1 and
    // columns 1, 4, 7, 10. Element 0 is base[9][1]; the lowest element
    // base[1][1] and the highest base[9][10] bound the span.
    std::vector<int32_t> base(10 * 12);
    for (size_t i = 0; i < base.size(); i++)
        base[i] = (int32_t)(100 * (i / 12) + i % 12);
    Dims shape{5, 4}, strides{-96, 12};
    const int32_t *e0 = &base[9 * 12 + 1];
    gser_buffer_desc_t d = layout(e0, GSER_DTYPE_INT32, shape, &strides);
    int64_t off = 0;
    size_t span = 0;
    ASSERT_EQ(gser_buffer_get_span(&d, &off, &span), GSER_OK);
    EXPECT_EQ(off, -384);
    EXPECT_EQ(span, 424u) << "from base[1][1] to the end of base[9][10]";

    auto m = new_msg();
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    auto frames = send(m.get(), v, 1);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
    const gser_frame_t &f = gser_frames_get_array(frames.get())[1];
    EXPECT_EQ(f.data, &base[1 * 12 + 1]);
    EXPECT_EQ(f.size, 424u);

    auto back = deserialize(ctx(), frames.get());
    gser_buffer_desc_t r = got(back);
    EXPECT_EQ(r.data, static_cast<const char *>(f.data) + 384);
    EXPECT_EQ(dims(r.strides, r.ndim), strides);
    EXPECT_EQ(r.nbytes, 5u * 4 * 4) << "nbytes counts the elements, not the span";
    for (int64_t i = 0; i < 5; i++)
        for (int64_t j = 0; j < 4; j++)
            ASSERT_EQ(elem<int32_t>(r, {i, j}), 100 * (9 - 2 * i) + 1 + 3 * j) << i << "," << j;
    EXPECT_TRUE(gser_value_equal(v, gser_msg_get_root(back.get())));

    // Through the flattened form, where frames are copied: the same values.
    auto flat = flatten(frames.get());
    gser_msg_t *fm = nullptr;
    ASSERT_EQ(gser_deserialize_flat(ctx(), flat.data(), flat.size(), nullptr, nullptr, nullptr, &fm), GSER_OK);
    MsgPtr fmp(fm);
    EXPECT_TRUE(gser_value_equal(v, gser_msg_get_root(fm)));
}

TEST_F(Strides, BroadcastArraysTravelAsTheirBase)
{
    auto m = new_msg();
    // np.broadcast_to(2.5, (1000, 1000)): 8 MB of elements, 8 bytes of memory.
    const double one = 2.5;
    Dims shape{1000, 1000}, zero{0, 0};
    gser_buffer_desc_t d = layout(&one, GSER_DTYPE_FLOAT64, shape, &zero);
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    auto frames = send(m.get(), v);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 1u) << "8 bytes go inline";
    EXPECT_LT(gser_frames_get_array(frames.get())[0].size, 40u);
    auto back = deserialize(ctx(), frames.get());
    gser_buffer_desc_t r = got(back);
    EXPECT_EQ(r.nbytes, 8000000u);
    EXPECT_EQ(dims(r.strides, r.ndim), zero);
    EXPECT_EQ(elem<double>(r, {999, 999}), 2.5);
    int64_t off;
    size_t span;
    ASSERT_EQ(gser_buffer_get_span(&r, &off, &span), GSER_OK);
    EXPECT_EQ(off, 0);
    EXPECT_EQ(span, 8u);
    EXPECT_TRUE(gser_value_equal(v, gser_msg_get_root(back.get())));

    // A row broadcast down 500 rows: the frame is the 1000-element row itself.
    std::vector<double> row(1000);
    for (size_t i = 0; i < row.size(); i++)
        row[i] = (double)i;
    Dims rshape{500, 1000}, rstrides{0, 8};
    gser_buffer_desc_t rd = layout(row.data(), GSER_DTYPE_FLOAT64, rshape, &rstrides);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &rd, &v));
    frames = send(m.get(), v);
    ASSERT_EQ(gser_frames_get_count(frames.get()), 2u);
    EXPECT_EQ(gser_frames_get_array(frames.get())[1].data, row.data());
    EXPECT_EQ(gser_frames_get_array(frames.get())[1].size, 8000u) << "never more bytes than the memory spanned";
    back = deserialize(ctx(), frames.get());
    r = got(back);
    EXPECT_EQ(elem<double>(r, {499, 123}), 123.0);
    EXPECT_TRUE(gser_value_equal(v, gser_msg_get_root(back.get())));
}

TEST_F(Strides, StridesThatSayCOrderAreDropped)
{
    auto m = new_msg();
    int32_t a[12] = {};
    Dims shape{3, 4}, c{16, 4};
    gser_buffer_desc_t with = layout(a, GSER_DTYPE_INT32, shape, &c), without = layout(a, GSER_DTYPE_INT32, shape, nullptr);
    gser_value_t *v1, *v2;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &with, &v1));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &without, &v2));
    gser_buffer_desc_t r = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_value_get_buffer(v1, &r), GSER_OK);
    EXPECT_EQ(r.strides, nullptr);
    auto f1 = send(m.get(), v1);
    std::string h1 = header_bytes(f1.get());
    auto f2 = send(m.get(), v2);
    EXPECT_EQ(h1, header_bytes(f2.get())) << "the same bytes on the wire: a 5-element buffer marker";

    // numpy gives an extent of 1 any stride, and an empty array any strides.
    Dims one{1, 4}, any1{999, 4};
    gser_buffer_desc_t d1 = layout(a, GSER_DTYPE_INT32, one, &any1);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d1, &v1));
    ASSERT_EQ(gser_value_get_buffer(v1, &r), GSER_OK);
    EXPECT_EQ(r.strides, nullptr);
    Dims empty{0, 3}, odd{-5, 7};
    gser_buffer_desc_t d0 = layout(nullptr, GSER_DTYPE_INT32, empty, &odd);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d0, &v1));
    ASSERT_EQ(gser_value_get_buffer(v1, &r), GSER_OK);
    EXPECT_EQ(r.strides, nullptr);
    EXPECT_EQ(r.nbytes, 0u);
    auto f0 = send(m.get(), v1);
    auto back = deserialize(ctx(), f0.get());
    EXPECT_EQ(dims(got(back).shape, 2), empty);
}

TEST_F(Strides, CopyingTakesTheSpanOnly)
{
    auto m = new_msg();
    std::vector<int16_t> base{1, 2, 3, 4, 5, 6};
    Dims shape{3}, rev{-4}; // base[4::-2]: 5, 3, 1
    gser_buffer_desc_t d = layout(&base[4], GSER_DTYPE_INT16, shape, &rev);
    d.flags = GSER_BUFFER_COPY;
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    base.assign(6, 0); // the message has its own copy
    gser_buffer_desc_t r = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_value_get_buffer(v, &r), GSER_OK);
    EXPECT_EQ(elem<int16_t>(r, {0}), 5);
    EXPECT_EQ(elem<int16_t>(r, {1}), 3);
    EXPECT_EQ(elem<int16_t>(r, {2}), 1);
    auto frames = send(m.get(), v);
    auto back = deserialize(ctx(), frames.get());
    EXPECT_TRUE(gser_value_equal(v, gser_msg_get_root(back.get())));

    // A broadcast copied is its base: one element.
    const double x = 7;
    Dims big{1 << 20}, z{0};
    gser_buffer_desc_t b = layout(&x, GSER_DTYPE_FLOAT64, big, &z);
    b.flags = GSER_BUFFER_COPY;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &b, &v));
    ASSERT_EQ(gser_value_get_buffer(v, &r), GSER_OK);
    EXPECT_NE(r.data, &x);
    EXPECT_EQ(elem<double>(r, {12345}), 7.0);
}

TEST_F(Strides, BadLayoutsAreRefusedWithWhatIsWrong)
{
    auto m = new_msg();
    double a[4] = {};
    gser_value_t *v = nullptr;
    auto refused = [&](gser_buffer_desc_t d, const char *why) {
        EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG) << why;
        std::string err = gser_context_get_last_error(ctx());
        EXPECT_NE(err.find(why), std::string::npos) << err;
        int64_t off;
        size_t span;
        EXPECT_EQ(gser_buffer_get_span(&d, &off, &span), GSER_ERR_INVALID_ARG) << why;
    };
    Dims s1{8};
    gser_buffer_desc_t flat = layout(a, GSER_DTYPE_FLOAT64, {}, nullptr);
    flat.nbytes = sizeof a;
    flat.strides = s1.data();
    refused(flat, "gser_msg_new_buffer: strides need a shape (ndim is 0)");
    Dims shape{3, 2}, huge{INT64_MAX, 8};
    refused(layout(a, GSER_DTYPE_FLOAT64, shape, &huge), "with strides[0] = 9223372036854775807 the elements span");
    Dims sum{INT64_MAX / 2, INT64_MAX / 2};
    Dims two{3, 3};
    refused(layout(a, GSER_DTYPE_FLOAT64, two, &sum), "with strides[1] = 4611686018427387903 the elements span");
    Dims neg{-1, 2}, ok{8, 16};
    refused(layout(a, GSER_DTYPE_FLOAT64, neg, &ok), "bad extent -1 in dim 0");
}

TEST_F(Strides, SpansOfLayouts)
{
    struct Case {
        Dims shape, strides;
        int64_t off;
        size_t span;
    } cases[] = {
        {{4}, {8}, 0, 32},                 // C order
        {{4}, {-8}, -24, 32},              // reversed
        {{4}, {16}, 0, 56},                // every other element
        {{3, 4}, {8, 24}, 0, 96},          // Fortran order
        {{3, 4}, {0, 8}, 0, 32},           // row broadcast
        {{3, 4}, {-32, -8}, -88, 96},      // both reversed
        {{3, 0}, {-32, 8}, 0, 0},          // no elements, no bytes
        {{5, 5}, {8, 8}, 0, 72},           // overlapping (as_strided)
    };
    double base[1];
    for (const Case &c : cases) {
        gser_buffer_desc_t d = layout(base, GSER_DTYPE_FLOAT64, c.shape, &c.strides);
        int64_t off = 1;
        size_t span = 1;
        ASSERT_EQ(gser_buffer_get_span(&d, &off, &span), GSER_OK);
        EXPECT_EQ(off, c.off) << c.strides[0];
        EXPECT_EQ(span, c.span) << c.strides[0];
    }
    gser_buffer_desc_t flat = layout(base, GSER_DTYPE_UINT8, {}, nullptr);
    flat.nbytes = 17;
    int64_t off = 1;
    size_t span = 0;
    ASSERT_EQ(gser_buffer_get_span(&flat, &off, &span), GSER_OK);
    EXPECT_EQ(off, 0);
    EXPECT_EQ(span, 17u);
}

// A buffer marker for a hostile header: [ext(4), dtype, shape, data, origin, strides].
template <class Shape, class Data, class Strides>
std::string strided_header(Shape shape, Data data, Strides strides, uint32_t version = GSER_WIRE_VERSION,
                           std::vector<size_t> frames = {}, gser_dtype_t dtype = GSER_DTYPE_FLOAT64)
{
    return craft(
        [&](msgpack_packer *pk) {
            msgpack_pack_map(pk, 1);
            msgpack_pack_str_with_body(pk, "b", 1);
            msgpack_pack_array(pk, 6);
            msgpack_pack_ext(pk, 0, 4);
            msgpack_pack_uint8(pk, (uint8_t)dtype);
            shape(pk);
            data(pk);
            msgpack_pack_uint8(pk, GSER_MEMORY_HOST);
            strides(pk);
        },
        version, frames);
}

auto ints(std::vector<int64_t> v)
{
    return [v](msgpack_packer *pk) {
        msgpack_pack_array(pk, v.size());
        for (int64_t x : v)
            msgpack_pack_int64(pk, x);
    };
}

auto bin(size_t n)
{
    return [n](msgpack_packer *pk) { msgpack_pack_bin_with_body(pk, std::string(n, '\x11').data(), n); };
}

TEST_F(Strides, HostileLayoutsOnTheWireAreRefusedWithThePath)
{
    struct Case {
        std::string header;
        gser_status_t st;
        const char *why;
        std::vector<size_t> frames;
    };
    auto nil = [](msgpack_packer *pk) { msgpack_pack_nil(pk); };
    auto one_str = [](msgpack_packer *pk) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_str_with_body(pk, "x", 1);
    };
    auto too_big = [](msgpack_packer *pk) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_uint64(pk, (uint64_t)INT64_MAX + 1);
    };
    auto ref = [](msgpack_packer *pk) { // [frame 0, offset 8, 32 bytes]
        msgpack_pack_array(pk, 3);
        msgpack_pack_uint8(pk, 0);
        msgpack_pack_uint8(pk, 8);
        msgpack_pack_uint8(pk, 32);
    };
    Case cases[] = {
        {strided_header(ints({4}), bin(32), ints({-8}), 1), GSER_ERR_FORMAT,
         "$.b: buffer strides need wire format version 2, the header is version 1", {}},
        {strided_header(nil, bin(8), ints({8})), GSER_ERR_FORMAT, "$.b: buffer has strides but no shape", {}},
        {strided_header(ints({4}), bin(32), ints({8, 8})), GSER_ERR_FORMAT,
         "$.b: buffer strides are not an array of 1 integers", {}},
        {strided_header(ints({4}), bin(32), nil), GSER_ERR_FORMAT, "$.b: buffer strides are not an array", {}},
        {strided_header(ints({4}), bin(32), one_str), GSER_ERR_FORMAT, "$.b: buffer stride 0 is not a 64-bit integer", {}},
        {strided_header(ints({4}), bin(32), too_big), GSER_ERR_FORMAT, "$.b: buffer stride 0 is not a 64-bit integer", {}},
        {strided_header(ints({3}), bin(8), ints({INT64_MAX})), GSER_ERR_FORMAT,
         "$.b: buffer strides[0] = 9223372036854775807: the elements span more than 2^63 - 1 bytes", {}},
        {strided_header(ints({3, 3}), bin(8), ints({INT64_MIN / 2, INT64_MIN / 2})), GSER_ERR_FORMAT,
         "$.b: buffer strides[1] = -4611686018427387904: the elements span more than", {}},
        {strided_header(ints({1LL << 40, 1LL << 30}), bin(8), ints({0, 0})), GSER_ERR_FORMAT,
         "$.b: buffer shape dim 1: the elements hold more than 2^63 - 1 bytes", {}},
        {strided_header(ints({1000, 1000}), bin(16), ints({0, 0})), GSER_ERR_FORMAT,
         "$.b: buffer data holds 16 bytes, its shape and strides span 8", {}},
        {strided_header(ints({4}), bin(24), ints({-8})), GSER_ERR_FORMAT,
         "$.b: buffer data holds 24 bytes, its shape and strides span 32", {}},
        {strided_header(ints({4}), ref, ints({-8}), GSER_WIRE_VERSION, {32}), GSER_ERR_FRAME,
         "$.b: 32 bytes at offset 8 are outside frame 1 of 32 bytes", {32}},
        {strided_header(ints(Dims(33, 1)), bin(8), ints(Dims(33, 0))), GSER_ERR_FORMAT,
         "$.b: buffer shape has 33 dims (1..32 allowed)", {}},
    };
    for (const Case &c : cases) {
        std::vector<std::string> data;
        std::vector<gser_frame_t> fr{{c.header.data(), c.header.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}}};
        for (size_t n : c.frames) {
            data.emplace_back(n, '\x22');
            fr.push_back({data.back().data(), n, GSER_MEMORY_HOST, 0, nullptr, nullptr, {}});
        }
        EXPECT_EQ(expect_failure(ctx(), fr.data(), fr.size()), c.st) << c.why;
        std::string err = gser_context_get_last_error(ctx());
        EXPECT_NE(err.find(c.why), std::string::npos) << err;
    }
}

TEST_F(Strides, HugeBroadcastsAndVersionOneHeadersDecode)
{
    // 2^40 one-byte elements that are all one byte: valid, and 1 byte on the wire.
    std::string h = strided_header(ints({1LL << 40}), bin(1), ints({0}), GSER_WIRE_VERSION, {}, GSER_DTYPE_UINT8);
    gser_frame_t f = {h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    gser_msg_t *m = nullptr;
    ASSERT_EQ(gser_deserialize(ctx(), &f, 1, nullptr, &m), GSER_OK) << gser_context_get_last_error(ctx());
    MsgPtr mp(m);
    gser_value_t *b;
    ASSERT_EQ(gser_map_find_cstr(gser_msg_get_root(m), "b", &b), GSER_OK);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    ASSERT_EQ(gser_value_get_buffer(b, &d), GSER_OK);
    EXPECT_EQ(d.nbytes, (size_t)1 << 40);
    EXPECT_EQ(elem<uint8_t>(d, {(1LL << 40) - 1}), 0x11);

    // A version 1 header (no strides anywhere) still reads.
    std::string v1 = craft(
        [](msgpack_packer *pk) {
            msgpack_pack_array(pk, 5);
            msgpack_pack_ext(pk, 0, 4);
            msgpack_pack_uint8(pk, GSER_DTYPE_INT16);
            ints({2})(pk);
            msgpack_pack_bin_with_body(pk, "\x01\x00\x02\x00", 4);
            msgpack_pack_uint8(pk, GSER_MEMORY_HOST);
        },
        1);
    f = {v1.data(), v1.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    ASSERT_EQ(gser_deserialize(ctx(), &f, 1, nullptr, &m), GSER_OK) << gser_context_get_last_error(ctx());
    mp.reset(m);
    ASSERT_EQ(gser_value_get_buffer(gser_msg_get_root(m), &d), GSER_OK);
    EXPECT_EQ(d.strides, nullptr);
    EXPECT_EQ(elem<int16_t>(d, {1}), 2);
}

// docs/wire-format.md section 11.6, byte for byte.
TEST_F(Strides, TheWireFormatExampleIsWhatGserWrites)
{
    auto m = new_msg();
    gser_value_t *root, *v;
    gser_msg_new_map(m.get(), &root);
    static const int16_t fortran[6] = {1, 4, 2, 5, 3, 6}; // [[1, 2, 3], [4, 5, 6]] in column order
    Dims fs{2, 3}, fst{2, 4};
    gser_buffer_desc_t d = layout(fortran, GSER_DTYPE_INT16, fs, &fst);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    gser_map_put_cstr(root, "f", v);
    static const float half = 0.5f;
    Dims zs{1000}, zst{0};
    d = layout(&half, GSER_DTYPE_FLOAT32, zs, &zst);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    gser_map_put_cstr(root, "z", v);
    static const uint8_t up[4] = {1, 2, 3, 4};
    Dims rs{4}, rst{-1};
    d = layout(&up[3], GSER_DTYPE_UINT8, rs, &rst);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    gser_map_put_cstr(root, "r", v);
    auto frames = send(m.get(), root);
    static const unsigned char expect[] = {
        0x94, 0xd6, 0x01, 0x47, 0x53, 0x45, 0x52, 0x02, 0x83, 0xa1, 0x66, 0x96, 0xc7, 0x00, 0x04, 0x03,
        0x92, 0x02, 0x03, 0xc4, 0x0c, 0x01, 0x00, 0x04, 0x00, 0x02, 0x00, 0x05, 0x00, 0x03, 0x00, 0x06,
        0x00, 0x00, 0x92, 0x02, 0x04, 0xa1, 0x7a, 0x96, 0xc7, 0x00, 0x04, 0x0c, 0x91, 0xcd, 0x03, 0xe8,
        0xc4, 0x04, 0x00, 0x00, 0x00, 0x3f, 0x00, 0x91, 0x00, 0xa1, 0x72, 0x96, 0xc7, 0x00, 0x04, 0x06,
        0x91, 0x04, 0xc4, 0x04, 0x01, 0x02, 0x03, 0x04, 0x00, 0x91, 0xff, 0x90};
    EXPECT_EQ(header_bytes(frames.get()), std::string(reinterpret_cast<const char *>(expect), sizeof expect));
    auto back = deserialize(ctx(), frames.get());
    EXPECT_TRUE(gser_value_equal(root, gser_msg_get_root(back.get())));
}

// ---- device buffers: the span is packed, staged, restored and scattered -----

namespace {

class DeviceStrides : public ::testing::TestWithParam<const char *> {
  public:
    void SetUp() override
    {
        gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
        o.trace = -1;
        o.device_backend = GetParam();
        o.pack_max = 256; // the 80-byte arrays are packed, the 2 KiB one is a frame of its own
        gser_context_t *c = nullptr;
        gser_status_t st = gser_context_create(&o, &c);
        if (st != GSER_OK && std::string(GetParam()) == "cuda")
            GTEST_SKIP() << "no usable CUDA device here: " << gser_context_get_last_error(nullptr);
        ASSERT_EQ(st, GSER_OK) << gser_context_get_last_error(nullptr);
        ctx_.reset(c);
    }
    void TearDown() override
    {
        for (auto &a : allocs_)
            gser_device_free(ctx(), a.first, a.second, nullptr);
    }
    gser_context_t *ctx() { return ctx_.get(); }
    // Device memory holding host's bytes.
    char *upload(const void *host, size_t n)
    {
        void *p = nullptr;
        EXPECT_EQ(gser_device_alloc(ctx(), n, nullptr, &p), GSER_OK);
        EXPECT_EQ(gser_device_memcpy(ctx(), p, GSER_MEMORY_DEVICE, host, GSER_MEMORY_HOST, n, nullptr), GSER_OK);
        allocs_.emplace_back(p, n);
        return static_cast<char *>(p);
    }
    // The elements of a received buffer, in C order of their indices, read
    // through its span (copied from the device first when it is there).
    std::vector<int32_t> elements(const gser_buffer_desc_t &d)
    {
        int64_t off;
        size_t span;
        EXPECT_EQ(gser_buffer_get_span(&d, &off, &span), GSER_OK);
        std::vector<char> host(span);
        const char *lo = static_cast<const char *>(d.data) + off;
        if (d.memory == GSER_MEMORY_DEVICE)
            EXPECT_EQ(gser_device_memcpy(ctx(), host.data(), GSER_MEMORY_HOST, lo, GSER_MEMORY_DEVICE, span, nullptr),
                      GSER_OK);
        else
            std::memcpy(host.data(), lo, span);
        gser_buffer_desc_t h = d;
        h.data = host.data() - off;
        std::vector<int32_t> out;
        for (int64_t i = 0; i < d.shape[0]; i++)
            for (int64_t j = 0; j < d.shape[1]; j++)
                out.push_back(elem<int32_t>(h, {i, j}));
        return out;
    }
    CtxPtr ctx_;
    std::vector<std::pair<void *, size_t>> allocs_;
};

} // namespace

TEST_P(DeviceStrides, LayoutsSurviveEveryDevicePath)
{
    // Three int32 arrays whose element (i, j) is 100 i + j: Fortran order
    // 4 x 5 (80 bytes, packed), a broadcast row 6 x 5 (20 bytes, packed), and
    // rows reversed 16 x 32 (2 KiB, a frame of its own).
    std::vector<int32_t> fortran(20), row(5), big(16 * 32);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            fortran[(size_t)(i + 4 * j)] = 100 * i + j;
    for (int j = 0; j < 5; j++)
        row[(size_t)j] = j;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 32; j++)
            big[(size_t)((15 - i) * 32 + j)] = 100 * i + j;
    const Dims fshape{4, 5}, fst{4, 16}, rshape{6, 5}, rst{0, 4}, bshape{16, 32}, bst{-128, 4};
    char *df = upload(fortran.data(), 80), *dr = upload(row.data(), 20), *db = upload(big.data(), 2048);
    std::vector<std::vector<int32_t>> want(3);
    for (int k = 0; k < 3; k++) {
        const Dims &s = k == 0 ? fshape : k == 1 ? rshape : bshape;
        for (int64_t i = 0; i < s[0]; i++)
            for (int64_t j = 0; j < s[1]; j++)
                want[(size_t)k].push_back(k == 1 ? (int32_t)j : (int32_t)(100 * i + j));
    }

    for (const char *family : {"device", "host"}) {
        for (unsigned flags : {0u, (unsigned)GSER_DESERIALIZE_RESTORE_DEVICE,
                               (unsigned)(GSER_DESERIALIZE_RESTORE_DEVICE | GSER_DESERIALIZE_SCATTER)}) {
            SCOPED_TRACE(std::string(family) + " flags " + std::to_string(flags));
            gser_msg_t *m = nullptr;
            ASSERT_EQ(gser_msg_create(ctx(), &m), GSER_OK);
            MsgPtr mp(m);
            gser_value_t *root, *v;
            gser_msg_new_list(m, &root);
            gser_buffer_desc_t d[3] = {layout(df, GSER_DTYPE_INT32, fshape, &fst),
                                       layout(dr, GSER_DTYPE_INT32, rshape, &rst),
                                       layout(db + 15 * 128, GSER_DTYPE_INT32, bshape, &bst)};
            for (auto &x : d) {
                x.memory = GSER_MEMORY_DEVICE;
                ASSERT_EQ(gser_msg_new_buffer(m, &x, &v), GSER_OK) << gser_context_get_last_error(ctx());
                gser_list_append(root, v);
            }
            gser_msg_set_root(m, root);
            gser_serialize_options_t so = GSER_SERIALIZE_OPTIONS_INIT;
            so.families = &family;
            so.nfamilies = 1;
            auto frames = serialize(ctx(), m, &so);
            ASSERT_TRUE(frames);
            ASSERT_EQ(gser_frames_wait(frames.get()), GSER_OK);
            const gser_frame_t *fr = gser_frames_get_array(frames.get());
            if (std::string(family) == "device") {
                ASSERT_EQ(gser_frames_get_count(frames.get()), 3u) << "one packed frame, one of its own";
                EXPECT_EQ(fr[1].size, 128u + 20u) << "the packed spans: 80 bytes at 0, the 20-byte row at 128";
                EXPECT_EQ(fr[2].data, db) << "the large span is the caller's memory";
                EXPECT_EQ(fr[2].size, 2048u);
            }
            auto back = deserialize(ctx(), frames.get(), flags);
            ASSERT_TRUE(back);
            ASSERT_EQ(gser_msg_wait(back.get()), GSER_OK);
            for (size_t k = 0; k < 3; k++) {
                gser_value_t *e;
                ASSERT_EQ(gser_list_get(gser_msg_get_root(back.get()), k, &e), GSER_OK);
                gser_buffer_desc_t r = GSER_BUFFER_DESC_INIT;
                ASSERT_EQ(gser_value_get_buffer(e, &r), GSER_OK);
                EXPECT_EQ(dims(r.strides, 2), dims(d[k].strides, 2)) << k;
                bool on_device = std::string(family) == "device" || (flags & GSER_DESERIALIZE_RESTORE_DEVICE);
                EXPECT_EQ(r.memory, on_device ? GSER_MEMORY_DEVICE : GSER_MEMORY_HOST) << k;
                EXPECT_EQ(elements(r), want[k]) << k;
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceStrides, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char *> &i) { return std::string(i.param); });
