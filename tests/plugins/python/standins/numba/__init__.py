"""A stand-in for Numba's CUDA device arrays (numba.cuda): pure Python,
device memory is the emulated backend's host memory."""

__version__ = "0.64.0+standin"  # PEP 440, as the real one's

from . import core  # noqa: E402,F401  (numba imports its core: Dask reaches numba.core.serialize)
