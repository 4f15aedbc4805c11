"""numba.core.serialize: the mixin numba's picklable objects (dispatchers,
types) derive from; nothing here derives from it."""


class ReduceMixin:
    def _reduce_states(self):
        raise NotImplementedError

    def __reduce__(self):
        return type(self)._rebuild, (self._reduce_states(),)
