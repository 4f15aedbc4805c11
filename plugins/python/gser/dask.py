"""gser as a Dask serialization family named "gser".

    import gser.dask
    gser.dask.register()
    client = Client(cluster, serializers=gser.dask.SERIALIZERS,
                    deserializers=gser.dask.DESERIALIZERS)

register() adds the family with
distributed.protocol.serialize.register_serialization_family, following
Dask's family contract: dumps(x) returns a msgpack-serializable header dict
and a list of frames; an object gser cannot carry as the same type (a
pandas frame, a set, an int above 2**64-1, a bytearray, a device array or an
Arrow table, which would come back as gser.DeviceArray / gser.ArrowArray, ...)
raises NotImplementedError, so Dask falls through to the next family in
`serializers=[...]`. gser never pickles.

Dask serializes the items of a list, tuple or dict wrapped in to_serialize()
(task results among them) one by one, and a list of 1,000,000 floats then
becomes 1,000,002 frames whatever the families. With collections=True (the
default), register() also makes distributed.protocol.serialize.serialize try
gser on the whole collection first when "gser" is the first serializer, so
that such a list is sent as one contiguous array; if gser cannot carry it,
Dask's own behaviour follows unchanged.

Every process that receives gser frames must have called register(): in a
multi-process cluster start workers (and the scheduler) with
`--preload gser.dask`, which calls dask_setup() below.
"""

from __future__ import annotations

import importlib

from gser import _gser
from gser._gser import GserError

FAMILY = "gser"
#: For Client(serializers=...): gser first, Dask's own families after it.
SERIALIZERS = (FAMILY, "dask", "pickle")
#: For Client(deserializers=...): also accept Dask's error messages.
DESERIALIZERS = (FAMILY, "dask", "pickle", "error")

_HEADER_KEY = "gser"
_HEADER_VERSION = 1

_state = {"original_serialize": None, "collections": False, "default": False}


def dumps(x):
    """Dask family dumps: ({"gser": 1}, [gser header, data frames...]).

    Raises NotImplementedError for what gser cannot carry as the same type.
    """
    try:
        header, frames = _gser.dumps(x, strict=True)
    except NotImplementedError:
        raise
    except (GserError, OverflowError, UnicodeError) as e:
        raise NotImplementedError(f"gser cannot serialize this {type(x).__name__}: {e}") from e
    return {_HEADER_KEY: _HEADER_VERSION}, [header, *frames]


def _writable(frame):
    """Dask may hand over read-only frames (after decompression): copy those
    once, so that loaded arrays are writable as Dask users expect."""
    try:
        mv = memoryview(frame)
    except TypeError:
        return frame  # a device frame
    return bytearray(mv) if mv.readonly else frame


def loads(header, frames):
    """Dask family loads: the object dumps serialized."""
    version = header.get(_HEADER_KEY)
    if version != _HEADER_VERSION:
        raise ValueError(f"gser.dask: header version {version!r}, this gser reads {_HEADER_VERSION}")
    if not frames:
        raise ValueError("gser.dask: no frames (the first frame is gser's header)")
    frames = [_writable(f) for f in frames]
    return _gser.loads(frames[0], frames[1:])


def _ser_module():
    # distributed.protocol re-exports a function named serialize, which hides
    # the submodule from attribute access: ask the import system for it.
    return importlib.import_module("distributed.protocol.serialize")


def _serialize_wrapper(original):
    Serialize = _ser_module().Serialize

    def serialize(x, serializers=None, on_error="message", context=None, iterate_collection=None):
        if serializers is None and _state["default"]:
            serializers = SERIALIZERS
        if _state["collections"] and serializers and serializers[0] == FAMILY:
            data = x.data if type(x) is Serialize else x
            if type(data) in (list, tuple, dict):
                try:
                    header, frames = dumps(data)
                except NotImplementedError:
                    pass
                else:
                    header["serializer"] = FAMILY
                    return header, frames
        return original(x, serializers, on_error, context, iterate_collection)

    serialize.__wrapped__ = original
    serialize.__doc__ = original.__doc__
    return serialize


def register(collections: bool = True, default: bool = False) -> None:
    """Register the "gser" family with Dask (idempotent).

    collections: when "gser" is the first serializer, serialize whole lists,
        tuples and dicts with gser (falling back to Dask's item-by-item path
        when gser raises NotImplementedError) instead of item by item.
    default: also use SERIALIZERS where Dask is given no serializers (for
        example worker-to-worker transfers). Every process of the cluster
        must then have registered gser.
    """
    ser = _ser_module()
    ser.register_serialization_family(FAMILY, dumps, loads)
    _state["collections"] = bool(collections)
    _state["default"] = bool(default)
    if (collections or default) and _state["original_serialize"] is None:
        _state["original_serialize"] = ser.serialize
        ser.serialize = _serialize_wrapper(ser.serialize)


def unregister() -> None:
    """Undo register(): remove the family and restore Dask's serialize()."""
    ser = _ser_module()
    ser.families.pop(FAMILY, None)
    if _state["original_serialize"] is not None:
        ser.serialize = _state["original_serialize"]
        _state["original_serialize"] = None
    _state["collections"] = False
    _state["default"] = False


def dask_setup(server=None) -> None:
    """Entry point of `dask worker --preload gser.dask` (and of the scheduler's)."""
    register()


# The comm backend "gser://" (gser.comm, on gser::ucx): importing gser.dask
# makes it known to Dask, as the package's entry point does.
if _gser.HAVE_UCX:
    from gser import comm as _comm  # noqa: E402

    _comm.register_backend()
