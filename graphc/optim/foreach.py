"""Eager multi-tensor updates: SGD and Adam over a group's parameters in numpy, in place.

PyTorch's optimizers default to `foreach` implementations outside compilation: one kernel per
formula step over all parameters instead of one small op per parameter and step. graphc's
equivalent, in eager mode only: each update line of `SGD` / `Adam` becomes one numpy ufunc
call per parameter writing into the parameter, the state or a scratch buffer (`out=`), with no
tensor made, no dispatch, no temporary allocated per step. Inside a trace, under abstract
evaluation, with a tensor hyperparameter (a scheduled lr, a runtime input) or with
`foreach=False`, the optimizers run their op-by-op update instead, which a trace records.

Invariant: the two updates agree bit for bit. Each function below performs the op path's
floating-point operations in the op path's order, on the same dtypes (a Python number meets
an array as graphc types it: weakly, in the array's dtype, as numpy's NEP 50 does), and bumps
each written tensor's version counter as often as the op path's in-place calls do. Anything
the op path would refuse (a read-only parameter, state aliasing a gradient) is left to it:
`eager_arrays` answers None and the caller runs the op path.
"""

from __future__ import annotations

import weakref

import numpy as np

from graphc.dispatch import current_tracer, is_abstract
from graphc.tensor import Tensor

_PYTHON_NUMBERS = (bool, int, float)


def usable(group: dict, *hyperparameters) -> bool:
    """Whether the group may take the numpy update: foreach not switched off, eager mode,
    every hyperparameter a Python number (a tensor is a runtime input of a compiled step; a
    numpy scalar would make numpy compute in its dtype, where graphc casts it to the
    parameter's)."""
    if group.get("foreach") is False or current_tracer() is not None or is_abstract():
        return False
    return all(type(h) in _PYTHON_NUMBERS for h in hyperparameters)


def eager_arrays(tensors: list) -> list | None:
    """The current numpy arrays of `tensors` (fetched from a device where one holds a newer
    value), or None if one is abstract, not writeable, or shares memory with another (the op
    path computes each line out of place, so only it is exact for aliased operands)."""
    arrays = []
    for t in tensors:
        array = t._data
        if type(array) is not np.ndarray or not array.flags.writeable:
            return None
        arrays.append(array)
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            if np.may_share_memory(a, b):
                return None
    return arrays


class Scratch:
    """Reusable temporary arrays, one flat buffer per (dtype, slot) grown to the largest
    parameter: a step allocates nothing (a fresh large array costs a page fault per 4 KiB).
    One per optimizer (`scratch_of`), dropped with it."""

    def __init__(self) -> None:
        self._buffers: dict = {}

    def like(self, array: np.ndarray, slot: int = 0) -> np.ndarray:
        key = (array.dtype, slot)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.size < array.size:
            buffer = np.empty(array.size, array.dtype)
            self._buffers[key] = buffer
        return buffer[:array.size].reshape(array.shape)


_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def scratch_of(optimizer) -> Scratch:
    """The scratch buffers of `optimizer` (made on first use)."""
    scratch = _SCRATCH.get(optimizer)
    if scratch is None:
        scratch = _SCRATCH[optimizer] = Scratch()
    return scratch


def _bump(*tensors) -> None:
    for t in tensors:
        t._version_counter.bump()


def sgd(p: Tensor, grad: Tensor, buf: Tensor | None, group: dict, scratch: Scratch) -> bool:
    """One SGD update of `p` (graphc.optim.sgd's lines, same order); `buf` is the existing
    momentum buffer (None: momentum off). False, touching nothing, where the op path must run."""
    tensors = [p, grad] if buf is None else [p, grad, buf]
    arrays = eager_arrays(tensors)
    if arrays is None:
        return False
    p_a, g_a = arrays[0], arrays[1]
    lr, momentum = group["lr"], group["momentum"]
    dampening, weight_decay = group["dampening"], group["weight_decay"]
    g = g_a
    if group["maximize"]:
        g = np.negative(g_a, out=scratch.like(p_a, 0))
    if weight_decay != 0:  # g.add(p, alpha=weight_decay): g + p * weight_decay
        decay = np.multiply(p_a, weight_decay, out=scratch.like(p_a, 1))
        g = np.add(g, decay, out=scratch.like(p_a, 0))
    if buf is not None:
        b_a = arrays[2]
        np.multiply(b_a, momentum, out=b_a)  # buf.mul_(momentum)
        alpha = 1 - dampening  # .add_(g, alpha=1 - dampening)
        np.add(b_a, g if alpha == 1 else np.multiply(g, alpha, out=scratch.like(p_a, 1)),
               out=b_a)
        _bump(buf, buf)
        if group["nesterov"]:  # g + buf * momentum
            g = np.add(g, np.multiply(b_a, momentum, out=scratch.like(p_a, 1)),
                       out=scratch.like(p_a, 0))
        else:
            g = b_a
    # add_scaled_(p, g, -lr): p.add_(g, alpha=-lr), whose alpha is never 1 (lr >= 0)
    np.add(p_a, np.multiply(g, -lr, out=scratch.like(p_a, 1)), out=p_a)
    _bump(p)
    return True


def adam(p: Tensor, grad: Tensor, state: dict, group: dict, scratch: Scratch) -> bool:
    """One Adam/AdamW update of `p` from its (initialised) state, graphc.optim.adam's lines in
    their order. False, touching nothing, where the op path must run."""
    amsgrad = group["amsgrad"]
    step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
    tensors = [p, grad, step_t, exp_avg, exp_avg_sq]
    if amsgrad:
        tensors.append(state["max_exp_avg_sq"])
    arrays = eager_arrays(tensors)
    if arrays is None:
        return False
    p_a, g, step_a, avg, avg_sq = arrays[:5]
    lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
    weight_decay = group["weight_decay"]
    dtype = p_a.dtype.type
    t0, t1 = scratch.like(p_a, 0), scratch.like(p_a, 1)

    np.add(step_a, 1, out=step_a)  # step_t.add_(1)
    _bump(step_t)
    if group["maximize"]:
        g = np.negative(g, out=t0)
    if weight_decay != 0:
        if group["decoupled_weight_decay"]:
            np.multiply(p_a, 1 - lr * weight_decay, out=p_a)
            _bump(p)
        else:  # g.add(p, alpha=weight_decay)
            g = np.add(g, np.multiply(p_a, weight_decay, out=t1), out=t0)
    weight = 1 - beta1  # lerp_(exp_avg, g, 1 - beta1), ATen's two formulas
    diff = np.subtract(g, avg, out=t1)
    if abs(weight) < 0.5:
        np.add(avg, np.multiply(diff, weight, out=diff), out=avg)
    else:
        one_minus = np.subtract(dtype(1), dtype(weight))
        np.subtract(g, np.multiply(diff, one_minus, out=diff), out=avg)
    _bump(exp_avg)
    np.multiply(avg_sq, beta2, out=avg_sq)  # exp_avg_sq.mul_(beta2).add_(g*(1-beta2)*g)
    square = np.multiply(g, 1 - beta2, out=t1)
    np.add(avg_sq, np.multiply(square, g, out=square), out=avg_sq)
    _bump(exp_avg_sq, exp_avg_sq)

    step = np.float64(step_a)  # the bias corrections in float64, as the op path
    bias_correction1 = np.subtract(np.float64(1), np.power(np.float64(beta1), step))
    bias_correction2 = np.subtract(np.float64(1), np.power(np.float64(beta2), step))
    step_size = dtype(np.true_divide(np.float64(lr), bias_correction1))
    bias_correction2_sqrt = dtype(np.power(bias_correction2, np.float64(0.5)))
    second = avg_sq
    if amsgrad:
        second = arrays[5]
        np.maximum(second, avg_sq, out=second)  # max_exp_avg_sq.copy_(maximum(...))
        _bump(state["max_exp_avg_sq"])
    denom = np.sqrt(second, out=t1)  # (sqrt(v) / bias_correction2_sqrt).add_(eps)
    np.add(np.true_divide(denom, bias_correction2_sqrt, out=denom), eps, out=denom)
    # p.add_((-step_size).mul(exp_avg).div(denom))
    update = np.multiply(-step_size, avg, out=t0)
    np.add(p_a, np.true_divide(update, denom, out=update), out=p_a)
    _bump(p)
    return True
