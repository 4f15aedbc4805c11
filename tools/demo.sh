#!/usr/bin/env bash
# The main job: install what is missing, build, then move a dataframe between
# two processes over UCX (gser-demo; options are passed on, see --help), and
# show what one message looks like inside (gser-demo-file + gser-inspect).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh core
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGSER_BUILD_TESTS=OFF -DGSER_BUILD_BENCH=OFF -DGSER_BUILD_PYTHON=OFF
cmake --build build-demo
echo
echo "== gser-demo: a table from one process to another over UCX, verified column by column"
build-demo/tools/gser-demo "$@"
echo
echo "== a control message with a 1,000,000-float list, written to a file and inspected"
build-demo/tools/gser-demo-file --out build-demo/demo.gser
build-demo/tools/gser-inspect build-demo/demo.gser
