// main() of the UCX tests: googletest, or a child role when started as
// `gser_ucx_tests --child <role> ...` by a two-process test.
#include "ucx_common.hpp"

int main(int argc, char **argv)
{
    if (argc > 1 && std::strcmp(argv[1], "--child") == 0) {
        alarm(60); // a child never outlives a stuck test by much
        return ucx_child_main(argc - 2, argv + 2);
    }
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
