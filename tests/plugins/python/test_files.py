"""The flattened form outside memory: gser.FlatBytes (what to_bytes returns),
gser.dump / gser.load through paths, descriptors, file objects, pipes,
sockets and mappings, and their errors, which must be from_bytes's on the same
bytes. Arrays are small: the GiB cases are in bench/python/bench_bytes.py."""

import errno
import gc
import io
import os
import pickle
import socket
import threading

import pytest

import gser

np = pytest.importorskip("numpy")

rng = np.random.default_rng(24)

LAYOUTS = {
    "c": lambda: rng.random((30, 20)),
    "fortran": lambda: np.asfortranarray(rng.random((30, 20))),
    "strided": lambda: rng.random((30, 20))[::3, ::2],
    "reversed": lambda: np.arange(100.0)[::-1],
    "broadcast": lambda: np.broadcast_to(np.arange(7.0), (5, 7)),
    "0d": lambda: np.array(3.5),
    "empty": lambda: np.zeros((0, 4)),
    "int8_odd": lambda: np.arange(13, dtype=np.int8),  # padding after it
    "big_endian": lambda: np.arange(50).astype(">i4"),
    "structured": lambda: np.ones(6, dtype=[("a", "i4"), ("b", "f8")]),
    "bool": lambda: np.array([True, False, True]),
    "large": lambda: rng.random(300_000),  # 2.4 MB: a frame read into a mapping of its own
}


def sample():
    return {"name": "sample", "arrays": {k: f() for k, f in LAYOUTS.items()}, "l": [1.5] * 40, "b": b"x" * 100_000}


def same(a, b):
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, np.ndarray):
        assert type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)
    else:
        assert type(a) is type(b) and a == b


# ---- FlatBytes ---------------------------------------------------------------------------------


def test_to_bytes_is_flat_bytes_read_as_bytes_is():
    obj = sample()
    b = gser.to_bytes(obj)
    assert type(b) is gser.FlatBytes
    raw = bytes(b)
    assert type(raw) is bytes and len(raw) == len(b) and len(b) > 2_500_000
    assert b == raw and raw == b and not (b != raw) and b == bytearray(raw) and b != raw[:-1]
    assert b[0] == 0x89 and b[-1] == raw[-1] and b[:8] == b"\x89GSER\r\n\x1a" and b[3:9:2] == raw[3:9:2]
    assert (b == "text") is False
    assert b + b"!" == raw + b"!" and b"!" + b == b"!" + raw and type(b + b"") is bytes
    with pytest.raises(TypeError):
        hash(b)
    mv = memoryview(b)
    assert mv.readonly and mv.nbytes == len(b) and mv.format == "B"
    with pytest.raises(TypeError):
        mv[0] = 1
    assert np.frombuffer(b, dtype=np.uint8)[:8].tobytes() == raw[:8]
    assert gser.to_bytes(obj) == b, "the same bytes every time"
    same(gser.from_bytes(b), obj)
    again = pickle.loads(pickle.dumps(b, protocol=5))
    assert type(again) is gser.FlatBytes and again == b
    assert gser.FlatBytes(raw) == b and gser.FlatBytes(b"") == b"" and len(gser.FlatBytes(b"")) == 0
    assert repr(b) == f"<gser.FlatBytes of {len(b)} bytes>"


def test_from_bytes_views_flat_bytes_without_a_copy():
    b = gser.to_bytes({"x": np.arange(100_000.0)})
    out = gser.from_bytes(b)["x"]
    assert np.shares_memory(out, np.frombuffer(b, dtype=np.uint8))
    assert not out.flags.writeable
    del b
    gc.collect()
    assert out[-1] == 99_999.0  # the array keeps the FlatBytes alive


def test_flat_bytes_go_to_files_and_sockets(tmp_path):
    b = gser.to_bytes(sample())
    p = tmp_path / "b.gser"
    with open(p, "wb") as f:
        assert f.write(b) == len(b)
    same(gser.load(p), gser.from_bytes(b))
    s1, s2 = socket.socketpair()
    with s1, s2:
        small = gser.to_bytes([1, 2, "three"])
        assert s1.send(small) == len(small)
        assert gser.from_bytes(s2.recv(1000)) == [1, 2, "three"]


# ---- dump / load -------------------------------------------------------------------------------


@pytest.mark.parametrize("mmap", [False, True], ids=["read", "mmap"])
@pytest.mark.parametrize("how", ["path", "str", "fd", "file", "raw_file"])
def test_round_trip_through_files(tmp_path, how, mmap):
    obj = sample()
    p = tmp_path / "x.gser"
    if how == "path":
        n = gser.dump(obj, p)
    elif how == "str":
        n = gser.dump(obj, str(p))
    elif how == "fd":
        fd = os.open(p, os.O_WRONLY | os.O_CREAT)
        n = gser.dump(obj, fd)
        os.close(fd)
    else:
        with open(p, "wb", buffering=0 if how == "raw_file" else -1) as f:
            f.write(b"")  # a buffered object with a position of its own
            n = gser.dump(obj, f)
            assert f.tell() == n
    assert n == os.path.getsize(p) and p.read_bytes() == gser.to_bytes(obj)
    if how in ("path", "str"):
        out = gser.load(p if how == "path" else str(p), mmap=mmap)
    elif how == "fd":
        fd = os.open(p, os.O_RDONLY)
        out = gser.load(fd, mmap=mmap)
        assert os.lseek(fd, 0, os.SEEK_CUR) == n, "the offset ends past the message"
        os.close(fd)
    else:
        with open(p, "rb", buffering=0 if how == "raw_file" else -1) as f:
            out = gser.load(f, mmap=mmap)
            assert f.tell() == n
    same(out, obj)
    assert out["arrays"]["large"].flags.writeable


def test_files_at_an_offset_and_read_ahead(tmp_path):
    """A file object's own position counts, even when its buffer has read
    past it; the message may start anywhere (here not on a page)."""
    obj = {"a": np.arange(300_000.0)}
    p = tmp_path / "x.gser"
    with open(p, "wb") as f:
        f.write(b"j" * 4100)
        n = gser.dump(obj, f)
    for mmap in (False, True):
        with open(p, "rb") as f:
            assert f.read(4100) == b"j" * 4100  # the buffer holds more than that
            same(gser.load(f, mmap=mmap), obj)
            assert f.tell() == 4100 + n and f.read() == b""


def maps_of(path):
    with open("/proc/self/maps") as m:
        return [line for line in m if line.rstrip().endswith(str(path))]


def test_mmap_arrays_view_the_mapping_which_they_keep_alive(tmp_path):
    a = np.arange(400_000, dtype=np.int64)
    p = tmp_path / "m.gser"
    gser.dump({"a": a, "s": "meta"}, p)
    out = gser.load(p, mmap=True)
    assert maps_of(p), "mapped, not read"
    x = out["a"]
    del out
    gc.collect()
    assert maps_of(p) and np.array_equal(x, a)
    # Private: writable, and the file never changes.
    x[0] = -1
    assert gser.load(p)["a"][0] == 0
    # The mapping outlives the file's name.
    os.unlink(p)
    assert x[-1] == 399_999
    del x
    gc.collect()
    assert not [m for m in maps_of(p) if "(deleted)" in m or str(p) in m]
    # Without mmap nothing stays mapped.
    gser.dump({"a": a}, p)
    y = gser.load(p)["a"]
    assert not maps_of(p) and np.array_equal(y, a)


def _pipe_writer(obj_list, fd, how):
    def run():
        if how == "fd":
            for o in obj_list:
                gser.dump(o, fd)
            os.close(fd)
        else:
            with open(fd, "wb", buffering=0 if how == "raw" else -1) as w:
                for o in obj_list:
                    gser.dump(o, w)
    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("how", ["fd", "raw", "buffered"])
def test_pipes_carry_messages_back_to_back(how):
    objs = [sample(), {"small": [1, 2, 3]}, np.arange(200_000, dtype=np.int32)]
    r, w = os.pipe()
    t = _pipe_writer(objs, w, how)
    try:
        if how == "fd":
            outs = [gser.load(r, mmap=True) for _ in objs]  # mmap: no file to map, read
            with pytest.raises(gser.GserError, match="GSER_ERR_BAD_MAGIC"):
                gser.load(r)
        else:
            with open(r, "rb", buffering=0 if how == "raw" else -1, closefd=False) as f:
                outs = [gser.load(f) for _ in objs]
                with pytest.raises(gser.GserError, match="GSER_ERR_BAD_MAGIC"):
                    gser.load(f)
    finally:
        t.join()
        os.close(r)
    for o, out in zip(objs, outs):
        same(out, o) if isinstance(o, dict) else same(out, o)


@pytest.mark.parametrize("timeout", [None, 5.0], ids=["blocking", "timeout"])
def test_sockets(timeout):
    objs = [sample(), {"k": np.ones((100, 100))}]
    s1, s2 = socket.socketpair()
    with s1, s2:
        s1.settimeout(timeout)
        s2.settimeout(timeout)
        t = threading.Thread(target=lambda: [gser.dump(o, s1) for o in objs])
        t.start()
        outs = [gser.load(s2) for _ in objs]
        t.join()
    for o, out in zip(objs, outs):
        same(out, o)


def test_tcp_loopback():
    srv = socket.create_server(("127.0.0.1", 0))
    obj = sample()
    with srv:
        c = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        with c, conn:
            t = threading.Thread(target=gser.dump, args=(obj, c))
            t.start()
            out = gser.load(conn)
            t.join()
    same(out, obj)


def test_objects_without_a_descriptor():
    obj = sample()
    f = io.BytesIO()
    f.write(b"pre")
    n = gser.dump(obj, f)
    assert f.getvalue()[3:] == gser.to_bytes(obj) and n == len(f.getvalue()) - 3
    f.seek(3)
    same(gser.load(f), obj)

    class Chunky:
        """write() takes at most 1000 bytes at a time; read() has no readinto."""

        def __init__(self):
            self.data = bytearray()
            self.pos = 0
            self.kept = []

        def write(self, mv):
            self.kept.append(mv)  # a writer that keeps what it was given
            self.data += mv[:1000]
            return min(len(mv), 1000)

        def read(self, n):
            out = bytes(self.data[self.pos:self.pos + min(n, 777)])
            self.pos += len(out)
            return out

    c = Chunky()
    gser.dump(obj, c)
    assert bytes(c.data) == gser.to_bytes(obj)
    with pytest.raises(ValueError, match="released"):
        bytes(c.kept[0])  # gser's memory is not reachable after the call
    same(gser.load(c), obj)


def test_device_objects_through_files(tmp_path):
    if gser.DEVICE_BACKEND != "emulated":
        pytest.skip("device arrays here are host memory: needs GSER_DEVICE=emulated")
    from test_device import Dev, check_device

    a = np.arange(3000, dtype=np.float32).reshape(30, 100)
    p = tmp_path / "d.gser"
    gser.dump({"d": Dev(a)}, p)
    for mmap in (False, True):
        assert np.array_equal(gser.load(p, mmap=mmap)["d"], a)  # host numpy by default
        check_device(gser.load(p, mmap=mmap, device=True)["d"], a)


def test_a_full_disk_is_an_oserror():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(OSError) as e:
        gser.dump(sample(), "/dev/full")
    assert e.value.errno == errno.ENOSPC


# ---- errors: those of from_bytes on the same bytes -------------------------------------------


def status_of(fn):
    try:
        fn()
    except gser.GserError as e:
        return e.status_name
    return "ok"


def bad_inputs():
    good = bytes(gser.to_bytes({"a": np.arange(50.0), "b": "x" * 300, "c": np.arange(7, dtype=np.int8)}))
    cases = [good[:n] for n in list(range(0, 48)) + list(range(48, len(good), 29))]
    cases += [good + b"\0" * 8, good + b"x"]
    r = np.random.default_rng(5)
    for _ in range(60):
        bad = bytearray(good)
        for i in r.integers(0, len(good), 2):
            bad[i] ^= int(r.integers(1, 256))
        cases.append(bytes(bad))
    n = int.from_bytes(good[12:16], "little")
    huge = bytearray(good)
    huge[16 + 8 * (n - 1) + 6] = 0x7f  # the last frame declares far more than there is
    cases.append(bytes(huge))
    return good, cases


def test_files_fail_as_from_bytes_does(tmp_path):
    good, cases = bad_inputs()
    p = tmp_path / "bad.gser"
    seen = set()
    for data in cases:
        want = status_of(lambda: gser.from_bytes(data))
        seen.add(want)
        p.write_bytes(data)
        for mmap in (False, True):
            assert status_of(lambda: gser.load(p, mmap=mmap)) == want, (len(data), mmap)
        if len(data) <= len(good):  # a stream's trailing bytes are the next message
            assert status_of(lambda: gser.load(io.BytesIO(data))) == want, len(data)
            r, w = os.pipe()
            os.write(w, data)
            os.close(w)
            try:
                assert status_of(lambda: gser.load(r)) == want, len(data)
            finally:
                os.close(r)
    assert {"ok", "GSER_ERR_TRUNCATED", "GSER_ERR_BAD_MAGIC", "GSER_ERR_FORMAT"} <= seen
    assert "GSER_ERR_LIMIT_BYTES" in seen or "GSER_ERR_TRUNCATED" in seen


def test_a_lying_stream_costs_what_it_sent():
    """A table that declares 512 GiB, then 100 kB and the end: truncated,
    in memory that followed what arrived."""
    prefix = b"\x89GSER\r\n\x1a" + (1).to_bytes(2, "little") + b"\0\0" + (1).to_bytes(4, "little")
    data = prefix + (512 << 30).to_bytes(8, "little") + b"x" * 100_000
    with pytest.raises(gser.GserError, match="GSER_ERR_TRUNCATED"):
        gser.load(io.BytesIO(data))
    r, w = os.pipe()
    t = threading.Thread(target=lambda: (os.write(w, data[:60000]), os.write(w, data[60000:]), os.close(w)))
    t.start()
    try:
        with pytest.raises(gser.GserError, match="GSER_ERR_TRUNCATED"):
            gser.load(r)
    finally:
        t.join()
        os.close(r)
