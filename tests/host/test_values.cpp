// Building value trees and reading them back.
#include <cmath>
#include <cstdint>
#include <limits>

#include "host/common.hpp"

using Values = CtxTest;

TEST_F(Values, ScalarsReadBackWithTheirKinds)
{
    auto m = new_msg();
    gser_value_t *v;
    bool b;
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
    size_t n;

    GSER_OK_OR_FAIL(ctx(), gser_msg_new_nil(m.get(), &v));
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_NIL);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_bool(m.get(), true, &v));
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_BOOL);
    GSER_OK_OR_FAIL(ctx(), gser_value_get_bool(v, &b));
    EXPECT_TRUE(b);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), INT64_MIN, &v));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_int(v, &i));
    EXPECT_EQ(i, INT64_MIN);
    EXPECT_EQ(gser_value_get_uint(v, &u), GSER_ERR_OUT_OF_RANGE);
    EXPECT_EQ(gser_value_get_float(v, &d), GSER_ERR_TYPE_MISMATCH);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_uint(m.get(), UINT64_MAX, &v));
    EXPECT_EQ(gser_value_get_kind(v), GSER_KIND_UINT);
    GSER_OK_OR_FAIL(ctx(), gser_value_get_uint(v, &u));
    EXPECT_EQ(u, UINT64_MAX);
    EXPECT_EQ(gser_value_get_int(v, &i), GSER_ERR_OUT_OF_RANGE);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_uint(m.get(), 7, &v));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_int(v, &i));
    EXPECT_EQ(i, 7);
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_float(m.get(), -0.5, &v));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_float(v, &d));
    EXPECT_EQ(d, -0.5);
    const char text[] = "a\0b";
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_str(m.get(), text, 3, &v));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_str(v, &s, &n));
    EXPECT_EQ(n, 3u);
    EXPECT_EQ(std::memcmp(s, text, 3), 0);
    EXPECT_EQ(s[3], '\0') << "strings are stored NUL-terminated";
    EXPECT_NE(s, text) << "strings are copied";
    EXPECT_EQ(gser_value_get_len(v), 3u);
}

TEST_F(Values, BytesAreBorrowed)
{
    auto m = new_msg();
    unsigned char raw[5] = {1, 2, 3, 4, 5};
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_bytes(m.get(), raw, sizeof raw, &v));
    const void *p;
    size_t n;
    GSER_OK_OR_FAIL(ctx(), gser_value_get_bytes(v, &p, &n));
    EXPECT_EQ(p, raw);
    EXPECT_EQ(n, 5u);
    EXPECT_EQ(gser_msg_new_bytes(m.get(), nullptr, 3, &v), GSER_ERR_INVALID_ARG);
}

TEST_F(Values, UnboxedListStaysContiguousUntilMixed)
{
    auto m = new_msg();
    gser_value_t *l, *e;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_list(m.get(), &l));
    for (int i = 0; i < 100; i++)
        GSER_OK_OR_FAIL(ctx(), gser_list_append_int(l, i * 3));
    gser_kind_t k;
    const void *data;
    size_t count;
    GSER_OK_OR_FAIL(ctx(), gser_list_get_array(l, &k, &data, &count));
    EXPECT_EQ(k, GSER_KIND_INT);
    EXPECT_EQ(count, 100u);
    EXPECT_EQ(static_cast<const int64_t *>(data)[99], 297);

    // A boxed int of the same kind keeps it unboxed.
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), 1000, &e));
    GSER_OK_OR_FAIL(ctx(), gser_list_append(l, e));
    GSER_OK_OR_FAIL(ctx(), gser_list_get_array(l, &k, &data, &count));
    EXPECT_EQ(count, 101u);

    // Element access boxes on demand.
    GSER_OK_OR_FAIL(ctx(), gser_list_get(l, 50, &e));
    int64_t i;
    GSER_OK_OR_FAIL(ctx(), gser_value_get_int(e, &i));
    EXPECT_EQ(i, 150);

    // A float makes it mixed: kinds of every element are kept.
    GSER_OK_OR_FAIL(ctx(), gser_list_append_float(l, 2.5));
    EXPECT_EQ(gser_list_get_array(l, &k, &data, &count), GSER_ERR_TYPE_MISMATCH);
    ASSERT_EQ(gser_value_get_len(l), 102u);
    GSER_OK_OR_FAIL(ctx(), gser_list_get(l, 100, &e));
    EXPECT_EQ(gser_value_get_kind(e), GSER_KIND_INT);
    GSER_OK_OR_FAIL(ctx(), gser_value_get_int(e, &i));
    EXPECT_EQ(i, 1000);
    GSER_OK_OR_FAIL(ctx(), gser_list_get(l, 101, &e));
    EXPECT_EQ(gser_value_get_kind(e), GSER_KIND_FLOAT);
    EXPECT_EQ(gser_list_get(l, 102, &e), GSER_ERR_OUT_OF_RANGE);
}

TEST_F(Values, ArrayFromCArrayIsBorrowedAndCopiedOnAppend)
{
    auto m = new_msg();
    double src[4] = {1, 2, 3, 4};
    gser_value_t *l;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_array(m.get(), GSER_KIND_FLOAT, src, 4, 0, &l));
    gser_kind_t k;
    const void *data;
    size_t count;
    GSER_OK_OR_FAIL(ctx(), gser_list_get_array(l, &k, &data, &count));
    EXPECT_EQ(data, src) << "borrowed, not copied";
    GSER_OK_OR_FAIL(ctx(), gser_list_append_float(l, 5));
    GSER_OK_OR_FAIL(ctx(), gser_list_get_array(l, &k, &data, &count));
    EXPECT_NE(data, src) << "appending to a borrowed array copies it first";
    EXPECT_EQ(count, 5u);
    EXPECT_EQ(static_cast<const double *>(data)[4], 5.0);
    EXPECT_EQ(src[3], 4.0);

    gser_value_t *c;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_array(m.get(), GSER_KIND_FLOAT, src, 4, GSER_ARRAY_COPY | GSER_ARRAY_TUPLE, &c));
    EXPECT_EQ(gser_value_get_kind(c), GSER_KIND_TUPLE);
    GSER_OK_OR_FAIL(ctx(), gser_list_get_array(c, &k, &data, &count));
    EXPECT_NE(data, src);

    unsigned char bad_bools[2] = {1, 7};
    EXPECT_EQ(gser_msg_new_array(m.get(), GSER_KIND_BOOL, bad_bools, 2, 0, &c), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("bool element 1 is 7"), std::string::npos)
        << gser_context_get_last_error(ctx());
    EXPECT_EQ(gser_msg_new_array(m.get(), GSER_KIND_STR, src, 1, 0, &c), GSER_ERR_INVALID_ARG);
}

TEST_F(Values, MapsKeepOrderAndAcceptScalarKeys)
{
    auto m = new_msg();
    gser_value_t *map, *k, *v, *got;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_map(m.get(), &map));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), 1, &v));
    GSER_OK_OR_FAIL(ctx(), gser_map_put_cstr(map, "z", v));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), -4, &k));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_cstr(m.get(), "neg", &v));
    GSER_OK_OR_FAIL(ctx(), gser_map_put(map, k, v));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_float(m.get(), 0.5, &k));
    GSER_OK_OR_FAIL(ctx(), gser_map_put(map, k, v));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_list(m.get(), &k));
    EXPECT_EQ(gser_map_put(map, k, v), GSER_ERR_INVALID_ARG) << "containers are not keys";

    ASSERT_EQ(gser_value_get_len(map), 3u);
    GSER_OK_OR_FAIL(ctx(), gser_map_get_at(map, 0, &k, &v));
    const char *s;
    GSER_OK_OR_FAIL(ctx(), gser_value_get_str(k, &s, nullptr));
    EXPECT_STREQ(s, "z");
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(m.get(), -4, &k));
    GSER_OK_OR_FAIL(ctx(), gser_map_find(map, k, &got));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_str(got, &s, nullptr));
    EXPECT_STREQ(s, "neg");
    EXPECT_EQ(gser_map_find_cstr(map, "missing", &got), GSER_ERR_NOT_FOUND);
    EXPECT_EQ(gser_map_get_at(map, 3, &k, &v), GSER_ERR_OUT_OF_RANGE);
}

TEST_F(Values, BufferDescriptionsAreValidated)
{
    auto m = new_msg();
    float img[2][3] = {};
    int64_t shape[2] = {2, 3};
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = img;
    d.nbytes = sizeof img;
    d.dtype = GSER_DTYPE_FLOAT32;
    d.ndim = 2;
    d.shape = shape;
    gser_value_t *v;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    gser_buffer_desc_t got = GSER_BUFFER_DESC_INIT;
    GSER_OK_OR_FAIL(ctx(), gser_value_get_buffer(v, &got));
    EXPECT_EQ(got.data, img);
    EXPECT_EQ(got.ndim, 2u);
    EXPECT_EQ(got.shape[1], 3);
    EXPECT_NE(got.shape, shape) << "the shape is copied into the message";

    d.nbytes = sizeof img - 4;
    EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx())).find("shape holds 24 bytes"), std::string::npos)
        << gser_context_get_last_error(ctx());
    d.nbytes = sizeof img;
    d.dtype = static_cast<gser_dtype_t>(99);
    EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG);
    d.dtype = GSER_DTYPE_FLOAT32;
    d.ndim = GSER_MAX_NDIM + 1;
    EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG);
    d.ndim = 0;
    d.nbytes = 6; // not a multiple of 4
    EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG);

    // Copy on request.
    d.nbytes = sizeof img;
    d.flags = GSER_BUFFER_COPY;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
    GSER_OK_OR_FAIL(ctx(), gser_value_get_buffer(v, &got));
    EXPECT_NE(got.data, img);
    EXPECT_EQ(std::memcmp(got.data, img, sizeof img), 0);
}

static void count_release(void *, void *arg)
{
    ++*static_cast<int *>(arg);
}

TEST_F(Values, OwnedBufferIsReleasedOnceWithTheMessage)
{
    int released = 0;
    {
        auto m = new_msg();
        gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
        static char bytes[16];
        d.data = bytes;
        d.nbytes = sizeof bytes;
        d.release = count_release;
        d.release_arg = &released;
        gser_value_t *v;
        GSER_OK_OR_FAIL(ctx(), gser_msg_new_buffer(m.get(), &d, &v));
        d.flags = GSER_BUFFER_COPY;
        EXPECT_EQ(gser_msg_new_buffer(m.get(), &d, &v), GSER_ERR_INVALID_ARG) << "copy and release conflict";
        EXPECT_EQ(released, 0);
    }
    EXPECT_EQ(released, 1);
}

TEST_F(Values, EqualityIsDeep)
{
    auto m = new_msg();
    gser_value_t *a, *b, *x;
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_list(m.get(), &a));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_list(m.get(), &b));
    for (int i = 0; i < 3; i++) {
        GSER_OK_OR_FAIL(ctx(), gser_list_append_float(a, i));
        GSER_OK_OR_FAIL(ctx(), gser_msg_new_float(m.get(), i, &x));
        GSER_OK_OR_FAIL(ctx(), gser_list_append(b, x));
    }
    EXPECT_TRUE(gser_value_equal(a, b));
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_tuple(m.get(), &x));
    EXPECT_FALSE(gser_value_equal(a, x)) << "a tuple is not a list";
    GSER_OK_OR_FAIL(ctx(), gser_list_append_float(b, std::nan("")));
    GSER_OK_OR_FAIL(ctx(), gser_list_append_float(a, std::nan("")));
    EXPECT_TRUE(gser_value_equal(a, b)) << "NaN equals NaN for round-trip checks";
    GSER_OK_OR_FAIL(ctx(), gser_list_append_int(a, 1));
    GSER_OK_OR_FAIL(ctx(), gser_list_append_uint(b, 1));
    EXPECT_FALSE(gser_value_equal(a, b)) << "int and uint are different kinds";
}

TEST_F(Values, NullArgumentsAreErrorsNotCrashes)
{
    gser_value_t *v = nullptr;
    EXPECT_EQ(gser_msg_new_int(nullptr, 1, &v), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_list_append(nullptr, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_map_put_cstr(nullptr, "a", nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_msg_create(nullptr, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_serialize(nullptr, nullptr, nullptr, nullptr), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(gser_deserialize(ctx(), nullptr, 0, nullptr, nullptr), GSER_ERR_INVALID_ARG);
    gser_msg_t *m = nullptr;
    EXPECT_EQ(gser_deserialize(ctx(), nullptr, 0, nullptr, &m), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(m, nullptr) << "outputs are set only on success";
    gser_msg_destroy(nullptr);
    gser_frames_destroy(nullptr);
    gser_context_destroy(nullptr);
    auto msg = new_msg();
    GSER_OK_OR_FAIL(ctx(), gser_msg_new_int(msg.get(), 1, &v));
    EXPECT_EQ(gser_list_append_int(v, 2), GSER_ERR_INVALID_ARG) << "an int is not a list";
    EXPECT_EQ(gser_value_get_len(v), 0u);
}

TEST(Status, EveryStatusHasAString)
{
    for (int s = GSER_INPROGRESS; s >= GSER_STATUS_LAST; s--) {
        std::string str = gser_status_str(static_cast<gser_status_t>(s));
        EXPECT_EQ(str.rfind("GSER_", 0), 0u) << s;
        EXPECT_EQ(str.find('?'), std::string::npos) << s << " " << str;
    }
    EXPECT_NE(std::string(gser_status_str(static_cast<gser_status_t>(-999))).find('?'), std::string::npos);
    EXPECT_STREQ(gser_dtype_str(GSER_DTYPE_FLOAT64), "float64");
    EXPECT_EQ(gser_dtype_size(GSER_DTYPE_COMPLEX128), 16u);
    EXPECT_STREQ(gser_kind_str(GSER_KIND_TUPLE), "tuple");
    EXPECT_STREQ(gser_memory_str(GSER_MEMORY_DEVICE), "device");
    EXPECT_EQ(std::string(gser_version_str()), std::to_string(GSER_VERSION_MAJOR) + "." +
                                                   std::to_string(GSER_VERSION_MINOR) + "." +
                                                   std::to_string(GSER_VERSION_PATCH))
        << "the library and its headers were built from one version";
}
