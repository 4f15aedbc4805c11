"""gser:// between two processes of one host whose shared-memory FIFO sizes
differ (docs/ucx.md, sections 2.4 and 7): UCX's sender indexes its peer's
FIFO by its own size, so such a pair would fail large messages or hang.
The handshake refuses it instead: the connecting side gets Dask's
FatalCommClosedError (a CommClosedError) naming both sizes and the variable
to set, at once, and the listening side goes on serving peers of its size.
Each side is a process of its own, started with its environment."""

import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "comm_peer.py")

# Connect to ADDRESS and print what happened as one JSON line.
CLIENT = r"""
import asyncio, json, sys, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from distributed.comm import connect
from distributed.comm.core import CommClosedError, FatalCommClosedError
import gser.ucx

async def main(address):
    start = time.monotonic()
    try:
        comm = await connect(address, timeout=30)
    except CommClosedError as e:
        cause = e.__cause__
        print(json.dumps({"error": type(e).__name__, "fatal": isinstance(e, FatalCommClosedError),
                          "message": str(e), "seconds": time.monotonic() - start,
                          "cause": type(cause).__name__ if cause is not None else None,
                          "status": getattr(cause, "status_name", None)}), flush=True)
        return
    await comm.write("ping")
    reply = await comm.read()
    await comm.close()
    print(json.dumps({"error": None, "reply": reply}), flush=True)

asyncio.run(main(sys.argv[1]))
"""


def env_with(fifo):
    """This process's environment with the FIFO size fifo (None: gser's default)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("UCX_MM_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE", "UCX_SYSV_FIFO_SIZE")}
    env.pop("UCX_TLS", None)  # shared memory between the two, as Dask's default
    if fifo is not None:
        env["UCX_MM_FIFO_SIZE"] = str(fifo)
    return env


def connect_from(address, fifo):
    out = subprocess.run([sys.executable, "-c", CLIENT, address], env=env_with(fifo), capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("server_fifo,client_fifo,server_says,client_says",
                         [(None, 64, 1024, 64), (64, None, 64, 1024)])
def test_different_fifo_sizes_are_refused_with_both_sizes(server_fifo, client_fifo, server_says, client_says):
    server = subprocess.Popen([sys.executable, PEER, "serve", "127.0.0.1"], env=env_with(server_fifo),
                              stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().strip()
        assert address.startswith("gser://"), address
        got = connect_from(address, client_fifo)
        assert got["error"] == "FatalCommClosedError", got
        assert got["fatal"] and got["status"] == "GSER_ERR_WIRE_VERSION", got
        msg = got["message"]
        assert f"shared-memory FIFO holds {server_says} segments, this side's {client_says}" in msg, msg
        assert "set UCX_MM_FIFO_SIZE alike in every process of a host" in msg, msg
        assert got["seconds"] < 20, got  # refused in the handshake, not after Dask's retries
        # The server goes on: a peer of its own size connects and is answered.
        again = connect_from(address, server_fifo)
        assert again == {"error": None, "reply": "ping"}, again
        assert server.poll() is None
    finally:
        server.kill()
        server.wait(30)
        server.stdout.close()


def test_equal_sizes_set_by_the_environment_connect():
    server = subprocess.Popen([sys.executable, PEER, "serve", "127.0.0.1"], env=env_with(64),
                              stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().strip()
        start = time.monotonic()
        got = connect_from(address, 64)
        assert got == {"error": None, "reply": "ping"}, got
        assert time.monotonic() - start < 60
    finally:
        server.kill()
        server.wait(30)
        server.stdout.close()
