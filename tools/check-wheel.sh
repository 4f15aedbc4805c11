#!/usr/bin/env bash
# Checks gser installed the way Python users install it: builds the wheel from
# pyproject.toml (python3 -m build --wheel, the backend fetched from PyPI as
# pip does), checks what is in it, installs it into fresh virtual
# environments and runs a Dask cluster over gser:// in each, from outside the
# checkout:
#   current  tools/pyenv.sh current: dask/distributed 2026.8.0 from PyPI
#   debian   --system-site-packages over /usr/bin/python3: Debian's
#            distributed 2022.12; and with UCX's libucp hidden (root), that
#            import gser fails saying what to install
#   offline  `pip install --no-build-isolation --no-index .` into a venv that
#            holds scikit-build-core (no network at install): import and
#            entry point only
# usage: tools/check-wheel.sh [WORKDIR]        WORKDIR: build-wheel-check
# GSER_CHECK_WHEEL="current debian offline" chooses the steps after the build
# (import-only for a venv name suffixed ":import", e.g. current:import).
# GSER_CUDA=OFF (or SKBUILD_CMAKE_DEFINE=...) reaches the wheel build as in
# pip install. Exit status 0: every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=$(realpath -m "${1:-build-wheel-check}")
steps=${GSER_CHECK_WHEEL:-current debian offline}
mkdir -p "$work"
say() { printf '\n== check-wheel: %s\n' "$*" >&2; }
t0=$SECONDS

# ---- the builder: build (and scikit-build-core, for the offline step) ----------
say "builder venv"
if [ ! -x "$work/venv-build/bin/python" ]; then
  /usr/bin/python3 -m venv "$work/venv-build" >&2
fi
"$work/venv-build/bin/python" -m pip install -q --disable-pip-version-check --no-input \
  build 'scikit-build-core>=0.10' >&2

say "wheel (python3 -m build --wheel)"
rm -rf "$work/dist"
tb=$SECONDS
"$work/venv-build/bin/python" -m build --wheel --outdir "$work/dist" "$src" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; echo "check-wheel: the wheel build failed ($work/build.log)" >&2; exit 1; }
wheels=("$work"/dist/gser-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] || { echo "check-wheel: no single wheel in $work/dist" >&2; exit 1; }
whl=${wheels[0]}
echo "check-wheel: $(basename "$whl"), $(stat -c %s "$whl") bytes, built in $((SECONDS - tb)) s" >&2

# ---- what is in it ---------------------------------------------------------------
say "wheel contents"
"$work/venv-build/bin/python" - "$whl" "$work/unpacked" "$src" <<'EOF'
import glob, os, re, shutil, subprocess, sys, zipfile
whl, out, src = sys.argv[1:4]
z = zipfile.ZipFile(whl)
names = z.namelist()
bad = []
top = {n.split("/")[0] for n in names}
dist_infos = [t for t in top if t.endswith(".dist-info")]
if top - {"gser"} - set(dist_infos) or len(dist_infos) != 1:
    bad.append(f"top-level entries other than gser/ and one dist-info: {sorted(top)}")
sos = [n for n in names if n.endswith(".so") or ".so." in n]
if not any(re.fullmatch(r"gser/_gser\.cpython-[^/]+\.so", n) for n in sos):
    bad.append("no gser/_gser.cpython-*.so")
# Every module of the source package (CMake's GSER_PY_SOURCES must list it).
for f in sorted(glob.glob(os.path.join(src, "plugins/python/gser/*.py"))):
    if f"gser/{os.path.basename(f)}" not in names:
        bad.append(f"gser/{os.path.basename(f)} missing (not in GSER_PY_SOURCES?)")
if any(n.endswith((".h", ".a", ".cmake", ".pc")) for n in names):
    bad.append("C headers, archives or CMake/pkg-config files in the wheel")
eps = z.read(f"{dist_infos[0]}/entry_points.txt").decode()
if not re.search(r"^\[distributed\.comm\.backends\]\s*\ngser = gser\.comm:GserBackend$", eps, re.M):
    bad.append(f"entry point missing: {eps!r}")
shutil.rmtree(out, ignore_errors=True)
z.extractall(out)
# Our shared libraries are in the wheel and found through $ORIGIN; of the
# system's only UCX (and the C library) is needed.
allowed = re.compile(r"(libucp|libucs|libc|libm|libdl|librt|libpthread|ld-linux-x86-64|ld-linux-aarch64)\.so\.[0-9]+")
for so in sos:
    d = subprocess.run(["readelf", "-d", os.path.join(out, so)], capture_output=True, text=True, check=True).stdout
    for lib in re.findall(r"\(NEEDED\).*\[(.*)\]", d):
        if not allowed.fullmatch(lib) and not any(os.path.basename(s) == lib for s in sos):
            bad.append(f"{so} needs {lib}")
    for rp in re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.*)\]", d):
        if any(not p.startswith("$ORIGIN") for p in rp.split(":")):
            bad.append(f"{so} has a run path outside the wheel: {rp}")
    print(f"  {so}: {os.path.getsize(os.path.join(out, so))} bytes, needs",
          " ".join(re.findall(r"\(NEEDED\).*\[(.*)\]", d)))
for b in bad:
    print("check-wheel:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF

# ---- the check each venv runs, from outside the checkout --------------------------
run_dir=$(mktemp -d /tmp/gser-check-wheel.XXXXXX)
trap 'rm -rf "$run_dir"' EXIT
cat >"$run_dir/check_installed.py" <<'EOF'
# Dask starts its workers with multiprocessing's spawn, which imports this
# file again in each: everything runs under the __main__ guard.
import importlib.metadata as md
import os
import sys

real = os.path.realpath


def make(n):
    import numpy as np
    return [1.5] * n, np.arange(n, dtype="f8")


def size(x):
    return len(x[0]), int(x[1].sum())


def where():
    import gser
    return gser.__file__


def inside(path, folder):
    return (real(path) + os.sep).startswith(real(folder) + os.sep)


def main(src, venv, mode):
    for p in sys.path:
        if p and inside(p, src) and not inside(p, venv):
            sys.exit(f"the checkout is on sys.path: {p}")

    import gser
    import gser.comm

    assert inside(gser.__file__, venv), f"gser from {gser.__file__}, not from {venv}"
    eps = [e for e in md.entry_points(group="distributed.comm.backends") if e.name == "gser"]
    assert len(eps) == 1 and eps[0].value == "gser.comm:GserBackend", eps
    assert eps[0].load() is gser.comm.GserBackend
    assert md.version("gser") == gser.__version__, (md.version("gser"), gser.__version__)
    import distributed
    print(f"  gser {gser.__version__} from {os.path.dirname(gser.__file__)} (device backend "
          f"{gser.DEVICE_BACKEND}, UCX {gser.HAVE_UCX}), distributed {distributed.__version__}, entry point ok")
    if mode == "import":
        return

    import numpy as np
    from distributed import Client, LocalCluster

    n = 1_000_000
    with LocalCluster(protocol="gser", n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        assert cluster.scheduler_address.startswith("gser://"), cluster.scheduler_address
        for w, f in client.run(where).items():
            assert inside(f, venv), f"worker {w}: gser from {f}"
        fut = client.submit(make, n)
        lst, arr = fut.result(timeout=120)
        assert type(lst) is list and lst == [1.5] * n
        assert isinstance(arr, np.ndarray) and np.array_equal(arr, np.arange(n, dtype="f8"))
        # Worker to worker: the result moves over gser:// to the other worker.
        holder = client.who_has(fut)[fut.key]
        other = [w for w in client.scheduler_info()["workers"] if w not in holder]
        got = client.submit(size, fut, workers=other, allow_other_workers=False).result(timeout=120)
        assert got == (n, n * (n - 1) // 2), got
        print(f"  LocalCluster(protocol='gser', n_workers=2) at {cluster.scheduler_address}: results ok, "
              "worker to worker ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
EOF

# check VENV MODE: run the check in VENV from outside the checkout.
check() {
  (cd "$run_dir" && env -u PYTHONPATH -u PYTHONHOME PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 \
     timeout -k 10 "${GSER_CHECK_WHEEL_TIMEOUT:-300}" "$1/bin/python" -u -I check_installed.py "$src" "$1" "$2")
}
# noucx VENV: without UCX's libucp, import gser must fail saying what to
# install. libucp is hidden behind /dev/null in a mount namespace of its own
# (root; skipped, with a line, where none can be made).
noucx() {
  local lib out
  lib=$(ldconfig -p | awk '/libucp\.so\.0 /{print $NF; exit}')
  if [ -z "$lib" ] || ! unshare -m true 2>/dev/null; then
    echo "  without libucp: skipped (no libucp.so.0 in ldconfig, or no mount namespace)"
    return 0
  fi
  if out=$(cd "$run_dir" && unshare -m sh -c 'mount --bind /dev/null "$1" && exec "$2/bin/python" -I -c "import gser"' \
             sh "$(realpath "$lib")" "$1" 2>&1); then
    echo "check-wheel: import gser succeeded with libucp hidden" >&2
    return 1
  fi
  if ! grep -q "needs UCX's shared libraries" <<<"$out" || ! grep -q "apt-get install libucx0" <<<"$out"; then
    printf 'check-wheel: without libucp, import gser failed without saying what to install:\n%s\n' "$out" >&2
    return 1
  fi
  echo "  without libucp: import gser says: $(tail -1 <<<"$out" | cut -c1-150)..."
}
install_wheel() {
  "$1/bin/python" -m pip uninstall -q -y gser >/dev/null 2>&1 || true
  "$1/bin/python" -m pip install -q --disable-pip-version-check --no-input --no-deps "$whl" >&2
}

fail=0
for step in $steps; do
  name=${step%%:*}
  mode=cluster
  [ "$step" = "$name" ] || mode=${step#*:}
  ts=$SECONDS
  case $name in
    current)
      say "current Dask (tools/pyenv.sh current)"
      venv=$(realpath -m "$(tools/pyenv.sh current "$work/venv-current")")
      install_wheel "$venv"
      ;;
    debian)
      say "Debian's distributed (--system-site-packages)"
      venv=$work/venv-debian
      rm -rf "$venv"
      /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
      install_wheel "$venv"
      ;;
    offline)
      say "offline: pip install --no-build-isolation --no-index ."
      venv=$work/venv-build
      "$venv/bin/python" -m pip uninstall -q -y gser >/dev/null 2>&1 || true
      # Where a network namespace can be made (root), without any network.
      nonet=()
      if unshare -n true 2>/dev/null; then nonet=(unshare -n); fi
      "${nonet[@]}" "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input --no-build-isolation \
        --no-index --no-deps "$src" >"$work/offline.log" 2>&1 ||
        { tail -40 "$work/offline.log" >&2; echo "check-wheel: offline install failed" >&2; fail=1; continue; }
      # distributed is not in this venv (gser.comm needs it): gser is
      # imported and the entry point read, not loaded.
      (cd "$run_dir" && env -u PYTHONPATH PYTHONNOUSERSITE=1 "$venv/bin/python" -I -c '
import importlib.metadata as md, os, sys, gser
assert os.path.realpath(gser.__file__).startswith(os.path.realpath(sys.prefix) + os.sep), gser.__file__
eps = [e.value for e in md.entry_points(group="distributed.comm.backends") if e.name == "gser"]
assert eps == ["gser.comm:GserBackend"], eps
print(f"  gser {gser.__version__} from {os.path.dirname(gser.__file__)}: import and entry point ok")') ||
        { echo "check-wheel: offline: import failed" >&2; fail=1; }
      echo "check-wheel: offline${nonet:+ (no network: unshare -n)}: $((SECONDS - ts)) s" >&2
      continue
      ;;
    *) echo "check-wheel: unknown step $step" >&2; exit 2 ;;
  esac
  if check "$venv" "$mode" && { [ "$name" != debian ] || noucx "$venv"; }; then
    echo "check-wheel: $step: passed in $((SECONDS - ts)) s" >&2
  else
    echo "check-wheel: $step: FAILED" >&2
    fail=1
  fi
done
echo "check-wheel: $( [ $fail = 0 ] && echo passed || echo FAILED ) in $((SECONDS - t0)) s" >&2
exit $fail
