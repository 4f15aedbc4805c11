#!/usr/bin/env bash
# The main job: install what is missing, build, run the demo and inspect its output.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh core
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGSER_BUILD_TESTS=OFF -DGSER_BUILD_BENCH=OFF -DGSER_BUILD_PYTHON=OFF
cmake --build build-demo
build-demo/tools/gser-demo --out build-demo/demo.gser
echo
echo "== gser-inspect build-demo/demo.gser"
build-demo/tools/gser-inspect build-demo/demo.gser
