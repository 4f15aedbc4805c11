"""Where a Dask process's received device buffers live: the allocation Dask's
own ucx:// comm gives them (distributed.comm.ucx.init_once), made gser's
device allocator (gser.set_device_allocator) once per process by the first
gser:// comm or gser-family load that may put data on the device.

The choice, first that applies: the function the Dask config key
distributed.comm.gser.device-allocator names ("package.module.function",
called with a size in bytes, returning an object with
__cuda_array_interface__); a function the process gave
gser.set_device_allocator itself; rmm.DeviceBuffer(size=n) when RMM is
importable (distributed.rmm.pool-size, if set, makes RMM a pool of that
size, as Dask does); a Numba device array; none (gser's own device pool,
frames stay gser.DeviceArray).
"""

from __future__ import annotations

import importlib
import logging
import os
import weakref

import dask
from dask.utils import parse_bytes

from gser import _gser

logger = logging.getLogger("gser.comm")

CONFIG_KEY = "distributed.comm.gser.device-allocator"

#: pid: the process the choice was made in; fn: the function chosen (or None).
state: dict = {"pid": None, "fn": None}


def _import_function(name: str):
    module, _, attr = name.rpartition(".")
    if not module:
        raise ValueError(f"{CONFIG_KEY}: {name!r} is not a dotted function name")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise TypeError(f"{CONFIG_KEY}: {name!r} is not callable")
    return fn


def choose():
    """The config key's function, else RMM's, else Numba's, else None."""
    name = dask.config.get(CONFIG_KEY, None)
    if name:
        return _import_function(name) if isinstance(name, str) else name
    pool_size = dask.config.get("distributed.rmm.pool-size", None)
    try:
        import rmm
    except ImportError:
        pass
    else:
        def rmm_device_buffer(n):
            return rmm.DeviceBuffer(size=n)

        if pool_size is not None:
            rmm.reinitialize(pool_allocator=True, managed_memory=False, initial_pool_size=parse_bytes(pool_size))
        return rmm_device_buffer
    if pool_size is not None:
        logger.warning("Initial RMM pool size defined, but RMM is not available. "
                       "Please consider installing RMM or removing the pool size option.")
    try:
        import numba.cuda
    except ImportError:
        return None

    def numba_device_array(n):
        a = numba.cuda.device_array((n,), dtype="u1")
        weakref.finalize(a, numba.cuda.current_context)
        return a

    return numba_device_array


def setup():
    """Make the choice in this process (once) and return the function."""
    if state["pid"] != os.getpid():
        fn = None
        if _gser.DEVICE_BACKEND != "none":
            current = _gser.set_device_allocator(None)
            _gser.set_device_allocator(current)
            fn = current if current is not None and not dask.config.get(CONFIG_KEY, None) else choose()
            if fn is not None and fn is not current:
                _gser.set_device_allocator(fn)
        state.update(pid=os.getpid(), fn=fn)
    return state["fn"]


def received(frame, alloc):
    """A received device frame (gser.DeviceArray) as the allocator's object:
    the allocation gser received it into, or (a frame that shared a packed
    transfer) a new allocation it is copied into on the device."""
    hit = _gser.device_allocation(frame.ptr)
    if hit is not None and hit[1] == frame.nbytes:
        return hit[0]
    out = alloc(frame.nbytes)
    _gser.device_copy(out, frame)
    return out
