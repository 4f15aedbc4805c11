"""How gser._gser is set up: one module instance per import (multi-phase
initialisation), its types heap types of that instance, everything it keeps
in the instance's state. Objects hold their type; dropping them must give it
back, and a module instance nobody refers to must be collected."""

import gc
import importlib.util
import sys
import types
import weakref

import pytest

import gser
import gser._gser as _gser

np = pytest.importorskip("numpy")


def fresh_instance():
    """A second, independent instance of gser._gser (not in sys.modules)."""
    spec = importlib.util.find_spec("gser._gser")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_a_second_instance_has_its_own_state():
    m = fresh_instance()
    assert m is not _gser
    assert m.GserError is not _gser.GserError and issubclass(m.GserError, ValueError)
    assert issubclass(m.GserUnsupported, m.GserError) and issubclass(m.GserUnsupported, NotImplementedError)
    assert m.FlatBytes is not _gser.FlatBytes and m.DeviceArray is not _gser.DeviceArray
    # Each instance raises its own classes, and its objects are of its own types.
    with pytest.raises(m.GserError) as info:
        m.loads(b"not a gser header", [])
    assert not isinstance(info.value, _gser.GserError) and info.value.status_name == "GSER_ERR_BAD_MAGIC"
    b = m.to_bytes({"x": np.arange(5)})
    assert type(b) is m.FlatBytes
    np.testing.assert_array_equal(_gser.from_bytes(b)["x"], np.arange(5))
    # Registrations are the instance's.
    m.register_type(complex, lambda c: (c.real, c.imag), lambda t: complex(*t), name="test.complex")
    assert "test.complex" in m.registered()["types"]
    assert "test.complex" not in _gser.registered()["types"]


def test_an_unused_instance_is_collected():
    m = fresh_instance()
    m.register_type(complex, lambda c: (c.real, c.imag), lambda t: complex(*t), name="test.complex")
    h, f = m.dumps({"a": np.arange(3), "z": 1j})
    out = m.loads(h, f)
    gone = weakref.ref(m)
    flat_type = weakref.ref(m.FlatBytes)
    del m, h, f, out
    gc.collect()
    assert gone() is None and flat_type() is None


def device_roundtrip():
    if gser.DEVICE_BACKEND != "emulated":
        pytest.skip("needs GSER_DEVICE=emulated")
    host = np.arange(10)  # presented as device memory: the emulated backend reads it
    dev = types.SimpleNamespace(__cuda_array_interface__={
        "shape": host.shape, "typestr": host.dtype.str, "data": (host.ctypes.data, False), "version": 3})
    h, f = gser.dumps(dev)  # a DeviceFrame
    return gser.loads(h, f)  # a DeviceArray


def internal_types():
    """_Owner and _Frame, which the module does not publish: a frame's exporter and its owner."""
    frame = gser.dumps(np.arange(100000))[1][0].obj
    owner = [o for o in gc.get_referents(frame) if type(o).__name__ == "_Owner"]
    assert len(owner) == 1
    return [type(frame), type(owner[0])]


@pytest.mark.parametrize(
    "make",
    [
        lambda: gser.to_bytes([1, 2, 3]),
        lambda: gser.loads(*gser.dumps(np.arange(1000))),
        lambda: gser.dumps(np.arange(100000)),
        device_roundtrip,
    ],
    ids=["flatbytes", "loads", "dumps", "device"],
)
def test_objects_give_their_type_back(make):
    types = [_gser.FlatBytes, _gser.DeviceArray, _gser.DeviceFrame, _gser.ArrowArray] + internal_types()
    for _ in range(3):
        make()
    gc.collect()
    before = [sys.getrefcount(t) for t in types]
    for _ in range(100):
        make()
    gc.collect()
    assert [sys.getrefcount(t) for t in types] == before


def test_types_are_not_instantiable():
    for t in (_gser.DeviceArray, _gser.DeviceFrame, _gser.ArrowArray):
        with pytest.raises(TypeError):
            t()
    assert bytes(_gser.FlatBytes(b"abc")) == b"abc"


@pytest.mark.skipif(sys.version_info < (3, 10), reason="Py_TPFLAGS_IMMUTABLETYPE is 3.10+")
def test_types_are_immutable():
    for t in (_gser.DeviceArray, _gser.DeviceFrame, _gser.ArrowArray, _gser.FlatBytes):
        with pytest.raises(TypeError):
            t.extra = 1
