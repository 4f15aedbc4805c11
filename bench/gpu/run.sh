#!/usr/bin/env bash
# Every GPU check of the project in ONE call of the device tool, within 540 s
# including the build: versions first, the carried dependencies, a build of
# only the targets used, the CUDA cases of the device, device-op, Arrow and
# UCX staging tests, compute-sanitizer (memcheck on the device and device-op
# tests; racecheck on the kernels that use shared memory: the plan scan),
# gser-bench-device, gser-bench-ucx over shared memory with device frames,
# and a short demo with the table on the GPU. Every step has a time limit
# and the whole run a budget; what does not fit is reported as not run.
#
# Here, once:   ../shared/gpu/fetch-runtime-debs.sh .gpudeps   (.gitignore has /.gpudeps/)
# Device tool:  run command "source .gpudeps/unpack.sh; bench/gpu/run.sh", carry [".gpudeps"],
#               timeout_s 580
# Comes back under $OUT (./gpu-out without it): summary.txt (the table and
# each step's verdict), run.log, and gpu-logs.tar.gz with every log.
#
# Without a GPU it says so first, runs what a CPU can (versions, the
# dependency probe, the build, the summary's own test, the demo on host
# memory) and lists the GPU steps as NOT RUN; it then exits 2.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
start=$SECONDS
budget=${GSER_GPU_BUDGET:-530}
out=${OUT:-gpu-out}
mkdir -p "$out"
logs=$(mktemp -d)
B=${GSER_GPU_BUILD:-build-gpu}

status=0
verdicts=()
say() { echo "== $*"; }
note() { verdicts+=("$1"); echo "   $1"; }
left() { echo $((budget - (SECONDS - start))); }

# step NAME LIMIT CMD...: CMD under a limit of LIMIT seconds (or what is left
# of the budget), its output in $logs/NAME.log; the verdict is recorded.
step() {
    local name=$1 limit=$2 l rc t0
    shift 2
    l=$(left)
    if ((l < 15)); then
        note "NOT RUN  $name: out of time (budget ${budget}s)"
        status=1
        return 1
    fi
    ((limit > l)) && limit=$l
    say "$name (limit ${limit}s)"
    t0=$SECONDS
    timeout --kill-after=5 "$limit" "$@" >"$logs/$name.log" 2>&1
    rc=$?
    if ((rc == 124 || rc == 137)); then
        note "TIMEOUT  $name after ${limit}s"
        status=1
    elif ((rc != 0)); then
        note "FAILED   $name (exit $rc, $((SECONDS - t0))s)"
        status=1
    else
        note "ok       $name ($((SECONDS - t0))s)"
    fi
    tail -4 "$logs/$name.log" | sed 's/^/   | /'
    return $rc
}

not_run() { note "NOT RUN  $1: no GPU"; }

# shellcheck disable=SC2317 # called by the EXIT trap
finish() {
    {
        echo "# bench/gpu/run.sh, $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - start))s of ${budget}s"
        printf '%s\n' "${verdicts[@]}"
        if [ -s "$logs/summary-table.txt" ]; then
            echo
            echo "# benchmarks (ratio = gser / anchor)"
            cat "$logs/summary-table.txt"
        fi
    } >"$out/summary.txt"
    tar -czf "$out/gpu-logs.tar.gz" -C "$logs" . 2>/dev/null
}

main() {
trap finish EXIT
say "versions"
cmake --version | head -1
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$nvcc" --version 2>&1 | tail -2
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >"$logs/gpus.txt" 2>&1 && [ -s "$logs/gpus.txt" ]; then
    gpu=1
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
else
    echo
    echo "*** NO GPU ON THIS MACHINE (nvidia-smi: $(head -1 "$logs/gpus.txt" 2>/dev/null || echo 'not found')) ***"
    echo "*** Only the CPU-capable steps run; every GPU check is listed as NOT RUN. ***"
    echo
fi

say "dependencies"
command -v ucx_info >/dev/null && ucx_info -v | head -2 || echo "ucx_info: not found"
command -v ucx_perftest >/dev/null || echo "ucx_perftest: not found (gser-bench-ucx needs it)"
printf '#include <ucp/api/ucp.h>\n#include <msgpack.h>\nint main(void){ucp_config_t*c;msgpack_sbuffer b;msgpack_sbuffer_init(&b);msgpack_sbuffer_destroy(&b);return ucp_config_read(0,0,&c)!=UCS_OK;}\n' \
    >"$logs/probe.c"
step deps-probe 30 sh -c "cc '$logs/probe.c' -o '$logs/probe' -lucp -lucs -lmsgpackc && '$logs/probe'"

# Only what the checks below run. nvcc compiles the kernels for sm_90 only.
targets="gser_device_tests gser_device_ops_tests gser_arrow_tests gser_ucx_tests gser-bench-device gser-bench-ucx gser-demo"
gen=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
if step configure 60 cmake -S . -B "$B" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DGSER_CUDA=ON -DGSER_BUILD_PYTHON=OFF \
    -DGSER_WERROR=OFF; then
    grep -E "gser: (CUDA|UCX)" "$logs/configure.log"
    # shellcheck disable=SC2086
    step build 240 cmake --build "$B" -j "$(nproc)" --target $targets
fi

step summary-test 30 python3 tests/gpu/test_summary.py

suites=(
    "tests-device $B/tests/gser_device_tests *cuda*"
    "tests-device-ops $B/tests/gser_device_ops_tests *cuda*"
    "tests-arrow $B/plugins/arrow/tests/gser_arrow_tests *cuda*"
    "tests-ucx-staging $B/plugins/ucx/tests/gser_ucx_tests *Staging*cuda*"
)
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if ((gpu)); then
    for s in "${suites[@]}"; do
        read -r name bin filter <<<"$s"
        step "$name" 60 env UCX_NET_DEVICES=lo UCX_TLS=posix,sysv,cma,self,tcp "$bin" --gtest_filter="$filter"
        if grep -q "SKIPPED \]" "$logs/$name.log" 2>/dev/null; then
            note "FAILED   $name: CUDA cases skipped on a GPU machine"
            status=1
        fi
    done
    if [ -x "$cs" ]; then
        for s in "${suites[@]:0:2}"; do
            read -r name bin filter <<<"$s"
            step "memcheck-${name#tests-}" 100 "$cs" --tool memcheck --error-exitcode 9 "$bin" --gtest_filter="$filter"
        done
        # The scan kernels share memory within a block; the copy kernels do not.
        step racecheck-scan 80 "$cs" --tool racecheck --error-exitcode 9 "$B/tests/gser_device_tests" \
            --gtest_filter='*CopyPlan*cuda*'
    else
        note "FAILED   compute-sanitizer: not found"
        status=1
    fi
    step bench-device 120 sh -c "'$B/bench/gser-bench-device' --json > '$logs/bench-device.json'"
    step bench-ucx-shm 60 sh -c "'$B/plugins/ucx/bench/gser-bench-ucx' --json --transport shm --device cuda \
        > '$logs/bench-ucx.json'"
    step demo 45 env UCX_NET_DEVICES=lo "$B/tools/gser-demo" --rows 200000 --iters 3
else
    for s in "${suites[@]}"; do
        read -r name _ <<<"$s"
        not_run "$name"
    done
    not_run "memcheck (device, device-ops)"
    not_run "racecheck (the plan scan)"
    not_run "bench-device"
    not_run "bench-ucx-shm (device frames)"
    step demo-host 45 env UCX_NET_DEVICES=lo "$B/tools/gser-demo" --rows 200000 --iters 3
fi

if compgen -G "$logs/bench-*.json" >/dev/null; then
    say "summary (ratio = gser / anchor)"
    cat "$logs"/bench-*.json | python3 bench/gpu/summary.py >"$logs/summary-table.txt"
    cat "$logs/summary-table.txt"
fi
echo
printf '%s\n' "${verdicts[@]}"
if ((!gpu)); then
    echo "NO GPU: the GPU checks did not run (exit 2)"
    exit 2
fi
((status == 0)) && echo "all GPU checks passed" || echo "some GPU checks FAILED or did not run (see $out)"
exit $status
}

main 2>&1 | tee "$out/run.log"
rc=${PIPESTATUS[0]}
cp "$out/run.log" "$logs/" 2>/dev/null && tar -czf "$out/gpu-logs.tar.gz" -C "$logs" . 2>/dev/null
rm -rf "$logs"
exit "$rc"
