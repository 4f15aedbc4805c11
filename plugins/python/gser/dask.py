"""gser as a Dask serialization family named "gser".

Turn it on in every process of a cluster with Dask's preload (the one switch):

    dask scheduler --preload gser.dask
    dask worker tcp://scheduler:8786 --preload gser.dask
    # clients: distributed.client.preload, or gser.dask.register(default=True)

or, for a LocalCluster, call gser.dask.register(default=True) before starting
it: its scheduler and workers then preload gser.dask too. A process that
preloads gser.dask makes "gser" its first serializer family (Dask config
``gser.default``, default true; false only registers the family). A scheduler
that preloads it refuses workers and clients that have not loaded gser, with
an error that names gser and the fix, before they hold or receive any data.

The family follows Dask's contract: dumps(x) returns a msgpack-serializable
header and a list of frames, and raises NotImplementedError for what gser
cannot carry as the same type (an arbitrary object, an unregistered
namedtuple or dataclass, a subclass of a standard type, a pandas column of
arbitrary objects, a device array or an Arrow table
whose type is not registered with gser.register_type, ...) and, as gser.Declined, for what gser would carry
more slowly than Dask's own path (many small items, which pickle carries
faster); Dask then tries its next family. gser never pickles.

Dask serializes the items of a list, tuple or dict wrapped in to_serialize()
(task results among them) one by one: a list of 1,000,000 floats becomes
1,000,002 frames whatever the families. With collections=True (the default),
register() makes distributed.protocol.serialize.serialize try gser on the
whole collection first when "gser" is the first serializer; if gser declines
it, Dask's own behaviour follows unchanged.

A message is only serialized with gser for a peer that has loaded gser: every
process that registered the family says so in its comm handshake, and data
for a peer that did not goes through Dask's own families.
"""

from __future__ import annotations

import importlib
import logging
import os
import time

from gser import _alloc, _gser
from gser._gser import Declined, GserError

logger = logging.getLogger(__name__)

FAMILY = "gser"
#: For Client(serializers=...): gser first, Dask's own families after it.
SERIALIZERS = (FAMILY, "dask", "pickle")
#: For Client(deserializers=...): gser, Dask's own serializers and its error
#: messages, but not pickle, which runs code from the data. Add "pickle" where
#: the cluster is trusted and objects that neither gser nor Dask's "dask"
#: family carries (sets, arbitrary classes) must come back.
DESERIALIZERS = (FAMILY, "dask", "error")

_HEADER_KEY = "gser"
_HEADER_VERSION = 1
#: The comm handshake key a process with the family sets (Comm.handshake_info).
HANDSHAKE_KEY = "gser"
#: The handshake key of a comm that carries gser.DeviceFrame frames as device
#: memory (a comm class sets it in its own handshake_info): towards such a
#: peer device buffers stay in device frames; towards any other they are
#: staged into host frames (the "host" family), as Dask's TCP comm needs.
HANDSHAKE_DEVICE_KEY = "gser-device"
#: The Dask config key preloads read: make gser the default family (true).
CONFIG_DEFAULT = "gser.default"

_FIX = (
    "load gser in every process of the cluster: start workers and the scheduler with "
    "`--preload gser.dask` (or list gser.dask in the Dask config keys distributed.worker.preload, "
    "distributed.scheduler.preload and distributed.client.preload), or call gser.dask.register() in the client"
)

_state = {"original_serialize": None, "original_handshake": None, "collections": False, "default": False}
_stats = {"dumps": 0, "declined": 0, "refused": 0, "loads": 0}


def stats() -> dict:
    """How often this process serialized with gser (dumps), let Dask's own
    path take an object because gser would have been slower (declined) or
    cannot carry it (refused), and loaded gser frames (loads): the family's
    entry points (counted in C) and the collection path together."""
    family = _gser._family_stats()
    return {k: v + family[k] for k, v in _stats.items()}

# What _gser.dumps raises for objects gser cannot carry; Dask wants NotImplementedError.
_REFUSED = (NotImplementedError, GserError, OverflowError, UnicodeError)


def _ser_module():
    # distributed.protocol re-exports a function named serialize, which hides
    # the submodule from attribute access: ask the import system for it.
    return importlib.import_module("distributed.protocol.serialize")


def _peer_has_gser(context) -> bool:
    """Whether the process a comm writes to has loaded gser (its handshake
    says so). Without a context (spilling to disk, serialize() called
    directly) the reader is this process, which has."""
    recipient = context.get("recipient") if context else None
    return recipient is None or HANDSHAKE_KEY in recipient


def _families(context):
    recipient = context.get("recipient") if context else None
    return _DEVICE_HOST if recipient and recipient.get(HANDSHAKE_DEVICE_KEY) else _HOST


#: Whether loads puts what was device memory at the sender back on the device.
_RESTORE_DEVICE = _gser.DEVICE_BACKEND != "none"


def _py_dumps(x, context=None):
    """Dask family dumps: ({"gser": 1}, [gser header, data frames...]).
    What _gser._family_dumps (gser.dask.dumps) does in one C call; kept as
    the reference the tests compare it with.

    Raises NotImplementedError for what gser cannot carry as the same type,
    gser.Declined (a NotImplementedError) for what Dask's own path carries
    faster, and NotImplementedError for a peer without gser.
    """
    # _peer_has_gser and _families inline: this is on the path of every
    # object Dask serializes (a tiny one's whole dumps is ~1 us).
    recipient = context.get("recipient") if context else None
    if recipient is not None and HANDSHAKE_KEY not in recipient:
        raise NotImplementedError("gser: the receiving process has not loaded gser")
    try:
        # An array's header frame is writable, as Dask's numpy frames: small
        # arrays inside it load writable and zero-copy (in-process) as Dask's do.
        # Other objects' headers stay bytes (Dask deep-copies and pickles those).
        # compression, the header's entry that Dask's serialize_and_split and its
        # compression read per frame: False (never split, compressed or wrapped
        # in memoryview) for device frames, as Dask's "cuda" family says of all
        # of its frames; None (Dask's default handling) for host frames.
        frames, compression = _dask_dumps(
            x, _DEVICE_HOST if recipient and recipient.get(HANDSHAKE_DEVICE_KEY) else _HOST, False)
    except Declined:
        _stats["declined"] += 1
        raise
    except NotImplementedError:
        _stats["refused"] += 1
        raise
    except _REFUSED as e:
        _stats["refused"] += 1
        raise NotImplementedError(f"gser cannot serialize this {type(x).__name__}: {e}") from e
    _stats["dumps"] += 1
    return {_HEADER_KEY: _HEADER_VERSION, "compression": compression}, frames


_HOST = ("host",)
_DEVICE_HOST = ("device", "host")
_dask_dumps = _gser._dask_dumps
_dask_loads = _gser._dask_loads

#: Dask family dumps: ({"gser": 1, "compression": (...)}, [gser header, data
#: frames...]), what _py_dumps says, in one C call (a tiny object's whole
#: round trip is ~1 us, of which the Python function took ~0.2).
dumps = _gser._family_dumps

#: This process's id, kept without a system call per loads (_alloc.setup()
#: asks os.getpid() each time): forked children set their own.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def loads(header, frames):
    """Dask family loads: the object dumps serialized, viewing the frames.

    numpy arrays come back with the writability they had at the sender, as
    Dask's numpy serializer gives them: zero-copy, except an array that was
    writable but arrives in a read-only frame, which is copied (as Dask does).
    What was device memory at the sender comes back on this process's device
    (gser.DeviceArray, or the registered type) when it has a device backend,
    else in host memory.
    """
    version = header.get(_HEADER_KEY)
    if version != _HEADER_VERSION:
        raise ValueError(f"gser.dask: header version {version!r}, this gser reads {_HEADER_VERSION}")
    _stats["loads"] += 1
    if _RESTORE_DEVICE and _alloc.state["pid"] != _PID[0]:  # what setup() checks, without its getpid()
        _alloc.setup()  # device buffers restored here live where Dask's ucx:// puts them (RMM, ...)
    return _dask_loads(frames, _RESTORE_DEVICE)  # ValueError without frames


if not _RESTORE_DEVICE:
    # Without a device backend loads is one C call (the same checks).
    _py_loads, loads = loads, _gser._family_loads


def _serialize_homes():
    """Where Dask's serialize() is looked up: the module's global (used by
    Dask's own message and spill code) and the package's name for it
    (`from distributed.protocol import serialize`, for code imported after
    register())."""
    return (_ser_module(), importlib.import_module("distributed.protocol"))


def _serialize_wrapper(original):
    Serialize = _ser_module().Serialize

    def serialize(x, serializers=None, on_error="message", context=None, iterate_collection=None):
        if serializers is None and _state["default"]:
            serializers = SERIALIZERS
        if serializers and FAMILY in serializers:
            if not _peer_has_gser(context):
                serializers = [s for s in serializers if s != FAMILY]
            elif _state["collections"] and serializers[0] == FAMILY:
                wrapped = type(x) is Serialize
                data = x.data if wrapped else x
                if type(data) in (list, tuple, dict):
                    try:
                        # Wrapped, Dask would serialize each item on its own.
                        frames, compression = _dask_dumps(data, _families(context), wrapped)
                    except Declined:
                        # Dask's path is faster for this one: all of it, gser
                        # included, would only try (and decline) item by item.
                        _stats["declined"] += 1
                        serializers = [s for s in serializers if s != FAMILY]
                    except _REFUSED:
                        _stats["refused"] += 1
                    else:
                        _stats["dumps"] += 1
                        return {_HEADER_KEY: _HEADER_VERSION, "serializer": FAMILY, "compression": compression}, frames
        return original(x, serializers, on_error, context, iterate_collection)

    serialize.__wrapped__ = original
    serialize.__doc__ = original.__doc__
    return serialize


def _handshake_wrapper(original):
    """Comm.handshake_info with the family's key added. original is the
    attribute as Comm's class holds it: a staticmethod up to distributed
    2023.4, a plain function (an instance method, which reads the comm's
    same_host) from 2023.5 on (dask/distributed#7768). The wrapper keeps
    its kind, so that every caller of either version gets what it expects."""
    if isinstance(original, staticmethod):
        function = original.__func__

        def handshake_info():
            return {**function(), HANDSHAKE_KEY: _HEADER_VERSION}

        handshake_info.__wrapped__ = function
        return staticmethod(handshake_info)

    def handshake_info(self):
        return {**original(self), HANDSHAKE_KEY: _HEADER_VERSION}

    handshake_info.__wrapped__ = original
    return handshake_info


def _comm_class():
    return importlib.import_module("distributed.comm.core").Comm


def _add_preloads():
    """Make clusters started from this process (LocalCluster) load gser.dask
    in their scheduler and workers, through Dask's preload config, which
    nannies hand to the worker processes."""
    import dask.config

    saved = _state.setdefault("saved_config", {})
    for key in ("distributed.scheduler.preload", "distributed.worker.preload", CONFIG_DEFAULT):
        current = dask.config.get(key, default=None)
        if key == CONFIG_DEFAULT:
            new = True
        else:
            current_list = [current] if isinstance(current, str) else list(current or [])
            new = current_list if __name__ in current_list else [*current_list, __name__]
        if new != current:
            saved.setdefault(key, current)
            dask.config.set({key: new})


def _restore_config():
    import dask.config

    for key, value in _state.pop("saved_config", {}).items():
        dask.config.set({key: value})


def register(collections: bool = True, default: bool = False) -> None:
    """Register the "gser" family with Dask in this process (idempotent; a
    second call changes the options). This is the entry point for anything
    that wants gser in a process, a comm backend included.

    collections: when "gser" is the first serializer, serialize whole lists,
        tuples and dicts with gser (falling back to Dask's item-by-item path
        when gser declines) instead of item by item.
    default: also make SERIALIZERS the serializers wherever Dask is given none
        (worker-to-worker transfers, task results); and add gser.dask to the
        scheduler's and workers' preloads in Dask's config, so that a
        LocalCluster started from this process loads it everywhere.

    Either way, the process says in its comm handshakes that it reads gser,
    and gser is used only towards peers that say so too.
    """
    ser = _ser_module()
    ser.register_serialization_family(FAMILY, dumps, loads)
    _state["collections"] = bool(collections)
    _state["default"] = bool(default)
    if _state["original_serialize"] is None:
        _state["original_serialize"] = ser.serialize
        wrapper = _serialize_wrapper(ser.serialize)
        for module in _serialize_homes():
            module.serialize = wrapper
    if _state["original_handshake"] is None:
        comm = _comm_class()
        _state["original_handshake"] = comm.__dict__["handshake_info"]
        comm.handshake_info = _handshake_wrapper(_state["original_handshake"])
    if default:
        _add_preloads()


def unregister() -> None:
    """Undo register(): remove the family, restore Dask's serialize(), the
    comm handshake and the Dask config register(default=True) changed."""
    ser = _ser_module()
    ser.families.pop(FAMILY, None)
    if _state["original_serialize"] is not None:
        for module in _serialize_homes():
            module.serialize = _state["original_serialize"]
        _state["original_serialize"] = None
    if _state["original_handshake"] is not None:
        _comm_class().handshake_info = _state["original_handshake"]
        _state["original_handshake"] = None
    _state["collections"] = False
    _state["default"] = False
    _restore_config()


def registered() -> bool:
    """Whether the family is registered in this process."""
    return _state["original_serialize"] is not None


# ---- the scheduler's check when a worker or a client joins ------------------------------------


def refusal(role: str) -> str:
    """The error a process without gser gets when it joins a gser cluster."""
    return (
        f"gser: this {role} has not loaded gser, and the scheduler's cluster sends data with the gser "
        f"serialization family, which it could not read. Fix: {_FIX}."
    )


def _guard_scheduler(scheduler) -> None:
    """Refuse workers and clients whose handshake does not say gser: they
    would get gser frames (forwarded through the scheduler) they cannot read.
    They are refused before they hold or receive data, so the cluster keeps
    its data."""
    handlers = scheduler.handlers
    if getattr(handlers.get("register-worker"), "_gser_guard", False):
        return
    add_worker, add_client = handlers["register-worker"], handlers["register-client"]

    async def register_worker(comm, **msg):
        if registered() and HANDSHAKE_KEY not in (comm.remote_info or {}):
            text = refusal("worker")
            logger.error("%s (worker %s)", text, msg.get("address"))
            await comm.write({"status": "error", "message": text, "time": time.time()})
            return None
        return await add_worker(comm, **msg)

    async def register_client(comm, **msg):
        if registered() and HANDSHAKE_KEY not in (comm.remote_info or {}):
            text = refusal("client")
            logger.error("%s (client %s)", text, msg.get("client"))
            # The client raises ImportError with this text (Client._ensure_connected).
            await comm.write([{"op": "stream-start", "error": text}])
            return None
        return await add_client(comm, **msg)

    register_worker._gser_guard = register_client._gser_guard = True
    handlers["register-worker"] = register_worker
    handlers["register-client"] = register_client


def dask_setup(server=None) -> None:
    """Entry point of `--preload gser.dask` (scheduler, worker, nanny, client):
    register the family, as the default unless the Dask config key
    gser.default is false; a scheduler also refuses peers without gser."""
    import dask.config

    register(default=bool(dask.config.get(CONFIG_DEFAULT, default=True)))
    if server is not None and "register-worker" in getattr(server, "handlers", {}):
        _guard_scheduler(server)


# The comm backend "gser://" (gser.comm, on gser::ucx): importing gser.dask
# makes it known to Dask, as the package's entry point does.
if _gser.HAVE_UCX:
    from gser import comm as _comm  # noqa: E402

    _comm.register_backend()

# The spill store for workers' data= (gser/spill.py).
from gser.spill import SpillStore  # noqa: E402,F401
