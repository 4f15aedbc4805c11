"""gser.dump and gser.load: the flattened form to and from files and streams.

A path, a descriptor (int) or a binary file object. Descriptors, and file
objects that have one (open(...), sockets in blocking mode, raw pipes), go
through gser's C reader and writer: frames are written with writev from
their own memory, never joined first, and read straight into one buffer of
the message's size, or mapped (mmap=True, regular files). Other file objects
(io.BytesIO, a buffered pipe, a socket with a timeout) are written piece by
piece through write() and read through readinto().
"""

import io
import os
import socket

from gser._gser import _dump_fd, _dump_write, _flat_need, _load_fd, from_bytes

__all__ = ["dump", "load"]

_PATH = (str, bytes, os.PathLike)


def _fileno(file):
    try:
        return file.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def _seekable(file):
    try:
        return file.seekable()
    except (AttributeError, OSError, ValueError):
        return False


def dump(obj, file, families=None, compression=None, compression_threshold=None, compression_chunk_size=None):
    """dump(obj, file, families=('host',), compression=None, compression_threshold=None,
            compression_chunk_size=None) -> int

    Write obj in gser's flattened form (the bytes to_bytes returns) to file:
    a path (created or truncated), a descriptor, or a binary file object,
    at its current position. Returns the number of bytes written. Pipes and
    sockets work (nothing seeks); a stream may carry messages back to back.
    A full disk raises OSError (ENOSPC) and leaves a partial file.
    compression=None, "lz4", "zstd" or "auto", compression_threshold and
    compression_chunk_size, as for dumps."""
    kw = {"compression": compression, "compression_threshold": compression_threshold,
          "compression_chunk_size": compression_chunk_size}
    if isinstance(file, int):
        return _dump_fd(obj, file, families, **kw)
    if isinstance(file, _PATH):
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            return _dump_fd(obj, fd, families, **kw)
        finally:
            os.close(fd)
    if isinstance(file, socket.socket):
        if file.gettimeout() is None:
            return _dump_fd(obj, file.fileno(), families, **kw)
        return _dump_write(obj, file.sendall, families, **kw)
    fd = _fileno(file)
    if fd is None:
        return _dump_write(obj, file.write, families, **kw)
    file.flush()
    n = _dump_fd(obj, fd, families, **kw)
    if _seekable(file):
        file.seek(os.lseek(fd, 0, os.SEEK_CUR))  # the object's idea of its position
    return n


def _read_stream(readinto):
    """One flattened message from a stream: exactly its bytes, in a buffer
    that grows with what arrives (a table may lie), checked as it goes."""
    buf, have, need = bytearray(8), 0, 8
    while True:
        if len(buf) < need:
            grown = bytearray(min(need, max(2 * len(buf), 1 << 20)))
            grown[:have] = memoryview(buf)[:have]
            buf = grown
        with memoryview(buf) as mv:
            while have < min(need, len(buf)):
                n = readinto(mv[have:min(need, len(buf))])
                if not n:
                    break
                have += n
        if have < min(need, len(buf)):  # the input ended: the decoder says why
            return memoryview(buf)[:have]
        if have < need:
            continue
        with memoryview(buf)[:have] as head:
            more = _flat_need(head)
        if more == need:
            return buf
        need = more


def _load_stream(readinto, device):
    return from_bytes(_read_stream(readinto), device=device)


def load(file, mmap=False, device=False):
    """load(file, mmap=False, device=False) -> obj

    Read one object in gser's flattened form from file: a path, a
    descriptor, or a binary file object, from its current position (a
    regular file must hold exactly the message from there; a pipe or
    socket is read to the end of one message, and the next may follow).
    mmap=True maps a regular file instead of reading it: arrays view the
    mapping (private: writable, the file never changes), which the loaded
    objects keep alive, so loading costs the same for any size; the file
    must not be truncated while they live. Other inputs are read as with
    mmap=False, straight into one buffer of the message's size. Arrays are
    writable. device=True puts buffers that were device memory at the
    sender back on the device. Errors are those of from_bytes on the same
    bytes (GserError: truncated, oversized, corrupted)."""
    if isinstance(file, int):
        return _load_fd(file, mmap, device)
    if isinstance(file, _PATH):
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _load_fd(fd, mmap, device)
        finally:
            os.close(fd)
    if isinstance(file, socket.socket):
        if file.gettimeout() is None:
            return _load_fd(file.fileno(), mmap, device)
        return _load_stream(file.recv_into, device)
    fd = _fileno(file)
    if fd is not None and _seekable(file):
        # A buffered reader may have read ahead: its position is the truth.
        os.lseek(fd, file.tell(), os.SEEK_SET)
        out = _load_fd(fd, mmap, device)
        file.seek(os.lseek(fd, 0, os.SEEK_CUR))
        return out
    if fd is not None and isinstance(file, io.RawIOBase):  # nothing read ahead
        return _load_fd(fd, mmap, device)
    readinto = getattr(file, "readinto", None)
    if readinto is None:
        def readinto(mv, read=file.read):
            b = read(len(mv))
            mv[:len(b)] = b
            return len(b)
    return _load_stream(readinto, device)
