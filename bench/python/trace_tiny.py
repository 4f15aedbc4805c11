#!/usr/bin/python3
"""Where a cycle of bench_comm.py's cluster_tiny_5000 goes, per comm (issue 39).

    PYTHONPATH=<build>/plugins/python /usr/bin/python3 bench/python/trace_tiny.py [--schemes gser,tcp] [--reps 2]

The row's workload (LocalCluster(n_workers=2, threads_per_worker=1,
processes=True), client.map of a tiny function over 5,000 ints, gather),
traced: Dask is not changed, its classes are wrapped in each process
(scheduler and client here, the workers through client.run) for the traced
runs only, the clusters of all schemes up at once and their runs
alternating, as in bench_comm.py. Recorded, with time.time() (one clock for
all processes on a host; Dask's BatchedSend deadlines use it too):

  - each BatchedSend.send (which stream, the ops and task keys enqueued);
  - each comm write (call and return) and read (return), on every comm,
    with the ops and keys of the message, so each compute-task and
    task-finished is followed from the scheduler's enqueue to the worker's
    read, and from the worker's enqueue to the scheduler's read;
  - each write of a BatchedSend: its interval, whether the batch waited for
    the deadline (its first message came before the previous write's
    deadline) and how late after that deadline it went, or how long it
    waited though sent at once;
  - each task's execution (start and end in the worker's thread).

Printed per scheme (median and the 10/90th percentiles over the tasks of
all runs): the phases of a task's round (scheduler enqueue -> batch write ->
worker read -> execution -> worker enqueue -> batch write -> scheduler read
-> the next task's enqueue), the interval between consecutive batches to a
worker (the cycle) and tasks per batch, where the run's time goes outside
the cycles (submission until the first compute-task, the last task-finished
until gather returned), and the floor that Dask's pacing gives.
--json prints the same as one JSON object per scheme.

Instead of that, on bench_comm.py's cluster_tiny_5000_unpaced run (the
scheduler's worker-saturation inf for it, every task sent at once):

  --profile      cProfile on the event loops of all three processes (the
                 main one holds the scheduler and the client), --reps runs
                 per scheme: each process's CPU, the cyclic GC's
                 collections and time, own time per task by area (gser's
                 C and Python, msgpack, Dask's comm and protocol, tornado,
                 asyncio, idle) and the functions whose time differs most.
  --perf DIR     Linux perf on the same processes (native code and the
                 kernel included): CPU per run by library and symbol.
  --unpaced-ab   the run --reps times for each of --variants (gser:// as
                 built, gser:// with every part through Dask's
                 protocol.dumps / loads, spin-us 0, tcp://), the order
                 rotated round by round: wall and all processes' CPU per
                 run, medians and ratios against tcp://.
"""

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time

from benchlib import row_clients  # bench/python: the script's own folder

N_TASKS = 5000


# ---- runs in every process (the scheduler's and client's here, each worker's via client.run) -------------------

def install():
    """Wrap BatchedSend.send and the comms' read and write (classes: every
    comm of the process, also those made later) and tag the process's
    running BatchedSends. Idempotent. Records go to sys.modules["_gser_trace"]."""
    import sys
    import time
    import types

    mod = sys.modules.get("_gser_trace")
    if mod is None:
        mod = sys.modules["_gser_trace"] = types.ModuleType("_gser_trace")
        mod.on = False
        mod.enq, mod.writes, mod.reads, mod.execs = [], [], [], []
        mod.bs_state = {}  # id(BatchedSend) -> deadline after its last write

        def ops_of(msg):
            if isinstance(msg, dict):
                msg = (msg,)
            elif not isinstance(msg, (list, tuple)):
                return ()
            out = []
            for m in msg:
                if isinstance(m, dict):
                    k = m.get("key")
                    out.append((m.get("op", "-"), str(k) if k is not None and not isinstance(k, (list, dict)) else None))
            return out

        from distributed.batched import BatchedSend
        orig_send = BatchedSend.send

        def send(self, *msgs):
            if mod.on:
                mod.enq.append((time.time(), id(self), ops_of(list(msgs))))
            return orig_send(self, *msgs)
        BatchedSend.send = send

        orig_start = BatchedSend.start

        def start(self, comm):
            comm._gser_trace_bs = self
            return orig_start(self, comm)
        BatchedSend.start = start

        classes = []
        from distributed.comm.tcp import TCP
        classes.append(TCP)
        try:
            from gser.comm import GserComm
            classes.append(GserComm)
        except Exception:
            pass
        for cls in classes:
            orig_write, orig_read = cls.write, cls.read

            def make(orig_write, orig_read):
                async def write(self, msg, *a, **k):
                    if not mod.on:
                        return await orig_write(self, msg, *a, **k)
                    t0 = time.time()
                    n = await orig_write(self, msg, *a, **k)
                    t1 = time.time()
                    bs = getattr(self, "_gser_trace_bs", None)
                    info = None
                    if bs is not None and bs.comm is self:
                        prev = mod.bs_state.get(id(bs))
                        mod.bs_state[id(bs)] = bs.next_deadline
                        info = (id(bs), bs.interval, prev)
                    mod.writes.append((t0, t1, id(self), info, ops_of(msg), n))
                    return n

                async def read(self, *a, **k):
                    msg = await orig_read(self, *a, **k)
                    if mod.on:
                        mod.reads.append((time.time(), id(self), ops_of(msg)))
                    return msg
                return write, read
            cls.write, cls.read = make(orig_write, orig_read)

    return True


def install_worker(dask_worker):
    """install(), and tag the worker's stream to the scheduler (started before)."""
    install()
    bs = dask_worker.batched_stream
    if bs.comm is not None:
        bs.comm._gser_trace_bs = bs
    return True


def install_scheduler(dask_scheduler):
    """install(), and tag the scheduler's streams to workers and clients."""
    install()
    for bs in list(dask_scheduler.stream_comms.values()) + list(dask_scheduler.client_comms.values()):
        if getattr(bs, "comm", None) is not None:
            bs.comm._gser_trace_bs = bs
    return True


def switch(on):
    import sys
    mod = sys.modules["_gser_trace"]
    mod.on = on
    if on:
        mod.enq.clear()
        mod.writes.clear()
        mod.reads.clear()
        mod.execs.clear()
        mod.bs_state.clear()
    return True


def collect():
    import sys
    mod = sys.modules["_gser_trace"]
    return {"enq": list(mod.enq), "writes": list(mod.writes), "reads": list(mod.reads), "execs": list(mod.execs)}


def traced_inc(x):
    import sys
    import time
    t0 = time.time()
    y = x + 1
    mod = sys.modules.get("_gser_trace")
    if mod is not None and mod.on:
        mod.execs.append((x, t0, time.time()))
    return y


# ---- the measuring side ----------------------------------------------------------------------------------------

def _scheduler_busy(dask_scheduler):
    return len(dask_scheduler.tasks)


def settle(clients):
    """Wait until every cluster let go of its last run's tasks (the releases
    after a run cascade client -> scheduler -> workers for a while; all
    clusters' schedulers and clients share this process and its CPU), so
    that no run is traced beside another cluster's clean-up."""
    end = time.time() + 30
    while time.time() < end and any(c.run_on_scheduler(_scheduler_busy) for c in clients):
        time.sleep(0.05)
    time.sleep(0.2)


def one_run(client, traced):
    t_map = time.time()
    futures = client.map(traced_inc, range(N_TASKS), pure=False)
    keys = [str(f.key) for f in futures]
    assert sum(client.gather(futures)) == sum(range(1, N_TASKS + 1))
    t_end = time.time()
    del futures
    return t_map, t_end, keys


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def summary(xs, scale=1e3):
    """median, p10, p90 (ms), count"""
    if not xs:
        return None
    return {"median": round(statistics.median(xs) * scale, 3), "p10": round(pct(xs, 0.1) * scale, 3),
            "p90": round(pct(xs, 0.9) * scale, 3), "mean": round(statistics.fmean(xs) * scale, 3), "n": len(xs)}


def analyse(run, main_rec, worker_recs):
    """Per task phases, per batch stats, from the records of one run."""
    t_map, t_end, keys = run
    keyset = set(keys)
    index = {k: i for i, k in enumerate(keys)}
    recs = [("main", main_rec)] + [(f"w{i}", r) for i, r in enumerate(worker_recs)]

    # task key -> time per event
    s_enq, s_write, w_read, w_enq, w_write, s_read, c_read = {}, {}, {}, {}, {}, {}, {}
    execs = {}
    slack = []
    batches = collections.defaultdict(list)  # (proc, bs id) -> [(t0, t1, ntasks, waited_deadline, late, wait)]
    for proc, r in recs:
        first_enq = {}  # (bs id) -> time of the first message since its last write
        enq_by_bs = collections.defaultdict(list)
        for t, bs, ops in r["enq"]:
            enq_by_bs[bs].append((t, ops))
            for op, k in ops:
                if k in keyset:
                    if op == "compute-task" and proc == "main":
                        s_enq.setdefault(k, t)
                    elif op == "task-finished" and proc != "main":
                        w_enq.setdefault(k, t)
        for t0, t1, cid, info, ops, n in r["writes"]:
            for op, k in ops:
                if k in keyset:
                    if op == "compute-task" and proc == "main":
                        s_write.setdefault(k, t0)
                    elif op == "task-finished" and proc != "main":
                        w_write.setdefault(k, t0)
            if info is not None:
                bs, interval, prev_deadline = info
                # the first enqueue of this batch: the earliest enqueue after the previous write of this bs
                prev_writes = [b[0] for b in batches[(proc, bs)]]
                after = prev_writes[-1] if prev_writes else 0
                firsts = [t for t, _ in enq_by_bs[bs] if after <= t <= t0]
                first = firsts[0] if firsts else t0
                waited = prev_deadline is not None and first < prev_deadline
                late = (t0 - prev_deadline) if waited else None
                ntasks = sum(1 for op, k in ops if k in keyset and op in ("compute-task", "task-finished"))
                if waited and proc == "main" and ntasks:
                    # how long before the deadline the batch's last task was ready: time that a faster
                    # chain (the comm included) could not have saved; < 0: it came in the lateness
                    slack.append(prev_deadline - firsts[-1])
                batches[(proc, bs)].append((t0, t1, ntasks, waited, late, t0 - first, interval, len(ops)))
        for t, cid, ops in r["reads"]:
            for op, k in ops:
                if k in keyset:
                    if op == "compute-task" and proc != "main":
                        w_read.setdefault(k, t)
                    elif op == "task-finished" and proc == "main":
                        s_read.setdefault(k, t)
                    elif op == "key-in-memory" and proc == "main":
                        c_read.setdefault(k, t)
        for x, t0, t1 in r["execs"]:
            if 0 <= x < len(keys):
                execs[keys[x]] = (t0, t1)

    phases = collections.defaultdict(list)
    for k in keys:
        try:
            a, b, c, (e0, e1), d, e, f = s_enq[k], s_write[k], w_read[k], execs[k], w_enq[k], w_write[k], s_read[k]
        except KeyError:
            continue
        phases["1 scheduler: enqueue -> batch write (5 ms pacing)"].append(b - a)
        phases["2 comm scheduler->worker: write call -> read returns"].append(c - b)
        phases["3 worker: read -> execution starts"].append(e0 - c)
        phases["4 execution"].append(e1 - e0)
        phases["5 worker: execution ends -> task-finished enqueued"].append(d - e1)
        phases["6 worker: enqueue -> batch write (2 ms pacing)"].append(e - d)
        phases["7 comm worker->scheduler: write call -> read returns"].append(f - e)
        phases["0 task round: scheduler enqueue -> scheduler read of task-finished"].append(f - a)
    # scheduler: task-finished read -> the enqueue of a later task (transitions, stealing, ...): the next
    # compute-task enqueued after each task-finished read
    enq_times = sorted(s_enq.values())
    import bisect
    for k, t in s_read.items():
        i = bisect.bisect_left(enq_times, t)
        if i < len(enq_times):
            phases["8 scheduler: task-finished read -> next compute-task enqueued"].append(enq_times[i] - t)

    cycles, per_batch, late, immediate_wait = [], [], [], []
    waited_n = immediate_n = 0
    wbatch = []
    for (proc, bs), bl in batches.items():
        tasks = sum(b[2] for b in bl)
        if proc == "main" and tasks > 0:  # a scheduler -> worker stream with the run's tasks
            bl = [b for b in bl if b[2] > 0]
            for prev, cur in zip(bl, bl[1:]):
                cycles.append(cur[0] - prev[0])
            for b in bl:
                per_batch.append(b[2])
                if b[3]:
                    waited_n += 1
                    late.append(b[4])
                else:
                    immediate_n += 1
                    immediate_wait.append(b[5])
        elif proc != "main" and tasks > 0:
            wbatch.extend(b[2] for b in bl if b[2] > 0)
    first_write = min(s_write.values()) if s_write else float("nan")
    last_read = max(s_read.values()) if s_read else float("nan")
    return {
        "wall_s": t_end - t_map,
        "submit_to_first_compute_task_s": first_write - t_map,
        "first_compute_task_to_last_task_finished_s": last_read - first_write,
        "last_task_finished_to_gather_done_s": t_end - last_read,
        "tasks_traced": len(phases["0 task round: scheduler enqueue -> scheduler read of task-finished"]),
        "phases": phases,
        "cycles": cycles,
        "tasks_per_scheduler_batch": per_batch,
        "tasks_per_worker_batch": wbatch,
        "scheduler_batches_waited_for_deadline": waited_n,
        "scheduler_batches_sent_at_once": immediate_n,
        "late_after_deadline": late,
        "slack_before_deadline": slack,
        "wait_when_sent_at_once": immediate_wait,
    }


def merge(results):
    out = {k: [] for k in ("wall_s", "submit_to_first_compute_task_s", "first_compute_task_to_last_task_finished_s",
                           "last_task_finished_to_gather_done_s")}
    phases = collections.defaultdict(list)
    cycles, per_batch, wbatch, late, imm, slack = [], [], [], [], [], []
    waited = at_once = 0
    for r in results:
        for k in out:
            out[k].append(round(r[k], 4))
        for k, v in r["phases"].items():
            phases[k].extend(v)
        cycles += r["cycles"]
        per_batch += r["tasks_per_scheduler_batch"]
        wbatch += r["tasks_per_worker_batch"]
        late += r["late_after_deadline"]
        imm += r["wait_when_sent_at_once"]
        slack += r["slack_before_deadline"]
        waited += r["scheduler_batches_waited_for_deadline"]
        at_once += r["scheduler_batches_sent_at_once"]
    out["phases_ms"] = {k: summary(v) for k, v in sorted(phases.items())}
    out["cycle_ms"] = summary(cycles)
    out["cycle_ms_histogram"] = dict(sorted(collections.Counter(min(int(c * 1e3), 20) for c in cycles).items()))
    out["tasks_per_scheduler_batch"] = dict(sorted(collections.Counter(per_batch).items()))
    out["tasks_per_worker_batch"] = dict(sorted(collections.Counter(wbatch).items()))
    out["scheduler_batches_waited_for_deadline"] = waited
    out["scheduler_batches_sent_at_once"] = at_once
    out["late_after_deadline_ms"] = summary(late)
    out["wait_when_sent_at_once_ms"] = summary(imm)
    out["slack_before_deadline_ms"] = summary(slack)
    out["slack_under_0.5ms_share"] = round(sum(x < 0.5e-3 for x in slack) / max(1, len(slack)), 4)
    # Dask's pacing: at most one batch per worker per 5 ms; the run's tasks per batch give the floor
    nb = len(per_batch) / max(1, len(results))
    out["scheduler_batches_per_run"] = round(nb, 1)
    return out


def timer_lateness(n=400, delay=0.005, woken=False):
    """How late asyncio runs call_later(delay) in this process, on an
    otherwise idle loop: the lateness every BatchedSend deadline starts
    from, before any work. The selector rounds its timeout up to whole
    milliseconds (epoll), counted from the loop's last wake-up: woken, the
    loop wakes once at a random moment before the deadline (as the
    scheduler's loop does for its other comms), which moves the rounding.
    ms: median, p10, p90, mean."""
    import asyncio
    import random
    import threading

    rng = random.Random(1)

    async def go():
        loop = asyncio.get_running_loop()
        out = []
        for _ in range(n):
            fut = loop.create_future()
            t0 = time.time()
            loop.call_later(delay, fut.set_result, None)
            if woken:  # by an fd (the loop's self-pipe), as a comm's read wakes it
                threading.Timer(rng.uniform(0, delay), loop.call_soon_threadsafe, (lambda: None,)).start()
            await fut
            out.append(time.time() - t0 - delay)
        return out
    return summary(asyncio.run(go()))


def _spec_inc(x):
    return x + 1


def batch_check(schemes, n, reps):
    """One scheduler batch of n compute-task messages (what the scheduler
    sends at once without queuing), each run_spec a ToPickle as 2026.x
    sends it (2022.12 sends bytes there; the same message is used for both)
    through each comm, both ends in this process: the write's and the
    read's times (ms, median and p10-p90 over reps), and encoding alone
    (Dask's to_frames for tcp://, gser's whole-message encoder for gser://)."""
    import asyncio

    from distributed.comm import connect, listen
    from distributed.comm.utils import to_frames
    from distributed.protocol.serialize import ToPickle

    try:
        from dask._task_spec import Task  # 2026.x: the run_spec is a Task

        def spec(i):
            return Task(f"k-{i}", _spec_inc, i)
    except ImportError:
        def spec(i):
            return (_spec_inc, i)

    def batch():
        return [{"op": "compute-task", "key": f"inc-{i:032x}", "run_spec": ToPickle(spec(i)), "priority": (0, i),
                 "duration": 0.5, "who_has": {}, "nbytes": {}, "resource_restrictions": {}, "actor": False,
                 "annotations": {}, "stimulus_id": f"compute-{i}"} for i in range(n)]

    async def go():
        import gser.comm
        from distributed.comm.core import CommClosedError

        got = asyncio.Queue()

        async def handle(comm):
            try:
                while True:
                    m = await comm.read()
                    await got.put((time.perf_counter(), len(m)))
            except CommClosedError:
                pass
        out = {}
        for s in schemes:
            lst = await listen(f"{s}://127.0.0.1:0", handle)
            c = await connect(lst.contact_address)
            writes, reads = [], []
            for _ in range(reps + 1):  # the first warms up
                msg = batch()
                t0 = time.perf_counter()
                await c.write(msg)
                tw = time.perf_counter()
                t1, k = await got.get()
                assert k == n, k
                writes.append(tw - t0)
                reads.append(t1 - t0)
            msg = batch()
            t0 = time.perf_counter()
            if s == "gser":
                ep = c._ep
                _, dask_codec = gser.comm._compression()
                assert c._encode_msg(ep, msg, gser.comm.SERIALIZERS, "raise", dask_codec, None, False, True)
            else:
                await to_frames(msg, allow_offload=False, serializers=gser.comm.SERIALIZERS, on_error="raise",
                                context={})
            enc = time.perf_counter() - t0
            await c.close()
            lst.stop()
            out[s] = {"write_ms": summary(writes[1:]), "read_ms": summary(reads[1:]), "encode_ms": round(enc * 1e3, 3)}
        return out
    return asyncio.run(go())


# ---- --profile: cProfile in every process of the unpaced run -------------------------------------------------

def _unpaced(value, dask_scheduler=None):
    """bench_comm.py's cluster_tiny_5000_unpaced setting, on the scheduler's
    loop between runs: WORKER_SATURATION value, or None for its own again."""
    if value is None:
        value = getattr(dask_scheduler, "_trace_saturation", dask_scheduler.WORKER_SATURATION)
    elif not hasattr(dask_scheduler, "_trace_saturation"):
        dask_scheduler._trace_saturation = dask_scheduler.WORKER_SATURATION
    dask_scheduler.WORKER_SATURATION = value


def prof_start(dask_scheduler=None, dask_worker=None):
    """cProfile on the calling thread (a server's event loop: client.run and
    run_on_scheduler call a plain function there), and the process's and
    thread's CPU clocks."""
    import cProfile
    import sys
    import threading
    import time
    import types

    mod = sys.modules.setdefault("_gser_prof", types.ModuleType("_gser_prof"))
    if getattr(mod, "prof", None) is not None:  # the scheduler and client share a loop: profiled once
        return threading.get_ident()
    mod.prof = cProfile.Profile()
    mod.t0 = (time.perf_counter(), time.process_time(), time.thread_time(), threading.get_ident())
    # The cyclic GC's collections and time per generation (a collection's
    # time lands on whatever function allocated when it started).
    mod.gc = [[0, 0.0], [0, 0.0], [0, 0.0]]
    mod.gc_t = 0.0

    def on_gc(phase, info):
        if phase == "start":
            mod.gc_t = time.perf_counter()
        else:
            g = mod.gc[info["generation"]]
            g[0] += 1
            g[1] += time.perf_counter() - mod.gc_t
    import gc
    if getattr(mod, "on_gc", None) in gc.callbacks:
        gc.callbacks.remove(mod.on_gc)
    mod.on_gc = on_gc
    gc.callbacks.append(on_gc)
    mod.prof.enable()
    return threading.get_ident()


def prof_stop(dask_scheduler=None, dask_worker=None):
    """(the profile's stats {(file, line, func): (cc, nc, tt, ct, callers)}
    without callers, wall s, process CPU s, loop thread CPU s, the cyclic
    GC's [(collections, s)] per generation in all the process's threads)."""
    import sys
    import time

    mod = sys.modules["_gser_prof"]
    if mod.prof is None:  # stopped already (the same loop)
        return None
    mod.prof.disable()
    import gc
    if mod.on_gc in gc.callbacks:
        gc.callbacks.remove(mod.on_gc)
    w0, p0, t0, _ = mod.t0
    wall, cpu, tcpu = time.perf_counter() - w0, time.process_time() - p0, time.thread_time() - t0
    mod.prof.create_stats()
    stats = {k: v[:4] for k, v in mod.prof.stats.items()}
    mod.prof = None
    return stats, wall, cpu, tcpu, [(n, round(t, 4)) for n, t in mod.gc]


async def _aprof(fn):
    return fn()


def _fname(key):
    f, line, name = key
    if f == "~":
        return name
    parts = f.replace("\\", "/").split("/")
    for root in ("distributed", "tornado", "asyncio", "gser", "msgpack", "dask"):
        if root in parts:
            f = "/".join(parts[len(parts) - 1 - parts[::-1].index(root):])
            break
    else:
        f = parts[-1]
    return f"{f}:{line}({name})"


_AREAS = (("idle (epoll)", ("select.epoll",)), ("gser C (_gser)", ("gser._gser",)),
          ("gser Python (gser/)", ("gser/",)), ("msgpack", ("msgpack",)), ("pickle", ("pickle",)),
          ("Dask comm (distributed/comm)", ("distributed/comm/",)),
          ("Dask protocol (distributed/protocol)", ("distributed/protocol/",)),
          ("tornado + sockets", ("tornado/", "_socket.socket")), ("asyncio", ("asyncio/", "_asyncio", "selectors")),
          ("Dask other (distributed/, dask/)", ("distributed/", "dask/")))


def _area(fn):
    for name, marks in _AREAS:
        if any(m in fn for m in marks):
            return name
    return "other (builtins, stdlib, toolz)"


def _merge_stats(stat_list):
    out = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for st in stat_list:
        for k, (cc, nc, tt, ct) in st.items():
            o = out[_fname(k)]
            o[0] += nc
            o[1] += tt
            o[2] += ct
    return out


def profile_runs(clients, reps, top):
    """Each scheme's unpaced run under cProfile (scheduler loop, both
    workers' loops, the client's loop), its runs alternating; per process
    role: wall, CPU, and the functions whose own time (tottime) differs
    most between the first two schemes, per task."""
    prof = {s: {"scheduler": [], "workers": [], "client": [], "cpu": collections.defaultdict(list), "wall": []}
            for s in clients}
    for s, c in clients.items():
        c.run_on_scheduler(_unpaced, float("inf"))
        one_run(c, False)  # warm-up, unpaced
    for _ in range(reps):
        for s, c in clients.items():
            settle(clients.values())
            client_tid = c.sync(_aprof, prof_start)
            sched_tid = c.run_on_scheduler(prof_start)
            c.run(prof_start)
            t0, t1, _ = one_run(c, False)
            wst = c.run(prof_stop)
            sst = c.run_on_scheduler(prof_stop)
            cst = c.sync(_aprof, prof_stop) if client_tid != sched_tid else None
            prof[s]["wall"].append(round(t1 - t0, 3))
            prof[s]["cpu"]["main_process (scheduler + client)"].append(round(sst[2], 3))
            prof[s]["cpu"]["main_process_gc (collections, s) per generation"].append(sst[4])
            prof[s]["cpu"]["workers_gc (collections, s) per generation"].append([st[4] for st in wst.values()])
            prof[s]["scheduler"].append(sst[0])
            prof[s]["cpu"]["scheduler_loop_thread"].append(round(sst[3], 3))
            if cst is not None:
                prof[s]["client"].append(cst[0])
                prof[s]["cpu"]["client_loop_thread"].append(round(cst[3], 3))
            for w, st in sorted(wst.items()):
                prof[s]["workers"].append(st[0])
            prof[s]["cpu"]["workers_process_sum"].append(round(sum(st[2] for st in wst.values()), 3))
            prof[s]["cpu"]["workers_loop_thread_sum"].append(round(sum(st[3] for st in wst.values()), 3))
    for s, c in clients.items():
        c.run_on_scheduler(_unpaced, None)
    schemes = list(clients)
    out = {"wall_s": {s: prof[s]["wall"] for s in schemes},
           "cpu_s": {s: dict(prof[s]["cpu"]) for s in schemes}, "roles": {}}
    per = reps * N_TASKS
    for role in ("scheduler", "workers", "client"):
        merged = {s: _merge_stats(prof[s][role]) for s in schemes if prof[s][role]}
        if len(merged) < 2:
            continue
        a, b = schemes[:2]
        keys = set(merged[a]) | set(merged[b])
        z = [0, 0.0, 0.0]
        rows = sorted(keys, key=lambda k: -abs(merged[a].get(k, z)[1] - merged[b].get(k, z)[1]))[:top]
        total = {s: sum(v[1] for v in merged[s].values()) for s in (a, b)}
        areas = {s: collections.Counter() for s in (a, b)}
        for s in (a, b):
            for k, v in merged[s].items():
                areas[s][_area(k)] += v[1]
        out["roles"][role] = {
            "own_time_s_per_run": {s: round(total[s] / reps, 3) for s in (a, b)},
            "by_area_us_per_task": {s: {k: round(v / per * 1e6, 2) for k, v in areas[s].most_common()}
                                    for s in (a, b)},
            "top_own": {s: [(k, round(v[1] / per * 1e6, 3), round(v[0] / per, 3))
                            for k, v in sorted(merged[s].items(), key=lambda kv: -kv[1][1])[:top]] for s in (a, b)},
            "rows": [{"fn": k, **{f"{s}_us_per_task": round(merged[s].get(k, z)[1] / per * 1e6, 3) for s in (a, b)},
                      **{f"{s}_calls_per_task": round(merged[s].get(k, z)[0] / per, 3) for s in (a, b)}}
                     for k in rows]}
    return out


def _gser_setting(direct, spin_us=None):
    """This process's gser:// (the client's and scheduler's here, a worker's
    through client.run): gser.comm.DIRECT_PARTS (direct: parts made
    without Dask's protocol.dumps / loads call, or through it), and its
    gser.ucx workers' spin (spin_us None: distributed.comm.gser.spin-us)."""
    import gser.comm
    gser.comm.DIRECT_PARTS = direct
    if spin_us is None:
        spin_us = float(gser.comm._config("spin-us", gser.comm._SPIN_US) or 0)
    for w in list(gser.comm._workers.values()):
        w.spin_s = spin_us * 1e-6
    return direct


def _gc_collect():
    import gc
    gc.collect()


def _cpu():
    import time
    return time.process_time()


# --unpaced-ab's variants: name -> (scheme, _gser_setting's arguments or None)
AB_VARIANTS = {
    "gser": ("gser", (True, None)),                # this tree's gser://
    "gser_dask_calls": ("gser", (False, None)),    # every part through Dask's dumps/loads (main before)
    "gser_spin_0": ("gser", (True, 0)),            # parts direct, distributed.comm.gser.spin-us 0
    "tcp": ("tcp", None),
}


def unpaced_ab(clients, reps, names):
    """bench_comm.py's cluster_tiny_5000_unpaced run in one session for each
    variant of names (AB_VARIANTS), the order rotated round by round, each
    run after a settle and a gc.collect in every process: ({variant: [s,
    ...]}, {variant: {"main": [CPU s], "workers": [CPU s]}}) (the CPU of
    the main process, the scheduler's and client's, and both workers')."""
    variants = [(n, *AB_VARIANTS[n]) for n in names]
    times = {n: [] for n in names}
    cpu = {n: {"main": [], "workers": []} for n in names}
    for s, c in clients.items():
        c.run_on_scheduler(_unpaced, float("inf"))
        one_run(c, False)  # warm-up, unpaced
    for r in range(reps):
        k = r % len(variants)
        for name, s, setting in variants[k:] + variants[:k]:
            c = clients[s]
            if setting is not None:
                _gser_setting(*setting)
                c.run(_gser_setting, *setting)
            settle(clients.values())
            _gc_collect()
            c.run(_gc_collect)
            m0, w0 = _cpu(), c.run(_cpu)
            t0, t1, _ = one_run(c, False)
            m1, w1 = _cpu(), c.run(_cpu)
            times[name].append(round(t1 - t0, 3))
            cpu[name]["main"].append(round(m1 - m0, 3))
            cpu[name]["workers"].append(round(sum(w1[w] - w0[w] for w in w1), 3))
    _gser_setting(*AB_VARIANTS["gser"][1])
    for s, c in clients.items():
        c.run_on_scheduler(_unpaced, None)
        if s == "gser":
            c.run(_gser_setting, *AB_VARIANTS["gser"][1])
    return times, cpu


def _pid():
    import os
    return os.getpid()


def perf_runs(clients, reps, outdir):
    """The unpaced run under Linux perf (sampling at 1999 Hz the main
    process and both workers, every thread, kernel included: the native
    side that cProfile does not see), --reps runs per scheme alternating:
    {scheme: {"by_dso": [(share of the samples in %, dso)], "by_symbol":
    [(%, dso, symbol)], "samples_per_run": n}}. perf's files stay in outdir."""
    import subprocess

    os.makedirs(outdir, exist_ok=True)
    for s, c in clients.items():
        c.run_on_scheduler(_unpaced, float("inf"))
        one_run(c, False)
    files = {s: [] for s in clients}
    for r in range(reps):
        for s, c in clients.items():
            pids = [os.getpid(), *c.run(_pid).values()]
            settle(clients.values())
            f = os.path.join(outdir, f"{s}-{r}.data")
            p = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-o", f, "-p", ",".join(map(str, pids))],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.3)  # perf attached
            one_run(c, False)
            p.send_signal(2)
            p.wait(30)
            files[s].append(f)
    for s, c in clients.items():
        c.run_on_scheduler(_unpaced, None)
    out = {}
    for s, fs in files.items():
        by = {"dso": collections.Counter(), "dso,sym": collections.Counter()}
        for f in fs:
            for key, counter in by.items():
                rep = subprocess.run(["perf", "report", "-i", f, "-n", "--sort", key, "--stdio", "-q"],
                                     capture_output=True, text=True).stdout
                for line in rep.splitlines():
                    parts = line.split(None, 2)  # overhead, samples, the rest
                    if len(parts) == 3 and parts[0].endswith("%") and parts[1].isdigit():
                        counter[" ".join(parts[2].split())] += int(parts[1])
        n = sum(by["dso"].values()) or 1
        out[s] = {"cpu_s_per_run": round(n / 1999 / len(fs), 3),
                  "by_dso_cpu_s_per_run": [(round(v / 1999 / len(fs), 3), k) for k, v in by["dso"].most_common(12)],
                  "by_symbol_cpu_s_per_run": [(round(v / 1999 / len(fs), 3), k)
                                              for k, v in by["dso,sym"].most_common(40)]}
    return out


def print_profile(out):
    print(f"wall s: {out['wall_s']}")
    for s, cpu in out["cpu_s"].items():
        print(f"{s}:// CPU s per run: {cpu}")
    for role, r in out["roles"].items():
        (a, ta), (b, tb) = r["own_time_s_per_run"].items()
        where = "the main process's loop (the scheduler's, and the client's where it shares it)" if role == "scheduler" else role
        for s, areas in r["by_area_us_per_task"].items():
            print(f"== {where}, {s}://: own time per task by area (us): {areas}")
        for s, rows in r["top_own"].items():
            print(f"== {where}, {s}://: most own time per task (us, calls)")
            for k, us, calls in rows:
                print(f"   {us:>9.2f} {calls:>8.2f}  {k}")
        print(f"== {where}: own time per run {a} {ta} s, {b} {tb} s; largest differences per task")
        print(f"   {a + ' us':>9} {b + ' us':>9} {a + ' calls':>10} {b + ' calls':>10}  function")
        for row in r["rows"]:
            print(f"   {row[a + '_us_per_task']:>9.2f} {row[b + '_us_per_task']:>9.2f} {row[a + '_calls_per_task']:>10.2f} "
                  f"{row[b + '_calls_per_task']:>10.2f}  {row['fn']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default="gser,tcp")
    ap.add_argument("--reps", type=int, default=2, help="traced runs per scheme (default 2)")
    ap.add_argument("--plain-reps", type=int, default=1, help="untraced runs per scheme, for the wall time (default 1)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--saturation", help="distributed.scheduler.worker-saturation for a diagnostic run (e.g. inf: "
                    "no queuing, where the comm is on the critical path); not the benchmark row's setting")
    ap.add_argument("--batch", type=int, metavar="N", help="instead: one N-task compute-task batch through each "
                    "comm in this process, write -> read (e.g. 2500, what --saturation inf sends at once)")
    ap.add_argument("--dump", help="also pickle each traced run's raw records to this file (to look further)")
    ap.add_argument("--profile", action="store_true", help="instead: bench_comm.py's cluster_tiny_5000_unpaced "
                    "run under cProfile in every process (the scheduler's, workers' and client's event loops), "
                    "--reps runs per scheme; prints the process CPU and the functions whose time differs most")
    ap.add_argument("--unpaced-ab", action="store_true", help="instead: the unpaced run --reps times for each "
                    "of --variants of gser:// and tcp://, rotating; prints the runs, medians, ratios and each "
                    "run's CPU in all processes")
    ap.add_argument("--variants", default="gser,gser_dask_calls,tcp", help="--unpaced-ab: which of "
                    + ", ".join(AB_VARIANTS) + " (default gser,gser_dask_calls,tcp)")
    ap.add_argument("--perf", metavar="DIR", help="instead: the unpaced run under Linux perf (main process and "
                    "workers, kernel included), --reps runs per scheme; perf's files in DIR")
    ap.add_argument("--top", type=int, default=30, help="--profile: functions listed per process role")
    args = ap.parse_args()

    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import distributed

    import gser.dask  # noqa: F401

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    schemes = args.schemes.split(",")
    if args.batch:
        for s, row in batch_check(schemes, args.batch, max(args.reps, 5)).items():
            row.update(scheme=s, tasks=args.batch, distributed=distributed.__version__)
            print(json.dumps(row) if args.json else f"{s}:// one {args.batch}-task batch: {row}", flush=True)
        return 0
    if args.saturation is not None:
        import dask
        dask.config.set({"distributed.scheduler.worker-saturation": float(args.saturation)})
    print(f"# distributed {distributed.__version__}, python {sys.executable}, load {os.getloadavg()}",
          file=sys.stderr, flush=True)
    if args.perf:
        with contextlib.ExitStack() as stack:
            out = perf_runs(row_clients(stack, schemes), args.reps, args.perf)
        out = {"perf": out, "distributed": distributed.__version__, "load": [round(x, 2) for x in os.getloadavg()]}
        print(json.dumps(out), flush=True)
        return 0
    if args.unpaced_ab:
        with contextlib.ExitStack() as stack:
            names = args.variants.split(",")
            times, cpu = unpaced_ab(row_clients(stack, sorted({AB_VARIANTS[n][0] for n in names})), args.reps, names)
        med = {k: statistics.median(v) for k, v in times.items()}
        cpu_med = {k: round(statistics.median(m + w for m, w in zip(v["main"], v["workers"])), 3)
                   for k, v in cpu.items()}
        out = {"runs_s": times, "median_s": med, "cpu_s": cpu,
               "cpu_all_processes_median_s": cpu_med,
               "cpu_ratio_vs_tcp": {k: round(v / cpu_med["tcp"], 3) for k, v in cpu_med.items()},
               "uptime_load": [round(x, 2) for x in os.getloadavg()],
               "ratio_vs_tcp": {k: round(v / med["tcp"], 3) for k, v in med.items()},
               "distributed": distributed.__version__, "load": [round(x, 2) for x in os.getloadavg()]}
        print(json.dumps(out), flush=True)
        return 0
    if args.profile:
        with contextlib.ExitStack() as stack:
            out = profile_runs(row_clients(stack, schemes), args.reps, args.top)
        out.update(distributed=distributed.__version__, load=[round(x, 2) for x in os.getloadavg()])
        print(json.dumps(out) if args.json else "", flush=True)
        if not args.json:
            print_profile(out)
        return 0
    with contextlib.ExitStack() as stack:
        clients = row_clients(stack, schemes)  # bench_comm.py's clusters
        for s, c in clients.items():
            install()
            c.run(install_worker)
            c.run_on_scheduler(install_scheduler)
            one_run(c, False)  # warm-up
        plain = {s: [] for s in schemes}
        results = {s: [] for s in schemes}
        raw = {s: [] for s in schemes}
        for _ in range(args.plain_reps):
            for s, c in clients.items():
                settle(clients.values())
                t0, t1, _ = one_run(c, False)
                plain[s].append(round(t1 - t0, 3))
        for _ in range(args.reps):
            for s, c in clients.items():
                settle(clients.values())
                c.run(switch, True)
                switch(True)
                run = one_run(c, True)
                switch(False)
                c.run(switch, False)
                main_rec = collect()
                worker_recs = list(c.run(collect).values())
                results[s].append(analyse(run, main_rec, worker_recs))
                raw[s].append((run, main_rec, worker_recs))
    if args.dump:
        import pickle
        with open(args.dump, "wb") as f:
            pickle.dump(raw, f)
    timer = {"idle": timer_lateness(), "woken once before": timer_lateness(woken=True)}
    for s in schemes:
        m = merge(results[s])
        m["idle_loop_call_later_5ms_lateness_ms"] = timer
        m["scheme"] = s
        m["untraced_wall_s"] = plain[s]
        m["distributed"] = distributed.__version__
        m["load"] = [round(x, 2) for x in os.getloadavg()]
        if args.json:
            print(json.dumps(m), flush=True)
        else:
            print(f"== {s}:// (distributed {distributed.__version__}) untraced wall {plain[s]} s, traced {m['wall_s']} s")
            for k in ("submit_to_first_compute_task_s", "first_compute_task_to_last_task_finished_s",
                      "last_task_finished_to_gather_done_s"):
                print(f"   {k:<45} {m[k]}")
            print(f"   cycle (consecutive scheduler batches to a worker) ms: {m['cycle_ms']}")
            print(f"   cycle histogram (ms floor: count): {m['cycle_ms_histogram']}")
            print(f"   tasks per scheduler batch: {m['tasks_per_scheduler_batch']}, per worker batch: "
                  f"{m['tasks_per_worker_batch']}, scheduler batches per run {m['scheduler_batches_per_run']}")
            print(f"   scheduler batches: waited for the deadline {m['scheduler_batches_waited_for_deadline']} "
                  f"(late after it, ms: {m['late_after_deadline_ms']}), sent at once "
                  f"{m['scheduler_batches_sent_at_once']} (waited ms: {m['wait_when_sent_at_once_ms']})")
            print(f"   scheduler batches that waited: their last task was ready this long before the deadline, ms: "
                  f"{m['slack_before_deadline_ms']} (share under 0.5 ms: {m['slack_under_0.5ms_share']})")
            if timer is not None:
                print(f"   this process's event loop alone, call_later(5 ms) lateness ms: {timer}")
            for k, v in m["phases_ms"].items():
                print(f"   {k:<70} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
