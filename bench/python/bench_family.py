#!/usr/bin/python3
"""The gser Dask family against the path Dask takes without it, measured in the
same run: one row per kind of object.

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/bench_family.py [--json]
    (or: ninja -C <build> bench-python)

Each row: distributed.protocol.dumps + loads of a worker's reply holding the
object, {"op": "get_data", "status": "OK", "data": {"x": to_serialize(obj)}},
as task results and transfers travel. value: with gser.dask registered as the
default family (what `--preload gser.dask` does); anchor: the same message
without gser (Dask's families "dask" and "pickle"; lists, tuples and dicts
item by item, as Dask does for to_serialize). Times are medians of --reps
runs alternating with and without gser after a warm-up, in ms; Dask's
item-by-item path runs once when one run takes more than 10 s. Where gser would be slower it declines (gser.Declined)
and Dask's path runs: those rows measure what declining costs.

Rows (target: ratio <= 1.0; [1.5]*1_000_000 <= 0.01):
  floats_1m       1,000,000 distinct floats
  ints_1m         list(range(1_000_000))
  strs_100k       100,000 short strings
  mixed_lists     20 lists of 5,000 floats + 5,000 ints + 1,000 strings (bag partitions)
  dict_int_lists  {name: list of 10,000 ints} x 20
  nested_dicts    2,000 dicts of five small values, in a dict
  sched_msg       a ~100-byte scheduler-like message
  numpy_8mb       numpy.arange(1_000_000, dtype=float64)
  const_list_1m   [1.5] * 1_000_000
Python's standard types, std_<kind>_<n> for n in --std-sizes (default 10,
1,000 and 1,000,000): the family's dumps + loads (gser.dask.dumps/loads, as
Dask calls it on a whole object; where it declines, Dask's next family is
pickle, timed as such) against pickle protocol 5's dumps + loads of the same
object, in the same run (target: ratio <= 1.0):
  complex, bigint (2**70 + i), set (of ints), frozenset (of strs),
  tuplekey_dict ({("x", i): i}), datetime, datetime_tz (a fixed offset),
  datetime_zi (zoneinfo), date, time, timedelta, decimal, uuid, fraction,
  range, slice, ellipsis: a list of n of them (or one set or dict of n);
  mixed (floats, ints, strs, None: a bag partition), mixed_std (floats,
  ints, strs, datetimes, Decimals), dicts (n records of five fields with a
  datetime), tuples ((str, int, float) rows).
End to end on a LocalCluster (2 worker processes, TCP), with gser preloaded
everywhere against no gser (--no-cluster skips them):
  e2e_dict_lists  client.submit(task returning a dict of 20 lists of 10,000 ints).result()
  e2e_bag_gather  client.gather(20 futures of mixed lists)
  e2e_list_1m     client.submit(lambda: [1.5] * 1_000_000).result()

--json prints one object per line: name, value, unit, anchor, anchor_value,
ratio (value / anchor_value), target (on ratio).
"""

import argparse
import random
import statistics
import sys
import time

from benchlib import Report, machine_line  # bench/python: the script's own folder

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


def timed_ms(fn, reps):
    """Median of reps runs after a warm-up, or one run when it takes more than SLOW_S."""
    t0 = time.perf_counter()
    fn()
    first = (time.perf_counter() - t0) * 1e3
    if first > SLOW_S * 1e3:
        return first, 1
    return median_ms(fn, reps, warmup=0), reps






def kinds():
    rng = random.Random(1)
    return {
        "floats_1m": [rng.random() for _ in range(1_000_000)],
        "ints_1m": list(range(1_000_000)),
        "strs_100k": [f"key-{i}" for i in range(100_000)],
        "mixed_lists": mixed_lists(rng),
        "dict_int_lists": {f"col{i}": list(range(i * 10_000, (i + 1) * 10_000)) for i in range(20)},
        "nested_dicts": {f"k{i}": {"a": i, "b": i / 7, "c": f"v{i}", "d": None, "e": i % 2 == 0}
                         for i in range(2000)},
        "sched_msg": {"op": "task-finished", "key": "inc-5e2c4f", "status": "OK", "nbytes": 800,
                      "thread": 140, "startstops": ({"action": "compute", "start": 1.5, "stop": 2.5},)},
    }


def std_kinds(n):
    """The std_* rows' objects of n elements."""
    import datetime as dt
    import decimal
    import fractions
    import uuid
    import zoneinfo

    rng = random.Random(n)
    base = dt.datetime(2020, 1, 1)
    tz = dt.timezone(dt.timedelta(hours=2))
    zi = zoneinfo.ZoneInfo("Europe/Paris")

    def t(i):
        return base + dt.timedelta(seconds=i)
    return {
        "complex": [complex(rng.random(), i) for i in range(n)],
        "bigint": [2**70 + i for i in range(n)],
        "set": set(range(n)),
        "frozenset": frozenset(f"s{i}" for i in range(n)),
        "tuplekey_dict": {("x", i): i for i in range(n)},
        "datetime": [t(i) for i in range(n)],
        "datetime_tz": [t(i).replace(tzinfo=tz) for i in range(n)],
        "datetime_zi": [t(i).replace(tzinfo=zi) for i in range(n)],
        "date": [dt.date(2000, 1, 1) + dt.timedelta(days=i % 3000) for i in range(n)],
        "time": [dt.time(i % 24, i % 60, i % 60, i % 1000) for i in range(n)],
        "timedelta": [dt.timedelta(seconds=i, microseconds=7) for i in range(n)],
        "decimal": [decimal.Decimal(i) / 8 for i in range(n)],
        "uuid": [uuid.UUID(int=rng.getrandbits(128)) for _ in range(n)],
        "fraction": [fractions.Fraction(i, 7) for i in range(n)],
        "range": [range(i) for i in range(n)],
        "slice": [slice(i, None, 2) for i in range(n)],
        "ellipsis": [...] * n,
        "mixed": [(rng.random(), i, f"s{i}", None)[i % 4] for i in range(n)],
        "mixed_std": [(rng.random(), i, f"s{i}", t(i), decimal.Decimal(i))[i % 5] for i in range(n)],
        "dicts": [{"id": i, "name": f"n{i}", "t": t(i), "v": i / 3, "ok": i % 2 == 0} for i in range(n)],
        "tuples": [(f"k{i % 100}", i, i / 3) for i in range(n)],
    }


def family_roundtrip(obj):
    """The family's dumps + loads (Dask's next family, pickle, where it declines)."""
    import pickle

    import gser.dask

    def run():
        try:
            h, f = gser.dask.dumps(obj)
        except NotImplementedError:
            out = pickle.loads(pickle.dumps(obj, protocol=5))
        else:
            out = gser.dask.loads(h, f)
        assert type(out) is type(obj)
    return run


def pickle_roundtrip(obj):
    import pickle

    def run():
        out = pickle.loads(pickle.dumps(obj, protocol=5))
        assert type(out) is type(obj)  # as family_roundtrip checks
    return run


#: A sample of a fast case runs it in a loop for at least this long, so that
#: the timer's own cost (~0.1 us a read) does not count against a 1 us case.
SAMPLE_S = 0.002


def alternating_pair_ms(a, b, reps):
    """Medians of a and b run alternately after a warm-up of each (one run
    each when one takes more than SLOW_S), per call: a sample of a fast case
    is a loop of calls (SAMPLE_S)."""
    def once(fn, k=1):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t0) * 1e3 / k
    ta, tb = [once(a)], [once(b)]
    if ta[0] > SLOW_S * 1e3 or tb[0] > SLOW_S * 1e3:
        return ta[0], tb[0], 1
    k = max(1, int(SAMPLE_S * 1e3 / max(min(once(a), once(b)), 1e-6)))
    ta, tb = [], []
    for _ in range(reps):
        ta.append(once(a, k))
        tb.append(once(b, k))
    return statistics.median(ta), statistics.median(tb), reps


def mixed_lists(rng):
    return [[rng.random() for _ in range(5000)] + list(range(5000)) + [f"s{i}" for i in range(1000)]
            for _ in range(20)]


def message_roundtrip(obj):
    from distributed.protocol import dumps, loads, to_serialize

    def run():
        frames = dumps({"op": "get_data", "status": "OK", "data": {"x": to_serialize(obj)}})
        out = loads(frames)["data"]["x"]
        assert type(out) is type(obj)
    return run


def alternating_ms(run, reps):
    """(gser ms, Dask ms, Dask runs): medians of runs alternating without and
    with gser (so that the shared machine's load hits both alike), after a
    warm-up of each; Dask's path once when it takes more than SLOW_S."""
    import gser.dask

    def once():
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e3

    def gser_once():
        gser.dask.register(default=True)
        try:
            return once()
        finally:
            gser.dask.unregister()

    d = [once()]
    gser_once()
    if d[0] > SLOW_S * 1e3:
        return statistics.median(gser_once() for _ in range(reps)), d[0], 1
    g = []
    for _ in range(reps):
        d.append(once())
        g.append(gser_once())
    return statistics.median(g), statistics.median(d[1:]), reps


def cluster_ms(reps, gser_on):
    """The three end-to-end rows' times on one LocalCluster: {name: (ms, runs)}."""
    import gser.dask
    from distributed import Client, LocalCluster

    if gser_on:
        gser.dask.register(default=True)  # and the preloads of the cluster's processes
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
             Client(cluster) as client:
            assert all(client.run(gser.dask.registered).values()) == gser_on

            def dict_lists():
                r = client.submit(lambda: {f"col{i}": list(range(i * 10_000, (i + 1) * 10_000)) for i in range(20)},
                                  pure=False).result(timeout=600)
                assert len(r) == 20

            parts = [client.submit(lambda i: mixed_lists(random.Random(i)), i, pure=False) for i in range(20)]
            client.gather(parts)

            def bag_gather():
                assert len(client.gather(parts, direct=False)) == 20
                client.run(lambda: None)  # nothing cached: gather asks the workers again

            def list_1m():
                assert len(client.submit(lambda: [1.5] * 1_000_000, pure=False).result(timeout=600)) == 1_000_000

            out = {}
            for name, fn in (("e2e_dict_lists", dict_lists), ("e2e_bag_gather", bag_gather), ("e2e_list_1m", list_1m)):
                fn()  # warm-up: the first task also ships the function
                out[name] = timed_ms(fn, reps)
            return out
    finally:
        if gser_on:
            gser.dask.unregister()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=9, help="repetitions of each case (default 9)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the LocalCluster rows")
    ap.add_argument("--rounds", type=int, default=2, help="LocalCluster pairs, alternating (default 2)")
    ap.add_argument("--only", nargs="*", help="only these rows")
    ap.add_argument("--std-sizes", default="10,1000,1000000",
                    help="the std_* rows' sizes, comma-separated (default 10,1000,1000000; empty: none)")
    ap.add_argument("--no-direct", action="store_true",
                    help="the family without its direct path for small plain messages (the general path, as "
                         "before it: an A/B in one build)")
    args = ap.parse_args()

    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import distributed  # noqa: F401  (sets up its loggers, quieted below)
    import numpy as np

    import gser.dask  # noqa: F401  (the family, registered with Dask)

    if args.no_direct:
        from gser import _gser
        _gser._direct(False)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    rep = Report(args.json, anchor_title="Dask ms")
    objs = kinds()
    objs["numpy_8mb"] = np.arange(1_000_000, dtype=np.float64)
    objs["const_list_1m"] = [1.5] * 1_000_000
    anchor = "Dask protocol dumps+loads of the same message without gser (ms)"
    for name, obj in objs.items():
        if args.only and name not in args.only:
            continue
        gser_ms, dask_ms, runs = alternating_ms(message_roundtrip(obj), args.reps)
        rep.add(name, gser_ms, anchor, dask_ms, "<= 0.01" if name == "const_list_1m" else "<= 1.0",
                note="" if runs > 1 else "Dask ran once (> 10 s)")

    sizes = [int(x) for x in args.std_sizes.split(",") if x]
    for n in sizes:
        for kind, obj in std_kinds(n).items():
            name = f"std_{kind}_{n}"
            if args.only and name not in args.only:
                continue
            reps = args.reps if n <= 100_000 else max(3, args.reps // 3)
            gser_ms, pickle_ms, runs = alternating_pair_ms(family_roundtrip(obj), pickle_roundtrip(obj), reps)
            rep.add(name, gser_ms, "pickle protocol 5 dumps+loads of the same object (ms)", pickle_ms, "<= 1.0",
                    note="" if runs > 1 else "one run each (> 10 s)")
            del obj

    if not args.no_cluster and (not args.only or any(n.startswith("e2e") for n in args.only)):
        # Clusters with and without gser, alternately, args.rounds times each.
        rounds = [(cluster_ms(args.reps, False), cluster_ms(args.reps, True)) for _ in range(args.rounds)]
        for name in rounds[0][1]:
            if args.only and name not in args.only:
                continue
            without = statistics.median(r[0][name][0] for r in rounds)
            withg = statistics.median(r[1][name][0] for r in rounds)
            once = any(r[0][name][1] == 1 for r in rounds)
            rep.add(name, withg, "the same on a LocalCluster without gser (ms)", without,
                    "<= 0.01" if name == "e2e_list_1m" else "<= 1.0",
                    note="without gser: one run per round (> 10 s)" if once else "")

    if not args.json:
        machine_line(f"distributed {distributed.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
