#!/bin/sh
# gser-localize.sh LD OBJCOPY OUT OBJ...: link OBJ... into one relocatable
# object OUT whose hidden global symbols are local. Weak ones (inline C++
# functions in COMDAT groups, e.g. CUDA's dim3 in a debug build) stay weak:
# the linker may discard our copy of their group for another object's, and
# local references into a discarded group would not link.
set -eu
ld=$1 objcopy=$2 out=$3
shift 3
"$ld" -r -o "$out" "$@"
readelf -sW "$out" | awk '$5 == "GLOBAL" && $6 == "HIDDEN" && $7 != "UND" {print $8}' | sort -u > "$out.local"
"$objcopy" --localize-symbols="$out.local" "$out"
