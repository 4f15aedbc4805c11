"""Untrusted input never crashes: bad headers, truncated and corrupted frames
and flattened messages raise exceptions. Reference counts and memory stay
flat over many round trips. Threads may share the module."""

import datetime as dt
import decimal
import fractions
import gc
import os
import uuid
import random
import sys
import threading

import pytest

import gser
from memory import rss_growth

np = pytest.importorskip("numpy")
msgpack = pytest.importorskip("msgpack")

SANITIZED = bool(os.environ.get("GSER_PY_SANITIZED"))


def sample():
    return {
        "name": "sample",
        "ints": list(range(40)),
        "floats": (0.5,) * 20,
        "mixed": [1, "two", 3.0, None, True, b"six", [7, (8,)]],
        "big": 2**64 - 1,
        "array": np.arange(300, dtype=np.float64).reshape(30, 10),
        "small": np.arange(6, dtype=np.int32),
        "bytes": bytearray(range(256)) * 2,
        "nested": {"a": {"b": {"c": [{"d": 1}]}}},
        # Python's standard types: a "python.tree" object, its tagged tuples
        # and packed columns under the same corruption as the rest
        "std": [{(1, "k"): {2**70, -3}}, dt.datetime(2020, 1, 2, 3, tzinfo=dt.timezone.utc), dt.date(2021, 5, 6),
                decimal.Decimal("-1.25E+7"), uuid.UUID(int=2**127 + 5), fractions.Fraction(-3, 8), range(1, 9, 2),
                slice(1, None), ..., 2 + 3j, frozenset({"x"}), dt.timedelta(days=-2, microseconds=3)],
        "packed": [[dt.datetime(2020, 1, 1, i) for i in range(20)], [(1.5, i, f"s{i}", None)[i % 4] for i in range(20)],
                   [{"a": i, "b": f"v{i}"} for i in range(20)], [("k", i) for i in range(20)]],
    }


# What a malformed message may raise: GserError, always. What the core
# accepts but Python cannot hold (a corrupted dtype that became bfloat16, a
# typed object of an unknown type) is its subclass GserUnsupported.
EXPECTED = gser.GserError


def test_bad_headers():
    header, frames = gser.dumps(sample())
    for bad in [b"", b"\x94", b"GSER", b"\x00" * 64, os.urandom(100), header[:7], header + b"\x00", b"\xc1" * 10]:
        with pytest.raises(gser.GserError):
            gser.loads(bad, frames)


def test_empty_input():
    # Nothing at all, in each form the decoders take: a specific error (and,
    # under the sanitizers, no null pointer passed on to the C library).
    for empty in (b"", bytearray(), memoryview(b""), memoryview(bytearray(8))[8:]):
        with pytest.raises(gser.GserError, match="GSER_ERR_BAD_MAGIC"):
            gser.from_bytes(empty)
        with pytest.raises(gser.GserError, match="GSER_ERR_TRUNCATED"):
            gser.loads(empty, [])
        with pytest.raises(gser.GserError):
            gser.loads(empty, [empty])


def test_header_truncated_at_every_length():
    header, frames = gser.dumps(sample())
    for n in range(len(header)):
        with pytest.raises(gser.GserError) as e:
            gser.loads(header[:n], frames)
        assert e.value.status_name in ("GSER_ERR_BAD_MAGIC", "GSER_ERR_TRUNCATED", "GSER_ERR_FORMAT"), (n, e.value)


def test_frames_missing_extra_or_truncated():
    header, frames = gser.dumps(sample())
    assert len(frames) >= 2
    with pytest.raises(gser.GserError, match="GSER_ERR_FRAME"):
        gser.loads(header, frames[:-1])
    with pytest.raises(gser.GserError, match="GSER_ERR_FRAME"):
        gser.loads(header, frames + [b"extra"])
    for i, f in enumerate(frames):
        for cut in sorted({0, 1, len(f) // 2, len(f) - 1}):
            bad = list(frames)
            bad[i] = bytes(f)[:cut]
            with pytest.raises(gser.GserError, match="GSER_ERR_FRAME"):
                gser.loads(header, bad)
        bad = list(frames)
        bad[i] = bytes(f) + b"\x00"
        with pytest.raises(gser.GserError, match="GSER_ERR_FRAME"):
            gser.loads(header, bad)


def test_flat_truncated_at_every_length():
    b = gser.to_bytes(sample())
    assert gser.from_bytes(b)["name"] == "sample"
    for n in range(len(b)):
        with pytest.raises(gser.GserError):
            gser.from_bytes(b[:n])
    with pytest.raises(gser.GserError):
        gser.from_bytes(b + b"\x00" * 8)


def test_corrupted_header_bytes():
    header, frames = gser.dumps(sample())
    rng = random.Random(1234)
    for i in range(len(header)):
        for v in {0x00, 0xFF, header[i] ^ 0x01, header[i] ^ 0x80, rng.randrange(256)}:
            bad = bytearray(header)
            bad[i] = v
            try:
                gser.loads(bytes(bad), frames)
            except EXPECTED:
                pass


def test_every_byte_value_of_an_array_header_is_a_gser_error():
    # Every value at every byte of a message holding an array: what fails is
    # a GserError; the dtype byte reaches dtypes numpy cannot express.
    header, frames = gser.dumps({"a": np.arange(4, dtype=np.float16)})  # bfloat16 is as wide
    unsupported = []
    for i in range(len(header)):
        for v in range(256):
            bad = bytearray(header)
            bad[i] = v
            try:
                gser.loads(bytes(bad), frames)
            except gser.GserError as e:
                if isinstance(e, getattr(gser, "GserUnsupported", ())):
                    unsupported.append(e)
            except BaseException as e:  # noqa: B036 - anything else is the defect
                pytest.fail(f"byte {i} = {v:#x}: {type(e).__name__}: {e}")
    assert unsupported, "no byte value reached a dtype Python cannot hold"
    e = unsupported[0]
    assert isinstance(e, NotImplementedError) and isinstance(e, ValueError)
    assert e.status_name == "GSER_ERR_UNSUPPORTED" and "$.a" in str(e), e
    assert any("bfloat16" in str(e) for e in unsupported)


def test_corrupted_flat_bytes():
    b = gser.to_bytes(sample())
    rng = random.Random(99)
    for _ in range(3000):
        bad = bytearray(b)
        for _ in range(rng.randrange(1, 4)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            gser.from_bytes(bytes(bad))
        except EXPECTED:
            pass


def test_random_garbage():
    rng = random.Random(7)
    for n in range(0, 300):
        junk = bytes(rng.randrange(256) for _ in range(n))
        for data in (junk, b"\x94\xd6\x01GSER" + junk, b"\x89GSER\r\n\x1a" + junk):
            try:
                gser.from_bytes(data)
            except EXPECTED:
                pass
            try:
                gser.loads(data, [])
            except EXPECTED:
                pass


def ext(t, data=b""):
    return msgpack.ExtType(t, data)


def handmade(root, table=()):
    """A header written by hand: [magic, version, root, frame table]."""
    return msgpack.packb([ext(1, b"GSER"), 1, root, list(table)], use_bin_type=True)


def test_decoding_cost_is_bounded_by_the_message_size():
    # 100,000 references to one 1-byte frame, a dozen header bytes each: the
    # arrays they become would cost ~70 times the message. Past max_expansion
    # (64) times its size a specific GserError stops the decoding.
    ref = [ext(4), 6, [1], [0, 0, 1], 0]
    header = msgpack.packb([ext(1, b"GSER"), 2, [ref] * 100_000, [[1, 0, 0]]])
    with pytest.raises(gser.GserError) as e:
        gser.loads(header, [b"\x07"])
    assert e.value.status_name == "GSER_ERR_LIMIT_BYTES" and "max_expansion" in str(e.value), str(e.value)
    assert "$[" in str(e.value), "the error names where decoding stopped"
    # What costs no more than its bytes decodes, however long: a million Nones.
    nones = msgpack.packb([ext(1, b"GSER"), 2, [None] * 1_000_000, []])
    assert gser.loads(nones, []) == [None] * 1_000_000
    # And what gser itself writes for many small arrays.
    many = [np.arange(3, dtype=np.int16)] * 20_000
    back = gser.from_bytes(gser.to_bytes(many))
    assert len(back) == 20_000 and np.array_equal(back[-1], many[-1])


def test_core_errors_name_the_path():
    # a buffer marker with an unknown dtype, two levels down
    h = handmade({"tasks": [0, {"payload": [ext(4), 99, None, b""]}]})
    with pytest.raises(gser.GserError) as e:
        gser.loads(h, [])
    assert e.value.status_name == "GSER_ERR_FORMAT"
    assert "$.tasks[1].payload" in str(e.value), str(e.value)
    # a frame reference past the frames given
    h = handmade([1, [ext(4), 13, [2], [0, 0, 16]]], table=[[8, 0, 0]])
    with pytest.raises(gser.GserError) as e:
        gser.loads(h, [b"\x00" * 8])
    assert "$[1]" in str(e.value) and e.value.status_name in ("GSER_ERR_FORMAT", "GSER_ERR_FRAME"), str(e.value)
    # a typed object nobody registered
    h = handmade({"x": [ext(6), "myapp.blob", "host", 1, 0, 0, msgpack.packb(None)]})
    with pytest.raises(gser.GserError) as e:
        gser.loads(h, [])
    assert e.value.status_name == "GSER_ERR_UNKNOWN_TYPE" and "$.x" in str(e.value)
    # a str that is not UTF-8
    raw = handmade({"k": "\u00e9"}).replace("\u00e9".encode(), b"\xff\xfe")
    with pytest.raises(gser.GserError, match=r"\$\.k: a str that is not valid UTF-8"):
        gser.loads(raw, [])


# ---- hostile input found by hand --------------------------------------------------------------


@pytest.mark.parametrize("origin", [0, 1], ids=["host", "device"])
def test_shape_numpy_cannot_hold_is_a_gser_error(origin):
    # valid for gser (no bytes), but no array can have this shape: the extents'
    # product overflows (it used to overflow a signed multiplication, and
    # release builds raised numpy's ValueError)
    for shape in ([0, 2**63 - 1], [0, 2**40, 2**40], [0, 2**61]):
        h = handmade({"a": [0, {"b": [ext(4), 13, shape, b"", origin]}]})
        with pytest.raises(gser.GserError) as e:
            gser.loads(h, [])
        assert e.value.status_name == "GSER_ERR_UNSUPPORTED" and "$.a[1].b" in str(e.value), str(e.value)
    # the largest shapes that fit still load
    out = gser.loads(handmade([[ext(4), 13, [0, 2**59], b"", origin]]), [])[0]
    assert out.shape == (0, 2**59)


def test_names_that_are_not_utf8_are_gser_errors_with_the_path():
    bad = b"\xff\xfeblob"
    for where in ("type", "family"):
        fields = {"type": "myapp.blob", "family": "host"}
        h = handmade({"x": [ext(6), fields["type"], fields["family"], 1, 0, 0, msgpack.packb(None)]})
        h = h.replace(fields[where].encode(), bad[: len(fields[where])].ljust(len(fields[where]), b"z"))
        with pytest.raises(gser.GserError) as e:
            gser.loads(h, [])
        assert "$.x" in str(e.value), str(e.value)
        assert where == "family" or "\\xff\\xfeblob" in str(e.value), str(e.value)  # the type is named


@pytest.mark.skipif(not gser.HAVE_ARROW, reason="built without gser::arrow")
def test_arrow_format_that_is_not_utf8_is_a_gser_error():
    from arrow_ctypes import Table

    header, frames = gser.dumps({"t": Table({"id": ("l", [1, 2, 3])}, methods=("array",))})
    assert header.count(b"\xa1l") == 1  # the column's format, a one-character str
    with pytest.raises(gser.GserError) as e:
        gser.loads(header.replace(b"\xa1l", b"\xa1\xff"), frames)
    assert "$.t" in str(e.value) and "\\xff" in str(e.value), str(e.value)


def test_frames_list_changed_while_loading():
    # reading a frame runs Python code (a __cuda_array_interface__ property);
    # here it empties the caller's list, which loads used to keep reading
    header, frames = gser.dumps([np.arange(100.0), np.arange(200.0)])
    received = [None, bytes(frames[1])]

    class Clearing:
        def __init__(self, b):
            self.a = np.frombuffer(bytearray(b), dtype=np.uint8)

        @property
        def __cuda_array_interface__(self):
            received.clear()
            return {"shape": self.a.shape, "typestr": "|u1", "data": (self.a.ctypes.data, False), "version": 3}

    received[0] = Clearing(frames[0])
    keep = received[0]
    out = gser.loads(header, received)
    assert received == [] and np.array_equal(out[1], np.arange(200.0))
    assert np.array_equal(out[0].copy_to_host(), np.arange(100.0)) and keep


def test_no_reads_of_arbitrary_device_addresses():
    # device memory is read only through gser's own objects, whose ranges gser knows
    assert not hasattr(gser._gser, "_device_read")
    out = gser.loads(*gser.dumps(np.arange(4.0)), device=False)
    assert not hasattr(out, "copy_to_host")


def test_many_buffer_references_share_one_exporter():
    # References into one frame, 11.5 bytes of header each: every array views
    # one exporter of that frame (one Python object per frame, not one per
    # buffer: a million of them used to take 41.6 s and 1.2 GB; now such a
    # message is past max_expansion, test_decoding_cost_is_bounded_by_the_message_size)
    n = 1 << 13
    h = handmade([[ext(4), 13, None, [0, 8 * (i % 32), 8], 0] for i in range(n)], table=[[256, 0, 0]])
    frame = np.arange(32, dtype=np.float64).tobytes()
    out = gser.loads(h, [frame])
    assert len(out) == n and out[n - 1][0] == (n - 1) % 32
    assert len({id(a.base) for a in out}) == 1 and out[0].base is not frame
    del out
    out = gser.from_bytes(gser.to_bytes([np.arange(40.0)] * 1000))
    assert len({id(a.base) for a in out}) == 1000  # one frame each


class CudaBytes:
    """Host bytes presented as a device frame through __cuda_array_interface__."""

    def __init__(self, b):
        self.a = np.frombuffer(bytearray(b), dtype=np.uint8)
        self.__cuda_array_interface__ = {"shape": self.a.shape, "typestr": "|u1",
                                         "data": (self.a.ctypes.data, False), "version": 3}


def test_frames_arriving_in_device_memory():
    a = np.arange(100, dtype=np.float64)
    header, frames = gser.dumps([a])
    frame = CudaBytes(frames[0])
    out = gser.loads(header, [frame])  # a host buffer that arrived in device memory stays there
    assert isinstance(out[0], gser.DeviceArray) and out[0].ptr == frame.a.ctypes.data
    assert np.array_equal(out[0].copy_to_host(), a)
    # a list converted to an array must be in host memory: the core refuses it
    header, frames = gser.dumps([0.5] * 100)
    with pytest.raises(gser.GserError, match="GSER_ERR_FRAME"):
        gser.loads(header, [CudaBytes(frames[0])])
    with pytest.raises(TypeError, match="header"):
        gser.loads(CudaBytes(header), frames)


# ---- reference counts and memory --------------------------------------------------------------


def test_refcounts_do_not_leak():
    a = np.arange(10_000, dtype=np.float64)
    s = "a string" * 100
    b = b"bytes" * 100
    floats = [1.5] * 1000
    obj = {"a": a, "s": s, "b": b, "f": floats, "t": (a, [s, b])}
    gc.collect()
    before = [sys.getrefcount(x) for x in (a, s, b, floats, obj)]
    for _ in range(300):
        header, frames = gser.dumps(obj)
        out = gser.loads(header, frames)
        assert out["s"] == s
        out2 = gser.from_bytes(gser.to_bytes(obj))
        assert out2["b"] == b
        try:
            gser.dumps([obj, {1, 2}])
        except NotImplementedError:
            pass
        try:
            gser.loads(header[:-3], frames)
        except gser.GserError:
            pass
    del header, frames, out, out2
    gc.collect()
    after = [sys.getrefcount(x) for x in (a, s, b, floats, obj)]
    assert after == before


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine holds freed memory: RSS is not meaningful")
def test_memory_stays_flat():
    obj = {
        "floats": [0.25] * 200_000,
        "ints": list(range(50_000)),
        "mixed": [1, "x", 2.5, None] * 10_000,
        "array": np.ones((256, 256)),
        "strided": np.ones((512, 512))[::2, ::2],
        "nested": [{"k": i, "v": (i, str(i))} for i in range(2000)],
    }

    def cycle():
        for _ in range(10):
            header, frames = gser.dumps(obj)
            out = gser.loads(header, [bytearray(f) for f in frames])
            assert len(out["floats"]) == 200_000
            out = gser.from_bytes(gser.to_bytes(obj))
            assert out["array"].shape == (256, 256)
            try:
                gser.loads(header, frames[:-1])
            except gser.GserError:
                pass

    grown = rss_growth(cycle, 10)
    # one message is ~5 MB; 100 more round trips must not add up
    assert grown < 8 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB over 100 round trips"


# ---- threads -------------------------------------------------------------------------------------


def test_threads_share_the_module():
    errors = []

    def work(seed):
        try:
            rng = random.Random(seed)
            for _ in range(100):
                obj = {"id": seed, "v": [rng.random() for _ in range(rng.randrange(1, 5000))],
                       "a": np.full(rng.randrange(1, 3000), seed, dtype=np.int64)}
                out = gser.loads(*gser.dumps(obj))
                assert out["id"] == seed and out["v"] == obj["v"] and np.array_equal(out["a"], obj["a"])
                try:
                    gser.loads(b"\x94\xd6\x01GSER\x02", [])
                except gser.GserError as e:
                    assert e.status_name in ("GSER_ERR_TRUNCATED", "GSER_ERR_WIRE_VERSION", "GSER_ERR_FORMAT")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---- Python's standard types ("python.tree") -----------------------------------------------------


def test_standard_types_mutated_are_gser_errors():
    # The fuzz seeds of the "python.tree" object (tests/fuzz/corpus), and
    # the sample's standard types: every byte changed at random, a few at a
    # time, gives a value or GserError, never another exception.
    corpus = os.path.join(os.path.dirname(__file__), "..", "..", "fuzz", "corpus")
    seeds = [open(os.path.join(corpus, f), "rb").read() for f in sorted(os.listdir(corpus))
             if f.startswith("python-tree-")]
    assert len(seeds) == 5
    seeds.append(bytes(gser.to_bytes({"std": sample()["std"], "packed": sample()["packed"]})))
    rng = random.Random(39)
    for seed in seeds:
        for _ in range(1000 if not SANITIZED else 200):
            m = bytearray(seed)
            for _ in range(rng.choice((1, 1, 2, 3))):
                m[rng.randrange(len(m))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0xC0, 0xC3, 0x90, 0xA1, rng.randrange(256)))
            try:
                gser.from_bytes(bytes(m))
            except gser.GserError:
                pass


def test_standard_types_hostile_fields():
    # A few by hand (test_stdtypes.py has the full list): each a GserError
    # naming the path, nothing else.
    def u(n):
        return ext(3, n.to_bytes(8, "little"))

    def tree(root):
        return {"v": [ext(6), "python.tree", "host", 1, 0, 0, msgpack.packb(root, use_bin_type=True)]}

    for root in ([ext(2), u(6), -1, None],                    # a datetime out of range
                 [ext(2), u(3), [[1], [2]]],                  # unhashable set items
                 [ext(2), u(11), "../../etc/passwd"],        # a ZoneInfo key that is a path
                 [ext(2), u(12), "NaN(1)"],                   # a Decimal str Decimal refuses
                 [ext(2), u(18), u(19), False, b"\x05", [], [], [99], b"x", []]):  # a str past its bytes
        with pytest.raises(gser.GserError) as e:
            gser.loads(handmade(tree(root)), [])
        # the module reads the tree (an older one says GSER_ERR_UNSUPPORTED)
        assert "$.v" in str(e.value) and e.value.status_name == "GSER_ERR_FORMAT", str(e.value)


def test_dask_family_loads_mutated_are_gser_errors():
    # The Dask family's one-call loads (_gser._dask_loads): mutated headers
    # of a message with standard types and packed lists give a value or
    # GserError, never another exception.
    gd = pytest.importorskip("gser.dask")
    header, frames = gd.dumps({"std": sample()["std"], "packed": sample()["packed"]})
    head = bytes(frames[0])
    rng = random.Random(3939)
    for _ in range(600 if not SANITIZED else 150):
        m = bytearray(head)
        for _ in range(rng.choice((1, 2, 3))):
            m[rng.randrange(len(m))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0xC0, 0xC3, 0x90, rng.randrange(256)))
        try:
            gd.loads(header, [bytes(m), *frames[1:]])
        except gser.GserError:
            pass


def test_dask_msg_seed_mutated_are_gser_errors():
    # The fuzz seed of a "dask.msg" holding a "python.tree" (with a set, a
    # datetime, tuple keys, a narrow int array and a "dask.part"): read by
    # anything but a Dask comm it is refused, naming the type; mutated, it
    # gives a value or GserError, never another exception.
    corpus = os.path.join(os.path.dirname(__file__), "..", "..", "fuzz", "corpus")
    seed = open(os.path.join(corpus, "dask-msg-python-tree.gser"), "rb").read()
    with pytest.raises(gser.GserError, match='"dask.msg" object: a Dask message, to a receiver that is not a Dask comm'):
        gser.from_bytes(seed)
    # Its "python.tree" alone (the dask.msg marker cut off) reads up to the
    # "dask.part", which is refused outside a "dask.msg".
    head = seed[24:24 + int.from_bytes(seed[16:24], "little")]
    top = msgpack.unpackb(head, raw=False, strict_map_key=False, use_list=True)
    tree = msgpack.unpackb(top[2][6], raw=False, strict_map_key=False, use_list=True)
    inner = msgpack.unpackb(tree[6], raw=False, strict_map_key=False, use_list=True)
    with pytest.raises(gser.GserError, match="dask.part"):
        gser.loads(b"\x94\xd6\x01GSER\x02" + msgpack.packb(tree, use_bin_type=True) + b"\x90", [])
    del inner["data"]
    tree[6] = msgpack.packb(inner, use_bin_type=True)
    out = gser.loads(b"\x94\xd6\x01GSER\x02" + msgpack.packb(tree, use_bin_type=True) + b"\x90", [])
    assert out["s"] == {1, 2, 3} and out["keys"] == {("x", 0): 1, ("x", 1): 2} and out["key"] == ("inc", 1)
    assert out["ints"] == list(range(-20, 20)) and all(type(i) is int for i in out["ints"])
    rng = random.Random(3940)
    for _ in range(1000 if not SANITIZED else 200):
        m = bytearray(seed)
        for _ in range(rng.choice((1, 1, 2, 3))):
            m[24 + rng.randrange(len(m) - 24)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0xC0, 0xC3, 0x90, rng.randrange(256)))
        try:
            gser.from_bytes(bytes(m))
        except gser.GserError:
            pass
