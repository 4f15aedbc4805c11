"""The family's direct path (plugins/python/src/direct.c): small plain
messages written from Python objects straight into msgpack and read
straight back. Its bytes are the general path's, byte for byte; what it
reads is what the general decoder gives (the same object, or the same
GserError naming the same path), for valid and for mangled headers alike."""

import datetime as dt
import decimal
import pickle
import random
import struct

import pytest

import gser
from gser import _gser

gser_dask = pytest.importorskip("gser.dask")
msgpack = pytest.importorskip("msgpack")

from test_stdtypes import HOSTILE, PACKED, VALUES, ext, same, std_values, tree  # noqa: E402


def counts():
    return _gser._direct(None)


def general_header(x):
    """The general path's header for x (gser.dumps is never direct)."""
    h, f = gser.dumps(x, families=("host",), strict=True)
    return bytes(h), f


def family(x):
    """gser.dask.dumps(x): (frames, whether the direct path wrote them), or
    (None, False) when the family declines."""
    before = counts()[0]
    try:
        _, frames = gser_dask.dumps(x)
    except NotImplementedError:
        return None, False
    return frames, counts()[0] > before


SMALL = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 2**200, 1.5, -0.0,
    float("inf"), "", "x", "é" * 40, "s" * 300, b"", b"b" * 300, [], (), {}, set(), frozenset(),
    [1, 2.5, "a", None, True], (2**64 - 1, 1), (2**63,), ((2**63, "x"),), {"a": (1, 2)}, {1: 2, None: 3, 1.5: 4},
    {b"k": 1, True: 2}, {(1, 2): 3}, {2**70: 1}, {frozenset({1}): [2]}, {1, 2, 3}, {"a", (1, 2), None},
    frozenset({"a"}), [2**70, 2**80], (2**70, -(2**90)), [2**70, 5], [2**64 - 1, 2**70], 1 + 2j, [1j, 2],
    [...], ..., {"k": {1: {2: [3, (4, {5})]}}}, [set(), frozenset()], [[[[[[[[1]]]]]]]], list(range(14)),
    tuple(range(14)), {i: str(i) for i in range(14)}, {(i,): i for i in range(14)},
    [{"id": 1, "name": "n"}, {"id": 2, "name": "m"}], [("k", 1, 0.5)] * 10,
    dt.datetime(2020, 1, 2, 3, 4, 5, 6), dt.datetime.min, dt.datetime.max, dt.datetime(2021, 11, 7, 1, 30, fold=1),
    [dt.datetime(2020, 1, 1), 1], {"t": dt.datetime(1999, 12, 31)}, {dt.datetime(2020, 1, 1): 1},
    [{"id": i, "name": f"n{i}", "t": dt.datetime(2020, 1, 1, i), "v": i / 3, "ok": i % 2 == 0} for i in range(10)],
    decimal.Decimal("1.00"), decimal.Decimal("-0"), decimal.Decimal("sNaN"), decimal.Decimal("-NaN123"),
    decimal.Decimal("-1E+999999999"), [decimal.Decimal(1), 2.5], {decimal.Decimal(2): "k"},
    [(1.5, 2, "s", dt.datetime(2020, 1, 1, i), decimal.Decimal(i))[i % 5] for i in range(10)],
]


def test_small_messages_go_direct():
    # the 10-element rows of bench_family.py that the direct path takes
    for x in [set(range(10)), frozenset(f"s{i}" for i in range(10)), {("x", i): i for i in range(10)},
              [2**70 + i for i in range(10)], [(f"k{i}", i, i / 3) for i in range(10)], [1.5, 2, "s", None] * 2,
              [...] * 10,
              [{"id": i, "name": f"n{i}", "t": dt.datetime(2020, 1, 1, i), "v": i / 3, "ok": i % 2 == 0}
               for i in range(10)],
              [(1.5, 2, "s", dt.datetime(2020, 1, 1, i), decimal.Decimal(i))[i % 5] for i in range(10)]]:
        frames, direct = family(x)
        assert direct, x
        assert len(frames) == 1
        before = counts()[1]
        assert same(gser_dask.loads({"gser": 1}, frames), x)
        assert counts()[1] == before + 1


def test_frames_as_a_comm_gives_them():
    # bytearray and memoryview headers (Dask's comms), in a list or a tuple
    frames, direct = family({"a": {1, 2}})
    for h in (bytearray(frames[0]), memoryview(bytes(frames[0])), memoryview(bytearray(frames[0]))):
        for seq in (list, tuple):
            before = counts()[1]
            assert gser_dask.loads({"gser": 1}, seq([h])) == {"a": {1, 2}}
            assert counts()[1] == before + 1


def test_first_list_of_decimals_in_a_process_is_packed():
    # before the module has imported decimal itself, a list of Decimals is
    # still left to the general path's packed list (the same bytes)
    import subprocess
    import sys
    code = ("import decimal, gser, gser.dask\n"
            "x = [{1}, [decimal.Decimal(1), decimal.Decimal(2)]]\n"
            "h, f = gser.dask.dumps(x)\n"
            "assert bytes(f[0]) == bytes(gser.dumps(x, families=('host',))[0])\n"
            "assert gser._gser._direct(None)[0] == 0\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_off_means_the_general_path():
    was = _gser._direct(False)
    try:
        before = counts()
        h, f = gser_dask.dumps({1, 2, 3})
        assert gser_dask.loads(h, f) == {1, 2, 3}
        assert counts() == before
    finally:
        _gser._direct(was)
    assert _gser._direct(None) == counts()


def test_what_it_does_not_take_goes_the_general_way():
    # 15 items and more (typed and packed arrays), types it does not write
    for x in [list(range(15)), set(range(20)), [dt.date(2020, 1, 1)], bytearray(b"x"),
              [dt.datetime(2020, 1, 1)] * 2, dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
              [decimal.Decimal(1), decimal.Decimal(2)],
              b"x" * 70_000, nested(18), "\udcff"]:
        frames, direct = family(x)
        assert not direct, x


def check_value(x):
    frames, direct = family(x)
    if not direct:
        return False
    want_header, want_frames = general_header(x)
    assert bytes(frames[0]) == want_header, x
    assert len(frames) == 1 and len(want_frames) == 0
    got = gser_dask.loads({"gser": 1}, frames)
    assert same(got, pickle.loads(pickle.dumps(x, protocol=5))), (x, got)
    return True


def test_same_bytes_as_the_general_path():
    values = list(SMALL)
    for vals in VALUES.values():
        values.extend(vals)
    values.extend(PACKED.values())
    direct = sum(check_value(x) for x in values)
    assert direct >= len(SMALL) - 5  # nearly all of SMALL; VALUES' other kinds go the general way


def test_same_bytes_property():
    hypothesis = pytest.importorskip("hypothesis")

    @hypothesis.settings(max_examples=400, deadline=None, derandomize=True,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(std_values(hypothesis.strategies))
    def check(x):
        check_value(x)

    before = counts()[0]
    check()
    assert counts()[0] > before + 50  # the strategy's small values went direct


def nested(n):
    x = 1
    for _ in range(n):
        x = [x]
    return x


def header(root):
    """A version-2 header with this root and no frames (the direct path's kind)."""
    return msgpack.packb([ext(1, b"GSER"), 2, root, []], use_bin_type=True)


def outcome(fn):
    try:
        return "ok", fn()
    except gser.GserError as e:
        return "error", (type(e), str(e))


def agree(h):
    """The family's loads (direct when it can) against the general decoder."""
    general = outcome(lambda: gser.loads(h, []))
    fam = outcome(lambda: gser_dask.loads({"gser": 1}, [h]))
    assert general[0] == fam[0], (h, general, fam)
    if general[0] == "ok":
        assert same(general[1], fam[1]), (h, general, fam)
    else:
        assert general[1] == fam[1], (h, general, fam)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_trees_through_the_family_name_the_path(name):
    h = header({"x": [0, tree(HOSTILE[name])]})
    with pytest.raises(gser.GserError) as e:
        gser_dask.loads({"gser": 1}, [h])
    assert "$.x[1]" in str(e.value) and e.value.status_name == "GSER_ERR_FORMAT", str(e.value)
    agree(h)


def u(n):
    return ext(3, struct.pack("<Q", n))


HOSTILE_DIRECT = [
    [ext(2), u(3), [1, 2]],                          # a tag outside a "python.tree": a tuple
    tree([ext(2), u(3), [[1]]]),                      # unhashable set item
    tree([ext(2), 3, [1]]),                           # an int first, not a uint: a tuple
    tree([ext(2), u(18), 1, False, [ext(5), 0, 2, 1, b"\x01" + b"\0" * 7], b"\x01"]),  # kind an int
    tree([ext(2), u(18), u(1), False, [1], b"\x01"]),  # lengths not an array
    tree([ext(2), u(18), u(1), False, [ext(5), 0, 3, 1, b"\x01" + b"\0" * 7], b"\x01"]),  # uint lengths
    tree([ext(2), u(18), u(1), False, [ext(5), 0, 2, 2, b"\x01" + b"\0" * 7], b"\x01"]),  # short data
    tree([ext(5), 0, 1, 2, b"\x00\x02"]),              # a bool of 2
    tree([ext(5), 0, 32, 2, b"\x00\x02"]),             # a narrow int array, inline
    tree([ext(5), u(0), 2, 1, b"\0" * 8]),             # a uint container
    [ext(6), "python.tree", "host", u(1), 0, 0, msgpack.packb(1)],   # a uint version
    [ext(6), "python.tree", "host", 2, 0, 0, msgpack.packb(1)],      # a version it cannot read
    [ext(6), "python.tree", "host", 1, 0, 1, msgpack.packb(1)],      # a frame it does not have
    [ext(6), "python.tree", "host", 1, 0, 0, msgpack.packb(1) + b"\x01"],  # bytes after the sub-header
    [ext(6), "python.tree", "host", 1, 0, 0, b""],                   # an empty sub-header
    [ext(6), "python.tree", "host", 1, 0, 0, "not bin"],
    [ext(6), "python.tree", "device", 1, 0, 0, msgpack.packb(1)],
    [ext(6), "nope", "host", 1, 0, 0, msgpack.packb(1)],
    {"k": [ext(2)]},
    tree([ext(2), u(6), u(2020 << 46 | 1 << 42 | 1 << 37), None]),  # datetime fields a uint
    tree([ext(2), u(6), 2020 << 46 | 13 << 42 | 1 << 37, None]),     # month 13
    tree([ext(2), u(6), -1, None]),
    tree([ext(2), u(6), 2020 << 46 | 1 << 42 | 1 << 37, 5]),         # a tzinfo of 5
    tree([ext(2), u(6), 2020 << 46 | 1 << 42 | 1 << 37]),            # no tzinfo field
    tree([ext(2), u(6), 2020 << 46 | 1 << 42 | 1 << 37 | 3 << 60, None]),  # fold 3
    tree([ext(2), u(12), "1.2.3"]),                                  # a Decimal that is not one
    tree([ext(2), u(12), 5]),
    tree([ext(2), u(12), b"1"]),
    tree([ext(2), u(12), "1", "2"]),
    # sets and frozensets are built as their items come: an unhashable item
    # after the first, duplicates, nesting, the wrong field shapes
    tree([ext(2), u(3), [1, [2]]]),
    tree([ext(2), u(4), ["a", "b", {"c": 1}]]),
    tree([ext(2), u(3), [1, 1, 2, 1]]),
    tree([ext(2), u(3), [[ext(2), u(4), [1, 2]], 3, [ext(2), u(4), []]]]),
    tree([ext(2), u(3), [[ext(2), u(3), [1]]]]),       # a set in a set: unhashable
    tree([ext(2), u(3), [1], [2]]),                   # a field too many
    tree([ext(2), u(4), [ext(2), 1, 2]]),             # a tuple, not a list
    tree([ext(2), u(3), []]), tree([ext(2), u(4), []]),
    tree([[ext(2), u(3), [1, 2]], [ext(2), u(4), [[ext(2), u(1), (2**70).to_bytes(10, "little", signed=True)], u(2**64 - 1)]]]),
    tree([ext(2), u(5), [[ext(2), u(4), [1]]], [2]]),  # a frozenset as a dict key
    # fractions and ranges
    tree([ext(2), u(14), 3, 7]), tree([ext(2), u(14), 6, 14]), tree([ext(2), u(14), 1, 0]),
    tree([ext(2), u(15), 1, 9, 2]), tree([ext(2), u(15), 1, 9, 0]),
    [ext(4)], [ext(2), ext(2)], [1, ext(2)], {"a": ext(2)}, ext(2), ext(9), ext(3, b"\0" * 4),
    [ext(1, b"GSER")], nested(31), nested(17),
]


@pytest.mark.parametrize("i", range(len(HOSTILE_DIRECT)))
def test_hostile_headers_agree_with_the_general_decoder(i):
    agree(header(HOSTILE_DIRECT[i]))


def test_headers_read_from_their_root_agree():
    # the reader takes [magic, 2, root, []] by reading the root between the
    # fixed bytes and the frames' last 0x90: what is not exactly that agrees
    sub = msgpack.packb([ext(2), u(3), [1, 2]], use_bin_type=True)
    obj = b"\x97\xc7\x00\x06\xabpython.tree\xa4host\x01\x00\x00\xc4" + bytes([len(sub)]) + sub
    start = b"\x94\xd6\x01GSER\x02"
    for h in [start + b"\x01\x90", start + b"\x01\x90\x90", start + b"\x01\xdc\x00\x00", start + b"\x90",
              start + b"\x91\x90", start + obj + b"\x90", start + obj + b"\x90\x90", start + obj[:-1] + b"\x90",
              start + obj + b"\x91\x90", start + obj + b"\xdc\x00\x00", start + b"\x92" + obj + obj + b"\x90",
              start + obj[:-len(sub) - 2] + b"\xc5\x00" + bytes([len(sub)]) + sub + b"\x90",
              start + obj[:-len(sub) - 2] + b"\xc4" + bytes([len(sub) + 1]) + sub + b"\x90"]:
        agree(h)
    assert gser_dask.loads({"gser": 1}, [start + obj + b"\x90"]) == {1, 2}
    assert gser_dask.loads({"gser": 1}, [start + b"\x91\x90\x90"]) == [[]]


def test_each_header_dict_is_its_own():
    # the direct path's header dict is a copy of one made once: Dask sets
    # keys of the one it gets ("serializer", "compression", split offsets)
    h1, _ = gser_dask.dumps({1, 2})
    assert h1 == {"gser": 1, "compression": (None,)}
    h1["serializer"] = "gser"
    h1["compression"] = ("lz4",)
    del h1["gser"]
    h2, f2 = gser_dask.dumps({1, 2})
    assert h2 == {"gser": 1, "compression": (None,)} and h2 is not h1
    assert gser_dask.loads(h2, f2) == {1, 2}


def test_map_keys_that_are_containers_are_refused():
    # msgpack-python cannot write them: a map {[1]: 2} and {[ext(2), 1]: 2} by hand
    for key in (b"\x91\x01", b"\x92\xc7\x00\x02\x01", b"\x80"):
        h = b"\x94\xd6\x01GSER\x02" + b"\x81" + key + b"\x02" + b"\x90"
        agree(h)
        with pytest.raises(gser.GserError):
            gser_dask.loads({"gser": 1}, [h])


def test_mangled_headers_agree_with_the_general_decoder():
    """Byte flips, truncations and splices of headers the direct path writes:
    whatever the general decoder makes of each (an object or a GserError
    naming a path), the family's loads makes the same."""
    rng = random.Random(39)
    bases = []
    for x in [set(range(10)), {("x", i): i for i in range(5)}, [2**70 + i for i in range(4)], ([1, "a"], {"k": None}),
              {"a": [1, 2.5, (3, frozenset({4}))], b"b": {1: 2}}, [1 + 2j, ..., 2**64 - 1], (2**63, 5),
              [{"t": dt.datetime(2020, 1, 1, i, fold=i % 2), "x": i} for i in range(3)],
              [decimal.Decimal("1.5"), 2, decimal.Decimal("-NaN7")]]:
        frames, direct = family(x)
        assert direct, x
        bases.append(bytes(frames[0]))
    for _ in range(3000):
        h = bytearray(rng.choice(bases))
        op = rng.randrange(4)
        if op == 0:
            for _ in range(rng.randint(1, 3)):
                h[rng.randrange(8, len(h))] = rng.randrange(256)
        elif op == 1:
            del h[rng.randrange(8, len(h)):]
        elif op == 2:
            i = rng.randrange(8, len(h))
            h[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        else:
            i, j = sorted(rng.randrange(8, len(h)) for _ in range(2))
            h[i:j] = h[j:]
        agree(bytes(h))


# Ints at the edges of the direct path's fast reads and writes (small_int:
# one and two 30-bit digits, and the one-byte fixints), as scalars, in sets,
# lists, tuples (a uint first escapes it), dict keys and values, tuple keys.
EDGE_INTS = [0, 1, -1, 127, 128, -32, -33, 255, 256, 2**29, 2**30 - 1, 2**30, -(2**30), -(2**30) - 1,
             2**31, 2**59, 2**60 - 1, 2**60, -(2**60) + 1, -(2**60), 2**62, 2**63 - 1, -(2**63), 2**63,
             2**64 - 1, 2**64, -(2**63) - 1]


@pytest.mark.parametrize("i", EDGE_INTS)
def test_edge_ints_same_bytes_as_the_general_path(i):
    for x in [i, [i], [i, 0], [0, i], (i,), (i, "x"), {i}, {i, -i, 1}, frozenset({i, 3}), {i: i}, {"k": i},
              {(i, "x"): i, ("x", i): -i}, [i, -i, i // 3, 5], ({i}, [i])]:
        assert check_value(x), x


def test_items_read_in_place_agree_with_the_general_decoder():
    # a list's, a set's, a dict's values' and a plain tuple's items past the
    # first are read without their field checks: still only items
    for root in [[1, ext(2)], [1, [ext(2)]], tree([ext(2), u(3), [1, ext(2)]]), tree([ext(2), u(3), [1, 2, [3]]]),
                 tree([ext(2), u(5), [[ext(2), 1], [ext(2), 2]], [3, ext(2)]]),
                 tree([ext(2), u(5), [[ext(2), 1], [ext(2), 2]], [3, [4]]]),
                 tree([ext(2), u(5), [[ext(2), 1], [ext(2), 1]], [3, 4]]),
                 tree([ext(2), u(5), [[ext(2), 1], [ext(2), 2]], [3, 4, 5]]),
                 tree([ext(2), u(5), [[ext(2), 1], [ext(2), 2]], [3]]),
                 [ext(2), 1, u(2), ext(2)], [ext(2), "a", u(3), [1]], tree([ext(2), "a", u(3), [1]]),
                 tree([ext(2), 1, u(2)]), tree([ext(2), 1, 2, [ext(2), u(3), [1, 2]]])]:
        agree(header(root))


def lens(*ns, container=0, kind=2):
    return [ext(5), container, kind, len(ns), struct.pack(f"<{len(ns)}q", *ns)]


def test_packed_int_lengths_read_as_bytes_agree_with_the_general_decoder():
    # a packed list's lengths are read from the int array's bytes where they
    # stand (its tag's field 4), and only there
    b = (2**70).to_bytes(10, "little", signed=True) + (-(2**70)).to_bytes(10, "little", signed=True)
    for root in [tree([ext(2), u(18), u(1), False, lens(10, 10), b]),       # what the writers put
                 tree([ext(2), u(18), u(1), True, lens(10, 10, container=1), b]),  # a tuple of lengths
                 tree([ext(2), u(18), u(1), False, lens(10, 11), b]),       # past the bytes
                 tree([ext(2), u(18), u(1), False, lens(10, 9), b]),        # short of them
                 tree([ext(2), u(18), u(1), False, lens(20, 0), b]),        # a length 0
                 tree([ext(2), u(18), u(1), False, lens(30, -10), b]),      # a negative one
                 tree([ext(2), u(18), u(1), False, lens(10, 10, kind=3), b]),  # uint lengths
                 tree([ext(2), u(18), u(1), False, lens(10, 10, kind=4), b]),  # float lengths
                 tree([ext(2), u(18), u(1), False, [10, 10], b]),           # a list, not an array
                 tree([ext(2), u(18), u(1), False, lens(10, 10), lens(10, 10)]),  # bytes an array
                 tree([ext(2), u(18), u(1), lens(10, 10), lens(10, 10), b]),  # an array as the tuple flag
                 tree([ext(2), u(18), u(1), False, b, b]),
                 tree([lens(10, 10), [ext(2), u(18), u(1), False, lens(10, 10), b], lens(3)]),
                 tree({"k": lens(1, 2, 3)}), tree((1, 2, lens(4), lens(5)))]:
        agree(header(root))
    for flag, want in ((True, (2**70, -(2**70))), (False, [2**70, -(2**70)])):
        before = counts()[1]
        assert gser_dask.loads({"gser": 1}, [header(tree([ext(2), u(18), u(1), flag, lens(10, 10), b]))]) == want
        assert counts()[1] == before + 1  # read by the direct path
    frames, direct = family([2**70, -(2**70), 5])
    assert direct and gser_dask.loads({"gser": 1}, frames) == [2**70, -(2**70), 5]
