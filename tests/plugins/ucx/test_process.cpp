#include "ucx_common.hpp"
int ucx_child_main(int, char **) { return 2; }
