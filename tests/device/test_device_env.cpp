// GSER_DEVICE with a value that names no backend: a context is still made
// (without a device backend), so what needs no device keeps working -- a
// tool reading a file, a host-memory message -- and the first use of device
// memory fails with a message that names the variable, its value and the
// values it takes. The same name given in gser_context_options_t fails at
// create. (The Python side: tests/plugins/python/test_device_env.py.)
#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>

#include "host/common.hpp"

namespace {

// GSER_DEVICE set for the life of the object.
struct Env {
    std::string old;
    bool had;
    explicit Env(const char *value)
    {
        const char *o = std::getenv("GSER_DEVICE");
        had = o != nullptr;
        if (had)
            old = o;
        setenv("GSER_DEVICE", value, 1);
    }
    ~Env()
    {
        if (had)
            setenv("GSER_DEVICE", old.c_str(), 1);
        else
            unsetenv("GSER_DEVICE");
    }
};

bool mentions_all(const std::string &m, std::initializer_list<const char *> parts)
{
    for (auto *p : parts)
        if (m.find(p) == std::string::npos)
            return false;
    return true;
}

} // namespace

TEST(DeviceEnv, AnUnknownGserDeviceLeavesAContextWithoutABackendThatSaysWhy)
{
    Env env("cdua");
    gser_context_t *c = nullptr;
    ASSERT_EQ(gser_context_create(nullptr, &c), GSER_OK) << gser_context_get_last_error(nullptr);
    CtxPtr cp(c);
    EXPECT_STREQ(gser_context_get_device_backend(c), "none");

    // Host data works as always.
    gser_msg_t *m;
    ASSERT_EQ(gser_msg_create(c, &m), GSER_OK);
    MsgPtr mp(m);
    gser_value_t *v;
    ASSERT_EQ(gser_msg_new_cstr(m, "hello", &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    gser_frames_t *f;
    ASSERT_EQ(gser_serialize(c, m, nullptr, &f), GSER_OK);
    gser_frames_destroy(f);

    // Device memory says why there is no backend.
    void *p = nullptr;
    EXPECT_EQ(gser_device_alloc(c, 64, nullptr, &p), GSER_ERR_NO_DEVICE);
    std::string msg = gser_context_get_last_error(c);
    EXPECT_TRUE(mentions_all(msg, {"gser_device_alloc", "GSER_DEVICE", "\"cdua\"", "cuda, emulated, none, auto"}))
        << msg;
    static char fake_device_bytes[100];
    gser_buffer_desc_t d = GSER_BUFFER_DESC_INIT;
    d.data = fake_device_bytes;
    d.nbytes = sizeof fake_device_bytes;
    d.memory = GSER_MEMORY_DEVICE;
    ASSERT_EQ(gser_msg_new_buffer(m, &d, &v), GSER_OK);
    ASSERT_EQ(gser_msg_set_root(m, v), GSER_OK);
    EXPECT_EQ(gser_serialize(c, m, nullptr, &f), GSER_ERR_NO_DEVICE);
    msg = gser_context_get_last_error(c);
    EXPECT_TRUE(mentions_all(msg, {"gser_serialize", "GSER_DEVICE", "\"cdua\""})) << msg;
}

TEST(DeviceEnv, AnUnknownBackendInTheOptionsFailsAtCreate)
{
    Env env("emulated"); // the option wins over the environment
    gser_context_options_t o = GSER_CONTEXT_OPTIONS_INIT;
    o.device_backend = "quantum\x1b[2J";
    gser_context_t *c = nullptr;
    EXPECT_EQ(gser_context_create(&o, &c), GSER_ERR_INVALID_ARG);
    EXPECT_EQ(c, nullptr);
    std::string msg = gser_context_get_last_error(nullptr);
    EXPECT_TRUE(mentions_all(msg, {"gser_context_options_t.device_backend", "\"quantum?[2J\"", "cuda, emulated"}))
        << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << "the name is printed escaped";
}

TEST(DeviceEnv, KnownNamesStillWork)
{
    for (const char *name : {"emulated", "none", "auto", ""}) {
        Env env(name);
        gser_context_t *c = nullptr;
        ASSERT_EQ(gser_context_create(nullptr, &c), GSER_OK) << name << ": " << gser_context_get_last_error(nullptr);
        CtxPtr cp(c);
        if (std::string(name) == "emulated") {
            EXPECT_STREQ(gser_context_get_device_backend(c), "emulated");
        }
        if (std::string(name) == "none") {
            void *p;
            EXPECT_EQ(gser_device_alloc(c, 8, nullptr, &p), GSER_ERR_NO_DEVICE);
            EXPECT_EQ(std::string(gser_context_get_last_error(c)).find("GSER_DEVICE is"), std::string::npos);
        }
    }
}

#if defined(GSER_INSPECT_PATH) && defined(GSER_DEMO_PATH)
// gser-inspect needs no device: GSER_DEVICE=garbage changes nothing for it.
TEST(DeviceEnv, InspectReadsFilesWhateverGserDeviceSays)
{
    std::string file = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/gser-env-" +
                       std::to_string(getpid()) + ".gser";
    auto run = [](const std::string &cmd, std::string *out) {
        FILE *p = popen((cmd + " 2>&1").c_str(), "r");
        char buf[4096];
        size_t n;
        while (p && (n = fread(buf, 1, sizeof buf, p)) > 0)
            out->append(buf, n);
        int st = p ? pclose(p) : -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    };
    std::string out;
    ASSERT_EQ(run(std::string(GSER_DEMO_PATH) + " --n 100 --out " + file, &out), 0) << out;
    std::string with_garbage, plain;
    EXPECT_EQ(run("GSER_DEVICE=garbage " + std::string(GSER_INSPECT_PATH) + " " + file, &with_garbage), 0)
        << with_garbage;
    EXPECT_EQ(run("GSER_DEVICE=none " + std::string(GSER_INSPECT_PATH) + " " + file, &plain), 0) << plain;
    EXPECT_EQ(with_garbage, plain) << "the same tree, no complaint: the tool uses no device memory";
    EXPECT_NE(with_garbage.find("\"op\": str \"compute-task\""), std::string::npos) << with_garbage;
    std::remove(file.c_str());
}
#endif
