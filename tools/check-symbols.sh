#!/usr/bin/env bash
# Checks what gser's installed libraries give a program that links them:
# every defined global symbol of libgser*.so and libgser*.a is in the public
# prefix gser_ and declared in a public header (include/gser), and a static
# library exports exactly what its shared library does.
#   tools/check-symbols.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: tools/check-symbols.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
declared=$(grep -ohE '\bgser_[a-z0-9_]+\s*\(' "$root"/include/gser/*.h | tr -d ' (' | sort -u)
fail=0
checked=0
while IFS= read -r lib; do
  case "$lib" in *_testing.a) continue ;; esac
  if [[ $lib == *.so ]]; then
    syms=$(nm -D --defined-only "$lib" | awk 'NF==3 {print $3}' | sort -u)
  else
    # Weak symbols are inline C++ functions in COMDAT groups (CUDA's dim3
    # in a debug build): duplicates by definition, resolved to one copy.
    syms=$(nm -g --defined-only "$lib" | awk 'NF==3 && $2 != "W" && $2 != "V" {print $3}' | sort -u)
  fi
  outside=$(grep -v '^gser_' <<<"$syms" || true)
  undeclared=$(comm -23 <(grep '^gser_' <<<"$syms" || true) <(echo "$declared"))
  if [ -n "$outside" ]; then
    echo "FAIL $lib: global symbols outside the gser_ prefix:"; sed 's/^/  /' <<<"$outside"; fail=1
  fi
  if [ -n "$undeclared" ]; then
    echo "FAIL $lib: exported but declared in no public header:"; sed 's/^/  /' <<<"$undeclared"; fail=1
  fi
  if [[ $lib == *.a ]]; then
    so=${lib%.a}.so
    if [ -e "$so" ]; then
      diffs=$(diff <(echo "$syms") <(nm -D --defined-only "$so" | awk 'NF==3 {print $3}' | sort -u) || true)
      if [ -n "$diffs" ]; then
        echo "FAIL $lib exports other symbols than $so:"; sed 's/^/  /' <<<"$diffs"; fail=1
      fi
    fi
  fi
  echo "$lib: $(wc -l <<<"$syms") global symbols"
  checked=$((checked + 1))
done < <(find "$build" -maxdepth 3 -name 'libgser*.so' -o -maxdepth 3 -name 'libgser*.a' | sort)
if [ "$checked" -eq 0 ]; then
  echo "FAIL: no libgser*.so or libgser*.a under $build"; exit 1
fi
[ "$fail" -eq 0 ] && echo "symbols: $checked libraries clean"
exit "$fail"
