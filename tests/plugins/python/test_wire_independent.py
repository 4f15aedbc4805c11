"""gser against an msgpack implementation nobody here wrote.

wire_reference.py reads gser's format from docs/wire-format.md alone, on
Debian's python3-msgpack. What gser writes must read back through it as the
same values, and headers that python3-msgpack writes by the spec must load
in gser as the spec says.
"""

import datetime
import struct

import msgpack
import numpy as np
import pytest

import gser
import wire_reference as ref

# ---- gser writes, the reference reads ------------------------------------------


def plain(v):
    """The reference's decoding as the Python values gser.loads gives (the
    module's own object types as plugins/python/README.md describes them)."""
    if isinstance(v, ref.Object) and v.type == "python.bytes":
        return bytes(v.tree.data)
    if isinstance(v, ref.Object) and v.type == "numpy.ndarray":
        buf, descr = v.tree[0], v.tree[1]
        return buf.array if descr is None else buf.array.view(np.lib.format.descr_to_dtype(descr))
    if isinstance(v, ref.Object) and v.type == "python.tree":
        return untree(v.tree)
    if isinstance(v, ref.Uint):
        return v.value
    if isinstance(v, ref.Buffer):
        if v.dtype == 0 and (v.array is None or v.array.ndim == 1):
            return bytes(v.data)
        return v.array
    if isinstance(v, dict):
        return {plain(k): plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, tuple):
        return tuple(plain(x) for x in v)
    return v


def untree(v):
    """docs/wire-format.md 4.9, read from the spec: in a "python.tree", a
    tuple whose first item is a uint is a tag (the kinds these tests send:
    a user tuple, a big int, a set, a date, packed mixed scalars, records)."""
    if isinstance(v, tuple) and v and isinstance(v[0], ref.Uint):
        tag, f = v[0].value, v[1:]
        if tag == 0:
            return tuple(untree(x) for x in f)
        if tag == 1:
            return int.from_bytes(f[0], "little", signed=True)
        if tag == 3:
            return set(untree(f[0]))
        if tag == 7:
            return datetime.date(f[0] >> 9, f[0] >> 5 & 15, f[0] & 31)
        assert tag == 18, tag
        kind, container, cols = f[0].value, f[1], f[2:]
        if kind == 19:
            codes, ints, floats, lens, blob, others = cols
            ints, floats, lens, others = iter(ints), iter(floats), iter(lens), iter(others)
            out, at = [], 0
            for c in codes:
                if c == 5:
                    n = next(lens)
                    out.append(blob[at:at + n].decode())
                    at += n
                else:
                    out.append({0: None, 1: False, 2: True, 8: ...}.get(c) if c in (0, 1, 2, 8) else
                               next(ints) if c == 3 else next(ints) % 2**64 if c == 6 else
                               next(floats) if c == 4 else untree(next(others)))
        else:
            assert kind == 20, kind
            keys, columns = cols
            columns = [untree(c) for c in columns]
            out = [dict(zip(keys, row)) for row in zip(*columns)]
        return tuple(out) if container else out
    if isinstance(v, dict):
        return {untree(k): untree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [untree(x) for x in v]
    if isinstance(v, tuple):
        return tuple(untree(x) for x in v)
    return plain(v)


def same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, (bytes, bytearray, memoryview)) and isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


rng = np.random.default_rng(7)
CASES = {
    "scalars": [None, True, False, 0, -1, 127, -33, 2**31, -(2**63), 2**63 - 1, 1.5, -0.0, float("inf"), "", "é€"],
    "uint": {"big": 2**64 - 1, "just": 2**63},
    "nested": {"op": "compute-task", "key": ("x", 3), "deps": [("y", 1), ("z", 2)], "pri": (0, -3, 1.5),
               "meta": {"a": {"b": {"c": [None, [], {}, ()]}}}},
    "int_keys": {1: "one", -2: "minus two", 2.5: "float", b"k": "bytes", None: "nil", True: "bool"},
    "float_list": [0.5 * i for i in range(1000)],
    "int_tuple": tuple(range(-50, 50)),
    "bool_list": [i % 3 == 0 for i in range(64)],
    "mixed_list": [1, "two", 3.0, None, [4], (5,)] * 2,
    # a "python.tree" (section 4.9): packed scalars and others, records, a set, a date, a big int, a tuple tag
    "mixed_list_packed": [1, "two", 3.0, None, [4], (5,), True, 2**64 - 1, ..., "é"] * 10,
    "python_tree": {"big": -(2**70), "set": {1, 2}, "date": datetime.date(2024, 2, 29), "uint_tuple": (2**63, 1),
                    "records": [{"a": i, "b": f"s{i}"} for i in range(20)]},
    "bytes": [b"", b"x" * 10, bytes(range(256)) * 1000],
    "arrays": [np.arange(24, dtype=np.int32).reshape(2, 3, 4), rng.random((5, 7)),
               np.array([1 + 2j, 3 - 4j], dtype=np.complex128), np.zeros(0, dtype=np.float32),
               np.array([True, False]), np.arange(10, dtype=np.uint16)],
    "layouts": [np.asfortranarray(rng.random((6, 5))), np.arange(20)[::-3], rng.random((8, 9))[1:7:2, ::-2],
                np.broadcast_to(np.arange(4.0), (1000, 4))],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_what_gser_writes_reads_back_through_an_independent_msgpack_decoder(name):
    obj = CASES[name]
    header, frames = gser.dumps(obj)
    version, got = ref.read(header, frames)
    assert version == 2  # no compressed frame: the version-2 wire (gser.WIRE_VERSION is 3)
    assert same(plain(got), obj), (plain(got), obj)


COMPRESSIBLE = {
    "keys": np.repeat(np.arange(20000, dtype=np.int64), 4),
    "codes": np.tile(np.arange(7, dtype=np.int8), 30000),
    "runs": np.repeat(rng.random(500), 200),
    "noise": rng.random(5000),  # stays as it is: it does not shrink
    "small": b"abc" * 10,
}


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_frames_read_back_by_the_spec(codec):
    """Version 3: the 5-field table entries, decompressed with python3-lz4
    (one LZ4 block) and python3-zstandard (one Zstandard frame)."""
    pytest.importorskip("lz4.block" if codec == "lz4" else "zstandard")
    header, frames = gser.dumps(COMPRESSIBLE, compression=codec)
    top = msgpack.unpackb(bytes(header), raw=False, strict_map_key=False)
    entries = [e for e in top[3] if len(e) == 5]
    assert entries and all(e[3] == (1 if codec == "lz4" else 2) for e in entries)
    version, got = ref.read(header, frames)
    assert version == 3
    assert same(plain(got), COMPRESSIBLE)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_frames_in_chunks_read_back_by_the_spec(codec):
    """Codecs 3 and 4: a block whose first row does not compress and whose
    second does, in chunks of 64 KiB, read by the reference reader."""
    pytest.importorskip("lz4.block" if codec == "lz4" else "zstandard")
    block = np.stack([rng.random(1 << 16), np.repeat(rng.random(64), 1 << 10)])
    header, frames = gser.dumps({"b": block}, compression=codec, compression_chunk_size=1 << 16)
    top = msgpack.unpackb(bytes(header), raw=False, strict_map_key=False)
    assert [e[3] for e in top[3] if len(e) == 5] == [3 if codec == "lz4" else 4]
    version, got = ref.read(header, frames)
    assert version == 3
    assert same(plain(got), {"b": block})


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_the_reference_reader_refuses_what_gser_refuses(codec):
    """A compressed frame cut short, or whose declared size lies, is refused
    by both readers."""
    pytest.importorskip("lz4.block" if codec == "lz4" else "zstandard")
    header, frames = gser.dumps({"k": COMPRESSIBLE["keys"]}, compression=codec)
    top = msgpack.unpackb(bytes(header), raw=False, strict_map_key=False)
    i = next(i for i, e in enumerate(top[3]) if len(e) == 5)
    frames = [bytes(memoryview(f).cast("B")) for f in frames]
    lying = [list(e) for e in top[3]]
    lying[i][4] += 1
    bad_header = msgpack.packb([top[0], top[1], top[2], lying], use_bin_type=True)
    with pytest.raises(ref.WireError):
        ref.read(bad_header, frames)
    with pytest.raises(gser.GserError):
        gser.loads(bad_header, frames)
    cut = list(frames)
    cut[i] = cut[i][: len(cut[i]) // 2]
    short = [list(e) for e in top[3]]
    short[i][0] = len(cut[i])
    cut_header = msgpack.packb([top[0], top[1], top[2], short], use_bin_type=True)
    with pytest.raises(ref.WireError):
        ref.read(cut_header, cut)
    with pytest.raises(gser.GserError):
        gser.loads(cut_header, cut)


def test_strided_layouts_travel_as_their_span_by_the_spec():
    b = np.broadcast_to(np.arange(4.0), (1000, 4))
    header, frames = gser.dumps(b)
    _, got = ref.read(header, frames)
    if isinstance(got, ref.Object):  # read-only: the module's "numpy.ndarray" around the buffer
        got = got.tree[0]
    assert isinstance(got, ref.Buffer) and len(got.data) <= b.base.nbytes, \
        "a broadcast array travels as the memory it spans"
    assert got.array.strides == (0, 8)


def test_the_flattened_form_follows_the_spec():
    obj = {"a": np.arange(100.0), "b": "x", "c": [1.5] * 100}
    blob = gser.to_bytes(obj)
    assert blob[:8] == b"\x89GSER\r\n\x1a"
    version, flags, n = struct.unpack_from("<HHI", blob, 8)
    assert (version, flags) == (1, 0) and n >= 1
    sizes = struct.unpack_from(f"<{n}Q", blob, 16)
    off, frames = 16 + 8 * n, []
    for size in sizes:
        assert off % 8 == 0
        frames.append(blob[off:off + size])
        pad = -size % 8
        assert blob[off + size:off + size + pad] == b"\0" * pad
        off += size + pad
    assert off == len(blob)
    _, got = ref.read(frames[0], frames[1:])
    assert same(plain(got), obj)


# ---- python3-msgpack writes by the spec, gser reads ------------------------------

EXT0 = lambda code: msgpack.ExtType(code, b"")  # noqa: E731  an empty marker ext


def header(root, table=(), version=2):
    return msgpack.packb([msgpack.ExtType(1, b"GSER"), version, root, list(table)], use_bin_type=True)


def test_headers_written_by_another_msgpack_library_load_as_the_spec_says():
    floats = np.arange(6.0)
    fortran = np.asfortranarray(np.arange(12, dtype="<i4").reshape(3, 4))
    span = fortran.T.copy().tobytes()  # Fortran order: the column-major bytes
    root = {
        "t": [EXT0(2), 1, "a"],
        "u": msgpack.ExtType(3, (2**64 - 2).to_bytes(8, "little")),
        "arr": [EXT0(5), 1, 4, 6, floats.tobytes()],
        "buf": [EXT0(4), 13, [2, 3], [0, 0, 48], 0],
        "f": [EXT0(4), 4, [3, 4], span, 0, [4, 12]],
        "rev": [EXT0(4), 5, [3], np.arange(3, dtype="<i8").tobytes(), 0, [-8]],
    }
    hdr = header(root, [[48, 0, 0]])
    got = gser.loads(hdr, [floats.reshape(2, 3).tobytes()])
    assert got["t"] == (1, "a")
    assert got["u"] == 2**64 - 2
    assert got["arr"] == tuple(floats.tolist())
    assert np.array_equal(got["buf"], floats.reshape(2, 3))
    assert got["f"].shape == (3, 4) and np.array_equal(got["f"], fortran)
    assert np.array_equal(got["rev"], [2, 1, 0])

    # Version 1 (no strides) still reads.
    assert gser.loads(header({"x": [EXT0(2)]}, version=1), []) == {"x": ()}


@pytest.mark.parametrize("root,why", [
    ([EXT0(7), 1], "reserved marker"),
    ([EXT0(4), 99, None, b"", 0], "unknown dtype"),
    ([EXT0(4), 13, [2], b"\0" * 8, 0], "data shorter than the shape"),
    ([EXT0(4), 13, [2], b"\0" * 16, 0, [8, 8]], "strides of another ndim"),
    ([EXT0(4), 13, None, b"\0" * 8, 0, [8]], "strides without a shape"),
    ([EXT0(4), 13, [3], b"\0" * 8, 0, [2**62]], "a span past 2**63"),
    ([EXT0(5), 0, 1, 2, b"\x00\x02"], "a bool other than 0 or 1"),
    (msgpack.Timestamp(1, 0), "a timestamp (ext -1)"),
    ({(1, 2): 3}, "an array as a map key"),
])
def test_spec_violations_written_by_another_library_are_refused(root, why):
    with pytest.raises(gser.GserError):
        gser.loads(header(root), [])
