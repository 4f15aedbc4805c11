"""gser.set_device_allocator: where gser allocates device memory for a
receiver (from_bytes/loads with device=True, gser.ucx receives) when the
user gives a function; device_allocation and device_copy."""

import gc
import weakref

import pytest

import gser

np = pytest.importorskip("numpy")

EMULATED = gser.DEVICE_BACKEND == "emulated"
pytestmark = pytest.mark.skipif(not EMULATED, reason="the allocations here are host memory: needs GSER_DEVICE=emulated")


class Block:
    """Device memory of the emulated backend (host memory), as RMM's
    DeviceBuffer presents it."""

    def __init__(self, size):
        self.mem = np.full(max(size, 1), 0xDB, np.uint8)
        self.size = size

    @property
    def __cuda_array_interface__(self):
        return {"data": (int(self.mem.ctypes.data) if self.size else 0, False), "shape": (self.size,),
                "typestr": "|u1", "strides": None, "version": 3}


class Dev:
    def __init__(self, a):
        self.a = np.ascontiguousarray(a)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ctypes.data, False),
                "strides": None, "version": 3}


@pytest.fixture
def allocator():
    made = []

    def alloc(n):
        b = Block(n)
        made.append(weakref.ref(b))
        return b

    assert gser.set_device_allocator(alloc) is None
    yield made
    assert gser.set_device_allocator(None) is alloc


def test_restored_device_buffers_live_in_the_users_allocations(allocator):
    a = np.arange(1000, dtype=np.float32)
    b = gser.to_bytes({"x": Dev(a), "y": Dev(a[:10])})
    out = gser.from_bytes(b, device=True)
    live = [r() for r in allocator if r() is not None]  # (a temporary one may be gone)
    assert live
    for key, ref in (("x", a), ("y", a[:10])):
        arr = out[key]
        assert type(arr) is gser.DeviceArray and np.array_equal(arr.copy_to_host(), ref)
        # the memory is inside one of the user's blocks
        assert any(b.mem.ctypes.data <= arr.ptr < b.mem.ctypes.data + b.size for b in live)
    del out, arr, live
    gc.collect()
    assert all(r() is None for r in allocator)  # gser let go of every block once done


def test_device_allocation_and_device_copy(allocator):
    a = np.arange(300_000, dtype=np.int64)  # above the pack size: a buffer of its own
    out = gser.from_bytes(gser.to_bytes([Dev(a)]), device=True)[0]
    hit = gser.device_allocation(out.ptr)
    assert hit is not None and type(hit[0]) is Block and hit[1] == a.nbytes
    dst = Block(a.nbytes)
    gser.device_copy(dst, out)
    assert np.array_equal(dst.mem.view(np.int64), a)
    assert gser.device_allocation(dst.mem.ctypes.data) is None  # not gser's
    with pytest.raises(ValueError):
        gser.device_copy(Block(8), out)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_failing_allocators_fail_the_call_not_the_process():
    b = gser.to_bytes([Dev(np.arange(100.0))])
    # too small, raising, no __cuda_array_interface__ (the last two are reported as unraisable)
    for bad in (lambda n: Block(n // 2), lambda n: 1 / 0, lambda n: object()):
        gser.set_device_allocator(bad)
        try:
            with pytest.raises((gser.GserError, MemoryError)):
                gser.from_bytes(b, device=True)
        finally:
            gser.set_device_allocator(None)
    assert np.array_equal(gser.from_bytes(b, device=True)[0].copy_to_host(), np.arange(100.0))
    with pytest.raises(TypeError):
        gser.set_device_allocator(42)


@pytest.mark.skipif(not gser.HAVE_UCX, reason="gser::ucx not built")
def test_ucx_receives_into_the_users_allocations(allocator):
    import asyncio

    import gser.ucx

    big = np.arange(1 << 20, dtype=np.uint8)  # above the pack size: received on its own

    async def main():
        got = asyncio.get_running_loop().create_future()

        async def serve(ep):
            got.set_result(await ep.recv_frames())

        w = gser.ucx.Worker(gser.ucx.Context(transports="tcp,self"))
        lst = w.listen(serve, "127.0.0.1", 0)
        ep = await w.connect("127.0.0.1", lst.port)
        await ep.send_frames([b"head", Dev(big)])
        frames = await asyncio.wait_for(got, 60)
        ep.close()
        lst.close()
        return frames, w

    frames, w = asyncio.run(main())
    w.close()
    dev = frames[1]
    assert type(dev) is gser.DeviceArray and np.array_equal(dev.copy_to_host(), big)
    hit = gser.device_allocation(dev.ptr)
    assert hit is not None and type(hit[0]) is Block and hit[1] == big.nbytes and hit[0].mem.ctypes.data == dev.ptr
