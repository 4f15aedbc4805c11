"""Helpers for the cluster tests that every process of a LocalCluster can
import (the stand-ins' directory is on the workers' PYTHONPATH): task
functions, a type that reports the frames its cuda deserializer was given,
and one whose deserializer raises in one chosen worker."""

import numpy as np
from distributed.protocol import dask_deserialize, dask_serialize
from distributed.protocol.cuda import cuda_deserialize, cuda_serialize
from distributed.utils import log_errors

import rmm


def same(x):
    """A task that returns its argument (to move data to a worker)."""
    return x


def _worker_address():
    try:
        from distributed import get_worker

        return get_worker().address
    except ValueError:
        return None


class Probe:
    """Serialized as one device frame (an rmm.DeviceBuffer) and one host frame;
    deserialized, it says what types of frames the deserializer got."""

    def __init__(self, payload=b"probe", seen=None):
        self.payload = payload
        self.seen = seen


def _probe_frames(x):
    return {"n": len(x.payload)}, [rmm.DeviceBuffer.to_device(x.payload), memoryview(bytearray(x.payload))]


@cuda_serialize.register(Probe)
def _cuda_ser_probe(x):
    return _probe_frames(x)


@cuda_deserialize.register(Probe)
def _cuda_de_probe(header, frames):
    dev, host = frames
    payload = bytes(np.asarray(dev.copy_to_host()).tobytes()) if hasattr(dev, "copy_to_host") else None
    return Probe(payload, [_kind(f) for f in frames])


def _kind(f):
    """A frame's type, and for a memoryview whether it is writable."""
    name = f"{type(f).__module__}.{type(f).__qualname__}"
    return name + ("" if f.readonly else ":writable") if type(f) is memoryview else name


@dask_serialize.register(Probe)
def _dask_ser_probe(x):
    header, frames = _probe_frames(x)
    return header, [memoryview(frames[0].copy_to_host()), frames[1]]


@dask_deserialize.register(Probe)
def _dask_de_probe(header, frames):
    return Probe(bytes(frames[1]), [_kind(f) for f in frames])


def seen(x):
    return x.seen, x.payload


class Boom:
    """Deserializing it raises in the worker at address `where` (as cuDF's and
    RMM's deserializers raise on an assertion), anywhere else it loads."""

    def __init__(self, where):
        self.where = where


def _boom_frames(x):
    return {"where": x.where}, [memoryview(bytearray(b"x" * 100_000)), rmm.DeviceBuffer.to_device(b"y" * 1000)]


@cuda_serialize.register(Boom)
def _cuda_ser_boom(x):
    return _boom_frames(x)


@dask_serialize.register(Boom)
def _dask_ser_boom(x):
    header, frames = _boom_frames(x)
    return header, [frames[0], memoryview(frames[1].copy_to_host())]


def _load_boom(header, frames):
    with log_errors():
        if header["where"] == _worker_address():
            raise AssertionError("Boom: this deserializer raises here")
        return Boom(header["where"])


cuda_deserialize.register(Boom)(_load_boom)
dask_deserialize.register(Boom)(_load_boom)


def counting_allocator(n):
    """An allocator for distributed.comm.gser.device-allocator (counts its calls)."""
    global allocations
    allocations += 1
    return rmm.DeviceBuffer(size=n)


allocations = 0


def task_state(key, dask_worker=None):
    """The state of key in this worker (client.run), and the text of its error."""
    ts = dask_worker.state.tasks.get(key)
    return (ts.state, ts.exception_text) if ts is not None else (None, "")
