"""Compressed frames from Python: dumps / to_bytes / dump with compression=,
which loads / from_bytes / load read without being told; what is left as it
is (random data, small frames, device frames); bad arguments."""

import os

import pytest

import gser

np = pytest.importorskip("numpy")

N = 1 << 20


def compressible():
    return np.repeat(np.arange(N // 64, dtype=np.int64), 8)  # sorted keys with runs


def incompressible():
    return np.random.default_rng(5).random(N // 8)


@pytest.mark.parametrize("codec", ["lz4", "zstd", "auto"])
def test_dumps_compresses_and_loads_reads_it(codec):
    a, r = compressible(), incompressible()
    header, frames = gser.dumps({"a": a, "r": r}, compression=codec)
    plain_header, plain_frames = gser.dumps({"a": a, "r": r})
    assert header[7] == 3 and plain_header[7] == 2  # the wire version after the 7-byte magic
    sizes = sorted(memoryview(f).nbytes for f in frames)
    assert sizes[0] < a.nbytes // 2  # the keys shrank
    assert sizes[1] == r.nbytes  # random data is sent as it is
    back = gser.loads(header, frames)
    np.testing.assert_array_equal(back["a"], a)
    np.testing.assert_array_equal(back["r"], r)
    assert not np.shares_memory(back["a"], a)


def test_none_is_todays_wire():
    a = compressible()
    h1, f1 = gser.dumps(a)
    h2, f2 = gser.dumps(a, compression=None)
    assert h1 == h2
    assert [bytes(x) for x in f1] == [bytes(x) for x in f2]


def test_small_frames_stay_as_they_are():
    small = np.zeros(1000, dtype=np.int64)  # 8,000 bytes, under the 10,000-byte minimum
    header, frames = gser.dumps([small], compression="zstd")
    assert header[7] == 2
    np.testing.assert_array_equal(gser.loads(header, frames)[0], small)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_to_bytes_and_dump_carry_compressed_frames(tmp_path, codec):
    a, r = compressible(), incompressible()
    b = gser.to_bytes([a, r], compression=codec)
    assert len(b) < len(gser.to_bytes([a, r])) - a.nbytes // 2
    x, y = gser.from_bytes(b)
    np.testing.assert_array_equal(x, a)
    np.testing.assert_array_equal(y, r)
    path = tmp_path / "c.gser"
    n = gser.dump([a, r], path, compression=codec)
    assert n == os.path.getsize(path) == len(b)
    for mmap in (False, True):
        x, y = gser.load(path, mmap=mmap) if mmap else gser.load(path)
        np.testing.assert_array_equal(x, a)
        np.testing.assert_array_equal(y, r)
    with open(path, "rb") as f:
        assert gser.load(f)[0].sum() == a.sum()


def test_corrupt_compressed_data_is_a_gser_error():
    a = compressible()
    header, frames = gser.dumps(a, compression="lz4")
    bad = bytearray(bytes(frames[0]))
    bad[:] = b"\xff" * len(bad)
    with pytest.raises(gser.GserError, match="frame 1"):
        gser.loads(header, [bad])
    b = bytearray(gser.to_bytes(a, compression="zstd"))
    b[-40:] = b"\x00" * 40  # the end of the zstd data
    with pytest.raises(gser.GserError, match="frame 1"):
        gser.from_bytes(bytes(b))


def test_bad_compression_argument():
    for bad in ("gzip", 3, b"lz4"):
        with pytest.raises(ValueError, match="compression"):
            gser.dumps(1, compression=bad)
        with pytest.raises(ValueError, match="compression"):
            gser.to_bytes(1, compression=bad)


class Dev:
    """Host memory presented as a device array (the emulated backend reads it)."""

    def __init__(self, a):
        self.host = np.ascontiguousarray(a)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "data": (self.host.ctypes.data, False),
                "strides": None, "version": 3, "stream": None}


@pytest.mark.skipif(gser.DEVICE_BACKEND != "emulated", reason="needs GSER_DEVICE=emulated")
def test_device_frames_are_not_compressed():
    zeros = np.zeros(N, dtype=np.uint8)
    header, frames = gser.dumps([Dev(zeros)], compression="auto")
    assert header[7] == 2 and type(frames[0]) is gser.DeviceFrame  # zeros, yet sent as they are
    # staged to host frames by the host family: left as they are too
    header, frames = gser.dumps([Dev(zeros)], families=("host",), compression="auto")
    assert header[7] == 2
    assert memoryview(frames[0]).nbytes == N
