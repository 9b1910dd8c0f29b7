"""OpInfo entries for the 'linalg' op group: matmul (every rank combination PyTorch accepts),
mm, bmm, dot, outer and linear, with PyTorch's shape and dtype errors."""

from __future__ import annotations

import numpy as np

import graphc
from graphc.errors import DTypeError, ShapeError
from tests.opinfo import ErrorInput, OpInfo, Sample, arr


def _torch(name):
    def fn(*args, **kwargs):
        import torch

        return getattr(torch, name)(*args, **kwargs)

    fn.__name__ = f"torch_{name}"
    return fn


def _torch_linear(*args, **kwargs):
    import torch.nn.functional as F

    return F.linear(*args, **kwargs)


def _np_linear(x, weight, bias=None):
    out = np.matmul(x, weight.T)
    return out if bias is None else out + bias


def _matmul_samples(rng):
    return [
        Sample((arr(rng, 3, 4), arr(rng, 4, 5)), desc="2-D @ 2-D"),
        Sample((arr(rng, 4), arr(rng, 4)), desc="1-D @ 1-D: dot"),
        Sample((arr(rng, 4), arr(rng, 4, 3)), desc="1-D @ 2-D"),
        Sample((arr(rng, 3, 4), arr(rng, 4)), desc="2-D @ 1-D"),
        Sample((arr(rng, 2, 3, 4), arr(rng, 2, 4, 5)), desc="batched"),
        Sample((arr(rng, 2, 1, 3, 4), arr(rng, 3, 4, 2)), desc="broadcast batch dims"),
        Sample((arr(rng, 2, 3, 4), arr(rng, 4, 2)), desc="3-D @ 2-D (linear layer)"),
        Sample((arr(rng, 3, 4), arr(rng, 2, 4, 2)), desc="2-D @ 3-D"),
        Sample((arr(rng, 4), arr(rng, 2, 4, 3)), desc="1-D @ 3-D"),
        Sample((arr(rng, 2, 3, 4), arr(rng, 4)), desc="3-D @ 1-D"),
        Sample((arr(rng, 1, 3, 4), arr(rng, 2, 4, 5)), desc="size-1 batch broadcast"),
        Sample((rng.integers(-3, 3, size=(3, 4)), rng.integers(-3, 3, size=(4, 2))),
               desc="int64"),
        Sample((arr(rng, 0, 4), arr(rng, 4, 3)), desc="empty rows"),
        Sample((arr(rng, 2, 0), arr(rng, 0, 3)), desc="empty inner: zeros"),
    ]


def _matmul_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 4, 5))), ShapeError,
                   r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)"),
        ErrorInput(Sample((arr(rng, 3), arr(rng, 4))), ShapeError,
                   r"inconsistent tensor size, expected tensor \[3\] and src \[4\]"),
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 4))), ShapeError,
                   r"size mismatch, got input \(2\), mat \(2x3\), vec \(4\)"),
        ErrorInput(Sample((arr(rng, 3), arr(rng, 4, 5))), ShapeError,
                   r"mat1 and mat2 shapes cannot be multiplied \(1x3 and 4x5\) "
                   r"\(matmul of \[3\] @ \[4, 5\]\)"),
        ErrorInput(Sample((arr(rng, 2, 2, 3), arr(rng, 4, 5))), ShapeError,
                   r"\(4x3 and 4x5\) \(matmul of \[2, 2, 3\] @ \[4, 5\]\)"),
        ErrorInput(Sample((arr(rng, 2, 2, 3), arr(rng, 2, 4, 5))), ShapeError,
                   r"\[2, 2, 3\] @ \[2, 4, 5\] \(the inner dimensions 3 and 4 differ\)"),
        ErrorInput(Sample((arr(rng, 2, 2, 3), arr(rng, 3, 3, 4))), ShapeError,
                   r"The size of tensor a \(2\) must match the size of tensor b \(3\) at "
                   r"non-singleton dimension 0 \(batch dimensions of \[2, 2, 3\] @ \[3, 3, 4\]\)"),
        ErrorInput(Sample((np.float32(1.0) * np.ones((), np.float32), arr(rng, 2))), ShapeError,
                   "both arguments to matmul need to be at least 1D, but they are 0D and 1D"),
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 3, 4, dtype=np.float64))), DTypeError,
                   "expected m1 and m2 to have the same dtype, but got: float != double"),
        ErrorInput(Sample((np.ones((2, 3), bool), np.ones((3, 4), bool))), DTypeError,
                   "\"matmul\" not implemented for 'Bool'"),
    ]


def _mm_samples(rng):
    return [Sample((arr(rng, 3, 4), arr(rng, 4, 5)), desc="3x4 @ 4x5"),
            Sample((arr(rng, 1, 4), arr(rng, 4, 1)), desc="1x4 @ 4x1")]


def _mm_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 3), arr(rng, 3, 4))), ShapeError, "self must be a matrix"),
        ErrorInput(Sample((arr(rng, 3, 4), arr(rng, 2, 4, 5))), ShapeError,
                   "mat2 must be a matrix"),
        ErrorInput(Sample((arr(rng, 32, 784), arr(rng, 128, 10))), ShapeError,
                   r"mat1 and mat2 shapes cannot be multiplied \(32x784 and 128x10\)$"),
    ]


def _bmm_samples(rng):
    return [Sample((arr(rng, 2, 3, 4), arr(rng, 2, 4, 5)), desc="2 x (3x4 @ 4x5)")]


def _bmm_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 3, 4), arr(rng, 3, 4, 6))), ShapeError,
                   "batch1 must be a 3D tensor"),
        ErrorInput(Sample((arr(rng, 2, 3, 4), arr(rng, 4, 6))), ShapeError,
                   "batch2 must be a 3D tensor"),
        ErrorInput(Sample((arr(rng, 2, 3, 4), arr(rng, 3, 4, 6))), ShapeError,
                   r"Expected size for first two dimensions of batch2 tensor to be: \[2, 4\] but "
                   r"got: \[3, 4\]\."),
        ErrorInput(Sample((arr(rng, 2, 3, 4), arr(rng, 2, 5, 6))), ShapeError,
                   r"to be: \[2, 4\] but got: \[2, 5\]\."),
    ]


def _dot_samples(rng):
    return [Sample((arr(rng, 5), arr(rng, 5)), desc="length 5"),
            Sample((rng.integers(-3, 3, size=4), rng.integers(-3, 3, size=4)), desc="int64")]


def _dot_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 3, 1), arr(rng, 3))), ShapeError,
                   "1D tensors expected, but got 2D and 1D tensors"),
        ErrorInput(Sample((arr(rng, 3), arr(rng, 3, dtype=np.float64))), DTypeError,
                   "dot : expected both vectors to have same dtype, but found Float and Double"),
        ErrorInput(Sample((arr(rng, 3), arr(rng, 4))), ShapeError,
                   "inconsistent tensor size"),
    ]


def _outer_samples(rng):
    return [Sample((arr(rng, 3), arr(rng, 4)), desc="3 x 4")]


def _outer_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 2), arr(rng, 3))), ShapeError,
                   "outer: Expected 1-D argument self, but got 2-D"),
        ErrorInput(Sample((arr(rng, 2), arr(rng, 3, 1))), ShapeError,
                   "outer: Expected 1-D argument vec2, but got 2-D"),
    ]


def _linear_samples(rng):
    return [
        Sample((arr(rng, 4, 3), arr(rng, 2, 3), arr(rng, 2)), desc="with bias"),
        Sample((arr(rng, 4, 3), arr(rng, 2, 3)), desc="no bias"),
        Sample((arr(rng, 2, 5, 3), arr(rng, 4, 3), arr(rng, 4)), desc="3-D input"),
        Sample((arr(rng, 3), arr(rng, 4, 3), arr(rng, 4)), desc="1-D input"),
        Sample((arr(rng, 4, 3), arr(rng, 3)), desc="1-D weight"),
    ]


def _linear_errors(rng):
    return [
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 4, 5))), ShapeError,
                   r"mat1 and mat2 shapes cannot be multiplied \(2x3 and 5x4\)"),
        ErrorInput(Sample((arr(rng, 2, 3), arr(rng, 4, 3), arr(rng, 5))), ShapeError,
                   r"The size of tensor a \(4\) must match the size of tensor b \(5\)"),
    ]


def _np_outer(a, b):
    return np.outer(a, b)


OP_INFOS: list[OpInfo] = [
    OpInfo("matmul", graphc.matmul, np.matmul, _matmul_samples, ("matmul", "permute", "reshape"),
           torch_fn=_torch("matmul"), error_inputs=_matmul_errors),
    OpInfo("mm", graphc.mm, np.matmul, _mm_samples, ("matmul",), torch_fn=_torch("mm"),
           error_inputs=_mm_errors),
    OpInfo("bmm", graphc.bmm, np.matmul, _bmm_samples, ("matmul",), torch_fn=_torch("bmm"),
           error_inputs=_bmm_errors),
    OpInfo("dot", graphc.dot, np.dot, _dot_samples, ("matmul",), torch_fn=_torch("dot"),
           error_inputs=_dot_errors),
    OpInfo("outer", graphc.outer, _np_outer, _outer_samples, ("reshape", "mul"),
           torch_fn=_torch("outer"), error_inputs=_outer_errors),
    OpInfo("linear", graphc.linear, _np_linear, _linear_samples, ("matmul", "permute", "add"),
           torch_fn=_torch_linear, error_inputs=_linear_errors),
]
