"""Arrow tables through the Arrow PyCapsule interface: dumps of producers
with __arrow_c_device_array__ / __arrow_c_array__ ("arrow.array" values of
gser::arrow), gser.ArrowArray from loads, capsule ownership on both sides,
device tables (GSER_DEVICE=emulated), to_bytes / from_bytes(device=True),
errors, and lifetimes.

pyarrow is not a Debian 12 package: the producer and consumer are the
ctypes ones of arrow_ctypes.py. When pyarrow is installed, a round trip
through it runs too."""

import gc
import os
import sys

import pytest

import arrow_ctypes as ac
import gser
from memory import rss_growth

pytestmark = pytest.mark.skipif(not gser.HAVE_ARROW, reason="the module was built without gser::arrow")
SANITIZED = bool(os.environ.get("GSER_PY_SANITIZED"))
EMULATED = gser.DEVICE_BACKEND == "emulated"
needs_emulated = pytest.mark.skipif(not EMULATED, reason="reads device memory through ctypes: GSER_DEVICE=emulated")


def sample(n=300, **kw):
    cols = {
        "id": ("l", [i if i % 7 else None for i in range(n)]),
        "name": ("u", [None if i % 5 == 3 else f"row-{i}" for i in range(n)]),
    }
    return ac.Table(cols, metadata={"id": {"unit": "count"}}, **kw)


def expected(t):
    return {name: values for name, (_, values) in t.columns.items()}


SCHEMA = {
    "format": "+s",
    "name": None,
    "metadata": None,
    "children": [
        {"format": "l", "name": "id", "metadata": {"unit": "count"}, "children": []},
        {"format": "u", "name": "name", "metadata": None, "children": []},
    ],
}


@pytest.mark.parametrize("n", [0, 1, 5, 300, 100_000])
def test_cpu_table_roundtrip(n):
    t = sample(n)
    header, frames = gser.dumps({"table": t, "note": "x"})
    assert t.calls == ["array"]
    out = gser.loads(header, frames)
    assert out["note"] == "x"
    got = out["table"]
    assert type(got) is gser.ArrowArray
    assert got.length == n and got.format == "+s" and got.device_type == ac.ARROW_DEVICE_CPU
    assert got.device_id == -1 and not got.consumed
    assert "length %d on the CPU" % n in repr(got)
    info, values, device_type = ac.read(got)
    assert info == SCHEMA and values == expected(t) and device_type == ac.ARROW_DEVICE_CPU
    assert got.consumed and "handed over" in repr(got)


def test_device_method_is_preferred():
    t = sample(methods=("array", "device"))
    out = gser.loads(*gser.dumps(t))
    assert t.calls == ["device"]
    assert out.device_type == ac.ARROW_DEVICE_CPU  # the producer said CPU
    assert ac.read(out, device=True)[1] == expected(t)
    only_device = sample(methods=("device",))
    assert ac.read(gser.loads(*gser.dumps(only_device)))[1] == expected(only_device)


def test_schema_capsules_are_copies():
    out = gser.loads(*gser.dumps(sample()))
    for _ in range(3):  # any number of times, before and after the table is handed over
        cap = out.__arrow_c_schema__()
        assert ac.schema_info(ac.ArrowSchema.from_address(ac.get_pointer(cap, ac.SCHEMA_NAME))) == SCHEMA
    ac.read(out, device=True, move=True)
    cap = out.__arrow_c_schema__()
    assert ac.schema_info(ac.ArrowSchema.from_address(ac.get_pointer(cap, ac.SCHEMA_NAME))) == SCHEMA


def test_single_consumer():
    out = gser.loads(*gser.dumps(sample()))
    schema, array = out.__arrow_c_device_array__()
    with pytest.raises(RuntimeError, match="handed over"):
        out.__arrow_c_device_array__()
    with pytest.raises(RuntimeError, match="handed over"):
        out.__arrow_c_array__()
    # the capsules own the table: it outlives the ArrowArray and is released with them
    del out
    gc.collect()
    assert ac.device_values(schema, array)["name"][:2] == ["row-0", "row-1"]
    del schema, array


def test_export_arguments():
    out = gser.loads(*gser.dumps(sample()))
    with pytest.raises(NotImplementedError, match="future"):
        out.__arrow_c_device_array__(future=1)
    with pytest.raises(TypeError):
        out.__arrow_c_array__(future=None)
    with pytest.raises(TypeError):
        out.__arrow_c_array__(None, requested_schema=None)
    assert not out.consumed
    # requested_schema is accepted and ignored; None-valued future keywords too
    schema_cap = out.__arrow_c_schema__()
    out.__arrow_c_device_array__(schema_cap, future=None)
    assert out.consumed


def test_tables_need_nothing_of_the_message():
    t = sample(50_000)
    header, frames = gser.dumps(t)
    received = [bytearray(f) for f in frames]
    out = gser.loads(header, received)
    del header, frames, received
    gc.collect()
    assert ac.read(out)[1] == expected(t)


def test_a_loaded_table_can_be_sent_on():
    t = sample()
    first = gser.loads(*gser.dumps(t))
    second = gser.loads(*gser.dumps([first]))[0]
    assert first.consumed  # dumps consumed it, as any consumer
    assert ac.read(second)[1] == expected(t)


# ---- ownership of the producer's structs ------------------------------------------------


def test_producer_structs_released_once_after_the_frames():
    t = sample(10_000)  # large columns: frames that borrow the producer's buffers
    header, frames = gser.dumps({"t": t})
    assert frames and t.released() == (0, 0)  # lent to the frames
    out = gser.loads(header, frames)
    assert t.released() == (0, 0)
    del frames
    gc.collect()
    assert t.released() == (1, 1)  # once, when the frames went
    assert ac.read(out["t"])[1] == expected(t)
    small = sample(3)  # everything inline: released when dumps returns
    header, frames = gser.dumps(small)
    assert frames == [] and small.released() == (1, 1)
    gser.to_bytes(small)
    assert small.released() == (2, 2)  # a fresh export each time, each released once


def test_dumps_borrows_the_producers_buffers():
    np = pytest.importorskip("numpy")
    t = sample(100_000)
    header, frames = gser.dumps(t)
    frame_addrs = {np.frombuffer(f, np.uint8).ctypes.data for f in frames}
    big = {addr for addr, size in t.buffers if size >= 100_000 * 4}  # int64 values, utf8 offsets and bytes
    assert len(big) == 3 and big <= frame_addrs, "sent zero-copy"


def test_invalid_capsules_are_refused_and_released():
    class Bad:
        def __init__(self, kind):
            self.kind = kind
            self.t = sample()

        def __arrow_c_array__(self, requested_schema=None):
            schema, array = self.t._c_array()
            if self.kind == "swap":
                return array, schema
            if self.kind == "one":
                return (schema,)
            if self.kind == "released":
                ac.ArrowArray.from_address(ac.get_pointer(array, ac.ARRAY_NAME)).release(
                    ac.ctypes.cast(ac.get_pointer(array, ac.ARRAY_NAME), ac.ctypes.POINTER(ac.ArrowArray)))
                return schema, array
            raise KeyError("producer failed")

    for kind, exc, msg in (("swap", ValueError, r"\$\[1\]: an Arrow table of type Bad: the first capsule"),
                           ("one", ValueError, "tuple of two capsules"),
                           ("released", ValueError, "released struct"),
                           ("raise", KeyError, "producer failed")):
        bad = Bad(kind)
        with pytest.raises(exc, match=msg):
            gser.dumps([1, bad])
        gc.collect()
        if kind != "raise":
            assert bad.t.released() == (1, 1), kind  # by the capsules' destructors


def test_invalid_tables_fail_with_the_column_path():
    t = ac.Table({"a": ("l", [1, 2, 3])}, length=-1)
    with pytest.raises(gser.GserError, match=r"GSER_ERR_INVALID_ARG.*\$\.t.*negative") as e:
        gser.dumps({"t": t})
    assert e.value.status_name == "GSER_ERR_INVALID_ARG"
    gc.collect()
    assert t.released() == (1, 1)


def test_strict_mode_refuses_tables():
    t = sample()
    with pytest.raises(NotImplementedError, match="strict"):
        gser.dumps({"t": t}, strict=True)
    assert t.calls == []  # refused before exporting anything


def test_to_bytes_and_from_bytes():
    t = sample(2000)
    out = gser.from_bytes(gser.to_bytes({"t": t}))["t"]
    assert out.device_type == ac.ARROW_DEVICE_CPU
    assert ac.read(out)[1] == expected(t)


# ---- device tables (host memory standing in for device memory) --------------------------


@needs_emulated
def test_device_table_roundtrip():
    t = sample(5000, methods=("device",), device_type=ac.ARROW_DEVICE_CUDA)
    header, frames = gser.dumps(t)
    assert frames and all(type(f) is gser.DeviceFrame for f in frames)
    out = gser.loads(header, frames)
    assert out.device_type == ac.ARROW_DEVICE_CUDA and out.device_id == 0
    with pytest.raises(ValueError, match="device memory"):
        out.__arrow_c_array__()
    assert not out.consumed
    info, values, device_type = ac.read(out, device=True)
    assert info == SCHEMA and values == expected(t) and device_type == ac.ARROW_DEVICE_CUDA


@needs_emulated
def test_device_table_through_the_host_family():
    t = sample(5000, methods=("device",), device_type=ac.ARROW_DEVICE_CUDA)
    header, frames = gser.dumps(t, families=("host",))
    assert all(type(f) is memoryview for f in frames)
    assert gser.loads(header, frames).device_type == ac.ARROW_DEVICE_CPU
    back = gser.loads(header, frames, device=True)
    assert back.device_type == ac.ARROW_DEVICE_CUDA
    assert ac.read(back, device=True)[1] == expected(t)
    b = gser.to_bytes({"t": t})
    host = gser.from_bytes(b)["t"]
    assert host.device_type == ac.ARROW_DEVICE_CPU and ac.read(host)[1] == expected(t)
    dev = gser.from_bytes(b, device=True)["t"]
    assert dev.device_type == ac.ARROW_DEVICE_CUDA and ac.read(dev, device=True, move=True)[1] == expected(t)


def _buffer_pointers(arr, path="$"):
    """(path, buffer index, pointer) of every buffer of arr and its children."""
    out = [(path, b, arr.buffers[b]) for b in range(arr.n_buffers)]
    for i in range(arr.n_children):
        out += _buffer_pointers(arr.children[i].contents, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("device", [False, pytest.param(True, marks=needs_emulated)], ids=["cpu", "device"])
@pytest.mark.parametrize("n", [0, 3])
def test_empty_buffers_are_not_null(n, device):
    """A zero-length buffer the format has is a non-NULL pointer, as Arrow's
    own exporter gives (older consumers dereference it): with no rows, every
    buffer but the offsets; with all strings "", the string data."""
    t = ac.Table({"id": ("l", list(range(n))), "name": ("u", [""] * n)},
                 methods=("device",) if device else ("array",),
                 device_type=ac.ARROW_DEVICE_CUDA if device else ac.ARROW_DEVICE_CPU)
    out = gser.loads(*gser.dumps(t))
    assert out.device_type == t.device_type
    schema, array = out.__arrow_c_device_array__()
    arr = ac.ArrowDeviceArray.from_address(ac.get_pointer(array, ac.DEVICE_ARRAY_NAME)).array
    ptrs = _buffer_pointers(arr)
    assert [(path, b) for path, b, _ in ptrs] == [("$", 0), ("$[0]", 0), ("$[0]", 1), ("$[1]", 0), ("$[1]", 1),
                                                   ("$[1]", 2)]
    assert [p for _, b, p in ptrs if b == 0] == [None] * 3  # no nulls: no validity bitmaps, as Arrow exports
    assert all(p for _, b, p in ptrs if b > 0), ptrs
    if not device:
        assert ac.read(gser.loads(*gser.dumps(t)))[1] == {"id": list(range(n)), "name": [""] * n}


@needs_emulated
def test_tables_and_device_arrays_in_one_message():
    import numpy as np

    class Dev:
        def __init__(self, a):
            self.a = a
            self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                             "data": (a.ctypes.data, False), "version": 3}

    a = np.arange(1000, dtype=np.float32)
    t = sample(100, methods=("device",), device_type=ac.ARROW_DEVICE_CUDA)
    out = gser.loads(*gser.dumps({"a": Dev(a), "t": t, "h": np.ones(4)}))
    assert ac.read(out["t"], device=True, move=True)[1] == expected(t)
    gc.collect()
    assert np.array_equal(out["a"].copy_to_host(), a)  # its memory is the message's, not the table's


# ---- leaks ----------------------------------------------------------------------------------


def test_refcounts_do_not_leak():
    t = sample(1000)
    gc.collect()
    before = sys.getrefcount(t)
    for _ in range(200):
        header, frames = gser.dumps({"t": t})
        out = gser.loads(header, frames)
        out["t"].__arrow_c_schema__()
        ac.read(out["t"])
        gser.from_bytes(gser.to_bytes(t))
        del out
    del header, frames
    gc.collect()
    assert sys.getrefcount(t) == before
    assert t.released() == (400, 400)


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine holds freed memory: RSS is not meaningful")
def test_memory_stays_flat():
    cpu = sample(20_000)
    dev = sample(20_000, methods=("device",), device_type=ac.ARROW_DEVICE_CUDA if EMULATED else ac.ARROW_DEVICE_CPU)

    def cycle():
        for _ in range(5):
            for t in (cpu, dev):
                out = gser.loads(*gser.dumps([t]))
                caps = out[0].__arrow_c_device_array__()  # handed over, released with the capsules
                del caps
                out = gser.from_bytes(gser.to_bytes(t), device=EMULATED)
                out.__arrow_c_schema__()
                del out  # never handed over: released by the ArrowArray

    grown = rss_growth(cycle, 8)
    assert grown < 8 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 160 table round trips"


# ---- pyarrow, where it is installed ---------------------------------------------------------


def test_pyarrow_roundtrip():
    pa = pytest.importorskip("pyarrow")
    batch = pa.record_batch({"id": pa.array([1, None, 3], pa.int64()), "s": pa.array(["a", None, "ccc"])})
    out = gser.loads(*gser.dumps(batch))
    assert pa.record_batch(out).equals(batch)
