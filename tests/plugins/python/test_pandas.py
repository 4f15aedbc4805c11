"""numpy scalars and pandas objects through gser and its Dask family, without
pickle: exact round trips of every dtype and index kind, zero-copy numeric
blocks, str columns as one offsets and one UTF-8 buffer, declines (so that
Dask's next family runs), malformed input, and a property test against
pickle."""

import datetime
import importlib
import pickle

import pytest

import gser

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")
tm = pytest.importorskip("pandas.testing")

import gser.dask  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning")


def family(x):
    """Through the Dask family, as Dask's serialize/deserialize call it."""
    header, frames = gser.dask.dumps(x)
    return gser.dask.loads(header, frames)


def plain(x):
    return gser.loads(*gser.dumps(x, strict=True))


ROUND_TRIPS = [family, plain]


# ---- numpy scalars ---------------------------------------------------------------------------

SCALARS = [
    np.float64(1.5), np.float64("nan"), np.float32(-0.25), np.float16(3.0), np.longdouble("1.1"),
    np.int8(-5), np.int16(300), np.int32(-70000), np.int64(-(2**63)), np.uint8(255), np.uint16(65535),
    np.uint32(2**32 - 1), np.uint64(2**64 - 1), np.bool_(True), np.bool_(False),
    np.complex64(1 + 2j), np.complex128(complex(-0.0, float("inf"))), np.clongdouble(3 - 1j),
    np.datetime64("2020-01-02T03:04:05.123456789", "ns"), np.datetime64("NaT", "ns"), np.datetime64("NaT"),
    np.datetime64("2020-01-02", "D"), np.timedelta64(5, "s"), np.timedelta64("NaT", "ms"),
    np.str_("héllo"), np.str_(""), np.bytes_(b"a\x00b"), np.void(b"\x01\x02\x03"),
    np.zeros(1, dtype=[("a", "<i4"), ("b", "<f8", (2,))])[0],
]


def same_scalar(a, b):
    assert type(a) is type(b)
    assert a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("x", SCALARS, ids=lambda x: f"{type(x).__name__}-{x.dtype.str}")
def test_numpy_scalars_come_back_exactly(rt, x):
    same_scalar(rt(x), x)


def test_numpy_scalars_inside_messages_keep_their_types():
    msg = {"op": "task-finished", "key": "sum-1", "result": np.float64(2.5), "n": np.int64(7),
           "flags": [np.bool_(True), 1, 2.0], "t": (np.datetime64("2020-01-01", "ns"),)}
    out = family(msg)
    assert out == msg
    for k in ("result", "n"):
        assert type(out[k]) is type(msg[k])
    assert type(out["flags"][0]) is np.bool_ and type(out["flags"][1]) is int
    assert type(out["t"][0]) is np.datetime64


def test_numpy_object_scalars_are_refused():
    x = np.zeros(1, dtype=[("o", object)])[0]
    with pytest.raises(NotImplementedError, match="objects"):
        gser.dask.dumps(x)


def test_numpy_scalar_with_bad_bytes_is_a_gser_error():
    header, frames = gser.dumps(np.float64(1.0))
    # the 8 value bytes follow a msgpack bin8 marker of length 8: make it 4
    i = bytes(header).rindex(b"\xc4\x08")
    bad = bytes(header[:i]) + b"\xc4\x04" + bytes(header[i + 2:i + 6])
    with pytest.raises(gser.GserError):
        gser.loads(bad, frames)


# ---- pandas round trips ---------------------------------------------------------------------


def check_frame(a, b):
    tm.assert_frame_equal(a, b, check_exact=True, check_freq=True, check_flags=True)
    assert type(b) is type(a)
    assert type(b.index) is type(a.index) and type(b.columns) is type(a.columns)
    assert b.attrs == a.attrs
    assert list(b.columns) == list(a.columns)
    # the same dtypes, down to a str dtype's storage and missing value
    assert [repr(d) for d in b.dtypes] == [repr(d) for d in a.dtypes]


def frame_of_everything(n=12):
    rng = np.random.default_rng(0)
    f = rng.random(n)
    f[::4] = np.nan
    ints = pd.array(rng.integers(-5, 5, n), dtype="Int64")
    ints[1::3] = pd.NA
    return pd.DataFrame({
        "i8": rng.integers(-100, 100, n).astype(np.int8),
        "i64": rng.integers(-(2**62), 2**62, n),
        "u32": rng.integers(0, 2**32, n).astype(np.uint32),
        "f32": rng.random(n).astype(np.float32),
        "f64": f,
        "c128": rng.random(n) + 1j * rng.random(n),
        "b": rng.random(n) < 0.5,
        "t": pd.date_range("2020-01-01", periods=n, freq="h"),
        "t_nat": pd.Series(pd.date_range("2020-01-01", periods=n, freq="D")).where(lambda s: s.dt.day % 3 != 0),
        "tz_utc": pd.date_range("2021-03-27", periods=n, freq="h", tz="UTC"),
        "tz_ny": pd.date_range("2021-03-13", periods=n, freq="h", tz="America/New_York"),
        "tz_fixed": pd.date_range("2021-01-01", periods=n, tz=datetime.timezone(datetime.timedelta(hours=-3))),
        "td": pd.to_timedelta(rng.integers(0, 10**12, n), unit="ns"),
        "cat": pd.Categorical(rng.choice(["x", "y", None], n), categories=["y", "x", "z"]),
        "cat_ord": pd.Categorical(rng.integers(0, 3, n), categories=[0, 1, 2], ordered=True),
        "Int64": ints,
        "UInt8": pd.array([1, None] * (n // 2), dtype="UInt8"),
        "Float64": pd.array([0.5, None, 1.5] * (n // 3), dtype="Float64"),
        "boolean": pd.array([True, None, False] * (n // 3), dtype="boolean"),
        "string": pd.array(["a", None, "ü€😀"] * (n // 3), dtype="string"),
        # object columns of str (pandas 3 would make them its str dtype)
        "str": pd.Series([f"s{i}" * (i % 4) for i in range(n)], dtype=object),
        "str_na": pd.Series(["x", None, float("nan"), "ÿ"] * (n // 4), dtype=object),
        **string_columns(n),
    })


def string_columns(n):
    """Every str dtype this pandas has: "string" (pd.NA) of python and
    pyarrow storage, pandas 3's default str (NaN) of both storages."""
    vals = ["a", None, "ü€😀"] * (n // 3)
    out = {"string_python": pd.array(vals, dtype=pd.StringDtype("python"))}
    try:
        out["str_python_nan"] = pd.array(vals, dtype=pd.StringDtype("python", na_value=np.nan))
    except TypeError:  # pandas < 2.3
        pass
    if HAVE_PYARROW:
        out["string_pyarrow"] = pd.array(vals, dtype=pd.StringDtype("pyarrow"))
        try:
            out["str_pyarrow_nan"] = pd.array(vals, dtype=pd.StringDtype("pyarrow", na_value=np.nan))
        except TypeError:
            pass
    return out


try:
    import pyarrow as pa
except ImportError:
    pa = None
HAVE_PYARROW = pa is not None


@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
def test_frame_of_every_column_kind(rt):
    df = frame_of_everything()
    out = rt(df)
    check_frame(df, out)
    # None and NaN keep their places in object columns
    col = out["str_na"].tolist()
    assert col[1] is None and isinstance(col[2], float) and col[2] != col[2]
    assert out["string"].isna().tolist() == df["string"].isna().tolist()


INDEXES = {
    "range": pd.RangeIndex(3, 30, 3, name="r"),
    "range_empty": pd.RangeIndex(0),
    "int": pd.Index([5, 1, 5, -2], name=("a", 1)),
    "uint": pd.Index(np.array([1, 2**63], dtype=np.uint64)),
    "float": pd.Index([0.5, np.nan, 2.0]),
    "bool": pd.Index([True, False, True]),
    "str": pd.Index(["a", "b", "ç"], name="s"),
    "mixed_labels": pd.Index(["a", 1, None, 2.5, b"x", True]),
    "datetime": pd.date_range("2020-01-01", periods=5, freq="D", name="when"),
    "datetime_tz": pd.DatetimeIndex(["2020-01-01", None, "2020-03-01"], tz="Europe/Paris"),
    "timedelta": pd.timedelta_range("1s", periods=4, freq="s"),
    "categorical": pd.CategoricalIndex(["b", "a", "b"], categories=["a", "b", "c"], ordered=True, name="c"),
    "multi": pd.MultiIndex.from_product([["x", "y"], [1, 2], pd.date_range("2020", periods=2, tz="UTC")],
                                        names=["l0", None, "l2"]),
    "nullable": pd.Index(pd.array([1, None, 3], dtype="Int64")),
}


@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", sorted(INDEXES))
def test_index_kinds(rt, kind):
    idx = INDEXES[kind]
    out = rt(idx)
    tm.assert_index_equal(out, idx, exact=True, check_exact=True)
    assert type(out) is type(idx) and out.names == idx.names
    if hasattr(idx, "freq"):
        assert out.freq == idx.freq
    n = len(idx)
    df = pd.DataFrame({"v": np.arange(n)}, index=idx)
    check_frame(df, family(df))
    s = pd.Series(np.arange(n, dtype=np.float32), index=idx, name="v")
    tm.assert_series_equal(family(s), s, check_exact=True)


@pytest.mark.parametrize("columns", [
    [0, 1, 2], [1.5, "a", None], ["a", "a", "b"], pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)]),
    pd.date_range("2020", periods=3, tz="UTC"), pd.CategoricalIndex(["x", "y", "z"]),
], ids=["int", "mixed", "duplicate", "multi", "datetime", "categorical"])
def test_column_names(columns):
    df = pd.DataFrame(np.arange(12).reshape(4, 3), columns=columns)
    df[("extra", 0) if isinstance(columns, pd.MultiIndex) else "extra"] = ["p", "q", "r", "s"]
    check_frame(df, family(df))


def test_series_of_every_kind_names_attrs_and_flags():
    df = frame_of_everything()
    for name in df.columns:
        s = df[name].rename((name, 1))
        s.attrs["source"] = {"col": name, "n": [1, 2.5]}
        out = family(s)
        tm.assert_series_equal(out, s, check_exact=True, check_flags=True)
        assert out.attrs == s.attrs and out.name == (name, 1)
    s = pd.Series([1, 2], index=["a", "b"]).set_flags(allows_duplicate_labels=False)
    assert family(s).flags.allows_duplicate_labels is False


def test_frame_attrs_flags_and_block_layout():
    df = pd.DataFrame(np.arange(20.0).reshape(5, 4), columns=list("abcd"))  # one F-ordered block
    df["e"] = np.arange(5)
    df.attrs = {"units": "m", "scale": 2.5, "tags": ["x", None]}
    df = df.set_flags(allows_duplicate_labels=False)
    out = family(df)
    check_frame(df, out)
    assert out.flags.allows_duplicate_labels is False
    assert [b.dtype for b in out._mgr.blocks] == [b.dtype for b in df._mgr.blocks]
    assert [b.mgr_locs.as_array.tolist() for b in out._mgr.blocks] == \
           [b.mgr_locs.as_array.tolist() for b in df._mgr.blocks]


def test_empty_frames_and_series():
    for df in (pd.DataFrame(), pd.DataFrame({"a": []}), pd.DataFrame({"s": pd.Series([], dtype=object)}),
               pd.DataFrame(index=pd.RangeIndex(3)), frame_of_everything().iloc[:0]):
        check_frame(df, family(df))
    s = pd.Series([], dtype="string")
    tm.assert_series_equal(family(s), s, check_exact=True)


def test_pandas_scalars_reductions_return():
    for x in (pd.Timestamp("2020-01-01 12:00:00.000000001"), pd.Timestamp("2020-06-01", tz="US/Eastern"),
              pd.Timestamp("2020-06-01", tz=datetime.timezone.utc), pd.Timedelta(123456789), pd.NaT, pd.NA):
        out = family(x)
        assert type(out) is type(x)
        assert out is x if x is pd.NaT or x is pd.NA else (out == x and getattr(out, "tz", None) == getattr(x, "tz", None))


# ---- zero copy and the layout of str columns ---------------------------------------------------


def addresses(frames):
    out = []
    for f in frames:
        m = memoryview(f)
        out.append((np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0] if m.nbytes else 0, m.nbytes))
    return out


def test_numeric_blocks_travel_zero_copy():
    n = 100_000
    df = pd.DataFrame({"a": np.arange(n, dtype=np.float64), "b": np.arange(n), "t": pd.date_range("2020", periods=n,
                                                                                                   freq="s")})
    header, frames = gser.dask.dumps(df)
    spans = addresses(frames)
    for b in df._mgr.blocks:
        v = b.values if isinstance(b.values, np.ndarray) else b.values._ndarray
        assert (v.__array_interface__["data"][0], v.nbytes) in spans, b
    out = gser.dask.loads(header, frames)
    check_frame(df, out)
    # and the received blocks are views of the frames, not copies
    for b in out._mgr.blocks:
        v = b.values if isinstance(b.values, np.ndarray) else b.values._ndarray
        assert (v.__array_interface__["data"][0], v.nbytes) in spans, b


def test_str_column_is_one_offsets_buffer_and_one_utf8_buffer():
    strs = [f"item-{i}-é" for i in range(50_000)]
    df = pd.DataFrame({"s": strs})
    header, frames = gser.dask.dumps(df)
    utf8 = "".join(strs).encode()
    big = [bytes(memoryview(f)) for f in frames if memoryview(f).nbytes >= len(strs)]
    assert len(big) == 2, [memoryview(f).nbytes for f in frames]
    assert utf8 in big
    offsets = np.cumsum([0] + [len(s.encode()) for s in strs]).astype(np.int64).tobytes()
    assert offsets in big
    check_frame(df, gser.dask.loads(header, frames))


# ---- declines ---------------------------------------------------------------------------------


class MyFrame(pd.DataFrame):
    pass


DECLINED = {
    "objects": pd.DataFrame({"o": [object(), object()]}),
    "mixed_object_column": pd.DataFrame({"o": ["a", 1]}),
    "tuple_labels": pd.Series([1, 2], index=pd.Index([(1, 2), (3, 4)], tupleize_cols=False)),
    "sparse": pd.DataFrame({"s": pd.arrays.SparseArray([0, 1, 0])}),
    "period": pd.DataFrame({"p": pd.period_range("2020", periods=3, freq="M")}),
    "period_index": pd.period_range("2020", periods=3, freq="M"),
    "interval": pd.Series(pd.interval_range(0, 3)),
    "interval_index": pd.interval_range(0, 3),
    "subclass": MyFrame({"a": [1]}),
    "attrs_object": pd.DataFrame({"a": [1]}).pipe(lambda d: d.attrs.update(o=object()) or d),
    "name_object": pd.Series([1], name=object()),
    "surrogate": pd.DataFrame({"s": ["\ud800"]}, dtype=object),
    "custom_tz": pd.Series(pd.date_range("2020", periods=2, tz=datetime.timezone(datetime.timedelta(hours=1),
                                                                                  "CET-ish"))),
}


def through_dasks_path(obj):
    """obj is declined by the family, and Dask's next family (pickle) carries it."""
    with pytest.raises(NotImplementedError):
        gser.dask.dumps(obj)
    ser = importlib.import_module("distributed.protocol.serialize")
    gser.dask.register()
    try:
        header, frames = ser.serialize(obj, serializers=["gser", "pickle"])
        assert header["serializer"] == "pickle"
        return ser.deserialize(header, frames)
    finally:
        gser.dask.unregister()


@pytest.mark.parametrize("kind", sorted(DECLINED))
def test_what_gser_cannot_carry_exactly_is_declined_to_dasks_next_family(kind):
    obj = DECLINED[kind]
    out = through_dasks_path(obj)
    if kind != "objects" and isinstance(obj, pd.DataFrame):
        tm.assert_frame_equal(out, obj)


# ---- pandas 2 and 3: str dtypes, pyarrow-backed columns, units, copy-on-write, unknown layouts ----

PANDAS_MAJOR = int(pd.__version__.split(".")[0])
needs_pyarrow = pytest.mark.skipif(not HAVE_PYARROW, reason="pyarrow is not installed (pandas' pyarrow-backed dtypes)")
needs_pandas2 = pytest.mark.skipif(PANDAS_MAJOR < 2, reason=f"pandas {pd.__version__}: datetimes only of ns")


@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("kind", sorted(string_columns(6)))
def test_str_dtypes_of_both_storages_keep_storage_and_missing_value(rt, kind):
    values = string_columns(6)[kind]
    s = pd.Series(values, name="s", index=pd.Index(values, name="i"))
    out = rt(s)
    tm.assert_series_equal(out, s, check_exact=True)
    assert repr(out.dtype) == repr(s.dtype) and repr(out.index.dtype) == repr(s.index.dtype)
    assert type(out.array) is type(s.array)
    assert out.isna().tolist() == s.isna().tolist()
    missing = out.array[1]
    assert missing is s.array[1] or (missing != missing and s.array[1] != s.array[1])
    df = pd.DataFrame({"a": values, "b": np.arange(6)}).astype({"a": values.dtype})
    check_frame(df, rt(df))
    for empty in (s.iloc[:0], pd.Series(pd.array([], dtype=values.dtype))):
        tm.assert_series_equal(rt(empty), empty, check_exact=True)


@needs_pyarrow
def test_pyarrow_str_column_travels_as_its_arrow_buffers():
    strs = [f"item-{i}-é" for i in range(50_000)]
    s = pd.Series(pd.array(strs, dtype=pd.StringDtype("pyarrow")))
    header, frames = gser.dask.dumps(s)
    spans = addresses(frames)
    chunk = s.array._pa_array.chunk(0)
    for b in chunk.buffers()[1:]:  # offsets and UTF-8 data, zero-copy
        assert (b.address, b.size) in spans
    out = gser.dask.loads(header, frames)
    tm.assert_series_equal(out, s, check_exact=True)
    assert out.array._pa_array.chunk(0).buffers()[2].address in [a for a, _ in spans]


def pyarrow_columns():
    n = 6
    chunked = pa.chunked_array([pa.array([1, None, 3], pa.int32()), pa.array([4, 5, None], pa.int32())])
    sliced = pa.array(np.arange(20, dtype=np.int64)).slice(7, n)
    return {
        "int64": pd.array([1, None, 3, 4, 5, 6], dtype="int64[pyarrow]"),
        "uint8": pd.array([1, 2, None, 4, 5, 255], dtype="uint8[pyarrow]"),
        "float32": pd.array([0.5, None, float("nan"), 1, 2, 3], dtype="float32[pyarrow]"),
        "bool": pd.array([True, None, False, True, True, False], dtype="bool[pyarrow]"),
        "string": pd.array(["a", None, "é", "", "x", "y"], dtype=pd.ArrowDtype(pa.string())),
        "large_string": pd.array(["a", None, "é", "", "x", "y"], dtype=pd.ArrowDtype(pa.large_string())),
        "binary": pd.array([b"a", None, b"\x00", b"", b"x", b"y"], dtype=pd.ArrowDtype(pa.binary())),
        "timestamp_tz": pd.array(pd.date_range("2020", periods=n, freq="h", tz="Europe/Paris"),
                                 dtype=pd.ArrowDtype(pa.timestamp("us", tz="Europe/Paris"))),
        "date32": pd.array([datetime.date(2020, 1, i + 1) for i in range(n)], dtype=pd.ArrowDtype(pa.date32())),
        "duration": pd.array([pd.Timedelta(i, "s") for i in range(n)], dtype=pd.ArrowDtype(pa.duration("ms"))),
        "decimal": pd.array([1, 2, None, 4, 5, 6], dtype=pd.ArrowDtype(pa.decimal128(10, 2))),
        "chunked": pd.arrays.ArrowExtensionArray(chunked),
        "sliced": pd.arrays.ArrowExtensionArray(pa.chunked_array([sliced])),
    }


@needs_pyarrow
@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
def test_pyarrow_backed_columns(rt):
    df = pd.DataFrame(pyarrow_columns())
    out = rt(df)
    check_frame(df, out)
    for name in df.columns:
        assert out[name].array._pa_array.type == df[name].array._pa_array.type, name
    s = df["timestamp_tz"].rename("t")
    tm.assert_series_equal(rt(s), s, check_exact=True)
    idx = pd.Index(df["large_string"])
    tm.assert_index_equal(rt(idx), idx, exact=True)


@needs_pyarrow
def test_a_slice_of_a_pyarrow_column_sends_only_its_items():
    big = pd.Series(pd.array([f"item-{i}" for i in range(100_000)], dtype=pd.StringDtype("pyarrow")))
    part = big.iloc[500:510]
    header, frames = gser.dask.dumps(part)
    assert sum(memoryview(f).nbytes for f in frames) < 4096
    tm.assert_series_equal(gser.dask.loads(header, frames), part, check_exact=True)


@needs_pyarrow
@pytest.mark.parametrize("kind", ["list", "struct", "dictionary"])
def test_nested_pyarrow_columns_are_declined_and_go_dasks_way(kind):
    arr = {"list": pa.array([[1, 2], None, []]), "struct": pa.array([{"a": 1}, None, {"a": 3}]),
           "dictionary": pa.array(["x", "y", "x"]).dictionary_encode()}[kind]
    df = pd.DataFrame({"c": pd.arrays.ArrowExtensionArray(arr), "n": np.arange(3)})
    tm.assert_frame_equal(through_dasks_path(df), df, check_exact=True)


@pytest.mark.parametrize("kind", ["datetime", "timedelta"])
def test_an_index_freq_is_read_where_either_pandas_sends_it(kind):
    """pandas <= 2 keeps an index's freq on its array, pandas 3 on the index:
    either message comes back with the freq, on every pandas."""
    from gser import _pandas

    idx = pd.date_range("2020", periods=3, freq="D") if kind == "datetime" else \
        pd.timedelta_range("1s", periods=3, freq="s")
    idx = idx.as_unit("ns") if hasattr(idx, "as_unit") else idx
    values = np.asarray(idx.asi8).view("M8[ns]" if kind == "datetime" else "m8[ns]")
    cls, freq = type(idx).__name__, idx.freqstr
    arrays = (("dt", values, None, freq), ("dt", values, None, None)) if kind == "datetime" else \
        (("td", values, freq), ("td", values, None))
    for out in (_pandas._dec_index(("index", cls, arrays[0], "x")),  # as pandas <= 2 sends it
                _pandas._dec_index(("index", cls, arrays[1], "x", freq))):  # as pandas 3 does
        assert type(out) is type(idx) and out.freq == idx.freq and out.name == "x"
        assert out.asi8.tolist() == idx.asi8.tolist()


def test_timestamps_of_other_units_are_not_read_as_nanoseconds_by_older_readers():
    """What a gser of before (Timestamp(value, tz=...)) does with a message of
    a non-ns Timestamp: an error, never another instant."""
    from gser import _pandas

    if PANDAS_MAJOR < 2:
        pytest.skip(f"pandas {pd.__version__}: Timestamps only of ns")
    v = _pandas._enc_timestamp(pd.Timestamp("2020-01-01").as_unit("s"))
    with pytest.raises((TypeError, ValueError)):
        pd.Timestamp(v[0], tz=None)
    with pytest.raises((TypeError, ValueError)):
        pd.Timedelta(_pandas._enc_timedelta(pd.Timedelta(3, "s").as_unit("s")))


@needs_pandas2
@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_datetimes_timedeltas_and_scalars_of_every_unit(rt, unit):
    t = pd.date_range("2020-01-01", periods=4, freq="D").as_unit(unit)
    df = pd.DataFrame({"t": t, "tz": t.tz_localize("Asia/Tokyo"), "td": (t - t[0]).as_unit(unit)},
                      index=t.rename("when"))
    out = rt(df)
    check_frame(df, out)
    assert out.index.freq == df.index.freq and out.index.dtype == df.index.dtype
    for x in (pd.Timestamp("2020-06-01 01:02:03", tz="US/Eastern").as_unit(unit),
              pd.Timestamp("1677-01-01").as_unit("s") if unit == "s" else pd.Timestamp(0).as_unit(unit),
              pd.Timedelta(3, "s").as_unit(unit)):
        y = rt(x)
        assert type(y) is type(x) and y == x and y.unit == x.unit and getattr(y, "tz", None) == getattr(x, "tz", None)


def copy_on_write():
    """pandas 3 always copies on write; 1.5 and 2.x when told to."""
    if PANDAS_MAJOR >= 3:
        import contextlib

        return contextlib.nullcontext()
    return pd.option_context("mode.copy_on_write", True)


@pytest.mark.parametrize("rt", ROUND_TRIPS, ids=lambda f: f.__name__)
def test_copy_on_write_frames(rt):
    with copy_on_write():
        base = frame_of_everything()
        views = {"all": base, "columns": base[["i64", "f64", "str", "Int64"]], "rows": base.iloc[2:9],
                 "renamed": base.rename(columns=str.upper), "reset": base.reset_index(drop=True),
                 "assigned": base.assign(extra=1.5)}
        for name, df in views.items():
            before = pickle.loads(pickle.dumps(df))
            out = rt(df)
            check_frame(df, out)
            if rt is family:  # Dask's flags: what was writable is (plain loads: read-only in bytes)
                out.iloc[0, 0] = out.iloc[1, 0]
            check_frame(before, df)
        s = base["f64"]
        tm.assert_series_equal(rt(s), s, check_exact=True)


class OddManager(pd.core.internals.BlockManager):
    """A block manager gser does not know (as pandas 1.5/2's ArrayManager)."""


def frames_of_unknown_layout():
    df = pd.DataFrame({"a": [1, 2, 3], "s": pd.Series(["x", "y", None], dtype=object)})
    df._mgr.__class__ = OddManager
    out = {"odd_manager": df}
    if PANDAS_MAJOR < 3:  # pandas 1.5 and 2.x: ArrayManager, a column per array
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pd.option_context("mode.data_manager", "array"):
                out["array_manager"] = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5]})
                out["array_manager_series"] = pd.Series([1.5, 2.5])
    return out


@pytest.mark.parametrize("kind", sorted(frames_of_unknown_layout()))
def test_unknown_layouts_are_declined_and_go_dasks_way(kind):
    obj = frames_of_unknown_layout()[kind]
    out = through_dasks_path(obj)
    if isinstance(obj, pd.DataFrame):
        tm.assert_frame_equal(out, obj, check_exact=True)
    else:
        tm.assert_series_equal(out, obj, check_exact=True)


def test_pandas_frames_no_longer_need_pickle_in_dask():
    """What Dask serializes with the family first and pickle refused."""
    ser = importlib.import_module("distributed.protocol.serialize")
    gser.dask.register()
    try:
        for obj in (frame_of_everything(), pd.Series([1.5, 2.5]), pd.RangeIndex(4), np.float64(3.5)):
            header, frames = ser.serialize(obj, serializers=list(gser.dask.SERIALIZERS))
            assert header["serializer"] == "gser"
            out = ser.deserialize(header, frames, deserializers=list(gser.dask.DESERIALIZERS))
            assert type(out) is type(obj)
    finally:
        gser.dask.unregister()


# ---- malformed input --------------------------------------------------------------------------


def packed(strs):
    arr = np.array(strs, dtype=object)
    return gser._gser._pack_str(arr, pd.NA)


def test_unpack_rejects_bad_offsets_and_utf8():
    offsets, data, kinds = packed(["ab", "c"])
    assert kinds is None and bytes(data) == b"abc"
    assert np.frombuffer(offsets, dtype=np.int64).tolist() == [0, 2, 3]
    out = np.empty(2, dtype=object)
    gser._gser._unpack_str(offsets, data, kinds, out, pd.NA)
    assert out.tolist() == ["ab", "c"]
    bad_offsets = [
        np.array([0, 2], dtype=np.int64),        # too few
        np.array([1, 2, 3], dtype=np.int64),     # not from 0
        np.array([0, 3, 2], dtype=np.int64),     # decreasing
        np.array([0, 2, 99], dtype=np.int64),    # past the data
    ]
    for off in bad_offsets:
        with pytest.raises(gser.GserError, match="str column"):
            gser._gser._unpack_str(off.tobytes(), data, None, np.empty(2, dtype=object), pd.NA)
    with pytest.raises(gser.GserError, match="UTF-8"):
        gser._gser._unpack_str(offsets, b"a\xffc", None, np.empty(2, dtype=object), pd.NA)
    empty_last = np.array([0, 3, 3], dtype=np.int64).tobytes()
    with pytest.raises(gser.GserError, match="unknown kind"):
        gser._gser._unpack_str(empty_last, data, b"\x00\x07", np.empty(2, dtype=object), pd.NA)
    with pytest.raises(gser.GserError, match="kinds"):
        gser._gser._unpack_str(empty_last, data, b"\x00", np.empty(2, dtype=object), pd.NA)
    with pytest.raises(gser.GserError, match="missing but has bytes"):
        gser._gser._unpack_str(offsets, data, b"\x00\x01", np.empty(2, dtype=object), pd.NA)
    with pytest.raises(TypeError):
        gser._gser._unpack_str(offsets, data, None, np.empty(2, dtype=np.int64), pd.NA)
    with pytest.raises(TypeError):
        gser._gser._unpack_str(offsets, data, None, np.empty(4, dtype=object)[::2], pd.NA)


def test_pack_reports_the_offending_item():
    with pytest.raises(NotImplementedError, match="item 2 .* of type int"):
        packed(["a", None, 5])


def test_unknown_pandas_tags_are_errors_not_crashes():
    from gser import _pandas

    for bad in (("nope",), ("index", "PeriodIndex", ("nd", np.arange(2)), None)):
        with pytest.raises(ValueError, match="unknown"):
            _pandas._dec_index(bad)
    with pytest.raises(ValueError, match="unknown"):
        _pandas._dec_array(("zzz",))
    bad_arrays = [
        ("cat", ("nd", np.array([0, 5], dtype=np.int8)), ("index", "Index", ("obj", ["a"]), None), False),
        ("cat", ("nd", np.array([0.5])), ("index", "Index", ("obj", ["a"]), None), False),
        ("dt", np.arange(3.0), None, None),
        ("td", np.arange(3), None),
        ("mask", "object", np.arange(2), np.zeros(2, dtype=bool)),
    ]
    for bad in bad_arrays:
        with pytest.raises(ValueError, match="gser"):
            _pandas._dec_array(bad)
    with pytest.raises(ValueError, match="gser"):
        _pandas._dec_index(("index", "Int64Index", ("nd", np.arange(3.0)), None))
    with pytest.raises(ValueError, match="frequency"):
        _pandas._dec_index(("index", "Index", ("nd", np.arange(3)), None, "D"))
    for bad in (("dt", np.arange(3).view("M8[D]"), None, None), ("td", np.arange(3).astype(">m8[ns]"), None),
                ("string", "python", "zero", ("str", (0,), np.zeros(1, np.int64), np.zeros(0, np.uint8), None)),
                ("string", "cloud", "NA", None)):
        with pytest.raises(ValueError, match="gser"):
            _pandas._dec_array(bad)
    for bad in ((pd.Timestamp, ((1, "D"), None)), (pd.Timestamp, ((1.5, "s"), None)), (pd.Timedelta, (1, "h"))):
        with pytest.raises(ValueError, match="gser"):
            (_pandas._dec_timestamp if bad[0] is pd.Timestamp else _pandas._dec_timedelta)(bad[1])


@needs_pyarrow
def test_malformed_pyarrow_columns_are_errors_not_crashes():
    from gser import _pandas

    good = _pandas._enc_arrow(pa.chunked_array([pa.array(["ab", None, "c"])]))
    schema, chunks = good
    n, nulls, offset, (validity, offsets, data) = chunks[0]
    assert _pandas._dec_arrow(good).to_pylist() == ["ab", None, "c"]
    list_schema = pa.schema([pa.field("", pa.list_(pa.int64()))]).serialize().to_pybytes()
    bad_offsets = np.frombuffer(np.array([0, 2, 2, 99], dtype=np.int32).tobytes(), dtype=np.uint8)
    bad = [
        (list_schema, chunks),                                          # a type gser does not send
        (schema, [(n, nulls, offset, [validity, offsets])]),            # a buffer short
        (schema, [(n, nulls, offset, [validity, bad_offsets, data])]),  # offsets past the data
        (schema, [(n, nulls, offset, [validity, offsets, np.frombuffer(b"a\xffc", np.uint8)])]),  # not UTF-8
        (schema, [(n + 5, nulls, offset, [validity, offsets, data])]),  # longer than its buffers
        (schema, [(n, nulls, offset, [validity, offsets.astype(np.int64), data])]),  # not bytes
        ("schema", chunks),
        (b"\x00" * 16, chunks),                                         # not an Arrow schema
    ]
    falling = np.frombuffer(np.array([0, 2, 1, 3], dtype=np.int32).tobytes(), dtype=np.uint8)
    bad += [
        (schema, [(n, nulls, offset, [validity, falling, data])]),  # offsets that fall back
        (schema, [(n, nulls, offset, [validity, offsets, np.frombuffer(b"ab\xc3", np.uint8)])]),  # a cut character
        (schema, [(3, 0, 1, [None, offsets, data])]),  # offset 1 and three items: one past the offsets
    ]
    for b in bad:
        with pytest.raises(ValueError, match="gser"):
            _pandas._dec_arrow(b)
    # ASCII skips pyarrow's UTF-8 pass; other UTF-8, and a slice (offset 1), still come back
    for strings in (["ab", None, "c"], ["é", "日本", None, "a" * 20], ["x" * 9, "y"]):
        enc = _pandas._enc_arrow(pa.chunked_array([pa.array(strings, pa.large_string())]))
        assert _pandas._dec_arrow(enc).to_pylist() == strings
        (n2, nulls2, _, bufs2), = enc[1]
        assert _pandas._dec_arrow((enc[0], [(n2 - 1, -1, 1, bufs2)])).to_pylist() == strings[1:]  # -1: nulls unknown


# ---- property: random frames, the family against pickle ----------------------------------------

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

COLUMN_KINDS = ["int64", "int32", "uint8", "float64", "float32", "bool", "datetime", "datetime_tz", "timedelta",
                "category", "Int64", "UInt16", "Float32", "boolean", "string", "str", "str_none",
                *(f"str:{k}" for k in string_columns(3) if k != "string_python")]
if HAVE_PYARROW:
    COLUMN_KINDS += ["int64[pyarrow]", "string[pyarrow]"]


def make_column(kind, n, data):
    draw = data.draw
    if kind in ("int64", "int32", "uint8"):
        info = np.iinfo(kind)
        return np.array(draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n)),
                        dtype=kind)
    if kind in ("float64", "float32"):
        vals = draw(st.lists(st.floats(width=32 if kind == "float32" else 64), min_size=n, max_size=n))
        return np.array(vals, dtype=kind)
    if kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    if kind in ("datetime", "datetime_tz", "timedelta"):
        ints = draw(st.lists(st.one_of(st.none(), st.integers(-(2**62), 2**62)), min_size=n, max_size=n))
        vals = np.array([np.iinfo(np.int64).min if v is None else v for v in ints], dtype=np.int64)
        if kind == "timedelta":
            return pd.to_timedelta(vals.view("m8[ns]"))
        out = pd.DatetimeIndex(vals.view("M8[ns]"))
        return out.tz_localize("UTC").tz_convert(draw(st.sampled_from(["UTC", "Asia/Tokyo", "America/Chicago"]))) \
            if kind == "datetime_tz" else out
    if kind == "category":
        cats = draw(st.lists(st.text(max_size=4), unique=True, max_size=5))
        codes = draw(st.lists(st.integers(-1, len(cats) - 1), min_size=n, max_size=n))
        return pd.Categorical.from_codes(codes, cats, ordered=draw(st.booleans()))
    if kind in ("Int64", "UInt16", "Float32", "boolean"):
        base = {"Int64": st.integers(-(2**63), 2**63 - 1), "UInt16": st.integers(0, 2**16 - 1),
                "Float32": st.floats(width=32, allow_nan=False), "boolean": st.booleans()}[kind]
        return pd.array(draw(st.lists(st.one_of(st.none(), base), min_size=n, max_size=n)), dtype=kind)
    text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
    if kind == "int64[pyarrow]":
        return pd.array(draw(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), min_size=n,
                                      max_size=n)), dtype=kind)
    if kind == "string[pyarrow]":
        return pd.array(draw(st.lists(st.one_of(st.none(), text), min_size=n, max_size=n)), dtype=kind)
    if kind.startswith("str:"):
        dtype = string_columns(3)[kind[4:]].dtype
        return pd.array(draw(st.lists(st.one_of(st.none(), text), min_size=n, max_size=n)), dtype=dtype)
    if kind == "string":
        return pd.array(draw(st.lists(st.one_of(st.none(), text), min_size=n, max_size=n)), dtype="string")
    if kind == "str":
        return np.array(draw(st.lists(text, min_size=n, max_size=n)) + [""], dtype=object)[:n]
    missing = st.sampled_from([None, float("nan")])
    return np.array(draw(st.lists(st.one_of(missing, text), min_size=n, max_size=n)) + [""], dtype=object)[:n]


def make_index(kind, n, data):
    if kind == "range":
        start = data.draw(st.integers(-5, 5))
        step = data.draw(st.sampled_from([1, 2, -3]))
        return pd.RangeIndex(start, start + step * n, step)
    if kind == "multi":
        return pd.MultiIndex.from_arrays([np.arange(n) % 3, [f"k{i}" for i in range(n)]], names=["a", "b"])
    return pd.Index(make_column(kind, n, data), name=data.draw(st.one_of(st.none(), st.text(max_size=3),
                                                                           st.integers(-(2**63), 2**63 - 1))))


@hypothesis.settings(max_examples=60, deadline=None, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(data=st.data())
def test_random_frames_match_pickle(data):
    n = data.draw(st.integers(0, 12))
    kinds = data.draw(st.lists(st.sampled_from(COLUMN_KINDS), min_size=0, max_size=6))
    names = data.draw(st.lists(st.one_of(st.text(max_size=3), st.integers(-3, 3)), min_size=len(kinds),
                               max_size=len(kinds)))
    index = make_index(data.draw(st.sampled_from(["range", "multi", "int64", "str", "datetime_tz", "category"])),
                       n, data)
    df = pd.DataFrame({i: make_column(k, n, data) for i, k in enumerate(kinds)}, index=index)
    df.columns = pd.Index(names, dtype=object) if kinds else df.columns
    if data.draw(st.booleans()):
        df.attrs["note"] = data.draw(st.text(max_size=5))
    by_pickle = pickle.loads(pickle.dumps(df, protocol=5))
    by_gser = family(df)
    check_frame(by_pickle, by_gser)
    check_frame(df, by_gser)
    if kinds:
        s = df.iloc[:, 0]
        tm.assert_series_equal(family(s), pickle.loads(pickle.dumps(s, protocol=5)), check_exact=True)
