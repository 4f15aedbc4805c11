"""DLPack both ways: objects with __dlpack__ / __dlpack_device__ become host
or device buffers (borrowed; their deleter runs once, when the message dies),
and gser.DeviceArray lends itself through __dlpack__.

numpy is a real CPU producer. CUDA producers are played by FakeTensor, which
builds DLManagedTensor with ctypes over host memory: with GSER_DEVICE=emulated
(as ctest runs this suite) "device" memory is host memory, so what gser reads
can be checked."""

import ctypes
import gc
import sys

import pytest

import gser

np = pytest.importorskip("numpy")

EMULATED = gser.DEVICE_BACKEND == "emulated"
needs_emulated = pytest.mark.skipif(not EMULATED, reason="reads device memory through ctypes: needs GSER_DEVICE=emulated")

kDLCPU, kDLCUDA, kDLCUDAHost, kDLOpenCL = 1, 2, 3, 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
PyCapsule_GetPointer.restype = ctypes.c_void_p
PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
PyCapsule_SetName = ctypes.pythonapi.PyCapsule_SetName
PyCapsule_SetName.restype = ctypes.c_int
PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# numpy dtype -> DLPack (code, bits)
CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32,
          np.float64, np.complex64, np.complex128]


def dl_type(dtype):
    dt = np.dtype(dtype)
    return CODES[dt.kind], dt.itemsize * 8


class HostOnly:
    """A CPU tensor known to gser only through DLPack (numpy exports it)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        assert stream is None  # CPU producers are not given a stream
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class FakeTensor:
    """A DLPack producer over host memory claiming any device type; counts
    how often its tensor's deleter runs."""

    def __init__(self, a, device_type=kDLCUDA, strides=None, byte_offset=0, lanes=1, ndim=None, code=None):
        self.a = a
        self.device_type = device_type
        self.deleted = 0
        self.streams = []
        self.strides = strides
        self.byte_offset = byte_offset
        self.lanes = lanes
        self.ndim = a.ndim if ndim is None else ndim
        self.code = code

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, *, stream=None):  # keyword-only, as the array API has it
        self.streams.append(stream)
        a = self.a
        n = max(a.ndim, self.ndim, 1)
        self.shape = (ctypes.c_int64 * n)(*(list(a.shape) + [1] * (n - a.ndim)))
        self.stride_arr = (ctypes.c_int64 * len(self.strides))(*self.strides) if self.strides else None
        code, bits = dl_type(a.dtype)
        mt = DLManagedTensor()
        mt.dl_tensor.data = a.ctypes.data - self.byte_offset
        mt.dl_tensor.device = DLDevice(self.device_type, 0)
        mt.dl_tensor.ndim = self.ndim
        mt.dl_tensor.dtype = DLDataType(code if self.code is None else self.code, bits, self.lanes)
        mt.dl_tensor.shape = self.shape
        mt.dl_tensor.strides = self.stride_arr
        mt.dl_tensor.byte_offset = self.byte_offset

        def deleter(_):
            self.deleted += 1

        self.deleter = DELETER(deleter)
        mt.deleter = self.deleter
        self.mt = mt
        return PyCapsule_New(ctypes.addressof(mt), b"dltensor", None)


class Dev:
    """Host memory as a device array through __cuda_array_interface__."""

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ctypes.data, False),
                "strides": None, "version": 3}


def values(dtype, shape):
    return (np.arange(int(np.prod(shape))) % 11 - 5).astype(dtype).reshape(shape)


def frame_addresses(frames):
    out = set()
    for f in frames:
        if isinstance(f, memoryview) and f.nbytes:
            out.add(np.frombuffer(f, np.uint8).ctypes.data)
        elif hasattr(f, "ptr"):
            out.add(f.ptr)
    return out


# ---- in: CPU tensors -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (3, 4), (2, 0, 5), (200_000,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_cpu_tensors_become_host_buffers(dtype, shape):
    a = values(dtype, shape)
    out = gser.loads(*gser.dumps({"t": HostOnly(a)}))["t"]
    assert type(out) is np.ndarray and out.dtype == a.dtype and out.shape == a.shape
    assert np.array_equal(out, a)


def test_cpu_tensors_are_borrowed_and_released_once():
    a = values(np.float64, (300_000,))  # above the inline limit: a frame of its own
    gc.collect()
    before = sys.getrefcount(a)
    header, frames = gser.dumps([HostOnly(a)])
    assert a.ctypes.data in frame_addresses(frames)  # zero-copy
    assert sys.getrefcount(a) == before + 1  # numpy's tensor holds the array until gser lets go
    del header, frames
    gc.collect()
    assert sys.getrefcount(a) == before
    for _ in range(100):
        gser.loads(*gser.dumps([HostOnly(a), HostOnly(a[:10])]))
    gc.collect()
    assert sys.getrefcount(a) == before


def test_strided_tensors_keep_their_layout():
    a = np.arange(12.0).reshape(3, 4)[:, ::2]  # numpy's DLPack export, strides in items
    out = gser.loads(*gser.dumps({"t": [HostOnly(a)]}))["t"][0]
    assert type(out) is np.ndarray and np.array_equal(out, a) and out.strides == a.strides


@pytest.mark.skipif(not EMULATED, reason="device tensors: needs GSER_DEVICE=emulated")
def test_strided_device_tensors_travel_and_lend_themselves():
    a = values(np.int64, (4, 5))
    t = FakeTensor(a, strides=[1, 4])  # Fortran order
    out = gser.loads(*gser.dumps(t))
    assert out.strides == (8, 32)
    assert np.array_equal(out.copy_to_host(), np.lib.stride_tricks.as_strided(a, (4, 5), (8, 32)))
    lent = tensor_of(out.__dlpack__()).dl_tensor
    assert [lent.strides[i] for i in range(2)] == [1, 4]


def test_numpy_refusals_come_through():
    with pytest.raises(BufferError):  # numpy's own: DLPack has no datetimes
        gser.dumps(HostOnly(np.zeros(3, "M8[ns]")))
    a = np.array([True, False, True] * 10)
    try:
        a.__dlpack__()
    except BufferError:  # numpy 1.x exports no bool through DLPack
        return
    out = gser.loads(*gser.dumps(HostOnly(a)))  # numpy 2: DLPack's bool
    assert out.dtype == np.bool_ and out.tolist() == a.tolist()


def test_buffer_protocol_and_cuda_array_interface_come_first():
    # A numpy array has __dlpack__ too; it still goes through the buffer
    # protocol (zero-copy, no tensor to release).
    a = values(np.int32, (50_000,))
    header, frames = gser.dumps(a)
    assert a.ctypes.data in frame_addresses(frames)


# ---- in: CUDA tensors (emulated) ---------------------------------------------------------------


@needs_emulated
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_cuda_tensors_become_device_buffers(dtype):
    a = values(dtype, (40, 25))
    t = FakeTensor(a)
    header, frames = gser.dumps({"t": t})
    assert t.streams == [2]  # ordered on the per-thread default stream, which gser uses
    out = gser.loads(header, frames)["t"]
    assert type(out) is gser.DeviceArray and out.shape == a.shape and out.dtype == a.dtype
    assert np.array_equal(out.copy_to_host(), a)
    assert t.deleted == 0
    del header, frames
    gc.collect()
    assert t.deleted == 0  # the loaded array still views the frames, which view the tensor
    del out
    gc.collect()
    assert t.deleted == 1


@needs_emulated
def test_byte_offset_strides_and_device_kinds():
    a = values(np.float32, (6, 7))
    # byte_offset is added to data; C-contiguous strides are fine
    for t in (FakeTensor(a, byte_offset=64), FakeTensor(a, strides=[7, 1]), FakeTensor(a[:1], strides=[99, 1])):
        ref = t.a
        out = gser.loads(*gser.dumps(t))
        assert np.array_equal(out.copy_to_host(), ref)
    # pinned host and CPU tensors are host buffers
    for kind in (kDLCUDAHost, kDLCPU):
        t = FakeTensor(a, device_type=kind)
        out = gser.loads(*gser.dumps(t))
        assert type(out) is np.ndarray and np.array_equal(out, a)
        assert t.streams == [None]


@needs_emulated
def test_bad_tensors_are_refused_and_still_released():
    a = values(np.int64, (4, 5))
    cases = [
        (FakeTensor(a, lanes=4), "vector"),
        (FakeTensor(a, code=9), "no dtype for"),
        (FakeTensor(a, ndim=0), "zero dimensions"),
        (FakeTensor(a, ndim=33), "more dimensions"),
    ]
    for t, why in cases:
        with pytest.raises(NotImplementedError, match=why) as e:
            gser.dumps({"key": [1, t]})
        assert "key" in str(e.value)  # the path of the value
        gc.collect()
        assert t.deleted == 1, why
    t = FakeTensor(a, device_type=kDLOpenCL)
    with pytest.raises(NotImplementedError, match="device type"):
        gser.dumps(t)
    assert t.deleted == 0  # refused before asking for the tensor

    class NotACapsule(FakeTensor):
        def __dlpack__(self, stream=None):
            return 42

    with pytest.raises(NotImplementedError, match="capsule"):
        gser.dumps(NotACapsule(a))

    class NoDevice:
        def __dlpack__(self, stream=None):
            raise AssertionError("not reached")

    with pytest.raises(AttributeError):
        gser.dumps(NoDevice())


@needs_emulated
def test_strict_mode_refuses_dlpack():
    with pytest.raises(NotImplementedError, match="strict"):
        gser.dumps([FakeTensor(values(np.int8, (3,)))], strict=True)


# ---- out: gser.DeviceArray.__dlpack__ --------------------------------------------------------------


def tensor_of(cap):
    ptr = PyCapsule_GetPointer(cap, b"dltensor")
    return ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor)).contents


@needs_emulated
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_arrays_lend_themselves(dtype):
    a = values(dtype, (3, 5, 2))
    out = gser.loads(*gser.dumps(Dev(a)))
    assert out.__dlpack_device__() == (kDLCUDA, 0)
    gc.collect()
    before = sys.getrefcount(out)
    cap = out.__dlpack__(stream=2)
    assert sys.getrefcount(out) == before + 1  # the tensor keeps the array alive
    t = tensor_of(cap).dl_tensor
    assert t.data == out.ptr and t.byte_offset == 0 and not t.strides
    assert (t.device.device_type, t.device.device_id) == (kDLCUDA, 0)
    assert t.ndim == 3 and [t.shape[i] for i in range(3)] == [3, 5, 2]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (*dl_type(dtype), 1)
    assert out.copy_to_host().tobytes() == a.tobytes()
    del t, cap  # never consumed: the capsule deletes its tensor
    gc.collect()
    assert sys.getrefcount(out) == before


@needs_emulated
def test_a_consumer_deletes_the_tensor_once():
    out = gser.loads(*gser.dumps(Dev(values(np.float64, (100,)))))
    gc.collect()
    before = sys.getrefcount(out)
    cap = out.__dlpack__()
    mt = tensor_of(cap)
    assert PyCapsule_SetName(cap, b"used_dltensor") == 0  # what a consumer does
    del cap
    gc.collect()
    assert sys.getrefcount(out) == before + 1  # consumed: the capsule leaves it to the consumer
    mt.deleter(ctypes.pointer(mt))
    gc.collect()
    assert sys.getrefcount(out) == before


@needs_emulated
def test_dlpack_arguments():
    out = gser.loads(*gser.dumps(Dev(values(np.int16, (10,)))))
    for kw in ({}, {"stream": None}, {"stream": 1}, {"max_version": (1, 0)}, {"dl_device": (kDLCUDA, 0)},
               {"copy": False}):
        assert tensor_of(out.__dlpack__(**kw)).dl_tensor.data == out.ptr
    with pytest.raises(BufferError, match="copy"):
        out.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device 0"):
        out.__dlpack__(dl_device=(kDLCPU, 0))
    with pytest.raises(TypeError):
        out.__dlpack__(2)  # keyword-only, as the array API says


@needs_emulated
def test_device_arrays_go_out_and_back_through_dlpack():
    a = values(np.float32, (64, 64))
    out = gser.loads(*gser.dumps(Dev(a)))

    class OnlyDLPack:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, stream=None):
            return self.x.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()

    gc.collect()
    before = sys.getrefcount(out)
    back = gser.loads(*gser.dumps({"x": OnlyDLPack(out)}))["x"]
    assert type(back) is gser.DeviceArray and np.array_equal(back.copy_to_host(), a)
    del back
    gc.collect()
    assert sys.getrefcount(out) == before
