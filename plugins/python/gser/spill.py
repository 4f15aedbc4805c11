"""gser.dask.SpillStore: a Dask worker's data, spilled device -> host -> disk.

    from gser.dask import SpillStore
    LocalCluster(..., data=(SpillStore, {"device_memory_limit": "4GiB", "memory_limit": "8GiB"}))
    # or Worker(data=SpillStore(device_memory_limit=..., memory_limit=..., local_directory=...))

A MutableMapping, as dask-cuda's DeviceHostFile is, with three tiers, each
least recently used first out:

- device: objects with __cuda_array_interface__ (CuPy, Numba, gser.DeviceArray)
  stay as they are until the device tier holds more than device_memory_limit;
- host: a device object moves here as gser.to_bytes(obj) (the "host" family:
  its buffers packed on the device and copied to host once per object, not
  once per buffer), host objects as themselves; above memory_limit the
  oldest go to disk;
- disk: one file per key under local_directory, written with gser.dump (frames
  streamed from their own memory); objects gser declines (pandas frames, sets,
  arbitrary classes) are written with Dask's own serialization
  (distributed.protocol.serialize_bytelist: its "dask" and "pickle" families).

Reading a key brings it back: from disk by mapping the file (gser.load(...,
mmap=True): the arrays view the mapping; the file is deleted at once, the
mapping lives as long as the objects), a device object back onto the device
(from_bytes/load with device=True), which may push older keys down a tier.

What differs from dask-cuda: no proxy objects (a key is in exactly one tier,
and reading it unspills it whole); device objects are recognised by
__cuda_array_interface__ only (a dataframe of device columns is a host object
here unless gser carries it); sizes are nbytes where the object has it, else
dask.sizeof. The files are removed when a key is deleted and all of them by
close(), when the store is garbage-collected or at interpreter exit: nothing
on disk outlives the store. The files go under local_directory, else the
worker's own directory (worker_local_directory, which Dask passes to data=
(SpillStore, {...}) and removes when the worker closes), else the system's
temporary directory. A full disk (OSError while spilling) leaves the key where it was,
logs an error naming it, and evict() returns -1, as Dask's SpillBuffer does:
no key is lost. The store implements Dask's manual-eviction protocol (fast,
evict()) and spilled_total, so the worker's memory monitor can spill from it
and its metrics count what is spilled.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import MutableMapping

import gser

logger = logging.getLogger(__name__)

__all__ = ["SpillStore"]


def _parse_bytes(n):
    if n is None or n == 0:
        return None
    if isinstance(n, str):
        from dask.utils import parse_bytes

        return parse_bytes(n)
    return int(n)


def _is_device(x) -> bool:
    return hasattr(type(x), "__cuda_array_interface__") or hasattr(x, "__cuda_array_interface__")


def _nbytes(x) -> int:
    n = getattr(x, "nbytes", None)
    if isinstance(n, int) and n >= 0:
        return n
    if _is_device(x):  # the interface's shape and typestr ("<f4": 4 bytes an item)
        cai = x.__cuda_array_interface__
        n = int(cai["typestr"][2:])
        for extent in cai["shape"]:
            n *= extent
        return n
    from dask.sizeof import sizeof

    return int(sizeof(x))


# The forms a key takes below its own tier.
_FLAT = "flat"        # a device object as gser.to_bytes(obj): back with device=True
_GSER = "gser"        # a host object in a gser file
_GSER_DEV = "gser-device"  # a device object in a gser file
_DASK = "dask"        # a host object in a file of Dask's frames


class SpillStore(MutableMapping):
    def __init__(self, device_memory_limit=None, memory_limit=None, local_directory=None,
                 worker_local_directory=None):
        self.device_memory_limit = _parse_bytes(device_memory_limit)
        self.memory_limit = _parse_bytes(memory_limit)
        base = local_directory or worker_local_directory or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        self.directory = tempfile.mkdtemp(prefix="gser-spill-", dir=base)
        # Removed when the store is collected or the interpreter exits,
        # whichever comes first (Dask's worker never closes its data; in a
        # worker's own directory, the worker removes it when it closes).
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.directory, True)
        self._lock = threading.RLock()
        self._device = OrderedDict()  # key -> (obj, nbytes)
        self._host = OrderedDict()    # key -> (obj or FlatBytes, nbytes, form or None)
        self._disk = {}               # key -> (path, nbytes, form, bytes on disk)
        self._device_bytes = 0
        self._host_bytes = 0
        self._serial = 0
        self.counts = {"device_to_host": 0, "host_to_disk": 0, "disk_to_host": 0, "host_to_device": 0,
                       "disk_errors": 0}

    # ---- the mapping ---------------------------------------------------------------------------

    def __setitem__(self, key, value):
        with self._lock:
            if key in self:
                self._drop(key)
            n = _nbytes(value)
            if _is_device(value):
                self._device[key] = (value, n)
                self._device_bytes += n
            else:
                self._host[key] = (value, n, None)
                self._host_bytes += n
            self._balance()

    def __getitem__(self, key):
        with self._lock:
            if key in self._device:
                self._device.move_to_end(key)
                return self._device[key][0]
            if key in self._host:
                obj, n, form = self._host[key]
                if form != _FLAT:
                    self._host.move_to_end(key)
                    return obj
                value = gser.from_bytes(obj, device=True)  # back on the device
                self._host_bytes -= n
                del self._host[key]
                self.counts["host_to_device"] += 1
            elif key in self._disk:
                value = self._read(key)
            else:
                raise KeyError(key)
            self[key] = value  # its tier again, the most recently used
            return value

    def __delitem__(self, key):
        with self._lock:
            if key not in self:
                raise KeyError(key)
            self._drop(key)

    def __contains__(self, key):
        return key in self._device or key in self._host or key in self._disk

    def __iter__(self):
        return iter(list(self._device) + list(self._host) + list(self._disk))

    def __len__(self):
        return len(self._device) + len(self._host) + len(self._disk)

    def close(self):
        """Forget every key and remove the files."""
        with self._lock:
            self._device.clear()
            self._host.clear()
            self._disk.clear()
            self._device_bytes = self._host_bytes = 0
            self._finalizer()

    # ---- what Dask's worker asks -----------------------------------------------------------------

    @property
    def fast(self):
        """Objects held in host memory as themselves (Dask's manual-eviction
        protocol tests it for emptiness)."""
        return {k: v[0] for k, v in self._host.items() if v[2] is None}

    def evict(self) -> int:
        """Move the least recently used host key to disk: its size in memory,
        or -1 when nothing could be spilled (logged). Never raises."""
        with self._lock:
            for key in list(self._host):
                n = self._host[key][1]
                ok = self._to_disk(key)
                return n if ok else -1
            return -1

    @property
    def spilled_total(self):
        """(bytes the spilled keys take in memory, bytes their files take)."""
        from distributed.spill import SpilledSize

        return SpilledSize(sum(v[1] for v in self._disk.values()), sum(v[3] for v in self._disk.values()))

    @property
    def tiers(self) -> dict:
        """Which keys are where: {"device": [...], "host": [...], "disk": [...]}."""
        return {"device": list(self._device), "host": list(self._host), "disk": list(self._disk)}

    @property
    def nbytes(self) -> dict:
        return {"device": self._device_bytes, "host": self._host_bytes,
                "disk": sum(v[1] for v in self._disk.values())}

    # ---- moving keys -----------------------------------------------------------------------------

    def _drop(self, key):
        if key in self._device:
            self._device_bytes -= self._device.pop(key)[1]
        elif key in self._host:
            self._host_bytes -= self._host.pop(key)[1]
        elif key in self._disk:
            path = self._disk.pop(key)[0]
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def _balance(self):
        if self.device_memory_limit is not None:
            while self._device_bytes > self.device_memory_limit and len(self._device) > 0:
                key, (obj, n) = next(iter(self._device.items()))
                flat = gser.to_bytes(obj)  # one packed device-to-host copy
                del self._device[key]
                self._device_bytes -= n
                self._host[key] = (flat, n, _FLAT)
                self._host_bytes += n
                self.counts["device_to_host"] += 1
        if self.memory_limit is not None:
            for key in list(self._host):
                if self._host_bytes <= self.memory_limit:
                    break
                if not self._to_disk(key):
                    break  # the disk is full: the rest stays where it is

    def _path(self):
        self._serial += 1
        return os.path.join(self.directory, f"{self._serial}.spill")

    def _to_disk(self, key) -> bool:
        obj, n, form = self._host[key]
        path = self._path()
        try:
            if form == _FLAT:
                with open(path, "wb") as f:
                    f.write(obj)
                how = _GSER_DEV
            else:
                how = self._dump(obj, path)
            size = os.path.getsize(path)
        except OSError:
            self.counts["disk_errors"] += 1
            logger.error("gser.SpillStore: could not spill %r to %s (kept in memory)", key, self.directory,
                         exc_info=True)
            try:
                os.unlink(path)
            except OSError:
                pass
            return False
        del self._host[key]
        self._host_bytes -= n
        self._disk[key] = (path, n, how, size)
        self.counts["host_to_disk"] += 1
        return True

    @staticmethod
    def _dump(obj, path) -> str:
        try:
            gser.dump(obj, path)
            return _GSER
        except (NotImplementedError, TypeError):
            pass
        from distributed.protocol import serialize_bytelist

        frames = serialize_bytelist(obj, on_error="raise")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            for fr in frames:
                mv = memoryview(fr).cast("B")
                while len(mv):
                    mv = mv[os.write(fd, mv):]
        finally:
            os.close(fd)
        return _DASK

    def _read(self, key):
        path, n, how, _ = self._disk.pop(key)
        try:
            if how == _DASK:
                from distributed.protocol import deserialize_bytes

                with open(path, "rb") as f:
                    return deserialize_bytes(f.read())
            self.counts["disk_to_host"] += 1
            return gser.load(path, mmap=True, device=how == _GSER_DEV)
        except BaseException:
            self._disk[key] = (path, n, how, _)
            raise
        finally:
            if key not in self._disk:
                os.unlink(path)  # the mapping outlives the name
