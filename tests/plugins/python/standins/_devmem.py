"""Device memory of the stand-ins: host memory, which gser's emulated device
backend takes as device memory (GSER_DEVICE=emulated). Copies go through
ctypes.memmove, as a CUDA library's would go through cudaMemcpy."""

import ctypes

import numpy as np

_FILL = 0xDB  # fresh device memory never holds the right answer


class Allocation:
    """size bytes of "device" memory, owned by this object."""

    __slots__ = ("_mem", "size", "__weakref__")

    def __init__(self, size):
        self.size = int(size)
        self._mem = np.full(max(self.size, 1), _FILL, np.uint8)

    @property
    def ptr(self):
        return int(self._mem.ctypes.data) if self.size else 0


def memcpy(dst, src, n):
    if n:
        ctypes.memmove(dst, src, n)


def cai_ptr(obj):
    return int(obj.__cuda_array_interface__["data"][0])


def host_view(ptr, nbytes):
    """The bytes at a "device" pointer, copied to the host."""
    out = np.empty(nbytes, np.uint8)
    memcpy(out.ctypes.data, ptr, nbytes)
    return out
