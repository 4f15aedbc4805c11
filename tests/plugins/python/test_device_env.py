"""GSER_DEVICE with a value that names no backend: `import gser` still works
(a Dask preload must not stop the worker), host data works, and the first
use of device memory raises GserError(GSER_ERR_NO_DEVICE) whose message names
the variable, its value and the values it takes."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("numpy")


def run_with(device, code):
    env = dict(os.environ, GSER_DEVICE=device)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


CODE = """
import gser, numpy as np
print(gser.DEVICE_BACKEND)
h, f = gser.dumps({"op": "compute", "data": [1.5] * 100})
print(gser.loads(h, f)["op"])
a = np.arange(100.0)
class Dev:
    __cuda_array_interface__ = {"shape": (100,), "typestr": "<f8", "data": (a.ctypes.data, False), "version": 3}
try:
    gser.dumps(Dev())
    print("no error")
except gser.GserError as e:
    print(e.status_name)
    print(e.detail)
"""


def test_unknown_gser_device_imports_and_fails_only_on_device_memory():
    r = run_with("cdua", CODE)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ["none", "compute", "GSER_ERR_NO_DEVICE"], r.stdout
    detail = lines[3]
    for part in ("GSER_DEVICE", '"cdua"', "cuda, emulated, none, auto"):
        assert part in detail, detail


def test_known_names_are_unchanged():
    r = run_with("none", CODE)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:3] == ["none", "compute", "GSER_ERR_NO_DEVICE"], r.stdout
    assert "GSER_DEVICE is" not in lines[3], lines[3]
