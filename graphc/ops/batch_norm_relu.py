"""batch_norm_relu: batch norm, an optional residual add and a ReLU as one op, with the ReLU's
mask; made only by the cpu pipeline's `fuse_batch_norm_relu` pass (graphc/passes/
batch_norm_relu.py), never called by users.

    batch_norm_relu[training, eps](input, weight, bias, running_mean, running_var, *residual)
        -> (out, positive, save_mean, save_invstd)

with y = batch_norm(input, ...)'s first output (rounded to the input's dtype), z = y, or
y + residual (one residual of input's type, added in that dtype); `out = relu(z)`, `positive =
out > 0` (bool: what the ReLU's backward reads), and save_mean, save_invstd batch_norm's. The
reference kernel runs the registry's own kernels in that order (batch_norm, add, relu, gt), so
the op means exactly the nodes it replaces and the interpreter needs nothing special. It has no
VJP: the pass runs after the backward graph is derived.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import ShapeError
from graphc.ops.registry import NORM, REGISTRY, OpDef, register
from graphc.types import TensorType, bool_

__all__: list[str] = []
PUBLIC: tuple[str, ...] = ()  # made by graphc.passes.batch_norm_relu, never called by users


def _infer(x: TensorType, weight: TensorType, bias: TensorType, running_mean: TensorType,
           running_var: TensorType, *residual: TensorType, training: bool, eps: float):
    out, mean, invstd = REGISTRY["batch_norm"].infer(x, weight, bias, running_mean, running_var,
                                                     training=training, eps=eps)
    if len(residual) > 1 or any(r != x for r in residual):
        got = ", ".join(str(r) for r in residual)
        raise ShapeError(f"batch_norm_relu: expected at most one residual of the input's type "
                         f"{x}, got ({got}); the residual is added to the normalised input "
                         "before the ReLU, so it must match it exactly")
    return out, TensorType(x.shape, bool_), mean, invstd


def _kernel(x, weight, bias, running_mean, running_var, *residual, training: bool, eps: float):
    y, mean, invstd = REGISTRY["batch_norm"].kernel(x, weight, bias, running_mean, running_var,
                                                    training=training, eps=eps)
    if residual:
        y = REGISTRY["add"].kernel(y, residual[0])
    out = REGISTRY["relu"].kernel(y)
    positive = REGISTRY["gt"].kernel(out, np.zeros((), out.dtype))
    return out, positive, mean, invstd


register(OpDef("batch_norm_relu", NORM,
               ("input", "weight", "bias", "running_mean", "running_var", "*residual"),
               _infer, _kernel, attrs={"training": bool, "eps": float},
               doc="relu(batch_norm(x) [+ residual]) and its mask, one op (cpu pipeline only)"))
