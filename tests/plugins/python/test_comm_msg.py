"""Whole Dask messages encoded by gser on gser:// ("dask.msg", gser.comm):
the receiver gets what Dask's tcp:// gives it, message by message, in the
Dask version installed: plain values (lists back as tuples), to_serialize,
ToPickle, Serialized and Pickled parts, pass-through on a deserialize=False
comm (the scheduler's), the "error" family, on_error, offloading, messages
gser declines (Dask's frames, marked on the wire), a peer that does not
speak it, and hostile parts."""

import asyncio
import collections
import enum
import logging
import pickle

import pytest

import gser

np = pytest.importorskip("numpy")
distributed = pytest.importorskip("distributed")
pytestmark = [
    pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)"),
    pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:There is no current event loop:DeprecationWarning"),
]

import dask  # noqa: E402
import gser.comm  # noqa: E402
import gser.dask  # noqa: E402,F401  (registers gser://)
from distributed.comm import CommClosedError, connect, listen  # noqa: E402
from distributed.comm.utils import OFFLOAD_THRESHOLD  # noqa: E402
from distributed.protocol import Serialized, to_serialize  # noqa: E402
from distributed.protocol.serialize import Pickled, Serialize, ToPickle, serialize  # noqa: E402


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def pair(scheme, deserialize=True, host="127.0.0.1"):
    """(client side, server side), Dask's handshake done. host 127.0.0.2: a
    listener at another address than the client's (127.0.0.1), so that Dask
    (2023 on) takes the peer for another host's."""
    q = asyncio.Queue()

    async def handle(comm):
        await q.put(comm)

    async with listen(f"{scheme}://{host}", handle, deserialize=deserialize) as listener:
        client = await connect(listener.contact_address, deserialize=deserialize)
    return client, await q.get()


def _handshake(msg):
    return type(msg) is dict and "pickle-protocol" in msg


class Paths:
    """Counts the messages that took Dask's frames (to_frames/from_frames) in
    gser.comm, Dask's handshakes (always Dask's frames) aside."""

    def __init__(self, monkeypatch):
        self.to = self.frm = 0
        to_frames, from_frames = gser.comm.to_frames, gser.comm.from_frames

        async def counted_to(msg, *a, **k):
            self.to += not _handshake(msg)
            return await to_frames(msg, *a, **k)

        async def counted_from(*a, **k):
            out = await from_frames(*a, **k)
            self.frm += not _handshake(out)
            return out

        monkeypatch.setattr(gser.comm, "to_frames", counted_to)
        monkeypatch.setattr(gser.comm, "from_frames", counted_from)


@pytest.fixture
def paths(monkeypatch):
    return Paths(monkeypatch)


async def through(scheme, msgs, deserialize=True, **write_kw):
    """What the server side reads of each message (or the exception), the
    comm still open after each."""
    client, server = await pair(scheme, deserialize)
    out = []
    try:
        for m in msgs:
            try:
                await client.write(m, **write_kw)
                out.append(await server.read())
            except Exception as e:  # noqa: BLE001 (compared with tcp's)
                out.append(e)
            assert not server.closed()
    finally:
        await client.close()
        await server.close()
    return out


def same(a, b):
    """Equal, and of the same types all the way down (tuples stay tuples)."""
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and str(a) == str(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(type(k) is type(j) for k, j in zip(a, b)) and all(
            same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) and (
            a.flags.writeable == b.flags.writeable)
    if isinstance(a, Serialized):
        return same(a.header, b.header) and [bytes(f) for f in a.frames] == [bytes(f) for f in b.frames]
    if isinstance(a, memoryview):
        return bytes(a) == bytes(b)
    return a == b


PLAIN = [
    {"op": "plain", "a": [1, 2, [3, "s"]], "b": (1.5, None, True), "c": b"bytes", "s": "\u00e9t\u00e9"},
    {"keys": {1: "int key", None: 2.0, 2.5: False, b"k": [], "": ()}, "deep": [[[[{"x": [()]}]]]]},
    {"ints": list(range(100)), "floats": [float(i) for i in range(50)], "bools": [True] * 20,
     "mixed": [1, "a", 2.0, None, b"b"] * 10, "big": 2**64 - 1, "neg": -2**63},
    {"large bytes": b"x" * (1 << 17), "nested tuple": ((1, 2), [3, (4,)])},
    [1, "list root"],
    "a str root",
    None,
]


@pytest.mark.parametrize("deserialize", [True, False])
def test_plain_messages_as_tcp(paths, deserialize):
    tcp = run(through("tcp", PLAIN, deserialize))
    got = run(through("gser", PLAIN, deserialize))
    assert paths.to == paths.frm == 0  # every message went whole through gser
    for m, t, g in zip(PLAIN, tcp, got):
        assert same(t, g), (m, t, g)
    assert type(got[0]["a"]) is tuple and type(got[0]["c"]) is bytes  # Dask's msgpack: use_list=False


class Opaque:  # picklable, no gser or dask family
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Opaque and other.x == self.x


def parts():
    arr = np.arange(1000, dtype="f8").reshape(10, 100)
    ser = serialize(np.arange(5), serializers=("dask", "pickle"))
    return [
        {"op": "s", "x": to_serialize(arr), "y": [to_serialize(np.int64(7)), to_serialize(Opaque(1))]},
        {"op": "p", "x": ToPickle(Opaque(2)), "y": Pickled(*_pickled(Opaque(3)))},
        {"op": "sd", "x": Serialized(*ser), "nested": {"k": (to_serialize({"a": b"b"}), 1)}},
        {"op": "big", "x": to_serialize(np.ones(1 << 18))},
    ]


def _pickled(obj):
    frames = []
    header = {"pickled-obj": pickle.dumps(obj, protocol=5, buffer_callback=lambda b: frames.append(b.raw()))}
    return header, frames


@pytest.mark.parametrize("deserialize", [True, False])
def test_parts_as_tcp(paths, deserialize):
    # The serializers and Dask's compression tcp:// uses (gser:// prefers the
    # gser family and compresses in the transport): the same sub-headers and
    # frames, for Serialized parts.
    kw = {"serializers": ("dask", "pickle")}
    with dask.config.set({"distributed.comm.compression": None}):
        tcp = run(through("tcp", parts(), deserialize, **kw))
        got = run(through("gser", parts(), deserialize, **kw))
    assert paths.to == paths.frm == 0
    for t, g in zip(tcp, got):
        assert same(t, g), (t, g)
    if deserialize:
        assert got[0]["x"].shape == (10, 100) and got[1]["x"] == Opaque(2) and got[1]["y"] == Opaque(3)
    else:  # the scheduler's side: passed through, never deserialized; pickles unpickled as Dask does
        assert type(got[0]["x"]) is Serialized and type(got[2]["nested"]["k"][0]) is Serialized


@pytest.mark.parametrize("deserialize", [True, False])
def test_parts_default_serializers(paths, deserialize):
    """With the comm's own serializers (the gser family first)."""
    got = run(through("gser", parts(), deserialize))
    assert paths.to == paths.frm == 0
    if deserialize:
        assert np.array_equal(got[0]["x"], np.arange(1000, dtype="f8").reshape(10, 100))
        assert got[0]["y"][1] == Opaque(1) and got[1]["x"] == Opaque(2) and got[2]["nested"]["k"][0] == {"a": b"b"}
    else:
        assert type(got[0]["x"]) is Serialized and got[0]["x"].header["serializer"] == "gser"


def test_scheduler_forwards_serialized(paths):
    """Serialized parts read on a deserialize=False comm and written on to a
    worker come back as the objects, as through tcp://."""
    async def go():
        c1, sched = await pair("gser", deserialize=False)
        c2, worker = await pair("gser", deserialize=True)
        arr = np.arange(12, dtype="i4").reshape(3, 4)
        await c1.write({"op": "task", "run": to_serialize(arr), "o": to_serialize(Opaque(5))})
        msg = await sched.read()
        assert type(msg["run"]) is Serialized
        await c2.write(msg)
        out = await worker.read()
        for c in (c1, sched, c2, worker):
            await c.close()
        return out
    out = run(go())
    assert paths.to == paths.frm == 0
    assert np.array_equal(out["run"], np.arange(12, dtype="i4").reshape(3, 4)) and out["o"] == Opaque(5)


class Unserializable:
    def __reduce__(self):
        raise TypeError("cannot pickle this")


@pytest.mark.parametrize("on_error", ["message", "raise"])
def test_error_family_as_tcp(paths, on_error):
    msgs = [{"op": "bad", "x": to_serialize(Unserializable())}, {"op": "after"}]
    tcp = run(through("tcp", msgs, on_error=on_error))
    got = run(through("gser", msgs, on_error=on_error))
    assert type(got[0]) is type(tcp[0]) and isinstance(got[0], Exception)
    assert same(got[1], tcp[1]) and got[1] == {"op": "after"}  # the comm goes on
    if on_error == "message":  # written as the "error" family; the reader raises Dask's TypeError
        assert isinstance(got[0], TypeError) and str(got[0]) == str(tcp[0])
    assert paths.to == 0  # the error is Dask's own, not a message gser declined


DECLINED = [
    {"op": "huge int", "i": 2**70},
    {"op": "huge int key", "k": {2**70: 1}},
    {"op": "huge int in a set", "s": {2**70}},
    {"op": "np scalar", "i": np.int64(7)},  # not an int subclass: Dask raises (2022.12) or pickles it (2026)
    {"__Set__": True, "as-list": [1, 2]},  # a dict Dask's loads acts on
    {"op": "magic subclass", "x": collections.Counter({"__Set__": 1})},  # Dask's loads fails on it
    {"op": "str subclass in a frozenset", "x": frozenset({type("S", (str,), {})("a")})},  # 2026: pickled as it is
    {"op": "bytearray", "x": bytearray(b"ab")},
]


def test_declined_go_as_dask_frames(paths):
    tcp = run(through("tcp", DECLINED))
    paths.to = paths.frm = 0
    got = run(through("gser", DECLINED))
    for m, t, g in zip(DECLINED, tcp, got):
        assert same(t, g), (m, t, g)
    assert paths.to == len(DECLINED)
    assert paths.frm == sum(not isinstance(t, Exception) for t in tcp)


def _std_msgs():
    """Messages holding Python's standard types: what Dask's msgpack carries
    itself (tuple dict keys, sets), and what Dask 2026.x pickles and 2022.12
    refuses (the rest)."""
    import datetime
    import decimal
    import fractions
    import uuid
    import zoneinfo

    dt = datetime.datetime(2020, 1, 2, 3, 4, 5, 6)
    return [
        # Dask 2026's heartbeats and update-graph: metrics keyed by tuples
        {"op": "heartbeat", "metrics": {("execute", "x", "thread-cpu", "seconds"): 1.5, ("a", ("b", 1)): [2, [3]]}},
        {"op": "set", "s": {1, 2, 3}, "l": [1, [2]], "st": {(1, "a"), ("b", (2,))}, "empty": set()},
        [{1}, {("t", 1): "v"}, ({"nested": {("k",): [1]}},)],
        {"tags": {(2**64 - 1, 1): (2**64 - 1, "x")}, "u": [2**64 - 1, 2]},  # uint first: not a tag
        {"fs": frozenset({1, (2, 3)}), "c": 1 + 2j, "l": [[1]]},
        {"dt": dt, "tz": dt.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=2), "X")),
         "zi": dt.replace(tzinfo=zoneinfo.ZoneInfo("Europe/Paris")), "d": dt.date(), "t": dt.time(),
         "td": datetime.timedelta(3, 4, 5)},
        {"dec": decimal.Decimal("-1.25E+7"), "uuid": uuid.UUID(int=12345), "frac": fractions.Fraction(-2, 3),
         "range": range(1, 10, 3), "slice": slice(1, [2, [3]], None), "ell": ...},
        {"keys": {frozenset({1}): 1, (datetime.date(2020, 1, 1), 1): [2]}, "sf": {frozenset({2**70})}},
        {"pickled exactly": slice({"__Set__": True, "as-list": [1]}, 2**70)},  # no Dask hook inside
    ]


# What Dask's msgpack carries in every version (no pickling, no error).
_STD_MSGPACK = 4


@pytest.mark.parametrize("deserialize", [True, False])
def test_standard_types_as_tcp(paths, deserialize):
    """Standard types inside a Dask message: the receiver gets what tcp://
    gives it in this Dask version (tuple keys and sets as Dask's msgpack
    gives them, lists in them as tuples; in 2026.x what Dask pickles exactly
    as it went, in 2022.12 Dask's error), gser carrying every message Dask
    does not refuse, never pickling."""
    msgs = _std_msgs()
    tcp = run(through("tcp", msgs, deserialize))
    paths.to = paths.frm = 0
    got = run(through("gser", msgs, deserialize))
    for m, t, g in zip(msgs, tcp, got):
        assert same(t, g), (m, t, g)
    refused = sum(isinstance(t, Exception) for t in tcp)
    assert not any(isinstance(t, Exception) for t in tcp[:_STD_MSGPACK])
    assert refused == (0 if gser.comm._DASK_PICKLES else len(msgs) - _STD_MSGPACK)
    assert paths.to == refused and paths.frm == 0  # only what Dask refuses took Dask's frames
    assert type(got[0]["metrics"][("a", ("b", 1))]) is tuple and type(got[1]["s"]) is set


def test_standard_types_never_pickled(paths, monkeypatch):
    """What Dask 2026.x would pickle, gser carries as data: no pickle.dumps
    or loads on either side."""
    if not gser.comm._DASK_PICKLES:
        pytest.skip("this Dask refuses them (tested above)")
    import datetime

    def refuse(*a, **k):
        raise AssertionError("pickled")
    monkeypatch.setattr(gser.comm._dask_protocol.pickle, "dumps", refuse)
    monkeypatch.setattr(gser.comm._dask_protocol.pickle, "loads", refuse)
    msg = {"dt": datetime.date(2020, 1, 1), "fs": frozenset({1}), "c": 1j, "l": [1]}
    got = run(through("gser", [msg]))[0]
    assert got == {"dt": datetime.date(2020, 1, 1), "fs": frozenset({1}), "c": 1j, "l": (1,)}
    assert paths.to == paths.frm == 0


@pytest.mark.parametrize("deserialize", [True, False])
def test_standard_types_with_parts(paths, deserialize):
    """Parts beside standard types: met again when the message is encoded
    again as a "python.tree", serialized once, rebuilt as Dask does."""
    calls = []
    dumps = gser.comm._dask_protocol.dumps

    def counted(*a, **k):
        calls.append(a[0])
        return dumps(*a, **k)
    msg = {"op": "update", "x": to_serialize(np.arange(4)), "keys": {("x", 0): to_serialize(Opaque(1))},
           "s": {("x", 1)}, "p": [ToPickle(Opaque(2))]}
    tcp = run(through("tcp", [msg], deserialize, serializers=("dask", "pickle")))
    paths.to = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gser.comm._dask_protocol, "dumps", counted)
        got = run(through("gser", [msg], deserialize, serializers=("dask", "pickle")))
    assert paths.to == 0 and len(calls) == 3  # one dumps per part
    t, g = tcp[0], got[0]
    assert g["s"] == t["s"] == {("x", 1)} and list(g["keys"]) == [("x", 0)]
    if deserialize:
        assert np.array_equal(g["x"], np.arange(4)) and g["keys"][("x", 0)] == Opaque(1) and g["p"] == (Opaque(2),)
    else:
        assert type(g["x"]) is Serialized and type(g["keys"][("x", 0)]) is Serialized
        assert same(t["x"], g["x"])


class _IE(enum.IntEnum):
    A = 1
    BIG = 2**64 - 1


_NT = collections.namedtuple("_NT", "a b")


@pytest.mark.parametrize("deserialize", [True, False])
def test_subclasses_as_base_types(paths, deserialize):
    """What Dask's msgpack packs as its base type (it does not ask for strict
    types) arrives as the base type through gser too: Dask 2026's heartbeats
    carry a Counter."""
    msgs = [
        {"op": "heartbeat_worker", "metrics": {"task_counts": collections.Counter("aab"), ("a", 1): 2.0}},
        {"o": collections.OrderedDict(b=1, a=[2]), "d": collections.defaultdict(list, {"x": [1]})},
        {"nt": _NT(1, [2]), "sub": type("L", (list,), {})([1, (2,)])},
        {"ie": _IE.A, "l": [_IE.A, 3], "s": type("S", (str,), {})("x"), "f": type("F", (float,), {})(1.5),
         "np": np.float64(2.5)},  # a float subclass
        {"keys": {(type("S", (str,), {})("a"), _IE.A): 1}, "big": (_IE.BIG, "x")},  # a uint first: not a tag
    ]
    tcp = run(through("tcp", msgs, deserialize))
    paths.to = paths.frm = 0
    got = run(through("gser", msgs, deserialize))
    for m, t, g in zip(msgs, tcp, got):
        assert same(t, g), (m, t, g)
    assert paths.to == paths.frm == 0
    assert type(got[0]["metrics"]["task_counts"]) is dict and type(got[3]["ie"]) is int


def test_part_as_dict_key_declined(paths):
    """A part as (in) a dict key is left to Dask's frames."""
    msgs = [{"k": {(1, ToPickle(2)): 1}}]
    tcp = run(through("tcp", msgs))
    paths.to = 0
    got = run(through("gser", msgs))
    assert same(tcp[0], got[0]) and paths.to == 1


def test_declined_after_parts_serializes_once(paths, monkeypatch):
    """A message declined after a part was met costs no serialization of it
    on gser's side (parts are serialized once the tree is built)."""
    calls = []
    dumps = gser.comm._dask_protocol.dumps

    def counted(*a, **k):
        calls.append(a[0])
        return dumps(*a, **k)
    monkeypatch.setattr(gser.comm._dask_protocol, "dumps", counted)
    got = run(through("gser", [{"x": to_serialize(np.arange(3)), "k": {("t", 1): 1}, "big": 2**70}]))
    assert isinstance(got[0], OverflowError)  # Dask's msgpack refuses the int (after gser met the part)
    assert calls == [] and paths.to == 1


def test_offload_large(paths, monkeypatch):
    """A message larger than distributed.comm.offload (by dask.sizeof, as
    Dask measures it) is serialized and deserialized on Dask's offload
    thread, as tcp:// does it; a small one on the event loop."""
    import threading

    used = []
    offload = gser.comm._dask_comm_utils.offload

    async def counted(fn, *a, **k):
        used.append(fn)
        return await offload(fn, *a, **k)
    monkeypatch.setattr(gser.comm._dask_comm_utils, "offload", counted)
    threads = []

    class Rec:
        pass

    from distributed.protocol.serialize import dask_deserialize, dask_serialize

    @dask_serialize.register(Rec)
    def _s(x):
        threads.append(("s", threading.current_thread() is threading.main_thread()))
        return {}, [b"r"]

    @dask_deserialize.register(Rec)
    def _d(header, frames):
        threads.append(("d", threading.current_thread() is threading.main_thread()))
        return Rec()

    msgs = [{"op": "big", "pad": b"x" * (OFFLOAD_THRESHOLD + 1), "x": to_serialize(Rec())},
            {"op": "small", "x": to_serialize(Rec())}]
    tcp = run(through("tcp", msgs, serializers=("dask",)))
    on_tcp, threads[:] = list(threads), []
    got = run(through("gser", msgs, serializers=("dask",)))
    assert paths.to == paths.frm == 0
    assert type(got[0]["x"]) is Rec and got[0]["pad"] == tcp[0]["pad"]
    assert threads == on_tcp == [("s", False), ("d", False), ("s", True), ("d", True)]
    assert len(used) == 2 + 2  # tcp's to_frames and from_frames, gser's two


def test_old_peer_gets_dask_frames(paths, monkeypatch):
    """A peer whose handshake does not announce gser-msg (an older gser)
    gets, and sends, Dask's frames; both ways work."""
    class Old(gser.comm.GserComm):
        def handshake_info(self):
            info = super().handshake_info()
            del info[gser.comm._MSG_KEY]
            return info
    monkeypatch.setattr(gser.comm.GserConnector, "comm_class", Old)

    async def go():
        client, server = await pair("gser")
        assert client.handshake_options[gser.comm._MSG_KEY] is False
        assert server.handshake_options[gser.comm._MSG_KEY] is False
        await client.write({"a": [1], "x": to_serialize(np.arange(3))})
        a = await server.read()
        await server.write({"b": (2,)})
        b = await client.read()
        await client.close()
        await server.close()
        return a, b
    a, b = run(go())
    assert a["a"] == (1,) and np.array_equal(a["x"], np.arange(3)) and b == {"b": (2,)}
    assert paths.to == paths.frm == 2


HOSTILE = [
    (7, b"\x80"),                    # a kind that is neither
    (0, "a str header"),
    (0, b"\x81", 12),                # a frame that is not bytes
    (1, b"\x81", "a str frame"),
    ("kind", b"h"),
    (0,),                            # too short (refused by the sender's encoder: not sent)
    (0, ToPickle(1)),                # a part inside a part (refused by the sender's encoder: not sent)
]


@pytest.mark.parametrize("reply", HOSTILE, ids=[repr(h)[:30] for h in HOSTILE])
def test_hostile_parts_close_the_comm(reply, caplog):
    """A peer that sends malformed parts closes the comm (CommClosedError on
    read, a GserError inside), never a crash or an exception of its making."""
    async def go():
        client, server = await pair("gser")
        ep = client._ep
        try:
            owner, _ = ep._c.prepare({"x": ToPickle(1)}, None, None, parts=(gser.comm._PART_TYPES, lambda o: reply))
        except TypeError:
            assert len(reply) < 2
            return None
        except NotImplementedError as e:
            assert "inside a Dask part" in str(e)
            return None
        client._post(ep.send_nowait, owner)
        with pytest.raises(CommClosedError) as e:
            await server.read()
        assert server.closed()
        await client.close()
        return e.value
    with caplog.at_level(logging.CRITICAL):
        e = run(go())
    if e is not None:
        assert "dask.part" in str(e)


def test_plain_loads_refuses_dask_msg():
    """A "dask.msg" is loaded only by a Dask comm: elsewhere GserError."""
    async def go():
        client, server = await pair("gser")
        ep = client._ep
        owner, _ = ep._c.prepare({"x": 1}, None, None, parts=(gser.comm._PART_TYPES, None))
        client._post(ep.send_nowait, owner)
        with pytest.raises(gser.GserError, match="dask.msg"):
            await server._ep.recv()  # a plain endpoint receive
        await client.close()
        server.abort()
    run(go())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compression_setting_followed_write_by_write():
    """distributed.comm.compression is read at every write (gser.comm caches
    what a setting means, never the setting): dask.config.set in a context,
    nested ones, leaving them, and a change made in Dask's config dict itself
    each hold from the next write on, on one comm (towards another address:
    towards this host's own, current Dask compresses nothing)."""
    cfg = dask.config.config["distributed"]["comm"]

    async def main():
        client, server = await pair("gser", host="127.0.0.2")
        seen = []

        async def write():
            msg = {"op": "x", "data": b"abc" * 100}
            await client.write(msg)
            assert same(await server.read(), msg)
            seen.append(client._ep.compression)

        try:
            await write()  # "auto" on loopback: none
            with dask.config.set({"distributed.comm.compression": "zstd"}):
                await write()
                with dask.config.set({"distributed.comm.compression": "lz4"}):
                    await write()
                await write()
            await write()
            old = cfg.get("compression", "auto")
            cfg["compression"] = "LZ4 "  # as Dask compares it: stripped, case-insensitive
            try:
                await write()
            finally:
                cfg["compression"] = old
            await write()
            with dask.config.set({"distributed.comm.compression": False}):
                await write()
        finally:
            await client.close()
            await server.close()
        return seen

    assert run(main()) == [None, "zstd", "lz4", "zstd", None, "lz4", None, None]


# ---- a part made and rebuilt without Dask's protocol.dumps / loads call -----------------------------

class Failing:
    """Serializes (pickles); its unpickling raises."""
    def __reduce__(self):
        return (_fail, ("no loading this",))


def _fail(msg):
    raise RuntimeError(msg)


def _part_objects():
    ser = serialize(np.arange(5), serializers=("dask", "pickle"))
    return [
        to_serialize(np.arange(1000, dtype="f8").reshape(10, 100)),
        to_serialize(np.int64(7)),
        to_serialize(7),                               # the gser family's small int (the tiny-task result)
        to_serialize(Opaque(1)),
        to_serialize({"a": b"b", "t": (1, 2)}),
        Serialized(*ser),
        ToPickle(Opaque(2)),
        ToPickle(np.arange(3000)),                     # out-of-band buffers: frames of a pickled part
        Pickled(*_pickled(Opaque(3))),
        to_serialize(Unserializable()),                # on_error="message": the "error" family
        to_serialize(Failing()),
    ]


def _dask_part(obj, serializers):
    from distributed.protocol import core

    frames = core.dumps(obj, serializers=serializers, on_error="message", context={"compression": None},
                        frame_split_size=gser.comm._NO_SPLIT)
    return (gser.comm._PART_KINDS[bytes(frames[0])], *frames[1:])


@pytest.mark.parametrize("serializers", [gser.comm.SERIALIZERS, ("dask", "pickle")])
def test_direct_part_dump_is_dasks(serializers):
    """Each supported Dask version's dumps body is one gser checked (else
    the test says which one to look at), and the part gser makes without
    the call is the kind, sub-header bytes and frames Dask's dumps makes."""
    assert gser.comm._dask_variant("dumps") is not None, "a Dask whose protocol.dumps gser has not checked"
    assert gser.comm._dask_variant("loads") is not None, "a Dask whose protocol.loads gser has not checked"
    gser.comm._register_family()  # as every process that uses gser:// does
    for a, b in zip(_part_objects(), _part_objects()):
        mine = gser.comm._dump_part(a, serializers, "message", {"compression": None})
        assert mine is not None, a
        theirs = _dask_part(b, serializers)
        assert mine[0] == theirs[0] and bytes(mine[1]) == bytes(theirs[1]), (a, mine[:2], theirs[:2])
        assert [bytes(f) for f in mine[2:]] == [bytes(f) for f in theirs[2:]], a


@pytest.mark.parametrize("deserialize", [True, False])
def test_direct_part_load_is_dasks(deserialize, caplog):
    """What gser rebuilds without Dask's loads call is what that call gives:
    the same types and values, Serialized pass-through with the same header
    dict (deserialize=False), pickles unpickled as Dask does; a failing
    unpickle raises Dask's exception with Dask's log line."""
    from distributed.protocol import core

    gser.comm._register_family()
    for obj in _part_objects():
        kind, header, *frames = _dask_part(obj, gser.comm.SERIALIZERS)
        frames = [memoryview(bytearray(f)) for f in frames]  # as received: writable memoryviews
        try:
            theirs = core.loads([gser.comm._PART_HEADS[kind], header, *frames], deserialize=deserialize)
        except Exception as e:  # noqa: BLE001 (compared)
            theirs = e
        with caplog.at_level(logging.CRITICAL, logger="distributed.protocol.core"):
            caplog.clear()
            try:
                mine = gser.comm._load_part(kind, header, list(frames), deserialize, None,
                                            gser.comm._dask_variant("loads"))
            except Exception as e:  # noqa: BLE001
                mine = e
                assert "Failed to deserialize" in caplog.text
        assert mine is not gser.comm._DASK, obj
        assert same(mine, theirs), (obj, mine, theirs)
        if isinstance(theirs, Serialized):
            assert type(mine.frames) is type(theirs.frames) is list
        if type(obj) is Serialize and type(obj.data) is Failing:
            assert isinstance(mine, RuntimeError) == deserialize


def test_direct_part_load_odd_headers_go_to_dask():
    """A sub-header the copy would not read as Dask does (no frame count, a
    negative or non-int one, not a map, not msgpack) is Dask's loads' call."""
    import msgpack

    for header in [msgpack.dumps({"serializer": "pickle"}), msgpack.dumps({"num-sub-frames": -1}),
                   msgpack.dumps({"num-sub-frames": "1"}), msgpack.dumps({"num-sub-frames": True}),
                   msgpack.dumps([1, 2]), b"\xc1"]:
        for kind in (0, 1):
            assert gser.comm._load_part(kind, header, [b"x"], True, None, "2026") is gser.comm._DASK


def test_direct_parts_only_for_checked_dask(monkeypatch):
    """Another body of Dask's dumps or loads (a patched one here) is called,
    never copied."""
    from distributed.protocol import core

    calls = collections.Counter()
    dumps, loads = core.dumps, core.loads

    def counted_dumps(*a, **k):
        calls["dumps"] += 1
        return dumps(*a, **k)

    def counted_loads(*a, **k):
        calls["loads"] += 1
        return loads(*a, **k)

    monkeypatch.setattr(core, "dumps", counted_dumps)
    monkeypatch.setattr(core, "loads", counted_loads)
    assert gser.comm._dask_variant("dumps") is None and gser.comm._dask_variant("loads") is None
    got = run(through("gser", [{"x": to_serialize(np.arange(3)), "y": ToPickle(Opaque(4))}]))
    assert np.array_equal(got[0]["x"], np.arange(3)) and got[0]["y"] == Opaque(4)
    assert calls == {"dumps": 2, "loads": 2}
    monkeypatch.undo()
    calls.clear()
    got = run(through("gser", [{"x": to_serialize(np.arange(3)), "y": ToPickle(Opaque(4))}]))
    assert np.array_equal(got[0]["x"], np.arange(3)) and got[0]["y"] == Opaque(4) and not calls


@pytest.mark.skipif(not hasattr(dask.config, "get") or distributed.__version__ >= "2023",
                    reason="distributed 2022.12's loads refuses pickles where distributed.scheduler.pickle is off")
def test_direct_part_load_refuses_pickle_as_2022():
    from distributed.protocol import core

    kind, header, *frames = _dask_part(ToPickle(Opaque(2)), gser.comm.SERIALIZERS)
    with dask.config.set({"distributed.scheduler.pickle": False}):
        with pytest.raises(ValueError, match="Unpickle on the Scheduler") as theirs:
            core.loads([gser.comm._PART_HEADS[kind], header, *frames], deserialize=False)
        with pytest.raises(ValueError, match="Unpickle on the Scheduler") as mine:
            gser.comm._load_part(kind, header, frames, False, None, gser.comm._dask_variant("loads"))
    assert str(mine.value) == str(theirs.value)
