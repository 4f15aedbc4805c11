"""A tiny Arrow producer and consumer in pure Python (ctypes), for testing the
Arrow PyCapsule interface without pyarrow (Debian 12 has no python3-pyarrow).

Producer: Table(columns) builds a struct array (a table) of int64 ("l") and
utf8 ("u") columns, with nulls where a value is None, as ArrowSchema /
ArrowArray structs, and exports them through __arrow_c_array__ and/or
__arrow_c_device_array__ in PyCapsules made with PyCapsule_New. Release
callbacks are counted (RELEASED[table.id]), so tests can check that each
struct is released exactly once, and when.

Consumer: read(obj) calls obj's export method and decodes the table back into
{name: [values]} through the capsules' structs; with move=True it moves the
struct out of the capsule (as a consumer that keeps it would) and releases it.
"""

import collections
import ctypes
import itertools
import struct
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_void_p

ARROW_DEVICE_CPU = 1
ARROW_DEVICE_CUDA = 2


class ArrowSchema(ctypes.Structure):
    pass


SchemaRelease = ctypes.CFUNCTYPE(None, POINTER(ArrowSchema))
ArrowSchema._fields_ = [
    ("format", c_char_p),
    ("name", c_char_p),
    ("metadata", c_void_p),
    ("flags", c_int64),
    ("n_children", c_int64),
    ("children", POINTER(POINTER(ArrowSchema))),
    ("dictionary", POINTER(ArrowSchema)),
    ("release", SchemaRelease),
    ("private_data", c_void_p),
]


class ArrowArray(ctypes.Structure):
    pass


ArrayRelease = ctypes.CFUNCTYPE(None, POINTER(ArrowArray))
ArrowArray._fields_ = [
    ("length", c_int64),
    ("null_count", c_int64),
    ("offset", c_int64),
    ("n_buffers", c_int64),
    ("n_children", c_int64),
    ("buffers", POINTER(c_void_p)),
    ("children", POINTER(POINTER(ArrowArray))),
    ("dictionary", POINTER(ArrowArray)),
    ("release", ArrayRelease),
    ("private_data", c_void_p),
]


class ArrowDeviceArray(ctypes.Structure):
    _fields_ = [
        ("array", ArrowArray),
        ("device_id", c_int64),
        ("device_type", c_int32),
        ("sync_event", c_void_p),
        ("reserved", c_int64 * 3),
    ]


# ---- PyCapsule through ctypes ------------------------------------------------------------

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [c_void_p, c_char_p, c_void_p]
get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
get_pointer.restype = c_void_p
get_pointer.argtypes = [ctypes.py_object, c_char_p]
# In a destructor the capsule is dying: it must not become a Python object again.
_get_pointer_raw = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))

SCHEMA_NAME = b"arrow_schema"
ARRAY_NAME = b"arrow_array"
DEVICE_ARRAY_NAME = b"arrow_device_array"

# Structs in live capsules, by address: the capsule owns them.
_in_capsules = {}


def _make_destructor(name, kind):
    def destructor(capsule):
        ptr = _get_pointer_raw(capsule, name)
        s = kind.from_address(ptr)
        base = s.array if kind is ArrowDeviceArray else s
        if base.release:  # nobody moved it out: release it (the producer's duty)
            base.release(ctypes.cast(ptr, POINTER(type(base))))
        _in_capsules.pop(ptr, None)

    return ctypes.CFUNCTYPE(None, c_void_p)(destructor)


_DESTRUCTORS = {
    SCHEMA_NAME: _make_destructor(SCHEMA_NAME, ArrowSchema),
    ARRAY_NAME: _make_destructor(ARRAY_NAME, ArrowArray),
    DEVICE_ARRAY_NAME: _make_destructor(DEVICE_ARRAY_NAME, ArrowDeviceArray),
}
_NAMES = {n: n for n in _DESTRUCTORS}  # the names must outlive the capsules


def capsule(struct_obj, name):
    """A capsule owning a copy of struct_obj (which is left released)."""
    kind = type(struct_obj)
    held = kind()
    ctypes.memmove(ctypes.addressof(held), ctypes.addressof(struct_obj), ctypes.sizeof(kind))
    base = struct_obj.array if kind is ArrowDeviceArray else struct_obj
    base.release = type(base.release)()  # moved
    addr = ctypes.addressof(held)
    _in_capsules[addr] = held
    return _capsule_new(addr, _NAMES[name], ctypes.cast(_DESTRUCTORS[name], c_void_p).value)


# ---- the producer ------------------------------------------------------------------------

RELEASED = collections.Counter()  # (table id, "schema" | "array") -> release calls
_live = {}  # private_data -> what a released struct frees
_ids = itertools.count(1)


def _release_schema(p):
    s = p.contents
    for i in range(s.n_children):
        c = s.children[i].contents
        if c.release:
            c.release(s.children[i])
    key = s.private_data
    if key in _live:  # top level: children have no private data
        tid = _live.pop(key)[0]
        RELEASED[(tid, "schema")] += 1
    s.release = SchemaRelease()


def _release_array(p):
    a = p.contents
    for i in range(a.n_children):
        c = a.children[i].contents
        if c.release:
            c.release(a.children[i])
    key = a.private_data
    if key in _live:
        tid = _live.pop(key)[0]
        RELEASED[(tid, "array")] += 1
    a.release = ArrayRelease()


RELEASE_SCHEMA = SchemaRelease(_release_schema)
RELEASE_ARRAY = ArrayRelease(_release_array)


def metadata_bytes(pairs):
    out = struct.pack("<i", len(pairs))
    for k, v in pairs.items():
        for s in (k.encode(), v.encode()):
            out += struct.pack("<i", len(s)) + s
    return out


def parse_metadata(ptr):
    if not ptr:
        return None
    (n,) = struct.unpack("<i", ctypes.string_at(ptr, 4))
    at, out = 4, {}
    for _ in range(n):
        kv = []
        for _ in range(2):
            (ln,) = struct.unpack("<i", ctypes.string_at(ptr + at, 4))
            kv.append(ctypes.string_at(ptr + at + 4, ln).decode())
            at += 4 + ln
        out[kv[0]] = kv[1]
    return out


class _Builder:
    def __init__(self):
        self.keep = []

    def buf(self, data):
        b = ctypes.create_string_buffer(bytes(data), max(len(data), 1))
        self.keep.append(b)
        return ctypes.addressof(b)

    def validity(self, values):
        if all(v is not None for v in values):
            return None, 0
        bits = bytearray((len(values) + 7) // 8)
        for i, v in enumerate(values):
            if v is not None:
                bits[i // 8] |= 1 << (i % 8)
        return self.buf(bits), sum(v is None for v in values)

    def column(self, name, fmt, values, metadata=None):
        s = ArrowSchema()
        s.format = self.keep_bytes(fmt.encode())
        s.name = self.keep_bytes(name.encode())
        if metadata:
            s.metadata = self.buf(metadata_bytes(metadata))
        s.flags = 2  # nullable
        s.release = RELEASE_SCHEMA
        a = ArrowArray()
        a.length = len(values)
        valid, a.null_count = self.validity(values)
        if fmt == "l":
            data = struct.pack(f"<{len(values)}q", *[v or 0 for v in values])
            bufs = [valid, self.buf(data)]
        elif fmt == "u":
            parts = [(v or "").encode() for v in values]
            offsets = list(itertools.accumulate((len(p) for p in parts), initial=0))
            bufs = [valid, self.buf(struct.pack(f"<{len(offsets)}i", *offsets)), self.buf(b"".join(parts))]
        else:
            raise ValueError(fmt)
        a.n_buffers = len(bufs)
        a.buffers = self.pointers(c_void_p, bufs)
        a.release = RELEASE_ARRAY
        self.keep += [s, a]
        return s, a

    def keep_bytes(self, b):
        self.keep.append(b)
        return b

    def pointers(self, kind, items):
        arr = (kind * max(len(items), 1))(*items)
        self.keep.append(arr)
        return ctypes.cast(arr, POINTER(kind))


class Table:
    """A table of int64 ("l") and utf8 ("u") columns: {name: (fmt, values)},
    exported as a struct array ("+s"). methods: which of __arrow_c_array__
    ("array") and __arrow_c_device_array__ ("device") it has; device_type:
    what the device export says (ARROW_DEVICE_CUDA for "device" memory that
    is host memory under GSER_DEVICE=emulated)."""

    def __init__(self, columns, methods=("array",), device_type=ARROW_DEVICE_CPU, metadata=None, length=None):
        self.id = next(_ids)
        self.columns = columns
        self.methods = methods
        self.device_type = device_type
        self.metadata = metadata or {}
        self.length = length
        self.calls = []

    def _export(self):
        b = _Builder()
        parts = [b.column(n, f, v, self.metadata.get(n)) for n, (f, v) in self.columns.items()]
        schema = ArrowSchema()
        schema.format = b.keep_bytes(b"+s")
        schema.n_children = len(parts)
        schema.children = b.pointers(POINTER(ArrowSchema), [ctypes.pointer(s) for s, _ in parts])
        schema.release = RELEASE_SCHEMA
        array = ArrowArray()
        lengths = {len(v) for _, v in self.columns.values()}
        array.length = self.length if self.length is not None else (lengths.pop() if lengths else 0)
        array.n_buffers = 1
        array.buffers = b.pointers(c_void_p, [None])
        array.n_children = len(parts)
        array.children = b.pointers(POINTER(ArrowArray), [ctypes.pointer(a) for _, a in parts])
        array.release = RELEASE_ARRAY
        # (address, size) of the data buffers of the last export
        self.buffers = [(ctypes.addressof(k), ctypes.sizeof(k)) for k in b.keep
                        if isinstance(k, ctypes.Array) and k._type_ is ctypes.c_char]
        # The structs' private data keys what their release frees.
        skey, akey = next(_ids), next(_ids)
        _live[skey] = (self.id, b)
        _live[akey] = (self.id, b)
        schema.private_data = skey
        array.private_data = akey
        return schema, array, b

    def __getattr__(self, name):
        if name == "__arrow_c_array__" and "array" in self.methods:
            return self._c_array
        if name == "__arrow_c_device_array__" and "device" in self.methods:
            return self._c_device_array
        raise AttributeError(name)

    def _c_array(self, requested_schema=None):
        self.calls.append("array")
        schema, array, _ = self._export()
        return capsule(schema, SCHEMA_NAME), capsule(array, ARRAY_NAME)

    def _c_device_array(self, requested_schema=None, **kwargs):
        self.calls.append("device")
        schema, array, _ = self._export()
        dev = ArrowDeviceArray()
        dev.array = array
        array.release = ArrayRelease()  # moved into dev
        dev.device_type = self.device_type
        dev.device_id = -1 if self.device_type == ARROW_DEVICE_CPU else 0
        return capsule(schema, SCHEMA_NAME), capsule(dev, DEVICE_ARRAY_NAME)

    def released(self):
        return RELEASED[(self.id, "schema")], RELEASED[(self.id, "array")]


# ---- the consumer ------------------------------------------------------------------------


def schema_info(s):
    """{format, name, metadata, children: [...]} of an ArrowSchema."""
    return {
        "format": s.format.decode(),
        "name": s.name.decode() if s.name else None,
        "metadata": parse_metadata(s.metadata),
        "children": [schema_info(s.children[i].contents) for i in range(s.n_children)],
    }


def _host_read(ptr, n):
    return ctypes.string_at(ptr, n)


class Capsules:
    """A producer that hands on the capsules of a table it was given, once
    (a consumer sending a table on)."""

    def __init__(self, schema, device_array):
        self.caps = (schema, device_array)

    def __arrow_c_device_array__(self, requested_schema=None, **kwargs):
        caps, self.caps = self.caps, None
        return caps


def device_values(schema, device_array):
    """{name: values} of a device table, copied to the host through gser
    (to_bytes stages device buffers with gser_device_memcpy), as a CUDA
    consumer would copy: host code never reads device memory (ASan builds of
    the emulated backend poison it). The table is moved out of the capsules."""
    import gser

    host = gser.from_bytes(gser.to_bytes(Capsules(schema, device_array)))
    return read(host)[1]


def _column(s, a):
    read = _host_read
    fmt = s.format.decode()
    n, off = a.length, a.offset
    valid = a.buffers[0]
    out = []
    for i in range(n):
        if valid and not read(valid + (off + i) // 8, 1)[0] >> ((off + i) % 8) & 1:
            out.append(None)
        elif fmt == "l":
            out.append(struct.unpack("<q", read(a.buffers[1] + 8 * (off + i), 8))[0])
        elif fmt == "u":
            lo, hi = struct.unpack("<ii", read(a.buffers[1] + 4 * (off + i), 8))
            out.append(read(a.buffers[2] + lo, hi - lo).decode() if hi > lo else "")
        else:
            raise ValueError(fmt)
    return out


def decode(schema, array):
    """{name: values} of a struct array (a table) in host memory."""
    assert schema.format == b"+s"
    return {
        schema.children[i].contents.name.decode(): _column(schema.children[i].contents, array.children[i].contents)
        for i in range(schema.n_children)
    }


def read(obj, device=False, move=False):
    """Export obj's table (__arrow_c_device_array__ with device=True, else
    __arrow_c_array__) and decode it: (schema info, {name: values},
    device_type); device tables are read through gser. move=True moves the array out of its
    capsule and releases it here, as a consumer that keeps it would."""
    if device:
        sc, ac = obj.__arrow_c_device_array__()
        addr = get_pointer(ac, DEVICE_ARRAY_NAME)
        dev = ArrowDeviceArray.from_address(addr)
        arr, device_type = dev.array, dev.device_type
        if device_type != ARROW_DEVICE_CPU:  # moved out and released by gser
            info = schema_info(ArrowSchema.from_address(get_pointer(sc, SCHEMA_NAME)))
            return info, device_values(sc, ac), device_type
    else:
        sc, ac = obj.__arrow_c_array__()
        addr = get_pointer(ac, ARRAY_NAME)
        arr, device_type = ArrowArray.from_address(addr), ARROW_DEVICE_CPU
    schema = ArrowSchema.from_address(get_pointer(sc, SCHEMA_NAME))
    info = schema_info(schema)
    values = decode(schema, arr)
    if move:
        mine = ArrowArray()
        ctypes.memmove(ctypes.addressof(mine), ctypes.addressof(arr), ctypes.sizeof(ArrowArray))
        arr.release = ArrayRelease()  # moved: the capsule's destructor does nothing
        assert mine.release
        mine.release(ctypes.pointer(mine))
        assert not mine.release
    return info, values, device_type
