"""pandas DataFrame, Series and Index through gser, without pickle.

Registered lazily (gser.register_lazy("pandas", ...)): pandas is imported
the first time gser meets a pandas object or a "pandas.*" name.

What travels (a tuple tree of plain gser values and numpy arrays):

- a DataFrame as its blocks (pandas' own layout, as its pickle does): each
  block's values and the columns they hold, the columns and the index;
  numeric, bool and datetime64/timedelta64 blocks are numpy arrays, so they
  travel zero-copy as frames of their own and are rebuilt as blocks over the
  received frames;
- str columns (object columns of str, with None / NaN / pd.NA for missing
  values, and the str dtypes of python storage: string[python], pandas 3's
  str without pyarrow) as one int64 offsets buffer and one UTF-8 data
  buffer, packed and unpacked in C (gser._gser._pack_str / _unpack_str);
- pyarrow-backed columns (string[pyarrow], pandas 3's default str,
  ArrowDtype of flat Arrow types) as each chunk's Arrow buffers, zero-copy,
  and the type as an Arrow IPC schema; the receiver validates them;
- categoricals as codes plus their categories (an Index); nullable masked
  arrays (Int64, ..., Float64, boolean) as data plus mask; tz-aware
  datetimes as int64 values plus the time zone's name (pytz, zoneinfo,
  dateutil, fixed offsets) and freq; datetimes of s, ms, us and ns;
- indexes (RangeIndex, MultiIndex, DatetimeIndex, TimedeltaIndex,
  CategoricalIndex, Index and pandas 1.x's Int64Index, ...) as their
  values and names (and freq, which pandas 3 keeps on the index); object
  labels may be str, int, float, bool, None, bytes or numpy scalars;
- names, attrs (plain values) and flags.allows_duplicate_labels.

pandas 1.5, 2.x and 3.x: what differs between them (managers, array
classes, units, where freq lives) is looked up, not assumed.

Everything else raises NotImplementedError, so Dask's next family (pickle)
takes the object: object columns holding other Python objects, sparse,
period, interval and nested or dictionary pyarrow columns, subclasses of the
pandas types, frames and series of a manager or block gser does not know.
"""

from __future__ import annotations

import datetime
import sys

import numpy as np

from gser import _gser

_VERSION = 1


class _Refuse(NotImplementedError):
    pass


def _refuse(what):
    raise _Refuse(f"gser cannot carry {what} (gser never pickles: Dask's next family takes it)")


# ---- plain values: labels, names, attrs -------------------------------------------------

_SCALARS = (type(None), bool, int, float, str, bytes)


def _check_plain(x, what, depth=0):
    """Raise unless x comes back as itself through gser: None, bool, int,
    float, str, bytes, numpy scalars, and tuples, lists and str-keyed dicts
    of those."""
    t = type(x)
    if t in _SCALARS:
        return
    if isinstance(x, np.generic) and x.dtype.kind != "O":
        return
    if depth < 8:
        if t is tuple or t is list:
            for v in x:
                _check_plain(v, what, depth + 1)
            return
        if t is dict:
            for k, v in x.items():
                if type(k) not in _SCALARS:
                    _refuse(f"{what} holding a dict key of type {type(k).__name__}")
                _check_plain(v, what, depth + 1)
            return
    _refuse(f"{what} holding a {t.__name__}")


# ---- time zones and frequencies ---------------------------------------------------------


def _enc_tz(tz):
    if tz is None:
        return None
    mod = type(tz).__module__
    if tz is datetime.timezone.utc:
        return ("utc",)
    if type(tz) is datetime.timezone:
        off = tz.utcoffset(None)
        if tz != datetime.timezone(off) or tz.tzname(None) != datetime.timezone(off).tzname(None):
            _refuse(f"the time zone {tz!r}")
        return ("fixed", off.days * 86400 + off.seconds, off.microseconds)
    if mod.startswith("pytz") and isinstance(getattr(tz, "zone", None), str):
        return ("pytz", tz.zone)  # a zone's DST variants (a Timestamp's tz) too
    if mod == "zoneinfo" and isinstance(getattr(tz, "key", None), str):
        return ("zoneinfo", tz.key)
    from pandas._libs.tslibs import timezones

    name = timezones.get_timezone(tz)
    if isinstance(name, str) and name.startswith("dateutil/"):
        return ("dateutil", name)
    _refuse(f"the time zone {tz!r}")


def _dec_tz(t):
    if t is None:
        return None
    kind = t[0]
    if kind == "utc":
        return datetime.timezone.utc
    if kind == "fixed":
        return datetime.timezone(datetime.timedelta(seconds=t[1], microseconds=t[2]))
    if kind == "pytz":
        import pytz

        return pytz.timezone(t[1])
    if kind == "zoneinfo":
        import zoneinfo

        return zoneinfo.ZoneInfo(t[1])
    if kind == "dateutil":
        from pandas._libs.tslibs import timezones

        return timezones.maybe_get_tz(t[1])
    raise ValueError(f"gser: a pandas time zone of unknown kind {kind!r}")


def _enc_freq(freq):
    if freq is None:
        return None
    from pandas.tseries.frequencies import to_offset

    s = freq.freqstr
    if to_offset(s) != freq:
        _refuse(f"the frequency {freq!r}")
    return s


def _dec_freq(s):
    if s is None:
        return None
    from pandas.tseries.frequencies import to_offset

    return to_offset(s)


# ---- arrays: block values, column values, index values ------------------------------------


def _enc_str(a, labels):
    """An object array of str (None / NaN / pd.NA) as offsets + UTF-8 data."""
    import pandas as pd

    c = np.ascontiguousarray(a)
    try:
        offsets, data, kinds = _gser._pack_str(c, pd.NA)
    except NotImplementedError:
        if not labels or a.ndim != 1:
            raise
        # Labels (column names, an object index): small; any plain scalars.
        items = list(a)
        labels = (*_SCALARS, pd.Timestamp, pd.Timedelta, type(pd.NaT))
        for x in items:
            if type(x) not in labels and not (isinstance(x, np.generic) and x.dtype.kind != "O"):
                _refuse(f"an index label of type {type(x).__name__}")
        return ("obj", items)
    # As numpy arrays, the buffers travel as frames and load without a copy.
    kinds = None if kinds is None else np.frombuffer(kinds, dtype=np.uint8)
    return ("str", a.shape, np.frombuffer(offsets, dtype=np.int64), np.frombuffer(data, dtype=np.uint8), kinds)


def _string_storage(dtype):
    """(storage, na) of a pandas StringDtype: na is "NA" (pd.NA, string) or
    "nan" (np.nan: pandas 3's default str, pandas 2's pyarrow_numpy)."""
    import pandas as pd

    na = getattr(dtype, "na_value", pd.NA)
    if na is pd.NA:
        return dtype.storage, "NA"
    if isinstance(na, float) and na != na:
        return dtype.storage, "nan"
    _refuse(f"a str column whose missing value is {na!r}")


def _string_dtype(storage, na):
    import pandas as pd

    if storage not in ("python", "pyarrow"):
        raise ValueError(f"gser: a pandas str column of unknown storage {storage!r}")
    if na == "NA":
        return pd.StringDtype(storage)
    if na != "nan":
        raise ValueError(f"gser: a pandas str column of unknown missing value {na!r}")
    try:
        return pd.StringDtype(storage, na_value=np.nan)
    except TypeError:  # pandas < 2.3
        pass
    if storage == "pyarrow":
        try:
            return pd.StringDtype("pyarrow_numpy")  # pandas 2.1 and 2.2
        except (TypeError, ValueError):
            pass
    raise ValueError(f"gser: a str column of {storage} storage and NaN for missing values, which this pandas has not")


# Arrow types whose arrays are only their own buffers (no children, no
# dictionary, no variadic buffers), which _enc_arrow sends as they are.
def _flat_arrow_type(t):
    import pyarrow as pa

    if t.num_fields or isinstance(t, (pa.DictionaryType, pa.ExtensionType)):
        return False
    return not any(getattr(pa.types, f, lambda t: False)(t) for f in ("is_string_view", "is_binary_view"))


def _enc_arrow(chunked):
    """A pyarrow ChunkedArray of a flat type as its type (an Arrow IPC
    schema: data, never code) and, per chunk, length, null count, offset and
    its buffers as numpy arrays (frames, zero-copy)."""
    import pyarrow as pa

    t = chunked.type
    if type(chunked) is not pa.ChunkedArray or not _flat_arrow_type(t):
        _refuse(f"a pyarrow column of type {t}")
    chunks = []
    for c in chunked.chunks:
        if c.get_total_buffer_size() > 2 * c.nbytes + 4096:
            # A slice (a partition of a larger frame) views its parent's
            # buffers: send only its own items, as pickle does.
            c = pa.concat_arrays([c])
        bufs = c.buffers()
        if len(bufs) != t.num_buffers:
            _refuse(f"a pyarrow column of type {t} with {len(bufs)} buffers")
        chunks.append((len(c), c.null_count, c.offset,
                       [None if b is None else np.frombuffer(b, dtype=np.uint8) for b in bufs]))
    schema = pa.schema([pa.field("", t)]).serialize().to_pybytes()
    return (schema, chunks)


_ASCII_HIGH = np.uint64(0x8080808080808080)


def _ascii(data):
    """Whether bytes (a uint8 array) are all ASCII: one OR over them, 8 at a
    time, with no temporary (0.15 ms for 12.5 MB on the CI machine)."""
    n8 = len(data) & ~7
    high = np.bitwise_or.reduce(data[:n8].view(np.uint64)) if n8 else np.uint64(0)
    return not (high & _ASCII_HIGH) and not (n8 < len(data) and np.bitwise_or.reduce(data[n8:]) & 0x80)


def _validate_arrow(arr, t, bufs):
    """What pyarrow's validate(full=True) checks, at the cost of the checks
    that keep memory safe: for strings and binaries, offsets that rise and
    stay inside the data (numpy, a pass over the offsets), and UTF-8 by
    pyarrow only where a byte is not ASCII (an ASCII column is valid UTF-8:
    full validation of a 1,000,000-string column took 10 ms on the CI
    machine, 20 times pickle's whole round trip of it)."""
    import pyarrow as pa

    arr.validate()  # buffer sizes against the length
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        arr.validate(full=True)
        return
    n, offset = len(arr), arr.offset
    if n == 0:
        return
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    if bufs[1] is None:
        raise pa.ArrowInvalid(f"{n} items and no offsets")
    # validate() checked that the offsets buffer holds offset + n + 1 of them
    offsets = np.frombuffer(bufs[1], np.int64 if wide else np.int32, count=offset + n + 1)[offset:]
    data = bufs[2] if bufs[2] is not None else np.empty(0, np.uint8)
    if offsets[0] < 0 or offsets[-1] > len(data) or (offsets[1:] < offsets[:-1]).any():
        raise pa.ArrowInvalid(f"offsets out of order or outside the {len(data)} bytes of data")
    if (pa.types.is_string(t) or pa.types.is_large_string(t)) and not _ascii(data[offsets[0]:offsets[-1]]):
        arr.validate(full=True)


def _dec_arrow(v):
    import pyarrow as pa

    schema, chunks = v
    if type(schema) is not bytes or type(chunks) is not list:
        raise ValueError("gser: a malformed pyarrow column")
    try:
        t = pa.ipc.read_schema(pa.py_buffer(schema)).field(0).type
    except (pa.ArrowException, IndexError) as e:
        raise ValueError(f"gser: a pyarrow column whose type is not an Arrow schema: {e}") from None
    if not _flat_arrow_type(t):
        raise ValueError(f"gser: a pyarrow column of type {t}, which gser does not send")
    out = []
    for n, nulls, offset, bufs in chunks:
        if type(bufs) is not list or len(bufs) != t.num_buffers or not all(
                b is None or (type(b) is np.ndarray and b.dtype == np.uint8 and b.ndim == 1) for b in bufs):
            raise ValueError(f"gser: a pyarrow column of type {t} with malformed buffers")
        try:
            arr = pa.Array.from_buffers(t, n, [None if b is None else pa.py_buffer(b) for b in bufs],
                                        null_count=nulls, offset=offset)
            _validate_arrow(arr, t, bufs)  # received bytes are not trusted
        except (pa.ArrowException, TypeError, OverflowError) as e:
            raise ValueError(f"gser: a malformed pyarrow column of type {t}: {e}") from None
        out.append(arr)
    return pa.chunked_array(out, type=t)


def _arrow_of(a):
    """The ChunkedArray behind a pyarrow-backed pandas array."""
    import pyarrow as pa

    c = getattr(a, "_pa_array", None)  # pandas >= 2.0
    if c is None:
        c = getattr(a, "_data", None)  # pandas 1.5
    if type(c) is not pa.ChunkedArray:
        _refuse(f"a pandas column of dtype {a.dtype} ({type(a).__name__}) of an unknown layout")
    return c


def _enc_array(a, labels=False):
    import pandas as pd
    from pandas.core.arrays import DatetimeArray, TimedeltaArray
    from pandas.core.arrays.masked import BaseMaskedArray

    t = type(a)
    if t is np.ndarray:
        if a.dtype.hasobject:
            return _enc_str(a, labels)
        return ("nd", a)
    if t is pd.Categorical:
        # the codes themselves: Categorical.codes is a read-only view of them
        codes = getattr(a, "_ndarray", None)
        codes = a.codes if type(codes) is not np.ndarray else codes
        return ("cat", _enc_array(codes), _enc_index(a.categories), bool(a.ordered))
    if t is DatetimeArray:
        return ("dt", a._ndarray, _enc_tz(a.tz), _enc_freq(getattr(a, "freq", None)))
    if t is TimedeltaArray:
        return ("td", a._ndarray, _enc_freq(getattr(a, "freq", None)))
    if isinstance(a, BaseMaskedArray) and t is a.dtype.construct_array_type():
        return ("mask", a.dtype.name, a._data, a._mask)
    if isinstance(a.dtype, pd.StringDtype) and t is a.dtype.construct_array_type():
        storage, na = _string_storage(a.dtype)
        if storage == "python":
            values = a._ndarray
            if type(values) is not np.ndarray or values.dtype != object:
                _refuse(f"a pandas column of dtype {a.dtype} ({t.__name__}) of an unknown layout")
            if na == "NA":
                return ("sa", _enc_str(values, False))  # as gser before pandas 3 sends it
            return ("string", storage, na, _enc_str(values, False))
        if storage in ("pyarrow", "pyarrow_numpy"):
            return ("string", "pyarrow", "nan" if storage == "pyarrow_numpy" else na, _enc_arrow(_arrow_of(a)))
        _refuse(f"a str column of storage {storage!r}")
    arrow_dtype = getattr(pd, "ArrowDtype", None)
    if arrow_dtype is not None and type(a.dtype) is arrow_dtype and t is a.dtype.construct_array_type():
        return ("arrow", _enc_arrow(_arrow_of(a)))
    _refuse(f"a pandas column of dtype {a.dtype} ({t.__name__})")


def _dec_str(v, na):
    if v[0] == "obj":
        out = np.empty(len(v[1]), dtype=object)
        for i, x in enumerate(v[1]):
            out[i] = x
        return out
    _, shape, offsets, data, kinds = v
    n = 1
    for e in shape:
        n *= e
    out = np.empty(n, dtype=object)
    _gser._unpack_str(offsets, data, kinds, out, na)
    return out.reshape(shape)


def _dec_array(v):
    import pandas as pd

    tag = v[0]
    if tag == "nd":
        return v[1]
    if tag in ("str", "obj"):
        return _dec_str(v, pd.NA)
    if tag == "cat":
        codes = _dec_array(v[1])
        categories = _dec_index(v[2])
        # The sender's categories were validated there (unique, no NaN), as
        # pandas' own unpickling assumes; re-checking costs a hash table.
        fast = getattr(pd.CategoricalDtype, "_from_fastpath", None)
        dtype = fast(categories, bool(v[3])) if fast else pd.CategoricalDtype(categories, ordered=v[3])
        if type(codes) is not np.ndarray or codes.dtype.kind != "i" or codes.ndim != 1 or (
                codes.size and (codes.min() < -1 or codes.max() >= len(dtype.categories))):
            raise ValueError("gser: a pandas categorical whose codes do not fit its categories")
        return pd.Categorical._simple_new(codes, dtype)
    if tag in ("dt", "td"):
        values = v[1]
        kind = "M8" if tag == "dt" else "m8"
        if type(values) is not np.ndarray or values.dtype.str not in _UNITS[kind]:
            raise ValueError(f"gser: a pandas {'datetime' if tag == 'dt' else 'timedelta'} array of "
                             f"{getattr(values, 'dtype', type(values).__name__)}, not of s, ms, us or ns")
        if values.dtype.str[-4:] != "[ns]" and int(pd.__version__.split(".")[0]) < 2:
            raise ValueError(f"gser: a pandas array of {values.dtype}: this pandas has only nanoseconds")
        freq = _dec_freq(v[3] if tag == "dt" else v[2])
        if tag == "dt":
            from pandas.core.arrays import DatetimeArray as cls

            tz = _dec_tz(v[2])
            dtype = pd.DatetimeTZDtype(unit=np.datetime_data(values.dtype)[0], tz=tz) if tz is not None \
                else values.dtype
        else:
            from pandas.core.arrays import TimedeltaArray as cls

            dtype = values.dtype
        out = cls._simple_new(values, dtype=dtype)
        if freq is not None and hasattr(cls, "freq"):  # pandas <= 2; pandas 3 keeps freq on the index
            out._freq = freq
        return out
    if tag == "mask":
        from pandas.core.arrays.masked import BaseMaskedArray

        cls = getattr(pd.api.types.pandas_dtype(v[1]), "construct_array_type", lambda: None)()
        if not (isinstance(cls, type) and issubclass(cls, BaseMaskedArray)):
            raise ValueError(f"gser: {v[1]!r} is not a masked pandas dtype")
        return cls(v[2], v[3])
    if tag == "sa":
        return _dec_string("python", "NA", v[1])
    if tag == "string":
        return _dec_string(v[1], v[2], v[3])
    if tag == "arrow":
        arr = _dec_arrow(v[1])
        return pd.arrays.ArrowExtensionArray(arr)
    raise ValueError(f"gser: a pandas array of unknown kind {tag!r}")


_UNITS = {k: tuple(f"<{k}[{u}]" for u in ("s", "ms", "us", "ns")) for k in ("M8", "m8")}


def _dec_string(storage, na, payload):
    import pandas as pd

    dtype = _string_dtype(storage, na)
    cls = dtype.construct_array_type()
    if storage == "python":
        from pandas.core.arrays import StringArray

        if not issubclass(cls, StringArray):
            raise ValueError(f"gser: a str column of {dtype!r} is not a StringArray here")
        return cls._simple_new(_dec_str(payload, pd.NA), dtype)
    chunked = _dec_arrow(payload)
    try:
        out = cls(chunked, dtype=dtype)  # pandas 3
    except TypeError:
        out = cls(chunked)  # pandas <= 2.3: the class says the missing value
    if out.dtype != dtype:
        raise ValueError(f"gser: a str column of {dtype!r} came back as {out.dtype!r}")
    return out


# ---- indexes --------------------------------------------------------------------------------


def _index_classes():
    import pandas as pd

    out = {n: getattr(pd, n) for n in ("Index", "DatetimeIndex", "TimedeltaIndex", "CategoricalIndex")}
    try:  # pandas 1.x: pd.Int64Index etc. warn, their module does not
        from pandas.core.indexes import numeric
    except ImportError:
        return out
    for n in ("Int64Index", "UInt64Index", "Float64Index", "NumericIndex"):
        if isinstance(getattr(numeric, n, None), type):
            out[n] = getattr(numeric, n)
    return out


_CLASSES = {}


def _enc_index(idx):
    import pandas as pd

    t = type(idx)
    _check_plain(list(idx.names) if t is pd.MultiIndex else idx.name, "an index name")
    if t is pd.RangeIndex:
        return ("range", idx.start, idx.stop, idx.step, idx.name)
    if t is pd.MultiIndex:
        return ("multi", [_enc_index(lv) for lv in idx.levels], [_enc_array(c) for c in idx.codes],
                list(idx.names), idx.sortorder)
    if not _CLASSES:
        _CLASSES.update(_index_classes())
    name = t.__name__
    if _CLASSES.get(name) is not t:
        _refuse(f"a pandas index of type {name}")
    values = _enc_array(idx._data, labels=True)
    freq = getattr(idx, "freq", None)
    if freq is not None and not hasattr(idx._data, "freq"):  # pandas 3: the index's, not its array's
        return ("index", name, values, idx.name, _enc_freq(freq))
    return ("index", name, values, idx.name)


def _dec_index(v):
    import pandas as pd

    tag = v[0]
    if tag == "range":
        return pd.RangeIndex(v[1], v[2], v[3], name=v[4])
    if tag == "multi":
        return pd.MultiIndex(levels=[_dec_index(lv) for lv in v[1]], codes=[_dec_array(c) for c in v[2]],
                             names=v[3], sortorder=v[4], verify_integrity=False)
    if tag == "index":
        if not _CLASSES:
            _CLASSES.update(_index_classes())
        cls = _CLASSES.get(v[1])
        if cls is None:
            raise ValueError(f"gser: a pandas index of unknown type {v[1]!r}")
        values = _dec_array(v[2])
        # freq: pandas <= 2 sends it with the array, pandas 3 with the index
        freq = v[4] if len(v) > 4 else None
        if freq is None and v[2][0] in ("dt", "td"):
            freq = v[2][3] if v[2][0] == "dt" else v[2][2]
        want = getattr(cls, "_default_dtype", None) if v[1] != "NumericIndex" else None
        if not isinstance(values, cls._data_cls) or getattr(values, "ndim", 1) != 1 or (
                want is not None and values.dtype != want):
            raise ValueError(f"gser: a pandas {v[1]} of values {type(values).__name__}")
        if freq is not None:
            if v[1] not in ("DatetimeIndex", "TimedeltaIndex"):
                raise ValueError(f"gser: a pandas {v[1]} with a frequency")
            freq = _dec_freq(freq)
            if hasattr(type(values), "freq"):  # pandas <= 2: the array's
                values._freq = freq
        out = cls._simple_new(values, name=v[3])
        if freq is not None and not hasattr(type(values), "freq"):  # pandas 3: the index's
            out._freq = freq
        return out
    raise ValueError(f"gser: a pandas index of unknown kind {tag!r}")


# ---- frames and series ----------------------------------------------------------------------


def _meta(obj):
    attrs = obj.attrs
    if attrs:
        _check_plain(attrs, "attrs")
    return (dict(attrs) if attrs else None, bool(obj.flags.allows_duplicate_labels))


def _set_meta(obj, meta):
    attrs, dup = meta
    if attrs:
        obj.attrs = attrs
    if not dup:
        obj.flags.allows_duplicate_labels = False
    return obj


def _enc_frame(df):
    from pandas.core.internals import BlockManager

    mgr = df._mgr
    if type(mgr) is not BlockManager:
        _refuse(f"a DataFrame held by a {type(mgr).__name__}")
    blocks = []
    for b in mgr.blocks:
        loc = b.mgr_locs.indexer
        if type(loc) is slice:
            loc = (loc.start, loc.stop, loc.step)
        blocks.append((_enc_array(b.values), loc))
    return (_VERSION, _enc_index(df.columns), _enc_index(df.index), blocks, _meta(df))


def _from_mgr(cls, mgr):
    # pandas >= 2.1: cls._from_mgr (a manager passed to the constructor is
    # deprecated there); pandas 1.5 and 2.0: the constructor.
    fast = getattr(cls, "_from_mgr", None)
    return fast(mgr, axes=mgr.axes) if fast is not None else cls(mgr)


def _dec_frame(v):
    import pandas as pd
    from pandas._libs.internals import BlockPlacement
    from pandas.core.internals import BlockManager
    from pandas.core.internals.blocks import new_block

    version, columns, index, blocks, meta = v
    if version != _VERSION:
        raise ValueError(f"gser: a pandas DataFrame of version {version!r}, this gser reads {_VERSION}")
    built = []
    for values, loc in blocks:
        loc = slice(*loc) if type(loc) is tuple else loc
        built.append(new_block(_dec_array(values), placement=BlockPlacement(loc), ndim=2))
    mgr = BlockManager(tuple(built), [_dec_index(columns), _dec_index(index)])
    return _set_meta(_from_mgr(pd.DataFrame, mgr), meta)


def _enc_series(s):
    from pandas.core.internals import SingleBlockManager

    if type(s._mgr) is not SingleBlockManager:
        _refuse(f"a Series held by a {type(s._mgr).__name__}")
    _check_plain(s.name, "a Series name")
    return (_VERSION, _enc_array(s._values), _enc_index(s.index), s.name, _meta(s))


def _dec_series(v):
    import pandas as pd
    from pandas.core.internals import SingleBlockManager

    version, values, index, name, meta = v
    if version != _VERSION:
        raise ValueError(f"gser: a pandas Series of version {version!r}, this gser reads {_VERSION}")
    mgr = SingleBlockManager.from_array(_dec_array(values), _dec_index(index))
    out = _from_mgr(pd.Series, mgr)
    out.name = name
    return _set_meta(out, meta)


# ---- scalars that reductions return ------------------------------------------------------


def _enc_timestamp(ts):
    unit = getattr(ts, "unit", "ns")
    if unit == "ns":
        return (ts.value, _enc_tz(ts.tz))  # as gser before pandas 2 sends it
    # (value, unit) where a gser of before reads an int: it raises, rather
    # than take the value for nanoseconds
    return ((ts._value, unit), _enc_tz(ts.tz))


def _dec_timestamp(v):
    import pandas as pd

    value, tz = v
    if type(value) is not tuple:
        return pd.Timestamp(value, tz=_dec_tz(tz))
    value, unit = value
    if unit not in ("s", "ms", "us", "ns") or type(value) is not int:
        raise ValueError(f"gser: a pandas Timestamp of unit {unit!r}")
    out = pd.Timestamp(np.datetime64(value, unit))
    tz = _dec_tz(tz)
    return out if tz is None else out.tz_localize("UTC").tz_convert(tz)


def _enc_timedelta(td):
    unit = getattr(td, "unit", "ns")
    if unit == "ns":
        return td.value
    return (td._value, unit)


def _dec_timedelta(v):
    import pandas as pd

    if type(v) is int:
        return pd.Timedelta(v)
    value, unit = v
    if unit not in ("s", "ms", "us", "ns") or type(value) is not int:
        raise ValueError(f"gser: a pandas Timedelta of unit {unit!r}")
    return pd.Timedelta(np.timedelta64(value, unit))


def register():
    """Register pandas' DataFrame, Series and index types, and the scalars
    reductions return (Timestamp, Timedelta, NaT, NA), with gser."""
    import pandas as pd

    # What dask.dataframe's task shuffle moves between workers: a dict of
    # frames (a subclass, for Dask's memory accounting). Registered in Dask
    # processes, where the receiver needs it before the frames inside.
    if "dask" in sys.modules:
        try:
            from dask.dataframe.backends import ShuffleGroupResult
        except ImportError:
            pass
        else:
            _gser.register_type(ShuffleGroupResult, dict, ShuffleGroupResult, name="pandas.dask.ShuffleGroupResult")
    _gser.register_type(pd.Timestamp, _enc_timestamp, _dec_timestamp, name="pandas.Timestamp")
    _gser.register_type(pd.Timedelta, _enc_timedelta, _dec_timedelta, name="pandas.Timedelta")
    _gser.register_type(type(pd.NaT), lambda x: None, lambda v: pd.NaT, name="pandas.NaT")
    _gser.register_type(type(pd.NA), lambda x: None, lambda v: pd.NA, name="pandas.NA")

    _gser.register_type(pd.DataFrame, _enc_frame, _dec_frame, name="pandas.DataFrame")
    _gser.register_type(pd.Series, _enc_series, _dec_series, name="pandas.Series")
    if not _CLASSES:
        _CLASSES.update(_index_classes())
    for name, cls in [("RangeIndex", pd.RangeIndex), ("MultiIndex", pd.MultiIndex), *_CLASSES.items()]:
        _gser.register_type(cls, _enc_index, _dec_index, name=f"pandas.{name}")
