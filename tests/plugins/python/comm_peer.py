"""A second process for the gser comm tests (test_comm.py): a peer on the
other side of a gser:// connection, run as `python3 comm_peer.py ROLE ...`.

    serve HOST             listen on gser://HOST:0, print the contact address,
                           echo every message back, one comm after another
    flood ADDRESS MIB      connect, then write MIB-MiB arrays until killed
    hold ADDRESS           connect, print "connected", sleep until killed
    client ADDRESS MIB     connect, ping-pong small messages and one MIB-MiB
                           array, print "ok <seconds>"
    partition ADDRESS      connect, one round trip, print "ready", then read:
                           print "closed <seconds>" when the comm fails
    codec ADDRESS          connect, send 8 MiB of compressible columns there
                           and back, print "codec <what the endpoint
                           compresses with>" once they came back equal

serve prints "closed" for every comm that failed.
"""

import asyncio
import sys
import time
import warnings

import numpy as np
from distributed.comm import connect, listen
from distributed.comm.core import CommClosedError
from distributed.protocol import to_serialize


async def echo(comm, report=False):
    """Send back every message (read with deserialize=False: as it came).
    report: print "closed" when the comm fails."""
    try:
        while True:
            await comm.write(await comm.read())
    except CommClosedError:
        if report:
            print("closed", flush=True)
    finally:
        await comm.close()


async def serve(host):
    listener = await listen(f"gser://{host}:0", lambda comm: echo(comm, report=True), deserialize=False)
    print(listener.contact_address, flush=True)
    await asyncio.Event().wait()


async def flood(address, mib):
    comm = await connect(address)
    data = np.ones(mib << 17)
    print("connected", flush=True)
    while True:
        await comm.write({"data": to_serialize(data)})


async def hold(address):
    await connect(address)
    print("connected", flush=True)
    await asyncio.Event().wait()


async def client(address, mib):
    comm = await connect(address, timeout=20)
    start = time.perf_counter()
    for i in range(100):
        await comm.write({"op": "ping", "i": i})
        assert await comm.read() == {"op": "ping", "i": i}
    data = np.arange(mib << 17, dtype=np.float64)
    await comm.write({"data": to_serialize(data)})
    back = await comm.read()
    assert np.array_equal(back["data"], data)
    await comm.close()
    print("ok", round(time.perf_counter() - start, 3), flush=True)


async def partition(address):
    comm = await connect(address, timeout=20)
    await comm.write("ping")
    assert await comm.read() == "ping"
    print("ready", flush=True)
    start = time.monotonic()
    try:
        await comm.read()
        print("message", flush=True)
    except CommClosedError:
        print("closed", round(time.monotonic() - start, 3), flush=True)


async def codec(address):
    comm = await connect(address, timeout=20)
    data = np.repeat(np.arange(1 << 17, dtype=np.int64), 8)
    await comm.write({"data": to_serialize(data)})
    back = await comm.read()
    assert np.array_equal(back["data"], data)
    print("codec", comm._ep.compression, flush=True)
    await comm.close()


def main(argv):
    warnings.simplefilter("ignore", DeprecationWarning)  # tornado 6.2 inside distributed
    role = argv[1]
    if role == "serve":
        coro = serve(argv[2])
    elif role == "flood":
        coro = flood(argv[2], int(argv[3]))
    elif role == "hold":
        coro = hold(argv[2])
    elif role == "client":
        coro = client(argv[2], int(argv[3]))
    elif role == "partition":
        coro = partition(argv[2])
    elif role == "codec":
        coro = codec(argv[2])
    else:
        raise SystemExit(f"unknown role {role!r}")
    asyncio.run(coro)


if __name__ == "__main__":
    main(sys.argv)
