"""A stand-in for cuDF: a DataFrame of device columns (rmm.DeviceBuffer
data) and host metadata, serialized as cuDF's Serializable is (device
frames plus a host frame, "is-cuda" and "lengths" per frame), and registered
with Dask by cudf.comm.serialize, as cuDF registers (Dask imports it lazily
on the first cudf object). Its device deserializer checks the owner type of
its buffers as cuDF releases do."""

import pickle

import numpy as np

import rmm

__version__ = "26.10.0+standin"  # PEP 440, as the real one's


class Buffer:
    """Device memory a column views, with the object that owns it (_owner)."""

    def __init__(self, owner):
        cai = owner.__cuda_array_interface__
        self._owner = owner
        self.ptr = int(cai["data"][0])
        self.size = int(np.prod(cai["shape"], dtype=np.int64)) * np.dtype(cai["typestr"]).itemsize

    @property
    def nbytes(self):
        return self.size

    def __len__(self):
        return self.size

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.ptr, False), "shape": (self.size,), "strides": None, "typestr": "|u1", "version": 0}


def as_buffer(data):
    return data if isinstance(data, Buffer) else Buffer(data)


class Serializable:
    """cuDF's serialization protocol (cudf.core.abc.Serializable)."""

    def serialize(self):
        raise NotImplementedError

    @classmethod
    def deserialize(cls, header, frames):
        raise NotImplementedError

    def device_serialize(self):
        header, frames = self.serialize()
        assert all(isinstance(f, (Buffer, memoryview)) for f in frames)
        header["type-serialized"] = pickle.dumps(type(self))
        header["is-cuda"] = [hasattr(f, "__cuda_array_interface__") for f in frames]
        header["lengths"] = [f.size if hasattr(f, "__cuda_array_interface__") else f.nbytes for f in frames]
        return header, frames

    @classmethod
    def device_deserialize(cls, header, frames):
        typ = pickle.loads(header["type-serialized"])
        frames = [as_buffer(f) if c else memoryview(f) for c, f in zip(header["is-cuda"], frames)]
        # As cuDF checks: device frames are what Dask's comms allocate.
        assert all((type(f._owner) is rmm.DeviceBuffer) if c else (type(f) is memoryview)
                   for c, f in zip(header["is-cuda"], frames)), [type(getattr(f, "_owner", f)) for f in frames]
        return typ.deserialize(header, frames)

    def host_serialize(self):
        header, frames = self.device_serialize()
        frames = [memoryview(_to_host(f)) if c else memoryview(f) for c, f in zip(header["is-cuda"], frames)]
        return header, frames

    @classmethod
    def host_deserialize(cls, header, frames):
        frames = [rmm.DeviceBuffer.to_device(f) if c else f for c, f in zip(header["is-cuda"], map(memoryview, frames))]
        return cls.device_deserialize(header, frames)


def _to_host(buf):
    from _devmem import host_view

    return host_view(buf.ptr, buf.size)


class DataFrame(Serializable):
    """Columns of fixed-width dtypes in device memory (rmm.DeviceBuffer), their
    names and dtypes as host metadata."""

    def __init__(self, data=None):
        self._columns = {}  # name -> (Buffer, dtype, length)
        for name, values in (data or {}).items():
            a = np.ascontiguousarray(values)
            buf = rmm.DeviceBuffer(ptr=int(a.ctypes.data), size=a.nbytes)
            self._columns[name] = (Buffer(buf), a.dtype, len(a))

    @property
    def columns(self):
        return list(self._columns)

    def __len__(self):
        return next(iter(self._columns.values()))[2] if self._columns else 0

    def to_pandas(self):
        import pandas

        return pandas.DataFrame({n: self.column_to_host(n) for n in self._columns})

    def column_to_host(self, name):
        buf, dtype, n = self._columns[name]
        return np.frombuffer(_to_host(buf).tobytes(), dtype)[:n]

    def column_owner(self, name):
        return self._columns[name][0]._owner

    def serialize(self):
        meta = [(name, dtype.str, n) for name, (_, dtype, n) in self._columns.items()]
        host = memoryview(pickle.dumps(meta))
        return {"columns": len(meta)}, [host] + [buf for buf, _, _ in self._columns.values()]

    @classmethod
    def deserialize(cls, header, frames):
        meta = pickle.loads(bytes(frames[0]))
        assert len(meta) == header["columns"] == len(frames) - 1
        out = cls()
        for (name, dtype, n), buf in zip(meta, frames[1:]):
            out._columns[name] = (buf, np.dtype(dtype), n)
        return out

    def equals(self, other):
        return (type(other) is DataFrame and self.columns == other.columns
                and all(np.array_equal(self.column_to_host(n), other.column_to_host(n)) and
                        self._columns[n][1] == other._columns[n][1] for n in self._columns))

    def __repr__(self):
        return f"<cudf.DataFrame columns={self.columns} rows={len(self)}>"
