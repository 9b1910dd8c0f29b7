"""Source ops: tensors made from attributes alone (full, arange), plus the creation API.

Random sources (rand, randn) live in graphc.ops.random with the counter-based generator.
`graphc.tensor` and `graphc.from_numpy` wrap user data: they are not ops (a trace treats such
tensors as constants or inputs).
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ArgumentError, where
from graphc.ops.registry import SOURCE, OpDef, call, register
from graphc.ops.shapes import size_arg
from graphc.symbolic import Sym
from graphc.types import TensorType, as_dtype, float32, int64


def check_device(function: str, device) -> None:
    """The front end's device check (graphc.tensor.check_device), imported when called: the
    ops package never imports graphc.tensor at module level."""
    from graphc.tensor import check_device as front_end_check

    front_end_check(function, device)


def _full_infer(shape: tuple, value: float, dtype: str) -> TensorType:
    return TensorType(shape, as_dtype(dtype))


def _full_kernel(shape: tuple, value: float, dtype: str):
    return np.full(shape, value, dtype=as_dtype(dtype).np)


register(OpDef("full", SOURCE, (), _full_infer, _full_kernel, None,
               attrs={"shape": tuple, "value": float, "dtype": str}))


def _arange_infer(start: float, end: float, step: float, dtype: str) -> TensorType:
    if type(end) is Sym or type(start) is Sym:  # arange(t) over a symbolic length t
        if step == 1 and float(start if type(start) is not Sym else 0) % 1 == 0:
            return TensorType((max_size(end - _int(start)),), as_dtype(dtype))
        start, end = float(start), float(end)  # another step: specialised (graphc.symbolic)
    if step == 0:
        raise ArgumentError(f"{where('arange')}: step must be nonzero")
    if (end - start) * step < 0:
        raise ArgumentError(
            f"{where('arange')}: upper bound and larger bound inconsistent with step sign"
        )
    n = max(0, int(np.ceil((end - start) / step)))
    return TensorType((n,), as_dtype(dtype))


def _int(x):
    return x if type(x) is Sym else int(x)


def max_size(n):
    """max(0, n) for a size that may be symbolic (a symbolic one is a size: >= 2 already)."""
    return n if type(n) is Sym else max(0, n)


def _arange_kernel(start: float, end: float, step: float, dtype: str):
    return np.arange(start, end, step).astype(as_dtype(dtype).np)


register(OpDef("arange", SOURCE, (), _arange_infer, _arange_kernel, None,
               attrs={"start": float, "end": float, "step": float, "dtype": str}))


def _make(op_value, shape, dtype, requires_grad):
    dt = float32 if dtype is None else as_dtype(dtype)
    t = call("full", shape=size_arg("full", shape), value=op_value, dtype=dt.name)
    if requires_grad:
        t.requires_grad_(True)
    return t


def full(size, fill_value, *, dtype=None, requires_grad=False, device=None):
    """A tensor of `size` filled with `fill_value` (PyTorch's torch.full)."""
    check_device("graphc.full", device)
    if dtype is None:
        dtype = (int64 if isinstance(fill_value, int) and not isinstance(fill_value, bool)
                 else "bool" if isinstance(fill_value, bool) else float32)
    return _make(fill_value, tuple(size), dtype, requires_grad)


def zeros(*size, dtype=None, requires_grad=False, device=None):
    """A tensor of zeros of the given size (float32 unless `dtype` says otherwise)."""
    check_device("graphc.zeros", device)
    return _make(0, size, dtype, requires_grad)


def ones(*size, dtype=None, requires_grad=False, device=None):
    """A tensor of ones of the given size (float32 unless `dtype` says otherwise)."""
    check_device("graphc.ones", device)
    return _make(1, size, dtype, requires_grad)


def zeros_like(t, *, dtype=None, requires_grad=False, device=None):
    """Zeros with the shape (and, unless given, the dtype) of `x`."""
    check_device("graphc.zeros_like", device)
    return _make(0, tuple(t.shape), dtype or t.dtype, requires_grad)


def ones_like(t, *, dtype=None, requires_grad=False, device=None):
    """Ones with the shape (and, unless given, the dtype) of `x`."""
    check_device("graphc.ones_like", device)
    return _make(1, tuple(t.shape), dtype or t.dtype, requires_grad)


def full_like(t, fill_value, *, dtype=None, requires_grad=False, device=None):
    """`fill_value` with the shape (and, unless given, the dtype) of `x`."""
    check_device("graphc.full_like", device)
    return _make(fill_value, tuple(t.shape), dtype or t.dtype, requires_grad)


def empty(*size, dtype=None, requires_grad=False, device=None):
    """Zero-filled (graphc never hands out uninitialised memory)."""
    check_device("graphc.empty", device)
    return zeros(*size, dtype=dtype, requires_grad=requires_grad)


def arange(start, end=None, step=1, *, dtype=None, requires_grad=False, device=None):
    """Values from `start` to `end` (exclusive) in steps of `step`, as torch.arange."""
    check_device("graphc.arange", device)
    if end is None:
        start, end = 0, start
    if dtype is None:
        is_int = all(isinstance(v, (int, Sym)) for v in (start, end, step))
        dtype = int64 if is_int else float32
    t = call("arange", start=_float(start), end=_float(end), step=float(step),
             dtype=as_dtype(dtype).name)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _float(x):
    """An arange bound as its float attribute; a symbolic size stays symbolic."""
    return x if type(x) is Sym else float(x)


def _new_zeros(self, *size, dtype=None, requires_grad=False, device=None):
    """Zeros of `size` with this tensor's dtype unless `dtype` is given."""
    check_device("Tensor.new_zeros", device)
    return zeros(*size, dtype=dtype or self.dtype, requires_grad=requires_grad)


def _new_ones(self, *size, dtype=None, requires_grad=False, device=None):
    """Ones of `size` with this tensor's dtype unless `dtype` is given."""
    check_device("Tensor.new_ones", device)
    return ones(*size, dtype=dtype or self.dtype, requires_grad=requires_grad)


def _new_full(self, size, fill_value, *, dtype=None, requires_grad=False, device=None):
    """`fill_value` over `size` with this tensor's dtype unless `dtype` is given."""
    check_device("Tensor.new_full", device)
    return _make(fill_value, tuple(size), dtype or self.dtype, requires_grad)


TENSOR_METHODS = {"new_zeros": _new_zeros, "new_ones": _new_ones, "new_full": _new_full}

PUBLIC = ("full", "zeros", "ones", "zeros_like", "ones_like", "full_like", "empty", "arange")
