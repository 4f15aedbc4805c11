#!/usr/bin/env bash
# Instructions per control message and phase (build, serialize, deserialize,
# destroy) and of msgpack-c's pack and unpack of the same message, counted by
# callgrind: the difference of two runs (200 and 1200 messages) over 1000,
# so start-up costs cancel. Repeatable whatever the machine's load.
#   bench/callgrind-control.sh [path/to/gser-bench-host]   (a Release build)
set -euo pipefail
bench=${1:-build/bench/gser-bench-host}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for n in 200 1200; do
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" --toggle-collect='phase_*' \
    --toggle-collect='anchor_*' "$bench" --phases "$n" > /dev/null 2>&1
  callgrind_annotate --inclusive=yes --threshold=100 "$out/cg.$n" 2>/dev/null |
    sed -n 's/^ *\([0-9,]*\) .*:\(phase_[a-z]*\|anchor_[a-z]*\) .*/\2 \1/p' | tr -d , | sort -u -k1,1 > "$out/ir.$n"
done
join "$out/ir.200" "$out/ir.1200" | awk '{ printf "%-18s %7.0f Ir/message\n", $1, ($3 - $2) / 1000 }'
