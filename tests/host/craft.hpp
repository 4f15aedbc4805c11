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

