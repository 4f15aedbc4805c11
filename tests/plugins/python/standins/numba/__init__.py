"""A stand-in for Numba's CUDA device arrays (numba.cuda): pure Python,
device memory is the emulated backend's host memory."""

__version__ = "0.0-standin"
