"""Compressed frames from Python: dumps / to_bytes / dump with compression=,
which loads / from_bytes / load read without being told; what is left as it
is (random data, small frames, device frames); bad arguments."""

import io
import os

import pytest

import gser

np = pytest.importorskip("numpy")

N = 1 << 20


def compressible():
    return np.repeat(np.arange(N // 64, dtype=np.int64), 8)  # sorted keys with runs


def incompressible():
    return np.random.default_rng(5).random(N // 8)


@pytest.mark.parametrize("codec", ["lz4", "zstd", "auto"])
def test_dumps_compresses_and_loads_reads_it(codec):
    a, r = compressible(), incompressible()
    header, frames = gser.dumps({"a": a, "r": r}, compression=codec)
    plain_header, plain_frames = gser.dumps({"a": a, "r": r})
    assert header[7] == 3 and plain_header[7] == 2  # the wire version after the 7-byte magic
    sizes = sorted(memoryview(f).nbytes for f in frames)
    assert sizes[0] < a.nbytes // 2  # the keys shrank
    assert sizes[1] == r.nbytes  # random data is sent as it is
    back = gser.loads(header, frames)
    np.testing.assert_array_equal(back["a"], a)
    np.testing.assert_array_equal(back["r"], r)
    assert not np.shares_memory(back["a"], a)


def test_none_is_todays_wire():
    a = compressible()
    h1, f1 = gser.dumps(a)
    h2, f2 = gser.dumps(a, compression=None)
    assert h1 == h2
    assert [bytes(x) for x in f1] == [bytes(x) for x in f2]


def test_small_frames_stay_as_they_are():
    small = np.zeros(1000, dtype=np.int64)  # 8,000 bytes, under the 10,000-byte minimum
    header, frames = gser.dumps([small], compression="zstd")
    assert header[7] == 2
    np.testing.assert_array_equal(gser.loads(header, frames)[0], small)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_to_bytes_and_dump_carry_compressed_frames(tmp_path, codec):
    a, r = compressible(), incompressible()
    b = gser.to_bytes([a, r], compression=codec)
    assert len(b) < len(gser.to_bytes([a, r])) - a.nbytes // 2
    x, y = gser.from_bytes(b)
    np.testing.assert_array_equal(x, a)
    np.testing.assert_array_equal(y, r)
    path = tmp_path / "c.gser"
    n = gser.dump([a, r], path, compression=codec)
    assert n == os.path.getsize(path) == len(b)
    for mmap in (False, True):
        x, y = gser.load(path, mmap=mmap) if mmap else gser.load(path)
        np.testing.assert_array_equal(x, a)
        np.testing.assert_array_equal(y, r)
    with open(path, "rb") as f:
        assert gser.load(f)[0].sum() == a.sum()


def test_corrupt_compressed_data_is_a_gser_error():
    a = compressible()
    header, frames = gser.dumps(a, compression="lz4")
    bad = bytearray(bytes(frames[0]))
    bad[:] = b"\xff" * len(bad)
    with pytest.raises(gser.GserError, match="frame 1"):
        gser.loads(header, [bad])
    b = bytearray(gser.to_bytes(a, compression="zstd"))
    b[-40:] = b"\x00" * 40  # the end of the zstd data
    with pytest.raises(gser.GserError, match="frame 1"):
        gser.from_bytes(bytes(b))


def test_bad_compression_argument():
    for bad in ("gzip", 3, b"lz4"):
        with pytest.raises(ValueError, match="compression"):
            gser.dumps(1, compression=bad)
        with pytest.raises(ValueError, match="compression"):
            gser.to_bytes(1, compression=bad)


def test_the_threshold_keeps_only_frames_that_shrink_that_much(tmp_path):
    counter = np.arange(N // 8, dtype=np.int64)  # lz4 halves it
    zeros = np.zeros(N // 8)  # lz4 leaves almost nothing
    for t in (None, 0.9, 0.3):
        header, frames = gser.dumps([counter, zeros], compression="lz4", compression_threshold=t)
        sizes = [memoryview(f).nbytes for f in frames]
        assert sizes[1] < N // 50, (t, sizes)
        if t == 0.3:
            assert sizes[0] == N and np.shares_memory(np.frombuffer(frames[0], np.int64), counter)
        else:
            assert N // 4 < sizes[0] < N * 9 // 10, (t, sizes)
        back = gser.loads(header, frames)
        np.testing.assert_array_equal(back[0], counter)
        np.testing.assert_array_equal(back[1], zeros)
    for t, counter_raw in ((None, False), (0.3, True)):
        b = gser.to_bytes([counter, zeros], compression="lz4", compression_threshold=t)
        path = tmp_path / f"{t}.gser"
        assert gser.dump([counter, zeros], path, compression="lz4", compression_threshold=t) == len(b)
        assert (len(b) > N) == counter_raw, (t, len(b))
        for back in (gser.from_bytes(b), gser.load(path)):
            np.testing.assert_array_equal(back[0], counter)


def test_bad_compression_threshold():
    for bad in (0, 1.5, -0.1, float("nan")):
        for call in (gser.dumps, gser.to_bytes):
            with pytest.raises(ValueError, match="compression_threshold"):
                call(1, compression="lz4", compression_threshold=bad)
    with pytest.raises(TypeError):
        gser.dumps(1, compression="lz4", compression_threshold="half")


def test_chunks_compress_only_the_parts_of_a_frame_that_shrink(tmp_path):
    # a block of two columns, as pandas keeps them: a counter (lz4: half)
    # and ones (lz4: almost nothing); at 0.3 only the ones' chunks pay
    m = N // 2
    block = np.stack([np.arange(m, dtype=np.float64), np.ones(m)])
    chunk = 1 << 20
    header, frames = gser.dumps(block, compression="lz4", compression_threshold=0.3, compression_chunk_size=chunk)
    assert header[7] == 3
    size = memoryview(frames[0]).nbytes
    assert 8 * m < size < 8 * m + chunk // 8, size  # the counter's chunks stored, the ones' squeezed
    np.testing.assert_array_equal(gser.loads(header, frames), block)
    whole = gser.dumps(block, compression="lz4", compression_threshold=0.3)[1]
    assert memoryview(whole[0]).nbytes < 8 * m  # whole: the counter is compressed with the rest
    b = gser.to_bytes(block, compression="lz4", compression_threshold=0.3, compression_chunk_size=chunk)
    path = tmp_path / "chunks.gser"
    assert gser.dump(block, path, compression="lz4", compression_threshold=0.3, compression_chunk_size=chunk) == len(b)
    assert path.read_bytes() == bytes(b)
    for back in (gser.from_bytes(b), gser.load(path), gser.load(path, mmap=True)):
        np.testing.assert_array_equal(back, block)
    # no larger than a chunk: compressed whole, the same bytes as without chunks
    small = np.arange(chunk // 8, dtype=np.int64)
    assert gser.to_bytes(small, compression="lz4", compression_chunk_size=chunk) == gser.to_bytes(
        small, compression="lz4")


def test_bad_compression_chunk_size():
    for bad in (1, 4095, (1 << 30) + 1, -1, 1 << 70):
        for call in (gser.dumps, gser.to_bytes):
            with pytest.raises(ValueError, match="compression_chunk_size"):
                call(1, compression="lz4", compression_chunk_size=bad)
    with pytest.raises(ValueError, match="compression_chunk_size"):
        gser.dump(1, io.BytesIO(), compression="lz4", compression_chunk_size=1)
    with pytest.raises(TypeError, match="compression_chunk_size"):
        gser.dumps(1, compression="lz4", compression_chunk_size="1MiB")
    for fine in (None, 0, 4096, 1 << 30):
        assert gser.loads(*gser.dumps(1, compression="lz4", compression_chunk_size=fine)) == 1


class Dev:
    """Host memory presented as a device array (the emulated backend reads it)."""

    def __init__(self, a):
        self.host = np.ascontiguousarray(a)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "data": (self.host.ctypes.data, False),
                "strides": None, "version": 3, "stream": None}


@pytest.mark.skipif(gser.DEVICE_BACKEND != "emulated", reason="needs GSER_DEVICE=emulated")
def test_device_frames_are_not_compressed():
    zeros = np.zeros(N, dtype=np.uint8)
    header, frames = gser.dumps([Dev(zeros)], compression="auto")
    assert header[7] == 2 and type(frames[0]) is gser.DeviceFrame  # zeros, yet sent as they are
    # staged to host frames by the host family: left as they are too
    header, frames = gser.dumps([Dev(zeros)], families=("host",), compression="auto")
    assert header[7] == 2
    assert memoryview(frames[0]).nbytes == N


# ---- the transport and gser:// (distributed.comm.compression) ---------------------------------

ucx_only = pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)")
dask_warnings = [
    pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:There is no current event loop:DeprecationWarning"),
]


def run(coro, timeout=120):
    import asyncio

    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def ucx_pair(server_opts=None, client_opts=None):
    """Two gser.ucx workers on this loop, connected over loopback: (server
    endpoint, client endpoint, workers)."""
    import asyncio

    import gser.ucx

    sw = gser.ucx.Worker(**(server_opts or {}))
    cw = gser.ucx.Worker(**(client_opts or {}))
    accepted = asyncio.get_running_loop().create_future()
    lst = sw.listen(lambda ep: accepted.set_result(ep), address="127.0.0.1")
    cep = await cw.connect("127.0.0.1", lst.port)
    sep = await asyncio.wait_for(accepted, 30)
    return sep, cep, (sw, cw)


@ucx_only
@pytest.mark.parametrize("option, codec", [("auto", None), (None, None), (False, None), ("lz4", "lz4"),
                                           ("zstd", "zstd")])
def test_ucx_worker_option(option, codec):
    """Worker(compression=) as Dask names it: over loopback "auto" compresses
    nothing; a forced codec is used; the message arrives equal."""
    async def main():
        sep, cep, ws = await ucx_pair(client_opts={"compression": option})
        assert cep.compression == codec
        assert sep.compression is None  # the server's default, on loopback
        data = compressible()
        sent = cep.send_frames_nowait([data.tobytes()])  # done once the peer took it
        got = await sep.recv_frames()
        await sent
        assert bytes(got[0]) == data.tobytes()
        for w in ws:
            w.close()

    run(main())


@ucx_only
def test_ucx_endpoint_option_and_prepare():
    """set_compression on one endpoint overrides its worker's; prepare_frames
    (what the comm runs off the loop) gives what send_nowait sends."""
    async def main():
        sep, cep, ws = await ucx_pair()
        assert cep.compression is None
        cep.set_compression("zstd")
        assert cep.compression == "zstd"
        data = compressible()
        prepared = cep.prepare_frames([data.tobytes(), b"small"], cep.compression)
        sent = cep.send_nowait(prepared)
        got = await sep.recv_frames()
        await sent
        assert bytes(got[0]) == data.tobytes() and bytes(got[1]) == b"small"
        cep.set_compression(None)
        assert cep.compression is None
        for bad in ("gzip", 3, "LZ4x"):
            with pytest.raises(ValueError, match="compression must be"):
                cep.set_compression(bad)
        for w in ws:
            w.close()

    run(main())


@ucx_only
def test_ucx_worker_option_refused():
    import gser.ucx

    async def main():
        with pytest.raises(ValueError, match="distributed.comm.compression"):
            gser.ucx.Worker(compression="brotli")

    run(main())


# Where gser:// comms that are to compress listen: another address than the
# client's 127.0.0.1, so that Dask (2023 on: Comm.same_host) takes the peer
# for another host's, and a forced codec compresses as it does between nodes.
OTHER_ADDRESS = "127.0.0.2"


def _comm_modules():
    pytest.importorskip("distributed")
    try:  # what these tests (and test_comm, whose peers they use) take from distributed's own tests
        import distributed.comm.tests.test_comms  # noqa: F401
    except ImportError as e:
        pytest.skip(f"distributed's own comm tests are not installed (PyPI's wheel leaves them out): {e}")
    import gser.comm  # noqa: F401
    import gser.dask  # noqa: F401  (registers gser://)


@ucx_only
@pytest.mark.parametrize("setting, codec", [("auto", None), (None, None), (False, None), ("lz4", "lz4"),
                                            ("zstd", "zstd"), ("zlib", None)])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_comm_honours_distributed_comm_compression(setting, codec):
    """gser:// reads distributed.comm.compression at each write: the codecs gser
    has compress in the transport (Dask's frames and their "compression"
    entries stay uncompressed/None on the receiving side), any other (zlib)
    is Dask's own; the data arrives equal either way. The listener is at
    127.0.0.2, another address than the client's: towards the same one,
    Dask from 2023 on compresses nothing (the test below)."""
    _comm_modules()
    import dask
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import Serialized, deserialize, to_serialize
    from distributed.protocol.compression import decompress

    async def main():
        a, b = await dask_tests.get_comm_pair(f"gser://{OTHER_ADDRESS}", deserialize=False)
        data = compressible()
        with dask.config.set({"distributed.comm.compression": setting}):
            await a.write({"x": to_serialize(data)})
        got = (await b.read())["x"]
        assert a._ep.compression == codec
        assert isinstance(got, Serialized)
        entries = got.header.get("compression") or [None] * len(got.frames)
        frames = got.frames
        if setting == "zlib":
            assert "zlib" in entries  # Dask compressed it itself
            frames = decompress(got.header, frames)
        else:
            assert all(c in (None, False) for c in entries), entries
            assert sum(memoryview(f).nbytes for f in frames) >= data.nbytes  # as Dask wrote them
        assert np.array_equal(deserialize(got.header, frames), data)
        await a.close()
        await b.close()

    run(main())


@ucx_only
@pytest.mark.parametrize("setting", ["lz4", "zstd", "zlib"])
@pytest.mark.parametrize("listen_at", ["127.0.0.1", OTHER_ADDRESS])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_comm_compresses_towards_its_own_host_as_tcp_does(setting, listen_at):
    """Whether a forced codec compresses towards a peer at the same address
    (127.0.0.1 to 127.0.0.1) is what the running Dask's tcp:// does: from
    Dask 2023 on nothing is compressed there (Comm.same_host), 2022.12
    compresses. Towards another address (127.0.0.2) both compress. Asked of
    tcp:// itself in the same test, not of the version."""
    _comm_modules()
    import dask
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import to_serialize

    async def compressed(scheme):
        """Whether the message went compressed: by gser's transport (the
        endpoint's codec) or in Dask's frames (their "compression" entries)."""
        with dask.config.set({"distributed.comm.compression": setting}):  # tcp:// reads it at the handshake
            a, b = await dask_tests.get_comm_pair(f"{scheme}://{listen_at}", deserialize=False)
            data = compressible()
            await a.write({"x": to_serialize(data)})
            got = (await b.read())["x"]
        entries = got.header.get("compression") or [None] * len(got.frames)
        by_gser = scheme == "gser" and a._ep.compression is not None
        await a.close()
        await b.close()
        return by_gser or any(c not in (None, False) for c in entries)

    async def main():
        return await compressed("tcp"), await compressed("gser")

    tcp, gser_ = run(main())
    if listen_at == OTHER_ADDRESS:
        assert tcp, "tcp:// compresses towards another address"
    assert gser_ == tcp


@ucx_only
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_comm_settings_differ_per_write_and_side():
    """Each side compresses by its own setting (both read every codec), so
    writes under different settings on the two ends of one comm interoperate
    (another address than the client's: see the test above)."""
    _comm_modules()
    import dask
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import to_serialize

    async def main():
        a, b = await dask_tests.get_comm_pair(f"gser://{OTHER_ADDRESS}")
        data = compressible()
        for sa, sb in [("lz4", "zstd"), ("zstd", None), (None, "lz4"), ("auto", "zstd")]:
            with dask.config.set({"distributed.comm.compression": sa}):
                await a.write({"x": to_serialize(data), "s": sa})
            with dask.config.set({"distributed.comm.compression": sb}):
                got = await b.read()
                await b.write({"x": to_serialize(got["x"]), "s": sb})
            back = await a.read()
            assert got["s"] == sa and back["s"] == sb
            assert np.array_equal(got["x"], data) and np.array_equal(back["x"], data)
        await a.close()
        await b.close()

    run(main())


@ucx_only
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_comm_large_messages_compress_off_the_event_loop(monkeypatch):
    """A message over distributed.comm.offload that its endpoint compresses is
    serialized and compressed on Dask's offload thread; small ones, and
    large ones that are not compressed, are not."""
    _comm_modules()
    import threading

    import dask
    import gser.comm
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import to_serialize

    threads = []
    real = gser.comm.offload

    async def counting(fn, *args, **kw):
        def inner(*a, **k):
            threads.append(threading.current_thread())
            return fn(*a, **k)

        return await real(inner, *args, **kw)

    monkeypatch.setattr(gser.comm, "offload", counting)

    async def main():
        a, b = await dask_tests.get_comm_pair(f"gser://{OTHER_ADDRESS}")
        big = np.repeat(np.arange(1 << 20, dtype=np.int64), 4)  # 32 MiB of runs
        with dask.config.set({"distributed.comm.compression": "lz4"}):
            await a.write({"x": to_serialize(big)})
            assert np.array_equal((await b.read())["x"], big)
            assert threads and all(t is not threading.main_thread() for t in threads)
            n = len(threads)
            await a.write({"x": to_serialize(compressible())})  # under the threshold
            assert np.array_equal((await b.read())["x"], compressible())
            assert len(threads) == n
        with dask.config.set({"distributed.comm.compression": None}):
            await a.write({"x": to_serialize(big)})
            assert np.array_equal((await b.read())["x"], big)
            assert len(threads) == n
        await a.close()
        await b.close()

    run(main())


@ucx_only
def test_ucx_recv_offloads_large_compressed_messages():
    """recv(offload=, offload_bytes=) deserializes a message that came
    compressed in more than offload_bytes through offload (on its thread),
    everything else inline; the request tells its size as it came and
    whether it is compressed before it is deserialized."""
    import asyncio
    import threading

    async def main():
        sep, cep, ws = await ucx_pair(client_opts={"compression": "lz4"})
        ran = []

        async def offload(fn):
            def inner():
                ran.append(threading.current_thread())
                return fn()

            return await asyncio.get_running_loop().run_in_executor(None, inner)

        big = np.repeat(np.arange(1 << 20, dtype=np.int64), 4)  # 32 MiB of runs
        sent = cep.send_frames_nowait([big.tobytes(), b"small"])
        got = await sep.recv_frames(offload=offload, offload_bytes=1 << 16)
        await sent
        assert bytes(got[0]) == big.tobytes() and bytes(got[1]) == b"small"
        assert sep.offloaded == 1 and len(ran) == 1 and ran[0] is not threading.current_thread()

        # Under the threshold as it came (compressed to a few MiB): inline.
        sent = cep.send_frames_nowait([big.tobytes()])
        got = await sep.recv_frames(offload=offload, offload_bytes=big.nbytes)
        await sent
        assert bytes(got[0]) == big.tobytes()
        assert sep.offloaded == 1 and len(ran) == 1

        # Not compressed, however large: inline (deserializing views the frames).
        cep.set_compression(None)
        sent = cep.send_frames_nowait([big.tobytes()])
        got = await sep.recv_frames(offload=offload, offload_bytes=1 << 16)
        await sent
        assert bytes(got[0]) == big.tobytes()
        assert sep.offloaded == 1 and len(ran) == 1

        # What the request says before it is deserialized.
        for codec, compressed in (("lz4", True), (None, False)):
            cep.set_compression(codec)
            sent = cep.send_frames_nowait([big.tobytes()])
            req = await sep._wait(sep._c.recv())
            await sent
            nbytes, is_compressed = req.size
            assert is_compressed is compressed
            assert (nbytes < big.nbytes // 2) if compressed else (nbytes > big.nbytes)
            assert bytes(req.result()[0]) == big.tobytes()
            assert req.size == (0, False)  # taken
        for w in ws:
            w.close()

    run(main())


@ucx_only
def test_ucx_large_compressed_result_releases_the_gil():
    """A large compressed message is decompressed with the GIL released, so
    the event loop's thread runs meanwhile. With the interpreter's forced
    switches off (a switch interval of 1000 s) another thread gets the GIL
    only where the running one lets go of it: the main thread sees the
    result not yet done exactly when result() released the GIL."""
    import sys
    import threading

    async def main():
        sep, cep, ws = await ucx_pair(client_opts={"compression": "lz4"})
        big = np.repeat(np.arange(1 << 20, dtype=np.int64), 4)
        sent = cep.send_frames_nowait([big.tobytes()])
        req = await sep._wait(sep._c.recv())
        await sent
        assert req.size[1]  # it came compressed
        state = {}

        def work():
            state["out"] = req.result()
            state["done"] = True

        old = sys.getswitchinterval()
        sys.setswitchinterval(1000)
        try:
            t = threading.Thread(target=work)
            t.start()  # back here once work() lets go of the GIL, or ends
            state["ran_during"] = "done" not in state
            t.join()
        finally:
            sys.setswitchinterval(old)
        assert state["ran_during"]
        assert bytes(state["out"][0]) == big.tobytes()
        for w in ws:
            w.close()

    run(main())


@ucx_only
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_comm_large_compressed_messages_decompress_off_the_event_loop(monkeypatch):
    """gser:// reads a compressed message over distributed.comm.offload by
    decompressing and deserializing it on Dask's offload thread (as Dask
    offloads deserializing large messages); small or uncompressed ones are
    read on the loop."""
    _comm_modules()
    import threading

    import dask
    import gser.comm
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import to_serialize

    calls = []
    real = gser.comm.offload

    async def counting(fn, *args, **kw):
        def inner(*a, **k):
            calls.append((getattr(fn, "func", fn).__name__, threading.current_thread().name))
            return fn(*a, **k)

        return await real(inner, *args, **kw)

    monkeypatch.setattr(gser.comm, "offload", counting)
    monkeypatch.setattr(gser.comm, "OFFLOAD_THRESHOLD", 1 << 20)

    async def main():
        a, b = await dask_tests.get_comm_pair(f"gser://{OTHER_ADDRESS}")
        a.handshake_options[gser.comm._PARTS_KEY] = False  # one message, not parts (tested below)
        big = np.repeat(np.arange(1 << 20, dtype=np.int64), 4)  # 32 MiB of runs: a few MiB in lz4
        with dask.config.set({"distributed.comm.compression": "lz4"}):
            await a.write({"x": to_serialize(big)})
            assert np.array_equal((await b.read())["x"], big)
        received = [c for c in calls if c[0] == "result"]
        assert len(received) == 1 and received[0][1].startswith("Dask-Offload"), calls
        assert b._ep.offloaded == 1
        with dask.config.set({"distributed.comm.compression": "lz4"}):
            await a.write({"x": to_serialize(np.arange(1000))})  # small
            assert np.array_equal((await b.read())["x"], np.arange(1000))
        with dask.config.set({"distributed.comm.compression": None}):
            await a.write({"x": to_serialize(big)})  # large, not compressed
            assert np.array_equal((await b.read())["x"], big)
        assert b._ep.offloaded == 1
        b.allow_offload = False  # as a comm of a server that does not offload
        with dask.config.set({"distributed.comm.compression": "lz4"}):
            await a.write({"x": to_serialize(big)})
            assert np.array_equal((await b.read())["x"], big)
        assert b._ep.offloaded == 1
        await a.close()
        await b.close()

    run(main())


@ucx_only
def test_comm_large_compressible_messages_travel_in_parts(monkeypatch):
    """A large message that compresses goes as parts of about 4 MiB: each
    compressed on the offload thread while the one before is sent, and
    decompressed as it comes; frames cut into pieces are joined again.
    Incompressible messages, and peers whose handshake lacks the key, get
    one message."""
    _comm_modules()
    import dask
    import gser.comm
    from distributed.comm.tests import test_comms as dask_tests
    from distributed.protocol import to_serialize

    prepared = []
    real = gser.ucx.Endpoint.prepare_frames

    def counting(self, frames, compression=None):
        prepared.append(len(frames))
        return real(self, frames, compression)

    monkeypatch.setattr(gser.ucx.Endpoint, "prepare_frames", counting)
    big = np.repeat(np.arange(1 << 20, dtype=np.int64), 4)  # 32 MiB of runs
    rnd = np.random.default_rng(3).random(1 << 22)  # 32 MiB, incompressible

    async def exchange(a, b, msg):
        prepared.clear()
        with dask.config.set({"distributed.comm.compression": "lz4"}):
            await a.write(msg)
            return await b.read()

    async def main():
        a, b = await dask_tests.get_comm_pair(f"gser://{OTHER_ADDRESS}")
        assert a.handshake_options[gser.comm._PARTS_KEY] and b.handshake_options[gser.comm._PARTS_KEY]
        offloaded = b._ep.offloaded
        got = await exchange(a, b, {"x": to_serialize(big), "y": to_serialize(np.arange(10)), "z": "small"})
        assert np.array_equal(got["x"], big) and np.array_equal(got["y"], np.arange(10)) and got["z"] == "small"
        assert len(prepared) >= 8, prepared  # 32 MiB in parts of 4 MiB, each compressed on its own
        assert b._ep.offloaded - offloaded >= 7  # the parts after the first that came compressed: off the loop
        got = await exchange(a, b, {"x": to_serialize(rnd)})
        assert np.array_equal(got["x"], rnd) and len(prepared) == 1, prepared  # does not compress: whole
        a2, b2 = await dask_tests.get_comm_pair(f"gser://{OTHER_ADDRESS}",
                                                connect_args={"handshake_overrides": {gser.comm._PARTS_KEY: 0}})
        assert not a2.handshake_options[gser.comm._PARTS_KEY] and not b2.handshake_options[gser.comm._PARTS_KEY]
        for x, y in ((a2, b2), (b2, a2)):
            got = await exchange(x, y, {"x": to_serialize(big)})
            assert np.array_equal(got["x"], big) and len(prepared) == 1, prepared
        for c in (a, b, a2, b2):
            await c.close()

    run(main())


def test_comm_parts_with_lying_markers_are_refused():
    """A marker whose counts do not match what follows is a GserError (the
    comm then closes), never a wait for parts that will not come."""
    _comm_modules()
    import struct

    import gser.comm
    from gser._gser import GserError

    class Peer:
        def __init__(self, parts):
            self.parts = list(parts)

        async def recv_frames_many(self, count, offload=None, offload_bytes=0):
            return [self.parts.pop(0) for _ in range(count)]

    def marker(nparts, counts, extra=b""):
        return memoryview(gser.comm._PARTS_HEAD.pack(gser.comm._PARTS_MAGIC, nparts, len(counts))
                          + struct.pack(f"<{len(counts)}I", *counts) + extra)

    piece = memoryview(b"abcd")
    comm = object.__new__(gser.comm.GserComm)

    async def main():
        got = await comm._read_parts(Peer([[piece, piece]]), [marker(2, [1, 2]), piece])
        assert [bytes(g) for g in got] == [b"abcd", b"abcdabcd"]
        for nparts, counts, extra, first, then in ((0, [1], b"", [], []), (1 << 20, [1], b"", [], []),
                                                   (1, [2], b"", [piece], []), (1, [1, 0], b"", [piece], []),
                                                   (2, [1], b"", [piece], [[piece]]), (1, [1], b"x", [piece], [])):
            with pytest.raises(GserError, match="in parts"):
                await comm._read_parts(Peer(then), [marker(nparts, counts, extra), *first])

    run(main())


@ucx_only
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_comm_sides_with_different_settings_in_two_processes():
    """A peer process that compresses with zstd and this one with lz4: the
    echo comes back equal."""
    _comm_modules()
    import dask
    from test_comm import Peer
    from distributed.comm import connect
    from distributed.protocol import to_serialize

    env = dict(os.environ, DASK_DISTRIBUTED__COMM__COMPRESSION="zstd")
    with Peer("serve", OTHER_ADDRESS, env=env) as peer:
        async def main():
            comm = await connect(peer.address)
            data = compressible()
            with dask.config.set({"distributed.comm.compression": "lz4"}):
                await comm.write({"data": to_serialize(data)})
                assert comm._ep.compression == "lz4"
            back = (await comm.read())["data"]
            assert np.array_equal(back, data)
            await comm.close()

        run(main())


NS = ("gcz-a", "gcz-b")
VETH = ("gcz-va", "gcz-vb")
ADDR = ("10.213.78.1", "10.213.78.2")


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair (names of this file's own)."""
    from netpair import veth_namespaces

    with veth_namespaces(NS, VETH, ADDR):
        yield


@ucx_only
def test_auto_compresses_between_network_namespaces(two_hosts):
    """Between two hosts (network namespaces joined by a veth pair, UCX over
    tcp) "auto" is link-aware: the first large message goes raw, measuring
    the link (the choice on shaped and unshaped links:
    test_link_compression.py); the data comes back equal."""
    _comm_modules()
    import subprocess
    import sys

    from test_comm import PEER, Peer

    env = dict(os.environ, UCX_TLS="tcp")
    env.pop("DASK_DISTRIBUTED__COMM__COMPRESSION", None)
    with Peer("serve", ADDR[0], prefix=("ip", "netns", "exec", NS[0]), env=env) as server:
        out = subprocess.run(["ip", "netns", "exec", NS[1], sys.executable, PEER, "codec", server.address],
                             capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split() == ["codec", "None"]
