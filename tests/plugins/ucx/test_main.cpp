// main() of the UCX tests: googletest, or a child role when started as
// `gser_ucx_tests --child <role> ...` by a two-process test.
//
// --transport=tcp|shm picks UCX's transports (UCX_TLS) before anything
// starts UCX; children inherit the environment (a test may change it for a
// child). Connections stay on the loopback device.
#include "ucx_common.hpp"

int ucx_child_main(int argc, char **argv)
{
    auto it = child_roles().find(argc > 0 ? argv[0] : "");
    if (it == child_roles().end())
        return 2;
    return it->second(std::vector<std::string>(argv + 1, argv + argc));
}

int main(int argc, char **argv)
{
    int k = 1;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--transport=tcp") == 0)
            setenv("UCX_TLS", "tcp", 1);
        else if (std::strcmp(argv[i], "--transport=shm") == 0)
            setenv("UCX_TLS", "posix,sysv,cma,self,tcp", 1); // tcp sets the connections up
        else
            argv[k++] = argv[i];
    }
    argc = k;
    argv[argc] = nullptr;
    if (argc > 1 && std::strcmp(argv[1], "--child") == 0) {
        alarm(60); // a child never outlives a stuck test by much
        return ucx_child_main(argc - 2, argv + 2); // the environment is the parent's, as it chose
    }
    setenv("UCX_NET_DEVICES", "lo", 1);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
