#!/usr/bin/env python3
"""The CUDA code in a library is exactly what CMakeLists.txt asks for: sm_90
machine code plus sm_90 PTX (which the driver compiles for newer GPUs), and
no other architecture -- in particular not the compiler's default, which
every process would JIT-compile at start.

usage: check_archs.py OBJCOPY LIBRARY

Reads the .nv_fatbin section: fatbin headers (magic 0xBA55ED50), then
entries of kind 1 (PTX) or 2 (ELF) with the SM version at byte 28."""
import os
import struct
import subprocess
import sys
import tempfile


def entries(blob):
    off = 0
    while off + 16 <= len(blob):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, off)
        if magic != 0xBA55ED50:
            raise SystemExit("unexpected fatbin magic %#x at %d" % (magic, off))
        p, end = off + hsize, off + hsize + fsize
        while p < end:
            kind, _unk, ehsize, size = struct.unpack_from("<HHIQ", blob, p)
            (arch,) = struct.unpack_from("<I", blob, p + 28)
            yield {1: "ptx", 2: "elf"}.get(kind, "kind%d" % kind), arch
            p += ehsize + size
        off = (end + 7) & ~7


def main():
    objcopy, lib = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fatbin")
        subprocess.run([objcopy, "-O", "binary", "--only-section=.nv_fatbin", lib, out], check=True)
        blob = open(out, "rb").read()
    found = sorted(set(entries(blob)))
    print("fatbin entries:", ", ".join("%s sm_%d" % e for e in found))
    if found != [("elf", 90), ("ptx", 90)]:
        raise SystemExit("expected sm_90 ELF and sm_90 PTX only")


if __name__ == "__main__":
    main()
