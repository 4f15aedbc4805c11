"""gser.dask.SpillStore: keys through the device, host and disk tiers and
back, Dask's path for what gser declines, a full disk, files removed, and a
worker whose data spills. Sizes are small: the GiB cases belong in benchmarks."""

import collections
import gc
import os

import pytest

import gser

np = pytest.importorskip("numpy")
pytest.importorskip("distributed")
pd = pytest.importorskip("pandas")

import gser.dask  # noqa: E402
from gser.dask import SpillStore  # noqa: E402

EMULATED = gser.DEVICE_BACKEND == "emulated"
KB = 1024
MB = 1 << 20


def arr(i, n=100_000):
    return np.arange(n, dtype=np.float64) + i  # 800 kB


def files(store):
    return sorted(os.listdir(store.directory))


def mapped(store):
    with open("/proc/self/maps") as m:
        return [line for line in m if store.directory in line]


def test_host_keys_spill_to_disk_and_come_back(tmp_path):
    store = SpillStore(memory_limit=2_000 * KB, local_directory=tmp_path, keep_files=True)
    for i in range(6):
        store[f"x{i}"] = arr(i)
    t = store.tiers
    assert t["host"] == ["x4", "x5"] and t["disk"] == ["x0", "x1", "x2", "x3"] and not t["device"]
    assert len(files(store)) == 4 and store.nbytes["host"] <= 2_000 * KB
    assert store.spilled_total == (4 * 800_000, sum(os.path.getsize(os.path.join(store.directory, f))
                                                    for f in files(store)))
    assert len(store) == 6 and set(store) == {f"x{i}" for i in range(6)} and "x0" in store
    x0 = store["x0"]  # from disk, and an older key goes down
    assert np.array_equal(x0, arr(0)) and x0.flags.writeable
    assert store.tiers["host"] == ["x5", "x0"] and "x4" in store.tiers["disk"]
    assert store.counts["disk_to_host"] == 1 and store.counts["host_to_disk"] == 5
    # Read into memory, not mapped: a mapping would hold the file's dirty
    # pages, which the kernel then writes back to the disk.
    assert not mapped(store)
    # x0's file is kept: when x0 goes down again, nothing is written.
    assert len(files(store)) == 5
    assert store.spilled_total[1] == sum(os.path.getsize(os.path.join(store.directory, f)) for f in files(store))
    for i in range(6):
        assert np.array_equal(store[f"x{i}"], arr(i))
    assert store.counts["writes_saved"] >= 3 and store.counts["host_to_disk"] == 6, store.counts
    assert len(files(store)) == 6  # one file per key, however often it went down
    del store["x3"]
    assert "x3" not in store and len(store) == 5 and len(files(store)) == 5
    with pytest.raises(KeyError):
        store["x3"]
    store["x1"] = "replaced"  # its file goes with the old value
    assert store["x1"] == "replaced" and len(store) == 5 and len(files(store)) == 4
    store["x0"] = arr(7)  # in memory, its kept file dropped: the next spill writes the new value
    assert len(files(store)) == 3
    for i in (2, 4, 5):
        store[f"x{i}"]
    assert np.array_equal(store["x0"], arr(7))
    d = store.directory
    store.close()
    assert not os.path.exists(d) and len(store) == 0


def test_by_default_a_file_goes_when_its_key_is_read(tmp_path):
    store = SpillStore(memory_limit=1_000 * KB, local_directory=tmp_path)
    for i in range(3):
        store[f"x{i}"] = arr(i)
    assert len(files(store)) == 2
    assert np.array_equal(store["x0"], arr(0)) and store.tiers["disk"] == ["x1", "x2"]
    assert len(files(store)) == 2 and store.counts["writes_saved"] == 0
    assert not mapped(store)


def test_a_value_still_referenced_comes_back_without_a_read(tmp_path):
    """As Dask's SpillBuffer: a spilled value that something else still
    holds is handed back as that object, not read again (no second copy);
    its file, never read, is kept, so going down again writes nothing."""
    store = SpillStore(memory_limit=1_000 * KB, local_directory=tmp_path)
    a = arr(0)
    store["a"] = a
    store["b"] = arr(1)  # a goes to disk; b's value has no other holder
    assert store.tiers["disk"] == ["a"] and len(files(store)) == 1
    assert store["a"] is a  # b goes down
    assert store.counts["reads_saved"] == 1 and store.counts["disk_to_host"] == 0
    assert store.tiers["disk"] == ["b"] and len(files(store)) == 2, "a's file is kept"
    assert store.spilled_total[1] == sum(os.path.getsize(os.path.join(store.directory, f)) for f in files(store))
    assert np.array_equal(store["b"], arr(1))  # nobody holds b: read from its file, which goes
    assert store.counts["disk_to_host"] == 1 and store.counts["host_to_disk"] == 2
    assert store.counts["writes_saved"] == 1 and len(files(store)) == 1, "a went down without a write"
    del a
    gc.collect()
    got = store["a"]  # nobody holds a now: read from its file
    assert np.array_equal(got, arr(0)) and store.counts["disk_to_host"] == 2
    store["a"] = arr(5)  # a new value: the old one is forgotten with its file
    store["b"] = arr(6)
    assert np.array_equal(store["a"], arr(5)) and got[1] == 1.0
    b = b"x" * 900_000  # bytes take no weak reference: read back from disk
    store["c"] = b
    store["d"] = arr(7)
    before = store.counts["disk_to_host"]
    assert store["c"] == b and store.counts["disk_to_host"] == before + 1


def test_what_gser_declines_spills_with_dasks_path(tmp_path):
    store = SpillStore(memory_limit=1, local_directory=tmp_path)
    df = pd.DataFrame({"a": np.arange(1000), "b": np.arange(1000) / 7, "c": [f"s{i}" for i in range(1000)]})
    store["df"] = df
    store["odict"] = collections.OrderedDict(a=1)  # a dict subclass: gser refuses it (a set it carries now)
    store["arr"] = arr(1)
    assert store.tiers["disk"] == ["df", "odict", "arr"] and not store.tiers["host"][:-1]
    assert {v[2] for v in store._disk.values()} >= {"dask", "gser"}
    pd.testing.assert_frame_equal(store["df"], df)
    assert store["odict"] == collections.OrderedDict(a=1) and type(store["odict"]) is collections.OrderedDict
    assert np.array_equal(store["arr"], arr(1))


def test_a_full_disk_loses_no_key(tmp_path, monkeypatch, caplog):
    store = SpillStore(memory_limit=1_000 * KB, local_directory=tmp_path)
    real = gser.dump
    monkeypatch.setattr(gser, "dump", lambda obj, path, **kw: real(obj, "/dev/full", **kw))  # ENOSPC from writev
    for i in range(3):
        store[f"x{i}"] = arr(i)
    assert store.tiers["host"] == ["x0", "x1", "x2"] and not store.tiers["disk"]
    assert store.evict() == -1 and store.counts["disk_errors"] >= 2
    assert "could not spill 'x0'" in caplog.text and not files(store)
    for i in range(3):
        assert np.array_equal(store[f"x{i}"], arr(i))
    monkeypatch.setattr(gser, "dump", real)
    assert store.evict() == 800_000 and len(store.tiers["disk"]) == 1


@pytest.mark.skipif(not EMULATED, reason="device arrays here are host memory: needs GSER_DEVICE=emulated")
def test_device_keys_go_to_host_packed_then_to_disk(tmp_path):
    from test_device import Dev, check_device

    store = SpillStore(device_memory_limit=1_000 * KB, memory_limit=1_500 * KB, local_directory=tmp_path)
    srcs = [np.arange(100_000, dtype=np.float32).reshape(100, 1000) + i for i in range(5)]  # 400 kB each
    for i, a in enumerate(srcs):
        store[f"d{i}"] = Dev(a)
    t = store.tiers
    assert t["device"] == ["d3", "d4"] and t["host"] == ["d0", "d1", "d2"] and not t["disk"]
    assert all(type(store._host[k][0]) is gser.FlatBytes for k in t["host"])
    store["h"] = arr(0)  # host memory overflows: the oldest host keys go to disk
    assert store.tiers["disk"] == ["d0", "d1"] and store.tiers["host"] == ["d2", "h"]
    for i, a in enumerate(srcs):
        check_device(store[f"d{i}"], a)  # back on the (emulated) device
    assert store.counts["host_to_device"] >= 1 and store.counts["disk_to_host"] >= 1
    assert np.array_equal(store["h"], arr(0))
    # A device object still held elsewhere comes back as itself: no copy
    # back to the device, no second device allocation.
    held = Dev(srcs[0])
    store["held"] = held
    for i in range(3):
        store[f"e{i}"] = Dev(srcs[i])  # held leaves the device
    assert "held" not in store.tiers["device"]
    before = dict(store.counts)
    assert store["held"] is held
    assert store.counts["host_to_device"] == before["host_to_device"]
    assert store.counts["disk_to_host"] == before["disk_to_host"]
    assert store.counts["reads_saved"] == before["reads_saved"] + 1


def test_files_go_with_the_store(tmp_path):
    store = SpillStore(memory_limit=1, local_directory=tmp_path)
    store["a"] = arr(0)
    d = store.directory
    assert os.listdir(d)
    del store
    gc.collect()
    assert not os.path.exists(d)


@pytest.mark.parametrize("protocol", ["tcp://", "gser://"])
def test_a_worker_spills_and_computes_the_same(protocol):
    """One worker whose data is a SpillStore far smaller than what it
    persists: 24 numpy chunks of 800 kB and 12 pandas partitions against
    4 MB of host memory, reduced to the results of an unlimited run."""
    if protocol == "gser://" and not gser.HAVE_UCX:
        pytest.skip("gser built without gser::ucx (libucx-dev)")
    import dask.array as da
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    x = da.arange(24 * 100_000, chunks=100_000, dtype=np.float64)
    pdf = pd.DataFrame({"k": np.arange(120_000) % 7, "v": np.arange(120_000, dtype=np.float64)})
    df = dd.from_pandas(pdf, npartitions=12)
    want = (float((x * 2).sum().compute(scheduler="sync")),
            df.groupby("k").v.sum().compute(scheduler="sync"))
    data = (SpillStore, {"memory_limit": 4_000 * KB})  # in the worker's directory
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol=protocol,
                      dashboard_address=None, data=data) as cluster, Client(cluster) as client:
        assert cluster.scheduler_address.startswith(protocol)
        xs, dfs = client.persist([x * 2, df])
        store = next(iter(cluster.workers.values())).data
        assert type(store) is SpillStore
        got_x = float(xs.sum().compute())
        got_df = dfs.groupby("k").v.sum().compute()
        assert store.counts["host_to_disk"] > 10, store.counts
        assert got_x == want[0]
        pd.testing.assert_series_equal(got_df, want[1])
        spilled = client.run(lambda dask_worker: dask_worker.data.spilled_total)
        assert list(spilled.values())[0][0] > 0
        directory = store.directory
        assert os.listdir(directory)
        assert directory.startswith(next(iter(cluster.workers.values())).local_directory)
    assert not os.path.exists(directory), "the worker's directory goes when it closes"


def test_compression_auto_squeezes_only_what_shrinks_a_lot(tmp_path):
    """Frames of data that lz4 shrinks to a few percent are compressed;
    frames that would shrink to about half (counters) or not at all are not,
    decided frame by frame: "mixed" is a frame whose float block is
    compressed and whose int64 counter is written as it is; and chunk by
    chunk (1 MiB) within a frame: "block" is one float block of 16 MiB whose
    counter column is written as it is and whose other columns shrink."""
    big = 1 << 18  # 2 MiB of float64
    values = {"zeros": np.zeros(big), "counter": np.arange(big, dtype=np.float64),
              "random": np.random.default_rng(0).random(big),
              "frame": pd.DataFrame({"a": np.arange(big // 4, dtype=np.float64), "b": np.ones(big // 4),
                                     "c": np.zeros(big // 4), "d": np.full(big // 4, 0.5)}),
              "mixed": pd.DataFrame({"i": np.arange(big // 2), "z": np.zeros(big // 2)}),
              "block": pd.DataFrame({"a": np.arange(2 * big, dtype=np.float64), "b": np.ones(2 * big),
                                     "c": np.zeros(2 * big), "d": np.full(2 * big, 0.5)})}
    sizes = {}
    for compression in ("auto", None):
        store = SpillStore(memory_limit=1, local_directory=tmp_path, compression=compression)
        for k, v in values.items():
            store[k] = v
            store["pad"] = 0  # pushes k to disk
        sizes[compression] = {k: store._disk[k][3] for k in values}
        for k, v in values.items():
            got = store[k]
            if isinstance(v, pd.DataFrame):
                pd.testing.assert_frame_equal(got, v)
            else:
                assert np.array_equal(got, v)
        store.close()
    auto, plain = sizes["auto"], sizes[None]
    assert all(plain[k] >= 2 * MB for k in values), plain
    assert auto["zeros"] < plain["zeros"] // 20 and auto["frame"] < plain["frame"] // 3, (auto, plain)
    assert auto["counter"] == plain["counter"] and auto["random"] == plain["random"], (auto, plain)
    half = plain["mixed"] // 2  # the counter's frame, within the index and header
    assert half < auto["mixed"] < half + 64 * KB, (auto, plain)
    assert 4 * MB < auto["block"] < 4 * MB + 256 * KB, (auto, plain)  # the counter's 4 MiB as they are


@pytest.mark.skipif(not EMULATED, reason="device arrays here are host memory: needs GSER_DEVICE=emulated")
def test_a_device_key_read_back_unchanged_goes_down_without_a_copy(tmp_path):
    from test_device import Dev, check_device

    store = SpillStore(device_memory_limit=500 * KB, memory_limit=1, local_directory=tmp_path, keep_files=True)
    a = np.arange(100_000, dtype=np.float32) + 1  # 400 kB
    store["d"] = Dev(a)
    store["e"] = Dev(a + 1)  # d: device -> host (one packed copy) -> disk
    assert store.tiers["disk"] == ["d"] and store.counts["device_to_host"] == 1
    check_device(store["d"], a)  # back on the device, e pushed down; d's file kept
    assert store.tiers["device"] == ["d"] and store.counts["device_to_host"] == 2
    before = dict(store.counts)
    store["f"] = Dev(a + 2)  # d leaves the device: its file still holds it
    assert store.tiers["disk"] == ["e", "d"] and store.tiers["device"] == ["f"]
    assert store.counts["device_to_host"] == before["device_to_host"], "no device-to-host copy for d"
    assert store.counts["writes_saved"] == before["writes_saved"] + 1
    check_device(store["d"], a)
