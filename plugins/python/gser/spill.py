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
  streamed from their own memory; numpy arrays, pandas frames and series,
  Arrow tables, containers of them); objects gser declines (sets, arbitrary
  classes) are written with Dask's own serialization
  (its "dask" and "pickle" families, as serialize_bytelist writes them but
  uncompressed; deserialize_bytes reads them).

Reading a key brings it back: from disk read into memory (gser.load: one
read into the final buffer, huge pages where the kernel allows; not mapped,
as a mapping would keep the file's pages and the kernel would write its dirty
ones back to the disk), a device object back onto the device (device=True),
which may push older keys down a tier. A spilled value that is still
referenced elsewhere in the process (a running task's input, another
key's container) is not read at all: the store remembers it weakly and
hands back that same object, as Dask's SpillBuffer does (its zict.Cache over
a WeakValueMapping), so the worker never holds two copies; objects that
take no weak reference (bytes, tuples) are always read. Such a key's file
was never read and still holds its value, so it is kept: when the key goes
down again nothing is written. The file of a key read from disk is removed
as soon as the key is read, as SpillBuffer does: a spill file deleted before
the kernel writes it back never reaches the disk, where a kept one does
(measured: keeping files cost 2-3x the time of writing the keys again,
nearly all of it system time). keep_files=True keeps those files too, while
the key's value is unchanged, so that going down again writes nothing (a
device key goes straight to disk, with no device-to-host copy): for a disk
faster than the writeback, or values read back many times. Values are
assumed not to be changed in place, as Dask assumes of task results;
setting a key again drops its file. compression="auto" (the default) writes
with lz4 each 1 MiB chunk of a frame that lz4 shrinks, sample and whole, to
at most 0.3 of its size (compressing such data costs less than moving it
through the page cache; chunks that shrink only to 0.5, such as a counter
column's, or not at all are written as they are: gser.dump's
compression_threshold and compression_chunk_size); None never
compresses; "lz4" or "zstd" compress as gser.dump does (each frame that a
sample shrinks to 0.9 or less, as Dask's maybe_compress).

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
                 worker_local_directory=None, keep_files=False, compression="auto"):
        self.device_memory_limit = _parse_bytes(device_memory_limit)
        self.memory_limit = _parse_bytes(memory_limit)
        self.keep_files = bool(keep_files)
        self.compression = compression
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
        # keep_files: keys read back from disk whose file still holds their
        # value: going down again costs no write (values are not changed in place, as
        # Dask assumes of task results; setting a key again drops its file).
        self._kept = {}               # key -> (path, form, bytes on disk)
        # Spilled values still referenced elsewhere in the process (a task
        # holding its input, a client's future): reading such a key back
        # returns that object instead of a second copy from disk, as Dask's
        # SpillBuffer does (zict.Cache over a WeakValueMapping). Objects that
        # take no weak reference are simply not remembered.
        self._alive = weakref.WeakValueDictionary()  # key -> the value that went down
        self._device_bytes = 0
        self._host_bytes = 0
        self._serial = 0
        self.counts = {"device_to_host": 0, "host_to_disk": 0, "disk_to_host": 0, "host_to_device": 0,
                       "disk_errors": 0, "writes_saved": 0, "reads_saved": 0}

    # ---- the mapping ---------------------------------------------------------------------------

    def __setitem__(self, key, value):
        with self._lock:
            if key in self:
                self._drop(key)
            self._put(key, value)

    def _put(self, key, value):
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
                value = self._alive.pop(key, None)
                if value is None:
                    value = gser.from_bytes(obj, device=True)  # back on the device
                    self.counts["host_to_device"] += 1
                else:
                    self.counts["reads_saved"] += 1
                self._host_bytes -= n
                del self._host[key]
            elif key in self._disk:
                value = self._alive.pop(key, None)
                alive = value is not None
                if alive:
                    self.counts["reads_saved"] += 1
                else:
                    value = self._read(key)
                path, n, how, size = self._disk.pop(key)
                if self.keep_files or alive:  # an object never read from its file: the file still holds it
                    self._kept[key] = (path, how, size)
                else:
                    _unlink(path)
            else:
                raise KeyError(key)
            self._put(key, value)  # its tier again, the most recently used
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
            self._kept.clear()
            self._alive.clear()
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
        """(bytes the spilled keys take in memory, bytes the store's files
        take: those of keys read back and kept included)."""
        from distributed.spill import SpilledSize

        return SpilledSize(sum(v[1] for v in self._disk.values()),
                           sum(v[3] for v in self._disk.values()) + sum(v[2] for v in self._kept.values()))

    @property
    def tiers(self) -> dict:
        """Which keys are where: {"device": [...], "host": [...], "disk": [...]}."""
        return {"device": list(self._device), "host": list(self._host), "disk": list(self._disk)}

    @property
    def nbytes(self) -> dict:
        return {"device": self._device_bytes, "host": self._host_bytes,
                "disk": sum(v[1] for v in self._disk.values())}

    # ---- moving keys -----------------------------------------------------------------------------

    def _remember(self, key, value):
        try:
            self._alive[key] = value
        except TypeError:  # takes no weak reference (bytes, tuples, ints)
            pass

    def _drop(self, key):
        self._alive.pop(key, None)
        if key in self._device:
            self._device_bytes -= self._device.pop(key)[1]
        elif key in self._host:
            self._host_bytes -= self._host.pop(key)[1]
        elif key in self._disk:
            _unlink(self._disk.pop(key)[0])
        kept = self._kept.pop(key, None)
        if kept:
            _unlink(kept[0])

    def _balance(self):
        if self.device_memory_limit is not None:
            while self._device_bytes > self.device_memory_limit and len(self._device) > 0:
                key, (obj, n) = next(iter(self._device.items()))
                del self._device[key]
                self._device_bytes -= n
                kept = self._kept.pop(key, None)
                if kept:  # its file holds it: straight to disk, nothing copied
                    self._disk[key] = (kept[0], n, kept[1], kept[2])
                    self._remember(key, obj)
                    self.counts["writes_saved"] += 1
                    continue
                self._host[key] = (gser.to_bytes(obj), n, _FLAT)  # one packed device-to-host copy
                self._remember(key, obj)
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
        kept = self._kept.pop(key, None)
        if kept:
            path, how, size = kept
            self.counts["writes_saved"] += 1
        else:
            path = self._path()
            try:
                if form == _FLAT:
                    _write_all(path, [obj])
                    how = _GSER_DEV
                else:
                    how = self._dump(obj, path, n)
                size = os.path.getsize(path)
            except OSError:
                self.counts["disk_errors"] += 1
                logger.error("gser.SpillStore: could not spill %r to %s (kept in memory)", key, self.directory,
                             exc_info=True)
                _unlink(path)
                return False
            self.counts["host_to_disk"] += 1
        del self._host[key]
        self._host_bytes -= n
        self._disk[key] = (path, n, how, size)
        if form is None:  # a _FLAT key's device object was remembered when it left the device
            self._remember(key, obj)
        return True

    def _dump(self, obj, path, n) -> str:
        try:
            if self.compression == "auto":
                gser.dump(obj, path, compression="lz4", compression_threshold=_SQUEEZE,
                          compression_chunk_size=_CHUNK)
            else:
                gser.dump(obj, path, compression=self.compression)
            return _GSER
        except (NotImplementedError, TypeError):
            pass
        _write_all(path, _dask_frames(obj))
        return _DASK

    def _read(self, key):
        """The value in key's file, read into memory (the file stays)."""
        path, n, how, _ = self._disk[key]
        self.counts["disk_to_host"] += 1
        if how != _DASK:
            # Read, not mapped: a mapping keeps the file's pages, and its
            # dirty ones are then written back to the disk.
            return gser.load(path, device=how == _GSER_DEV)
        import numpy as np
        from distributed.protocol import deserialize_bytes

        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            buf = np.empty(os.fstat(fd).st_size, dtype=np.uint8)  # numpy's memory: huge pages when large
            mv, got = memoryview(buf), 0
            while got < len(mv):
                r = os.readv(fd, [mv[got:]])
                if r == 0:
                    raise OSError(f"gser.SpillStore: {path} ended after {got} bytes")
                got += r
        finally:
            os.close(fd)
        return deserialize_bytes(mv)


# A frame is written compressed when lz4 shrinks its samples and itself to
# at most this fraction: data that compresses that well costs less to
# compress than to move through the page cache; frames of counters (about
# 0.5) or of random floats (1.0) are written as they are.
_SQUEEZE = 0.3
# ... decided chunk by chunk: a block of pandas columns of which one does not
# compress that well costs lz4 time only for the others.
_CHUNK = 1 << 20


def _dask_frames(obj):
    """Dask's serialize_bytelist(obj) without its compression: frames of
    the object's own memory, which deserialize_bytes reads back (compressing
    costs more CPU than the page cache saves)."""
    import msgpack
    from distributed.protocol.serialize import serialize_and_split
    from distributed.protocol.utils import pack_frames_prelude

    header, frames = serialize_and_split(obj, on_error="raise")
    header["compression"] = (None,) * len(frames)
    header["count"] = len(frames)
    out = [msgpack.dumps(header, use_bin_type=True), *frames]
    out.insert(0, pack_frames_prelude(out))
    return out


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_all(path, frames):
    """frames written one after the other from their own memory (a full
    disk raises OSError, the partial file is the caller's to remove)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for fr in frames:
            mv = memoryview(fr).cast("B")
            while len(mv):
                mv = mv[os.write(fd, mv):]
    finally:
        os.close(fd)
