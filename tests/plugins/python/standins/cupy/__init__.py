"""A stand-in for CuPy (pure Python, device memory is the emulated backend's
host memory): ndarray(shape, dtype, memptr, strides, order) with
__cuda_array_interface__, data (a MemoryPointer), flags, strides, views by
indexing and .T; asarray, ascontiguousarray, array, asnumpy, dtype."""

import numpy as np

from _devmem import Allocation, host_view, memcpy

__version__ = "14.2.0+standin"  # PEP 440: current Dask parses cupy.__version__ (protocol/cupy.py)

dtype = np.dtype


class _Memory:
    """Device memory that something else owns (a DeviceBuffer, a frame)."""

    def __init__(self, ptr, size, owner):
        self.ptr, self.size, self.owner = int(ptr), int(size), owner


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem = mem
        self.offset = int(offset)

    @property
    def ptr(self):
        return self.mem.ptr + self.offset if self.mem.ptr else 0


class _Flags(dict):
    def __getattr__(self, name):
        return self[name.upper()]


def _c_strides(shape, itemsize):
    strides, s = [], itemsize
    for n in reversed(shape):
        strides.append(s)
        s *= max(int(n), 1)
    return tuple(reversed(strides))


class ndarray:
    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if isinstance(shape, int):
            shape = (shape,)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        if strides is None:
            strides = _c_strides(self.shape, self.dtype.itemsize)
            if order == "F":
                strides = tuple(reversed(_c_strides(tuple(reversed(self.shape)), self.dtype.itemsize)))
        self.strides = tuple(int(s) for s in strides)
        if memptr is None:
            memptr = MemoryPointer(Allocation(self.nbytes), 0)
        self.data = memptr

    # -- layout ----------------------------------------------------------------------------
    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def _layout(self):
        # A host array with this layout over one item (its flags; never read).
        return np.lib.stride_tricks.as_strided(np.empty(1, self.dtype), self.shape, self.strides)

    @property
    def flags(self):
        a = self._layout()
        return _Flags(C_CONTIGUOUS=bool(a.flags.c_contiguous), F_CONTIGUOUS=bool(a.flags.f_contiguous),
                      OWNDATA=False)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False),
                "strides": None if self.flags.c_contiguous else self.strides, "version": 3,
                "descr": [("", self.dtype.str)]}

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    # -- views ----------------------------------------------------------------------------
    def _span_bounds(self):
        lo = hi = 0
        for n, s in zip(self.shape, self.strides):
            if n == 0:
                return 0, 0
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        return lo, hi + self.itemsize

    def __getitem__(self, idx):
        # Index a host array of offsets, as numpy would, to find the view's layout.
        lo, hi = self._span_bounds()
        probe = np.ndarray(self.shape, self.dtype, buffer=np.zeros(max(hi - lo, self.itemsize), np.uint8),
                           offset=-lo, strides=self.strides)
        key = idx if isinstance(idx, tuple) else (idx,)
        view = probe[key if Ellipsis in key else key + (Ellipsis,)]  # always a view, 0-d ones too
        base = probe.__array_interface__["data"][0] - (-lo)
        off = view.__array_interface__["data"][0] - base
        return ndarray(view.shape, self.dtype, MemoryPointer(self.data.mem, self.data.offset + off), view.strides)

    @property
    def T(self):
        return self.transpose()

    def transpose(self):
        return ndarray(self.shape[::-1], self.dtype, self.data, self.strides[::-1])

    # -- copies ---------------------------------------------------------------------------
    def get(self, stream=None, order="C"):
        """To the host (cupy.ndarray.get)."""
        if self.nbytes == 0:
            return np.empty(self.shape, self.dtype)
        lo, hi = self._span_bounds()
        raw = host_view(self.data.ptr + lo, hi - lo)
        return np.ndarray(self.shape, self.dtype, buffer=raw, offset=-lo, strides=self.strides).copy(order="K")

    def copy(self, order="C"):
        return array(self, copy=True, order=order)

    def set(self, arr):
        a = np.asarray(arr, dtype=self.dtype)
        if self.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        elif self.flags.f_contiguous:
            a = np.asfortranarray(a)
        else:
            raise NotImplementedError("set() into a strided array")
        memcpy(self.data.ptr, a.ctypes.data, a.nbytes)

    def __repr__(self):
        return f"<cupy.ndarray shape={self.shape} dtype={self.dtype}>"


def _from_host(a, order="K"):
    a = np.asarray(a)
    f = order == "F" or (order in ("K", "A") and a.flags.f_contiguous and not a.flags.c_contiguous)
    a = np.array(a, order="F" if f else "C")  # 0-d stays 0-d
    out = ndarray(a.shape, a.dtype, order="F" if f else "C")
    memcpy(out.data.ptr, a.ctypes.data, a.nbytes)
    return out


def asarray(a, dtype=None, order=None):
    """A cupy.ndarray: a itself, a zero-copy view of anything with
    __cuda_array_interface__, or host data copied to the device."""
    if isinstance(a, ndarray):
        out = a
    elif hasattr(a, "__cuda_array_interface__"):
        cai = a.__cuda_array_interface__
        dt = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides") or _c_strides(shape, dt.itemsize)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        out = ndarray(shape, dt, MemoryPointer(_Memory(cai["data"][0], nbytes, a), 0), strides)
    else:
        out = _from_host(a)
    if dtype is not None and np.dtype(dtype) != out.dtype:
        out = _from_host(out.get().astype(dtype))
    return out


def array(obj, dtype=None, copy=True, order="K"):
    if isinstance(obj, ndarray):
        host = obj.get()
        if order == "C":
            host = np.ascontiguousarray(host)
        if not (obj.flags.c_contiguous or obj.flags.f_contiguous) and order in ("K", "A"):
            host = np.ascontiguousarray(host)
        out = _from_host(host, order if order in ("C", "F") else "K")
        return out if dtype is None else asarray(out, dtype)
    return _from_host(np.asarray(obj, dtype=dtype), order)


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else array(a, copy=True, order="C")


def asnumpy(a, stream=None, order="C"):
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def empty(shape, dtype=float, order="C"):
    return ndarray(shape, dtype, order=order)


def arange(*args, dtype=None):
    return _from_host(np.arange(*args, dtype=dtype))
