"""gser as a Dask serialization family: the family contract, the fall-through
to Dask's other families (for what gser cannot carry, and for what it would
carry more slowly), the peer check of the comm handshake, and end-to-end runs
on local clusters."""

import collections
import dataclasses
import datetime
import decimal
import importlib

import pytest

import gser

distributed = pytest.importorskip("distributed")
np = pytest.importorskip("numpy")
msgpack = pytest.importorskip("msgpack")

import dask.config  # noqa: E402
import gser.dask  # noqa: E402
from distributed.protocol import dumps as dask_dumps  # noqa: E402
from distributed.protocol import loads as dask_loads  # noqa: E402
from distributed.protocol import to_serialize  # noqa: E402

ser = importlib.import_module("distributed.protocol.serialize")
comm_core = importlib.import_module("distributed.comm.core")

# tornado 6.2 (Debian) warns about its own event-loop setup inside distributed
pytestmark = pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning")

WITH_PICKLE = [*gser.dask.DESERIALIZERS, "pickle"]


@pytest.fixture
def registered():
    gser.dask.register()
    yield
    gser.dask.unregister()


@pytest.fixture
def spy(monkeypatch, registered):
    """Count the calls into gser's core: the collection path's (its one-call
    entry points, _gser._dask_dumps and _dask_loads) and the family's (C
    functions that count themselves: _gser._family_stats)."""
    base = gser._gser._family_stats()

    class Calls(dict):
        def __getitem__(self, key):
            return dict.__getitem__(self, key) + gser._gser._family_stats()[key] - base[key]

    calls = Calls(dumps=0, loads=0)
    real_dumps, real_loads = gser.dask._dask_dumps, gser.dask._dask_loads

    def dumps(*a, **k):
        dict.__setitem__(calls, "dumps", dict.__getitem__(calls, "dumps") + 1)
        return real_dumps(*a, **k)

    def loads(*a, **k):
        dict.__setitem__(calls, "loads", dict.__getitem__(calls, "loads") + 1)
        return real_loads(*a, **k)

    monkeypatch.setattr(gser.dask, "_dask_dumps", dumps)
    monkeypatch.setattr(gser.dask, "_dask_loads", loads)
    return calls


def test_family_contract():
    obj = {"a": [1.5] * 100, "b": np.arange(10), "c": ("t", None), "d": b"x" * 100_000}
    header, frames = gser.dask.dumps(obj)
    msgpack.packb(header, use_bin_type=True)  # Dask msgpacks the header
    assert header == {"gser": 1, "compression": (None,) * len(frames)}  # host frames: Dask's default handling
    assert any(f is obj["d"] for f in frames)  # large bytes are a frame of their own, the object itself
    out = gser.dask.loads(header, frames)
    assert out["a"] == obj["a"] and out["c"] == obj["c"] and out["d"] is obj["d"]
    assert np.array_equal(out["b"], obj["b"]) and out["b"].flags.writeable


def test_family_one_call_entry_points():
    """dumps/loads go through _gser._dask_dumps/_dask_loads: the same
    header and frames as the general dumps, errors as before."""
    arr = np.arange(6, dtype="i4").reshape(2, 3)
    header, frames = gser.dask.dumps(arr)
    assert header == {"gser": 1, "compression": (None,) * len(frames)}
    assert isinstance(frames[0], memoryview) and not frames[0].readonly  # an array's header: writable, as Dask's
    gh, gf = gser.dumps(arr, strict=True, writable_header=True)
    assert bytes(frames[0]) == bytes(gh) and [bytes(f) for f in frames[1:]] == [bytes(f) for f in gf]
    out = gser.dask.loads(header, frames)
    assert np.array_equal(out, arr) and out.flags.writeable
    header, frames = gser.dask.dumps({"a": 1})
    assert type(frames[0]) is bytes and header["compression"] == (None,)
    with pytest.raises(ValueError, match="no frames"):
        gser.dask.loads(header, [])
    with pytest.raises(ValueError, match="header version"):
        gser.dask.loads({"gser": 2}, frames)
    with pytest.raises(gser.GserError):
        gser.dask.loads(header, [b"not a gser header"])
    with pytest.raises(TypeError):
        gser.dask._dask_loads(None, False)
    with pytest.raises(gser.Declined):
        gser.dask.dumps([1] * 20 + [{"k": i} for i in range(200)])  # many small dicts: Dask's path is faster
    with pytest.raises(NotImplementedError, match="has not loaded gser"):
        gser.dask.dumps(1, context={"recipient": {}})


#: Types of the user's: carried only when registered by name.
Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float


class MyDatetime(datetime.datetime):
    pass


class MyDecimal(decimal.Decimal):
    pass


def nested(depth):
    obj = 1
    for _ in range(depth):
        obj = [obj]
    return obj


@pytest.mark.parametrize(
    "obj",
    [{1, Pair(1, 2)}, Pair(1, 2), Point(1, 2.0), [1, Point(1, 2.0)], MyDatetime(2020, 1, 1), MyDecimal("1.5"),
     {(1, 2): datetime.datetime(2020, 1, 1, tzinfo=datetime.tzinfo())},
     np.zeros(1, dtype=[("o", object)])[0], object(), "\ud800", nested(40)],
    ids=["set_of_namedtuple", "namedtuple", "dataclass", "dataclass_in_list", "datetime_subclass", "decimal_subclass",
         "tzinfo_base", "np_object_scalar", "object", "surrogate", "deep"],
)
def test_family_refuses_with_not_implemented(obj):
    with pytest.raises(NotImplementedError):
        gser.dask.dumps(obj)


def test_loads_rejects_unknown_header():
    with pytest.raises(ValueError):
        gser.dask.loads({"gser": 99}, [b""])
    with pytest.raises(ValueError):
        gser.dask.loads({"gser": 1}, [])


def test_loads_is_zero_copy_with_dasks_flags():
    # frames as Dask hands them over, read-only (bytes) or writable (bytearray)
    for writeable in (True, False):
        a = np.arange(1000.0)
        a.flags.writeable = writeable
        header, frames = gser.dask.dumps(a)
        for received in ([bytes(f) for f in frames], [bytearray(f) for f in frames]):
            out = gser.dask.loads(header, received)
            assert out.flags.writeable == writeable  # as at the sender, as Dask's numpy serializer
            viewed = np.frombuffer(received[1], dtype=np.float64)
            # zero-copy, except writable at the sender over a read-only frame (Dask copies that too)
            copied = writeable and type(received[1]) is bytes
            assert np.shares_memory(out, viewed) != copied
    # the frames of a writable array are writable views of it, as Dask's
    a = np.arange(1000.0)
    header, frames = gser.dask.dumps(a)
    out = gser.dask.loads(header, frames)
    a[0] = 42.0
    assert out[0] == 42.0 and out.flags.writeable


def test_serialize_uses_gser_first_and_falls_through(registered):
    h, f = ser.serialize([1.5] * 1000, serializers=["gser", "pickle"])
    assert h["serializer"] == "gser"
    assert ser.deserialize(h, f) == [1.5] * 1000
    h, f = ser.serialize({1, 2, 3}, serializers=["gser", "pickle"])
    assert h["serializer"] == "gser"
    assert ser.deserialize(h, f) == {1, 2, 3}
    h, f = ser.serialize({1, Pair(2, 3)}, serializers=["gser", "pickle"])
    assert h["serializer"] == "pickle"
    assert ser.deserialize(h, f) == {1, Pair(2, 3)}
    h, f = ser.serialize(b"raw", serializers=["dask", "gser"])
    assert h["serializer"] == "dask"


def test_to_serialize_collection_is_one_message(registered):
    big = [1.5] * 1_000_000
    frames = dask_dumps({"op": "x", "data": to_serialize(big)}, serializers=list(gser.dask.SERIALIZERS))
    assert len(frames) < 10  # not 1,000,002: one array (maybe split and compressed by Dask)
    out = dask_loads(frames, deserializers=list(gser.dask.DESERIALIZERS))
    assert out["op"] == "x" and out["data"] == big and type(out["data"][0]) is float
    mixed = [1, "two", 3.0, None, (4,)]
    frames = dask_dumps({"data": to_serialize(mixed)}, serializers=list(gser.dask.SERIALIZERS))
    assert dask_loads(frames)["data"] == mixed
    # a collection gser cannot carry goes item by item, as Dask does it
    odd = [1.5, Pair(1, 2), np.arange(3)]
    frames = dask_dumps({"data": to_serialize(odd)}, serializers=list(gser.dask.SERIALIZERS))
    out = dask_loads(frames)["data"]
    assert out[0] == 1.5 and out[1] == Pair(1, 2) and np.array_equal(out[2], np.arange(3))


def mixed_list(n):
    return [float(i) for i in range(n)] + list(range(n)) + [f"s{i}" for i in range(n // 5)]


def test_declines_what_pickle_carries_faster(registered):
    # many small lists of varying length: pickle is faster (BENCHMARKS.md)
    with pytest.raises(gser.Declined):
        gser.dask.dumps([[i, 1.5] * (1 + i % 3) for i in range(2000)])
    with pytest.raises(NotImplementedError):  # Declined is one, so Dask falls through
        gser.dask.dumps({"a": [[i, 1.5] * (1 + i % 3) for i in range(2000)]})
    h, f = ser.serialize([[i, 1.5] * (1 + i % 3) for i in range(2000)], serializers=list(gser.dask.SERIALIZERS))
    assert h["serializer"] == "pickle"
    # long lists of mixed scalars and of records go as typed columns: kept
    for obj in (mixed_list(5000), {"a": [{"k": i, "v": 1.5} for i in range(2000)]}):
        assert gser.dask.dumps(obj)[0]["gser"] == 1
    # what gser carries faster it keeps: arrays, strings, numpy, small messages
    for obj in ([1.5] * 5000, list(range(5000)), [f"s{i}" for i in range(5000)], np.arange(100_000),
                {"op": "task-finished", "key": "x", "nbytes": 8, "startstops": ({"start": 1.5, "stop": 2.0},)}):
        assert gser.dask.dumps(obj)[0]["gser"] == 1
    # items Dask would serialize one by one: gser saves each one's cost, so a
    # list of lists of small lists at the top is kept, and lists of them
    # are declined item by item
    small = [[[i, 1.5] * (1 + i % 3) for i in range(2000)] for _ in range(4)]
    frames = dask_dumps({"data": to_serialize(small[0])}, serializers=list(gser.dask.SERIALIZERS))
    assert msgpack.unpackb(frames[1])["serializer"] == "gser"
    frames = dask_dumps({"data": to_serialize(small)}, serializers=list(gser.dask.SERIALIZERS))
    sub = msgpack.unpackb(frames[1])
    assert sub.get("is-collection") and {h["serializer"] for h in sub["sub-headers"]} == {"pickle"}
    assert dask_loads(frames, deserializers=WITH_PICKLE)["data"] == small
    # a bag of mixed lists (floats, ints, strs) is one gser message now
    bag = [mixed_list(5000) for _ in range(4)]
    frames = dask_dumps({"data": to_serialize(bag)}, serializers=list(gser.dask.SERIALIZERS))
    assert msgpack.unpackb(frames[1])["serializer"] == "gser"
    assert dask_loads(frames, deserializers=list(gser.dask.DESERIALIZERS))["data"] == bag


def test_without_collections_dask_iterates():
    gser.dask.register(collections=False)
    try:
        h, f = ser.serialize(to_serialize([1.5] * 100), serializers=["gser", "pickle"])
        # item by item: a gser message (one header frame) per float
        assert h.get("is-collection") and len(f) == 100
        assert {sh["serializer"] for sh in h["sub-headers"]} == {"gser"}
        assert ser.deserialize(h, f) == [1.5] * 100
    finally:
        gser.dask.unregister()


def test_default_makes_gser_first_without_serializers():
    gser.dask.register(default=True)
    try:
        h, f = ser.serialize([2.5] * 1000)  # Dask's default would pickle it
        assert h["serializer"] == "gser"
        assert ser.deserialize(h, f) == [2.5] * 1000
        h, f = ser.serialize({1, 2})
        assert h["serializer"] == "gser"
        h, f = ser.serialize(Pair(1, 2))
        assert h["serializer"] == "pickle"
        # clusters started from here load gser.dask too
        assert "gser.dask" in dask.config.get("distributed.worker.preload")
        assert "gser.dask" in dask.config.get("distributed.scheduler.preload")
    finally:
        gser.dask.unregister()
    h, f = ser.serialize([2.5] * 1000)
    assert h["serializer"] == "pickle"
    assert "gser.dask" not in (dask.config.get("distributed.worker.preload") or [])


def _a_comm():
    """A comm of Dask's own (tcp://), unconnected: what handshake_info is called on."""
    from distributed.comm.tcp import TCP

    class Unconnected(TCP):
        def __init__(self):
            comm_core.Comm.__init__(self)
            self._local_addr, self._peer_addr = "tcp://127.0.0.1:1", "tcp://127.0.0.2:2"

    return Unconnected()


def test_register_is_idempotent_and_undone():
    original, handshake = ser.serialize, comm_core.Comm.__dict__["handshake_info"]
    comm = _a_comm()
    assert "gser" not in comm.handshake_info() and "python" in comm.handshake_info()
    gser.dask.register()
    gser.dask.register()
    assert "gser" in ser.families and ser.serialize.__wrapped__ is original and gser.dask.registered()
    # Peers learn that this process reads gser, whatever the kind of Dask's
    # handshake_info (a staticmethod up to 2023.4, an instance method since).
    info = comm.handshake_info()
    assert info["gser"] == 1 and "python" in info and "compression" in info
    assert isinstance(comm_core.Comm.__dict__["handshake_info"], staticmethod) == isinstance(handshake, staticmethod)
    gser.dask.unregister()
    assert "gser" not in ser.families and ser.serialize is original and not gser.dask.registered()
    assert comm_core.Comm.__dict__["handshake_info"] is handshake


def test_peers_without_gser_get_dasks_families(registered):
    with_gser = {"recipient": {"gser": 1, "compression": None}}
    without = {"recipient": {"compression": None}}
    serializers = list(gser.dask.SERIALIZERS)
    assert ser.serialize([1.5] * 100, serializers, context=with_gser)[0]["serializer"] == "gser"
    assert ser.serialize([1.5] * 100, serializers, context=without)[0]["serializer"] == "pickle"
    assert ser.serialize(np.arange(5), serializers, context=without)[0]["serializer"] == "dask"
    with pytest.raises(NotImplementedError, match="not loaded gser"):
        gser.dask.dumps([1.5], context=without)
    # a whole message, as a comm writes it
    frames = dask_dumps({"x": to_serialize([0.5] * 10)}, serializers=serializers, context=without)
    sub = msgpack.unpackb(frames[1])
    assert sub["is-collection"] and {h["serializer"] for h in sub["sub-headers"]} == {"pickle"}


def test_local_cluster_end_to_end(spy):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                      dashboard_address=None) as cluster, \
         Client(cluster, serializers=list(gser.dask.SERIALIZERS), deserializers=WITH_PICKLE) as client:
        assert cluster.scheduler_address.startswith("tcp://")  # real comms, real serialization

        floats = client.submit(lambda: [1.5] * 1_000_000, pure=False).result(timeout=60)
        assert type(floats) is list and len(floats) == 1_000_000
        assert floats == [1.5] * 1_000_000 and type(floats[0]) is float
        assert spy["dumps"] >= 1 and spy["loads"] >= 1

        arr = client.submit(lambda: np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000),
                            pure=False).result(timeout=60)
        assert arr.dtype == np.float64 and arr.shape == (1000, 1000)
        assert np.array_equal(arr, np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000))
        assert arr.flags.writeable

        mixed = client.submit(lambda: {"ids": list(range(1000)), "t": (1, "x", None), "flags": [True, 1]},
                              pure=False).result(timeout=60)
        assert mixed == {"ids": list(range(1000)), "t": (1, "x", None), "flags": [True, 1]}
        assert type(mixed["t"]) is tuple and type(mixed["flags"][0]) is bool

        # what gser refuses still arrives, through Dask's own families
        assert client.submit(lambda: {1, 2, 3}, pure=False).result(timeout=60) == {1, 2, 3}

        before = spy["dumps"]
        fut = client.scatter([0.5] * 50_000)
        assert client.submit(sum, fut).result(timeout=60) == 25_000.0
        assert spy["dumps"] > before


# ---- deployment: one switch for every process, and no half-gser cluster ---------------------------


def test_preload_reaches_every_process_of_a_local_cluster():
    from distributed import Client, LocalCluster

    gser.dask.register(default=True)  # adds gser.dask to the scheduler's and workers' preloads
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
             Client(cluster) as client:
            assert set(client.run(gser.dask.registered).values()) == {True}
            a, b = sorted(cluster.scheduler.workers)
            x = client.submit(lambda: [1.5] * 200_000, workers=[a], pure=False)
            assert client.submit(sum, x, workers=[b], pure=False).result(timeout=120) == 300_000.0
            stats = client.run(gser.dask.stats)
            # the list went from worker a to worker b as one gser message
            assert stats[a]["dumps"] >= 1 and stats[b]["loads"] >= 1, stats
    finally:
        gser.dask.unregister()


def without_gser():
    """The environment of a process that cannot import gser."""
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_without_gser(*args):
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as cwd:  # not next to the built package (python -c puts cwd on the path)
        p = subprocess.run([sys.executable, *args], env=without_gser(), cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=300, text=True)
    return p.returncode, p.stdout


def test_peers_without_gser_are_refused_and_the_cluster_keeps_its_data():
    import sys

    from distributed import Client, LocalCluster

    assert run_without_gser("-c", "import gser")[0] != 0
    gser.dask.register(default=True)
    try:
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                          dashboard_address=None) as cluster, Client(cluster) as client:
            data = client.scatter([0.5] * 100_000)
            rc, out = run_without_gser("-m", "distributed.cli.dask_worker", cluster.scheduler_address,
                                       "--no-nanny", "--no-dashboard")
            assert rc != 0 and "this worker has not loaded gser" in out and "--preload gser.dask" in out, out
            rc, out = run_without_gser("-c", f"from distributed import Client; Client({cluster.scheduler_address!r})")
            assert rc != 0 and "ImportError: gser: this client has not loaded gser" in out, out
            assert len(cluster.scheduler.workers) == 1
            assert client.gather(data) == [0.5] * 100_000
            assert client.submit(sum, data).result(timeout=60) == 50_000.0
    finally:
        gser.dask.unregister()
    assert sys.modules["gser.dask"]
