#!/usr/bin/env bash
# The test suite: install what is missing, build everything, run ctest.
# Python runs twice over: with Debian's packages (Dask 2022.12, the oldest
# supported) and in venvs of what users pip install (tools/pyenv.sh: current
# Dask, pandas 3 and 2, numpy 2, pyarrow). GSER_PYTHON_VENVS=none leaves the
# venvs out (a machine that reaches no package index).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh all
venvs=${GSER_PYTHON_VENVS-current pandas2 dask-2026.7.1}
[ "$venvs" = none ] && venvs=
dirs=()
for v in $venvs; do dirs+=("$(tools/pyenv.sh "$v")"); done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGSER_WERROR=ON \
  "-DGSER_PYTHON_VENVS=$(IFS=';'; echo "${dirs[*]}")"
cmake --build build
ctest --test-dir build --output-on-failure -j2 --timeout 900
