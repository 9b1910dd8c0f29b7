"""Gradient clipping: `clip_grad_norm_`, `clip_grad_value_`, `get_total_norm`, as PyTorch.

Written with graphc ops under no_grad (per-gradient norms, their norm, a clamped scale, an
in-place multiply), so a compiled training step that clips records the clipping as graph ops.
The scale is applied whether or not the norm exceeds `max_norm` (clamped to 1), as PyTorch
does, so no value is read and no branch depends on data.

`error_if_nonfinite=True` needs the norm's value: it is checked in eager mode; inside a trace
it raises a TraceError (a compiled step cannot raise on data).
"""

from __future__ import annotations

import math

from graphc.autograd.grad_mode import no_grad
from graphc.creation import tensor
from graphc.dispatch import current_tracer
from graphc.errors import ArgumentError, TraceError
from graphc.ops.movement import stack
from graphc.tensor import Tensor


def _grads(parameters) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def get_total_norm(tensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach=None) -> Tensor:
    """The norm of the norms of `tensors` (as if they were concatenated into one vector)."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    with no_grad():
        norms = [t.norm(norm_type) for t in tensors]
        total = stack(norms).norm(norm_type) if len(norms) > 1 else norms[0]
    if error_if_nonfinite:
        if current_tracer() is not None:
            raise TraceError("clip_grad_norm_(error_if_nonfinite=True) reads the norm's value, "
                             "which a compiled step does not have; leave it False in a "
                             "compiled function")
        value = total.item()
        if math.isnan(value) or math.isinf(value):
            raise ArgumentError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    return total


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None) -> Tensor:
    """Scale the gradients of `parameters` so their total norm is at most `max_norm`;
    returns the total norm before clipping."""
    grads = _grads(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if not grads:
        return total
    with no_grad():
        coef = (max_norm / (total + 1e-6)).clamp(None, 1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clamp every gradient of `parameters` to [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(-clip_value, clip_value)
