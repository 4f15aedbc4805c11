"""A stand-in for RMM (pure Python, device memory is the emulated backend's
host memory): DeviceBuffer with RMM's constructor, attributes and copies,
and reinitialize() recording the pool it was asked for."""

import numpy as np

from _devmem import Allocation, host_view, memcpy

__version__ = "26.10.0+standin"  # PEP 440, as the real one's

#: The keyword arguments of the last reinitialize() (a test reads the pool size).
_reinitialized = None
#: How many DeviceBuffers were made (a test reads it).
allocations = 0


def reinitialize(pool_allocator=False, managed_memory=False, initial_pool_size=None, maximum_pool_size=None,
                 devices=0, logging=False, log_file_name=None):
    global _reinitialized
    _reinitialized = dict(pool_allocator=pool_allocator, managed_memory=managed_memory,
                          initial_pool_size=initial_pool_size)


class DeviceBuffer:
    """rmm.DeviceBuffer(ptr=0, size=0, stream=...): size bytes of device
    memory, copied from the host memory at ptr when ptr is given."""

    def __init__(self, *, ptr=0, size=0, stream=None):
        global allocations
        allocations += 1
        self._alloc = Allocation(size)
        if ptr and size:
            memcpy(self._alloc.ptr, ptr, size)

    @property
    def ptr(self):
        return self._alloc.ptr

    @property
    def size(self):
        return self._alloc.size

    nbytes = size

    def __len__(self):
        return self.size

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": (self.size,), "strides": None, "typestr": "|u1",
                "version": 0}

    def copy_to_host(self, ary=None, stream=None):
        data = host_view(self.ptr, self.size)
        if ary is None:
            return data
        np.asarray(memoryview(ary)).reshape(-1).view(np.uint8)[:] = data
        return ary

    def tobytes(self):
        return self.copy_to_host().tobytes()

    @staticmethod
    def to_device(b, stream=None):
        mv = memoryview(b).cast("B") if memoryview(b).nbytes else memoryview(b"")
        a = np.frombuffer(mv, np.uint8) if mv.nbytes else np.empty(0, np.uint8)
        return DeviceBuffer(ptr=int(a.ctypes.data), size=a.nbytes)

    def __reduce__(self):
        return DeviceBuffer.to_device, (self.tobytes(),)

    def __repr__(self):
        return f"<rmm.DeviceBuffer size={self.size}>"
