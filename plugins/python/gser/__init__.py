"""gser: GPU-aware serialization, for Python.

    header, frames = gser.dumps(obj)          # header: bytes, frames: list
    obj = gser.loads(header, frames)
    b = gser.to_bytes(obj)                    # one flattened bytes object
    obj = gser.from_bytes(b)                  # device=True: device buffers back on the device

Types, exactly (subclasses are refused, so that what comes back is of the
same type): None, bool, int (int64, or up to 2**64-1; larger raises
OverflowError), float, str, bytes, list, tuple (kept distinct from list),
dict with None/bool/int/float/str/bytes keys, buffer-protocol objects (numpy
arrays keep dtype and shape and are not copied; other exporters come back as
numpy arrays, untyped bytes such as bytearray as memoryviews; non-contiguous
arrays are copied once into C order), objects with __cuda_array_interface__,
serialized as device frames (gser.DeviceFrame) and loaded as gser.DeviceArray
(__cuda_array_interface__ v3, copy_to_host()), and Arrow tables with the Arrow
PyCapsule interface (__arrow_c_device_array__ / __arrow_c_array__), loaded as
gser.ArrowArray, which hands the table over once through the same interface.
to_bytes stages device data into host frames. The device backend follows
GSER_DEVICE (cuda, emulated, none; default: cuda when a GPU is present):
gser.DEVICE_BACKEND. Anything else raises NotImplementedError: gser never
pickles.

Lists and tuples of ints, floats or bools travel as one contiguous typed
array and come back as lists/tuples of the same Python types; mixed ones
keep every item's type.

Errors from the core raise GserError (a ValueError) whose message names the
failing value's path, e.g. "GSER_ERR_FORMAT: gser_deserialize: $[2].payload:
...". The Dask integration is in gser.dask.
"""

from gser._gser import (  # noqa: F401
    DEPTH_MAX,
    DEVICE_BACKEND,
    HAVE_ARROW,
    WIRE_VERSION,
    ArrowArray,
    Declined,
    DeviceArray,
    DeviceFrame,
    GserError,
    __version__,
    dumps,
    from_bytes,
    loads,
    register_lazy,
    register_type,
    registered,
    to_bytes,
    unregister_type,
)

__all__ = [
    "DEPTH_MAX",
    "DEVICE_BACKEND",
    "HAVE_ARROW",
    "WIRE_VERSION",
    "ArrowArray",
    "Declined",
    "DeviceArray",
    "DeviceFrame",
    "GserError",
    "__version__",
    "dumps",
    "from_bytes",
    "loads",
    "register_lazy",
    "register_type",
    "registered",
    "to_bytes",
    "unregister_type",
]
