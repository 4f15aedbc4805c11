"""numba.cuda.cudadrv.devicearray.DeviceNDArray, as Numba's: shape,
strides, dtype, gpu_data (the memory it views, which it keeps alive)."""

import numpy as np

from _devmem import Allocation, host_view, memcpy


class MemoryPointer:
    """Device memory at ptr, size bytes, kept alive by owner."""

    def __init__(self, ptr, size, owner=None):
        self.ptr = int(ptr)
        self.size = int(size)
        self.owner = owner

    @property
    def device_pointer_value(self):
        return self.ptr


def _c_strides(shape, itemsize):
    strides, s = [], itemsize
    for n in reversed(shape):
        strides.append(s)
        s *= max(int(n), 1)
    return tuple(reversed(strides))


def _span(shape, strides, itemsize):
    if any(n == 0 for n in shape):
        return 0
    return itemsize + sum((n - 1) * abs(s) for n, s in zip(shape, strides))


class DeviceNDArray:
    def __init__(self, shape, strides, dtype, stream=0, gpu_data=None):
        if isinstance(shape, int):
            shape = (shape,)
        if isinstance(strides, int):
            strides = (strides,)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.strides = tuple(int(s) for s in strides) if strides is not None else _c_strides(self.shape,
                                                                                            self.dtype.itemsize)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        span = _span(self.shape, self.strides, self.dtype.itemsize)
        if gpu_data is None:
            mem = Allocation(span)
            gpu_data = MemoryPointer(mem.ptr, span, mem)
        self.gpu_data = gpu_data
        self.stream = stream

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def device_ctypes_pointer(self):
        import ctypes

        return ctypes.c_void_p(self.gpu_data.ptr or None)

    @property
    def flags(self):
        a = self._shadow()
        return {"C_CONTIGUOUS": bool(a.flags.c_contiguous), "F_CONTIGUOUS": bool(a.flags.f_contiguous)}

    def _shadow(self):
        # A host array of the same layout (flags only: never read).
        return np.lib.stride_tricks.as_strided(np.empty(1, self.dtype), self.shape, self.strides)

    def is_c_contiguous(self):
        return self.flags["C_CONTIGUOUS"]

    def is_f_contiguous(self):
        return self.flags["F_CONTIGUOUS"]

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "strides": None if self.is_c_contiguous() else self.strides,
                "data": (self.gpu_data.ptr, False), "typestr": self.dtype.str, "stream": None, "version": 3}

    def __len__(self):
        return self.shape[0]

    def copy_to_host(self, ary=None, stream=0):
        span = _span(self.shape, self.strides, self.dtype.itemsize)
        if span == 0:
            out = np.empty(self.shape, self.dtype)
        else:
            raw = host_view(self.gpu_data.ptr, span)
            out = np.ndarray(self.shape, self.dtype, buffer=raw, strides=self.strides).copy(order="K")
        if ary is not None:
            ary[...] = out
            return ary
        return out

    def copy_to_device(self, ary, stream=0):
        src = ary.copy_to_host() if hasattr(ary, "copy_to_host") else np.asarray(ary)
        src = np.ascontiguousarray(src, dtype=self.dtype).reshape(self.shape)
        if self.is_c_contiguous():
            memcpy(self.gpu_data.ptr, src.ctypes.data, src.nbytes)
        elif self.is_f_contiguous():
            f = np.asfortranarray(src)
            memcpy(self.gpu_data.ptr, f.ctypes.data, f.nbytes)
        else:
            raise NotImplementedError("copy_to_device into a strided device array")

    def __repr__(self):
        return f"<numba.cuda.DeviceNDArray shape={self.shape} dtype={self.dtype}>"
