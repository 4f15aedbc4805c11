#!/usr/bin/python3
"""gser:// with distributed.comm.compression on loopback, anchors measured in
the same run (one process, a comm pair over loopback, one way: from write
until the reader has the array). The listener is at 127.0.0.2: towards its
own address (127.0.0.1 to 127.0.0.1) Dask from 2023 on compresses nothing
whatever the setting, and gser:// with it.

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/bench_compress.py [--json]

Rows (median of --reps, the cases in a shuffled order each round):

  lz4_offloaded_vs_on_loop   64 MiB of compressible columns, "lz4" forced:
                             compressed on Dask's offload thread (what the
                             comm does) against compressed on the event loop
                             (offload off). Target: time <= 1.05x (moving it
                             off the loop costs nothing).
  auto_loopback_vs_none      the same data, "auto" (nothing compressed
                             towards this host) against None. Target: time
                             <= 1.05x (the setting costs nothing where it
                             does not compress).
  lz4_loopback_vs_none       "lz4" forced against None: what compressing
                             costs where moving bytes is cheap (reported;
                             target <= 3x).
"""

import argparse
import asyncio
import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Report  # noqa: E402

N = 64 << 20


def columns():
    n = N // 3 // 8
    rng = np.random.default_rng(3)
    keys = np.sort(rng.integers(0, n // 16, n))
    codes = rng.integers(0, 12, n).astype(np.int64)
    runs = np.repeat(rng.random(n // 64 + 1), 64)[:n]
    return np.concatenate([keys.view(np.uint8), codes.view(np.uint8), runs.view(np.uint8)])


async def main(args):
    import dask
    import gser.comm
    import gser.dask  # noqa: F401  (registers gser://)
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import to_serialize

    data = columns()
    a, b = await dask_tests.get_comm_pair("gser://127.0.0.2")
    threshold = gser.comm.OFFLOAD_THRESHOLD

    async def once(setting, offload=True):
        gser.comm.OFFLOAD_THRESHOLD = threshold if offload else 0
        with dask.config.set({"distributed.comm.compression": setting}):
            start = time.perf_counter()
            await a.write({"x": to_serialize(data)})
            got = (await b.read())["x"]
            took = time.perf_counter() - start
        gser.comm.OFFLOAD_THRESHOLD = threshold
        assert got.nbytes == data.nbytes
        return took * 1000

    cases = {"lz4": ("lz4", True), "lz4_loop": ("lz4", False), "auto": ("auto", True), "none": (None, True)}
    for c in cases.values():  # warm-up
        await once(*c)
    runs = {k: [] for k in cases}
    order = list(cases)
    rng = random.Random(1)
    for _ in range(args.reps):
        rng.shuffle(order)  # no case always follows the same one (receive buffers, caches)
        for k in order:
            runs[k].append(await once(*cases[k]))
    med = {k: statistics.median(v) for k, v in runs.items()}
    rep = Report(args.json, anchor_title="anchor ms", width=28)
    rep.add("lz4_offloaded_vs_on_loop", med["lz4"], "lz4 on the loop", med["lz4_loop"], "<= 1.05")
    rep.add("auto_loopback_vs_none", med["auto"], "None", med["none"], "<= 1.05")
    rep.add("lz4_loopback_vs_none", med["lz4"], "None", med["none"], "<= 3")
    await a.close()
    await b.close()
    return rep.missed


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # tornado 6.2 inside distributed
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--reps", type=int, default=7)
    sys.exit(1 if asyncio.run(main(p.parse_args())) else 0)
