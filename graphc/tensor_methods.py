"""Tensor operators and methods, attached to `Tensor` from the op modules' tables.

Each op module exports `TENSOR_METHODS` (method name -> function whose first argument is the
tensor) and `PUBLIC` (names re-exported as `graphc.<name>`). This module attaches the methods,
adds Python's operators, and the dtype conversions. Nothing here computes: it forwards.
"""

from __future__ import annotations

import numpy as np

from graphc.ops import OP_MODULES
from graphc.ops.elementwise import cast
from graphc.ops.registry import call, inplace
from graphc.tensor import Tensor, check_device
from graphc.tensor import device as CpuDevice
from graphc.types import as_dtype, bool_, float32, float64, int64


def _operand(other):
    """A binary operator's other operand as something `call` takes, or None if it is foreign.

    Tensors and Python/numpy numbers pass; an ndarray becomes a tensor (as PyTorch does);
    anything else makes the operator return NotImplemented, so Python tries the reflected
    method and `tensor == None` is False rather than an error.
    """
    if isinstance(other, (Tensor, bool, int, float, np.number, np.bool_)):
        return other
    if isinstance(other, np.ndarray):
        return Tensor._wrap(np.array(other))
    return None


def _reflect(name: str):
    def method(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return call(name, other, self)

    method.__name__ = f"__r{name}__"
    return method


def _to(self, *args, **kwargs):
    """`to(dtype)`, `to("cpu")`, `to(device, dtype)`, `to(other_tensor)`; devices are no-ops.

    `copy=True` always returns a new tensor (with history), as PyTorch.
    """
    dtype = kwargs.get("dtype")
    device = kwargs.get("device")
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (str, CpuDevice)):
            device = a
        elif a is not None:
            dtype = a
    check_device("Tensor.to", device)
    if dtype is None or as_dtype(dtype) is self.dtype:
        return call("cast", self, dtype=self.dtype.name) if kwargs.get("copy") else self
    return cast(self, as_dtype(dtype))


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    from graphc.creation import tensor

    if isinstance(data, Tensor):
        data = data.detach()
    return tensor(data, dtype=dtype or self.dtype, device=device, requires_grad=requires_grad)


def _abs(self):
    return call("abs", self)


def _cuda(self, *args, **kwargs):
    raise ValueError("graphc eager tensors live on the CPU: there is no .cuda(); "
                     "use graphc.compile with the CUDA backend instead")


def _type_as(self, other):
    return cast(self, other.dtype)


def _float(self):
    return cast(self, float32)


def _double(self):
    return cast(self, float64)


def _long(self):
    return cast(self, int64)


def _bool(self):
    return cast(self, bool_)


def _cpu(self):
    return self


def _zero_(self):
    return inplace(self, "zero_", _zeros_of)


def _zeros_of(old):
    return call("full", shape=tuple(old.shape), value=0, dtype=old.dtype.name)


def _fill_(self, value):
    value = value.item() if isinstance(value, Tensor) else value

    def filled(old):
        return call("full", shape=tuple(old.shape), value=value, dtype=old.dtype.name)

    return inplace(self, "fill_", filled)


def _copy_(self, src):
    """Copy src (broadcast to self's shape, cast to self's dtype) into self."""
    if not isinstance(src, Tensor):
        src = Tensor._wrap(np.asarray(src))

    def copied(old):
        value = cast(src, old.dtype)
        if tuple(value.shape) != tuple(old.shape):
            value = call("broadcast_to", value, shape=tuple(old.shape))
        return value

    return inplace(self, "copy_", copied)


_OPERATORS = {
    "__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div",
    "__pow__": "pow", "__matmul__": "matmul", "__eq__": "eq", "__ne__": "ne", "__lt__": "lt",
    "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__and__": "logical_and",
    "__or__": "logical_or", "__xor__": "logical_xor", "__floordiv__": "floor_divide",
    "__mod__": "remainder",
}
_REFLECTED = {"add": "add", "sub": "sub", "mul": "mul", "div": "truediv", "pow": "pow",
              "matmul": "matmul", "floor_divide": "floordiv", "remainder": "mod"}


def _forward(name: str):
    def method(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return call(name, self, other)

    method.__name__ = name
    return method


def _neg(self):
    return call("neg", self)


def _invert(self):
    return call("logical_not", self)


def _pos(self):
    return self


def _inplace_operator(name: str):
    op = _OPERATORS[name]

    def method(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return inplace(self, op + "_", lambda old: call(op, old, other))

    return method


def attach() -> None:
    for module in OP_MODULES:
        for name, fn in getattr(module, "TENSOR_METHODS", {}).items():
            setattr(Tensor, name, fn)
    for dunder, op in _OPERATORS.items():
        setattr(Tensor, dunder, _forward(op))
    for op, dunder in _REFLECTED.items():
        setattr(Tensor, f"__r{dunder}__", _reflect(op))
    for dunder in ("__add__", "__sub__", "__mul__", "__truediv__", "__pow__", "__floordiv__",
                   "__mod__"):
        setattr(Tensor, dunder.replace("__", "__i", 1), _inplace_operator(dunder))
    Tensor.__neg__ = _neg
    Tensor.__invert__ = _invert
    Tensor.__pos__ = _pos
    Tensor.__abs__ = _abs
    Tensor.__hash__ = object.__hash__
    extras = {"to": _to, "type_as": _type_as, "float": _float, "double": _double,
              "long": _long, "int": _long, "bool": _bool, "cpu": _cpu, "cuda": _cuda,
              "zero_": _zero_, "fill_": _fill_, "copy_": _copy_, "new_tensor": _new_tensor}
    for name, fn in extras.items():
        setattr(Tensor, name, fn)

