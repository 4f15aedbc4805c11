// main() of the UCX tests: googletest, or a child role when started as
// `gser_ucx_tests --child <role> ...` by a two-process test.
//
// --transport=tcp|shm picks UCX's transports (UCX_TLS) before anything
// starts UCX; children inherit the environment. Connections stay on the
// loopback device.
#include "ucx_common.hpp"

int main(int argc, char **argv)
{
    setenv("UCX_NET_DEVICES", "lo", 1);
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
        return ucx_child_main(argc - 2, argv + 2);
    }
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
