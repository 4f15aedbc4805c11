#!/usr/bin/env bash
# Every GPU check of the project, in one run on a machine with a GPU: build
# (CUDA on, UCX and msgpack-c from the carried Debian packages), the CUDA
# cases of the device, device-op, Arrow and UCX staging tests, the same under
# compute-sanitizer (memcheck; racecheck on the copy kernel), the GPU
# benchmarks, and the demo with the table on the GPU. A short table last.
#
# Here, once:   echo /.gpudeps/ >> .git/info/exclude && ../shared/gpu/fetch-runtime-debs.sh .gpudeps
# Device tool:  run "source .gpudeps/unpack.sh; bench/gpu/run.sh [STEPS]"  with carry [".gpudeps"]
# STEPS: any of build tests sanitize bench demo (default: all of them). Logs go to $OUT (or ./gpu-out).
# One device call may run 600 s at most: if all of it may not fit, run "build tests bench" first and
# "sanitize demo" in a second call while the machine is warm (build-gpu/ is kept between calls).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
steps=${*:-build tests sanitize bench demo}
has() { [[ " $steps " == *" $1 "* ]]; }
log() { echo "== $*"; }
status=0
fail() { echo "FAILED: $*"; status=1; }
B=build-gpu

log "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

if has build || [ ! -d "$B" ]; then
  log "build"
  gen=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
  cmake -S . -B "$B" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DGSER_CUDA=ON -DGSER_BUILD_PYTHON=OFF \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  grep -E "gser: (CUDA|UCX)" "$out/configure.log"
  cmake --build "$B" -j 16 >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
fi

# name, binary, gtest filter
suites=(
  "device $B/tests/gser_device_tests *cuda*"
  "device-ops $B/tests/gser_device_ops_tests *cuda*"
  "arrow $B/plugins/arrow/tests/gser_arrow_tests *cuda*"
  "ucx-staging $B/plugins/ucx/tests/gser_ucx_tests *cuda*"
)

if has tests; then
  for s in "${suites[@]}"; do
    read -r name bin filter <<<"$s"
    [ -x "$bin" ] || { fail "$name: $bin was not built"; continue; }
    log "tests: $name ($filter)"
    UCX_NET_DEVICES=lo timeout 600 "$bin" --gtest_filter="$filter" >"$out/tests-$name.log" 2>&1 || fail "$name tests"
    tail -3 "$out/tests-$name.log"
    if grep -q "SKIPPED" "$out/tests-$name.log"; then fail "$name: CUDA cases skipped (no device?)"; fi
  done
fi

if has sanitize; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$cs" ]; then
    for s in "${suites[@]:0:3}"; do
      read -r name bin filter <<<"$s"
      log "compute-sanitizer memcheck: $name"
      timeout 900 "$cs" --tool memcheck --error-exitcode 9 "$bin" --gtest_filter="$filter" \
        >"$out/memcheck-$name.log" 2>&1 || fail "memcheck $name"
      tail -2 "$out/memcheck-$name.log"
    done
    log "compute-sanitizer racecheck: the copy kernel"
    timeout 900 "$cs" --tool racecheck --error-exitcode 9 "$B/tests/gser_device_tests" \
      --gtest_filter='*CopyPlan*cuda*' >"$out/racecheck.log" 2>&1 || fail "racecheck"
    tail -2 "$out/racecheck.log"
  else
    fail "compute-sanitizer not found"
  fi
fi

if has bench; then
  log "gser-bench-device"
  timeout 900 "$B/bench/gser-bench-device" --json >"$out/bench-device.json" 2>"$out/bench-device.err" ||
    fail "gser-bench-device"
  tail -3 "$out/bench-device.err"
  if [ -x "$B/plugins/ucx/bench/gser-bench-ucx" ]; then
    log "gser-bench-ucx (device frames through staging)"
    timeout 900 "$B/plugins/ucx/bench/gser-bench-ucx" --json --device cuda >"$out/bench-ucx.json" \
      2>"$out/bench-ucx.err" || fail "gser-bench-ucx"
    tail -3 "$out/bench-ucx.err"
  fi
  if [ -x "$B/bench/gser-bench-arrow" ]; then
    log "gser-bench-arrow (tables on the GPU)"
    timeout 900 "$B/bench/gser-bench-arrow" --json --memory device >"$out/bench-arrow.json" \
      2>"$out/bench-arrow.err" || fail "gser-bench-arrow"
    tail -3 "$out/bench-arrow.err"
  fi
fi

if has demo && [ -x "$B/tools/gser-demo" ]; then
  log "gser-demo (the table on the GPU)"
  timeout 600 "$B/tools/gser-demo" --rows 2000000 --iters 10 >"$out/demo.log" 2>&1 || fail "gser-demo"
  grep -E "memory|path|overall|verified|OK|FAILED" "$out/demo.log"
fi

if compgen -G "$out/bench-*.json" >/dev/null; then
  log "summary (ratio = gser / anchor)"
  cat "$out"/bench-*.json | python3 bench/gpu/summary.py \
    || echo "(some ratios missed their targets: recorded above, not a check failure)"
fi
[ $status -eq 0 ] && echo "all GPU checks passed" || echo "some GPU checks FAILED (see above and $out)"
exit $status
