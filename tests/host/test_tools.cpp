// gser-demo and gser-inspect, run as programs.
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>

#include "host/common.hpp"
#include "host/craft.hpp"

#if defined(GSER_INSPECT_PATH) && defined(GSER_DEMO_PATH)

namespace {

struct ProcResult {
    int status;
    std::string out;
};

ProcResult run(const std::string &cmd)
{
    FILE *p = popen((cmd + " 2>&1").c_str(), "r");
    ProcResult r{-1, ""};
    if (!p)
        return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0)
        r.out.append(buf, n);
    int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

std::string tmp_path(const char *name)
{
    const char *dir = getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/gser-test-" + std::to_string(getpid()) + "-" + name;
}

// gser-inspect on the flattened frames.
ProcResult inspect_frames(const gser_frames_t *frames, const char *name)
{
    std::string file = tmp_path(name);
    FILE *f = fopen(file.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gser_flat_write_file(gser_frames_get_array(frames), gser_frames_get_count(frames), f), GSER_OK);
    fclose(f);
    ProcResult r = run(std::string(GSER_INSPECT_PATH) + " " + file);
    std::remove(file.c_str());
    return r;
}

} // namespace

TEST(Tools, DemoWritesAMessageThatInspectPrints)
{
    std::string file = tmp_path("demo.gser");
    ProcResult demo = run(std::string(GSER_DEMO_PATH) + " --n 1000 --out " + file);
    ASSERT_EQ(demo.status, 0) << demo.out;
    EXPECT_NE(demo.out.find("round trip verified"), std::string::npos) << demo.out;
    ProcResult insp = run(std::string(GSER_INSPECT_PATH) + " " + file);
    ASSERT_EQ(insp.status, 0) << insp.out;
    EXPECT_NE(insp.out.find("\"op\": str \"compute-task\""), std::string::npos) << insp.out;
    EXPECT_NE(insp.out.find("\"data\": list array<float> n=1000 (8000 bytes, frame 1)"), std::string::npos)
        << insp.out;
    EXPECT_NE(insp.out.find("\"priority\": tuple n=3"), std::string::npos) << insp.out;
    EXPECT_NE(insp.out.find("\"image\": buffer int32 shape=(64, 64) 16384 bytes host, frame 2"), std::string::npos)
        << insp.out;
    // stdin works too
    ProcResult piped = run(std::string(GSER_INSPECT_PATH) + " - < " + file);
    EXPECT_EQ(piped.status, 0);
    EXPECT_EQ(piped.out, insp.out);
    std::remove(file.c_str());
}

TEST(Tools, InspectShowsUnknownObjectsWithoutTheirType)
{
    auto ctx = make_ctx();
    BlobStats stats;
    register_blob(ctx.get(), &stats, {"host"});
    Blob blob{11, "eleven", std::vector<double>(64, 2.0)};
    auto m = blob_msg(ctx.get(), &blob);
    auto frames = serialize(ctx.get(), m.get());
    ProcResult insp = inspect_frames(frames.get(), "obj.gser");
    ASSERT_EQ(insp.status, 0) << insp.out;
    EXPECT_NE(insp.out.find("object type=\"test.blob\" family=\"host\" version=1 frames=1"), std::string::npos)
        << insp.out;
    EXPECT_NE(insp.out.find("\"name\": str \"eleven\""), std::string::npos) << insp.out;
    EXPECT_NE(insp.out.find("\"data\": buffer float64 512 bytes host, frame 1"), std::string::npos) << insp.out;
}

TEST(Tools, InspectPrintsStridesAndSpans)
{
    auto ctx = make_ctx();
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(ctx.get(), &m), GSER_OK);
    MsgPtr mp(m);
    std::vector<double> base(30 * 40, 1.0);
    const double one = 2.5;
    int64_t fshape[2] = {30, 40}, fstrides[2] = {8, 240}, zshape[2] = {1000, 1000}, zstrides[2] = {0, 0};
    gser_value_t *root, *v;
    gser_msg_new_map(m, &root);
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = base.data();
    d.nbytes = base.size() * 8;
    d.dtype = GSER_DTYPE_FLOAT64;
    d.ndim = 2;
    d.shape = fshape;
    d.strides = fstrides;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    gser_map_put_cstr(root, "f", v);
    d.data = &one;
    d.nbytes = 8000000;
    d.shape = zshape;
    d.strides = zstrides;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    gser_map_put_cstr(root, "z", v);
    gser_msg_set_root(m, root);
    auto frames = serialize(ctx.get(), m);
    ProcResult insp = inspect_frames(frames.get(), "strides.gser");
    ASSERT_EQ(insp.status, 0) << insp.out;
    EXPECT_NE(insp.out.find("gser message, wire format 2:"), std::string::npos) << insp.out;
    EXPECT_NE(insp.out.find("\"f\": buffer float64 shape=(30, 40) strides=(8, 240) 9600 bytes (span 9600) host, frame 1"),
              std::string::npos)
        << insp.out;
    EXPECT_NE(insp.out.find("\"z\": buffer float64 shape=(1000, 1000) strides=(0, 0) 8000000 bytes (span 8) host, inline"),
              std::string::npos)
        << insp.out;
}

TEST(Tools, InspectRejectsBadFilesWithOneLine)
{
    std::string file = tmp_path("bad.gser");
    FILE *f = fopen(file.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fputs("this is not a gser message\n", f);
    fclose(f);
    ProcResult r = run(std::string(GSER_INSPECT_PATH) + " " + file);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("GSER_ERR_BAD_MAGIC"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;

    // A truncated real message.
    std::string good = tmp_path("good.gser");
    ASSERT_EQ(run(std::string(GSER_DEMO_PATH) + " --n 100 --out " + good).status, 0);
    r = run("head -c 100 " + good + " | " + GSER_INSPECT_PATH + " -");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("GSER_ERR_TRUNCATED"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;

    // An empty file, and empty standard input.
    std::string empty = tmp_path("empty.gser");
    fclose(fopen(empty.c_str(), "wb"));
    r = run(std::string(GSER_INSPECT_PATH) + " " + empty);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("GSER_ERR_BAD_MAGIC"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    r = run(std::string(GSER_INSPECT_PATH) + " - < /dev/null");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("GSER_ERR_BAD_MAGIC"), std::string::npos) << r.out;
    std::remove(empty.c_str());

    r = run(std::string(GSER_INSPECT_PATH) + " /nonexistent/file");
    EXPECT_EQ(r.status, 2);
    r = run(std::string(GSER_INSPECT_PATH));
    EXPECT_EQ(r.status, 2);
    std::remove(file.c_str());
    std::remove(good.c_str());
}

namespace {

std::string write_tmp(const char *name, const std::string &bytes)
{
    std::string file = tmp_path(name);
    FILE *f = fopen(file.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    fclose(f);
    return file;
}

} // namespace

TEST(Tools, InspectSurvivesHostileFiles)
{
    const std::string inspect = GSER_INSPECT_PATH;
    // Endless zeros: one line, the magic, at once.
    ProcResult r = run(inspect + " /dev/zero");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("GSER_ERR_BAD_MAGIC"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    r = run("head -c 100000000 /dev/zero | " + inspect + " -");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("GSER_ERR_BAD_MAGIC"), std::string::npos) << r.out;

    // 60,000 nested objects (1.2 MB): refused by the depth limit, no stack overflow.
    std::string deep = write_tmp("deep.gser", flat_header(craft_raw(nested_objects(60000))));
    r = run(inspect + " " + deep);
    EXPECT_EQ(r.status, 1) << r.out.substr(0, 2000);
    EXPECT_NE(r.out.find("GSER_ERR_LIMIT_DEPTH"), std::string::npos) << r.out.substr(0, 2000);
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out.substr(0, 2000);
    std::remove(deep.c_str());

    // 29 of them, each type name a terminal escape: every level printed, the
    // output a few lines per object, and no escape byte reaches the terminal.
    const std::string evil = "\x1b[2J\x1b]0;owned\x07";
    std::string names = write_tmp("names.gser", flat_header(craft_raw(nested_objects(GSER_DEPTH_MAX - 1, evil, evil))));
    r = run(inspect + " " + names);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
    EXPECT_EQ(r.out.find('\x07'), std::string::npos);
    size_t objects = 0;
    for (size_t at = 0; (at = r.out.find("object type=\"\\x1b[2J\\x1b]0;owned\\x07\" family=\"\\x1b", at)) !=
                        std::string::npos;
         at++)
        objects++;
    EXPECT_EQ(objects, (size_t)GSER_DEPTH_MAX - 1) << r.out;
    EXPECT_LT(r.out.size(), 29u * 200) << "indentation is bounded by the depth limit";
    std::remove(names.c_str());

    // The same names in an error line on stderr.
    std::string bad = nested_objects(1, evil);
    bad.back() = '\xc1'; // the sub-header's only byte: never valid msgpack
    std::string badf = write_tmp("badsub.gser", flat_header(craft_raw(bad)));
    r = run(inspect + " " + badf);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("sub-header of type \"\\x1b[2J\\x1b]0;owned\\x07\" holds an invalid byte at byte 0 of 1"),
              std::string::npos)
        << r.out;
    std::remove(badf.c_str());

    // An unknown device backend does not matter to a tool that needs none.
    std::string good = tmp_path("good.gser");
    ASSERT_EQ(run(std::string(GSER_DEMO_PATH) + " --n 10 --out " + good).status, 0);
    r = run("GSER_DEVICE=garbage " + inspect + " " + good);
    EXPECT_EQ(r.status, 0) << r.out;
    std::remove(good.c_str());
}

#else
TEST(Tools, Skipped)
{
    GTEST_SKIP() << "built without GSER_BUILD_TOOLS";
}
#endif
