"""gser:// workers in a container's small /dev/shm (Docker's and Kubernetes'
default is 64 MiB): UCX's posix shared memory keeps each worker's FIFO and
receive buffers there, and a worker that finds it full goes without posix,
meeting its peers on the host on sysv shared memory (docs/ucx.md, section
7). Run as root, in a mount namespace of its own whose /dev/shm is a small
tmpfs; skipped (visibly) where that cannot be made."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import gser

pytestmark = pytest.mark.skipif(not gser.HAVE_UCX, reason="gser built without gser::ucx (libucx-dev)")

# Worker a gets posix (room for it), then /dev/shm is filled, then worker b
# has none left: b must start without posix, and the two must move large
# messages both ways (UCX's rendezvous, on sysv between them).
PEERS = textwrap.dedent("""
    import asyncio, os, sys
    import gser.ucx

    def fill():
        st = os.statvfs("/dev/shm")
        with open("/dev/shm/gser-test-fill", "wb") as f:
            f.write(b"x" * max(0, st.f_bavail * st.f_frsize - 4096))
        st = os.statvfs("/dev/shm")
        return st.f_bavail * st.f_frsize

    async def main():
        a = gser.ucx.Worker()
        accepted = asyncio.Queue()
        lst = a.listen(accepted.put_nowait, "127.0.0.1", 0)
        print("left", fill(), flush=True)
        b = gser.ucx.Worker()
        ep = await b.connect("127.0.0.1", lst.port, timeout=20)
        srv = await asyncio.wait_for(accepted.get(), 20)
        big = bytes(range(256)) * (16 << 12)  # 4 MiB
        for x, y in ((ep, srv), (srv, ep)):
            _, got = await asyncio.gather(x.send_frames([b"head", big]), y.recv_frames())
            assert bytes(got[0]) == b"head" and bytes(got[1]) == big
        print("ok", flush=True)
        ep.close(); srv.close(); lst.close(); a.close(); b.close()

    asyncio.run(asyncio.wait_for(main(), 60))
""")


def in_small_shm(size, script, env=None):
    cmd = (f"mount -t tmpfs -o size={size} gser-test /dev/shm && "
           f"exec {sys.executable} -c \"$GSER_TEST_SCRIPT\"")
    env = dict(os.environ if env is None else env, GSER_TEST_SCRIPT=script)
    return subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def small_shm():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1): a mount namespace with a small /dev/shm")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m gser-test /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")


def test_a_worker_without_room_in_dev_shm_goes_without_posix(small_shm):
    env = {k: v for k, v in os.environ.items() if k != "UCX_TLS"}
    out = in_small_shm("32m", PEERS, env)
    assert out.returncode == 0 and "ok" in out.stdout.split(), out.stdout + out.stderr
    left = int(out.stdout.split()[1])
    assert left < (1 << 20), f"{left} bytes of /dev/shm left: the second worker had room after all"


def test_transports_the_user_chose_are_not_changed(small_shm):
    # With UCX_TLS set, gser takes no transport away: the second worker fails
    # as UCX fails it, saying why.
    env = dict(os.environ, UCX_TLS="posix,tcp")
    out = in_small_shm("32m", PEERS, env)
    assert out.returncode != 0, out.stdout
    assert "ucp_worker_create" in out.stderr, out.stderr
