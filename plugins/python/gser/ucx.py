"""gser's UCX transport (gser::ucx) for asyncio.

    import gser.ucx

    async def serve(ep):                       # one accepted Endpoint
        obj = await ep.recv()                  # one message, loaded as gser.loads does
        await ep.send({"echo": obj})

    worker = gser.ucx.Worker()                 # one UCX worker, driven by the running loop
    listener = worker.listen(serve, port=0)    # every interface, a free port
    ep = await worker.connect("127.0.0.1", listener.port)
    await ep.send({"x": numpy.ones(10**6)})    # one gser message; arrays are not copied
    reply = await ep.recv()
    frames = await ep.recv_frames()            # a message sent with send_frames()
    ep.close(); listener.close(); worker.close()

A message is what gser.dumps takes (dicts, lists, numpy arrays, objects with
__cuda_array_interface__ or DLPack, Arrow tables, ...): it travels as one
gser message, its header and small frames in one UCX send, large frames
zero-copy, device frames straight to UCX when both sides' UCX can read CUDA
memory and through pinned staging buffers otherwise. send_frames() sends a
list of frames (bytes-like objects, and device arrays) as such a message,
recv_frames() gives them back: memoryviews over the received host frames
(writable, not copied) and gser.DeviceArray for device frames, whose memory
comes from gser.set_device_allocator's function when one is set (a large
device frame is received straight into one allocation of its own:
gser.device_allocation(frame.ptr) gives it).

The loop watches the worker's event file descriptor (loop.add_reader); when
it is readable the worker is progressed until it can be armed again, so an
idle worker costs nothing. A Worker belongs to the loop that created it:
use it from that loop's thread only.

Failures raise gser.ucx.ConnectionClosedError (a ConnectionError) when the
endpoint failed or was closed, gser.GserError for anything else the
transport refuses; both carry the transport's message and, as .status /
.status_name, its gser_status_t.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import weakref

from gser import _gser
from gser._gser import GserError

HAVE_UCX = _gser.HAVE_UCX
#: peer_timeout_ms that turns the silent-peer check off.
PEER_TIMEOUT_NONE = getattr(_gser, "UCX_PEER_TIMEOUT_NONE", 0xFFFFFFFF)

__all__ = [
    "HAVE_UCX",
    "PEER_TIMEOUT_NONE",
    "ConnectionClosedError",
    "Context",
    "Endpoint",
    "Listener",
    "Worker",
    "default_context",
]

# gser_status_t values this module tells apart.
_INPROGRESS = 1
_ERR_CONNECTION = -26
_ERR_TIMEOUT = -27
_ERR_CANCELED = -28
_CLOSED = (_ERR_CONNECTION, _ERR_CANCELED, _ERR_TIMEOUT)

# Progress rounds in one go before other callbacks of the loop get a turn
# (a busy worker is progressed again right after them).
_ROUNDS = 64
# How long to wait before progressing again when a worker cannot be armed
# but nothing moves (asyncio's timers are as fine as the selector's 1 ms).
_IDLE_S = 0.001


class ConnectionClosedError(ConnectionError):
    """The endpoint failed (the peer went away, the network failed) or was
    closed here. status / status_name / detail: as GserError's."""

    def __init__(self, message, status=_ERR_CONNECTION, status_name="GSER_ERR_CONNECTION", detail=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.detail = detail if detail is not None else message


def _translate(e: GserError) -> Exception:
    """GserError of a closed or failed endpoint -> ConnectionClosedError."""
    if getattr(e, "status", None) in _CLOSED:
        out = ConnectionClosedError(str(e), e.status, e.status_name, e.detail)
        out.__cause__ = e
        return out
    return e


def _need_ucx():
    if not HAVE_UCX:
        raise ImportError("gser was built without gser::ucx (Debian's libucx-dev): gser.ucx is not available")


class Context:
    """A UCX transport context (gser_ucx_context_create).

    transports: as UCX_TLS lists them ("tcp", "posix,sysv,cma,self,tcp");
    None = the UCX_TLS environment variable, else UCX's default.
    peer_timeout_ms: a peer silent this long is failed (0 = 10000 ms;
    PEER_TIMEOUT_NONE = never). See gser_ucx_context_options_t.
    secret: a shared secret every connection proves both ways (None = the
    GSER_UCX_SECRET environment variable; "" = none). It never crosses the
    wire; nothing is encrypted (docs/ucx.md).
    net_devices: UCX network devices as UCX_NET_DEVICES lists them (None =
    that variable, else the device of the first address a worker listens on).
    """

    def __init__(self, transports: str | None = None, peer_timeout_ms: int = 0, secret: str | None = None,
                 net_devices: str | None = None):
        _need_ucx()
        self._c = _gser._UcxContext(transports=transports, peer_timeout_ms=peer_timeout_ms, secret=secret,
                                    net_devices=net_devices)
        self.transports = transports
        self.peer_timeout_ms = peer_timeout_ms
        self.net_devices = net_devices

    @property
    def cuda(self) -> bool:
        """Whether this UCX reads and writes CUDA memory (else device frames are staged)."""
        return bool(self._c.caps & _gser.UCX_CAP_CUDA)


_default = {"context": None, "pid": None}
_default_lock = threading.Lock()


def default_context(**options) -> Context:
    """The process's shared Context, created at the first call (with options;
    later calls return it as it is)."""
    with _default_lock:
        if _default["context"] is None or _default["pid"] != os.getpid():
            _default["context"] = Context(**options)
            _default["pid"] = os.getpid()
        return _default["context"]


class Worker:
    """A UCX worker driven by an asyncio loop (the running one by default).

    Options (0 = the transport's default): inline_max, inline_budget,
    staging_chunk, staging_depth, recv_cache_bytes, recv_cache_max_bytes,
    max_frames, max_bytes (see gser_ucx_worker_options_t); compression, as
    Dask's distributed.comm.compression names it: "auto" (the default: none
    towards a peer on this host, sampled lz4 towards another host), None or
    False (none), "lz4" or "zstd" (sampled, that codec on every transport;
    a codec the peer did not announce is never used), and
    compression_level (0: the codec's default).
    """

    def __init__(self, context: Context | None = None, *, loop=None, spin_us: float = 0, **options):
        _need_ucx()
        self.context = context if context is not None else default_context()
        self._loop = loop if loop is not None else asyncio.get_running_loop()
        #: How long a receive that found nothing polls before the loop
        #: sleeps on the fd (seconds; 0: never). See Endpoint._spin.
        self.spin_s = max(0.0, float(spin_us)) * 1e-6
        self._w = _gser._UcxWorker(self.context._c, **options)
        self._fd = self._w.fileno()
        self._scheduled = False
        self._armed = False  # arm() said so, and the fd has not woken the loop since
        self._waiting = False  # not armed, and nothing moved: the fd is not watched, _timer looks
        self._timer = None
        self._connecting: dict = {}  # _UcxEndpoint -> Future
        self.endpoints: weakref.WeakSet = weakref.WeakSet()
        self.listeners: weakref.WeakSet = weakref.WeakSet()
        #: Called with the worker once it failed for good (see failed).
        self.on_failed: list = []
        self._failed = None
        self._loop.add_reader(self._fd, self._on_fd)

    # -- driving it -------------------------------------------------------------------

    def _on_fd(self):
        """The fd woke the loop: the worker is no longer armed."""
        self._armed = False
        self._progress()

    def _progress(self):
        """Progress until the worker can be armed (then the fd wakes the loop).
        After _ROUNDS rounds that could not arm, come back once the loop's
        other callbacks ran. If nothing moved in them either, UCX waits on the
        peer (a large send the peer is still reading) and will not let the fd
        be armed meanwhile; the fd then stays readable, so watching it would
        spin, taking the CPU the peer needs: look once every _IDLE_S instead
        until something moves or the worker can be armed."""
        self._scheduled = False
        w = self._w
        if w is None:
            return
        moved = False
        for _ in range(1 if self._waiting else _ROUNDS):
            events = w.progress()
            if events:
                self._dispatch(events)
                moved = True
            elif w.handled:
                moved = True
            if self._connecting:
                self._check_connecting()
            if self._w is None:
                return
            if self._armed and not moved:
                # Armed by the last call, nothing moved since, and the fd has
                # not fired (_on_fd would have said so): still armed. A send
                # or receive just posted needs no arm then.
                return
            if w.arm():
                # Most calls end here: nothing more than needed (an armed
                # worker costs one look at its fd, C's arm).
                self._armed = True
                if self._waiting:
                    self._wait_for_peer(False)
                if self._failed is None and w.status()[0] < 0:
                    self._check_failed()
                return
            self._armed = False
        self._wait_for_peer(not moved)
        self._check_failed()
        if moved:
            self.kick()

    def _check_failed(self):
        if self._failed is None and self._w is not None and self._w.status()[0] < 0:
            self._failed = self.failed
            for cb in list(self.on_failed):
                try:
                    cb(self)
                except Exception:  # one listener's trouble is not the others'
                    logging.getLogger(__name__).exception("gser.ucx: an on_failed callback raised")

    @property
    def failed(self):
        """None, or the ConnectionClosedError that failed this worker for good:
        its shared-memory receive queue is blocked (a local peer killed while
        it wrote into it; UCX 1.13), so nothing from a local peer arrives any
        more. Every endpoint failed with it and no connection can be made:
        use a new Worker. The worker checks itself after a peer dies."""
        if self._w is None:
            return None
        st, why = self._w.status()
        if st >= 0 or st == _INPROGRESS:
            return None
        return ConnectionClosedError(why, st, "GSER_ERR_CONNECTION" if st == _ERR_CONNECTION else str(st))

    def check_queue(self):
        """Check the receive queue now, as after a peer's death (about 2 s;
        failed tells the outcome)."""
        self._check_open()
        self._w.check_queue()
        self.kick()

    def _wait_for_peer(self, waiting):
        """Switch between watching the fd and looking every _IDLE_S."""
        if self._loop.is_closed():
            return
        if waiting != self._waiting:
            self._waiting = waiting
            if waiting:
                self._loop.remove_reader(self._fd)
            else:
                self._loop.add_reader(self._fd, self._on_fd)
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
        if waiting and self._timer is None:
            self._timer = self._loop.call_later(_IDLE_S, self._on_timer)

    def _on_timer(self):
        self._timer = None
        self._progress()

    def kick(self):
        """Progress soon: work was posted that the event fd may not announce."""
        self._armed = False  # what was posted may need UCX's arm (a connection, a close)
        if not self._scheduled and self._w is not None and not self._loop.is_closed():
            self._scheduled = True
            self._loop.call_soon(self._progress)

    def _dispatch(self, events):
        for ev in events:
            if type(ev) is _gser._UcxRequest:
                # _complete, inline: a completed send or receive is most events
                user, ev.user = ev.user, None
                if user is None:
                    continue
                if type(user) is _Future:
                    if not user.done():
                        user.set_result(ev)
                else:
                    _complete_user(ev, user)
            else:  # an accepted _UcxEndpoint
                listener = ev.listener.user()
                if listener is None or listener.closed:
                    ev.destroy()
                else:
                    listener._accepted(ev)

    def _check_connecting(self):
        for c, fut in list(self._connecting.items()):
            if c.status != _INPROGRESS:
                del self._connecting[c]
                if not fut.done():
                    fut.set_result(None)

    # -- listening and connecting -------------------------------------------------------

    def listen(self, callback, address: str | None = None, port: int = 0) -> Listener:
        """Listen on address (None: every interface) and port (0: a free one).
        callback(endpoint) is called for every connection whose handshake
        succeeded; a coroutine function runs as a task. Listening stops when
        the Listener is closed or dropped: keep it."""
        self._check_open()
        try:
            c = self._w.listen(address, port)
        except GserError as e:
            raise _translate(e) from None
        self._armed = False  # the first listen creates UCX's worker: not armed yet
        lst = Listener(self, c, callback)
        self.listeners.add(lst)
        return lst

    async def connect(self, host: str, port: int, timeout: float | None = None) -> Endpoint:
        """Connect and wait for the handshake (at most timeout seconds).
        A refused or failed connection raises ConnectionClosedError."""
        self._check_open()
        try:
            c = self._w.connect(host, port)
        except GserError as e:
            raise _translate(e) from None
        fut = self._loop.create_future()
        self._connecting[c] = fut
        self.kick()
        try:
            if timeout is None:
                await fut
            else:
                await asyncio.wait_for(fut, timeout)
        except BaseException:
            self._connecting.pop(c, None)
            c.destroy()
            raise
        err = c.error()
        if err is not None:
            c.destroy()
            raise ConnectionClosedError(f"connecting to {host}:{port}: {err}", err.status, err.status_name,
                                        err.detail)
        ep = Endpoint(self, c)
        self.endpoints.add(ep)
        return ep

    # -- state --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._w is None

    def _check_open(self):
        if self._w is None:
            raise ConnectionClosedError("the gser.ucx worker is closed", _ERR_CANCELED, "GSER_ERR_CANCELED")

    def cache_stats(self) -> dict:
        self._check_open()
        return self._w.cache_stats()

    def alloc_host(self, n: int) -> memoryview:
        """A writable buffer of n bytes (contents undefined) from the receive
        cache: warm memory, reused like received frames' (a fresh buffer of
        tens of MiB faults in every page again). Handed back to the cache
        when the last view of it is gone."""
        self._check_open()
        return memoryview(self._w.alloc_host(n))

    def close(self):
        """Destroy the worker with its listeners and endpoints: what is in flight
        ends with ConnectionClosedError. Idempotent."""
        w, self._w = self._w, None
        if w is None:
            return
        if self._loop.is_closed():
            w.close()  # nobody can wait for what it still had
            self._connecting.clear()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            self._loop.remove_reader(self._fd)
        for ev in w.close():
            if type(ev) is _gser._UcxRequest:
                _complete(ev)
        for fut in self._connecting.values():
            if not fut.done():
                fut.set_result(None)
        self._connecting.clear()


def frames_of(out, who="gser.ucx") -> list:
    """out, a received message, as a list of frames: memoryviews of bytes
    over host frames, gser.DeviceArray for device frames (a typed host frame,
    a CPU DLPack tensor, becomes its bytes). Anything else raises GserError
    naming who received it."""
    if type(out) is not list:
        raise GserError(f"{who}: expected a list of frames, got a message of type {type(out).__name__}")
    for i, f in enumerate(out):
        t = type(f)
        if t is memoryview or t is _gser.DeviceArray:
            continue
        if t.__name__ == "ndarray" and t.__module__ == "numpy":
            out[i] = _bytes_of(memoryview(f))
            continue
        raise GserError(f"{who}: expected a list of frames, got a list with an item of type {t.__name__}")
    return out


def _complete(req):
    """A request completed: resolve its future, or call its callback."""
    user, req.user = req.user, None
    if user is not None:
        _complete_user(req, user)


def _complete_user(req, user):
    if isinstance(user, asyncio.Future):
        if not user.done():
            user.set_result(req)
    else:
        user(req)


# The loop's own futures (asyncio's C Future); others go through isinstance.
_Future = asyncio.Future
_perf = time.perf_counter
# Receives of an endpoint that sleep at once after a poll found nothing.
_SPIN_BACKOFF = 64


class Listener:
    """Accepts connections for a Worker (from Worker.listen)."""

    def __init__(self, worker: Worker, c, callback):
        self.worker = worker
        self._c = c
        self._callback = callback
        self._tasks: set = set()
        c.user = weakref.ref(self)  # for progress() to find it, without a cycle
        self.port = c.port

    @property
    def closed(self) -> bool:
        return self._c.closed

    @property
    def failed(self) -> int:
        """Connections whose handshake failed; the listener went on serving."""
        return self._c.failed

    def _accepted(self, c):
        ep = Endpoint(self.worker, c)
        self.worker.endpoints.add(ep)
        r = self._callback(ep)
        if asyncio.iscoroutine(r):
            task = self.worker._loop.create_task(r)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def close(self):
        """Stop listening; endpoints it accepted stay open."""
        self._c.close()


def _bytes_of(mv):
    """A contiguous memoryview as a flat memoryview of its bytes, not copied.
    An empty one of several dimensions (an empty partition's (0, 3) array)
    cannot be cast: its bytes are b""."""
    return mv.cast("B") if mv.nbytes else memoryview(b"")


class _DeviceBytes:
    """A device frame as plain device memory: its __cuda_array_interface__
    without its type, so that a frame of a type registered with gser (a
    CuPy array from Dask's cuda family) travels as a device buffer and
    arrives as one, not as that type."""

    __slots__ = ("obj", "__cuda_array_interface__")

    def __init__(self, obj):
        self.obj = obj  # keeps the memory alive while the send holds it
        self.__cuda_array_interface__ = obj.__cuda_array_interface__


def _frame(f):
    """One frame for send_frames: host bytes as a flat memoryview of bytes
    (gser's untyped bytes, not copied), device arrays as device buffers."""
    if type(f) is bytes:  # the common case first: Dask's headers
        return memoryview(f)
    if hasattr(f, "__cuda_array_interface__"):
        t = type(f)
        return f if t is _gser.DeviceFrame or t is _gser.DeviceArray else _DeviceBytes(f)
    if not _has_buffer(f) and hasattr(f, "__dlpack__"):
        return f
    mv = memoryview(f)
    if mv.ndim == 1 and mv.format == "B":
        return mv
    if mv.c_contiguous:
        return _bytes_of(mv)
    return memoryview(mv.tobytes())  # strided: one copy


def _has_buffer(f):
    try:
        memoryview(f)
    except TypeError:
        return False
    return True


class Endpoint:
    """One connection (from Worker.connect, or given to a listener's callback).

    Messages arrive in the order they were sent. One reader and one writer at
    a time is what a comm needs; concurrent sends and receives are allowed
    and keep the order in which they were posted.
    """

    def __init__(self, worker: Worker, c):
        self.worker = worker
        self._c = c
        #: Messages recv() deserialized through its offload function
        #: (large compressed ones).
        self.offloaded = 0
        self._spin_skip = 0  # receives left that do not poll (after a poll that found nothing)

    # -- state --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Closed here, or failed (the peer or the network)."""
        return self._c.status not in (0, _INPROGRESS)

    @property
    def state(self) -> str:
        """'ready', 'failed', 'closed' (close()) or 'destroyed'."""
        return self._c.state

    def error(self):
        """Why the endpoint failed or closed (a ConnectionClosedError), or None."""
        e = self._c.error()
        return None if e is None else _translate(e)

    def peer_info(self) -> dict:
        """The peer's handshake (wire_version, gser_wire_version, caps, cuda,
        mm_fifo_size: its shared-memory FIFO's segments) and the connection's
        addresses (local_host, local_port, peer_host, peer_port)."""
        info = self._c.peer_info()
        info["cuda"] = bool(info["caps"] & _gser.UCX_CAP_CUDA)
        return info

    # -- messages ------------------------------------------------------------------------

    @property
    def compression(self):
        """The codec this endpoint's sends are compressed with, as negotiated in
        its handshake: "lz4", "zstd" or None. Frames that do not shrink travel
        as they are."""
        return self._c.compression

    def choose_compression(self, frames, pipelined=False):
        """The codec to send these frames with: "lz4", "zstd" or None. With
        link-aware compression ("auto" between hosts), decided from what the
        endpoint measured of its link and of each codec on a sample of the
        frames (messages under 1 MiB get the last decision, unsampled);
        pipelined: they will be compressed in parts sent as they are ready.
        Otherwise the compression property. docs/ucx.md 4.5."""
        try:
            return self._c.choose_compression(frames, pipelined)
        except GserError as e:
            raise _translate(e) from None

    def raw_wins(self, nbytes, pipelined=False) -> bool:
        """Whether, with link-aware compression, what the endpoint measured
        already says a message of nbytes (1 MiB or more) moves fastest raw
        whatever its data: the link's rate against every codec's speed at
        the best ratio a codec could reach. True: recorded as the message's
        decision (as choose_compression would), no sample taken: send it
        uncompressed. False: ask choose_compression (nothing decided or
        sampled yet, the codecs due to be timed again, or a codec could win
        on data that shrinks enough). docs/ucx.md 4.5."""
        try:
            return self._c.raw_wins(nbytes, pipelined)
        except GserError as e:
            raise _translate(e) from None

    def mark_posted(self) -> None:
        """Every send of the message choose_compression last decided for
        (one send, or all of its parts) is posted: the endpoint times that
        message to its last send's completion, which corrects its model for
        the codec. Without it, the end is guessed from the compressed
        bytes the sample predicted (gser_ucx_ep_mark_posted)."""
        try:
            self._c.mark_posted()
        except GserError as e:
            raise _translate(e) from None

    @property
    def link_stats(self) -> dict:
        """The link-aware compression's measurements and last decision:
        codec, link_aware, send_rate (bytes/s), per codec (lz4, zstd) ratio,
        compress_rate and decompress_rate, estimate (seconds: raw, lz4, zstd),
        and counts (decisions, samples, rate_samples, probes, runs,
        explores, raw_wins: decisions raw without a sample); per codec fix
        (its messages' time over the model's) and ratio_fix (their size
        over their samples')."""
        try:
            return self._c.link_stats
        except GserError as e:
            raise _translate(e) from None

    def set_compression(self, compression) -> None:
        """What this endpoint compresses, over its worker's option (see Worker)."""
        self._c.set_compression(compression)

    def prepare_frames(self, frames, compression=None):
        """Serialize a list of frames as send_frames does, compressing host
        frames with compression ("lz4", "zstd", "auto" or None; see the
        compression property): the object to pass to send_nowait. Runs on
        any thread, with the GIL released while it compresses, so that large
        frames are compressed off the event loop."""
        try:
            return self._c.prepare([_frame(f) for f in frames], None, compression)
        except GserError as e:
            raise _translate(e) from None

    async def _wait(self, req):
        fut = self.worker._loop.create_future()
        req.user = fut
        w = self.worker
        w._progress()  # now: what already arrived completes it without a loop turn
        if w.spin_s and not fut.done():
            if self._spin_skip:
                self._spin_skip -= 1
            else:
                self._spin(fut)
        try:
            await fut
        except asyncio.CancelledError:
            # Undone here: a receive that matched nothing leaves the endpoint
            # usable, anything else closes it (gser_ucx_request_cancel).
            if not req.done:
                req.cancel()
                self.worker.kick()
            raise
        return req

    def _spin(self, fut):
        """Poll for at most the worker's spin_s before the loop sleeps: a
        peer that answers within it (a request and its reply) is seen
        without the sleep and wake-up of this process (tens of microseconds
        where the loop's CPU went idle). A poll that finds nothing lets the
        next _SPIN_BACKOFF receives of this endpoint sleep at once, so an
        endpoint whose messages come seldom costs at most one poll in
        _SPIN_BACKOFF + 1, and an idle worker none."""
        w = self.worker
        ww = w._w
        moved = False
        end = _perf() + w.spin_s
        while _perf() < end:
            events = ww.progress()
            if events:
                moved = True
                w._dispatch(events)
                if w._w is None or fut.done():
                    break
        else:
            self._spin_skip = _SPIN_BACKOFF
        if moved and w._w is not None:
            w._armed = False  # what moved may need UCX's arm
            w._progress()

    async def send(self, obj, families=None) -> None:
        """Send obj (anything gser.dumps takes) as one message; returns once the
        transport is done with obj's buffers."""
        try:
            req = await self._wait(self._c.send(obj, families))
            req.result()
        except GserError as e:
            raise _translate(e) from None

    async def send_frames(self, frames) -> None:
        """Send a list of frames (bytes-like objects; device arrays with
        __cuda_array_interface__ or DLPack) as one message."""
        await self.send([_frame(f) for f in frames])

    def send_nowait(self, obj, families=None, *, callback=None):
        """Start sending obj and return at once. The transport holds obj's
        buffers until the send completes: keep them unchanged until then. A
        large message completes only once the peer receives it, so a peer
        that sends before it receives needs this rather than send().

        Returns a future that resolves then (None, or ConnectionClosedError /
        GserError); with callback, calls callback(None or that exception)
        instead (perhaps before this returns) and returns None."""
        fut = None
        if callback is None:
            fut = self.worker._loop.create_future()

            def callback(error):
                if not fut.done():
                    if error is None:
                        fut.set_result(None)
                    else:
                        fut.set_exception(error)

        def done(req):
            try:
                req.result()
            except GserError as e:
                callback(_translate(e))
            else:
                callback(None)

        try:
            self._c.send(obj, families, user=done)
        except GserError as e:
            raise _translate(e) from None
        # Progress now rather than soon: a caller that keeps sending without
        # ever yielding to the loop still moves its messages.
        self.worker._progress()
        return fut

    def _send_then(self, obj, done):
        """send_nowait for gser.comm's small messages: done(req) once the
        send completed, well or not (req.result() raises the failure)."""
        try:
            self._c.send(obj, None, user=done)
        except GserError as e:
            raise _translate(e) from None
        self.worker._progress()

    def send_frames_nowait(self, frames, *, callback=None):
        """send_frames without waiting: see send_nowait."""
        return self.send_nowait([_frame(f) for f in frames], callback=callback)

    async def recv(self, device: bool = False, *, offload=None, offload_bytes: int = 0):
        """The next message, loaded as gser.loads does (arrays view the
        received frames).

        offload: None, or an async function that runs a function elsewhere
        and returns its result (Dask's distributed.utils.offload): a message
        with compressed frames that came in more than offload_bytes bytes
        (compressed frames at their size as sent) is deserialized through
        it, so that its decompression (the GIL released) leaves the event
        loop free. Other messages are deserialized here: without
        compression, deserializing only views the received frames."""
        try:
            return await self._load(await self._wait(self._c.recv()), device, offload, offload_bytes)
        except GserError as e:
            raise _translate(e) from None

    async def _load(self, req, device, offload, offload_bytes):
        """A completed receive's message, loaded here or through offload (recv)."""
        nbytes, compressed = req.size if offload is not None else (0, False)
        if compressed and nbytes > offload_bytes:
            self.offloaded += 1
            return await offload(functools.partial(req.result, device=device))
        return req.result(device=device)

    async def recv_frames(self, *, offload=None, offload_bytes: int = 0) -> list:
        """The next message sent with send_frames: memoryviews of bytes over
        host frames, gser.DeviceArray for device frames. Anything else (a peer
        that sent some other message) raises GserError. offload and
        offload_bytes: as for recv()."""
        return frames_of(await self.recv(offload=offload, offload_bytes=offload_bytes))

    async def recv_frames_many(self, count: int, *, offload=None, offload_bytes: int = 0) -> list:
        """The next count messages sent with send_frames, as recv_frames
        gives each (a list of their frame lists), their receives posted at
        once: the transport takes each message as it arrives, where one
        receive after another waits a loop turn between messages (a
        message in parts, raw on a fast link: 0.2 GB/s on a busy receiver
        against the link's 1.6). Cancelled or failed, the receives not yet
        matched are withdrawn (the endpoint stays usable)."""
        loop = self.worker._loop
        reqs, futs = [], []
        try:
            for _ in range(count):
                req = self._c.recv()
                fut = loop.create_future()
                req.user = fut  # before any progress can complete it
                reqs.append(req)
                futs.append(fut)
            self.worker._progress()
            out = []
            for fut in futs:
                out.append(frames_of(await self._load(await fut, False, offload, offload_bytes)))
            return out
        except GserError as e:
            raise _translate(e) from None
        finally:
            left = [r for r in reqs if not r.done]
            for r in left:
                r.cancel()
            if left:
                self.worker.kick()

    # -- teardown ------------------------------------------------------------------------

    def abort(self):
        """Close now: what is in flight ends with ConnectionClosedError, the peer
        sees the connection drop."""
        self._c.close()
        self._c.destroy()
        self.worker.kick()

    def close(self):
        """Destroy the endpoint: sends that completed are flushed to the peer
        first (bounded: at most 2 s), anything in flight is canceled."""
        self._c.destroy()
        self.worker.kick()
