"""A gser:// client for test_link_compression.py, run in a network namespace:

    link_peer.py ADDRESS COUNT MIB

connects to an echo server (comm_peer.py serve), sends COUNT messages of MIB
MiB of compressible columns, each waited for and checked on its way back,
and prints one JSON line: the codec each message went with and the
endpoint's link_stats after the last."""

import asyncio
import json
import sys
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


async def main(address, count, mib):
    import gser.dask  # noqa: F401  (gser://)

    comm = await connect(address, timeout=20)
    data = columns(mib)
    codecs = []
    for _ in range(count):
        await comm.write({"data": to_serialize(data)})
        back = await comm.read()
        assert np.array_equal(back["data"], data)
        codecs.append(comm._ep.link_stats["codec"])
    print(json.dumps({"codecs": codecs, "stats": comm._ep.link_stats}), flush=True)
    await comm.close()


if __name__ == "__main__":
    warnings.simplefilter("ignore", DeprecationWarning)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
