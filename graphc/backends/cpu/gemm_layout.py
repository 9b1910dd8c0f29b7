"""gemm_layout: how a BLAS GEMM reads operands laid out with given element strides.

`gemm_layout(rows, cols, sr, sc)` is the CBLAS transpose flag and leading dimension that read
a rows x cols matrix as a row-major operand, or None (the caller then packs a copy);
`folded_rows(...)` is the row count of one GEMM that replaces a batch of GEMMs against one
matrix, or None. Used by graphc.backends.cpu.codegen's matmul lowering.
"""

from __future__ import annotations

import math

from graphc.backends.common import broadcast_strides

__all__ = ["folded_rows", "gemm_layout"]


def folded_rows(batch: tuple, sa_shape: list, sa: list, sb_shape: list, sb: list):
    """batch * m when a batched product reads one matrix B for every batch element and A's
    batch and rows form one row-major block (a Linear layer on a (B, T, C) input): the batch
    folds into the rows of a single GEMM instead of one small GEMM per batch element (the
    numbers are the same: each row of C is the same dot products). None otherwise."""
    if not batch or len(sb_shape) < 2 or sa[-1] != 1 or len(sa_shape) - 2 != len(batch):
        return None
    if tuple(sa_shape[:-2]) != batch or any(broadcast_strides(
            tuple(sb_shape[:-2]), tuple(sb[:-2]), batch)):
        return None
    m, k = sa_shape[-2:]
    expected = sa[-2] * m
    if sa[-2] < k:  # rows that overlap (a broadcast row): not one row-major block
        return None
    for size, stride in zip(reversed(batch), reversed(sa[:-2])):
        if size != 1 and stride != expected:
            return None
        expected *= size
    return math.prod(batch) * m


def gemm_layout(rows: int, cols: int, sr: int, sc: int):
    """(CBLAS transpose flag, leading dimension) reading a rows x cols matrix with element
    strides (sr, sc) as a row-major operand, or None when no layout reads it."""
    if cols == 1 or sc == 1:
        ld = sr if rows > 1 else max(cols, 1)
        if ld >= max(1, cols):
            return (111, ld)
    if rows == 1 or sr == 1:
        ld = sc if cols > 1 else max(rows, 1)
        if ld >= max(1, rows):
            return (112, ld)
    return None
