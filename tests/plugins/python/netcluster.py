#!/usr/bin/python3
"""A Dask cluster of separate nodes on one machine: a scheduler, workers and
a client, each in a network namespace of its own, joined by a bridge over
links shaped with tc (tbf), as between the nodes of a real cluster.

Used by tests/plugins/python/test_netcluster.py (results on gser:// against
tcp://) and bench/python/bench_links.py (the cluster rows). Needs root, ip
and tc (iproute2): available() says why not.

    with NetCluster(workers=4, rate="1gbit") as net:
        sched = net.start("gser", env={...})        # scheduler + workers
        result = net.client(sched, "shuffle", rows=100_000)  # in the client's namespace

Topology: a hub namespace holds the bridge (nothing is made in the root
namespace, no host interface or address is touched); every node namespace
has one veth into it, addressed in 10.78.0.0/24 (scheduler .1, workers .11
and up, client .100). Each veth is shaped on both ends, so every node's link
runs at the rate in both directions, as a switch port would. Processes run
under `ip netns exec` with UCX_TLS=tcp (UCX would otherwise use shared
memory between the namespaces of one machine), workers without a nanny (a
worker that dies stays dead: the check sees it) but with the environment a
nanny gives its worker (nanny_environ), the client as a subprocess that
prints its result as JSON (python3 netcluster.py client ...).

Everything is removed on close(): processes (killed by their ids, with
their process groups), namespaces, the bridge with them. Namespaces left by
a run that was killed outright (their owner process is gone) are removed
when the next NetCluster starts, with the processes still inside them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
NS_PREFIX = "gser-nc-"
SUBNET = "10.78.0"  # bench_links.py's veth pair uses 10.77.0.x
DEV = "gnc"  # a node's end of its veth
BRIDGE = "gncbr"
#: tbf rates by name, and the payload bytes/s they stand for
RATES = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8, "10gbit": 10e9 / 8}


def available() -> str | None:
    """None where namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return f"no {tool} (iproute2)"
    name = f"{NS_PREFIX}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", name], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
    return None


def _sh(*cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r.stdout


def _kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_stale():
    """Remove the namespaces of runs whose process is gone, what still runs
    inside them, and their temporary folders."""
    for line in _sh("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NS_PREFIX):
            continue
        owner = name[len(NS_PREFIX):].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            pids = [int(p) for p in _sh("ip", "netns", "pids", name, check=False).split() if p.isdigit()]
            _kill_pids(pids)
            _sh("ip", "netns", "del", name, check=False)
    # and their folders (scheduler files, logs, workers' spill)
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if name.startswith(NS_PREFIX):
            owner = name[len(NS_PREFIX):].split("-")[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


def nanny_environ() -> dict:
    """The variables Dask's nanny sets in its worker's environment
    (distributed.nanny.pre-spawn-environ and .environ), as `dask worker` and
    LocalCluster run workers by default. Among them MALLOC_TRIM_THRESHOLD_,
    which also fixes glibc's thresholds: without it glibc raises them as
    large blocks are freed, and a worker whose received frames come from
    malloc (Dask's tcp://) then keeps its heap where one whose frames do not
    (gser://'s own mappings) faults its arrays in anew (BENCHMARKS.md,
    2026-12-06: zeroing pages took 12-15 % of the gser:// workers' CPU in
    the 100 Mbit/s shuffle, 0.2-9 % of tcp://'s). {} where this Python has
    no Dask."""
    try:
        import dask
        import distributed  # noqa: F401 (its defaults join dask.config)
    except ImportError:
        return {}
    out = {}
    for key in ("distributed.nanny.pre-spawn-environ", "distributed.nanny.environ"):
        out.update({str(k): str(v) for k, v in (dask.config.get(key, default=None) or {}).items()})
    return out


class Proc:
    """A process in a namespace; its output goes to a log file."""

    def __init__(self, name, argv, env, logdir):
        self.name = name
        self.log = os.path.join(logdir, f"{name}.log")
        with open(self.log, "wb") as f:
            self.p = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.p.poll() is None

    def tail(self, n=4000) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()


class Cluster:
    """One Dask cluster on the namespaces: a scheduler and its workers."""

    def __init__(self, protocol, scheduler_file, procs, env):
        self.protocol = protocol
        self.scheduler_file = scheduler_file
        self.procs = procs
        self.env = env

    def dead(self) -> list:
        """The names of this cluster's processes that have exited."""
        return [p.name for p in self.procs if not p.alive()]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (exit {p.p.poll()})\n{p.tail()}" for p in self.procs)


class NetCluster:
    """Namespaces for a scheduler, `workers` workers and a client, joined by a
    bridge; every link shaped to `rate` (a key of RATES, or None)."""

    def __init__(self, workers=4, rate=None):
        if rate is not None and rate not in RATES:
            raise ValueError(f"rate {rate!r}: one of {', '.join(RATES)} or None")
        remove_stale()
        tag = f"{NS_PREFIX}{os.getpid()}-{id(self) & 0xffff:x}"
        self.hub = f"{tag}-hub"
        self.nodes = {"sched": f"{SUBNET}.1", **{f"w{i}": f"{SUBNET}.{11 + i}" for i in range(workers)},
                      "client": f"{SUBNET}.100"}
        self.ns = {node: f"{tag}-{node}" for node in self.nodes}
        self.made = []
        self.clusters = []
        self.tmp = tempfile.mkdtemp(prefix=f"{NS_PREFIX}{os.getpid()}-")
        try:
            self._make(rate)
        except BaseException:
            self.close()
            raise

    # ---- namespaces ----

    def _make(self, rate):
        _sh("ip", "netns", "add", self.hub)
        self.made.append(self.hub)
        _sh("ip", "-n", self.hub, "link", "set", "lo", "up")
        _sh("ip", "-n", self.hub, "link", "add", BRIDGE, "type", "bridge")
        _sh("ip", "-n", self.hub, "link", "set", BRIDGE, "up")
        for i, (node, addr) in enumerate(self.nodes.items()):
            ns, port = self.ns[node], f"gncp{i}"
            _sh("ip", "netns", "add", ns)
            self.made.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "link", "add", DEV, "netns", ns, "type", "veth", "peer", "name", port, "netns", self.hub)
            _sh("ip", "-n", self.hub, "link", "set", port, "master", BRIDGE)
            _sh("ip", "-n", self.hub, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", DEV)
            _sh("ip", "-n", ns, "link", "set", DEV, "up")
        self.shape(rate)
        # UCX takes a device without carrier for absent: wait until every
        # link is up at both ends (the bridge runs no STP: its ports forward
        # once up)
        deadline = time.monotonic() + 10
        for ns, dev in self._ends():
            while "LOWER_UP" not in _sh("ip", "-n", ns, "link", "show", dev):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{dev} in {ns} is not up")
                time.sleep(0.05)

    def _ends(self):
        """Both ends of every link: (namespace, device)."""
        return [(self.ns[node], DEV) for node in self.nodes] + [(self.hub, f"gncp{i}") for i in range(len(self.nodes))]

    def shape(self, rate):
        """Shape every link (both ends of each veth) to rate, or unshape (None)."""
        self.rate = rate
        for ns, dev in self._ends():
            _sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            if rate:
                burst = max(int(RATES[rate] * 0.005), 64 << 10)  # 5 ms at the rate
                _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", str(burst),
                    "latency", "20ms")

    def tx_bytes(self) -> dict:
        """Bytes each node has sent on its link so far."""
        out = {}
        for node, ns in self.ns.items():
            link = json.loads(_sh("ip", "-j", "-s", "-n", ns, "link", "show", "dev", DEV))[0]
            out[node] = int(link["stats64"]["tx"]["bytes"])
        return out

    # ---- processes ----

    def env(self, extra=None) -> dict:
        """The environment of every process: this one's, UCX on tcp only, the
        helper importable (the workloads below run on the workers)."""
        env = dict(os.environ, UCX_TLS="tcp", PYTHONDONTWRITEBYTECODE="1")
        env.pop("UCX_NET_DEVICES", None)
        env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.update(extra or {})
        return env

    def start(self, protocol, env=None, preload=None, timeout=120) -> Cluster:
        """A scheduler and the workers on protocol ("gser", "tcp"), with
        `preload` (a module, e.g. gser.dask) in every process; returns once
        every worker is registered. Workers also get nanny_environ(), where
        env does not set the same names."""
        wenv = self.env({**nanny_environ(), **(env or {})})
        env = self.env(env)
        name = f"{protocol}{len(self.clusters)}"
        sfile = os.path.join(self.tmp, f"{name}.json")
        pre = ["--preload", preload] if preload else []
        procs = []
        cluster = Cluster(protocol, sfile, procs, env)
        self.clusters.append(cluster)
        procs.append(Proc(f"{name}-sched", self._exec("sched", [
            PY, "-m", "distributed.cli.dask_scheduler", "--protocol", protocol, "--host", self.nodes["sched"],
            "--port", "0", "--no-dashboard", "--no-show", "--scheduler-file", sfile] + pre), env, self.tmp))
        self._wait(lambda: os.path.exists(sfile), cluster, timeout, "the scheduler file")
        workers = [n for n in self.nodes if n.startswith("w")]
        for w in workers:
            wdir = os.path.join(self.tmp, f"{name}-{w}")
            os.makedirs(wdir, exist_ok=True)
            procs.append(Proc(f"{name}-{w}", self._exec(w, [
                PY, "-m", "distributed.cli.dask_worker", "--scheduler-file", sfile, "--protocol", protocol,
                "--host", self.nodes[w], "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name", w,
                "--memory-limit", "0", "--local-directory", wdir] + pre), wenv, self.tmp))
        registered = [p for p in procs if p.name.startswith(f"{name}-w")]
        self._wait(lambda: all("Registered to:" in p.tail(1 << 20) for p in registered), cluster, timeout,
                   f"{len(workers)} registered workers")
        return cluster

    def _exec(self, node, argv):
        return ["ip", "netns", "exec", self.ns[node]] + argv

    def _wait(self, cond, cluster, timeout, what):
        deadline = time.monotonic() + timeout
        while not cond():
            if cluster.dead() or time.monotonic() > deadline:
                raise RuntimeError(f"{cluster.protocol} cluster: no {what} after {timeout} s, "
                                   f"dead: {cluster.dead()}\n{cluster.logs()}")
            time.sleep(0.2)

    def client(self, cluster, workload, timeout=600, **kwargs) -> dict:
        """Run WORKLOADS[workload](client, **kwargs) in a client in the
        client's namespace; its result (a JSON-able dict)."""
        argv = self._exec("client", [PY, os.path.abspath(__file__), "client", cluster.scheduler_file,
                                     cluster.protocol, workload, json.dumps(kwargs)])
        r = subprocess.run(argv, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout, start_new_session=True)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode or not lines:
            raise RuntimeError(f"{workload} on {cluster.protocol}: exit {r.returncode}\n{r.stdout[-3000:]}"
                               f"\n{r.stderr[-6000:]}\n{cluster.logs()}")
        return json.loads(lines[-1])

    def close(self):
        for c in self.clusters:
            for p in c.procs:
                p.kill()
        self.clusters = []
        for ns in self.made:
            # anything still inside (a child that left its process group)
            _kill_pids(int(p) for p in _sh("ip", "netns", "pids", ns, check=False).split() if p.isdigit())
            _sh("ip", "netns", "del", ns, check=False)
        self.made = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- workloads: run in the client's namespace, their results printed as JSON ---------------

def _part(i, rows, seed):
    """Partition i of the shuffle's input: 8 columns, made on the worker."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed + i)
    base = i * rows
    cats = pd.Categorical.from_codes(rng.integers(0, 12, rows), [f"c{j}" for j in range(12)])
    return pd.DataFrame({
        "id": np.arange(base, base + rows, dtype="int64"),  # sorted keys
        "k": rng.integers(0, 1 << 20, rows),  # the shuffle's key
        "cat": cats,
        "price": np.repeat(rng.random(rows // 64 + 1).round(2), 64)[:rows],  # float64 with runs
        "qty": rng.integers(0, 100, rows).astype("int32"),
        "flag": rng.random(rows) < 0.1,
        "x": rng.random(rows),  # random float64
        "day": (base + np.arange(rows)) // 100_000,
    })


def _digest(df, npartitions):
    """One row per partition: rows, an order-free hash of its rows, and how
    many distinct keys it holds. Over a shuffle's output the keys add up to
    the input's distinct keys exactly when no key is split between two
    partitions, whichever partition Dask sends a key to (its own hashing,
    which dask-expr changed)."""
    import numpy as np
    import pandas as pd

    h = pd.util.hash_pandas_object(df, index=False).to_numpy()
    return pd.DataFrame({"rows": np.array([len(df)], "int64"), "hash": np.array([h.sum(dtype="uint64")], "uint64"),
                         "keys": np.array([df["k"].nunique()], "int64")})


def _shuffled(rows, npartitions, seed, method="tasks"):
    """The input (made on the workers) and its shuffle on column k."""
    import dask.dataframe as dd

    ddf = dd.from_map(_part, range(npartitions), rows=rows // npartitions, seed=seed, meta=_part(0, 0, seed),
                      enforce_metadata=False)
    return ddf, shuffle_by(ddf, "k", method, npartitions=npartitions)


def shuffle_by(ddf, on, method, **kwargs):
    """ddf's shuffle on column on by method ("tasks", "p2p"), by the keyword
    this Dask names (shuffle_method= in dask-expr, shuffle= in 2022.12).
    Looked up, not tried: dask-expr takes any unknown keyword into
    **options and would run its default, the P2P shuffle."""
    import inspect

    params = inspect.signature(ddf.shuffle).parameters
    key = next((k for k in ("shuffle_method", "method", "shuffle") if k in params), None)
    if key is None:
        raise TypeError(f"this Dask's shuffle names no method keyword: {list(params)}")
    return ddf.shuffle(on=on, **{key: method}, **kwargs)


def task_shuffle(ddf, on, **kwargs):
    """ddf's task shuffle on column on (shuffle_by)."""
    return shuffle_by(ddf, on, "tasks", **kwargs)


_DIGEST_META = {"rows": "i8", "hash": "u8", "keys": "i8"}


def _cpu_seconds(client) -> dict:
    """CPU seconds (user and system) each process of the cluster has used so
    far: "sched", "client", and each worker by address. On a machine of
    few cores a round can wait on them all rather than on the links: their
    sum over the cores is the least it can take (bench_links' cpu_floor)."""
    def used():
        t = os.times()
        return t.user + t.system

    out = {"sched": client.run_on_scheduler(used), "client": used()}
    out.update(client.run(used))
    return out


def workload_shuffle(client, rows=200_000, npartitions=8, seed=7, reps=1, warmup_rows=0, check_input=True,
                     method="tasks"):
    """A dask.dataframe shuffle on column k (method: shuffle_by's): per
    output partition its digest (the last run's), the input's digest
    (check_input), and the seconds of each of reps runs (after one untimed
    shuffle of warmup_rows)."""
    import pandas as pd

    if warmup_rows:
        client.compute(_shuffled(warmup_rows, npartitions, seed + 1, method)[1].map_partitions(len), sync=True)
    ddf, shuffled = _shuffled(rows, npartitions, seed, method)
    times = []
    cpu = []
    out = None
    for _ in range(reps):
        c0 = _cpu_seconds(client)
        t0 = time.perf_counter()
        out = client.compute(shuffled.map_partitions(_digest, npartitions, meta=_DIGEST_META), sync=True)
        times.append(time.perf_counter() - t0)
        c1 = _cpu_seconds(client)
        cpu.append({k: round(c1[k] - c0[k], 4) for k in c0 if k in c1})
    assert isinstance(out, pd.DataFrame) and out["hash"].dtype == "uint64", out.dtypes
    result = {"parts": [[int(r), int(h), int(t)] for r, h, t in out.itertuples(index=False)], "seconds": times,
              "cpu": cpu}
    if check_input:
        inp = client.compute(ddf.map_partitions(_digest, npartitions, meta=_DIGEST_META), sync=True)
        result.update(input_rows=int(inp["rows"].sum()), input_hash=int(inp["hash"].to_numpy().sum(dtype="uint64")),
                      input_keys=int(client.compute(ddf["k"].nunique(), sync=True)))
    return result


def shuffle_ok(result) -> bool:
    """Whether a shuffle's output holds exactly its input's rows, and every
    key in one partition only."""
    parts = result["parts"]
    return (sum(r for r, _, _ in parts) == result["input_rows"]
            and sum(h for _, h, _ in parts) % (1 << 64) == result["input_hash"]
            and sum(k for _, _, k in parts) == result["input_keys"])


def workload_xxt(client, n=2000, chunks=500, seed=42):
    """(x + x.T).sum() of a random n x n dask.array, and the same computed
    in this process with Dask's synchronous scheduler."""
    import dask.array as da

    x = da.random.RandomState(seed).random((n, n), chunks=chunks)
    y = (x + x.T).sum()
    got = client.compute(y, sync=True)
    return {"sum": float(got), "type": type(got).__name__, "local": float(y.compute(scheduler="sync"))}


def _columns(mib, seed):
    """mib MiB of a DataFrame's compressible columns (sorted ids, prices in
    runs, small counts), made where it runs."""
    import numpy as np
    import pandas as pd

    rows = (mib << 20) // 24
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": np.arange(rows, dtype="int64"),
                         "price": np.repeat(rng.random(rows // 64 + 1).round(2), 64)[:rows],
                         "qty": rng.integers(0, 100, rows).astype("int64")})


def workload_gather(client, mib=64, reps=3, seed=5):
    """A result of mib MiB of columns made on a worker, gathered by the
    client reps times (through the scheduler, as Dask's client gathers by
    default): the seconds of each gather, and whether each was the
    worker's frame."""
    import pandas as pd

    fut = client.submit(_columns, mib, seed, pure=False)
    want = _columns(mib, seed)
    times, equal = [], True
    for _ in range(reps):
        t0 = time.perf_counter()
        got = client.gather(fut)
        times.append(time.perf_counter() - t0)
        equal = equal and isinstance(got, pd.DataFrame) and got.equals(want)
    return {"seconds": times, "equal": equal}


def workload_facts(client):
    """How the cluster talked: the addresses, and on each worker the schemes
    of the peers it fetched data from, the bytes, gser's counters and the
    codecs its gser:// connections compress with, and its environment's
    values of nanny_environ()'s names."""

    def on_worker(dask_worker):
        import os
        import sys

        log = list(dask_worker.transfer_incoming_log)
        stats = sys.modules["gser.dask"].stats() if "gser.dask" in sys.modules else None
        comm = sys.modules.get("gser.comm")
        # what the open gser::ucx endpoints compress with (as negotiated)
        eps = [] if comm is None else [ep for w in list(comm._workers.values()) for ep in w.endpoints
                                       if ep.state == "ready"]
        codecs = None if comm is None else sorted({str(ep.compression) for ep in eps})
        # what each link-aware endpoint measured and last chose (gser.ucx.Endpoint.link_stats)
        links = None if comm is None else [s for s in (ep.link_stats for ep in eps) if s["link_aware"]]
        return {"peers": sorted({e["who"].split("://")[0] for e in log}),
                "fetched_bytes": int(sum(e["total"] for e in log)), "gser": stats, "codecs": codecs, "links": links,
                "environ": {k: os.environ.get(k) for k in nanny_environ()}}

    info = client.scheduler_info()
    return {"scheduler": client.scheduler.address, "workers": sorted(info["workers"]),
            "on_workers": client.run(on_worker)}


def workload_suite(client, xxt=None, shuffle=None):
    """xxt, shuffle and then facts in one client (one start-up)."""
    return {"xxt": workload_xxt(client, **(xxt or {})), "shuffle": workload_shuffle(client, **(shuffle or {})),
            "facts": workload_facts(client)}


WORKLOADS = {"suite": workload_suite, "shuffle": workload_shuffle, "xxt": workload_xxt, "facts": workload_facts,
             "gather": workload_gather}


def client_main(argv):
    """python3 netcluster.py client SCHEDULER_FILE PROTOCOL WORKLOAD JSON_KWARGS"""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    sfile, protocol, workload, kwargs = argv
    import distributed

    if protocol == "gser":
        import gser.dask  # noqa: F401  (gser:// in this process, and the family)

        gser.dask.register(default=True)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with distributed.Client(scheduler_file=sfile, timeout=30) as client:
        if not client.scheduler.address.startswith(protocol + "://"):
            raise SystemExit(f"the client reached {client.scheduler.address}, not {protocol}://")
        print(json.dumps(WORKLOADS[workload](client, **json.loads(kwargs))), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client_main(sys.argv[2:])
    else:
        sys.exit(f"usage: {sys.argv[0]} client SCHEDULER_FILE PROTOCOL WORKLOAD JSON_KWARGS")
