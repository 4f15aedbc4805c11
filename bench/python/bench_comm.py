#!/usr/bin/python3
"""Dask comms between two processes: gser:// (gser.comm on gser::ucx) against
Dask's tcp:// comm, measured in the same run.

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/bench_comm.py [--json]
    (or: ninja -C <build> bench-python-comm)

A server process listens on both schemes (127.0.0.1) and echoes; this
process connects to it with distributed.comm.connect and times, alternating
the two schemes round by round:

  comm_rtt_100B          round trip of a ~100-byte dict (write + read on each
                         side), median over rounds of --rtt-n round trips, in
                         microseconds. Target: <= 0.3x the tcp comm's (gser
                         encodes the whole message in C, no to_frames).
  comm_256mib_one_way    a 256 MiB numpy array (to_serialize) one way: from
                         write until the server's small acknowledgement is
                         back, median of --reps transfers after a warm-up, in
                         GB/s. Target: >= 2x the tcp comm's throughput.
  cluster_xxT_sum        LocalCluster(n_workers=2, threads_per_worker=1,
                         processes=True): (x + x.T).sum() of
                         da.random.random((8000, 8000), chunks=1000), median
                         of --reps runs after a warm-up (cluster start-up not
                         counted; both clusters up, runs alternating), in
                         seconds. Target: <= 1.0x the tcp cluster.
  cluster_tiny_5000      the same clusters: client.map of a tiny function
                         over 5,000 ints (pure=False) and gather, median of
                         --reps runs, in seconds: Dask's small messages
                         (scheduler <-> workers, client). Target: <= 0.9x
                         the tcp cluster. Paced by Dask's BatchedSend
                         (one batch per worker per 5 ms, 2 tasks each)
                         rather than by the comm: trace_tiny.py shows
                         where each cycle's time goes. Reported, not
                         held to the target: no comm can reach it there.
  cluster_tiny_5000_unpaced  the same run with the scheduler's
                         worker-saturation set to inf for it (every task
                         sent at once, so the comm is on the critical
                         path rather than Dask's 5 ms batch interval), in
                         seconds. Target: <= 0.9x the tcp cluster.

Where Dask's own UCX comm is installed (distributed-ucxx-cu12 from PyPI:
it runs without a GPU, host memory over UCX), ucxx:// is measured in the
same rounds too, and each case gets a second row against it (*_vs_ucxx, no
target). UCX uses its defaults (shared memory and tcp between local
processes) unless UCX_TLS says otherwise. --json prints one object per line: name, value,
unit, anchor, anchor_value, ratio (value / anchor_value), target (on ratio),
and the runs behind the medians (runs, anchor_runs).
"""

import argparse
import asyncio
import json
import math
import operator
import os
import statistics
import subprocess
import sys
import time

from benchlib import machine_line, row_clients  # bench/python: the script's own folder

def _has_ucxx():
    """Dask's own UCX comm, ucxx:// (PyPI's distributed-ucxx-cu12, which
    imports and runs host memory over UCX without a GPU): what a RAPIDS user
    would pick instead of gser://."""
    try:
        # First, so that its UCX (the libucx wheel's, 1.2x) is the process's:
        # gser's module then binds to the same libucp.so.0 rather than
        # Debian's 1.13, whose libucs the wheel's transports cannot use.
        import distributed_ucxx  # noqa: F401
        import ucxx  # noqa: F401
    except Exception:
        return False
    return True


SCHEMES = ("gser", "tcp", "ucxx") if _has_ucxx() else ("gser", "tcp")  # before gser is imported
BIG = 256 << 20


# ---- the server process ---------------------------------------------------------------------

async def serve(host="127.0.0.1"):
    """Listen on host for every scheme; print the addresses; echo forever."""
    from distributed.comm import listen
    from distributed.comm.core import CommClosedError

    async def handle(comm):
        try:
            while True:
                msg = await comm.read()
                # a large message is acknowledged (and let go of before the
                # next arrives, as a consumer would), a small one echoed
                reply = {"ack": msg["data"].nbytes} if "data" in msg else msg
                del msg
                await comm.write(reply)
        except CommClosedError:
            pass

    listeners = [await listen(f"{s}://{host}:0", handle) for s in SCHEMES]
    print(" ".join(lst.contact_address for lst in listeners), flush=True)
    await asyncio.Event().wait()


# ---- the measuring side -------------------------------------------------------------------------

async def rtt_us(comm, n):
    msg = {"op": "heartbeat", "who": "worker-1", "now": 1.5e9, "metrics": {"executing": 3, "memory": 123456},
           "reply": True}
    t0 = time.perf_counter()
    for _ in range(n):
        await comm.write(msg)
        await comm.read()
    return (time.perf_counter() - t0) / n * 1e6


async def one_way_gbs(comm, data):
    from distributed.protocol import to_serialize

    t0 = time.perf_counter()
    await comm.write({"data": to_serialize(data)})
    ack = await comm.read()
    dt = time.perf_counter() - t0
    assert ack == {"ack": data.nbytes}, ack
    return data.nbytes / dt / 1e9


async def comm_cases(addresses, args):
    import numpy as np
    from distributed.comm import connect

    comms = {s: await connect(a) for s, a in zip(SCHEMES, addresses)}
    rtt = {s: [] for s in SCHEMES}
    bw = {s: [] for s in SCHEMES}
    for s in SCHEMES:  # warm-up
        await rtt_us(comms[s], 200)
    for _ in range(args.rounds):
        for s in SCHEMES:
            rtt[s].append(await rtt_us(comms[s], args.rtt_n))
    data = np.random.default_rng(1).random(BIG // 8)
    for s in SCHEMES:  # warm-up: receive buffers, page faults
        await one_way_gbs(comms[s], data)
    for _ in range(args.reps):
        for s in SCHEMES:
            bw[s].append(await one_way_gbs(comms[s], data))
    for c in comms.values():
        await c.close()
    return rtt, bw


def cluster_seconds(reps):
    """Both clusters up at once, their runs alternating: {protocol: [s, ...]}."""
    import contextlib

    import dask.array as da

    with contextlib.ExitStack() as stack:
        clients = row_clients(stack, SCHEMES)

        def run(client):
            x = da.random.random((8000, 8000), chunks=1000)
            t0 = time.perf_counter()
            client.compute((x + x.T).sum(), sync=True)
            return time.perf_counter() - t0

        def tiny(client):
            t0 = time.perf_counter()
            futures = client.map(_inc, range(5000), pure=False)
            assert sum(client.gather(futures)) == sum(range(1, 5001))
            del futures
            return time.perf_counter() - t0

        def tiny_unpaced(client):
            client.run_on_scheduler(_set_saturation, math.inf)
            try:
                return tiny(client)
            finally:
                client.run_on_scheduler(_set_saturation, None)

        for client in clients.values():
            run(client)  # warm-up: workers import, functions shipped
            tiny(client)
        times = {protocol: [] for protocol in SCHEMES}
        tiny_times = {protocol: [] for protocol in SCHEMES}
        unpaced_times = {protocol: [] for protocol in SCHEMES}
        for _ in range(reps):
            for protocol, client in clients.items():
                times[protocol].append(run(client))
                tiny_times[protocol].append(tiny(client))
                unpaced_times[protocol].append(tiny_unpaced(client))
        return times, tiny_times, unpaced_times


def _set_saturation(value, dask_scheduler=None):
    """On the scheduler's loop, between runs (nothing queued): value, or
    None for what its config said at start."""
    if value is None:
        value = getattr(dask_scheduler, "_bench_saturation", dask_scheduler.WORKER_SATURATION)
    elif not hasattr(dask_scheduler, "_bench_saturation"):
        dask_scheduler._bench_saturation = dask_scheduler.WORKER_SATURATION
    dask_scheduler.WORKER_SATURATION = value


def _inc(x):
    return x + 1


def spread(xs):
    return f"range {min(xs):.3g}-{max(xs):.3g} over {len(xs)}"


TARGET_OPS = {"<=": operator.le, ">=": operator.ge}


def report(as_json, name, unit, gser_runs, anchor, anchor_runs, target=None):
    """One row: the medians, their ratio against target ("<= 0.5"; None: no
    target, reported only), the ranges."""
    value, anchor_value = statistics.median(gser_runs), statistics.median(anchor_runs)
    ratio = value / anchor_value
    if target is None:
        ok, target = True, "-"
    else:
        op, bound = target.split()
        ok = TARGET_OPS[op](ratio, float(bound))
    if as_json:
        print(json.dumps({"name": name, "value": round(value, 6), "unit": unit, "anchor": anchor,
                          "anchor_value": round(anchor_value, 6), "ratio": round(ratio, 6), "target": target,
                          "runs": [round(x, 6) for x in gser_runs],
                          "anchor_runs": [round(x, 6) for x in anchor_runs]}), flush=True)
    else:
        print(f"{name:<26} {value:>9.3f} {unit:<4} {anchor:<36} {anchor_value:>9.3f}  {ratio:>7.3f}  {target:<6} "
              f"{'ok' if ok else 'MISSED'}  gser {spread(gser_runs)}, anchor {spread(anchor_runs)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=5, help="large transfers and cluster runs per scheme (default 5)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of round trips per scheme (default 5)")
    ap.add_argument("--rtt-n", type=int, default=1000, help="round trips per round (default 1000)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the LocalCluster case")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import distributed  # noqa: F401  (sets up its loggers, quieted below)

    import gser.dask  # noqa: F401  (gser:// in this process; the server finds it by its entry point)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    if args.serve:
        asyncio.run(serve())
        return 0

    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdout=subprocess.PIPE,
                              text=True)
    try:
        addresses = server.stdout.readline().split()
        assert len(addresses) == len(SCHEMES), addresses
        rtt, bw = asyncio.run(comm_cases(addresses, args))
    finally:
        server.kill()
        server.wait()
    if not args.json:
        print(f"{'case':<26} {'value':>9} {'unit':<4} {'anchor':<36} {'anchor':>9}  {'ratio':>7}  target")
    report(args.json, "comm_rtt_100B", "us", rtt["gser"], "Dask tcp comm, same message (us)", rtt["tcp"], "<= 0.3")
    report(args.json, "comm_256mib_one_way", "GB/s", bw["gser"], "Dask tcp comm, same array (GB/s)", bw["tcp"],
           ">= 2")
    if "ucxx" in SCHEMES:  # the same runs, against Dask's UCX comm (no target: reported)
        report(args.json, "comm_rtt_100B_vs_ucxx", "us", rtt["gser"], "Dask ucxx comm, same message (us)",
               rtt["ucxx"])
        report(args.json, "comm_256mib_one_way_vs_ucxx", "GB/s", bw["gser"], "Dask ucxx comm, same array (GB/s)",
               bw["ucxx"])
    if not args.no_cluster:
        times, tiny_times, unpaced_times = cluster_seconds(args.reps)
        report(args.json, "cluster_xxT_sum", "s", times["gser"], "same on a tcp LocalCluster (s)", times["tcp"],
               "<= 1.0")
        report(args.json, "cluster_tiny_5000", "s", tiny_times["gser"], "same on a tcp LocalCluster (s)",
               tiny_times["tcp"])  # paced by Dask's BatchedSend: trace_tiny.py
        report(args.json, "cluster_tiny_5000_unpaced", "s", unpaced_times["gser"], "same on a tcp LocalCluster (s)",
               unpaced_times["tcp"], "<= 0.9")
        if "ucxx" in SCHEMES:
            report(args.json, "cluster_xxT_sum_vs_ucxx", "s", times["gser"], "same on a ucxx LocalCluster (s)",
                   times["ucxx"])
            report(args.json, "cluster_tiny_5000_vs_ucxx", "s", tiny_times["gser"], "same on a ucxx LocalCluster (s)",
                   tiny_times["ucxx"])
            report(args.json, "cluster_tiny_5000_unpaced_vs_ucxx", "s", unpaced_times["gser"],
                   "same on a ucxx LocalCluster (s)", unpaced_times["ucxx"])
    if not args.json:
        machine_line(f"UCX_TLS={os.environ.get('UCX_TLS', '(default)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
