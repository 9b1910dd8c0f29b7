"""Eager dispatch cost: Python time per small op, graphc next to PyTorch and numpy.

    python -m benchmarks.eager_dispatch

Each figure is the median of 7 rounds of 20,000 calls on 10-element float32 tensors (the
work itself is negligible, so this is the per-op overhead users pay while debugging in eager
mode). The performance issue's target is <= 5 us per small elementwise op.
"""

from __future__ import annotations

import os
import statistics
import timeit

import numpy as np

import graphc

CALLS, ROUNDS = 20_000, 7


def per_call(fn) -> float:
    return statistics.median(timeit.repeat(fn, number=CALLS, repeat=ROUNDS)) / CALLS


def main() -> int:
    a, b = graphc.ones(10), graphc.ones(10)
    w = graphc.ones(10, requires_grad=True)
    na = np.ones(10, np.float32)
    rows = [("a + b", lambda: a + b), ("a.relu()", lambda: a.relu()),
            ("w * b (w requires grad)", lambda: w * b)]
    try:
        import torch

        ta, tb = torch.ones(10), torch.ones(10)
        tw = torch.ones(10, requires_grad=True)
        anchors = [lambda: ta + tb, lambda: ta.relu(), lambda: tw * tb]
    except ImportError:
        anchors = [None] * len(rows)
    print(f"command: `python -m benchmarks.eager_dispatch`; load average "
          f"{os.getloadavg()[0]:.2f}; numpy a + b: {per_call(lambda: na + na) * 1e6:.2f} us\n")
    print("| op (10 floats) | graphc eager | PyTorch eager | ratio | target |")
    print("|---|---|---|---|---|")
    for (label, fn), anchor in zip(rows, anchors):
        ours = per_call(fn)
        theirs = per_call(anchor) if anchor is not None else None
        ratio = f"{ours / theirs:.1f}x" if theirs else "-"
        torch_cell = f"{theirs * 1e6:.2f} us" if theirs else "torch not installed"
        print(f"| {label} | {ours * 1e6:.2f} us | {torch_cell} | {ratio} | <= 5 us |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
