"""Round trips through gser.dumps/loads and to_bytes/from_bytes: every mapped
type, nesting, type identity, large converted and mixed lists, errors."""

import math
import sys
from collections import OrderedDict, namedtuple
from enum import IntEnum

import pytest

import gser

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


def roundtrip(obj, **kw):
    header, frames = gser.dumps(obj, **kw)
    assert isinstance(header, bytes)
    assert isinstance(frames, list)
    return gser.loads(header, frames)


def flat_roundtrip(obj):
    b = gser.to_bytes(obj)
    assert isinstance(b, gser.FlatBytes)
    return gser.from_bytes(b)


def assert_same(a, b, path="$"):
    """Equal, and of exactly the same types all the way down."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for (ka, va), (kb, vb) in zip(a.items(), b.items()):
            assert type(ka) is type(kb), f"{path} key {ka!r}"
            assert_same(va, vb, f"{path}[{ka!r}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    elif isinstance(a, float):
        assert a == b and math.copysign(1, a) == math.copysign(1, b), path
    else:
        assert a == b, path


SCALARS = [
    None,
    True,
    False,
    0,
    1,
    -1,
    127,
    128,
    -33,
    2**31,
    INT64_MIN,
    INT64_MAX,
    INT64_MAX + 1,
    UINT64_MAX,
    0.0,
    -0.0,
    1.5,
    -2.25e300,
    5e-324,
    float("inf"),
    float("-inf"),
    float("nan"),
    "",
    "plain",
    "ünïcødé ✓ 𝄞",
    "x" * 100_000,
    b"",
    b"\x00\x01\xff",
    b"y" * 100_000,
]


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: repr(v)[:30])
@pytest.mark.parametrize("rt", [roundtrip, flat_roundtrip], ids=["frames", "flat"])
def test_scalars(value, rt):
    assert_same(value, rt(value))


def test_int_range_edges():
    for v in (INT64_MAX + 1, UINT64_MAX):
        out = roundtrip(v)
        assert out == v and type(out) is int
    # beyond 64 bits: a "python.tree" int (two's complement bytes)
    for v in (UINT64_MAX + 1, INT64_MIN - 1, 10**40, -(10**40), 2**10000, -(2**10000) + 1):
        out = roundtrip(v)
        assert out == v and type(out) is int


def test_big_ints_anywhere():
    for v in ([0, 1, {"payload": [1, 2**64]}], {"ids": list(range(100)) + [2**70]}, (2**64, -(2**64)),
              {2**80: "key"}, [[2**65] * 3, -(2**63) - 1]):
        out = roundtrip(v)
        assert out == v and repr(out) == repr(v)


NESTED = {
    "none": None,
    "flags": [True, False, True],
    "ints": [1, -2, 3],
    "floats": (1.5, 2.5),
    "mixed": [1, 1.5, True, None, "s", b"b", [], (), {}],
    "deep": [[[[[("x", {"y": [1, (2, [3])]})]]]]],
    "tuple_of_lists": ([1], [2.0], [True]),
    "list_of_tuples": [(1,), (2.0,), (False,)],
    "empty": {"l": [], "t": (), "d": {}, "s": "", "b": b""},
    1: "int key",
    -7: "negative key",
    2**64 - 1: "uint key",
    2.5: "float key",
    None: "none key",
    True: "bool key",
    b"raw": "bytes key",
    "ünï": "unicode key",
}


@pytest.mark.parametrize("rt", [roundtrip, flat_roundtrip], ids=["frames", "flat"])
def test_nested(rt):
    assert_same(NESTED, rt(NESTED))


def test_dict_order_kept():
    d = {k: i for i, k in enumerate(["z", "a", "m", 3, 1, 2])}
    assert list(roundtrip(d).items()) == list(d.items())


def test_tuple_and_list_stay_distinct():
    for obj in ([1, 2], (1, 2), [(1, 2)], ([1, 2],), [1.5] * 100, (1.5,) * 100, [True] * 50, (False,) * 50,
                ((),), [[]], ([], ()), tuple(range(1000)), list(range(1000))):
        assert_same(obj, roundtrip(obj))
        assert_same(obj, flat_roundtrip(obj))


def test_nesting_limit():
    obj = "leaf"
    for _ in range(gser.DEPTH_MAX - 1):
        obj = [obj]
    assert roundtrip(obj) == obj  # DEPTH_MAX levels, the leaf included
    with pytest.raises(gser.GserError) as e:
        gser.dumps([obj])
    assert e.value.status_name == "GSER_ERR_LIMIT_DEPTH"


def test_cycle_is_an_error_not_a_crash():
    a = [1]
    a.append(a)
    with pytest.raises(gser.GserError, match="cycle"):
        gser.dumps(a)
    d = {}
    d["self"] = d
    with pytest.raises(gser.GserError, match="LIMIT_DEPTH"):
        gser.dumps(d)


Point = namedtuple("Point", "x y")


class Color(IntEnum):
    RED = 1


class MyList(list):
    pass


class MyStr(str):
    pass


@pytest.mark.parametrize(
    "obj",
    [
        object(),
        len,
        lambda: 1,
        Point(1, 2),
        OrderedDict(a=1),
        Color.RED,
        MyList([1]),
        MyStr("s"),
        Exception("x"),
    ],
    ids=lambda o: type(o).__name__,
)
def test_unsupported_types_raise_not_implemented(obj):
    with pytest.raises(NotImplementedError, match="gser cannot serialize"):
        gser.dumps(obj)
    with pytest.raises(NotImplementedError):
        gser.to_bytes(obj)


def test_unsupported_error_names_path():
    with pytest.raises(NotImplementedError) as e:
        gser.dumps([0, 1, {"payload": Color.RED}])
    assert str(e.value).startswith("$[2].payload: gser cannot serialize an object of type Color"), str(e.value)
    with pytest.raises(NotImplementedError) as e:
        gser.dumps({"a b": [{"c": object()}]})
    assert str(e.value).startswith("$['a b'][0].c:"), str(e.value)


def test_dict_keys_of_any_carried_type():
    # keys that are not scalars: a "python.tree" dict of (keys, values)
    for key in [(1, 2), frozenset([1]), ("x", (1, 2.5)), 2**70, None]:
        d = {key: 1, "other": [key]}
        out = roundtrip(d)
        assert out == d and list(out) == list(d) and type(list(out)[0]) is type(key)
    with pytest.raises(NotImplementedError, match="gser cannot serialize an object of type Color"):
        gser.dumps({(1, 2): 0, Color.RED: 1})


def test_str_with_surrogates_is_an_error():
    with pytest.raises(gser.GserError, match="UTF-8"):
        gser.dumps("\ud800")


def test_families():
    obj = {"x": [1, 2, 3]}
    assert roundtrip(obj, families=("host",)) == obj
    assert roundtrip(obj, families="host") == obj
    assert roundtrip(obj, families=["device", "host"]) == obj
    with pytest.raises(gser.GserError) as e:
        gser.dumps(obj, families=("nope",))
    assert e.value.status_name == "GSER_ERR_UNKNOWN_FAMILY"
    with pytest.raises(TypeError):
        gser.dumps(obj, families=(1,))
    with pytest.raises(ValueError):
        gser.dumps(obj, families=())


# ---- large lists: converted to one typed array, or kept element-wise --------------------

N = 1_000_000


@pytest.mark.parametrize(
    "make",
    [
        lambda: [1.5] * N,
        lambda: [i * 0.25 for i in range(N)],
        lambda: list(range(-N // 2, N // 2)),
        lambda: [INT64_MAX, INT64_MIN] * (N // 2),
        lambda: [2**63 + i for i in range(N)],  # all above INT64_MAX: a uint64 array
        lambda: [True, False, False] * (N // 3),
        lambda: tuple([7] * N),
    ],
    ids=["floats_const", "floats", "ints", "int_edges", "uints", "bools", "int_tuple"],
)
def test_large_homogeneous_list_is_one_array(make):
    obj = make()
    header, frames = gser.dumps(obj)
    # one contiguous data frame: 8 bytes per number, 1 per bool, ints as
    # narrow as their range (wire-format 4.6); a tiny header
    assert len(frames) == 1
    width = 1 if type(obj[0]) is bool else 8
    if type(obj[0]) is int and -2**31 <= min(obj) and max(obj) < 2**31:
        width = next(w for w in (1, 2, 4) if -2**(8 * w - 1) <= min(obj) and max(obj) < 2**(8 * w - 1))
    assert frames[0].nbytes == len(obj) * width
    assert len(header) < 100
    out = gser.loads(header, frames)
    assert type(out) is type(obj)
    assert out == obj
    assert {type(x) for x in out} == {type(obj[0])}


@pytest.mark.parametrize(
    "make",
    [
        lambda: [1, 1.5, True, None] * (N // 4),
        lambda: [1.5] * (N - 1) + [1],
        lambda: [1] * (N - 1) + [True],
        lambda: [True] * (N - 1) + [1],
        lambda: [0] * (N - 1) + [2**63],
        lambda: [1.0] * (N - 1) + ["s"],
    ],
    ids=["cycle", "floats_then_int", "ints_then_bool", "bools_then_int", "ints_then_uint", "floats_then_str"],
)
def test_large_mixed_list_keeps_item_types(make):
    obj = make()
    header, frames = gser.dumps(obj)
    # not converted: element-wise, or (16 items and more of mixed scalars) a
    # "python.tree" packed list of typed columns, codes saying each item's type
    assert b"python.tree" in bytes(header) or frames == []
    out = gser.loads(header, frames)
    assert out == obj
    assert [type(x) for x in out] == [type(x) for x in obj]


def test_short_lists_keep_types():
    for obj in ([1.0], [1], [True], [1, True], [True, 1], [1.0, 1], [1, 2**63], [None, 0], [0.0] * 15,
                [0] * 17, [False] * 16, [2**63] * 16, (2**63, 1)):
        out = roundtrip(obj)
        assert out == obj and [type(x) for x in out] == [type(x) for x in obj], obj


def test_list_starting_with_uint():
    # the uint64 ext must not be taken for one of gser's markers
    for obj in ([2**63, 1], [2**64 - 1], [2**63, "x"], [[2**63, 2**63 + 1]], {"k": [2**64 - 1, None]}):
        out = roundtrip(obj)
        assert_same(obj, out)


def test_repeated_objects_are_shared_but_equal():
    x = roundtrip([1.5] * 100 + [2.5] * 100)
    assert x[0] is x[99] and x[100] is x[199] and x[0] == 1.5 and x[100] == 2.5
    y = roundtrip([-0.0, 0.0] * 10)
    assert [math.copysign(1, v) for v in y] == [-1.0, 1.0] * 10


# ---- versions, attributes ----------------------------------------------------------

def test_module_attributes():
    assert gser.__version__.count(".") == 2
    assert gser.WIRE_VERSION == 3  # written only when a frame is compressed; 2 otherwise
    assert issubclass(gser.GserError, ValueError)
    assert gser.DEPTH_MAX == 30


def test_gser_error_attributes():
    with pytest.raises(gser.GserError) as e:
        gser.loads(b"not a header", [])
    err = e.value
    assert err.status == -9 and err.status_name == "GSER_ERR_BAD_MAGIC"
    assert str(err).startswith("GSER_ERR_BAD_MAGIC: gser_deserialize:")
    assert "magic" in err.detail


def test_loads_argument_errors():
    header, frames = gser.dumps([1])
    with pytest.raises(TypeError):
        gser.loads(header, 5)
    with pytest.raises(TypeError, match="header"):
        gser.loads(object(), [])
    with pytest.raises(TypeError, match="frame 1"):
        gser.loads(header, [object()])
    with pytest.raises(TypeError):
        gser.from_bytes("text")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
