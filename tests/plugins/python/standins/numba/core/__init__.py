"""numba.core as far as Dask reaches into it (dask/tokenize.py registers a
normalizer for numba.core.serialize.ReduceMixin when numba is imported)."""

from . import serialize  # noqa: F401  (numba's own __init__ imports its core)
