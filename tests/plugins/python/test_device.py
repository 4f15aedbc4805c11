"""Device buffers on the way back: gser.DeviceArray from loads and from_bytes
(__cuda_array_interface__ v3, copy_to_host, lifetime), to_bytes of device
data through the "host" family, device=True (GSER_DESERIALIZE_RESTORE_DEVICE),
the interface's stream, and the device backend chosen by GSER_DEVICE.

The suite runs with GSER_DEVICE=emulated (plugins/python/CMakeLists.txt):
"device" memory is host memory; contents are checked through copy_to_host()
(gser_device_memcpy), as on a GPU."""

import gc
import os
import subprocess
import sys
import weakref

import pytest

import gser
from memory import rss_growth

np = pytest.importorskip("numpy")

EMULATED = gser.DEVICE_BACKEND == "emulated"
SANITIZED = bool(os.environ.get("GSER_PY_SANITIZED"))
pytestmark = pytest.mark.skipif(not EMULATED, reason="reads device memory through ctypes: needs GSER_DEVICE=emulated")

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]


class Dev:
    """Host memory presented as a device array through __cuda_array_interface__."""

    def __init__(self, a, stream=None):
        self.host = np.ascontiguousarray(a)
        self.stream = stream

    @property
    def __cuda_array_interface__(self):
        cai = {"shape": self.host.shape, "typestr": self.host.dtype.str, "data": (self.host.ctypes.data, False),
               "strides": None, "version": 3}
        if self.stream is not False:
            cai["stream"] = self.stream
        return cai


def make(dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 11 - 5).astype(dtype).reshape(shape)
    return a


def check_device(out, ref):
    assert type(out) is gser.DeviceArray
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.ndim == ref.ndim
    assert out.nbytes == ref.nbytes and len(out) == ref.shape[0]
    cai = out.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == ref.shape and cai["typestr"] == ref.dtype.str
    assert cai["data"] == (out.ptr, False) and cai["strides"] is None and cai["stream"] is None
    host = out.copy_to_host()
    assert type(host) is np.ndarray and host.dtype == ref.dtype and host.shape == ref.shape
    assert np.array_equal(host, ref)


@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (3, 4), (2, 0, 5), (300_000,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_roundtrip(dtype, shape):
    a = make(dtype, shape)
    header, frames = gser.dumps({"x": Dev(a)})
    out = gser.loads(header, frames)["x"]
    check_device(out, a)
    assert repr(out).startswith("<gser.DeviceArray ")


def test_device_arrays_view_the_frames():
    big = np.arange(400_000, dtype=np.float32)  # >= pack_max: a frame of its own, zero-copy
    small = np.arange(100, dtype=np.int16)       # packed with the others into one frame
    header, frames = gser.dumps([Dev(big), Dev(small), Dev(small[:10])])
    out = gser.loads(header, frames)
    ptrs = {f.ptr for f in frames}
    assert out[0].ptr == big.ctypes.data and big.ctypes.data in ptrs
    packed = [f for f in frames if f.ptr != big.ctypes.data][0]
    assert packed.ptr <= out[1].ptr < packed.ptr + packed.nbytes
    check_device(out[1], small)
    check_device(out[2], small[:10])


def test_device_arrays_keep_the_message_alive():
    src = Dev(np.arange(300_000, dtype=np.float64))
    ref = weakref.ref(src)
    header, frames = gser.dumps(src)
    out = gser.loads(header, frames)
    del src, frames, header
    gc.collect()
    assert ref() is not None  # DeviceArray -> message -> input DeviceFrame -> dumps' message -> src
    check_device(out, np.arange(300_000, dtype=np.float64))
    del out
    gc.collect()
    assert ref() is None


def test_device_arrays_send_again():
    a = make(np.float32, (5, 7))
    once = gser.loads(*gser.dumps(Dev(a)))
    twice = gser.loads(*gser.dumps({"again": once}))["again"]
    check_device(twice, a)
    check_device(gser.from_bytes(gser.to_bytes([once]), device=True)[0], a)
    # something consuming __cuda_array_interface__ sees the same memory
    cai = twice.__cuda_array_interface__
    assert cai["data"][0] == twice.ptr and np.array_equal(twice.copy_to_host(), a)


def test_to_bytes_stages_device_data_into_host_frames():
    a = make(np.int32, (100, 30))
    obj = {"d": Dev(a), "h": np.ones(3), "l": [1.5] * 20}
    b = gser.to_bytes(obj)
    out = gser.from_bytes(b)
    assert type(out["d"]) is np.ndarray and np.array_equal(out["d"], a)  # host numpy by default
    assert np.array_equal(out["h"], np.ones(3)) and out["l"] == [1.5] * 20
    dev = gser.from_bytes(b, device=True)
    check_device(dev["d"], a)
    assert type(dev["h"]) is np.ndarray  # host buffers of the sender stay host buffers
    # families given: "device" is left out, "host" added
    for fams in (("device", "host"), "device", ("host",)):
        assert np.array_equal(gser.from_bytes(gser.to_bytes(obj, families=fams))["d"], a)


def test_to_bytes_copies_each_device_buffer_once():
    # Counted by the emulated backend: every device buffer is copied once, by
    # one batch, into the FlatBytes; nothing is gathered on the device first.
    from gser import _gser

    bufs = [make(np.float64, (n,)) + i for i, n in enumerate([4096, 1, 100_000, 0, 333, 32 * 1024] * 10)]
    obj = [Dev(b) for b in bufs]
    nonempty = [b for b in bufs if b.nbytes]
    _gser._device_stats(True)
    b = gser.to_bytes(obj)
    st = _gser._device_stats(True)
    assert st["d2h_ops"] == 1 and st["d2h_copies"] == len(nonempty)
    assert st["d2h_bytes"] == sum(x.nbytes for x in nonempty)
    assert st["d2d_ops"] == 0 and st["d2d_bytes"] == 0
    out = gser.from_bytes(b)
    assert len(out) == len(bufs)
    for o, r in zip(out, bufs):  # an empty device buffer stays a device buffer
        assert o.nbytes == 0 if not r.nbytes else np.array_equal(o, r)
    # the frames path (dumps) stages: a gather on the device, then one copy to host
    gser.dumps(obj, families=("host",))
    st = _gser._device_stats(True)
    assert st["d2d_bytes"] == sum(x.nbytes for x in nonempty) and st["d2h_ops"] == 1
    # with compression, the same bytes as uncompressed where nothing shrinks
    assert gser.from_bytes(gser.to_bytes(obj, compression="lz4"))[2].tolist() == bufs[2].tolist()


def test_host_family_and_device_true():
    a = make(np.float64, (64, 64))
    header, frames = gser.dumps([Dev(a), np.zeros(2)], families=("host",))
    assert all(type(f) is memoryview for f in frames)
    out = gser.loads(header, frames)
    assert type(out[0]) is np.ndarray and np.array_equal(out[0], a)
    out = gser.loads(header, frames, device=True)
    check_device(out[0], a)
    assert type(out[1]) is np.ndarray
    # device frames need no restoring: device=True changes nothing for them
    out = gser.loads(*gser.dumps([Dev(a)]), device=True)
    check_device(out[0], a)


def test_cuda_array_interface_streams():
    a = make(np.float32, (1000,))
    for stream in (None, 1, 2, False):  # False: no "stream" key at all
        out = gser.loads(*gser.dumps(Dev(a, stream=stream)))
        check_device(out, a)
    with pytest.raises(NotImplementedError, match="stream 0"):
        gser.dumps(Dev(a, stream=0))
    with pytest.raises(NotImplementedError, match="stream is not an int"):
        gser.dumps(Dev(a, stream="default"))
    # frames with a stream: loads synchronizes with it before reading
    header, frames = gser.dumps(Dev(a))
    out = gser.loads(header, [Dev(frames[0].copy_to_host(), stream=2)])
    check_device(out, a)
    with pytest.raises(NotImplementedError, match="stream 0"):
        gser.loads(header, [Dev(np.zeros(frames[0].nbytes, np.uint8), stream=0)])


def test_device_array_attributes_are_read_only():
    out = gser.loads(*gser.dumps(Dev(np.arange(10))))
    for name, value in (("ptr", 0), ("nbytes", 1), ("shape", (1,)), ("dtype", None)):
        with pytest.raises(AttributeError):
            setattr(out, name, value)
    assert out.typestr == np.dtype(np.int64).str and out.device == 0
    with pytest.raises(TypeError):
        gser.DeviceArray()


def test_strict_mode_refuses_device_arrays():
    with pytest.raises(NotImplementedError, match="gser.DeviceArray"):
        gser.dumps([Dev(np.arange(3))], strict=True)


def test_refcounts_do_not_leak():
    a = make(np.float32, (1000, 10))
    src = Dev(a)
    gc.collect()
    before = sys.getrefcount(src), sys.getrefcount(a)
    for _ in range(200):
        header, frames = gser.dumps({"d": src, "again": [src]})
        out = gser.loads(header, frames)
        out["d"].copy_to_host()
        gser.from_bytes(gser.to_bytes(out), device=True)
        gser.loads(header, frames, device=True)
        try:
            gser.dumps(Dev(a, stream=0))
        except NotImplementedError:
            pass
    del header, frames, out
    gc.collect()
    assert (sys.getrefcount(src), sys.getrefcount(a)) == before


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine holds freed memory: RSS is not meaningful")
def test_memory_stays_flat():
    src = [Dev(make(np.float64, (256, 256))), Dev(make(np.int8, (1000,)))]

    def cycle():
        for _ in range(20):
            header, frames = gser.dumps(src)
            out = gser.loads(header, frames)
            out[0].copy_to_host()
            b = gser.to_bytes(src)
            gser.from_bytes(b, device=True)[0].copy_to_host()
            gser.loads(*gser.dumps(src, families="host"), device=True)

    grown = rss_growth(cycle, 10)
    assert grown < 8 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 200 device round trips"


# ---- the backend follows GSER_DEVICE -------------------------------------------------------------


def run_with(device, code):
    env = dict(os.environ, GSER_DEVICE=device)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_backend_none():
    code = """
import gser, numpy as np
print(gser.DEVICE_BACKEND)
a = np.arange(1000.0)
class Dev:
    __cuda_array_interface__ = {"shape": (1000,), "typestr": "<f8", "data": (a.ctypes.data, False), "version": 3}
try:
    gser.dumps(Dev())
except gser.GserError as e:
    print(e.status_name)
h, f = gser.dumps(a)
out = gser.loads(h, [Dev()])  # device frames load as DeviceArray without a backend...
print(type(out).__name__)
try:
    out.copy_to_host()          # ...but copying them needs one
except gser.GserError as e:
    print(e.status_name)
try:
    gser.from_bytes(gser.to_bytes(a), device=True)
except gser.GserError as e:
    print(e.status_name)
"""
    r = run_with("none", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["none", "GSER_ERR_NO_DEVICE", "DeviceArray", "GSER_ERR_NO_DEVICE",
                                "GSER_ERR_NO_DEVICE"], r.stdout
