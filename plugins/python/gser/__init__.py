"""gser: GPU-aware serialization, for Python.

    header, frames = gser.dumps(obj)          # header: bytes, frames: list
    obj = gser.loads(header, frames)
    b = gser.to_bytes(obj)                    # one flattened gser.FlatBytes (bytes-like)
    obj = gser.from_bytes(b)                  # device=True: device buffers back on the device
    gser.dump(obj, file)                      # the same bytes to a path, fd or file object
    obj = gser.load(file, mmap=True)          # arrays view the mapped file

Types, exactly (subclasses are refused, so that what comes back is of the
same type): None, bool, int (of any size), float, complex, str, bytes, list,
tuple (kept distinct from list), dict (with keys of any of these types), set,
frozenset, datetime.datetime, date, time and timedelta (tzinfo None, a
datetime.timezone or a zoneinfo.ZoneInfo by key; fold kept), decimal.Decimal,
uuid.UUID, fractions.Fraction, range, slice, Ellipsis, bytearray and memoryview
(large bytes travel as frames of their own), numpy arrays of any dtype but
objects (dtype, shape, strides and writability kept, not copied; views that
are neither C nor Fortran order nor broadcasts are copied once into C order,
as Dask does), numpy scalars of any dtype but objects (back as the same
scalar type), other buffer exporters (back as numpy arrays), objects with
__cuda_array_interface__,
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
keep every item's type. Python's standard types (complex, ints beyond 64
bits, sets, datetimes, Decimal, ...) travel inside a "python.tree" object
(docs/wire-format.md), where long lists of one such type, of mixed scalars,
of dicts with the same str keys or of tuples of one length go as a few
typed columns. Namedtuples and dataclasses travel only once registered by
name (register_namedtuple, register_dataclass): nothing of the data names
code to run.

Other types travel as themselves once registered: register_type(cls,
to_gser, from_gser) sends what to_gser returns (a device array, an Arrow
table, a numpy array, a dict...) and the receiver's from_gser rebuilds the
object from it (register_dataclass and register_namedtuple do that for their
fields); register_lazy(toplevel, loader) defers the import until an
object of that package is met. CuPy, Numba device arrays, PyTorch tensors,
pyarrow arrays and record batches, and pandas DataFrame, Series, indexes and
scalars (gser._pandas) are registered that way here, lazily.

Errors from the core raise GserError (a ValueError) whose message names the
failing value's path, e.g. "GSER_ERR_FORMAT: gser_deserialize: $[2].payload:
...". The Dask integration is in gser.dask; gser.ucx moves messages between
processes with UCX (asyncio), and gser.comm is a Dask comm backend on it
(gser://HOST:PORT; HAVE_UCX says whether this build has them).
"""

# The extension links UCX's libucp and libucs (when built with gser::ucx, as
# wheels are): on a machine without them it cannot load, and the loader's
# message alone does not say what to install.
try:
    from gser import _gser
except ImportError as e:
    if "libuc" in str(e):
        raise ImportError(
            f"gser: the extension module gser._gser needs UCX's shared libraries, which this machine lacks ({e}). "
            "Install them (Debian and Ubuntu: apt-get install libucx0; elsewhere UCX (libucp.so.0, libucs.so.0) on the "
            "loader's path), or build gser without UCX: pip install . --config-settings=cmake.define.GSER_BUILD_UCX=OFF"
        ) from e
    raise

from gser._gser import (  # noqa: F401
    DEPTH_MAX,
    DEVICE_BACKEND,
    HAVE_ARROW,
    HAVE_UCX,
    WIRE_VERSION,
    ArrowArray,
    Declined,
    DeviceArray,
    DeviceFrame,
    FlatBytes,
    GserError,
    GserUnsupported,
    __version__,
    device_allocation,
    device_copy,
    dumps,
    from_bytes,
    loads,
    register_lazy,
    register_type,
    registered,
    set_device_allocator,
    to_bytes,
    unregister_type,
)
from gser._flatio import dump, load  # noqa: F401

__all__ = [
    "DEPTH_MAX",
    "DEVICE_BACKEND",
    "HAVE_ARROW",
    "HAVE_UCX",
    "WIRE_VERSION",
    "ArrowArray",
    "Declined",
    "DeviceArray",
    "DeviceFrame",
    "FlatBytes",
    "GserError",
    "GserUnsupported",
    "__version__",
    "device_allocation",
    "device_copy",
    "dump",
    "dumps",
    "from_bytes",
    "load",
    "loads",
    "register_dataclass",
    "register_lazy",
    "register_namedtuple",
    "register_type",
    "registered",
    "set_device_allocator",
    "to_bytes",
    "unregister_type",
]


def register_namedtuple(cls, *, name=None):
    """Send instances of exactly the namedtuple class cls as themselves: their
    fields as a tuple under name (default "<module>.<qualname>"), rebuilt by
    the receiver's cls._make. The receiver must register the same class under
    the same name; unregistered namedtuples are refused (NotImplementedError:
    Dask's next family), like every type gser does not know."""
    if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_make") and hasattr(cls, "_fields")):
        raise TypeError(f"register_namedtuple: {cls!r} is not a namedtuple class")
    register_type(cls, tuple, cls._make, name=name)


def register_dataclass(cls, *, name=None):
    """Send instances of exactly the dataclass cls as themselves: a dict of
    its fields (dataclasses.fields, init or not) under name (default
    "<module>.<qualname>"); the receiver makes the instance without calling
    __init__ or __post_init__ (as pickle does) and sets the fields, frozen
    or not. The receiver must register the same class under the same name;
    unregistered dataclasses are refused (NotImplementedError: Dask's next
    family). Fields that are not in the message are left unset."""
    import dataclasses

    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"register_dataclass: {cls!r} is not a dataclass")
    names = tuple(f.name for f in dataclasses.fields(cls))
    fields = frozenset(names)
    setattr_ = object.__setattr__

    def to_gser(obj):
        return {n: getattr(obj, n) for n in names}

    def from_gser(value):
        if type(value) is not dict or not fields.issuperset(value):
            raise GserError(f"a {cls.__qualname__} whose fields are not the registered class's")
        obj = cls.__new__(cls)
        for k, v in value.items():
            setattr_(obj, k, v)
        return obj

    register_type(cls, to_gser, from_gser, name=name)


# ---- libraries registered lazily (see register_type) ------------------------------------------
#
# Each loader runs the first time gser meets an object of the package (or a
# "python.type" name under it), imports it and registers its types. Device
# arrays travel as device buffers (zero-copy where the comm carries device
# frames) and come back through the library's own zero-copy import of
# gser.DeviceArray (__cuda_array_interface__ or DLPack); a receiver without a
# device backend gets them as host numpy arrays, which the same functions copy
# to its device. Written against the libraries' documented APIs; they do not
# install on Debian 12, so the tests use stand-ins with those APIs.


def _contiguous(x, make):
    # Fortran order travels with its strides, as Dask's cuda family keeps it.
    return x if x.flags.c_contiguous or x.flags.f_contiguous else make(x)


def _register_cupy():
    import cupy

    register_type(cupy.ndarray, lambda x: _contiguous(x, cupy.ascontiguousarray), cupy.asarray, name="cupy.ndarray")


def _register_numba():
    from numba import cuda

    register_type(cuda.cudadrv.devicearray.DeviceNDArray, lambda x: x, cuda.as_cuda_array,
                  name="numba.cuda.DeviceNDArray")


def _register_torch():
    import torch

    def to_gser(t):
        t = t.detach().contiguous()
        return t if t.device.type == "cuda" else t.numpy()  # CUDA: DLPack / CAI; CPU: numpy, zero-copy

    def from_gser(v):
        return torch.from_dlpack(v) if isinstance(v, DeviceArray) else torch.from_numpy(v)

    register_type(torch.Tensor, to_gser, from_gser, name="torch.Tensor")


def _register_pyarrow():
    import pyarrow

    register_type(pyarrow.RecordBatch, lambda b: b, pyarrow.record_batch, name="pyarrow.RecordBatch")
    register_type(pyarrow.Array, lambda a: a, pyarrow.array, name="pyarrow.Array")


def _register_pandas():
    from gser import _pandas

    _pandas.register()


def _register_dask():
    # dask.dataframe's shuffle results (registered with pandas' types); any
    # other object of the dask package leaves this loader pending.
    import sys

    if "dask.dataframe.backends" in sys.modules:
        _register_pandas()
    else:
        register_lazy("dask", _register_dask)


for _top, _loader in (("cupy", _register_cupy), ("numba", _register_numba), ("torch", _register_torch),
                      ("pyarrow", _register_pyarrow), ("pandas", _register_pandas), ("dask", _register_dask)):
    register_lazy(_top, _loader)
del _top, _loader
