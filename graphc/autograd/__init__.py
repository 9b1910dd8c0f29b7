"""graphc.autograd: reverse-mode automatic differentiation with PyTorch's semantics.

`backward` accumulates gradients into the leaves' `.grad`; `grad` returns gradients of chosen
inputs instead. `Function` lets users define their own differentiable functions;
`gradcheck`/`gradgradcheck` compare analytical gradients with float64 finite differences.
"""

from __future__ import annotations

from collections.abc import Sequence

from graphc.autograd.engine import run_backward
from graphc.autograd.function import Function, FunctionCtx, once_differentiable
from graphc.autograd.grad_mode import (
    detect_anomaly,
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_detect_anomaly,
    set_grad_enabled,
)
from graphc.autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck


def _as_seq(x) -> list:
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Compute the gradient of `tensors` w.r.t. the graph leaves and add it to their `.grad`."""
    tensors = _as_seq(tensors)
    grads = _as_seq(grad_tensors) or [None] * len(tensors)
    if retain_graph is None:
        retain_graph = create_graph
    if inputs is not None:
        inputs = _as_seq(inputs)
        results = run_backward(tensors, grads, retain_graph, create_graph, inputs=inputs,
                               allow_unused=True)
        for t, g in zip(inputs, results):
            if g is not None:
                t._grad_accumulator().accumulate(g, create_graph)
        return
    run_backward(tensors, grads, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False) -> tuple:
    """Return d(outputs)/d(inputs) without touching any `.grad`.

    >>> import graphc
    >>> x = graphc.tensor([3.0], requires_grad=True)
    >>> (g,) = graphc.autograd.grad(x * x, x, create_graph=True)
    >>> g
    tensor([6.], grad_fn=<AddBackward0>)
    """
    outputs = _as_seq(outputs)
    inputs_seq: Sequence = _as_seq(inputs)
    grads = _as_seq(grad_outputs) or [None] * len(outputs)
    if retain_graph is None:
        retain_graph = create_graph
    return run_backward(outputs, grads, retain_graph, create_graph, inputs=inputs_seq,
                        allow_unused=allow_unused)


__all__ = [
    "Function", "FunctionCtx", "GradcheckError", "backward", "detect_anomaly", "enable_grad",
    "grad", "gradcheck", "gradgradcheck", "inference_mode", "is_grad_enabled",
    "is_inference_mode_enabled", "no_grad", "once_differentiable", "set_detect_anomaly",
    "set_grad_enabled",
]
