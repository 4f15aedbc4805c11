#include "ucx_common.hpp"
