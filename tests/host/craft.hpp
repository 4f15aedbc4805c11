// Hand-made headers for the decoder's refusals: a header around msgpack
// written by a test, and a check that decoding it fails cleanly.
#pragma once

#include <msgpack.h>

#include "host/common.hpp"

inline bool is_error(gser_status_t st)
{
    return st < 0 && std::string(gser_status_str(st)).find('?') == std::string::npos;
}

// Deserialize frames and expect a failure status (and no output).
inline gser_status_t expect_failure(gser_context_t *ctx, const gser_frame_t *fr, size_t n, unsigned flags = 0,
                                    const gser_limits_t *lim = nullptr)
{
    gser_deserialize_options_t o = GSER_DESERIALIZE_OPTIONS_INIT;
    o.flags = flags;
    o.limits = lim;
    gser_msg_t *m = nullptr;
    gser_status_t st = gser_deserialize(ctx, fr, n, &o, &m);
    EXPECT_TRUE(is_error(st)) << gser_status_str(st);
    EXPECT_EQ(m, nullptr);
    EXPECT_NE(std::string(gser_context_get_last_error(ctx)), "") << "an error always has a message";
    gser_msg_destroy(m);
    return st;
}

// A header whose root is the msgpack built by fn, and a frame table of host
// frames of the given sizes (none by default).
template <class Fn>
std::string craft(Fn fn, uint32_t version = GSER_WIRE_VERSION, const std::vector<size_t> &frame_sizes = {})
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_ext_with_body(&pk, "GSER", 4, 1);
    msgpack_pack_uint32(&pk, version);
    fn(&pk);
    msgpack_pack_array(&pk, frame_sizes.size());
    for (size_t size : frame_sizes) {
        msgpack_pack_array(&pk, 3);
        msgpack_pack_uint64(&pk, size);
        msgpack_pack_uint8(&pk, GSER_MEMORY_HOST);
        msgpack_pack_uint8(&pk, 0);
    }
    std::string s(sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return s;
}

inline gser_status_t decode_crafted(gser_context_t *ctx, const std::string &h, std::string *err = nullptr)
{
    gser_frame_t f = {h.data(), h.size(), GSER_MEMORY_HOST, 0, nullptr, nullptr, {}};
    gser_status_t st = expect_failure(ctx, &f, 1);
    if (err)
        *err = gser_context_get_last_error(ctx);
    return st;
}


// A flat host buffer marker whose data is the reference [frame, offset, nbytes].
inline void pack_buffer_ref(msgpack_packer *pk, gser_dtype_t dtype, uint64_t frame, uint64_t offset, uint64_t nbytes)
{
    msgpack_pack_array(pk, 5);
    msgpack_pack_ext(pk, 0, 4);
    msgpack_pack_uint8(pk, (uint8_t)dtype);
    msgpack_pack_nil(pk);
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, frame);
    msgpack_pack_uint64(pk, offset);
    msgpack_pack_uint64(pk, nbytes);
    msgpack_pack_uint8(pk, GSER_MEMORY_HOST);
}

// An object marker up to its sub-header: [ext(6), type, family, version 1,
// base, count, ...]; the caller packs the sub-header (a bin) after it.
inline void pack_object_head(msgpack_packer *pk, const std::string &type, const std::string &family, uint64_t base,
                             uint64_t count)
{
    msgpack_pack_array(pk, 7);
    msgpack_pack_ext(pk, 0, 6);
    msgpack_pack_str_with_body(pk, type.data(), type.size());
    msgpack_pack_str_with_body(pk, family.data(), family.size());
    msgpack_pack_uint8(pk, 1);
    msgpack_pack_uint64(pk, base);
    msgpack_pack_uint64(pk, count);
}

// The msgpack of n typed objects nested in one another (each object's
// sub-header is the next object; the innermost holds nil), built from the
// inside out in linear time: level k is its marker's fields, a bin header,
// then level k + 1.
inline std::string nested_objects(size_t n, const std::string &type = "t", const std::string &family = "host")
{
    std::vector<std::string> heads(n);
    size_t inner = 1; // "\xc0"
    for (size_t k = n; k-- > 0;) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        pack_object_head(&pk, type, family, 0, 0);
        msgpack_pack_bin(&pk, inner);
        heads[k].assign(sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
        inner += heads[k].size();
    }
    std::string out;
    out.reserve(inner);
    for (const std::string &h : heads)
        out += h;
    return out + "\xc0";
}

// A header-only message in the flattened form.
inline std::string flat_header(const std::string &h)
{
    std::string p("\x89GSER\r\n\x1a\x01\x00\x00\x00\x01\x00\x00\x00", 16);
    uint64_t n = h.size();
    p.append(reinterpret_cast<const char *>(&n), 8);
    return p + h + std::string((8 - h.size() % 8) % 8, '\0');
}

// A header around raw msgpack bytes as its root.
inline std::string craft_raw(const std::string &root)
{
    return craft([&](msgpack_packer *pk) { pk->callback(pk->data, root.data(), root.size()); });
}
