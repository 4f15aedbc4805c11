#!/usr/bin/env bash
# Makes (or reuses) a Python virtual environment with what users install from
# PyPI, pinned by tests/plugins/python/requirements/NAME.txt, and prints its
# folder. Never installs into the system Python.
#   tools/pyenv.sh NAME [DIR]     DIR defaults to build-venv/NAME
# The venv is built on Debian's /usr/bin/python3, the interpreter gser's module
# is built for, so build/plugins/python works in it as it is. A venv whose
# requirements have not changed since it was made is reused as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: tools/pyenv.sh NAME [DIR]}
req=tests/plugins/python/requirements/$name.txt
[ -f "$req" ] || { echo "tools/pyenv.sh: no $req" >&2; exit 2; }
dir=${2:-build-venv/$name}
stamp=$(sha256sum "$req" | cut -c1-16)
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.gser-req" 2>/dev/null)" = "$stamp" ]; then
  echo "$dir"
  exit 0
fi
rm -rf "$dir"
/usr/bin/python3 -m venv "$dir" >&2
# Quiet, but a failing install still says why on stderr.
"$dir/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$req" >&2
echo "$stamp" > "$dir/.gser-req"
echo "$dir"
