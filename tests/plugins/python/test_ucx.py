"""gser.ucx: the Python bindings of gser::ucx on asyncio. Messages and frames
through a listener and an endpoint on 127.0.0.1, device frames staged on the
emulated backend, C errors as Python exceptions, cancel and close, an idle
worker that sleeps, and objects that do not leak."""

import asyncio
import gc
import os
import resource
import select

import pytest

import gser
from memory import rss_growth

np = pytest.importorskip("numpy")
pytestmark = pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)")

import gser.ucx  # noqa: E402
from test_device import Dev  # noqa: E402  (host memory behind __cuda_array_interface__)
from test_dlpack import FakeTensor, HostOnly, kDLCUDA  # noqa: E402  (DLPack producers)

EMULATED = gser.DEVICE_BACKEND == "emulated"


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def pair(worker=None):
    """A listener's endpoint and a connected one, on one worker."""
    w = worker or gser.ucx.Worker()
    accepted = asyncio.Queue()
    lst = w.listen(accepted.put_nowait, "127.0.0.1", 0)
    ep = await w.connect("127.0.0.1", lst.port, timeout=10)
    srv = await asyncio.wait_for(accepted.get(), 10)
    return w, lst, ep, srv


def test_objects_and_order():
    async def main():
        w, lst, a, b = await pair()
        msgs = [{"op": "x", "i": i, "t": (1, None), "arr": np.arange(i, dtype=np.int32)} for i in range(50)]
        for m in msgs:
            await a.send(m)
        for m in msgs:
            got = await b.recv()
            assert got["i"] == m["i"] and got["t"] == (1, None) and np.array_equal(got["arr"], m["arr"])
        info = a.peer_info()
        assert info["wire_version"] == gser._gser.UCX_WIRE_VERSION and info["cuda"] is False
        if not any(os.environ.get(v) for v in ("UCX_TLS", "UCX_MM_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE",
                                               "UCX_SYSV_FIFO_SIZE")):
            assert info["mm_fifo_size"] == 1024  # gser's shared-memory FIFO, as the peer announced it
        assert a.state == b.state == "ready" and not a.closed
        w.close()

    run(main())


def test_frames_zero_copy_writable():
    big = np.arange(1 << 20, dtype=np.float64)  # 8 MiB: a frame of its own
    strided = memoryview(np.arange(100, dtype=np.int16))[::2]

    async def main():
        w, lst, a, b = await pair()
        # A large frame is done only once the peer receives it: both at once.
        _, out = await asyncio.gather(a.send_frames([b"head", bytearray(b"ba"), big, strided, b""]),
                                      b.recv_frames())
        assert [type(f) for f in out] == [memoryview] * 5
        assert bytes(out[0]) == b"head" and bytes(out[1]) == b"ba" and bytes(out[4]) == b""
        assert bytes(out[2]) == big.tobytes() and bytes(out[3]) == np.arange(0, 100, 2, dtype=np.int16).tobytes()
        assert not out[2].readonly  # the received frame is ours
        view = np.frombuffer(out[2], dtype=np.float64)
        view[0] = 5.0  # no copy was made: the view writes into the frame
        assert out[2][:8] == np.float64(5.0).tobytes()
        w.close()

    run(main())


def test_empty_frames_of_any_shape():
    # An empty partition's arrays: no bytes, but a shape with a 0 in it
    # (memoryview.cast refuses those). Found by Dask's test_worker.py over
    # gser:// (test_broken_comm: a shuffle's empty pieces).
    frames = [b"head", np.zeros((0, 3)), np.zeros((3, 0), dtype=np.int8), np.zeros((2, 0, 2), dtype="u1"),
              memoryview(np.zeros((4, 0)))[::2], np.zeros(0)]

    async def main():
        w, lst, a, b = await pair()
        _, out = await asyncio.gather(a.send_frames(frames), b.recv_frames())
        assert [bytes(f) for f in out] == [b"head"] + [b""] * 5
        w.close()

    run(main())


@pytest.mark.skipif(not EMULATED, reason="device frames need GSER_DEVICE=emulated here (or a GPU)")
def test_host_and_device_frames_in_one_message():
    dev_big = np.arange(300_000, dtype=np.float32)
    dev_small = np.arange(100, dtype=np.int16)

    async def main():
        w, lst, a, b = await pair(gser.ucx.Worker(staging_chunk=64 << 10))  # several staged chunks
        frames = [b"header", Dev(dev_big), np.ones(10), Dev(dev_small),
                  FakeTensor(dev_small, device_type=kDLCUDA), HostOnly(dev_small)]  # DLPack: device, CPU
        _, out = await asyncio.gather(a.send_frames(frames), b.recv_frames())
        assert [type(f) for f in out] == [memoryview, gser.DeviceArray, memoryview, gser.DeviceArray,
                                          gser.DeviceArray, memoryview]
        assert bytes(out[0]) == b"header" and bytes(out[2]) == np.ones(10).tobytes()
        assert out[1].dtype == np.float32 and np.array_equal(out[1].copy_to_host(), dev_big)
        for f in out[3:5]:
            assert f.dtype == np.int16 and np.array_equal(f.copy_to_host(), dev_small)
        assert bytes(out[5]) == dev_small.tobytes()
        w.close()

    run(main())


@pytest.mark.skipif(not EMULATED, reason="needs the emulated backend's queues (events answer 'not yet' first)")
def test_armed_worker_always_has_a_wakeup_coming():
    """Driven as an event loop drives it (progress, arm, sleep on the fd), a
    staged message arrives: the end of a device copy does not show on the
    fd, so arm() must not say "sleep" while one runs (nothing would wake the
    loop but an unrelated event, seconds later)."""
    c = gser._gser
    w = c._UcxWorker(c._UcxContext(), staging_chunk=64 << 10)  # 16 chunks, copies both ways
    lst = w.listen("127.0.0.1", 0)
    ep = w.connect("127.0.0.1", lst.port)
    accepted = []
    while ep.state == "connecting" or not accepted:
        accepted += [e for e in w.progress() if type(e) is c._UcxEndpoint]
    data = np.arange(1 << 17, dtype=np.int64)
    send = ep.send([Dev(data)])
    recv = accepted[0].recv()
    while not (send.done and recv.done):
        w.progress()
        if w.arm():
            readable, _, _ = select.select([w.fileno()], [], [], 2.0)
            assert readable, "armed with the message half staged, and nothing woke the loop"
    assert np.array_equal(recv.result()[0].copy_to_host(), data)
    w.close()


def test_connection_refused_carries_the_c_message():
    async def main():
        w = gser.ucx.Worker()
        lst = w.listen(lambda ep: None, "127.0.0.1", 0)
        port = lst.port
        lst.close()
        with pytest.raises(gser.ucx.ConnectionClosedError) as ei:
            await w.connect("127.0.0.1", port, timeout=10)
        assert ei.value.status_name == "GSER_ERR_CONNECTION" and f"127.0.0.1:{port}" in str(ei.value)
        w.close()

    run(main())


def test_errors_after_close_and_peer_close():
    async def main():
        w, lst, a, b = await pair()
        pending = asyncio.ensure_future(b.recv())
        await asyncio.sleep(0.05)
        a.close()  # the peer's pending receive fails
        with pytest.raises(gser.ucx.ConnectionClosedError) as ei:
            await asyncio.wait_for(pending, 10)
        assert ei.value.status_name == "GSER_ERR_CONNECTION"
        detail = ei.value.detail  # the transport's own message, not just the status
        assert detail and ("peer" in detail or "receive" in detail), detail
        assert b.closed and b.state == "failed" and isinstance(b.error(), gser.ucx.ConnectionClosedError)
        with pytest.raises(gser.ucx.ConnectionClosedError):
            await a.send({"x": 1})  # destroyed here
        with pytest.raises(gser.ucx.ConnectionClosedError):
            await b.send({"x": 1})  # failed by the peer
        w.close()
        with pytest.raises(gser.ucx.ConnectionClosedError):
            await w.connect("127.0.0.1", lst.port)

    run(main())


def test_unserializable_and_non_frames_messages():
    async def main():
        w, lst, a, b = await pair()
        with pytest.raises(NotImplementedError):
            await a.send(object())  # gser never pickles: nothing is sent
        await a.send({"not": "frames"})
        with pytest.raises(gser.GserError, match="expected a list of frames"):
            await b.recv_frames()
        await a.send([b"x"])  # bytes, not a frame
        with pytest.raises(gser.GserError, match="an item of type bytes"):
            await b.recv_frames()
        await a.send_frames([b"ok"])  # the endpoint is still good
        assert [bytes(f) for f in await b.recv_frames()] == [b"ok"]
        w.close()

    run(main())


def test_cancel_unmatched_receive_keeps_endpoint():
    async def main():
        w, lst, a, b = await pair()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.recv(), 0.1)
        assert b.state == "ready"
        await a.send("after")
        assert await b.recv() == "after"
        w.close()

    run(main())


def test_receives_posted_at_once():
    """recv_frames_many posts its receives together and gives each
    message's frames in order; cancelled with some unmatched, those are
    withdrawn and the endpoint goes on with the next message."""
    async def main():
        w, lst, a, b = await pair()
        big = [np.arange(i << 18, dtype=np.int64) for i in range(1, 4)]  # 2, 4, 6 MiB
        for x in big:
            a.send_frames_nowait([b"h", x])
        got = await b.recv_frames_many(3)
        assert [bytes(m[0]) for m in got] == [b"h"] * 3
        assert all(np.array_equal(np.frombuffer(m[1], np.int64), x) for m, x in zip(got, big))
        a.send_frames_nowait([b"one"])
        many = asyncio.ensure_future(b.recv_frames_many(3))
        await asyncio.sleep(0.1)
        assert not many.done()
        many.cancel()
        with pytest.raises(asyncio.CancelledError):
            await many
        assert b.state == "ready"
        await a.send_frames([b"after"])
        assert [bytes(f) for f in await b.recv_frames()] == [b"after"]  # not taken by a withdrawn receive
        w.close()

    run(main())


def test_worker_close_ends_pending_operations():
    async def main():
        w, lst, a, b = await pair()
        pending = [asyncio.ensure_future(a.recv()), asyncio.ensure_future(b.recv())]
        await asyncio.sleep(0.05)
        w.close()
        for p in pending:
            with pytest.raises(gser.ucx.ConnectionClosedError) as ei:
                await asyncio.wait_for(p, 10)
            assert ei.value.status_name == "GSER_ERR_CANCELED"
        assert w.closed and a.state == "destroyed"
        w.close()  # idempotent

    run(main())


def test_send_nowait_completes_when_the_peer_receives():
    big = np.ones(4 << 20)  # 32 MiB: UCX's rendezvous, done when the peer takes it

    async def main():
        w, lst, a, b = await pair()
        fut = a.send_frames_nowait([big])
        got = await b.recv_frames()
        await asyncio.wait_for(fut, 10)
        assert bytes(got[0]) == big.tobytes()
        w.close()

    run(main())


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def test_idle_worker_sleeps():
    """Waiting on an open connection with a receive posted costs no CPU: the
    loop sleeps on the worker's event fd (a busy poll would use ~1 s here)."""
    async def main():
        w, lst, a, b = await pair()
        pending = asyncio.ensure_future(b.recv())
        await asyncio.sleep(0.1)
        start = cpu_seconds()
        await asyncio.sleep(1.0)
        used = cpu_seconds() - start
        assert used < 0.25, f"{used:.3f} s of CPU in 1 s idle"
        await a.send("wake")
        assert await asyncio.wait_for(pending, 10) == "wake"
        w.close()

    run(main())


def test_spin_polls_once_then_sleeps():
    """Worker(spin_us=...): a receive that finds nothing polls that long
    before the loop sleeps, then the endpoint's next receives sleep at once
    (_SPIN_BACKOFF of them); an idle worker with a receive posted still
    costs no CPU, and messages arrive as without polling."""
    async def main():
        w, lst, a, b = await pair(gser.ucx.Worker(spin_us=20000))
        assert w.spin_s == pytest.approx(0.02)
        start = cpu_seconds()
        t0 = asyncio.get_running_loop().time()
        pending = asyncio.ensure_future(b.recv())
        await asyncio.sleep(0)  # the receive is posted, polls 20 ms, finds nothing
        assert asyncio.get_running_loop().time() - t0 >= 0.019
        assert b._spin_skip == gser.ucx._SPIN_BACKOFF
        await asyncio.sleep(1.0)
        used = cpu_seconds() - start
        assert used < 0.25, f"{used:.3f} s of CPU in 1 s idle"
        await a.send("wake")
        assert await asyncio.wait_for(pending, 10) == "wake"
        # The next receive sleeps at once (one of the backoff's).
        t0 = asyncio.get_running_loop().time()
        pending = asyncio.ensure_future(b.recv())
        await asyncio.sleep(0)
        assert asyncio.get_running_loop().time() - t0 < 0.015
        assert b._spin_skip == gser.ucx._SPIN_BACKOFF - 1
        for i in range(5):
            await a.send({"i": i})
        assert await asyncio.wait_for(pending, 10) == {"i": 0}
        for i in range(1, 5):
            assert await b.recv() == {"i": i}
        w.close()

    run(main())


def test_objects_do_not_leak():
    async def cycle_async():
        w, lst, a, b = await pair()
        for _ in range(20):
            await a.send({"x": np.arange(1000)})
            await b.recv()
        a.close()
        w.close()

    def cycle():
        run(cycle_async())

    cycle()
    gc.collect()
    counts = {t: sum(type(o).__name__ == t for o in gc.get_objects())
              for t in ("_UcxWorker", "_UcxEndpoint", "_UcxListener", "_UcxRequest")}
    assert counts == {"_UcxWorker": 0, "_UcxEndpoint": 0, "_UcxListener": 0, "_UcxRequest": 0}, counts
    fds = len(os.listdir("/proc/self/fd"))
    growth = rss_growth(cycle, 30)
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert growth < 16 << 20, f"resident memory grew by {growth >> 20} MiB over 30 worker cycles"


def test_a_shared_secret_admits_only_peers_that_prove_it():
    async def main():
        server = gser.ucx.Worker(gser.ucx.Context(secret="s3cret"))
        accepted = asyncio.Queue()
        lst = server.listen(accepted.put_nowait, "127.0.0.1", 0)
        for wrong in ("other", ""):  # another secret, and none at all
            client = gser.ucx.Worker(gser.ucx.Context(secret=wrong))
            with pytest.raises(gser.ucx.ConnectionClosedError, match="GSER_ERR_ACCESS"):
                await client.connect("127.0.0.1", lst.port, timeout=10)
            client.close()
        assert accepted.empty(), "a peer without the secret never reaches the accept callback"
        client = gser.ucx.Worker(gser.ucx.Context(secret="s3cret"))
        ep = await client.connect("127.0.0.1", lst.port, timeout=10)
        srv = await asyncio.wait_for(accepted.get(), 10)
        await ep.send({"hello": 1})
        assert await srv.recv() == {"hello": 1}
        client.close()
        server.close()

    run(main())


def test_a_strangers_hello_of_another_version_does_not_stop_the_listener():
    async def main():
        w = gser.ucx.Worker()
        accepted = asyncio.Queue()
        lst = w.listen(accepted.put_nowait, "127.0.0.1", 0)
        # The 64-byte hello of transport version 99, from a plain socket.
        hello = b"\x89GSERUCX" + (99).to_bytes(4, "little") + bytes(52)
        reader, writer = await asyncio.open_connection("127.0.0.1", lst.port)
        writer.write(hello)
        await writer.drain()
        await asyncio.wait_for(reader.read(), 10)  # this side's hello, then the end
        writer.close()
        for _ in range(200):
            if lst.failed:
                break
            await asyncio.sleep(0.01)
        assert lst.failed == 1 and not lst.closed
        ep = await w.connect("127.0.0.1", lst.port, timeout=10)
        srv = await asyncio.wait_for(accepted.get(), 10)
        await ep.send({"after": "a stranger"})
        assert await srv.recv() == {"after": "a stranger"}
        w.close()

    run(main())


def test_an_access_refusal_says_which_side_lacks_the_secret():
    async def main():
        server = gser.ucx.Worker(gser.ucx.Context(secret="s3cret"))
        lst = server.listen(lambda ep: None, "127.0.0.1", 0)
        plain = gser.ucx.Worker(gser.ucx.Context(secret=""))
        plain_lst = plain.listen(lambda ep: None, "127.0.0.1", 0)
        cases = [
            ("other", lst.port, "refused this side's proof of the shared secret (the secrets differ)"),
            ("", lst.port, "the server proves a shared secret and this side has none"),
            ("s3cret", plain_lst.port, "the server does not prove the shared secret"),
        ]
        for secret, port, why in cases:
            client = gser.ucx.Worker(gser.ucx.Context(secret=secret))
            with pytest.raises(gser.ucx.ConnectionClosedError) as ei:
                await client.connect("127.0.0.1", port, timeout=10)
            e = ei.value
            assert e.status_name == "GSER_ERR_ACCESS" and why in str(e) and why in e.detail, (secret, str(e))
            client.close()
        plain.close()
        server.close()

    run(main())


def test_a_peer_that_stops_progressing_is_failed_after_the_peer_timeout():
    """The worker's loop is blocked (time.sleep) past the peer's timeout: the
    other side's pending receive fails instead of waiting forever."""
    import threading
    import time

    async def main():
        w = gser.ucx.Worker(gser.ucx.Context(peer_timeout_ms=1000))
        accepted = asyncio.Queue()
        lst = w.listen(accepted.put_nowait, "127.0.0.1", 0)
        done = threading.Event()
        port = lst.port

        def silent_peer():  # its own loop, which then stops running
            async def peer():
                pw = gser.ucx.Worker(gser.ucx.Context(peer_timeout_ms=1000))
                ep = await pw.connect("127.0.0.1", port, timeout=10)
                time.sleep(4)  # blocks this loop: no progress, no heartbeat
                ep.close()
                pw.close()
            asyncio.run(peer())
            done.set()

        t = threading.Thread(target=silent_peer)
        t.start()
        srv = await asyncio.wait_for(accepted.get(), 10)
        start = time.monotonic()
        with pytest.raises(gser.ucx.ConnectionClosedError, match="silent"):
            await asyncio.wait_for(srv.recv(), 30)
        assert time.monotonic() - start < 3.5, "failed within the timeout and a bounded slack"
        await asyncio.get_running_loop().run_in_executor(None, t.join)
        w.close()

    run(main())
