#!/usr/bin/python3
"""Python lists through gser, against Dask and pickle measured in the same run.

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/bench_lists.py [--json]
    (or: ninja -C <build> bench-python)

Cases (every value is a median after warm-up, in milliseconds):

  py_list_1m_vs_dask      gser.dumps + gser.loads of [1.5] * 1_000_000, against
                          distributed.protocol.dumps + loads of the same list in
                          a message ({"data": to_serialize(list)}): Dask's
                          item-by-item path. Target: >= 100x faster (ratio <= 0.01).
  py_list_1m_dask_family  the same Dask message with serializers=["gser", ...]
                          (gser.dask registered), against the same anchor.
  py_list_1m_vs_pickle    gser against pickle.dumps + pickle.loads of the list.
                          Target: faster (ratio < 1). Also for 1,000,000
                          distinct floats and ints, which cannot share objects.
  py_submit_list_1m       client.submit(lambda: [1.5] * 1_000_000).result() on a
                          local cluster (one in-process worker, TCP comms) with
                          the gser family first, against the same without it.
                          Target: ratio <= 0.01.

Dask's item-by-item path takes seconds: when one run of it takes more than
10 s it is run only once. --json prints one object per line: name, value,
unit, anchor, anchor_value, ratio (value / anchor_value), target (on ratio).
"""

import argparse
import json
import os
import pickle
import random
import statistics
import sys
import time

N = 1_000_000
SLOW_S = 10.0


def median_ms(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)


def slow_ms(fn, reps):
    """Median of reps runs, or one run when it takes more than SLOW_S."""
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    if first > SLOW_S * 1e3 or reps <= 1:
        return first, 1
    return median_ms(fn, reps - 1, warmup=0), reps


def meets(ratio, target):
    op, x = (target[:2], target[2:]) if target[1] == "=" else (target[:1], target[1:])
    x = float(x)
    return {"<=": ratio <= x, "<": ratio < x, ">=": ratio >= x, ">": ratio > x}[op]


class Report:
    def __init__(self, as_json):
        self.json = as_json
        self.missed = 0
        if not as_json:
            print(f"{'case':<24} {'value':>10} {'unit':<4}  {'anchor':<44} {'anchor':>10}  {'ratio':>9}  target")

    def add(self, name, value, anchor, anchor_value, target, unit="ms", note=""):
        ratio = value / anchor_value
        ok = meets(ratio, target)
        self.missed += not ok
        if self.json:
            print(json.dumps({"name": name, "value": round(value, 6), "unit": unit, "anchor": anchor,
                              "anchor_value": round(anchor_value, 6), "ratio": round(ratio, 8), "target": target}))
        else:
            print(f"{name:<24} {value:>10.3f} {unit:<4}  {anchor:<44} {anchor_value:>10.3f}  {ratio:>9.5f}  "
                  f"{target:<7} {'ok' if ok else 'MISSED'}{'  ' + note if note else ''}")
        sys.stdout.flush()


def gser_roundtrip(gser, obj):
    def run():
        header, frames = gser.dumps(obj)
        out = gser.loads(header, frames)
        assert len(out) == len(obj)
    return run


def pickle_roundtrip(obj):
    def run():
        out = pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        assert len(out) == len(obj)
    return run


def dask_message_roundtrip(obj, serializers=None):
    from distributed.protocol import dumps, loads, to_serialize

    def run():
        frames = dumps({"status": "OK", "data": {"x": to_serialize(obj)}}, serializers=serializers)
        out = loads(frames, deserializers=serializers)["data"]["x"]
        assert len(out) == len(obj)
    return run


def submit_ms(reps, with_gser):
    import gser.dask
    from distributed import Client, LocalCluster

    kwargs = {}
    if with_gser:
        gser.dask.register()
        kwargs = {"serializers": list(gser.dask.SERIALIZERS), "deserializers": list(gser.dask.DESERIALIZERS)}
    try:
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                          dashboard_address=None) as cluster, Client(cluster, **kwargs) as client:
            def run():
                out = client.submit(lambda: [1.5] * N, pure=False).result(timeout=600)
                assert len(out) == N
            run()  # warm-up: the first task also ships the function
            return slow_ms(run, reps)
    finally:
        if with_gser:
            gser.dask.unregister()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=15, help="repetitions of the fast cases (default 15)")
    ap.add_argument("--slow-reps", type=int, default=3,
                    help=f"repetitions of Dask's item-by-item path, if a run is under {SLOW_S:.0f} s (default 3)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the local-cluster cases")
    args = ap.parse_args()

    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)

    import distributed  # noqa: F401  (sets up its loggers, quieted below)

    import gser
    import gser.dask

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    rep = Report(args.json)
    const = [1.5] * N
    rng = random.Random(1)
    distinct = [rng.random() for _ in range(N)]
    ints = list(range(N))

    g_const = median_ms(gser_roundtrip(gser, const), args.reps, warmup=2)

    dask_anchor, runs = slow_ms(dask_message_roundtrip(const), args.slow_reps)
    note = f"Dask ran {runs}x" if runs > 1 else "Dask ran once (> 10 s)" if dask_anchor > SLOW_S * 1e3 else ""
    rep.add("py_list_1m_vs_dask", g_const, "Dask protocol dumps+loads, item by item (ms)", dask_anchor, "<= 0.01",
            note=note)

    gser.dask.register()
    try:
        fam = median_ms(dask_message_roundtrip(const, list(gser.dask.SERIALIZERS)), args.reps)
    finally:
        gser.dask.unregister()
    rep.add("py_list_1m_dask_family", fam, "Dask protocol dumps+loads, item by item (ms)", dask_anchor, "<= 0.01",
            note="Dask's own dumps/loads with serializers=['gser', ...]")

    for name, obj, g in (("py_list_1m_vs_pickle", const, g_const),
                         ("py_floats_1m_vs_pickle", distinct, None),
                         ("py_ints_1m_vs_pickle", ints, None)):
        if g is None:
            g = median_ms(gser_roundtrip(gser, obj), args.reps, warmup=2)
        p = median_ms(pickle_roundtrip(obj), max(3, args.reps // 3))
        rep.add(name, g, "pickle.dumps+loads, protocol 5 (ms)", p, "< 1")

    if not args.no_cluster:
        with_gser, _ = submit_ms(args.reps, True)
        without, runs = submit_ms(args.slow_reps, False)
        rep.add("py_submit_list_1m", with_gser, "same, without the gser family (ms)", without, "<= 0.01",
                note=f"without gser: {runs} run(s)")

    if not args.json:
        print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
              f"gser {gser.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
