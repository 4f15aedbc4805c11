"""gser.dask.SpillStore in real workers at full size: a worker process of
512 MiB persisting 1.5 GiB of numpy chunks and 1.5 GiB of pandas partitions,
a worker killed while it spills, and a disk that fills up.

Minutes of disk and CPU: run only where GSER_SPILL_WORKER_TESTS=1 (the ctest
python_spill_worker sets it); the python suite skips them."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")
pytest.importorskip("distributed")

import gser  # noqa: E402
from gser.dask import SpillStore  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("GSER_SPILL_WORKER_TESTS") != "1",
    reason="full-size spill tests: set GSER_SPILL_WORKER_TESTS=1 (ctest python_spill_worker)")

MIB = 1 << 20
CHUNK = 4 * MIB  # float64 items: 32 MiB
ROWS = 32 * MIB // 40  # 5 columns of 8 bytes: 32 MiB a partition
WORKER = "512MiB"
STORE = {"memory_limit": "192MiB"}  # the rest of the 512 MiB: the interpreter, Dask and the task running


def partition(i):
    k = np.arange(ROWS, dtype=np.int64)
    return pd.DataFrame({"k": (k + i) % 11, "a": k * 0.5 + i, "b": np.full(ROWS, float(i)), "c": np.sqrt(k + i),
                         "d": np.ones(ROWS)})


def graphs(n=48):
    import dask
    import dask.array as da
    import dask.dataframe as dd

    x = da.arange(n * CHUNK, chunks=CHUNK, dtype=np.float64) * 2 + 1
    df = dd.from_delayed([dask.delayed(partition)(i) for i in range(n)], meta=partition(0).iloc[:0])
    return x, df


def reduce(x, df):
    return [x.sum(), (x * x).mean(), df.groupby("k").a.sum(), df.c.sum(), df.b.max()]


def same(got, want):
    for g, w in zip(got, want):
        if isinstance(w, pd.Series):
            pd.testing.assert_series_equal(g, w)
        else:
            assert g == w, (g, w)


@pytest.fixture(scope="module")
def unlimited():
    """The reductions computed without any memory limit or spilling."""
    import dask

    x, df = graphs()
    return dask.compute(*reduce(x, df), scheduler="sync")


def cluster(protocol, **kw):
    from distributed import LocalCluster

    return LocalCluster(n_workers=1, threads_per_worker=1, processes=True, protocol=protocol,
                        dashboard_address=":0", memory_limit=WORKER, data=(SpillStore, STORE), **kw)


# A cluster that stops making progress (a worker that cannot start, a
# restart loop) fails the test within this many seconds instead of hanging.
BOUND = 600


def computed(client, collections):
    """dask.compute on client, failing after BOUND seconds."""
    from distributed import wait

    futures = client.compute(list(collections))
    wait(futures, timeout=BOUND)
    return tuple(client.gather(futures))


def store_state(dask_worker):
    s = dask_worker.data
    return {"type": type(s).__name__, "counts": dict(s.counts), "directory": s.directory, "tiers": s.nbytes,
            "pid": os.getpid()}


@pytest.mark.parametrize("protocol", ["tcp://", "gser://"])
def test_a_512mib_worker_persists_3gib_and_reduces_as_an_unlimited_run(protocol, unlimited):
    if protocol == "gser://" and not gser.HAVE_UCX:
        pytest.skip("gser built without gser::ucx (libucx-dev)")
    from distributed import Client, wait

    with cluster(protocol) as c, Client(c) as client:
        assert c.scheduler_address.startswith(protocol)
        x, df = graphs()
        xs, dfs = client.persist([x, df])
        wait([xs, dfs], timeout=BOUND)
        (state,) = client.run(store_state).values()
        assert state["type"] == "SpillStore"
        # 3 GiB against a store of 192 MiB: nearly all of it went to disk.
        assert state["counts"]["host_to_disk"] >= 80, state
        assert state["tiers"]["host"] <= 192 * MIB and state["tiers"]["disk"] >= 80 * 32 * MIB, state
        got = computed(client, reduce(xs, dfs))
        same(got, unlimited)
        (after,) = client.run(store_state).values()
        assert after["pid"] == state["pid"], "the worker was never restarted"
        assert after["counts"]["disk_to_host"] >= 96, after  # every key read back at least once
        directory = state["directory"]
        assert os.path.isdir(directory)
    assert not os.path.exists(directory), "the spill files go with the worker"


def test_a_worker_killed_while_spilling_loses_nothing_dask_does_not_recompute(unlimited):
    from distributed import Client

    with cluster("tcp://") as c, Client(c) as client:
        x, _ = graphs()
        xs = client.persist(x)
        deadline = time.monotonic() + 120
        while True:  # until the worker is writing files
            (state,) = client.run(store_state).values()
            if state["counts"]["host_to_disk"] >= 4:
                break
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        os.kill(state["pid"], signal.SIGKILL)
        got = computed(client, (xs.sum(), (xs * xs).mean()))  # the lost keys are computed again
        same(got, unlimited[:2])
        (state2,) = client.run(store_state).values()
        assert state2["pid"] != state["pid"], "the nanny started a new worker"
        # The dead worker's directory, spill files and all, is removed by the
        # next worker in the same place (Dask's WorkSpace purges directories
        # whose lock no live process holds).
        assert not os.path.exists(state["directory"]), os.listdir(os.path.dirname(state["directory"]))


FULL_DISK = textwrap.dedent("""
    import collections, json, logging, os, sys
    import numpy as np
    from gser.dask import SpillStore

    logging.basicConfig(stream=sys.stderr)
    d = sys.argv[1]
    store = SpillStore(memory_limit=1_000_000, local_directory=d)
    arr = lambda i: np.arange(100_000, dtype=np.float64) + i  # 800 kB
    for i in range(12):  # 9.6 MB into a disk of 4 MiB
        store[f"x{i}"] = arr(i)
    store["set"] = collections.OrderedDict(a=1)  # Dask's path (gser refuses dict subclasses) meets the full disk too
    out = {"tiers": store.tiers, "counts": dict(store.counts), "evict_full": store.evict(),
           "files": len(os.listdir(store.directory))}
    out["all_back"] = all(np.array_equal(store[f"x{i}"], arr(i)) for i in range(12)) and store["set"] == collections.OrderedDict(a=1)
    for k in list(store.tiers["disk"]):  # room again
        del store[k]
    out["evict_room"] = store.evict()
    out["after"] = store.tiers
    out["files_after"] = len(os.listdir(store.directory))
    store.close()
    out["left"] = os.listdir(d)
    print(json.dumps(out))
""")


def test_a_full_disk_is_a_clear_error_and_loses_no_key(tmp_path):
    """A tmpfs of 4 MiB in a mount namespace of the test's own (gone with it)."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=4m none {mnt}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.decode().strip()}")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=4m none "$1" && exec "$2" "$3" "$1"',
                        "sh", str(mnt), sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["counts"]["disk_errors"] >= 1 and out["evict_full"] == -1, out
    assert "No space left on device" in r.stderr and "could not spill 'x" in r.stderr, r.stderr
    assert 1 <= len(out["tiers"]["disk"]) <= 5 and len(out["tiers"]["host"]) >= 8, out  # what fits, and the rest kept
    assert out["files"] == len(out["tiers"]["disk"]), "no partial file is left behind"
    assert out["all_back"], "every key reads back whole"
    assert out["evict_room"] > 0 and out["after"]["disk"], out  # with room again, spilling resumes
    assert out["left"] == [], "close() removed the store's directory"
