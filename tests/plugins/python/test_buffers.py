"""Buffers: numpy arrays (dtype, shape, zero-copy both ways, non-contiguous
inputs), other buffer exporters, __cuda_array_interface__ device arrays, and
the lifetime of the memory they view."""

import array
import gc
import weakref

import pytest

import gser

np = pytest.importorskip("numpy")

DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]
SHAPES = [(0,), (1,), (7,), (1000,), (3, 4), (2, 3, 5), (0, 3), (1, 1, 1, 1), (64, 1, 33)]


def make(dtype, shape):
    n = int(np.prod(shape))
    a = (np.arange(n) % 7 - 3).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * a[::-1]
    return a.reshape(shape)


def check_array(out, ref):
    assert type(out) is np.ndarray
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_roundtrip(dtype, shape):
    a = make(dtype, shape)
    header, frames = gser.dumps(a)
    check_array(gser.loads(header, frames), a)
    check_array(gser.from_bytes(gser.to_bytes(a)), a)


def test_numpy_in_containers():
    obj = {"x": [np.zeros(3), (np.ones((2, 2), np.int32), "s")], "y": np.arange(100_000, dtype=np.float64)}
    out = gser.loads(*gser.dumps(obj))
    check_array(out["x"][0], obj["x"][0])
    assert type(out["x"][1]) is tuple
    check_array(out["x"][1][0], obj["x"][1][0])
    check_array(out["y"], obj["y"])


@pytest.mark.parametrize(
    "view,layout",
    [
        (lambda a: a[::2], "copy"),
        (lambda a: a[:, ::3], "copy"),
        (lambda a: a.T, "fortran"),
        (lambda a: np.asfortranarray(a), "fortran"),
        (lambda a: a[::-1], "copy"),
        (lambda a: a[1:3, 2:5], "copy"),
        (lambda a: np.broadcast_to(a[0], (4, 12)), "broadcast"),
    ],
    ids=["step", "col_step", "transpose", "fortran", "reversed", "window", "broadcast"],
)
def test_layouts_as_dasks_numpy_serializer_keeps_them(view, layout):
    # Fortran order and broadcasts travel zero-copy with their strides; other
    # views are copied once into C order (test_arrays.py compares with Dask)
    base = np.arange(48, dtype=np.float64).reshape(4, 12)
    a = view(base)
    header, frames = gser.dumps(a)
    out = gser.loads(header, frames)
    check_array(out, a)
    if layout == "copy":
        assert out.flags.c_contiguous
        assert not frames or not np.shares_memory(np.frombuffer(frames[0], np.uint8), base)
    else:
        assert out.strides == a.strides
        sent = frames[0] if frames else header
        assert len(sent) <= base.nbytes and (layout != "broadcast" or len(sent) < a.nbytes)


def test_dumps_is_zero_copy():
    a = np.arange(1 << 16, dtype=np.float64)
    header, frames = gser.dumps({"a": a})
    assert len(frames) == 1
    f = np.frombuffer(frames[0], dtype=np.float64)
    # the frame is the array's own memory
    assert f.ctypes.data == a.ctypes.data
    assert np.shares_memory(f, a)
    # as writable as the array, as Dask's frames of it
    assert not frames[0].readonly
    a.flags.writeable = False
    assert gser.dumps({"a": a})[1][0].readonly


def test_loads_is_zero_copy():
    a = np.arange(1 << 16, dtype=np.int32).reshape(256, 256)
    header, frames = gser.dumps([a, "tail"])
    received = [bytearray(f) for f in frames]  # as a transport would hand them over
    out = gser.loads(header, received)
    view = np.frombuffer(received[0], dtype=np.uint8)
    assert np.shares_memory(out[0], view)
    assert out[0].ctypes.data == view.ctypes.data
    check_array(out[0], a)


def test_from_bytes_is_zero_copy():
    a = np.arange(4096, dtype=np.float32)
    b = bytearray(gser.to_bytes(a))
    out = gser.from_bytes(b)
    assert np.shares_memory(out, np.frombuffer(b, dtype=np.uint8))
    check_array(out, a)


def test_writability_follows_the_frames_and_the_sender():
    a = np.arange(1000, dtype=np.float64)
    header, frames = gser.dumps(a)
    assert not gser.loads(header, [bytes(f) for f in frames]).flags.writeable  # read-only frames
    out = gser.loads(bytearray(header), [bytearray(f) for f in frames])
    assert out.flags.writeable
    out[0] = 42.0  # writes into the received frame only
    assert a[0] == 0.0
    assert not gser.from_bytes(gser.to_bytes(a)).flags.writeable
    assert gser.from_bytes(bytearray(gser.to_bytes(a))).flags.writeable
    with pytest.raises(ValueError):
        gser.loads(header, [bytes(f) for f in frames])[0] = 1.0
    # read-only at the sender: read-only, whatever the frames
    a.flags.writeable = False
    header, frames = gser.dumps(a)
    out = gser.loads(bytearray(header), [bytearray(f) for f in frames])
    assert not out.flags.writeable and np.array_equal(out, a)
    # copy_readonly: writable at the sender, so writable, copied only out of read-only frames
    a = np.arange(1000, dtype=np.float64)
    header, frames = gser.dumps(a)
    for received, copied in (([bytes(f) for f in frames], True), ([bytearray(f) for f in frames], False)):
        out = gser.loads(header, received, copy_readonly=True)
        assert out.flags.writeable and np.array_equal(out, a)
        assert np.shares_memory(out, np.frombuffer(received[0], np.uint8)) != copied


def test_small_arrays_inline_in_the_header():
    a = np.arange(40, dtype=np.uint8)
    header, frames = gser.dumps(a)
    assert frames == []
    out = gser.loads(header, frames)
    check_array(out, a)
    assert not out.flags.writeable  # it views the (immutable) header bytes
    assert gser.loads(bytearray(header), frames).flags.writeable
    # wider elements may be copied out of the header to align them: then writable
    for dt in (np.int16, np.float64, np.complex128):
        b = np.arange(5, dtype=dt)
        h, f = gser.dumps(b)
        before = bytes(h)
        out = gser.loads(h, f)
        check_array(out, b)
        if out.flags.writeable:
            out[:] = 0
        assert h == before


def test_other_buffer_exporters():
    # bytearray and memoryview come back as themselves; typed buffers as numpy arrays
    ba = bytearray(b"abc" * 1000)
    out = gser.loads(*gser.dumps(ba))
    assert type(out) is bytearray and out == ba
    mv = memoryview(b"xyz" * 500)
    out = gser.loads(*gser.dumps(mv))
    assert type(out) is memoryview and out.tobytes() == mv.tobytes()
    out = gser.loads(*gser.dumps(array.array("d", [1.5, 2.5] * 100)))
    check_array(out, np.array([1.5, 2.5] * 100))
    out = gser.loads(*gser.dumps(array.array("i", range(300))))
    check_array(out, np.arange(300, dtype=np.int32))
    typed = memoryview(np.arange(12, dtype=np.uint16).reshape(3, 4))
    out = gser.loads(*gser.dumps(typed))
    assert type(out) is memoryview and out.format == "H" and out.shape == (3, 4) and out.tolist() == typed.tolist()


def test_strict_mode_takes_what_comes_back_as_itself():
    a = np.arange(10)
    check_array(gser.loads(*gser.dumps(a, strict=True)), a)
    for obj in (bytearray(b"x" * 300), memoryview(b"y" * 300), b"z" * 100_000):
        out = gser.loads(*gser.dumps([1, {"k": obj}], strict=True))[1]["k"]
        assert type(out) is type(obj) and bytes(out) == bytes(obj)
    x = gser.loads(*gser.dumps([1, {"k": np.float64(1.0)}], strict=True))[1]["k"]
    assert type(x) is np.float64 and x == 1.0  # numpy scalars come back as themselves
    for obj in (array.array("d", [1.0]),):
        with pytest.raises(NotImplementedError, match="strict"):
            gser.dumps(obj, strict=True)
        with pytest.raises(NotImplementedError, match="strict"):
            gser.dumps([1, {"k": obj}], strict=True)


@pytest.mark.parametrize(
    "obj",
    [
        lambda: np.array([object(), 1]),
        lambda: np.zeros(2, dtype=[("a", "i4"), ("o", object)]),
        lambda: np.zeros(1, dtype=[("a", "i4"), ("o", object)])[0],
    ],
    ids=["object", "object_field", "object_field_scalar"],
)
def test_unsupported_arrays(obj):
    with pytest.raises(NotImplementedError):
        gser.dumps(obj())


# ---- lifetime ------------------------------------------------------------------------------


def test_frames_keep_the_source_alive():
    a = np.arange(100_000, dtype=np.float64)
    ref = weakref.ref(a)
    header, frames = gser.dumps({"a": a})
    del a
    gc.collect()
    assert ref() is not None  # the frames borrow its memory
    out = gser.loads(header, frames)
    check_array(out["a"], np.arange(100_000, dtype=np.float64))
    del frames, out
    gc.collect()
    assert ref() is None


def test_loaded_arrays_keep_the_frames_alive():
    src = np.arange(100_000, dtype=np.float64)
    header, frames = gser.dumps(src)
    received = [np.frombuffer(bytearray(f), dtype=np.uint8) for f in frames]
    ref = weakref.ref(received[0])
    out = gser.loads(header, received)
    del received, frames, header
    gc.collect()
    assert ref() is not None
    check_array(out, src)
    del out
    gc.collect()
    assert ref() is None


def test_loaded_arrays_keep_the_flat_bytes_alive():
    b = np.frombuffer(bytearray(gser.to_bytes([np.arange(5000), np.ones(5000)])), dtype=np.uint8)
    ref = weakref.ref(b)
    out = gser.from_bytes(b)
    del b
    gc.collect()
    assert ref() is not None
    first = out[0]
    del out
    gc.collect()
    assert ref() is not None
    check_array(first, np.arange(5000))
    del first
    gc.collect()
    assert ref() is None


# ---- device arrays (__cuda_array_interface__) ----------------------------------------------


class FakeDeviceArray:
    """Host memory presented through __cuda_array_interface__: enough to check
    what dumps makes of a device array without a GPU."""

    def __init__(self, a, strides=None, shape=None):
        self.host = a
        self.strides = strides
        self.shape = shape or a.shape

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.shape,
            "typestr": self.host.dtype.str,
            "data": (self.host.ctypes.data, False),
            "strides": self.strides,
            "version": 3,
        }


def device_bytes(frame):
    # Copied through gser, as from a GPU (the tests run on the emulated backend).
    return frame.copy_to_host().tobytes()


def test_device_arrays_become_device_frames():
    # At least pack_max (1 MiB): a zero-copy frame of its own.
    host = np.arange(300_000, dtype=np.float32).reshape(3, 100_000)
    dev = FakeDeviceArray(host)
    ref = weakref.ref(dev)
    header, frames = gser.dumps({"x": dev, "y": [1, 2]})
    assert len(frames) == 1
    f = frames[0]
    assert isinstance(f, gser.DeviceFrame)
    assert f.nbytes == host.nbytes and len(f) == host.nbytes and f.ptr == host.ctypes.data
    cai = f.__cuda_array_interface__
    assert cai["shape"] == (host.nbytes,) and cai["typestr"] == "|u1" and cai["data"][0] == host.ctypes.data
    del dev
    gc.collect()
    assert ref() is not None  # the frame keeps the device array alive
    # loaded: a DeviceArray viewing the (zero-copy) frame, so the source's memory
    out = gser.loads(header, frames)
    assert isinstance(out["x"], gser.DeviceArray) and out["x"].ptr == host.ctypes.data
    with pytest.raises(NotImplementedError, match="strict"):
        gser.dumps(FakeDeviceArray(host), strict=True)
    del header, frames, f
    gc.collect()
    assert ref() is not None  # the loaded array keeps it alive
    assert np.array_equal(out["x"].copy_to_host(), host)
    del out
    gc.collect()
    assert ref() is None


def test_small_device_arrays_are_packed_into_one_device_frame():
    a = np.arange(1000, dtype=np.float32)
    b = np.arange(77, dtype=np.int16)
    header, frames = gser.dumps([FakeDeviceArray(a), FakeDeviceArray(b)])
    assert len(frames) == 1, "both gathered into one packed frame"
    f = frames[0]
    assert isinstance(f, gser.DeviceFrame)
    assert f.ptr not in (a.ctypes.data, b.ctypes.data), "packed: a copy, not a view"
    data = device_bytes(f)
    assert data[: a.nbytes] == a.tobytes()
    # each packed buffer starts 64-byte aligned
    assert data[4032 : 4032 + b.nbytes] == b.tobytes()


@pytest.mark.skipif(gser.DEVICE_BACKEND == "none", reason="needs a device backend (GSER_DEVICE=emulated)")
def test_strided_device_arrays_keep_their_layout():
    host = np.arange(12, dtype=np.float64)
    want = np.lib.stride_tricks.as_strided(host, (3, 4), (8, 24))  # Fortran order
    for families in (None, ("host",)):
        header, frames = gser.dumps(FakeDeviceArray(host.reshape(3, 4), strides=(8, 24)), families)
        out = gser.loads(header, frames, device=True)
        assert type(out) is gser.DeviceArray and out.strides == (8, 24) and out.shape == (3, 4)
        assert out.__cuda_array_interface__["strides"] == (8, 24)
        host_copy = out.copy_to_host()
        assert host_copy.strides == (8, 24) and np.array_equal(host_copy, want)
    # a broadcast travels as its base
    header, frames = gser.dumps(FakeDeviceArray(np.arange(4.0), strides=(0, 8), shape=(1000, 4)))
    assert sum(f.nbytes for f in frames) < 100 or not frames
    out = gser.loads(header, frames)
    assert out.strides == (0, 8) and np.array_equal(out.copy_to_host(), np.broadcast_to(np.arange(4.0), (1000, 4)))


def test_device_array_checks():
    host = np.arange(12, dtype=np.float64).reshape(3, 4)
    header, frames = gser.dumps(FakeDeviceArray(host, strides=(32, 8)))  # C-order strides given explicitly
    assert frames[0].nbytes == 96
    with pytest.raises(NotImplementedError, match="big-endian"):
        gser.dumps(FakeDeviceArray(np.arange(3, dtype=">i4")))

    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        gser.dumps([Broken()])
