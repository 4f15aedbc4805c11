"""gser as a Dask serialization family: the family contract, the fall-through
to Dask's other families, and an end-to-end run on a local cluster whose
comms (TCP) use the gser family first."""

import importlib

import pytest

import gser

distributed = pytest.importorskip("distributed")
np = pytest.importorskip("numpy")
msgpack = pytest.importorskip("msgpack")

import gser.dask  # noqa: E402
from distributed.protocol import dumps as dask_dumps  # noqa: E402
from distributed.protocol import loads as dask_loads  # noqa: E402
from distributed.protocol import to_serialize  # noqa: E402

ser = importlib.import_module("distributed.protocol.serialize")

# tornado 6.2 (Debian) warns about its own event-loop setup inside distributed
pytestmark = pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning")


@pytest.fixture
def registered():
    gser.dask.register()
    yield
    gser.dask.unregister()


@pytest.fixture
def spy(monkeypatch, registered):
    """Count the family's dumps/loads calls (also those of the collection path)."""
    calls = {"dumps": 0, "loads": 0}
    real_dumps, real_loads = gser.dask.dumps, gser.dask.loads

    def dumps(x):
        calls["dumps"] += 1
        return real_dumps(x)

    def loads(header, frames):
        calls["loads"] += 1
        return real_loads(header, frames)

    monkeypatch.setattr(gser.dask, "dumps", dumps)
    monkeypatch.setattr(gser.dask, "loads", loads)
    gser.dask.register()  # picks up the spies
    return calls


def test_family_contract():
    obj = {"a": [1.5] * 100, "b": np.arange(10), "c": ("t", None)}
    header, frames = gser.dask.dumps(obj)
    msgpack.packb(header, use_bin_type=True)  # Dask msgpacks the header
    assert header == {"gser": 1}
    out = gser.dask.loads(header, frames)
    assert out["a"] == obj["a"] and out["c"] == obj["c"]
    assert np.array_equal(out["b"], obj["b"]) and out["b"].flags.writeable


def nested(depth):
    obj = 1
    for _ in range(depth):
        obj = [obj]
    return obj


@pytest.mark.parametrize(
    "obj",
    [{1, 2}, 2**70, [1, 2**70], np.float64(1.0), object(), "\ud800", nested(40)],
    ids=["set", "bigint", "bigint_in_list", "np_scalar", "object", "surrogate", "deep"],
)
def test_family_refuses_with_not_implemented(obj):
    with pytest.raises(NotImplementedError):
        gser.dask.dumps(obj)


def test_loads_rejects_unknown_header():
    with pytest.raises(ValueError):
        gser.dask.loads({"gser": 99}, [b""])
    with pytest.raises(ValueError):
        gser.dask.loads({"gser": 1}, [])


def test_readonly_frames_give_writable_arrays():
    header, frames = gser.dask.dumps(np.arange(1000.0))
    frames = [bytes(f) for f in frames]
    out = gser.dask.loads(header, frames)
    assert out.flags.writeable


def test_serialize_uses_gser_first_and_falls_through(registered):
    h, f = ser.serialize([1.5] * 1000, serializers=["gser", "pickle"])
    assert h["serializer"] == "gser"
    assert ser.deserialize(h, f) == [1.5] * 1000
    h, f = ser.serialize({1, 2, 3}, serializers=["gser", "pickle"])
    assert h["serializer"] == "pickle"
    assert ser.deserialize(h, f) == {1, 2, 3}
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
    odd = [1.5, {1, 2}, np.arange(3)]
    frames = dask_dumps({"data": to_serialize(odd)}, serializers=list(gser.dask.SERIALIZERS))
    out = dask_loads(frames)["data"]
    assert out[0] == 1.5 and out[1] == {1, 2} and np.array_equal(out[2], np.arange(3))


def test_without_collections_dask_iterates():
    original = ser.serialize
    gser.dask.register(collections=False)
    try:
        assert ser.serialize is original
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
        assert h["serializer"] == "pickle"
    finally:
        gser.dask.unregister()
    h, f = ser.serialize([2.5] * 1000)
    assert h["serializer"] == "pickle"


def test_register_is_idempotent_and_undone():
    original = ser.serialize
    gser.dask.register()
    gser.dask.register()
    assert "gser" in ser.families and ser.serialize.__wrapped__ is original
    gser.dask.unregister()
    assert "gser" not in ser.families and ser.serialize is original


def test_local_cluster_end_to_end(spy):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                      dashboard_address=None) as cluster, \
         Client(cluster, serializers=list(gser.dask.SERIALIZERS),
                deserializers=list(gser.dask.DESERIALIZERS)) as client:
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
