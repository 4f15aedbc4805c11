"""gser:// under Dask over UCX's tcp transport: a worker stopped (SIGSTOP) in
the middle of a transfer, longer than distributed.comm.gser.peer-timeout,
then continued (issue 38: the sending worker used to die of SIGSEGV now and
then, in UCX's tcp transport, docs/ucx.md "Closing over tcp"). No process
dies, and the result is right.

A scheduler and two workers (no nanny) are processes of their own on
127.0.0.1; the workers fail a silent peer after 2 s, the scheduler after
60 s (so that it keeps the stopped worker)."""

import os
import signal
import subprocess
import sys
import time

import pytest

import gser

pytestmark = pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)")
distributed = pytest.importorskip("distributed")
np = pytest.importorskip("numpy")

ROUNDS = int(os.environ.get("GSER_TEST_DASK_MIDCLOSE_ROUNDS", "3"))
PARTS, PART_MIB = 8, 32


def _start(argv, env, log):
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_a_worker_stopped_mid_transfer_past_the_peer_timeout(tmp_path):
    dask_cli = [sys.executable, "-m", "dask"]  # this interpreter's Dask (a venv's or Debian's), not PATH's
    base = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo", DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="20s",
                DASK_DISTRIBUTED__COMM__GSER__TRANSPORTS="tcp")
    sched_file = tmp_path / "scheduler.json"
    procs = {}
    logs = {}

    def start(name, argv, peer_timeout):
        logs[name] = open(tmp_path / f"{name}.log", "w+")
        procs[name] = _start(argv, dict(base, DASK_DISTRIBUTED__COMM__GSER__PEER_TIMEOUT=peer_timeout), logs[name])

    def tails():
        out = []
        for name, f in logs.items():
            f.flush()
            f.seek(0)
            out.append(f"--- {name} (exit {procs[name].poll()}):\n{f.read()[-3000:]}")
        return "\n".join(out)

    try:
        start("scheduler", [*dask_cli, "scheduler", "--protocol", "gser", "--host", "127.0.0.1", "--port", "0",
                            "--no-dashboard", "--scheduler-file", str(sched_file)], "60s")
        deadline = time.monotonic() + 60
        while not sched_file.exists() or not sched_file.read_text().strip():
            assert procs["scheduler"].poll() is None, tails()
            assert time.monotonic() < deadline, "the scheduler did not start\n" + tails()
            time.sleep(0.1)
        import json

        address = json.loads(sched_file.read_text())["address"]
        for name in ("a", "b"):
            start(name, [*dask_cli, "worker", address, "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1",
                         "--no-nanny", "--name", name, "--memory-limit", "0"], "2s")
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            info = client.scheduler_info()["workers"]
            by_name = {w["name"]: addr for addr, w in info.items()}
            a, b, b_pid = by_name["a"], by_name["b"], procs["b"].pid  # (no nanny: the worker is that process)
            for r in range(ROUNDS):
                parts = [client.submit(np.full, PART_MIB << 17, float(r * PARTS + i), workers=[a], pure=False)
                         for i in range(PARTS)]
                distributed.wait(parts, timeout=120)
                # B fetches them all from A; it stops halfway, past the peer timeout.
                total = client.submit(lambda *xs: float(sum(x.sum() for x in xs)), *parts, workers=[b],
                                      pure=False)
                time.sleep(0.25 + 0.1 * r)
                os.kill(b_pid, signal.SIGSTOP)
                time.sleep(5)
                os.kill(b_pid, signal.SIGCONT)
                want = float(sum((r * PARTS + i) * (PART_MIB << 17) for i in range(PARTS)))
                assert total.result(timeout=120) == want, tails()
                for name, p in procs.items():
                    assert p.poll() is None, f"round {r}: {name} died\n" + tails()
                del parts, total
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        for f in logs.values():
            f.close()
    sys.stdout.write("")
