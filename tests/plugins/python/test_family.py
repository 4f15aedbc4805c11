"""gser.dask.dumps / loads as one C call each (_gser._family_dumps /
_family_loads): the same contract as the Python functions they replace
(gser.dask._py_dumps / _py_loads), which Dask finds as it found those."""

import inspect

import pytest

gser = pytest.importorskip("gser")
gd = pytest.importorskip("gser.dask")
pytest.importorskip("distributed")

OBJECTS = [1, "s", None, 2.5, [1, 2, 3], list(range(100)), {"a": (1, "x")}, {1, 2, 3},
           [(0.5, i, f"s{i}", None)[i % 4] for i in range(40)], b"x" * 100_000]


def test_dask_passes_the_context():
    # Dask's register_serialization_family asks has_keyword(dumps, "context").
    from distributed.utils import has_keyword

    assert has_keyword(gd.dumps, "context")
    assert list(inspect.signature(gd.dumps).parameters) == ["x", "context"]


@pytest.mark.parametrize("obj", OBJECTS, ids=[type(o).__name__ + str(i) for i, o in enumerate(OBJECTS)])
def test_as_the_python_functions(obj):
    for context in (None, {}, {"recipient": None}, {"recipient": {"gser": 1}}, {"recipient": {"gser": 1, "gser-device": 1}}):
        header, frames = gd.dumps(obj, context=context)
        h2, f2 = gd._py_dumps(obj, context)
        assert header == h2 == {"gser": 1, "compression": (None,) * len(frames)}
        assert [bytes(f) for f in frames] == [bytes(f) for f in f2]
        assert gd.loads(header, frames) == obj
        if not gd._RESTORE_DEVICE:
            assert gd._py_loads(header, frames) == obj
    # a new header each time: Dask adds "serializer" to it
    assert gd.dumps(obj)[0] is not gd.dumps(obj)[0]


def test_refusals_and_errors_as_the_python_functions():
    before = gd.stats()
    with pytest.raises(NotImplementedError, match="has not loaded gser"):
        gd.dumps(1, context={"recipient": {}})
    with pytest.raises(NotImplementedError, match="has not loaded gser"):
        gd.dumps(1, {"recipient": {"other": 1}})
    with pytest.raises(gser.Declined):
        gd.dumps([1] * 20 + [{"k": i} for i in range(200)])
    with pytest.raises(NotImplementedError) as e:
        gd.dumps(object())  # not a GserError: raised as it is
    assert type(e.value) is NotImplementedError and e.value.__cause__ is None
    with pytest.raises(NotImplementedError, match="gser cannot serialize this str: ") as e:
        gd.dumps("\ud800")  # a lone surrogate: the GserError is the cause
    assert isinstance(e.value.__cause__, gser.GserError) and e.value.__context__ is e.value.__cause__
    assert "not be encoded as UTF-8" in str(e.value)
    after = gd.stats()
    assert after["declined"] == before["declined"] + 1 and after["refused"] == before["refused"] + 2
    with pytest.raises(TypeError):
        gd.dumps()
    with pytest.raises(TypeError):
        gd.dumps(1, None, None)
    with pytest.raises(TypeError):
        gd.dumps(1, contxt=None)
    with pytest.raises(TypeError):
        gd.dumps(1, None, context=None)
    header, frames = gd.dumps({"a": 1})
    with pytest.raises(ValueError, match="header version 2"):
        gd.loads({"gser": 2}, frames)
    with pytest.raises(ValueError, match="header version None"):
        gd.loads({}, frames)
    with pytest.raises(ValueError, match="no frames"):
        gd.loads(header, [])
    with pytest.raises(gser.GserError):
        gd.loads(header, [b"not a gser header"])
    n = gd.stats()["loads"]
    assert gd.loads(header, frames) == {"a": 1} and gd.stats()["loads"] == n + 1
    n = gd.stats()["dumps"]
    gd.dumps(1)
    assert gd.stats()["dumps"] == n + 1


def test_mixed_lists_at_the_root_round_trip():
    # A mixed list at the root goes round twice (first as it is, then as a
    # "python.tree"): the second try takes the first one's count of its
    # kinds and str bytes. Every mix of kinds, non-ASCII strs, uints, other
    # items (under half, and over), a surrogate (item by item), as a list and
    # as a tuple, at the root and nested (counted again there).
    import random

    rng = random.Random(5)
    kinds = [lambda i: rng.random(), lambda i: i - 50, lambda i: f"s{i}", lambda i: "é€" * (i % 5), lambda i: None,
             lambda i: i % 2 == 0, lambda i: 2**64 - i, lambda i: ..., lambda i: [i], lambda i: {i}]
    cases = []
    for a in range(len(kinds)):
        for b in range(a + 1, len(kinds)):
            cases.append([(kinds[a], kinds[b])[i % 2](i) for i in range(40)])
    cases.append([(0.5, i, "x", [i], (i,), {"k": i})[i % 6] for i in range(60)])  # others over half
    cases.append([(0.5, i, "\udcff" if i == 7 else "s")[i % 3] for i in range(30)])  # a surrogate
    for x in cases:
        for y in (x, tuple(x), {"k": x}, [x, x]):
            try:
                header, frames = gd.dumps(y)
            except NotImplementedError:
                continue  # the surrogate: Dask's next family
            got = gd.loads(header, frames)
            assert got == y and type(got) is type(y), y
            assert [type(v) for v in (got if not isinstance(got, dict) else got["k"])] == \
                   [type(v) for v in (y if not isinstance(y, dict) else y["k"])]


def test_large_sets_round_trip_at_their_final_size():
    # Sets past the direct path's size through the family: ints (a typed
    # array), floats, strs, tuples and a mix (item lists), set and
    # frozenset, nested in a dict, come back equal, of their type, with the
    # table a set built by adding has (stdtypes.c presizes it).
    import itertools
    import sys

    for n in (1000, 3000):
        for items, cls in itertools.product(
                (range(-n // 2, n - n // 2), [i + 0.5 for i in range(n)], [f"s{i}" for i in range(n)],
                 [(i, f"k{i}") for i in range(n)], [(i, f"s{i}", i + 0.25)[i % 3] for i in range(n)]),
                (set, frozenset)):
            obj = {"x": cls(items), "n": len(items)}
            header, frames = gd.dumps(obj)
            got = gd.loads(header, frames)
            assert got == obj and type(got["x"]) is cls
            assert sys.getsizeof(got["x"]) == sys.getsizeof(cls(items))
