"""A reader of gser's wire format written from docs/wire-format.md alone, on
an msgpack implementation nobody here wrote (Debian's python3-msgpack).

It shares no code with the library: if gser's writer and this reader
disagree, one of them does not follow the spec. It decodes a header and its
data frames (host memory) into plain Python values:

    uint            -> Uint(int)          (a uint stays distinct from an int)
    tuple marker    -> tuple
    array marker    -> list or tuple of bool/int/Uint/float
    buffer marker   -> Buffer(dtype code, numpy array or None, origin)
    object marker   -> Object(type, family, version, decoded sub-tree, frames)
"""

import dataclasses

import msgpack
import numpy as np

MAGIC = msgpack.ExtType(1, b"GSER")
EXT_TUPLE, EXT_UINT, EXT_BUFFER, EXT_ARRAY, EXT_OBJECT = 2, 3, 4, 5, 6

# docs/wire-format.md 4.5: dtype code -> (numpy dtype or None, element bytes)
DTYPES = {
    0: ("u1", 1), 1: ("?", 1), 2: ("<i1", 1), 3: ("<i2", 2), 4: ("<i4", 4), 5: ("<i8", 8),
    6: ("u1", 1), 7: ("<u2", 2), 8: ("<u4", 4), 9: ("<u8", 8), 10: ("<f2", 2), 11: (None, 2),
    12: ("<f4", 4), 13: ("<f8", 8), 14: ("<c8", 8), 15: ("<c16", 16),
}
# 32..34: ints written as int8/16/32, read as ints (wire-format 4.6)
ARRAY_KINDS = {1: ("?", 1), 2: ("<i8", 8), 3: ("<u8", 8), 4: ("<f8", 8), 32: ("<i1", 1), 33: ("<i2", 2), 34: ("<i4", 4)}


class WireError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Uint:
    value: int


@dataclasses.dataclass
class Buffer:
    dtype: int
    array: object  # numpy array over the bytes (None for bfloat16)
    data: bytes  # the bytes as they travelled (C order, or the span)
    origin: int


@dataclasses.dataclass
class Object:
    type: str
    family: str
    version: int
    tree: object
    nframes: int


def _is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _marker(v):
    if isinstance(v, list) and v and isinstance(v[0], msgpack.ExtType) and v[0].data == b"":
        return v[0].code
    return None


class _Reader:
    def __init__(self, frames):
        self.frames = frames

    def data(self, d, base, n, nbytes=None):
        if isinstance(d, bytes):
            raw = d
        elif isinstance(d, list) and len(d) == 3 and all(_is_uint(x) for x in d):
            frame, offset, length = d
            if frame >= n:
                raise WireError(f"frame {frame} outside a scope of {n}")
            f = self.frames[base + frame]
            if offset + length > len(f):
                raise WireError("a reference past its frame's end")
            raw = bytes(f[offset:offset + length])
        else:
            raise WireError(f"data is neither bin nor a reference: {d!r}")
        if nbytes is not None and len(raw) != nbytes:
            raise WireError(f"data holds {len(raw)} bytes, {nbytes} expected")
        return raw

    def buffer(self, v, base, n):
        if len(v) not in (5, 6):
            raise WireError("a buffer marker has 5 or 6 fields")
        dtype, shape, d, origin = v[1], v[2], v[3], v[4]
        strides = v[5] if len(v) == 6 else None
        if dtype not in DTYPES or origin not in (0, 1):
            raise WireError("bad dtype or origin")
        npdt, es = DTYPES[dtype]
        if shape is not None and (not isinstance(shape, list) or not shape or not all(_is_uint(x) for x in shape)):
            raise WireError("bad shape")
        if strides is None:
            raw = self.data(d, base, n)
            nbytes = es * int(np.prod(shape)) if shape is not None else len(raw)
            if len(raw) != nbytes or len(raw) % es:
                raise WireError("data does not match the shape")
            arr = None
            if npdt:
                arr = np.frombuffer(raw, dtype=npdt)
                if shape is not None:
                    arr = arr.reshape(shape)
            return Buffer(dtype, arr, raw, origin)
        if shape is None or not isinstance(strides, list) or len(strides) != len(shape):
            raise WireError("strides need a shape of as many dimensions")
        lo = sum(min(0, s * (e - 1)) for s, e in zip(strides, shape))
        hi = sum(max(0, s * (e - 1)) for s, e in zip(strides, shape))
        span = 0 if 0 in shape else hi - lo + es
        raw = self.data(d, base, n, span)
        arr = None
        if npdt:
            if span == 0:
                arr = np.empty(shape, dtype=npdt)
            else:
                arr = np.ndarray(shape, dtype=npdt, buffer=raw, offset=-lo, strides=strides)
        return Buffer(dtype, arr, raw, origin)

    def array(self, v, base, n):
        if len(v) != 5:
            raise WireError("an array marker has 5 fields")
        container, kind, count, d = v[1], v[2], v[3], v[4]
        if container not in (0, 1) or kind not in ARRAY_KINDS or not _is_uint(count):
            raise WireError("bad array marker")
        npdt, es = ARRAY_KINDS[kind]
        raw = self.data(d, base, n, count * es)
        items = np.frombuffer(raw, dtype=npdt).tolist()
        if kind == 1 and any(b not in (0, 1) for b in raw):
            raise WireError("a bool element other than 0 or 1")
        if kind == 3:
            items = [Uint(x) for x in items]
        return tuple(items) if container == 1 else items

    def obj(self, v, base, n, depth):
        if len(v) != 7:
            raise WireError("an object marker has 7 fields")
        typ, fam, ver, fbase, fcount, sub = v[1:]
        if not isinstance(typ, str) or not isinstance(fam, str) or not isinstance(sub, bytes):
            raise WireError("bad object marker")
        if not (_is_uint(fbase) and _is_uint(fcount)) or fbase + fcount > n:
            raise WireError("an object's frames outside its scope")
        tree = msgpack.unpackb(sub, raw=False, strict_map_key=False, use_list=True)
        return Object(typ, fam, ver, self.value(tree, base + fbase, fcount, depth + 1), fcount)

    def value(self, v, base, n, depth=1):
        if depth > 64:
            raise WireError("too deep")
        if isinstance(v, msgpack.ExtType):
            if v.code == EXT_UINT and len(v.data) == 8:
                return Uint(int.from_bytes(v.data, "little"))
            raise WireError(f"ext {v.code} where a value is expected")
        if isinstance(v, int) and not isinstance(v, bool) and v > 2**63 - 1:
            return Uint(v)
        if isinstance(v, dict):
            return {self.key(k): self.value(x, base, n, depth + 1) for k, x in v.items()}
        if isinstance(v, list):
            m = _marker(v)
            if m is None:
                return [self.value(x, base, n, depth + 1) for x in v]
            if m == EXT_TUPLE:
                return tuple(self.value(x, base, n, depth + 1) for x in v[1:])
            if m == EXT_BUFFER:
                return self.buffer(v, base, n)
            if m == EXT_ARRAY:
                return self.array(v, base, n)
            if m == EXT_OBJECT:
                return self.obj(v, base, n, depth)
            raise WireError(f"reserved marker {m}")
        return v

    def key(self, k):
        if isinstance(k, (list, dict)):
            raise WireError("a map key that is not a scalar")
        return self.value(k, 0, 0)


def read(header, frames):
    """Decode a header (bytes) and its data frames (buffers) as the spec says."""
    top = msgpack.unpackb(bytes(header), raw=False, strict_map_key=False, use_list=True)
    if bytes(header[:7]) != b"\x94\xd6\x01GSER":
        raise WireError("bad magic")
    if not isinstance(top, list) or len(top) != 4 or top[0] != MAGIC:
        raise WireError("not a gser header")
    version, root, table = top[1], top[2], top[3]
    if version not in (1, 2, 3):
        raise WireError(f"wire version {version}")
    if not isinstance(table, list) or len(table) != len(frames):
        raise WireError("the frame table does not match the frames")
    mem = []
    for entry, f in zip(table, frames):
        five = version >= 3 and isinstance(entry, list) and len(entry) == 5
        if not (isinstance(entry, list) and (len(entry) == 3 or five) and _is_uint(entry[0])
                and entry[1] in (0, 1)):
            raise WireError(f"bad frame table entry {entry!r}")
        f = memoryview(f).cast("B")
        if entry[0] != len(f):
            raise WireError("a frame of another size than its table entry")
        if five:
            f = memoryview(_decompress(entry, f))
        mem.append(f)
    return version, _Reader(mem).value(root, 0, len(mem))


def _decompress(entry, f):
    """3.3: codec 1 is one LZ4 block, codec 2 one Zstandard frame, codecs 3
    and 4 the same in chunks; the data must decompress to exactly raw bytes."""
    _, memory, _, codec, raw = entry
    if memory != 0 or codec not in (1, 2, 3, 4) or not _is_uint(raw) or raw == 0:
        raise WireError(f"bad compressed frame entry {entry!r}")
    if codec in (3, 4):
        return _chunks(codec - 2, raw, f)
    return _block(codec, raw, f)


def _chunks(codec, raw, f):
    """u32 chunk size, u32 per chunk (bit 31: stored as it is), the chunks."""
    import struct

    f = bytes(f)
    if len(f) < 4:
        raise WireError("chunked frame without a chunk size")
    (chunk,) = struct.unpack_from("<I", f)
    if not 4096 <= chunk <= 1 << 30:
        raise WireError(f"chunk size {chunk}")
    n = -(-raw // chunk)
    if 4 + 4 * n > len(f):
        raise WireError(f"a table of {n} chunks does not fit in {len(f)} bytes")
    sizes = struct.unpack_from(f"<{n}I", f, 4)
    out, at = [], 4 + 4 * n
    for k, e in enumerate(sizes):
        size, stored = e & 0x7FFFFFFF, bool(e & 0x80000000)
        want = chunk if k + 1 < n else raw - k * chunk
        piece = f[at:at + size]
        if len(piece) != size:
            raise WireError(f"chunk {k} runs past the frame")
        if stored and size != want:
            raise WireError(f"stored chunk {k} of {size} bytes, not {want}")
        out.append(piece if stored else _block(codec, want, piece))
        at += size
    if at != len(f):
        raise WireError(f"chunks end at byte {at} of {len(f)}")
    return b"".join(out)


def _block(codec, raw, f):
    try:
        if codec == 1:
            import lz4.block

            out = lz4.block.decompress(bytes(f), uncompressed_size=raw)
        else:
            import zstandard

            out = zstandard.ZstdDecompressor().decompress(bytes(f), max_output_size=raw)
    except Exception as e:  # each library has its own error types
        raise WireError(f"compressed frame does not decompress: {e}") from None
    if len(out) != raw:
        raise WireError(f"compressed frame decompresses to {len(out)} bytes, not {raw}")
    return out
