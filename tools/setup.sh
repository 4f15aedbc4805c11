#!/usr/bin/env bash
# Installs gser's build and test dependencies from Debian's packages.
#   tools/setup.sh [core|all] [--update]
# core: what the library, the UCX plugin, the tools and the demo need; all:
# also tests, sanitizers, the fuzzer, ucx_perftest and Python. Only missing packages are installed, with sudo
# when not root. --update runs `apt-get update` first even if nothing is missing.
set -euo pipefail

CORE_PKGS=(build-essential cmake ninja-build pkg-config libmsgpack-dev libucx-dev liblz4-dev libzstd-dev)
ALL_PKGS=("${CORE_PKGS[@]}" libgtest-dev clang libclang-rt-14-dev ucx-utils
          iproute2 python3-dev python3-venv python3-pytest python3-numpy python3-pandas python3-distributed python3-msgpack
          python3-hypothesis python3-cryptography python3-pytest-timeout
          python3-lz4 python3-zstandard)  # independent codecs for the wire reader (wire_reference.py)

group=${1:-all}
update=${2:-}
case "$group" in
  core) pkgs=("${CORE_PKGS[@]}") ;;
  all) pkgs=("${ALL_PKGS[@]}") ;;
  *) echo "usage: tools/setup.sh [core|all] [--update]" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] || [ "$update" = "--update" ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi
