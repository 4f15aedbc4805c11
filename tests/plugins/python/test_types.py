"""Types registered from Python (gser.register_type / register_lazy) travel as
themselves: device arrays as device buffers, Arrow tables as "arrow.array",
anything else as what to_gser makes of them; the receiver's from_gser rebuilds
them, zero-copy. CuPy, PyTorch and pyarrow do not install here: their lazy
registrations are exercised with stand-in modules that have the few functions
gser calls. Device memory is the emulated backend's (GSER_DEVICE=emulated):
its contents are read through gser's own copies, never by host code."""

import gc
import sys
import types

import pytest

import gser

np = pytest.importorskip("numpy")
needs_device = pytest.mark.skipif(gser.DEVICE_BACKEND == "none", reason="needs a device backend (GSER_DEVICE=emulated)")


class CAI:
    def __init__(self, obj):
        self.__cuda_array_interface__ = obj.__cuda_array_interface__


def host_copy(obj):
    """The contents of a device array, copied to the host by gser (host family)."""
    return gser.loads(*gser.dumps(CAI(obj), families=("host",)))


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


@pytest.fixture
def point():
    gser.register_type(Point, lambda p: (p.x, p.y), lambda t: Point(*t), name="test.Point")
    yield
    assert gser.unregister_type("test.Point")


def test_registered_type_comes_back_as_itself(point):
    out = gser.loads(*gser.dumps({"p": [Point(1, 2.5)], "q": Point("a", None)}))
    assert type(out["p"][0]) is Point and (out["p"][0].x, out["p"][0].y) == (1, 2.5)
    assert (out["q"].x, out["q"].y) == ("a", None)
    assert gser.registered()["types"]["test.Point"][0] is Point
    # the Dask family's strict mode takes it: the registration says what comes back
    assert type(gser.loads(*gser.dumps(Point(0, 0), strict=True))) is Point


def test_receiver_without_the_registration_is_told_the_fix(point):
    header, frames = gser.dumps({"p": Point(1, 2)})
    gser.unregister_type(Point)
    with pytest.raises(gser.GserError) as e:
        gser.loads(header, frames)
    assert e.value.status_name == "GSER_ERR_UNKNOWN_TYPE" and "$.p" in str(e.value)
    assert "'test.Point'" in str(e.value) and "gser.register_type" in str(e.value)
    gser.register_type(Point, lambda p: (p.x, p.y), lambda t: Point(*t), name="test.Point")
    assert gser.loads(header, frames)["p"].y == 2
    with pytest.raises(NotImplementedError, match="register_type"):
        gser.dumps(types.SimpleNamespace())  # never registered: refused, never pickled


def test_registration_arguments_and_errors(point):
    with pytest.raises(TypeError):
        gser.register_type("not a type", lambda x: x, lambda x: x)
    with pytest.raises(TypeError):
        gser.register_type(Point, None, lambda x: x)
    assert not gser.unregister_type("nobody")

    class Default:
        pass

    gser.register_type(Default, lambda d: 1, lambda v: Default())
    name = f"{__name__}.test_registration_arguments_and_errors.<locals>.Default"
    assert name in gser.registered()["types"]
    assert type(gser.loads(*gser.dumps(Default()))) is Default
    assert gser.unregister_type(Default) and name not in gser.registered()["types"]

    def broken(p):
        raise RuntimeError("to_gser failed")

    gser.register_type(Point, broken, lambda t: Point(*t), name="test.Point")
    with pytest.raises(RuntimeError, match="to_gser failed"):
        gser.dumps([Point(1, 2)])


def test_lazy_loader_runs_once_when_first_met():
    mod = types.ModuleType("gser_test_lazylib")
    exec("class Thing:\n    def __init__(self, v): self.v = v\n", mod.__dict__)
    mod.Thing.__module__ = "gser_test_lazylib.core"
    calls = []

    def loader():
        calls.append(1)
        gser.register_type(mod.Thing, lambda t: t.v, mod.Thing, name="gser_test_lazylib.Thing")

    gser.register_lazy("gser_test_lazylib", loader)
    try:
        assert not calls
        header, frames = gser.dumps([mod.Thing(5), mod.Thing(6)])
        assert calls == [1]
        gser.unregister_type("gser_test_lazylib.Thing")
        gser.register_lazy("gser_test_lazylib", loader)  # a receiver that never met one
        out = gser.loads(header, frames)
        assert calls == [1, 1] and [t.v for t in out] == [5, 6]
    finally:
        gser.unregister_type("gser_test_lazylib.Thing")


# ---- device arrays of a library of our own ----------------------------------------------------


class DevArray:
    """A device array library: host memory behind __cuda_array_interface__
    (device memory, to the emulated backend), or a zero-copy view of another
    CAI object (a gser.DeviceArray)."""

    def __init__(self, host=None, view_of=None):
        self.host, self.view_of = host, view_of

    @property
    def __cuda_array_interface__(self):
        if self.view_of is not None:
            return self.view_of.__cuda_array_interface__
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "data": (self.host.ctypes.data, False),
                "strides": None, "version": 3}


@pytest.fixture
def devarray():
    gser.register_type(DevArray, lambda a: a, lambda v: DevArray(view_of=v), name="test.DevArray")
    yield
    gser.unregister_type(DevArray)


@needs_device
@pytest.mark.parametrize("n", [100, 300_000], ids=["packed", "zero_copy"])
def test_device_arrays_come_back_as_their_type_zero_copy(devarray, n):
    a = np.arange(n, dtype=np.float32).reshape(-1, 50)
    header, frames = gser.dumps({"a": DevArray(a)})
    assert all(type(f) is gser.DeviceFrame for f in frames)  # a device buffer, not a host copy
    out = gser.loads(header, frames)["a"]
    assert type(out) is DevArray and type(out.view_of) is gser.DeviceArray
    cai = out.__cuda_array_interface__
    assert cai["data"][0] == out.view_of.ptr and cai["shape"] == a.shape  # a view of the received frame
    assert np.array_equal(out.view_of.copy_to_host(), a)
    # through the host family (a comm without device frames): back on the device with device=True
    header, frames = gser.dumps(DevArray(a), families=("host",))
    assert all(type(f) is memoryview for f in frames)
    out = gser.loads(header, frames, device=True)
    assert type(out) is DevArray and np.array_equal(out.view_of.copy_to_host(), a)


@needs_device
def test_dlpack_tensors_of_a_registered_type(devarray):
    from test_dlpack import FakeTensor, kDLCUDA

    class Tensor(FakeTensor):
        pass

    gser.register_type(Tensor, lambda t: t, lambda v: ("tensor", v), name="test.Tensor")
    try:
        a = np.arange(64, dtype=np.int16).reshape(8, 8)
        t = Tensor(a, device_type=kDLCUDA)
        kind, v = gser.loads(*gser.dumps([t], strict=True))[0]
        assert kind == "tensor" and type(v) is gser.DeviceArray and np.array_equal(v.copy_to_host(), a)
        assert t.deleted == 0  # v views the frames, which borrow the tensor
        del v
        gc.collect()
        assert t.deleted == 1  # released once, with the message
    finally:
        gser.unregister_type(Tensor)


@pytest.mark.skipif(not gser.HAVE_ARROW, reason="built without gser::arrow")
def test_arrow_tables_of_a_registered_type():
    import arrow_ctypes as ac

    class Batch(ac.Table):
        """A record-batch class with the PyCapsule interface; from_gser reads it back."""

    def from_gser(arr):
        info, values, _ = ac.read(arr, device=arr.device_type != ac.ARROW_DEVICE_CPU)
        return Batch({name: (child["format"], values[name]) for name, child in
                      zip(values, info["children"])}, methods=("array",))

    gser.register_type(Batch, lambda b: b, from_gser, name="test.Batch")
    try:
        for device_type, families in ((ac.ARROW_DEVICE_CPU, None), (ac.ARROW_DEVICE_CUDA, ("host",))):
            if device_type != ac.ARROW_DEVICE_CPU and gser.DEVICE_BACKEND == "none":
                continue
            b = Batch({"id": ("l", [1, None, 3]), "name": ("u", ["a", "b", None])}, methods=("device",),
                      device_type=device_type)
            out = gser.loads(*gser.dumps([b], families, strict=True), device=True)[0]
            assert type(out) is Batch and out.columns == {"id": ("l", [1, None, 3]), "name": ("u", ["a", "b", None])}
    finally:
        gser.unregister_type(Batch)


# ---- the libraries gser registers lazily, with stand-ins ------------------------------------------


@pytest.fixture
def stand_in(monkeypatch):
    """Put a stand-in module in sys.modules under a library's name and arm
    gser's lazy loader for it again; undone afterwards."""
    names = []

    def install(name, module, loader):
        monkeypatch.setitem(sys.modules, name, module)
        gser.register_lazy(name, loader)
        names.append((name, loader))

    yield install
    for name, loader in names:
        for key in [k for k in gser.registered()["types"] if k.startswith(name + ".")]:
            gser.unregister_type(key)
        gser.register_lazy(name, loader)


def fake_cupy():
    cupy = types.ModuleType("cupy")

    class ndarray(DevArray):
        __module__ = "cupy"
        flags = types.SimpleNamespace(c_contiguous=True)

    def asarray(obj):
        if isinstance(obj, np.ndarray):  # host data: cupy copies it to its device
            return ndarray(host=np.array(obj))
        return ndarray(view_of=obj)  # __cuda_array_interface__: zero-copy

    cupy.ndarray, cupy.asarray, cupy.ascontiguousarray = ndarray, asarray, lambda x: x
    return cupy


@needs_device
def test_cupy_arrays_come_back_as_cupy_arrays(stand_in):
    cupy = fake_cupy()
    stand_in("cupy", cupy, gser._register_cupy)
    a = np.arange(3000, dtype=np.float64).reshape(30, 100)
    out = gser.loads(*gser.dumps({"x": cupy.ndarray(host=a)}, strict=True))["x"]
    assert type(out) is cupy.ndarray and type(out.view_of) is gser.DeviceArray  # zero-copy of the frame
    assert np.array_equal(host_copy(out), a)
    assert "cupy.ndarray" in gser.registered()["types"]


@needs_device
def test_cupy_arrays_through_the_dask_family(stand_in):
    pytest.importorskip("distributed")
    import gser.dask

    cupy = fake_cupy()
    stand_in("cupy", cupy, gser._register_cupy)
    a = np.arange(500, dtype=np.int32)
    # a comm with device frames (its handshake says so) keeps them on the device
    header, frames = gser.dask.dumps([cupy.ndarray(host=a)], context={"recipient": {"gser": 1, "gser-device": True}})
    assert all(type(f) is gser.DeviceFrame for f in frames[1:])
    out = gser.dask.loads(header, frames)[0]
    assert type(out) is cupy.ndarray and np.array_equal(host_copy(out), a)
    # Dask's TCP comm carries host frames only: staged to the host, back on this device
    header, frames = gser.dask.dumps([cupy.ndarray(host=a)], context={"recipient": {"gser": 1}})
    assert all(type(f) in (bytes, memoryview) for f in frames)
    out = gser.dask.loads(header, [bytearray(f) for f in frames])[0]
    assert type(out) is cupy.ndarray and type(out.view_of) is gser.DeviceArray
    assert np.array_equal(host_copy(out), a)


def test_torch_tensors_on_the_cpu_and_on_the_device(stand_in):
    torch = types.ModuleType("torch")

    class Tensor:
        __module__ = "torch"

        def __init__(self, data, device="cpu"):
            self.data, self.device = data, types.SimpleNamespace(type=device)

        def detach(self):
            return self

        def contiguous(self):
            return self

        def numpy(self):
            return self.data

        @property
        def __cuda_array_interface__(self):
            if self.device.type != "cuda":
                raise AttributeError("__cuda_array_interface__")
            return self.data.__cuda_array_interface__

    torch.Tensor = Tensor
    torch.from_numpy = lambda a: Tensor(a)
    torch.from_dlpack = lambda v: Tensor(v, device="cuda")
    stand_in("torch", torch, gser._register_torch)
    cpu = gser.loads(*gser.dumps(Tensor(np.arange(10.0)), strict=True))
    assert type(cpu) is Tensor and cpu.device.type == "cpu" and np.array_equal(cpu.data, np.arange(10.0))
    if gser.DEVICE_BACKEND != "none":
        dev = gser.loads(*gser.dumps(Tensor(DevArray(np.arange(7.0)), device="cuda"), strict=True))
        assert type(dev) is Tensor and dev.device.type == "cuda" and type(dev.data) is gser.DeviceArray
        assert np.array_equal(dev.data.copy_to_host(), np.arange(7.0))


@pytest.mark.skipif(not gser.HAVE_ARROW, reason="built without gser::arrow")
def test_pyarrow_record_batches(stand_in):
    import arrow_ctypes as ac

    pyarrow = types.ModuleType("pyarrow")

    class RecordBatch(ac.Table):
        __module__ = "pyarrow.lib"

    class Array(ac.Table):
        __module__ = "pyarrow.lib"

    pyarrow.RecordBatch, pyarrow.Array = RecordBatch, Array
    pyarrow.record_batch = lambda arr: ("record_batch", ac.read(arr)[1])
    pyarrow.array = lambda arr: ("array", ac.read(arr)[1])
    stand_in("pyarrow", pyarrow, gser._register_pyarrow)
    b = RecordBatch({"id": ("l", [7, 8])}, methods=("array",))
    assert gser.loads(*gser.dumps(b, strict=True)) == ("record_batch", {"id": [7, 8]})
