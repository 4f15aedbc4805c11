#!/usr/bin/python3
"""gser's flattened form at memory and file speed, against numpy doing the
same with the same bytes, measured in the same run.

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/bench_bytes.py [--json]
    (or: ninja -C <build> bench-python-bytes)

Rows (value and anchor in ms; medians of --reps runs, alternating gser and
the anchor after a warm-up of each):
  to_bytes_256mib  gser.to_bytes(a), a 256 MiB float64 array      vs numpy.copy(a)        ratio <= 1.5
  to_bytes_1gib    the same for 1 GiB                            vs numpy.copy(a)        ratio <= 1.5
  dump_1gib        gser.dump(a, path)                            vs numpy.save(path, a)  ratio <= 1.3
  load_mmap_1gib   gser.load(path, mmap=True)                    vs numpy.load(path, mmap_mode="c")
                   target on the value: <= 1 ms whatever the size
  load_1gib        gser.load(path)                               vs numpy.load(path)     ratio <= 1.3
  spill_numpy_2gib 64 numpy chunks of 32 MiB put into gser.dask.SpillStore(memory_limit=512 MiB),
                   the store holding the only reference, then each read back and a float
                   of each 4 KiB page of each column read
                                                                 vs the same through Dask's default
                   spill (distributed.spill.SpillBuffer, zict, target 512 MiB)         ratio <= 0.7
  spill_pandas_1gib the same with 32 pandas partitions of 32 MiB (4 float columns, 1 int)  ratio <= 0.7
  spill_numpy_2gib_held, spill_pandas_1gib_held
                   the same while the caller also holds every chunk: both stores then hand
                   spilled values back from weak references instead of reading them
                   Both stores at their defaults: SpillStore compresses with lz4 each frame
                   that shrinks to 0.3 or less; SpillBuffer lz4 where a sample shrinks to 0.9
                   or less (Dask's distributed.comm.compression "auto"); both delete a file
                   when its key is read from it; SpillBuffer writes a key again whenever it
                   is evicted, SpillStore not when its file was kept (a weakly held value)
  device_to_host_200  gser.to_bytes of a list of 200 device buffers of 256 KiB (one packed copy)
                   vs numpy.copy of 50 MiB: only with a device backend (GSER_DEVICE=emulated here,
                   where "device" memory is host memory)                               ratio <= 1.5
Files go to --dir (default: the temporary directory), both on the same
filesystem (a disk: a tmpfs would hold the spilled GiBs in memory),
written and read through the page cache (no fsync: neither
numpy nor gser asks for one); before each dump both files are removed and
the system synced, untimed, so that neither pays for the other's writeback. Needs about
4 GiB of memory and 4 GiB of disk.

--json prints one object per line: name, value, unit, anchor, anchor_value,
ratio (value / anchor_value), target, and target_on ("ratio", or "value"
where the target is a time).
"""

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

from benchlib import Report, machine_line  # bench/python: the script's own folder

MIB = 1 << 20






def once_ms(fn, setup=None):
    gc.collect()
    if setup:
        setup()
    t0 = time.perf_counter()
    out = fn()
    t = (time.perf_counter() - t0) * 1e3
    del out  # results are freed outside the timing, as each run's are
    return t


def alternating_ms(fn, anchor, reps, setup=None):
    """Medians of reps runs of fn and of anchor, alternating, after one of
    each; setup() runs before each, untimed."""
    once_ms(fn, setup)
    once_ms(anchor, setup)
    a, b = [], []
    for _ in range(reps):
        a.append(once_ms(fn, setup))
        b.append(once_ms(anchor, setup))
    return statistics.median(a), statistics.median(b)


def touch(v):
    """A float read from every 4 KiB page of each column of v, in place:
    a value viewing a mapped file costs nothing until used. (DataFrame.to_numpy
    would copy a frame of mixed dtypes into one new array first: work for
    the benchmark, not for either store.)"""
    cols = [c.to_numpy() for _, c in v.items()] if hasattr(v, "items") else [v]
    return sum(float(c.reshape(-1)[::512].sum()) for c in cols)


def spill_cycle(make_store, chunks):
    """Put every chunk in a fresh store, then read every key back and touch
    each page of it. The list is emptied as the chunks go in: what else
    holds them (or nothing) is the caller's choice. The store is returned,
    to be dropped (and its files removed) untimed."""
    store = make_store()
    total = 0.0
    n = len(chunks)
    for i in range(n):
        store[f"k{i}"], chunks[i] = chunks[i], None
    for i in range(n):
        total += touch(store[f"k{i}"])
    return store, total


def spill_rows(rep, args, want):
    import numpy as np
    import pandas as pd
    from distributed.spill import SpillBuffer

    from gser.dask import SpillStore

    limit = 512 * MIB
    work = tempfile.mkdtemp(prefix="gser-bench-spill-", dir=args.dir)
    serial = [0]

    def gstore():
        return SpillStore(memory_limit=limit, local_directory=work)

    def dstore():
        serial[0] += 1
        return SpillBuffer(os.path.join(work, f"dask-{serial[0]}"), target=limit)

    try:
        def numpy_chunks():
            return [np.arange(4 * MIB, dtype=np.float64) + i for i in range(64)]

        def pandas_chunks():
            n = 32 * MIB // 40
            return [pd.DataFrame({"a": np.arange(n, dtype=np.float64) + i, "b": np.ones(n), "c": np.zeros(n),
                                  "d": np.full(n, 0.5), "i": np.arange(n)}) for i in range(32)]

        rows = [(name, what, make, held) for name, what, make in
                (("spill_numpy_2gib", "numpy chunks", numpy_chunks),
                 ("spill_pandas_1gib", "pandas partitions", pandas_chunks))
                for held in (False, True) if want(name + ("_held" if held else ""))]

        def clean():
            # Neither store's files may linger into the other's run (Dask's
            # SpillBuffer leaves its directory behind): removed, then synced.
            gc.collect()
            for d in os.listdir(work):
                shutil.rmtree(os.path.join(work, d), ignore_errors=True)
            os.sync()

        for name, what, make, held in rows:
            # held: the caller keeps every chunk, so both stores hand spilled
            # values back from their weak references and read nothing; else
            # the store holds the only reference and every key read back
            # comes from its file (the chunks are made anew, untimed).
            kept = make() if held else None
            given = [None]

            def setup():
                given[0] = None
                clean()
                given[0] = list(kept) if held else make()

            g, d = alternating_ms(lambda: spill_cycle(gstore, given[0]), lambda: spill_cycle(dstore, given[0]),
                                  max(5, args.reps // 2), setup=setup)
            rep.add(name + ("_held" if held else ""), g,
                    f"the same {what}{', also held by the caller,' if held else ''} through Dask's SpillBuffer, "
                    "same limit and filesystem (ms)", d, "<= 0.7")
            del kept
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Dev:
    """Host memory presented as device memory (__cuda_array_interface__): what
    the emulated backend copies as a device would."""

    def __init__(self, a):
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                         "data": (a.ctypes.data, False), "strides": None, "version": 3}


def device_row(rep, args):
    import numpy as np

    import gser

    bufs = [np.arange(32 * 1024, dtype=np.float64) + i for i in range(200)]  # 256 KiB each
    obj = [_Dev(b) for b in bufs]
    flat = np.concatenate(bufs)
    g, n = alternating_ms(lambda: gser.to_bytes(obj), lambda: np.copy(flat), args.reps)
    rep.add("device_to_host_200", g, f"numpy.copy of the same 50 MiB, contiguous ({gser.DEVICE_BACKEND}) (ms)", n,
            "<= 1.5")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=9, help="repetitions of each case (default 9)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go")
    ap.add_argument("--only", nargs="*", help="only these rows")
    args = ap.parse_args()

    import numpy as np

    import gser

    rep = Report(args.json)

    def want(name):
        return not args.only or name in args.only

    for name, mib in (("to_bytes_256mib", 256), ("to_bytes_1gib", 1024)):
        if not want(name):
            continue
        a = np.arange(mib * MIB // 8, dtype=np.float64)
        g, n = alternating_ms(lambda: gser.to_bytes(a), lambda: np.copy(a), args.reps)
        rep.add(name, g, f"numpy.copy of the same {mib} MiB (ms)", n, "<= 1.5")
        del a

    a = np.arange(1024 * MIB // 8, dtype=np.float64)
    work = tempfile.mkdtemp(prefix="gser-bench-bytes-", dir=args.dir)
    gpath, npath = os.path.join(work, "a.gser"), os.path.join(work, "a.npy")
    try:
        def gdump():
            gser.dump(a, gpath)

        def ndump():
            np.save(npath, a)

        def clean():
            # Each write starts from the same state: no old file to truncate,
            # no dirty pages of the other's write left to flush.
            for p in (gpath, npath):
                if os.path.exists(p):
                    os.unlink(p)
            os.sync()

        if want("dump_1gib"):
            g, n = alternating_ms(gdump, ndump, args.reps, setup=clean)
            rep.add("dump_1gib", g, "numpy.save of the same 1 GiB, same filesystem (ms)", n, "<= 1.3")
        clean()
        gdump()  # the files the loads read
        ndump()
        del a
        gc.collect()
        if want("load_mmap_1gib"):
            g, n = alternating_ms(lambda: gser.load(gpath, mmap=True), lambda: np.load(npath, mmap_mode="c"),
                                  max(args.reps, 9))
            rep.add("load_mmap_1gib", g, "numpy.load(mmap_mode='c') of the same 1 GiB (ms)", n, "<= 1.0",
                    target_on="value")
        if want("load_1gib"):
            g, n = alternating_ms(lambda: gser.load(gpath), lambda: np.load(npath), args.reps)
            rep.add("load_1gib", g, "numpy.load of the same 1 GiB (ms)", n, "<= 1.3")
    finally:
        for p in (gpath, npath):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(work)

    if want("spill_numpy_2gib") or want("spill_pandas_1gib"):
        spill_rows(rep, args, want)
    if want("device_to_host_200") and gser.DEVICE_BACKEND != "none":
        device_row(rep, args)

    if not args.json:
        machine_line(f"numpy {np.__version__}, files in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
