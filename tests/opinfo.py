"""The OpInfo table: one entry per user-facing op, driving every generic op test.

An `OpInfo` names the graphc function under test, a numpy reference, sample inputs, error
inputs, the PyTorch function for parity, and the registry ops it exercises. Entries live in
`tests/opinfos/<group>.py` (one file per op group, one owner each) and are gathered here into
`OP_INFOS`. tests/test_ops.py runs, for every entry and sample:
- eager graphc vs the numpy reference (computed in float64),
- float64 gradcheck (differentiable ops),
- PyTorch parity of forward and gradients (skipped, with the reason, without torch),
- each error input raises the stated error class with a message matching the pattern,
and checks that every registered op is covered by some entry.

Samples hold numpy arrays and plain Python values; the harness turns every ndarray argument
into a graphc tensor (or a torch tensor), so an entry never builds tensors itself. Arrays
inside a list/tuple argument are converted too (for cat/stack).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass
class Sample:
    """One call: positional args (ndarrays become tensors) and keyword args."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    desc: str = ""
    # Indices of args that gradcheck perturbs; default: every floating-point ndarray arg.
    grad_args: tuple[int, ...] | None = None


@dataclass
class ErrorInput:
    """A call that must fail: the error class and a regex its message must match."""

    sample: Sample
    error: type
    match: str


@dataclass
class OpInfo:
    """Everything the generic tests need to check one user-facing op."""

    name: str
    op: Callable[..., Any]  # the graphc function: op(*tensors_and_values, **kwargs)
    ref: Callable[..., Any]  # numpy reference over float64 arrays: ref(*arrays, **kwargs)
    samples: Callable[[np.random.Generator], list[Sample]]
    registry_ops: tuple[str, ...]  # registry ops this entry exercises (coverage check)
    torch_fn: Callable[..., Any] | None = None  # torch_fn(*torch_tensors, **kwargs)
    differentiable: bool = True
    error_inputs: Callable[[np.random.Generator], list[ErrorInput]] | None = None
    atol: float = 1e-5
    rtol: float = 1e-4
    grad_atol: float = 1e-5
    grad_rtol: float = 1e-3
    # Test kind ("ref", "gradcheck", "torch", "torch_grad") -> reason to skip it.
    skips: dict[str, str] = field(default_factory=dict)
    # Compare the eager output against ref exactly (integer and boolean results).
    exact: bool = False


def arr(rng: np.random.Generator, *shape, low: float = -2.0, high: float = 2.0,
        dtype=np.float32) -> np.ndarray:
    """A random float array in [low, high)."""
    return rng.uniform(low, high, size=shape).astype(dtype)


def positive(rng: np.random.Generator, *shape, dtype=np.float32) -> np.ndarray:
    return rng.uniform(0.5, 2.0, size=shape).astype(dtype)


def away_from(rng, *shape, points=(0.0,), gap=0.1, dtype=np.float32) -> np.ndarray:
    """Random values at least `gap` from each of `points` (kinks of relu, abs, max...)."""
    x = rng.uniform(-2.0, 2.0, size=shape)
    for p in points:
        close = np.abs(x - p) < gap
        x = np.where(close, x + np.sign(x - p + 1e-12) * gap * 2, x)
    return x.astype(dtype)


def _gather() -> list[OpInfo]:
    from tests.opinfos import ALL_GROUPS

    infos: list[OpInfo] = []
    for group in ALL_GROUPS:
        infos.extend(group.OP_INFOS)
    names = [i.name for i in infos]
    dupes = {n for n in names if names.count(n) > 1}
    assert not dupes, f"OpInfo names must be unique: {dupes}"
    return infos


OP_INFOS: list[OpInfo] = _gather()

# Registry ops no OpInfo needs to cover, each with the reason.
COVERAGE_EXEMPT: dict[str, str] = {
    "all_reduce": "needs a process group of several ranks: tests/test_distributed.py runs it "
                  "on 2 MPI ranks, eager and compiled for interp and cpu",
    "all_reduce_start": "made by the bucketing pass from all_reduces: tests/test_distributed.py "
                        "runs it on 2 MPI ranks, compiled for interp and cpu",
    "all_reduce_wait": "made by the bucketing pass with all_reduce_start: "
                       "tests/test_distributed.py runs it on 2 MPI ranks",
    "attention": "made by the cpu pipeline's fuse_attention pass, never called by users: "
                 "tests/test_fused_attention.py checks it compiled and interpreted",
    "attention_backward": "made by fuse_attention with attention: tests/test_fused_attention.py",
    "batch_norm_relu": "made by the cpu pipeline's fuse_batch_norm_relu pass, never called by "
                       "users: tests/test_batch_norm_relu.py checks it compiled and interpreted",
    "batch_norm_relu_backward": "made by the cpu pipeline's fuse_batch_norm_backward pass, never "
                                "called by users: tests/test_batch_norm_relu.py checks it "
                                "compiled and interpreted",
    "conv2d_channel_sums": "made by the cpu pipeline's fuse_conv_channel_sums pass, never called "
                           "by users: tests/test_conv_channel_sums.py checks it compiled and "
                           "interpreted",
}
