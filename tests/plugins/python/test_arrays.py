"""numpy arrays through the Dask family come back as Dask's own numpy
serializer gives them back: equal values, shape, dtype, strides and flags
(layout and writability), zero-copy where Dask is, and never with more bytes
than Dask sends for the same array (a broadcast array travels as its base)."""

import pytest

import gser

np = pytest.importorskip("numpy")
pytest.importorskip("distributed")
msgpack = pytest.importorskip("msgpack")

import gser.dask  # noqa: E402
from distributed.protocol import serialize as dask_serialize  # noqa: E402
from distributed.protocol.numpy import deserialize_numpy_ndarray, serialize_numpy_ndarray  # noqa: E402
from distributed.utils import nbytes  # noqa: E402

rng = np.random.default_rng(7)


def r(*shape):
    return rng.random(shape)


ARRAYS = {
    "ones": lambda: np.ones(5),
    "0d": lambda: np.array(5),
    "0d_datetime": lambda: np.array(7, dtype="M8[s]"),
    "c": lambda: r(5, 5),
    "rows": lambda: r(5, 5)[::2, :],
    "cols": lambda: r(5, 5)[:, ::2],
    "fortran": lambda: np.asfortranarray(r(5, 5)),
    "fortran_rows": lambda: np.asfortranarray(r(5, 5))[::2, :],
    "fortran_cols": lambda: np.asfortranarray(r(5, 5))[:, ::2],
    "fortran_3d": lambda: np.asfortranarray(r(4, 3, 2)),
    "transpose": lambda: r(6, 4).T,
    "reversed": lambda: np.arange(10.0)[::-1],
    "reversed_2d": lambda: r(4, 6)[::-1, ::-1],
    "window": lambda: np.arange(100)[10:20],
    "f4": lambda: r(5).astype("f4"),
    "big_endian": lambda: (np.arange(5) * 1000).astype(">i8"),
    "big_endian_fortran": lambda: np.asfortranarray(np.arange(12.0).reshape(3, 4).astype(">f8")),
    "M8_us": lambda: np.arange(5).astype("M8[us]"),
    "M8_ms": lambda: np.arange(5).astype("M8[ms]"),
    "m8": lambda: np.arange(5).astype("m8"),
    "m8_s": lambda: np.arange(5).astype("m8[s]"),
    "c16": lambda: np.arange(5).astype("c16"),
    "c8": lambda: np.arange(5).astype("c8"),
    "bool": lambda: np.array([True, False, True]),
    "structured": lambda: np.ones(shape=5, dtype=[("a", "i4"), ("b", "M8[us]")]),
    "S3": lambda: np.array(["abc", "de"], dtype="S3"),
    "U3": lambda: np.array(["abc", "dé"], dtype="U3"),
    "subarray_dtype": lambda: np.ones(shape=(5,), dtype=("f8", 32)),
    "subarray_field": lambda: np.ones(shape=(5,), dtype=[("x", "f8", 32)]),
    "unaligned_struct": lambda: np.ones(shape=(5,), dtype=np.dtype([("a", "i1"), ("b", "f8")], align=False)),
    "aligned_struct": lambda: np.ones(shape=(5,), dtype=np.dtype([("a", "i1"), ("b", "f8")], align=True)),
    "m8_us_field": lambda: np.ones(shape=(5,), dtype=np.dtype([("a", "m8[us]")], align=False)),
    "m8_field": lambda: np.ones(shape=(5,), dtype=np.dtype([("a", "m8")], align=False)),
    "struct_4f8": lambda: np.zeros(5000, dtype=[("x%d" % i, "<f8") for i in range(4)]),
    "S32": lambda: np.zeros(5000, dtype="S32"),
    "3d": lambda: np.zeros((1, 1000, 1000)),
    "step": lambda: np.arange(12)[::2],
    "struct_2d": lambda: np.ones(shape=(5, 6)).astype(dtype=[("total", "<f8"), ("n", "<f8")]),
    "struct_fortran": lambda: np.asfortranarray(np.ones((4, 3), dtype=[("a", "i2"), ("b", "f4")])),
    "longdouble": lambda: np.arange(4, dtype=np.longdouble),
    "empty": lambda: np.zeros((0, 3)),
    "empty_fortran": lambda: np.asfortranarray(np.zeros((3, 0, 2))),
    "broadcast_rows": lambda: np.broadcast_to(np.arange(3), shape=(10, 3)),
    "broadcast_rows_20": lambda: np.broadcast_to(np.arange(10), (20, 10)),
    "broadcast_scalar": lambda: np.broadcast_to(1, (3, 4, 2)),
    "broadcast_base_larger": lambda: np.broadcast_to(np.arange(100)[:1], 5),
    "broadcast_reversed": lambda: np.broadcast_to(np.arange(5), (4, 5))[:, ::-1],
    "broadcast_strided_block": lambda: np.broadcast_to(np.arange(30.0)[::3], (6, 10)),
    "broadcast_fortran_block": lambda: np.lib.stride_tricks.as_strided(
        np.asfortranarray(r(3, 4)), shape=(5, 3, 4), strides=(0, 8, 24)),
    "da_zeros_chunk": lambda: np.broadcast_to(np.zeros((), dtype="f8"), (1000, 1000)),
    "broadcast_datetime": lambda: np.broadcast_to(np.arange(3).astype("M8[s]"), (4, 3)),
}


def with_flag(make, writeable):
    x = make()
    if not writeable:
        x.setflags(write=False)
    assert x.flags.writeable == writeable
    return x


# Broadcast views are read-only in numpy: they come in one flavour.
FLAVOURS = [(name, w) for name in ARRAYS for w in (True, False) if not w or ARRAYS[name]().flags.writeable]


def dask_roundtrip(x, transport):
    header, frames = serialize_numpy_ndarray(x)
    return header, frames, deserialize_numpy_ndarray(header, [transport(f) for f in frames])


def gser_roundtrip(x, transport):
    header, frames = gser.dask.dumps(x)
    return header, frames, gser.dask.loads(header, [transport(f) for f in frames])


TRANSPORTS = {
    "in_process": lambda f: f,
    "writable_frames": lambda f: bytearray(memoryview(f).cast("B")),
    "read_only_frames": lambda f: bytes(memoryview(f).cast("B")),
}


@pytest.mark.parametrize("transport", list(TRANSPORTS))
@pytest.mark.parametrize("name,writeable", FLAVOURS, ids=[f"{n}-{'writable' if w else 'read_only'}" for n, w in FLAVOURS])
def test_arrays_come_back_as_dask_gives_them(name, writeable, transport):
    x = with_flag(ARRAYS[name], writeable)
    move = TRANSPORTS[transport]
    _, _, want = dask_roundtrip(x, move)
    _, frames, got = gser_roundtrip(x, move)
    assert type(got) is np.ndarray
    assert got.dtype == want.dtype == x.dtype and got.shape == want.shape == x.shape
    np.testing.assert_equal(got, x)
    assert got.strides == want.strides, (got.strides, want.strides)
    assert got.flags == want.flags, (got.flags, want.flags)
    # zero-copy exactly when Dask is: the result views the frames it was given
    if transport != "in_process" and len(frames) > 1:  # gser sent the data as a frame, not in its header
        received = [move(f) for f in frames]
        got = gser.dask.loads({"gser": 1}, received)
        _, dframes = serialize_numpy_ndarray(x)
        dreceived = [move(f) for f in dframes]
        want = deserialize_numpy_ndarray(serialize_numpy_ndarray(x)[0], dreceived)
        in_frames = any(np.shares_memory(got, np.frombuffer(f, np.uint8)) for f in received[1:])
        dask_in_frames = np.shares_memory(want, np.frombuffer(dreceived[0], np.uint8))
        assert in_frames == dask_in_frames


def wire_bytes(header, frames):
    return len(msgpack.packb(header, use_bin_type=True)) + sum(nbytes(f) for f in frames)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_never_more_bytes_than_dask(name):
    x = ARRAYS[name]()
    dh, df = dask_serialize(x, serializers=("dask",))  # Dask's numpy serializer, with Dask's header
    gh, gf = gser.dask.dumps(x)
    assert sum(nbytes(f) for f in gf[1:]) <= sum(nbytes(f) for f in df)  # data frames
    assert wire_bytes(gh, gf) <= wire_bytes(dh, df), (wire_bytes(gh, gf), wire_bytes(dh, df))


def test_broadcast_travels_as_its_base():
    x = ARRAYS["da_zeros_chunk"]()  # a chunk of da.zeros((1000, 1000))
    header, frames = gser.dask.dumps(x)
    assert x.nbytes == 8_000_000 and sum(nbytes(f) for f in frames) < 100  # was 8,000,038
    out = gser.dask.loads(header, frames)
    assert out.strides == (0, 0) and out.shape == x.shape and not out.flags.writeable
    # zero-copy at the sender too: a broadcast of a contiguous block is sent as that block
    base = np.arange(1000.0)
    x = np.broadcast_to(base, (500, 1000))
    header, frames = gser.dask.dumps(x)
    assert len(frames) == 2 and np.shares_memory(np.frombuffer(frames[1], np.float64), base)


def test_fortran_order_is_zero_copy_both_ways():
    x = np.asfortranarray(np.arange(60_000.0).reshape(200, 300))
    header, frames = gser.dask.dumps(x)
    assert np.shares_memory(np.frombuffer(frames[1], np.float64), x)
    received = [bytearray(f) for f in frames]
    out = gser.dask.loads(header, received)
    assert out.flags.f_contiguous and np.shares_memory(out, np.frombuffer(received[1], np.uint8))
    np.testing.assert_equal(out, x)


def test_plain_dumps_keeps_layouts_too():
    for name in ("fortran", "broadcast_rows", "reversed", "structured", "0d", "big_endian_fortran"):
        x = ARRAYS[name]()
        out = gser.loads(*gser.dumps(x))
        np.testing.assert_equal(out, x)
        assert out.dtype == x.dtype and out.shape == x.shape
    out = gser.from_bytes(gser.to_bytes({"f": ARRAYS["fortran"](), "b": ARRAYS["broadcast_rows"]()}))
    assert out["f"].flags.f_contiguous and out["b"].strides == (0, 8)


def test_hostile_described_dtypes_are_refused():
    header, frames = gser.dumps(np.zeros(4, dtype=[("a", "i4"), ("b", "f8")]))
    # a description that says Python objects: never read bytes as object pointers
    bad = header.replace(b"<i4", b"|O8") if b"|O8" not in header else header
    with pytest.raises(gser.GserError, match="Python objects|item size|dtype"):
        gser.loads(bad, frames)
    with pytest.raises(gser.GserError):
        gser.loads(header.replace(b"<f8", b"<f4"), frames)  # the item size no longer matches
    with pytest.raises(gser.GserError, match="bad dtype description"):
        gser.loads(header.replace(b"<f8", b"<q9"), frames)
