"""Two network namespaces joined by a veth pair, standing for two nodes in
the tests (loopback-free, never the host's own interfaces)."""

import contextlib
import os
import shutil
import subprocess

import pytest


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@contextlib.contextmanager
def veth_namespaces(ns, veth, addr):
    """Make namespaces ns[0], ns[1] joined by the veth pair veth[0] (in
    ns[0], address addr[0]/24) and veth[1] (in ns[1], addr[1]/24), up with
    their loopbacks; remove them (and so the pair) on exit. Skips the test,
    with the reason, where they cannot be made (not root, no ip)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2's ip")
    for n in ns:
        ip("netns", "del", n, check=False)  # left by a killed run
    try:
        for n in ns:
            ip("netns", "add", n)
        ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for n, v, a in zip(ns, veth, addr):
            ip("link", "set", v, "netns", n)
            ip("-n", n, "addr", "add", f"{a}/24", "dev", v)
            ip("-n", n, "link", "set", v, "up")
            ip("-n", n, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as e:
        for n in ns:
            ip("netns", "del", n, check=False)
        pytest.skip(f"cannot set up network namespaces here: {getattr(e, 'stderr', e)}")
    try:
        yield
    finally:
        for n in ns:
            ip("netns", "del", n, check=False)  # takes the veth pair with it
