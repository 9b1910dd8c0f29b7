"""conv_row_split: one image's im2col GEMM in one generated call (once 16 row slabs).

The stride-2 convolutions of ResNet-18 (CIFAR, batch 32) run by im2col and one BLAS GEMM
per image (graphc.backends.cpu.conv): the forward's `out (O x P) = w (O x K) @ cols (K x P)`
and the input gradient's `cols (K x P) = w^T (K x O) @ gy (O x P)`. On the mid-sized
images OpenBLAS runs these at 120-145 GFLOP/s (one thread), where graphc.backends.cpu.
winograd_gemm's generated function, which runs 16 products of one shape without packing,
runs the same product cut into 16 slabs of rows (a and c stepped by a slab's rows, b shared
and read from cache by every slab) at 170-185 (one thread, alone, 2026-11-26; docs/
performance.md, "ResNet-18's stride-2 convolutions, ninth session"):

| product (per image) | OpenBLAS, one call | 16 slabs, generated |
|---|---|---|
| 3x3, 128 ch, 8x8 out: [256 x 1152] @ [1152 x 64] | 135-143 GFLOP/s | 176 |
| its input gradient [1152 x 256] @ [256 x 64] | 143 | 171 |
| 1x1, 64 -> 128, 16x16 out: [128 x 64] @ [64 x 256] | 120-128 | 173 |
| 1x1, 128 -> 256, 8x8 out: [256 x 128] @ [128 x 64] | 130-149 | 181 |

Inside the convolution kernels (batch 32, one thread, the one-op graphs of
`python -m benchmarks.resnet18_kernels --only row-split-kernels`, load ~4, four runs) the
forwards of 64 -> 128 (3x3 and 1x1) and 128 -> 256 and the input gradients of 128 -> 256
gained (0.1-2.4 ms a kernel); the input gradients of 64 -> 128 (n = 256 positions, c the
576 x 256 columns) lost 0.1-0.5 ms in three runs of four: an input gradient is taken up to
INPUT_GRAD_MAX_N positions. A product whose b is past MAX_B_BYTES (the slabs read b from
L2 once per slab) and a block of several images (graphc.backends.cpu.conv_blocks, the 4x4
planes, one GEMM of 512 columns) keep the BLAS (the latter measured the same or slower).

Since the tenth session the product is one product of the function (SLABS = 1), not 16
slabs: the generated function's loops (panels of c, blocks of k, row tiles) keep b's block
in L1 for all of c's rows either way, and the slabs' thin row blocks (128 rows: 16 slabs
of 8, two tiles of 4 rows) cost more than they saved. Each kernel as a one-op graph (batch
32, 1 thread, CPU time, 15 alternated rounds, three runs at load 5-6), 16 slabs -> one
product: 3x3 128 -> 256 input gradient 8.21 -> 7.51, 8.24 -> 7.62, 7.69 -> 6.95 ms; 1x1
128 -> 256 input gradient 1.18 -> 1.00 (BLAS 1.27); 3x3 64 -> 128 forward 7.68 -> 7.40,
7.89 -> 7.68, 7.37 -> 7.21; the 1x1 and 128 -> 256 forwards the same within 0.2 ms. The
same sums, bit for bit. The rules below (INPUT_GRAD_MAX_N, MAX_B_BYTES, MAX_K) stay as
measured with the slabs: the 64 -> 128 input gradient as one product lost too (9.29 ->
9.66 ms against the BLAS).

The weight gradient too (`plan_weight_grad`, tenth session): one image's `gw^T (K x O) (+)=
cols (K x P) @ gy^T (P x O)`, beta 0 for the kernel's (or share's) first image and 1 after,
from a per-image copy of gy^T (b's rows must be contiguous; gy^T is the smaller operand),
gw^T untransposed at the end as the BLAS's transposed form does (graphc.backends.cpu.conv).
One-op kernels (batch 32, 1 thread, CPU time, 15 and 21 alternated rounds, load 4.5-5),
BLAS -> generated: 3x3 64 -> 128 8.27 -> 7.30, 8.72 -> 7.69 ms; 3x3 128 -> 256 8.23 -> 7.43,
7.82 -> 7.41; the 1x1 shortcuts the same (1.46 -> 1.42, 1.07 -> 1.06), with gy^T copied
element by element (0.5-0.9 ms of the 3x3 kernels); copied in 16 x 16 squares in vector
registers (conv._transposed_squares; 15 rounds, load 6.5): 3x3 8.28 -> 6.84 and 7.57 ->
6.71, 1x1 1.48 -> 1.14 and 1.05 -> 0.91. The 256 -> 512 layers (blocks of images) keep
the BLAS.

Rounding: each element of c sums k in blocks of winograd_gemm.K_BLOCK (fused multiply-adds in
order), the blocks' sums added in c, as a BLAS blocks k; judged by distance from a float64
run (tests/test_cpu_conv_row_split.py).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import winograd_gemm
from graphc.backends.cpu.values import F32, as_i64
from graphc.types import float32

__all__ = ["ENABLED", "INPUT_GRAD_MAX_N", "MAX_B_BYTES", "MAX_K", "SLABS", "WEIGHT_GRAD", "call",
           "plan", "plan_weight_grad"]

SLABS = 1  # products of m / SLABS rows each, one call (see the module docstring)
# b (k x n floats) read by every slab: 3x3 64 -> 128's forward (576 KB) gained 0.7-0.9 ms
# of 8-9 in the kernel (three runs), though alone, b in cache, it measured 121-169 GFLOP/s
# against the BLAS's 140 (noisy); larger ones not measured
MAX_B_BYTES = 640 << 10
INPUT_GRAD_MAX_N = 64  # the columns an input gradient's product may have (see above)
MAX_K = 1152  # the longest k measured (128 channels x 3 x 3)
MIN_SLAB_ROWS = 4  # the thinnest slabs measured (1x1 64 -> 128, input gradient: 4 rows)
ENABLED = True  # False: every product keeps its BLAS call (A/B runs, benchmarks)
WEIGHT_GRAD = True  # False: the weight gradients keep their BLAS calls (A/B runs)


def plan(dt, m: int, n: int, k: int, a_row: int, a_col: int, ldb: int, ldc: int,
         max_n: int | None = None):
    """The generated function computing c (m x n, rows ldc apart) = a (m x k, element
    strides a_row, a_col) @ b (k x n, rows ldb apart) as SLABS slab(s) of m / SLABS rows, or
    None where the BLAS call stays (not float32, not ENABLED, a host winograd_gemm does not
    serve, m not a whole number of slabs of MIN_SLAB_ROWS rows or more, k past MAX_K, b past
    MAX_B_BYTES, n past `max_n` or not a whole number of vectors)."""
    if dt is not float32 or not ENABLED or not winograd_gemm.available():
        return None
    if not all(type(d) is int for d in (m, n, k)):
        return None
    rows = m // SLABS
    if m % SLABS or rows < MIN_SLAB_ROWS or k > MAX_K or k * n * 4 > MAX_B_BYTES or \
            (max_n is not None and n > max_n):
        return None
    return winograd_gemm.plan(rows, n, k, a_row, a_col, ldb, ldc, rows * a_row, 0, rows * ldc,
                              max_k=MAX_K, products=SLABS)


def plan_weight_grad(dt, k: int, o: int, p: int):
    """The generated function accumulating one image's transposed weight gradient
    `gw^T (K x O) (+)= cols (K x P) @ gy^T (P x O)` (gy^T a per-image copy, rows of O), or
    None where the BLAS call stays (as `plan`; P up to winograd_gemm.MAX_K)."""
    if dt is not float32 or not ENABLED or not WEIGHT_GRAD or not winograd_gemm.available():
        return None
    if not all(type(d) is int for d in (k, o, p)) or k < MIN_SLAB_ROWS or \
            p > winograd_gemm.MAX_K or p * o * 4 > MAX_B_BYTES:
        return None
    return winograd_gemm.plan(k, o, p, p, 1, o, o, 0, 0, 0, accumulates=True,
                              max_k=winograd_gemm.MAX_K, products=1)


def call(lw, b, kb, gemm, a, a_off, bm, b_off, c, c_off, beta=None) -> None:
    """c (+)= a @ b by `gemm` (from `plan`: beta 0, c written; or `plan_weight_grad`: beta
    an IR value, 0 or 1), on kernel operands from these element offsets."""
    fn = winograd_gemm.function(lw.module, gemm)
    b.call(fn, [kb.pointer(b, a, as_i64(a_off)), kb.pointer(b, bm, as_i64(b_off)),
                kb.pointer(b, c, as_i64(c_off)), beta or ir.Constant(F32, 0.0)])
