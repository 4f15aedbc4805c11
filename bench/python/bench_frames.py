#!/usr/bin/python3
"""pandas DataFrames through the gser Dask family against pickle, measured in
the same run.

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/bench_frames.py [--json]
    (or: ninja -C <build> bench-python-frames)

The frame: --rows rows (default 1,000,000) x 8 columns: int64, float64 with
NaN, bool, datetime64[ns, UTC], categorical, str of 5-20 chars (an object
column), nullable Int64 with missing values, str again (object, with None).

Rows:
  frame_family   gser.dask.dumps + loads of the frame (what Dask's serialize
                 and deserialize call); anchor: pickle.dumps(protocol=5)
                 with out-of-band buffers + pickle.loads, as Dask's pickle
                 family does. Target <= 0.8.
  frame_bytes    the same with gser.dumps/loads (no Dask family), for reference.
  scalar_msg     a scheduler-like message holding numpy scalars (float64,
                 int64, datetime64) through the family, against pickle:
                 small messages must stay cheap. Target <= 1.0.
  shuffle_16     a 16-partition task shuffle (netcluster.task_shuffle) of
                 such frames (--shuffle-rows rows in all, default 400,000),
                 computed and gathered on LocalCluster(protocol="gser"),
                 against the same on tcp:// without gser. Target <= 0.9.
                 (--no-cluster skips it.)

Times are medians of --reps runs alternating gser and the anchor after a
warm-up, in ms. --json prints one object per line: name, value, unit,
anchor, anchor_value, ratio (value / anchor_value), target (on ratio).
"""

import argparse
import os
import pickle
import statistics
import sys
import time

from benchlib import Report, machine_line  # bench/python: the script's own folder

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "plugins", "python"))
import netcluster  # noqa: E402  (its task_shuffle: the keyword each Dask names)






def make_frame(rows, seed=1):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
    lens = rng.integers(5, 21, rows)
    chars = letters[rng.integers(0, len(letters), int(lens.sum()))]
    flat = "".join(chars)
    ends = np.cumsum(lens)
    strs = [flat[e - n:e] for e, n in zip(ends.tolist(), lens.tolist())]
    f = rng.random(rows)
    f[rng.random(rows) < 0.1] = np.nan
    ints = pd.array(rng.integers(-1000, 1000, rows), dtype="Int64")
    ints[rng.random(rows) < 0.1] = pd.NA
    obj = np.array(strs[::-1], dtype=object)
    obj[rng.random(rows) < 0.05] = None
    return pd.DataFrame({
        "key": rng.integers(0, 1 << 40, rows),
        "f": f,
        "b": rng.random(rows) < 0.5,
        "t": pd.Timestamp("2020-01-01", tz="UTC") + pd.to_timedelta(rng.integers(0, 10**15, rows), unit="ns"),
        "cat": pd.Categorical.from_codes(rng.integers(0, 50, rows), [f"c{i}" for i in range(50)]),
        "s": strs,
        "i": ints,
        "o": obj,
    })


def alternating(a, b, reps):
    """Medians (ms) of a() and b() alternating, after one warm-up each."""
    def once(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    once(a)
    once(b)
    ta, tb = [], []
    for _ in range(reps):
        ta.append(once(a))
        tb.append(once(b))
    return statistics.median(ta), statistics.median(tb)


def frame_rows(rep, df, reps):
    import pandas.testing as tm

    import gser
    import gser.dask

    def fam():
        h, frames = gser.dask.dumps(df)
        return gser.dask.loads(h, frames)

    def raw():
        h, frames = gser.dumps(df)
        return gser.loads(h, frames)

    def pkl():
        bufs = []
        b = pickle.dumps(df, protocol=5, buffer_callback=bufs.append)
        return pickle.loads(b, buffers=bufs)

    tm.assert_frame_equal(fam(), df, check_exact=True)
    tm.assert_frame_equal(pkl(), df, check_exact=True)
    anchor = "pickle.dumps(protocol=5, out-of-band buffers) + pickle.loads (ms)"
    g, p = alternating(fam, pkl, reps)
    rep.add("frame_family", g, anchor, p, "<= 0.8")
    g, p = alternating(raw, pkl, reps)
    rep.add("frame_bytes", g, anchor, p, "<= 0.8")


def scalar_row(rep, reps):
    import numpy as np

    import gser.dask

    msg = {"op": "task-finished", "key": "sum-aggregate-5e2c4f", "status": "OK", "nbytes": 8,
           "result": np.float64(2.5), "n": np.int64(7), "t": np.datetime64("2020-01-01", "ns")}

    def fam():
        for _ in range(1000):
            gser.dask.loads(*gser.dask.dumps(msg))

    def pkl():
        for _ in range(1000):
            pickle.loads(pickle.dumps(msg, protocol=5))

    out = gser.dask.loads(*gser.dask.dumps(msg))
    assert out == msg and all(type(out[k]) is type(msg[k]) for k in msg)
    g, p = alternating(fam, pkl, reps)
    rep.add("scalar_msg", g, "pickle.dumps(protocol=5) + pickle.loads, 1,000 messages (ms)", p, "<= 1.0")


def shuffle_ms(rows, parts, reps, protocol, gser_on):
    import dask
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    import gser.dask

    if gser_on:
        gser.dask.register(default=True)
    try:
        with dask.config.set({"distributed.comm.compression": None}), \
             LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol=protocol,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            assert all(client.run(gser.dask.registered).values()) == gser_on
            pdf = make_frame(rows)
            ddf = dd.from_pandas(pdf, npartitions=parts).persist()
            client.wait_for_workers(2)

            def run():
                out = netcluster.task_shuffle(ddf, "key").compute()
                assert len(out) == rows
            run()
            t = []
            for _ in range(reps):
                t0 = time.perf_counter()
                run()
                t.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(t)
    finally:
        if gser_on:
            gser.dask.unregister()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--reps", type=int, default=7, help="repetitions of each case (default 7)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the frame (default 1,000,000)")
    ap.add_argument("--shuffle-rows", type=int, default=400_000, help="rows shuffled (default 400,000)")
    ap.add_argument("--rounds", type=int, default=2, help="cluster pairs, alternating (default 2)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the LocalCluster row")
    args = ap.parse_args()

    import logging
    import warnings

    warnings.filterwarnings("ignore")
    import distributed

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    rep = Report(args.json, width=14)
    frame_rows(rep, make_frame(args.rows), args.reps)
    scalar_row(rep, args.reps)
    if not args.no_cluster:
        rounds = [(shuffle_ms(args.shuffle_rows, 16, max(1, args.reps // 2), "tcp", False),
                   shuffle_ms(args.shuffle_rows, 16, max(1, args.reps // 2), "gser", True))
                  for _ in range(args.rounds)]
        rep.add("shuffle_16", statistics.median(r[1] for r in rounds),
                f"the same on LocalCluster(protocol='tcp') without gser, {args.shuffle_rows} rows (ms)",
                statistics.median(r[0] for r in rounds), "<= 0.9")
    if not args.json:
        machine_line(f"distributed {distributed.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
