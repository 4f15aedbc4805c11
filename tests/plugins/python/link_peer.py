"""A gser:// client for test_link_compression.py, run in a network namespace:

    link_peer.py ADDRESS COUNT MIB [PAUSE]

connects to an echo server (comm_peer.py serve), sends COUNT messages of MIB
MiB of compressible columns, each waited for and checked on its way back,
and prints one JSON line: for each message the codec it went with, the way
the comm sent it ("msg": one gser-encoded "dask.msg", as forced None sends;
"frames": Dask's frames, sent as they are; "prepared": Dask's frames
serialized with a codec off the loop, whole or in parts), how many calls
of each way, the endpoint's link_stats once it was written ("written") and
after its round trip, and the round trip's seconds; and the link_stats after the last. PAUSE:
after that many messages, print {"paused": PAUSE} and wait for a line on
stdin (the test shapes the link meanwhile). LINK_PEER_NO_OFFLOAD=1 in the
environment: the comm does not offload (allow_offload False, as the
scheduler's comms). LINK_PEER_PIECE_KIB=K: each message is the columns cut
in arrays of K KiB, one frame each (a shuffle's pieces), not one array."""

import asyncio
import json
import os
import sys
import time
import warnings

import numpy as np
from distributed.comm import connect
from distributed.protocol import to_serialize


def columns(mib):
    rows = (mib << 20) // 16
    rng = np.random.default_rng(3)
    keys = np.cumsum(rng.integers(0, 8, rows))  # sorted keys
    price = np.repeat(rng.random(rows // 64 + 1).round(2), 64)[:rows]  # runs of values
    return np.stack([keys.astype(np.float64), price], axis=1)


def watch(ep, paths):
    """Count in paths (a dict) the calls the comm makes of each of ep's
    sending ways."""
    def wrap(name, path):
        method = getattr(ep, name)

        def called(*args, **kw):
            paths[path] = paths.get(path, 0) + 1
            return method(*args, **kw)
        setattr(ep, name, called)

    wrap("_send_then", "msg")
    wrap("send_frames_nowait", "frames")
    wrap("prepare_frames", "prepared")


async def main(address, count, mib, pause):
    import gser.dask  # noqa: F401  (gser://)

    comm = await connect(address, timeout=20)
    if os.environ.get("LINK_PEER_NO_OFFLOAD"):
        comm.allow_offload = False  # as the scheduler's comms are
    data = columns(mib)
    piece = int(os.environ.get("LINK_PEER_PIECE_KIB", 0)) << 10
    if piece:
        flat = data.reshape(-1)
        data = [flat[i:i + piece // 8].copy() for i in range(0, len(flat), piece // 8)]
    paths = {}
    watch(comm._ep, paths)
    messages = []
    for i in range(count):
        if i == pause:
            print(json.dumps({"paused": pause}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        paths.clear()
        t0 = time.perf_counter()
        await comm.write({"data": [to_serialize(a) for a in data] if piece else to_serialize(data)})
        sent, calls, written = sorted(paths), dict(paths), comm._ep.link_stats
        back = await comm.read()
        seconds = time.perf_counter() - t0
        if piece:
            assert len(back["data"]) == len(data) and all(map(np.array_equal, back["data"], data))
        else:
            assert np.array_equal(back["data"], data)
        stats = comm._ep.link_stats
        messages.append({"codec": stats["codec"], "paths": sent, "calls": calls, "stats": stats, "written": written,
                         "seconds": seconds})
    print(json.dumps({"codecs": [m["codec"] for m in messages], "messages": messages, "stats": comm._ep.link_stats}),
          flush=True)
    await comm.close()


if __name__ == "__main__":
    warnings.simplefilter("ignore", DeprecationWarning)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else -1))
