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
stamp=$(cat "$req" "$0" | sha256sum | cut -c1-16)  # this script makes it too
if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.gser-req" 2>/dev/null)" = "$stamp" ]; then
  echo "$dir"
  exit 0
fi
rm -rf "$dir"
/usr/bin/python3 -m venv "$dir" >&2
# Quiet, but a failing install still says why on stderr.
"$dir/bin/python" -m pip install -q --disable-pip-version-check --no-input -r "$req" >&2
# PyPI's wheels and sdists of distributed carry no tests: a requirements file
# may name the release tag's source (a `# tests-from: FILE` line, FILE in
# ../shared/pydeps, the same version as the one pinned), whose tests
# folders are laid into the installed package as Debian's package has them.
# pip then still sees the version of PyPI's wheel, which is the same code.
src=$(sed -n 's/^# tests-from: *//p' "$req")
if [ -n "$src" ]; then
  tarball=../shared/pydeps/$src
  if [ -f "$tarball" ]; then
    site=$("$dir/bin/python" -c 'import distributed, os; print(os.path.dirname(os.path.dirname(distributed.__file__)))')
    top=${src%.tar.gz}  # git archive --prefix=NAME-VERSION/
    # With the tag's conftest.py (--runslow, the resource-leak checks) and
    # pytest settings (warnings are errors, 300 s per test) at the top, as
    # in Dask's own checkout: its suites run under Dask's own rules.
    tar xzf "$tarball" -C "$site" --strip-components=1 --wildcards "$top/distributed/*tests/*" \
      "$top/conftest.py" "$top/pyproject.toml"
  else
    echo "tools/pyenv.sh: $tarball not found: $name has no Dask test suites" >&2
  fi
fi
echo "$stamp" > "$dir/.gser-req"
echo "$dir"
