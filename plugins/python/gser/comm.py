"""A Dask comm backend on gser::ucx, under the scheme "gser" (gser://HOST:PORT).

    LocalCluster(protocol="gser")                     # one node
    dask scheduler --protocol gser                    # across nodes
    dask worker gser://SCHEDULER:PORT

Dask finds it through the entry point distributed.comm.backends (the
installed package's metadata, also in the build tree), or because gser.dask
was imported. One Dask message is one gser message: Dask's frames become
gser buffers; small ones ride in the message's first UCX send, large ones go
zero-copy, and frames in device memory (__cuda_array_interface__) go as device
frames, straight to UCX when both sides' UCX can read CUDA memory and through
pinned staging buffers otherwise (never an error).

Every process that uses the scheme registers the gser serialization family
(gser.dask.register), and where Dask names no serializers the comm writes
with SERIALIZERS: "gser" first, then Dask's own families; it reads what
Dask's own comms read. Its handshake says that it carries device frames as
device memory (gser.dask.HANDSHAKE_DEVICE_KEY), so the family keeps device
buffers on the device towards its peers.

Received frames are what Dask's own comms deliver: host frames as writable
memoryviews, device frames as the object Dask's ucx:// allocates for them,
rmm.DeviceBuffer(size=n) when RMM is importable (honouring
distributed.rmm.pool-size as Dask does), else a Numba device array, or what
the function named by distributed.comm.gser.device-allocator returns
("package.module.function", called with a size, returning an object with
__cuda_array_interface__), or one the process gave gser.set_device_allocator
before. That function is gser's device allocator in the process
(gser.set_device_allocator), so the received bytes land in its
allocations: a large device frame is received straight into its own
allocation; frames under gser's pack size (1 MiB) travel packed in one
transfer and are copied once on the device into their own allocations.
Without RMM, Numba or the key, device frames stay gser.DeviceArray.

Faults, as Dask expects of a comm: a peer that dies or closes ends pending
and later reads and writes with CommClosedError; a read or write that is
canceled (a timeout) aborts the comm, since its message stream would be torn.

A peer that goes silent (a hung process, a network partition: no socket
ever closes) fails its comms with CommClosedError after the peer timeout:
distributed.comm.gser.peer-timeout, by default Dask's own
distributed.comm.timeouts.tcp (30 s, what Dask's tcp comm gives a dead
peer); "none" turns the check off. Each side heartbeats on its own, so an
idle healthy comm stays up, as long as the event loop runs at least every
few seconds.

distributed.comm.compression is honoured as tcp:// honours it ("auto",
"lz4", "zstd", None/False), by the transport: it compresses host frames
(sampled, as Dask's maybe_compress) and the peer's transport decompresses
them, so Dask's frames stay uncompressed and their "compression" entries
None. Towards a peer on the same host (the two addresses' IPs equal)
nothing is compressed whatever the setting, as tcp:// does from Dask 2023
on (Dask 2022.12's tcp:// compresses there, and so does gser:// under
it); towards other hosts "auto" picks the codec, or none, that moves each
message fastest on the link (docs/ucx.md section 4.5). Large messages (more than
distributed.comm.offload bytes, as they travel) are compressed, and
received ones decompressed and deserialized, on Dask's offload thread, as
Dask offloads serializing and deserializing them; small ones on the loop.

UCX settings come from the environment (UCX_TLS, UCX_NET_DEVICES, ...) and
from Dask's configuration, distributed.comm.gser.{transports, net-devices,
peer-timeout, secret, spin-us} (DASK_DISTRIBUTED__COMM__GSER__TRANSPORTS=tcp, ...).
With a secret (that key, or the GSER_UCX_SECRET environment variable) every
connection proves it both ways before UCX or Dask sees a byte of it; the
secret never crosses the wire, nothing is encrypted (docs/ucx.md). So a
demand for encryption (distributed.comm.require-encryption,
Security(require_encryption=True)) or for TLS (an ssl_context) is refused
with a RuntimeError, as tcp:// refuses plaintext; every connection argument
is honoured or refused, never dropped. A connection refused for good (the
secrets differ, another wire version) raises FatalCommClosedError with the
transport's reason: Dask's connect() does not retry it.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import math
import socket
import struct
import threading
import weakref

import dask
from dask.utils import parse_timedelta
from distributed.comm.addressing import get_address_host, parse_host_port, unparse_host_port
from distributed.comm import core as _dask_comm_core
from distributed.comm.core import Comm, CommClosedError, Connector, FatalCommClosedError, Listener
from distributed.comm.registry import Backend, backends
from distributed.comm.utils import OFFLOAD_THRESHOLD, ensure_concrete_host, from_frames, to_frames
from distributed.comm import utils as _dask_comm_utils
from distributed.protocol import core as _dask_protocol
from distributed.protocol.serialize import Pickled, Serialize, Serialized, ToPickle
from distributed.sizeof import sizeof
from distributed.utils import ensure_ip, get_ip, nbytes, offload
import msgpack

import gser.ucx
from gser import _alloc
from gser._gser import DeviceArray, GserError
from gser.ucx import frames_of

logger = logging.getLogger(__name__)

SCHEME = "gser"
PREFIX = SCHEME + "://"
#: Serializers where Dask names none.
SERIALIZERS = ("gser", "cuda", "dask", "pickle", "error")

# The first message of a connection, from the connecting side: the comm's
# protocol version, its local address and the address it connected to.
_HELLO_KEY = "gser-comm"
_HELLO_VERSION = 1
# Dask's frame splitting exists for sockets; one gser frame per Dask frame
# keeps large arrays in one piece (no merge copy on the receiving side).
_NO_SPLIT = 1 << 62

# A large message that the transport compresses, and whose samples do
# compress, travels in parts of about _PART_BYTES (frames cut into pieces of
# that size): part k+1 is compressed on the offload thread while part k is
# on the wire, and the reader decompresses each part as it arrives, where
# one whole message would be compressed, sent and decompressed one after
# the other. The reader joins the pieces of a cut frame again (one copy, as
# Dask's tcp:// merges its shards). Only between comms whose handshakes
# both announce _PARTS_KEY. The first part starts with a marker frame: the
# magic, the number of parts and of frames, and each frame's piece count.
_PARTS_KEY = "gser-parts"
_PART_BYTES = 4 << 20
_PARTS_MAX = 1 << 16
_PARTS_MAGIC = b"\xc1gser-parts"  # 0xc1 begins no msgpack value: no Dask frame starts so
_PARTS_HEAD = struct.Struct(f"<{len(_PARTS_MAGIC)}sII")
_SAMPLE_BYTES = 10_000  # a sample of each large frame, as gser's own sampling takes
# An endpoint that chooses its codec by its link measures the link with its
# first large message, raw (nothing else says how fast the link is). A whole
# message raw is what a slow link makes slow: a 64 MiB result gathered
# through the scheduler at 100 Mbit/s took 11.6 s, raw on both legs, where
# tcp:// + lz4 took 3.7. So a message of more than _MEASURE_MIN bytes on an
# endpoint whose link is not measured goes in parts: its first _MEASURE_BYTES
# raw as one part (twice Linux's largest default socket send buffer, as the
# link's windows take), and once that part's sends completed (the link
# measured), the rest with the codec the endpoint then chooses for it. So
# does a raw decision that is a probe (the link measured again): a probe
# costs that part, not the message (gser_ucx_ep_choose_compression). A peer
# that takes longer than _MEASURE_WAIT seconds to receive it (not reading)
# is not waited for: the rest goes as the endpoint then decides (raw,
# unmeasured). A probe of a message of more than _PROBE_MIN bytes goes
# raw for its first _PROBE_BYTES: a probe comes after compressed sends, on
# a connection whose socket buffers grew (about 5 MiB at 1 Gbit/s), which
# take the start of a raw part at once; its sends after the first
# completion then read the link at (bytes - first send) / (bytes -
# buffers): about 1.33 times the link for 8 MiB (172 MB/s measured on 125),
# about 1.09 for 16 MiB (gser_ucx's GUX_LINK_PROBE_BYTES, which spaces
# probes by that share).
_MEASURE_BYTES = 8 << 20
_MEASURE_MIN = _MEASURE_BYTES + _PART_BYTES
_PROBE_BYTES = 16 << 20
_PROBE_MIN = _PROBE_BYTES + _PART_BYTES
_MEASURE_WAIT = 5.0

# A whole Dask message encoded by gser in C (a "dask.msg": its dicts, lists,
# tuples and scalars as gser values) instead of Dask's to_frames and
# from_frames, between comms whose handshakes both announce _MSG_KEY. Its
# parts (Serialize, Serialized, ToPickle, Pickled) are made and rebuilt as
# Dask's own protocol.dumps and loads make them (_dump_part, _load_part: its
# steps without the call, where gser checked that Dask's body; else the
# call), one part at a time ("dask.part": the
# part's kind, its sub-header and its frames, as Dask's frames would carry
# them), so that families, on_error, context, pass-through on the scheduler
# (deserialize=False) and unpickling are Dask's, in each Dask version. What
# gser does not carry as Dask's msgpack would give it back (another type, a
# dict key Dask's protocol acts on, an int beyond 64 bits, deep nesting)
# sends that message as Dask's frames: the receiver tells the two apart by
# the root ("dask.msg" or a list of frames). Lists arrive as tuples, as
# Dask's msgpack (use_list=False) gives them; tuple dict keys and sets as
# Dask's msgpack gives them; subclasses of dict, list, tuple, int, float and
# str as their base type (msgpack packs them so); the standard types Dask 2026.x pickles
# where its msgpack refuses them (a datetime, a frozenset: the fallback in its
# protocol.dumps) exactly as they went, in a "python.tree" (never pickled),
# and as Dask's frames in 2022.12, which raises on them.
_MSG_KEY = "gser-msg"
_PART_TYPES = (Serialize, Serialized, ToPickle, Pickled)
_DASK_PICKLES = hasattr(_dask_protocol, "_is_msgpack_serializable")
# Dask's first frame for a message that is one part (kind 0, 1).
_PART_HEADS = (msgpack.dumps({"__Serialized__": 1}, use_bin_type=True),
               msgpack.dumps({"__Pickled__": 1}, use_bin_type=True))
_PART_KINDS = {h: k for k, h in enumerate(_PART_HEADS)}


class _Redo(Exception):
    """From the encoder's callback, before the first part: the message goes
    another way (_OFFLOAD: encoded on the offload thread; None: as Dask's
    frames)."""


_OFFLOAD = object()  # _encode_msg: encode again on the offload thread


# Dask's protocol.dumps and loads for one part, made without the call where
# the body of the installed Dask's dumps / loads is one gser has checked (its
# source's sha256, below; per Dask version): the same steps with the same
# functions, looked up in Dask's module at each call as Dask's code looks
# them up, in the same order, so the same objects, header dicts and
# errors (Dask's log line with them) come out; what the copy does not take
# the ordinary way (a subclass, a header that is not a dict, a frame
# count that is not a plain int, or any error before a deserializer ran)
# goes through Dask's call after all. What it saves per part is Dask's
# outer msgpack of the one-key {"__Serialized__": 1} map and its hook, and
# a msgpack Packer made per dumps (issue 39: the scheduler reads and writes
# a part per task in a tiny-task run, 2026.x's workers read one more).
_DASK_SOURCES = {
    "dumps": {"5f315c46d7932e30": "2022.12", "ddf64272e6473950": "2026"},
    "loads": {"b2a81fa31ddf046c": "2022.12", "06d746db9f54c49d": "2026"},
}
#: Off: every part through Dask's own protocol.dumps and loads (tests compare).
DIRECT_PARTS = True
_checked: dict = {}  # Dask's function -> the variant of its checked source, or None
_DASK = object()  # _load_part: Dask's loads decides this one


def _dask_variant(name):
    """Which checked body Dask's protocol function name has ("2022.12",
    "2026"), or None (another body, no source, turned off)."""
    if not DIRECT_PARTS:
        return None
    f = getattr(_dask_protocol, name)
    try:
        return _checked[f]
    except KeyError:
        pass
    try:
        import hashlib
        import inspect

        digest = hashlib.sha256(inspect.getsource(f).encode()).hexdigest()[:16]
        variant = _DASK_SOURCES[name].get(digest)
    except (OSError, TypeError):  # no source installed: Dask's call
        variant = None
    _checked[f] = variant
    return variant


_packers = threading.local()  # msgpack.dumps(x, **kw) is Packer(**kw).pack(x): one Packer per thread


def _pack_sub_header(kind, sub_header):
    """Dask's msgpack.dumps of a part's sub-header (with its
    msgpack_encode_default for a serialized part; a pickled part's without
    a default), with a kept Packer."""
    default = _dask_protocol.msgpack_encode_default if kind == 0 else None
    kept = getattr(_packers, "kept", None)
    if kept is None:
        kept = _packers.kept = {}
    p = kept.get(default)
    if p is None:
        p = kept[default] = msgpack.Packer(default=default, use_bin_type=True) if kind == 0 else msgpack.Packer()
    return p.pack(sub_header)


def _compress_in_place(sub_header, sub_frames, context):
    """Dask's dumps' _inplace_compress_frames, its compress_opts from the context."""
    P = _dask_protocol
    opts = {"compression": context["compression"]} if context and "compression" in context else {}
    compression = list(sub_header.get("compression", [None] * len(sub_frames)))
    for i in range(len(sub_frames)):
        if compression[i] is None:
            compression[i], sub_frames[i] = P.maybe_compress(sub_frames[i], **opts)
    sub_header["compression"] = tuple(compression)


def _dump_part(obj, serializers, on_error, context):
    """(kind, sub-header, sub-frames...) as Dask's dumps makes them for the
    part obj, or None: Dask's dumps is to make them (it then gives its own
    error, where there is one)."""
    P = _dask_protocol
    t = type(obj)
    try:
        if t is Serialize:
            kind = 0
            sub_header, sub_frames = P.serialize_and_split(obj, serializers=serializers, on_error=on_error,
                                                           context=context, size=_NO_SPLIT)
            _compress_in_place(sub_header, sub_frames, context)
        elif t is ToPickle:
            kind = 1
            sub_frames = []
            ensure_memoryview = P.ensure_memoryview
            sub_header = {"pickled-obj": P.pickle.dumps(obj.data,
                                                        buffer_callback=lambda x: sub_frames.append(ensure_memoryview(x)))}
            _compress_in_place(sub_header, sub_frames, context)
        elif t is Serialized or t is Pickled:
            kind = int(t is Pickled)
            sub_header, sub_frames = obj.header, obj.frames
            if type(sub_header) is not dict or type(sub_frames) is not list:
                return None  # Dask's [sub_header] + sub_frames decides
        else:
            return None
        if type(sub_frames) is not list:
            return None
        sub_header["num-sub-frames"] = len(sub_frames)
        return (kind, _pack_sub_header(kind, sub_header), *sub_frames)
    except Exception:
        return None


def _load_part(kind, header, frames, deserialize, deserializers, variant):
    """What Dask's loads gives back for the part, or _DASK: its loads is to
    decide (a header it would read otherwise, or would fail on)."""
    P = _dask_protocol
    try:
        if kind == 0:
            sub_header = msgpack.loads(header, object_hook=P.msgpack_decode_default, use_list=False,
                                       **P.msgpack_opts)
        else:
            sub_header = msgpack.loads(header)
        n = sub_header["num-sub-frames"]
        if type(n) is not int or n < 0:
            return _DASK
        allow_pickle = kind == 0 or variant != "2022.12" or dask.config.get("distributed.scheduler.pickle")
    except Exception:
        return _DASK
    sub_frames = frames if n >= len(frames) else frames[:n]
    try:
        if kind == 0:
            if not deserialize:
                return P.Serialized(sub_header, sub_frames)
            if "compression" in sub_header:
                sub_frames = P.decompress(sub_header, sub_frames)
            return P.merge_and_deserialize(sub_header, sub_frames, deserializers=deserializers)
        if not allow_pickle:
            raise ValueError("Unpickle on the Scheduler isn't allowed, set `distributed.scheduler.pickle=true`")
        if variant != "2022.12" and "compression" in sub_header:
            sub_frames = P.decompress(sub_header, sub_frames)
        return P.pickle.loads(sub_header["pickled-obj"], buffers=sub_frames)
    except Exception:
        P.logger.critical("Failed to deserialize", exc_info=True)  # as Dask's loads logs it
        raise


def _part_dumper(serializers, on_error, make_context, failed, first=None):
    """The encoder's callback: a part as (kind, sub-header, sub-frames...),
    made as Dask's dumps makes it (with the context make_context() makes,
    once), after first() (which may raise _Redo). What Dask raises is
    noted in failed (Dask's error, not a message gser declines)."""
    context = []
    direct = _dask_variant("dumps") is not None

    def dump(obj):
        if not context:
            if first is not None:
                first()
            context.append(make_context())
        try:
            if direct:
                out = _dump_part(obj, serializers, on_error, context[0])
                if out is not None:
                    return out
            frames = _dask_protocol.dumps(obj, serializers=serializers, on_error=on_error, context=context[0],
                                          frame_split_size=_NO_SPLIT)
            return (_PART_KINDS[bytes(frames[0])], *frames[1:])
        except BaseException as e:
            failed.append(e)
            raise
    return dump


def _part_loader(deserialize, deserializers, failed):
    """The decoder's callback: a part as Dask's loads gives it back (in this
    Dask version) from the frames Dask would have sent."""
    alloc = _alloc_state["fn"]
    variant = _dask_variant("loads")

    def load(kind, header, frames):
        if alloc is not None:
            frames = [_received(f, alloc) if type(f) is DeviceArray else f for f in frames]
        try:
            if variant is not None:
                out = _load_part(kind, header, frames, deserialize, deserializers, variant)
                if out is not _DASK:
                    return out
            return _dask_protocol.loads([_PART_HEADS[kind], header, *frames], deserialize=deserialize,
                                        deserializers=deserializers)
        except BaseException as e:
            failed.append(e)
            raise
    return load


def _offload_threshold():
    """distributed.comm.offload as Dask's to_frames and from_frames read it
    now (distributed.comm.utils.OFFLOAD_THRESHOLD, which tests change), or
    this module's copy where that one was changed; 0: never offload."""
    a, b = _dask_comm_utils.OFFLOAD_THRESHOLD, OFFLOAD_THRESHOLD
    return min(a, b) if a and b else 0


def _parts_size(msg, budget=256):
    """The bytes msg's parts and strings carry (what the transport may
    compress), or None for a message of more than budget items."""
    total, stack = 0, [msg]
    while stack:
        budget -= 1
        if budget < 0:
            return None
        x = stack.pop()
        t = type(x)
        if t is dict:
            stack.extend(x.values())
        elif t is list or t is tuple:
            stack.extend(x)
        elif t is str or t is bytes:
            total += len(x)
        elif t is Serialize or t is ToPickle:
            total += sizeof(x.data)
        elif t is Serialized or t is Pickled:
            total += sum(map(nbytes, x.frames))
    return total


def _msg_size(msg):
    """The size Dask's to_frames measures a message by (to offload it)."""
    try:
        return sizeof(msg)
    except Exception:  # RecursionError: Dask offloads such a message
        return math.inf




# ---- process state: one UCX context, one worker per event loop ----------------------------

_workers: dict = {}  # loop -> gser.ucx.Worker


def _config(key, default=None):
    return dask.config.get(f"distributed.comm.gser.{key}", default)


def _peer_timeout_ms() -> int:
    timeout = _config("peer-timeout")
    if timeout is None:
        timeout = dask.config.get("distributed.comm.timeouts.tcp", None)
    if timeout is None:
        return 0
    if timeout is False or (isinstance(timeout, str) and timeout.strip().lower() in ("none", "never", "off")):
        return gser.ucx.PEER_TIMEOUT_NONE
    return max(1, int(parse_timedelta(timeout, default="seconds") * 1000))


# distributed.comm.compression as gser:// honours it: the codecs gser has
# compress in the transport ("auto": by transport, none towards this host);
# any other name Dask knows (zlib, snappy) is left to Dask's own frames.
_GSER_COMPRESSION = {"auto": "auto", None: None, False: None, "none": None, "None": None, "lz4": "lz4",
                     "zstd": "zstd"}


def _compression():
    """(what the transport compresses, what Dask compresses) for
    distributed.comm.compression now. Read at every write, so that
    dask.config.set in a context holds for the writes inside it: straight
    from the config dict (what dask.config.get reads, without its key
    parsing, a third of a small write's own time), the mapping cached by
    the setting's value."""
    try:
        setting = dask.config.config["distributed"]["comm"].get("compression", "auto")
    except (KeyError, TypeError, AttributeError):  # not the usual layout: Dask's own lookup
        setting = dask.config.get("distributed.comm.compression", "auto")
    try:
        key = (type(setting), setting)  # False and 0 apart
        return _compression_of[key]
    except KeyError:
        out = _compression_of[key] = _compression_for(setting)
        if len(_compression_of) > 64:  # settings are few; never grow without bound
            _compression_of.clear()
        return out
    except TypeError:  # unhashable: not a codec name
        return _compression_for(setting)


_compression_of: dict = {}

# Whether the running Dask compresses nothing between two comms of one host,
# whatever distributed.comm.compression says: its Comm.same_host, with which
# handshake_info announces no compression (Dask 2023 on; 2022.12 compresses
# there too). gser:// follows, so a setting means what it means to tcp://.
_SAME_HOST_RAW = isinstance(getattr(Comm, "same_host", None), property)
_FORCED = ("lz4", "zstd")


def _compression_for(setting):
    if isinstance(setting, str):
        setting = setting.strip().lower() if setting.strip().lower() in _GSER_COMPRESSION else setting
    try:
        return _GSER_COMPRESSION[setting], None
    except (KeyError, TypeError):
        return None, setting


def _context() -> gser.ucx.Context:
    return gser.ucx.default_context(transports=_config("transports"), peer_timeout_ms=_peer_timeout_ms(),
                                    secret=_config("secret"), net_devices=_config("net-devices"))


# Received device frames: the allocation Dask's ucx:// gives them (gser._alloc).
_alloc_state = _alloc.state
_choose_device_allocator = _alloc.choose
_device_allocator = _alloc.setup
_received = _alloc.received


def _register_family():
    """Every process that uses the scheme can read what the gser family wrote
    (gser.dask.register: the family's entry point for anything that wants it)."""
    from gser import dask as gser_dask  # here: gser.dask imports this module

    if not gser_dask.registered():
        gser_dask.register()


# distributed.comm.gser.spin-us by default: a receive that finds nothing
# polls this long before the loop sleeps (gser.ucx.Endpoint._spin). Between
# processes on cores of their own, a request's reply then comes without two
# wake-ups of an idle CPU (bench_comm.py comm_rtt_100B: 18 us instead of
# 100 us here); on one shared core a poll that finds nothing costs that
# long once in 65 receives of the endpoint. 0 turns it off.
_SPIN_US = 100


def _worker() -> gser.ucx.Worker:
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _workers if lp.is_closed()]:
        _workers.pop(old).close()  # comms left open when their loop ended
    _register_family()
    _device_allocator()
    w = _workers.get(loop)
    if w is None or w.closed or w.failed is not None:
        # A failed worker (its receive queue blocked) stays with what still
        # uses it until they let go; new comms get a new one.
        w = _workers[loop] = gser.ucx.Worker(_context(), loop=loop, compression="auto",
                                             spin_us=float(_config("spin-us", _SPIN_US) or 0))
    return w


def _release(worker: gser.ucx.Worker):
    """Close a worker nothing uses any more (its loop may be gone soon)."""
    if worker.closed or worker._connecting:
        return
    if any(not lst.closed for lst in worker.listeners):
        return
    if any(ep.state != "destroyed" for ep in worker.endpoints):
        return
    worker.close()
    if _workers.get(worker._loop) is worker:
        del _workers[worker._loop]


def _local_ip_for(host: str) -> str:
    """The local address this host reaches host from (a UDP connect sends
    nothing). Where no route leads there: IPv4 as Dask's get_ip() answers
    (this host's address towards the internet, or its name's), IPv6 this
    host's name's IPv6 address, else ::1. gser's own rather than Dask's
    get_ipv6, which Dask deprecated (2024) and whose get_ip took no IPv6
    host before that."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        pass
    if family == socket.AF_INET:
        return get_ip()
    try:
        return socket.getaddrinfo(socket.gethostname(), 9, family, socket.SOCK_DGRAM)[0][4][0]
    except OSError:
        return "::1"


_PLAIN = (str, bytes, int, float, bool, type(None))


# Messages from this size get the endpoint's choice for them (its
# gser_ucx_ep_choose_compression's threshold); smaller ones its last one.
_LINK_MIN = 1 << 20


def _compresses(frames, codec, ep=None) -> bool:
    """Whether a sample of the message's large host frames shrinks with
    codec to gser's threshold (0.9), as the transport's own sampling would
    decide: a message that does not compress is sent whole, with nothing
    to join on the other side. An endpoint that decides by its link chose
    codec on a sample of these frames already: one that does not shrink is
    never chosen."""
    if ep is not None and ep.link_stats["link_aware"]:
        return True
    samples = []
    for f in frames:
        if type(f) is memoryview or isinstance(f, (bytes, bytearray)):
            mv = memoryview(f).cast("B")
            if len(mv) >= _PART_BYTES:
                step = (len(mv) - _SAMPLE_BYTES) // 4
                samples.extend(bytes(mv[k * step:k * step + _SAMPLE_BYTES]) for k in range(5))
    if not samples:
        return False
    import numpy as np  # an array travels in a frame (short bytes would be inlined, never compressed)

    raw = np.frombuffer(b"".join(samples), np.uint8)
    return len(gser.to_bytes(raw, compression=codec)) <= 0.9 * raw.nbytes + 256


def _small(msg, budget=64) -> bool:
    """Whether msg is a small plain message (at most budget items, strings and
    bytes under 64 KiB, nothing Dask would serialize with a family). Such a
    message is never offloaded, so Dask's check (a sizeof() of the whole
    message, the largest cost of a small write) is skipped for it."""
    stack = [msg]
    while stack:
        budget -= 1
        if budget < 0:
            return False
        x = stack.pop()
        t = type(x)
        if t is dict:
            stack.extend(x.keys())
            stack.extend(x.values())
        elif t is list or t is tuple:
            stack.extend(x)
        elif t not in _PLAIN or ((t is str or t is bytes) and len(x) > 65536):
            return False
    return True


# A frame joined from pieces, of this many bytes or more, goes into a buffer
# of the worker's receive cache: a bytearray of tens of MiB is mapped fresh
# by malloc every time (over its dynamic mmap threshold), and its page faults
# cost the receiver more than the copy (64 MiB of columns at 1 Gbit/s: 15,400
# faults and 45 ms a message, on the message's critical path after its last
# part; BENCHMARKS.md, issue 40, h40d).
_CACHED_JOIN = 1 << 20


def _joined(pieces, ep) -> memoryview:
    """pieces (bytes-like) joined in one new writable buffer (from the cache
    of ep's worker where large)."""
    n = sum(map(nbytes, pieces))
    if n < _CACHED_JOIN or ep.worker.closed:
        return memoryview(bytearray().join(pieces))
    out, at = ep.worker.alloc_host(n), 0
    for p in pieces:
        p = memoryview(p).cast("B")
        out[at:at + len(p)] = p
        at += len(p)
    return out


def _closed_error(comm, what, e=None) -> CommClosedError:
    msg = f"{what}: {comm!r}"
    if e is not None:
        msg += f": {e}"
    return CommClosedError(msg)


# ---- the comm ---------------------------------------------------------------------------

class GserComm(Comm):
    """A Dask Comm over one gser::ucx endpoint (gser.ucx.Endpoint)."""

    def __init__(self, ep: gser.ucx.Endpoint, local_addr: str, peer_addr: str, deserialize: bool = True):
        super().__init__(deserialize=deserialize)
        self._ep = ep
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._compression = "auto"  # what the endpoint was told (its worker's default)
        self._same_host = None  # whether the peer is on this host (asked once, where Dask asks)
        self._link_aware = None  # whether it then chooses its codec by the link (asked once)
        self._probes = 0  # the endpoint's probes seen (link_stats): a raw decision that is one is sent measured
        self._sending = 0  # sends the transport still holds buffers of
        self._drained = None  # a future close() waits on until _sending is 0
        # A comm dropped without close() must not keep its connection.
        self._finalizer = weakref.finalize(self, _drop_endpoint, ep)

    def handshake_info(self):
        # Comm's (with the gser family's key once it is registered), and that
        # this comm carries device frames as device memory: the family keeps
        # device buffers in device frames towards such a peer. Comm's is a
        # staticmethod up to distributed 2023.4 and an instance method since:
        # called through super(), either gets what it expects.
        from gser import dask as gser_dask

        return {**super().handshake_info(), gser_dask.HANDSHAKE_DEVICE_KEY: True, _PARTS_KEY: 1, _MSG_KEY: 1}

    @staticmethod
    def handshake_configuration(local, remote):
        out = Comm.handshake_configuration(local, remote)
        out[_PARTS_KEY] = bool(local.get(_PARTS_KEY) and remote.get(_PARTS_KEY))
        out[_MSG_KEY] = bool(local.get(_MSG_KEY) and remote.get(_MSG_KEY))
        return out

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    @property
    def extra_info(self):
        ep = self._ep
        if ep is None or ep.closed:
            return {}
        peer = ep.peer_info()
        local = ep.worker.context.cuda
        return {
            "transport": "gser::ucx",
            "local_cuda": local,
            "peer_cuda": peer["cuda"],
            "device_frames": "direct" if local and peer["cuda"] else "staged",
        }

    def closed(self) -> bool:
        return self._ep is None or self._ep.closed

    def _endpoint(self, what) -> gser.ucx.Endpoint:
        ep = self._ep
        if ep is None:
            raise _closed_error(self, f"{what} on a closed comm")
        return ep

    async def write(self, msg, serializers=None, on_error="message"):
        ep = self._ep
        if ep is None:
            raise _closed_error(self, "write on a closed comm")
        if ep.closed:
            self.abort()
            raise _closed_error(self, "write", ep.error())
        gser_codec, dask_codec = _compression()
        if (dask_codec is not None or gser_codec in _FORCED) and self._raw_to_same_host():
            gser_codec, dask_codec = None, None  # as tcp:// (auto: the transport knows the host itself)
        if gser_codec != self._compression:
            ep.set_compression(gser_codec)
            self._compression = gser_codec
            self._link_aware = None
        serializers = serializers if serializers is not None else SERIALIZERS
        if self.handshake_options.get(_MSG_KEY):
            codec = ep.compression  # the last choice: small messages keep it (open: checked above)
            if self._link_aware is None:
                self._link_aware = not ep.closed and ep.link_stats["link_aware"]
            # A large message the transport may compress goes as Dask's
            # frames below, where the endpoint chooses its codec by the link
            # (unless its measurements say raw wins whatever the data:
            # _encode_msg's first()).
            compressible = codec is not None or self._link_aware
            encoded = self._encode_msg(ep, msg, serializers, on_error, dask_codec, codec, compressible, False)
            if encoded is _OFFLOAD:  # as to_frames offloads (its name for Dask's offload)
                encoded = await _dask_comm_utils.offload(self._encode_msg, ep, msg, serializers, on_error,
                                                         dask_codec, codec, compressible, True)
            if encoded is not None:
                owner, size = encoded
                self._post(ep._send_then, owner, True)
                return size
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload and not _small(msg),
            serializers=serializers,
            on_error=on_error,
            context=self._serialize_context(dask_codec),
            frame_split_size=_NO_SPLIT,
        )
        size = sum(map(nbytes, frames))
        in_parts = self._in_parts(size)
        # "auto" between hosts: the endpoint picks the codec (or none) that
        # moves this message fastest on its link (docs/ucx.md 4.5)
        codec = None if ep.closed else ep.choose_compression(frames, in_parts) if size >= _LINK_MIN else ep.compression
        if in_parts and codec is not None and _compresses(frames, codec, ep):
            await self._write_parts(ep, frames, codec)
            return size
        if in_parts and codec is None and size > _MEASURE_MIN and not ep.closed:
            stats = ep.link_stats
            probe, self._probes = stats["probes"] > self._probes, stats["probes"]
            if stats["link_aware"] and (probe or not stats["send_rate"] > 0):  # raw only to measure the link
                measure = _PROBE_BYTES if probe and size > _PROBE_MIN else _MEASURE_BYTES
                await self._write_parts(ep, frames, None, measure=measure)
                return size
        prepared = None
        if OFFLOAD_THRESHOLD and not ep.closed:
            if codec is not None and size > OFFLOAD_THRESHOLD:
                # Compressing is the large message's cost: off the event
                # loop, as Dask offloads serialization; also from a comm
                # that does not offload Dask's work (the scheduler's: its
                # loop serves the whole cluster).
                prepared = await self._prepare(ep, frames, codec)
        # Posted, not waited for: as a socket's buffer would, the transport
        # holds the frames until the peer takes them (a large message
        # completes only when the peer reads it, and Dask peers often write
        # before they read). A send that fails fails the endpoint, which the
        # next read or write reports.
        if prepared is not None:
            self._post(ep.send_nowait, prepared)
        else:
            self._post(ep.send_frames_nowait, frames)
        if size >= _LINK_MIN:
            self._mark_posted(ep)
        return size

    def _mark_posted(self, ep):
        """The message the endpoint last decided a codec for is all posted:
        it is timed to its last send's completion (gser_ucx_ep_mark_posted:
        its parts' compressed frames of under 64 KiB, which time nothing,
        kept a 100 Mbit/s shuffle's timing open through the sends after it,
        and the endpoint went raw)."""
        try:
            if not ep.closed:
                ep.mark_posted()
        except gser.ucx.ConnectionClosedError:
            pass  # all of it was posted: the next read or write reports the endpoint's end

    def _raw_to_same_host(self) -> bool:
        """Whether Dask, as it runs here, sends this comm's messages
        uncompressed whatever the setting: its peer is on this host (Dask's
        Comm.same_host: the two addresses' IPs equal)."""
        if self._same_host is None:
            same = False
            if _SAME_HOST_RAW:
                try:
                    same = bool(Comm.same_host.fget(self))
                except Exception:  # an address Dask cannot resolve: its host names compared
                    same = get_address_host(self._local_addr) == get_address_host(self._peer_addr)
            self._same_host = same
        return self._same_host

    def _in_parts(self, size) -> bool:
        """Whether a message of size bytes goes in parts (_write_parts) where
        it is compressed or measures the link."""
        return bool(self.handshake_options.get(_PARTS_KEY) and OFFLOAD_THRESHOLD and size > 2 * _PART_BYTES)

    def _serialize_context(self, dask_codec):
        """The context Dask's serializers get from this comm."""
        return {
            "sender": self.local_info,
            "recipient": self.remote_info,
            **self.handshake_options,
            # The transport compresses (and the peer's decompresses):
            # Dask's frames stay as they are, their entries None.
            "compression": dask_codec,
        }

    def _encode_msg(self, ep, msg, serializers, on_error, dask_codec, codec, compressible, offloaded):
        """msg encoded whole by gser (a "dask.msg"): (what to send, its
        bytes), or None where gser declines it (Dask's frames carry it
        then), or _OFFLOAD. A message with parts that Dask's to_frames would
        offload (dask.sizeof over distributed.comm.offload) is _OFFLOAD: to
        be encoded again on the offload thread (offloaded: that is where
        this runs); one whose parts the transport compresses, and that is
        large, goes as Dask's frames (compressed off the loop, in parts:
        _write_parts). A message without parts is encoded here: gser copies
        its strings once and borrows its bytes (Dask's sizeof() of it
        would cost more than that)."""
        threshold = 0 if offloaded or not self.allow_offload else _offload_threshold()

        # An endpoint that chooses by its link chooses for messages from
        # _LINK_MIN: those go as frames, where it is asked and samples them,
        # unless its last decision was raw and its measurements say raw
        # wins whatever the data (the link faster than every codec: it
        # records that decision without a sample); then the message goes
        # as forced None sends it, one "dask.msg" (docs/ucx.md 4.5). Also
        # on a comm that does not offload (the scheduler's): a large result
        # it forwards to a client is asked too, though not a message of more
        # items than _parts_size counts (its batches of thousands of small
        # ops stay one "dask.msg"). None: nothing goes as frames for its
        # size (the offloaded pass: the loop's pass decided).
        if offloaded:
            limit = None
        elif self._link_aware:
            limit = min(threshold, _LINK_MIN) if threshold else _LINK_MIN
        else:
            limit = threshold or None

        def first():  # before the first part is serialized
            if compressible and limit is not None:
                size = _parts_size(msg)
                if size is None and not threshold:
                    size = 0
                if size is None or (size > limit and not (
                        codec is None and self._link_aware and size >= _LINK_MIN
                        and ep.raw_wins(size, self._in_parts(size)))):
                    raise _Redo(None)
            if threshold and _msg_size(msg) > threshold:
                raise _Redo(_OFFLOAD)

        failed = []
        dump = _part_dumper(serializers, on_error, functools.partial(self._serialize_context, dask_codec), failed,
                            first if threshold or limit is not None else None)
        try:
            return ep._c.prepare(msg, None, codec, parts=(_PART_TYPES, dump, _DASK_PICKLES))
        except _Redo as redo:
            return redo.args[0]
        except Exception as e:
            if failed and e is failed[0]:
                # Dask's own serialization failed: as to_frames reports it.
                _dask_comm_utils.logger.info("Unserializable Message: %s", msg)
                _dask_comm_utils.logger.exception(e)
                raise
            return None

    async def _prepare(self, ep, frames, codec):
        """frames serialized and compressed for one send, on the offload thread."""
        try:
            return await offload(ep.prepare_frames, frames, codec)
        except gser.ucx.ConnectionClosedError as e:
            self.abort()
            raise _closed_error(self, "write", e) from e

    def _post(self, send, obj, then=False, done=None):
        """One send posted (send: the endpoint's send_nowait or
        send_frames_nowait; then: it is _send_then, whose callback is
        positional and takes the request: a small message's path, one call
        less); a failure to post aborts the comm. done: a future resolved
        (None) once the send completed, well or not."""
        self._sending += 1
        try:
            if then:
                send(obj, self._sent)
            elif done is not None:
                def sent(error):
                    self._sent(error)
                    if not done.done():
                        done.set_result(None)
                send(obj, callback=sent)
            else:
                send(obj, callback=self._sent)
        except BaseException as e:
            self._sending -= 1
            self.abort()
            if isinstance(e, gser.ucx.ConnectionClosedError):
                raise _closed_error(self, "write", e) from e
            raise

    def _sent(self, _):
        # send_nowait gives the error, _send_then the request; either way a
        # failed send failed the endpoint: the next read or write says so.
        self._sending -= 1
        if self._sending == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def _write_parts(self, ep, frames, codec, measure=0):
        """frames as consecutive messages of about _PART_BYTES, host frames
        larger than that cut into pieces, the first message led by the
        marker: each part is compressed on the offload thread while the one
        before is sent. measure: the link is to be measured (not measured
        yet, or a probe): the first measure bytes go raw as one part and
        measure it, the rest with the codec the endpoint then chooses for
        them (codec: None)."""
        pieces, counts = [], []
        for f in frames:
            if type(f) is memoryview or isinstance(f, (bytes, bytearray)):
                mv = memoryview(f).cast("B")
                cut = [mv[i:i + _PART_BYTES] for i in range(0, len(mv), _PART_BYTES)] or [mv]
            else:  # a device frame: one piece
                cut = [f]
            pieces.extend(cut)
            counts.append(len(cut))
        parts, part, n = [], [], 0
        for p in pieces:
            part.append(p)
            n += nbytes(p)
            # (measure: the first part is the raw start, one message, so
            # that the receiver takes all of it as it comes)
            if n >= (measure if measure and not parts else _PART_BYTES):
                parts.append(part)
                part, n = [], 0
        if part:
            parts.append(part)
        head = _PARTS_HEAD.pack(_PARTS_MAGIC, len(parts), len(counts)) + struct.pack(f"<{len(counts)}I", *counts)
        parts[0].insert(0, head)
        k = 0
        if measure:
            k = 1
            done = asyncio.get_running_loop().create_future()
            self._post(ep.send_frames_nowait, parts[0], done=done)
            try:
                await asyncio.wait_for(done, _MEASURE_WAIT)
            except asyncio.TimeoutError:
                pass
            if ep.closed:
                raise _closed_error(self, "write", ep.error())
            codec = ep.choose_compression([p for part in parts[k:] for p in part], True) if k < len(parts) else None
        for part in parts[k:]:
            if codec is None:
                self._post(ep.send_frames_nowait, part)
            else:
                self._post(ep.send_nowait, await self._prepare(ep, part, codec))
        self._mark_posted(ep)

    async def _read_parts(self, ep, frames):
        """The frames of a message written by _write_parts, whose first part
        is frames (the marker first), pieces joined again."""
        head = bytes(frames[0])
        _, nparts, nframes = _PARTS_HEAD.unpack_from(head)
        if not 1 <= nparts <= _PARTS_MAX or len(head) != _PARTS_HEAD.size + 4 * nframes:
            raise GserError(f"gser://: a message in parts announced {nparts} parts (1 to {_PARTS_MAX}) and "
                            f"{nframes} frames in a marker of {len(head)} bytes")
        counts = struct.unpack_from(f"<{nframes}I", head, _PARTS_HEAD.size)
        pieces = list(frames[1:])
        # the other parts' receives posted at once (raw ones come at the
        # link's pace, not a loop turn each); every compressed one
        # decompressed off the loop
        left = nparts - 1
        while left:  # (a hostile marker's count posts 64 receives at a time)
            n = min(left, 64)
            for part in await ep.recv_frames_many(n, offload=offload):
                pieces.extend(part)
            left -= n
        if sum(counts) != len(pieces) or 0 in counts:
            raise GserError(f"gser://: a message in parts announced {sum(counts)} pieces in {nframes} frames, "
                            f"{len(pieces)} came")
        out, k = [], 0
        for c in counts:
            out.append(pieces[k] if c == 1 else _joined(pieces[k:k + c], ep))
            k += c
        return out

    async def read(self, deserializers=None):
        ep = self._endpoint("read")
        failed = []
        try:
            # A large message is deserialized on Dask's offload thread, as
            # Dask offloads deserializing messages of more than
            # distributed.comm.offload bytes: decompressing its frames
            # (the GIL released) and, for a whole Dask message, Dask's
            # deserializers are its cost. Small ones here.
            req = await ep._wait(ep._c.recv())
            loader = _part_loader(self.deserialize, deserializers, failed)
            nbytes_in, compressed = req.size
            threshold = _offload_threshold()
            if self.allow_offload and threshold and nbytes_in > threshold and compressed:
                ep.offloaded += 1
                out = await offload(functools.partial(req.result, parts=loader))
            elif (self.allow_offload and threshold and nbytes_in > threshold and self.deserialize
                  and self.handshake_options.get(_MSG_KEY)):
                # Perhaps a whole Dask message, deserialized as from_frames
                # offloads it (its name for Dask's offload).
                out = await _dask_comm_utils.offload(functools.partial(req.result, parts=loader))
            else:
                out = req.result(parts=loader)
            if type(out) is tuple:  # a whole Dask message
                return out[0]
            frames = frames_of(out, "gser://")
            if (self.handshake_options.get(_PARTS_KEY) and frames and type(frames[0]) is memoryview
                    and nbytes(frames[0]) >= _PARTS_HEAD.size
                    and bytes(frames[0][:len(_PARTS_MAGIC)]) == _PARTS_MAGIC):
                frames = await self._read_parts(ep, frames)
        except BaseException as e:
            if failed and e is failed[0]:
                # Dask's loads raised, for a part: as from_frames would.
                if isinstance(e, EOFError):
                    self.abort()
                    raise _closed_error(self, "read: truncated data") from e
                raise
            self.abort()
            if isinstance(e, Exception):
                # A failed endpoint, or a message that is not a Dask message
                # (GserError; anything else its decoding raised).
                raise _closed_error(self, "read", e) from e
            raise
        alloc = _alloc_state["fn"]
        if alloc is not None:
            frames = [_received(f, alloc) if type(f) is gser.DeviceArray else f for f in frames]
        try:
            return await from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,  # None: what Dask's own comms accept
                allow_offload=self.allow_offload,
            )
        except EOFError as e:
            # Frames that end early: the peer's data is not a Dask message.
            self.abort()
            raise _closed_error(self, "read: truncated data") from e

    async def close(self):
        """Wait until the peer took what was written (or failed), then close."""
        ep = self._ep
        if ep is None:
            return
        if self._sending:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained
        self._let_go(graceful=True)

    def abort(self):
        self._let_go(graceful=False)

    def _let_go(self, graceful):
        ep, self._ep = self._ep, None
        if ep is not None:
            self._finalizer.detach()
            if graceful:
                ep.close()  # completed sends are flushed first
            else:
                ep.abort()
            _release(ep.worker)


def _drop_endpoint(ep):
    if not ep.worker.closed:
        ep.abort()
        _release(ep.worker)


# ---- Dask's connection arguments ------------------------------------------------------------

# What a listener takes besides Dask's security arguments: the host and port
# to fill in (as tcp:// does) and what its handshake says over its own
# (Listener.on_connection; the scheduler's pickle protocol and compression).
_LISTENER_ARGS = frozenset({"default_host", "default_port", "handshake_overrides"})


def _check_connection_args(address: str, args: dict, listener: bool = False):
    """Honour or refuse each of the connection_args Dask passes (Security's
    get_connection_args / get_listen_args, a listener's defaults), never drop
    one: gser:// does not encrypt, so a demand for encryption or TLS is
    refused, as tcp:// refuses plaintext under require_encryption."""
    where = repr(PREFIX + address)
    required = args.get("require_encryption")
    if required is None:  # not passed: Dask's configuration decides, as Security would
        required = dask.config.get("distributed.comm.require-encryption", False)
    if required:
        raise RuntimeError(
            f"encryption required by Dask configuration, refusing communication from/to {where}: gser:// does "
            "not encrypt (its shared secret, distributed.comm.gser.secret, authenticates peers; the bytes travel "
            "in plaintext). Use tls:// for encryption, or leave require_encryption off to use gser://")
    if args.get("ssl_context") is not None:
        raise RuntimeError(
            f"a TLS Security (ssl_context) was given for {where}, and gser:// does not encrypt: refusing rather "
            "than communicating in plaintext. Use tls:// with this Security, or a Security without TLS for "
            "gser:// (its shared secret, distributed.comm.gser.secret, authenticates peers without encrypting)")
    if args.get("extra_conn_args"):
        raise TypeError(f"gser:// takes no extra_conn_args (given for {where}): {sorted(args['extra_conn_args'])!r}")
    # Keys Dask itself never passes: its comm contract (check_client_server
    # in distributed/comm/tests/test_comms.py) says a comm ignores them. Said
    # in the log, so that none goes unnoticed.
    unknown = sorted(set(args) - {"require_encryption", "ssl_context", "extra_conn_args"} - _LISTENER_ARGS)
    if unknown:
        logger.warning("gser: connection arguments %s for %s are not Dask's: ignored, as Dask's comms do", unknown,
                       where)
    if not listener and set(args) & _LISTENER_ARGS:
        raise TypeError(f"gser:// takes {sorted(set(args) & _LISTENER_ARGS)} when listening only (given for "
                        f"connecting to {where})")


# Refusals a retry cannot turn into a connection: Dask's connect() gives up
# at once on FatalCommClosedError, with this message, instead of retrying
# until its timeout and showing the reason only as the cause.
_FATAL = frozenset({"GSER_ERR_ACCESS", "GSER_ERR_WIRE_VERSION"})


# ---- connecting ---------------------------------------------------------------------------

class GserConnector(Connector):
    prefix = PREFIX
    comm_class = GserComm
    encrypted = False

    async def connect(self, address, deserialize=True, **connection_args):
        _check_connection_args(address, connection_args)
        host, port = parse_host_port(address)
        worker = _worker()
        try:
            ep = await worker.connect(host, port)
        except gser.ucx.ConnectionClosedError as e:
            _release(worker)
            error = FatalCommClosedError if e.status_name in _FATAL else CommClosedError
            raise error(f"gser: cannot connect to {PREFIX}{address}: {e}") from e
        except BaseException:
            _release(worker)
            raise
        # This side's address as tcp:// gives it: the connection's own port.
        try:
            info = ep.peer_info()
            local = PREFIX + unparse_host_port(info["local_host"], info["local_port"])
        except (gser.GserError, ConnectionError):  # closed under us: the comm's first read says so
            local = PREFIX + unparse_host_port(_local_ip_for(host), 0)
        peer = PREFIX + address
        comm = self.comm_class(ep, local, peer, deserialize)
        try:
            await ep.send({_HELLO_KEY: _HELLO_VERSION, "address": local, "to": peer})
        except BaseException as e:
            comm.abort()
            if isinstance(e, gser.ucx.ConnectionClosedError):
                raise CommClosedError(f"gser: {PREFIX}{address} closed the connection: {e}") from e
            raise
        return comm


def _check_hello(msg):
    """The peer's (local address, the address it connected to), or a ValueError."""
    if (type(msg) is not dict or msg.get(_HELLO_KEY) != _HELLO_VERSION or set(msg) != {_HELLO_KEY, "address", "to"}):
        raise ValueError(f"not a gser comm hello: {msg!r:.200}")
    for k in ("address", "to"):
        v = msg[k]
        if type(v) is not str or len(v) > 300 or not v.startswith(PREFIX):
            raise ValueError(f"gser comm hello: bad {k} {v!r:.200}")
        parse_host_port(v[len(PREFIX):])
    return msg["address"], msg["to"]


# From distributed 2023.6.1 on, a stopping Server aborts the comms still in
# their handshake (BaseListener.abort_handshaking_comms, which tracks them in
# on_connection); before, Listener alone. Found by its presence.
_ListenerBase = getattr(_dask_comm_core, "BaseListener", Listener)


class GserListener(_ListenerBase):
    prefix = PREFIX
    comm_class = GserComm
    encrypted = False

    def __init__(self, address, comm_handler, deserialize=True, allow_offload=True, default_host=None,
                 **connection_args):
        if address.startswith(PREFIX):
            address = address[len(PREFIX):]
        super().__init__()
        _check_connection_args(address, connection_args, listener=True)
        self.ip, self._port = parse_host_port(address, connection_args.get("default_port") or 0)
        self.default_host = default_host
        self.handshake_overrides = connection_args.get("handshake_overrides")
        self._ip = None
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self._listener = None
        self._worker = None
        self._hellos = set()  # endpoints accepted whose gser hello has not come yet
        self._handshaking = set()  # comms in Dask's handshake (BaseListener's own set, on every Dask)
        #: Connections dropped before they became comms (bad hello, dead peer).
        self.rejected = 0

    def _scheduler_side(self):
        """The local address that reaches this server's scheduler, or None.

        Dask tells a tcp:// or tls:// worker's listener that address
        (default_host) and no other scheme's; a Dask worker or nanny (the
        server whose handle_comm this listener serves) has its scheduler's
        address from the start, so the listener finds it there."""
        if self.default_host:
            return self.default_host
        server = getattr(self.comm_handler, "__self__", None)
        try:
            address = server.scheduler.address
            host = get_address_host(address)
        except Exception:  # not a worker, or no scheduler address yet: every interface
            return None
        return _local_ip_for(host) if host else None

    async def start(self):
        self._worker = _worker()
        # No host: as tcp://, the interface that reaches the scheduler (a
        # Dask worker's), else every interface; "0.0.0.0" and "::": every
        # interface (the transport's default); names resolved here.
        host = self.ip or self._scheduler_side() or ""
        self._ip = None if host in ("", "0.0.0.0") else host if host == "::" else ensure_ip(host)
        try:
            self._listener = self._worker.listen(self._handle, self._ip, self._port)
        except Exception as e:
            _release(self._worker)
            if isinstance(e, GserError) and e.status_name == "GSER_ERR_EXISTS":
                # As tcp:// raises it: a worker given a port range
                # (--worker-port 9000:9100) tries the next port on EADDRINUSE.
                where = self.prefix + unparse_host_port(self._ip or "0.0.0.0", self._port)
                raise OSError(errno.EADDRINUSE, f"gser: cannot listen on {where}: {e}") from e
            raise
        self._port = self._listener.port
        self._worker.on_failed.append(self._on_worker_failed)

    def _on_worker_failed(self, worker):
        """The worker failed for good (its shared-memory receive queue is
        blocked: gser.ucx.Worker.failed): listen on a new one, same port."""
        if self._listener is None or worker is not self._worker:
            return
        logger.warning("gser: %s: listening again on a new transport worker: %s", self.contact_address,
                       worker.failed)
        self._listener.close()
        self._worker = _worker()
        self._listener = self._worker.listen(self._handle, self._ip, self._port)
        self._worker.on_failed.append(self._on_worker_failed)
        _release(worker)

    def stop(self):
        lst, self._listener = self._listener, None
        if lst is not None:
            lst.close()
            _release(self._worker)

    def abort_handshaking_comms(self):
        """Abort the connections accepted but not yet handed to Dask: those
        still waiting for their gser hello, and comms in Dask's handshake. A
        stopping Server calls it (distributed 2023.6.1 on); gser keeps the
        same sets on older Dask, where it can be called by hand."""
        hellos, self._hellos = self._hellos, set()
        comms, self._handshaking = self._handshaking, set()
        for ep in hellos:
            ep.abort()
        for comm in comms:
            comm.abort()  # the same comms BaseListener tracks, where Dask has it

    async def _handle(self, ep: gser.ucx.Endpoint):
        timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), default="seconds")
        self._hellos.add(ep)
        try:
            hello = await asyncio.wait_for(ep.recv(), timeout)
            peer, local = _check_hello(hello)
        except Exception as e:
            self.rejected += 1
            logger.info("gser: dropped a connection to %s before its handshake: %s", self.contact_address, e)
            ep.abort()
            _release(ep.worker)
            return
        finally:
            self._hellos.discard(ep)
        if self._listener is None:
            # Stopped after it accepted this connection: close it, as tcp://
            # does, rather than start a handshake nobody will finish (the
            # peer's handshake has no timeout of its own).
            logger.info("gser: %s stopped before it handled a connection from %s", self.prefix, peer)
            ep.abort()
            _release(ep.worker)
            return
        comm = self.comm_class(ep, local, peer, self.deserialize)
        comm.allow_offload = self.allow_offload
        self._handshaking.add(comm)
        try:
            await self.on_connection(comm, self.handshake_overrides)
        except CommClosedError:
            logger.info("gser: connection from %s closed before the Dask handshake completed", peer)
            return
        finally:
            self._handshaking.discard(comm)
        await self.comm_handler(comm)

    def get_host_port(self):
        """The address listened on, names resolved (as tcp://'s bound address)."""
        if self._listener is None and self._worker is None:
            raise ValueError("invalid operation on a gser listener that was not started")
        return (self._ip or "0.0.0.0"), self._port

    @property
    def listen_address(self):
        return self.prefix + unparse_host_port(*self.get_host_port())

    @property
    def contact_address(self):
        host, port = self.get_host_port()
        return self.prefix + unparse_host_port(ensure_concrete_host(host, default_host=self.default_host), port)


# ---- the backend ---------------------------------------------------------------------------

class GserBackend(Backend):
    """Dask's comm backend for gser:// addresses (host:port, as tcp's)."""

    def get_connector(self):
        return GserConnector()

    def get_listener(self, loc, handle_comm, deserialize, **connection_args):
        return GserListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc):
        return parse_host_port(loc)[0]

    def get_address_host_port(self, loc):
        return parse_host_port(loc)

    def resolve_address(self, loc):
        host, port = parse_host_port(loc)
        return unparse_host_port(ensure_ip(host), port)

    def get_local_address_for(self, loc):
        host, port = parse_host_port(loc)
        host = ensure_ip(host)
        return unparse_host_port(_local_ip_for(host), None)


def register_backend():
    """Make gser:// known to Dask in this process (what the entry point does
    lazily, on the first gser address)."""
    if not isinstance(backends.get(SCHEME), GserBackend):
        backends[SCHEME] = GserBackend()
