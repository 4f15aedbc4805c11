// GSER_TRACE output: path, kind/type, family, memory, bytes.
#include <cstdio>
#include <cstdlib>

#include "host/common.hpp"

TEST(Trace, SerializeAndDeserializePrintTheTree)
{
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    auto ctx = make_trace_ctx(f);
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    Blob blob{5, "five", std::vector<double>(100, 1.0)};
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *root, *l, *v;
    gser_msg_new_map(m, &root);
    gser_msg_new_list(m, &l);
    for (int i = 0; i < 1000; i++)
        gser_list_append_float(l, 1.5);
    gser_map_put_cstr(root, "data", l);
    gser_msg_new_object(m, "test.blob", &blob, &v);
    gser_map_put_cstr(root, "payload", v);
    gser_msg_new_cstr(m, "go", &v);
    gser_map_put_cstr(root, "op", v);
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx.get(), m);
    std::string out = read_all(f);
    EXPECT_NE(out.find("[gser] serialize $  map n=3"), std::string::npos) << out;
    EXPECT_NE(out.find("[gser] serialize $.data  list array<float> n=1000 bytes=8000 frame 1 host"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[gser] serialize $.payload  object type=test.blob family=host version=1 frames=1"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[gser] serialize $.payload.data  buffer float64 ndim=0 bytes=800 frame 2 host"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[gser] serialize $.op  str \"go\""), std::string::npos) << out;
    EXPECT_NE(out.find("[gser] serialize frame 1 host 8000 bytes"), std::string::npos) << out;

    fclose(f);
    f = tmpfile();
    auto rx = make_trace_ctx(f);
    auto back = deserialize(rx.get(), frames.get(), GSER_DESERIALIZE_ALLOW_UNKNOWN);
    out = read_all(f);
    EXPECT_NE(out.find("[gser] deserialize header"), std::string::npos) << out;
    EXPECT_NE(out.find("[gser] deserialize $.data  list array<float> n=1000 bytes=8000 frame 1 host"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[gser] deserialize $.payload  serialized type=\"test.blob\" family=\"host\" version=1 frames=1"),
              std::string::npos)
        << out;
    fclose(f);
}

TEST(Trace, EnvironmentVariableTurnsItOnAndOffByDefault)
{
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.trace_stream = f; // trace == 0: follow GSER_TRACE
    for (const char *env : {"1", "0"}) {
        setenv("GSER_TRACE", env, 1);
        gser_context_t *c = nullptr;
        ASSERT_EQ(gser_context_create(&o, &c), GSER_OK);
        CtxPtr ctx(c);
        gser_msg_t *m;
        ASSERT_EQ(gser_msg_create(c, &m), GSER_OK);
        MsgPtr mp(m);
        gser_value_t *v;
        gser_msg_new_int(m, 12345, &v);
        gser_msg_set_root(m, v);
        auto frames = serialize(c, m);
        std::string out = read_all(f);
        if (env[0] == '1')
            EXPECT_NE(out.find("[gser] serialize $  int 12345"), std::string::npos) << out;
        else
            EXPECT_EQ(out.find("int 12345", out.find("int 12345") + 1), std::string::npos)
                << "GSER_TRACE=0 adds nothing: " << out;
    }
    unsetenv("GSER_TRACE");
    fclose(f);
}

// A failure names the same path whether the encoder traces (and keeps the
// path as it goes) or not (and gathers it on the way out).
TEST(Trace, FailuresNameTheSamePathTracedOrNot)
{
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    for (bool traced : {false, true}) {
        auto ctx = traced ? make_trace_ctx(f) : make_ctx();
        BlobStats stats;
        register_blob(ctx.get(), &stats, {"host"});
        Blob bad{-5, "neg", {}};
        gser_msg_t *m;
        ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
        MsgPtr mp(m);
        gser_value_t *root, *l, *v;
        gser_msg_new_map(m, &root);
        gser_msg_new_list(m, &l);
        gser_list_append_int(l, 1);
        gser_msg_new_object(m, "test.blob", &bad, &v);
        gser_list_append(l, v);
        gser_map_put_cstr(root, "tasks", l);
        gser_msg_set_root(m, root);
        gser_frames_t *fr = nullptr;
        EXPECT_EQ(gser_serialize(ctx.get(), m, nullptr, &fr), GSER_ERR_INVALID_ARG);
        EXPECT_EQ(std::string(gser_context_get_last_error(ctx.get())),
                  "$.tasks[1]: type \"test.blob\", family \"host\": serializer failed: blob id -5 is negative")
            << (traced ? "traced" : "not traced");
    }
    fclose(f);
}
