"""gemm_layout: how a BLAS GEMM reads operands laid out with given element strides.

`gemm_layout(rows, cols, sr, sc)` is the CBLAS transpose flag and leading dimension that read
a rows x cols matrix as a row-major operand, or None (the caller then packs a copy);
`folded_rows(...)` is the row count of one GEMM that replaces a batch of GEMMs against one
matrix, or None; `fold_after_packing(...)` says when packing A into a contiguous copy first
makes that fold possible and pays; `strided_output(c, shape)` says how a GEMM writes a result
the plan lays out other than row-major (graphc.passes.gemm_output_layout: rows `ldc` apart, or
transposed, which the GEMM writes as c^T = b^T @ a^T through `transposed` operands). Used by
graphc.backends.cpu.codegen's matmul lowering.
"""

from __future__ import annotations

import math

from graphc.backends.common import broadcast_strides, contiguous_strides
from graphc.backends.cpu.values import CpuLoweringError, Loc
from graphc.types import TensorType

__all__ = ["fold_after_packing", "folded_rows", "gemm_layout", "strided_output", "transposed"]


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


def fold_after_packing(batch: tuple, sa_shape: list, sa: list, sb_shape: list, sb: list) -> bool:
    """True when a batched product against one shared matrix B does not fold as A is laid out
    (folded_rows is None: A's batch and rows are not one row-major block, e.g. a time-major
    view of a batch-first tensor) but would fold once A is copied contiguous. The copy
    reads and writes A once (m*k per batch element) while the GEMM does 2*m*k*n flops per
    batch element, and one tall GEMM runs at BLAS speed where the batch of thin ones does
    not (a CharLSTM's input projection [16 x 32] @ [32 x 512] 32 times: 35 GFLOP/s, one
    [512 x 32] @ [32 x 512]: ~110). The numbers are the same: each row of C is the same dot
    products. Sizes known only per call (symbols) keep the per-batch loop."""
    if not all(type(d) is int for d in (*batch, *sa_shape, *sb_shape, *sa, *sb)):
        return False
    if not batch or math.prod(batch) < 2 or len(sb_shape) < 2 or sb_shape[-1] < 4:
        return False
    if any(broadcast_strides(tuple(sb_shape[:-2]), tuple(sb[:-2]), batch)):
        return False  # B differs per batch element: no single GEMM
    if len(sa_shape) - 2 != len(batch) or tuple(sa_shape[:-2]) != batch:
        return False  # A broadcast over the batch: packing would copy it batch times
    if any(size != 1 and stride == 0 for size, stride in zip(batch, sa[:-2])):
        return False  # A repeats along a batch dimension: the same
    return folded_rows(batch, sa_shape, sa, sb_shape, sb) is None


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


def strided_output(c: Loc, shape: tuple) -> str | None:
    """How a GEMM writes its result `c` of (batch..., m, n) `shape`: None when c is row-major
    (the common case), "rows" when its rows lie a row stride apart that is not n (each
    matrix is written with ldc = that stride; a batch of them at any strides), "transposed"
    when its columns are contiguous instead (the caller computes c^T = b^T @ a^T). A head
    merge's P @ V written straight into the merged [B, T, H*E] buffer is "rows" (ldc = H*E),
    a K gradient computed as [B, H, E, T] and merged is "transposed"."""
    item = c.type.dtype.itemsize
    if tuple(c.strides) == tuple(contiguous_strides(tuple(c.type.shape), item)):
        return None
    sc = [s // item for s in c.strides]
    m, n = shape[-2:]
    layout = gemm_layout(m, n, sc[-2], sc[-1]) if tuple(c.type.shape) == tuple(shape) else None
    if layout is None:
        raise CpuLoweringError(f"cpu backend: a matmul result of {c.type} laid out with "
                               f"element strides {tuple(sc)}: a GEMM writes rows or columns "
                               "with unit stride only; plan it row-major (graphc.passes."
                               "gemm_output_layout chooses only layouts a GEMM writes)")
    return "rows" if layout[0] == 111 else "transposed"


def transposed(x: Loc, shape: list, strides: list) -> Loc:
    """`x` read as its last two dims swapped (element `strides` of its `shape`, which may be a
    1-D operand padded to 2-D), for computing c^T = b^T @ a^T."""
    item = x.type.dtype.itemsize
    shape = (*shape[:-2], shape[-1], shape[-2])
    strides = (*strides[:-2], strides[-1], strides[-2])
    return Loc(x.base, x.index, x.offset, tuple(s * item for s in strides),
               TensorType(shape, x.type.dtype))
