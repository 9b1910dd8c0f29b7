"""`Parameter` and `Buffer`: tensors that a Module registers when they are assigned to it.

A `Parameter` is a leaf `Tensor` subclass that shares memory (and the version counter) with the
tensor it was made from, as `torch.nn.Parameter` does, and requires grad by default. Results of
ops on a Parameter are plain Tensors (the dispatch point wraps with `Tensor._wrap`), so only
the objects a Module owns are Parameters. A `Buffer` marks a tensor as module state that is not
a parameter (BatchNorm's running statistics); assigning one registers it as a buffer.

>>> import graphc
>>> import graphc.nn as nn
>>> w = nn.Parameter(graphc.zeros(2))
>>> w
Parameter containing:
tensor([0., 0.], requires_grad=True)
"""

from __future__ import annotations

import numpy as np

from graphc.tensor import Tensor


def _source_array(data) -> Tensor:
    if data is None:
        return Tensor._wrap(np.empty((0,), dtype=np.float32))
    if not isinstance(data, Tensor):
        raise TypeError(
            f"Parameter/Buffer data must be a graphc.Tensor, got {type(data).__name__} "
            "(make one with graphc.tensor(...))"
        )
    return data


def _share(cls, data: Tensor, requires_grad: bool) -> Tensor:
    """A new `cls` instance over `data`'s memory and version counter, with no history."""
    t = object.__new__(cls)
    t._init(data._data, False)
    t._version_counter = data._version_counter
    t._base = data._base
    t.requires_grad = requires_grad
    return t


class Parameter(Tensor):
    """A tensor that is a module parameter: assigning it to a Module attribute registers it.

    `Parameter(data, requires_grad=True)` shares `data`'s memory and is always a leaf.
    """

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        return _share(cls, _source_array(data), requires_grad)

    def __init__(self, *args, **kwargs) -> None:  # Tensor.__init__ refuses on purpose
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = type(self)(Tensor._wrap(self._data.copy()), self.requires_grad)
        if self.grad is not None:
            result.grad = Tensor._wrap(self.grad._data.copy())
        memo[id(self)] = result
        return result

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (self._data, self.requires_grad))


def _rebuild_parameter(array, requires_grad):
    return Parameter(Tensor._wrap(np.array(array)), requires_grad)


class Buffer(Tensor):
    """A tensor that is module state but not a parameter (e.g. running statistics).

    `Buffer(data, persistent=True)`: assigning it to a Module attribute registers a buffer;
    a non-persistent one is left out of `state_dict()`.
    """

    def __new__(cls, data: Tensor | None = None, *, persistent: bool = True):
        data = _source_array(data)
        t = _share(cls, data, data.requires_grad)
        t.persistent = persistent
        return t

    def __init__(self, *args, **kwargs) -> None:
        pass


def typename(obj) -> str:
    """PyTorch's `torch.typename`: 'graphc.FloatTensor' for tensors, 'module.Class' otherwise."""
    if isinstance(obj, Tensor):
        return obj.type_name()
    module = getattr(obj, "__module__", "") or ""
    if hasattr(obj, "__qualname__"):
        qualname = obj.__qualname__
    elif hasattr(obj, "__name__"):
        qualname = obj.__name__
    else:
        module = type(obj).__module__ or ""
        qualname = type(obj).__qualname__
    if module in ("", "builtins"):
        return qualname
    return f"{module}.{qualname}"
