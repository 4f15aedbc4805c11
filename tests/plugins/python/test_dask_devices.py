"""RAPIDS objects through gser as through Dask's own comms, against Dask's
contract rather than gser's registry: stand-ins of CuPy, RMM, Numba and
cuDF (tests/plugins/python/standins: pure Python, their device memory is
host memory, which the emulated backend takes as device memory) registered
with Dask exactly as the real packages are (distributed.protocol's lazy
registrations of cupy, rmm and numba; cudf.comm.serialize), on
LocalCluster(protocol="gser") and on a tcp LocalCluster with the gser
family on, each compared with a tcp LocalCluster without gser: scatter to
one worker, move to the other, gather; byte-identical results; the types of
the frames a receiving worker's deserializer gets; a deserializer that
raises on the receiving worker errs the task (never a crash, never a hang).

One cluster of each kind for the whole module: starting clusters is the
slow part of these tests."""

import asyncio
import os
import sys
from pathlib import Path

import pytest

import gser

np = pytest.importorskip("numpy")
pytest.importorskip("distributed")

STANDINS = Path(__file__).parent / "standins"
EMULATED = gser.DEVICE_BACKEND == "emulated"
pytestmark = pytest.mark.skipif(not EMULATED, reason="the stand-ins' device memory is host memory: "
                                "needs GSER_DEVICE=emulated")
_STANDIN_TOPS = ("cupy", "rmm", "numba", "cudf", "daskprobe", "_devmem")
# A hang fails the test rather than the suite.
TIMEOUT = 120


@pytest.fixture(scope="module")
def standins():
    """The stand-ins, importable here and in every process a cluster starts."""
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(STANDINS))
    mp.setenv("PYTHONPATH", os.pathsep.join([str(STANDINS), os.environ.get("PYTHONPATH", "")]))
    import cudf
    import cupy
    import daskprobe
    import numba.cuda
    import rmm

    # This process's gser:// comms choose their allocator again, now that RMM is there.
    comm = None
    if gser.HAVE_UCX:
        import gser.comm as comm

        saved = dict(comm._alloc_state), gser.set_device_allocator(None)
        comm._alloc_state["pid"] = None
    yield type("S", (), dict(cupy=cupy, rmm=rmm, numba=numba, cudf=cudf, probe=daskprobe))
    if comm is not None:
        comm._alloc_state.update(saved[0])
        gser.set_device_allocator(saved[1])
    mp.undo()
    for name in [n for n in sys.modules if n.split(".")[0] in _STANDIN_TOPS]:
        del sys.modules[name]
    # gser registered the stand-ins' types lazily: arm its loaders again for the real ones.
    for key in [k for k in gser.registered()["types"] if k.split(".")[0] in _STANDIN_TOPS]:
        gser.unregister_type(key)
    gser.register_lazy("cupy", gser._register_cupy)
    gser.register_lazy("numba", gser._register_numba)


def _cluster(protocol, **client_options):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol=protocol,
                           dashboard_address=":0")
    client = Client(cluster, **client_options)
    return cluster, client


@pytest.fixture(scope="module")
def clusters(standins):
    """{"tcp": without gser, "tcp+gser": the family on, "gser": gser://} -> Client."""
    import gser.dask

    was = gser.dask.registered(), dict(gser.dask._state)
    out, started = {}, []
    try:
        gser.dask.unregister()
        # Its scheduler runs in this process, whose comms say "gser" in their
        # handshakes once the family is registered below: this client keeps
        # to Dask's own serializers, as a process without gser would.
        started.append(_cluster("tcp", serializers=["dask", "pickle"]))
        out["tcp"] = started[-1][1]
        gser.dask.register(default=True)
        started.append(_cluster("tcp"))
        out["tcp+gser"] = started[-1][1]
        started.append(_cluster("gser"))
        out["gser"] = started[-1][1]
        yield out
    finally:
        for cluster, client in reversed(started):
            client.close()
            cluster.close()
        gser.dask.unregister()
        if was[0]:
            gser.dask.register(collections=was[1]["collections"], default=was[1]["default"])


def _move(client, obj):
    """Scatter obj to one worker, move it to the other (worker to worker),
    gather it back."""
    from daskprobe import same

    a, b = sorted(client.scheduler_info()["workers"])
    fut = client.scatter(obj, workers=[a])
    moved = client.submit(same, fut, workers=[b], allow_other_workers=False, pure=False)
    done = moved.result(timeout=TIMEOUT)
    assert client.who_has(moved)[moved.key] == (b,)
    return done


def _bytes(x, s):
    """What a result is, byte for byte: type, dtype, shape, strides, flags, bytes."""
    if isinstance(x, s.cupy.ndarray):
        return ("cupy", x.dtype.str, x.shape, x.strides, x.flags.c_contiguous, x.flags.f_contiguous,
                x.get().tobytes(order="A"))
    if isinstance(x, s.rmm.DeviceBuffer):
        return ("rmm", x.size, x.tobytes())
    if isinstance(x, s.numba.cuda.devicearray.DeviceNDArray):
        return ("numba", x.dtype.str, x.shape, x.strides, x.copy_to_host().tobytes(order="A"))
    if isinstance(x, s.cudf.DataFrame):
        return ("cudf", x.columns, [(x._columns[n][1].str, x.column_to_host(n).tobytes()) for n in x.columns],
                [type(x.column_owner(n)).__name__ for n in x.columns])
    raise AssertionError(f"unexpected result type {type(x)}")


def _objects(s):
    cupy, rmm, cudf, cuda = s.cupy, s.rmm, s.cudf, s.numba.cuda
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    c = cupy.asarray(base)
    return {
        "cupy_c": c,
        "cupy_f": cupy.asarray(np.asfortranarray(base)),
        "cupy_0d": cupy.asarray(np.float32(2.5)),
        "cupy_empty": cupy.asarray(np.empty((0, 3), np.int16)),
        "cupy_view": c[::2, 1::2],
        "cupy_1byte": cupy.asarray(np.array([7], np.uint8)),
        "cupy_32MiB": cupy.asarray(np.arange(4 << 20, dtype=np.float64)),
        "rmm_empty": rmm.DeviceBuffer(size=0),
        "rmm_1byte": rmm.DeviceBuffer.to_device(b"\x05"),
        "rmm_32MiB": rmm.DeviceBuffer.to_device(np.arange(8 << 20, dtype=np.int32).tobytes()),
        "numba": cuda.to_device(np.arange(10, dtype=np.int64)),
        "numba_f": cuda.to_device(np.asfortranarray(base)),
        "cudf": cudf.DataFrame({"a": np.arange(1000), "b": np.linspace(0, 1, 1000)}),
        "cudf_empty": cudf.DataFrame({"a": np.arange(0)}),
    }


OBJECTS = ["cupy_c", "cupy_f", "cupy_0d", "cupy_empty", "cupy_view", "cupy_1byte", "cupy_32MiB", "rmm_empty",
           "rmm_1byte", "rmm_32MiB", "numba", "numba_f", "cudf", "cudf_empty"]


@pytest.mark.parametrize("name", OBJECTS)
def test_device_objects_move_as_on_tcp(clusters, standins, name):
    obj = _objects(standins)[name]
    ref = _bytes(obj, standins)
    if name == "cupy_view":  # Dask's serializers send a strided view as a C-ordered copy
        ref = _bytes(standins.cupy.ascontiguousarray(obj), standins)
    results = {kind: _bytes(_move(client, obj), standins) for kind, client in clusters.items()}
    assert results["tcp"] == ref
    assert results["tcp+gser"] == results["tcp"]
    assert results["gser"] == results["tcp"]


def test_receiving_worker_gets_rmm_device_buffers(clusters, standins):
    """What the receiving worker's cuda deserializer is given on gser://: the
    device frame as rmm.DeviceBuffer (as Dask's ucx:// gives it), the host
    frame as a writable memoryview; on tcp://, host frames only."""
    from daskprobe import Probe, seen

    for kind, client in clusters.items():
        a, b = sorted(client.scheduler_info()["workers"])
        fut = client.scatter(Probe(b"abc" * 50), workers=[a])
        types, payload = client.submit(seen, fut, workers=[b], allow_other_workers=False,
                                       pure=False).result(timeout=TIMEOUT)
        if kind == "gser":
            assert types == ["rmm.DeviceBuffer", "builtins.memoryview:writable"], kind
            assert payload == b"abc" * 50
        else:
            assert all(t in ("builtins.memoryview", "builtins.memoryview:writable", "builtins.bytes",
                             "builtins.bytearray") for t in types), (kind, types)


def test_raising_deserializer_on_a_worker_ends_the_transfer(clusters, standins):
    """The dependency's deserializer raises on the worker that fetches it:
    the worker does not crash, the transfer ends (the dependency leaves
    "flight") and the dependent task ends where it ends on tcp, and the
    cluster keeps working. (Dask 2022.12 leaves the dependent task waiting
    on tcp too: the scheduler ignores an error report for a key another
    worker holds in memory.) A hang fails the test by its timeout."""
    import time

    from distributed import wait
    from daskprobe import Boom, same, task_state

    outcome = {}
    for kind, client in clusters.items():
        a, b = sorted(client.scheduler_info()["workers"])
        fut = client.scatter(Boom(b), workers=[a])
        moved = client.submit(same, fut, workers=[b], allow_other_workers=False, pure=False)
        deadline, seen = time.monotonic() + TIMEOUT, False
        while True:
            state, text = client.run(task_state, fut.key, workers=[b])[b]
            if state is None and seen:
                state = "forgotten"  # released and dropped between two polls
            seen = seen or state is not None
            if state not in ("fetch", "flight", None) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # Where the dependency is then is Dask's: "error" with the
        # deserializer's exception (up to 2023), or on current Dask, whose
        # get_worker() answers only where the worker set it (the stand-in
        # raises only there), the data arrives, the dependent task
        # finishes, and the key is in "memory" or already "released" (8
        # rounds each: tcp:// 8 "memory"; with gser's serializers, on
        # tcp:// and gser://, 3 and 0 "released" when first seen).
        assert state in ("error", "released", "forgotten", "memory"), (kind, state)
        if state == "error":
            assert "Boom: this deserializer raises here" in text, (kind, text)
        try:
            wait([moved], timeout=5)  # finished or erred, or (2022.12) waiting on every comm
        except TimeoutError:
            pass
        outcome[kind] = moved.status
        assert moved.status == outcome["tcp"], (kind, outcome)  # clusters lists tcp first
        client.cancel([moved, fut])
        assert client.submit(sum, [1, 2], pure=False).result(timeout=TIMEOUT) == 3, kind  # still works
        assert sorted(client.scheduler_info()["workers"]) == [a, b], kind  # no worker died


# ---- where gser:// puts received device frames (in this process) -------------------------------


@pytest.fixture
def fresh_allocator():
    """gser.comm chooses its allocator again (as in a new process) and forgets it after."""
    import gser.comm

    saved = dict(gser.comm._alloc_state), gser.set_device_allocator(None)
    gser.comm._alloc_state["pid"] = None
    yield gser.comm
    gser.comm._alloc_state.update(saved[0])
    gser.set_device_allocator(saved[1])


def test_rmm_allocates_and_honours_the_pool_size(standins, fresh_allocator):
    import dask

    rmm = standins.rmm
    with dask.config.set({"distributed.rmm.pool-size": "3 MiB"}):
        fn = fresh_allocator._device_allocator()
    assert type(fn(10)) is rmm.DeviceBuffer
    assert rmm._reinitialized == {"pool_allocator": True, "managed_memory": False, "initial_pool_size": 3 << 20}


def test_an_allocator_set_before_comes_before_rmm(standins, fresh_allocator):
    def mine(n):
        return standins.cupy.empty((n,), "u1")

    gser.set_device_allocator(mine)
    assert fresh_allocator._device_allocator() is mine
    assert gser.set_device_allocator(mine) is mine  # still set


def test_the_config_key_names_the_allocator(standins, fresh_allocator):
    import dask

    with dask.config.set({"distributed.comm.gser.device-allocator": "daskprobe.counting_allocator"}):
        fn = fresh_allocator._device_allocator()
    assert fn is standins.probe.counting_allocator
    before = standins.probe.allocations
    out = gser.from_bytes(gser.to_bytes([standins.cupy.asarray(np.arange(10.0))]), device=True)[0]
    assert standins.probe.allocations > before  # gser's own device allocations go through it too
    assert np.array_equal(standins.cupy.asarray(out).get(), np.arange(10.0))


async def _through_a_comm(obj):
    from distributed.comm import connect, listen
    from distributed.protocol import to_serialize

    got = asyncio.Queue()

    async def handle(comm):
        await got.put(await comm.read())
        await comm.close()

    lst = listen("gser://127.0.0.1:0", handle)
    await lst.start()
    comm = await connect(lst.contact_address)
    await comm.write({"x": to_serialize(obj)})
    msg = await asyncio.wait_for(got.get(), TIMEOUT)
    await comm.close()
    lst.stop()
    return msg["x"]


@pytest.mark.skipif(not gser.HAVE_UCX, reason="gser::ucx not built")
def test_numba_device_arrays_without_rmm(standins, fresh_allocator):
    """Without RMM, received device frames are Numba device arrays, as on ucx://."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "rmm", None)  # import rmm fails
        fn = fresh_allocator._device_allocator()
    assert type(fn(4)) is standins.numba.cuda.devicearray.DeviceNDArray
    out = asyncio.run(_through_a_comm(standins.probe.Probe(b"xyz" * 100)))
    assert out.seen == ["numba.cuda.cudadrv.devicearray.DeviceNDArray", "builtins.memoryview:writable"]


def test_family_headers_keep_device_frames_out_of_memoryview(standins):
    """serialize_and_split (Dask's message path) on the family's headers, for
    one object and a whole collection: device frames pass as they are."""
    import gser.dask
    from distributed.protocol.serialize import merge_and_deserialize, serialize_and_split

    cupy = standins.cupy
    ctx = {"recipient": {"gser": 1, "gser-device": True}}
    a = cupy.asarray(np.arange(300_000, dtype=np.float32))
    was = gser.dask.registered(), dict(gser.dask._state)
    gser.dask.register()
    try:
        for obj in (a, [a, cupy.asarray(np.arange(5))]):
            header, frames = serialize_and_split(obj, serializers=("gser",), context=ctx, size=1 << 16)
            assert header["serializer"] == "gser"
            assert len(header["compression"]) == len(frames)
            dev = [f for f in frames if type(f) is gser.DeviceFrame]
            assert dev and all(c is False for f, c in zip(frames, header["compression"]) if f in dev)
            out = merge_and_deserialize(header, frames, deserializers=("gser",))
            first = out if type(out) is cupy.ndarray else out[0]
            assert type(first) is cupy.ndarray and np.array_equal(first.get(), a.get())
    finally:
        if not was[0]:
            gser.dask.unregister()
        else:
            gser.dask.register(collections=was[1]["collections"], default=was[1]["default"])


@pytest.mark.skipif(not gser.HAVE_UCX, reason="gser::ucx not built")
def test_large_device_frames_are_received_into_their_allocation(standins, fresh_allocator):
    """A device frame above the pack size is received straight into the
    rmm.DeviceBuffer the deserializer gets: one allocation, no device copy;
    small ones (packed on the way) get one allocation each."""
    rmm = standins.rmm
    fresh_allocator._device_allocator()
    payload = np.arange(1 << 20, dtype=np.uint16).tobytes()  # 2 MiB
    src = rmm.DeviceBuffer.to_device(payload)
    before = rmm.allocations
    out = asyncio.run(_through_a_comm(src))
    assert type(out) is rmm.DeviceBuffer and out.tobytes() == payload
    assert rmm.allocations - before == 1
    small = [rmm.DeviceBuffer.to_device(bytes([i]) * (i + 1)) for i in range(3)]
    before = rmm.allocations
    outs = asyncio.run(_through_a_comm(small))
    assert [type(o) for o in outs] == [rmm.DeviceBuffer] * 3
    assert [o.tobytes() for o in outs] == [s.tobytes() for s in small]
    # the sender's packed frame and the receiver's (gser's device memory
    # comes from the allocator on both sides), then one each
    assert rmm.allocations - before == 2 + 3


def test_raising_deserializer_on_the_client_fails_the_gather(clusters, standins):
    """The deserializer raises in the client (gather): the gather raises, as
    on tcp, and the client keeps working (a hang fails the test by its timeout)."""
    from daskprobe import Boom

    for kind, client in clusters.items():
        fut = None
        # Where it raises is Dask's: at the gather (2022.12), or already in
        # the scatter, whose reply carries the object back (2026).
        with pytest.raises(Exception) as info:
            fut = client.scatter(Boom(None), workers=sorted(client.scheduler_info()["workers"])[:1])
            fut.result(timeout=TIMEOUT)
        assert not isinstance(info.value, (TimeoutError, asyncio.TimeoutError)), (kind, info.value)
        if fut is not None:
            client.cancel([fut])
        assert client.submit(sum, [1, 2], pure=False).result(timeout=TIMEOUT) == 3, kind


def test_family_restores_device_buffers_into_rmm(standins, fresh_allocator):
    """On a comm without device frames (tcp://), the family stages device
    buffers into host frames; the receiver restores them into the memory
    Dask's ucx:// would give them (an rmm.DeviceBuffer here)."""
    import gser.dask

    cupy, rmm = standins.cupy, standins.rmm
    a = cupy.asarray(np.arange(300_000, dtype=np.float32))  # a buffer of its own
    header, frames = gser.dask.dumps(a, context={"recipient": {"gser": 1}})  # a tcp peer: host frames
    assert not any(type(f) is gser.DeviceFrame for f in frames)
    before = rmm.allocations
    out = gser.dask.loads(header, frames)
    assert type(out) is cupy.ndarray and np.array_equal(out.get(), a.get())
    assert rmm.allocations > before
    hit = gser.device_allocation(out.data.ptr)
    assert hit is not None and type(hit[0]) is rmm.DeviceBuffer
