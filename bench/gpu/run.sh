#!/usr/bin/env bash
# One run on a machine with a GPU: build, run the device tests on CUDA (plain,
# then under compute-sanitizer memcheck and racecheck), run gser-bench-device,
# and print a short table last. Meant for the device tool:
#   echo /.gpudeps/ >> .git/info/exclude && ../shared/gpu/fetch-runtime-debs.sh .gpudeps   (here, once)
#   run: source .gpudeps/unpack.sh; bench/gpu/run.sh        (carry: .gpudeps)
# Full logs go to $OUT (or ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
log() { echo "== $*"; }

log "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

log "build (CUDA on, tests and benchmarks; no UCX/Python needed here)"
cmake -S . -B build-gpu -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" \
  -DCMAKE_BUILD_TYPE=Release -DGSER_CUDA=ON -DGSER_BUILD_PYTHON=OFF -DGSER_BUILD_UCX=OFF \
  >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j 16 >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }

status=0
log "device tests on CUDA"
GSER_DEVICE=cuda build-gpu/tests/gser_device_tests --gtest_filter='*cuda*' >"$out/tests.log" 2>&1 || status=1
tail -5 "$out/tests.log"
grep -q "SKIPPED" "$out/tests.log" && { echo "CUDA tests skipped: no device?"; status=1; }

if command -v compute-sanitizer >/dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  log "compute-sanitizer memcheck"
  "$cs" --tool memcheck --error-exitcode 9 build-gpu/tests/gser_device_tests --gtest_filter='*cuda*' \
    >"$out/memcheck.log" 2>&1 || status=1
  tail -3 "$out/memcheck.log"
  log "compute-sanitizer racecheck (the copy kernel)"
  "$cs" --tool racecheck --error-exitcode 9 build-gpu/tests/gser_device_tests \
    --gtest_filter='*CopyPlan*cuda*' >"$out/racecheck.log" 2>&1 || status=1
  tail -3 "$out/racecheck.log"
fi

log "gser-bench-device"
build-gpu/bench/gser-bench-device --json >"$out/bench-device.json" 2>"$out/bench-device.err" || status=1
cat "$out/bench-device.err" | tail -5

log "summary (ratio = gser / anchor)"
python3 - "$out/bench-device.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def meets(r, t):
    op, x = (t[:2], float(t[2:])) if t[1] == "=" else (t[:1], float(t[1:]))
    return {"<=": r <= x, "<": r < x, ">=": r >= x, ">": r > x}[op]
for r in rows:
    print(f"{r['name']:<28} {r['value']:10.4f} {r['unit']:<3} vs {r['anchor']:<38} {r['anchor_value']:10.4f}"
          f"  ratio {r['ratio']:7.3f} {r['target']:>7} {'ok' if meets(r['ratio'], r['target']) else 'MISSED'}")
PY
exit $status
