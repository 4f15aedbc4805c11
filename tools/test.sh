#!/usr/bin/env bash
# The test suite: install what is missing, build everything, run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh all
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGSER_WERROR=ON
cmake --build build
ctest --test-dir build --output-on-failure -j2 --timeout 900
