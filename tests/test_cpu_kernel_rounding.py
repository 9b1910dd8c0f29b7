"""A kernel rounds the same in every module that holds it: the CPU backend's reductions sum
with `reassoc` (LLVM picks the order of the partial sums as it unrolls and vectorises), so
the LLVM pipeline must not depend on the module around a kernel. When modules from 150k
characters were compiled at O2 and smaller ones at O3, a DDP step and its
gradient_as_bucket_view twin (whose module crossed that size once the small GEMM joined it)
gave conv weight gradients 1 ulp apart (tests/test_distributed_bucket_view.py). Here: the
same conv weight gradient and sum, alone in a small module and among ~200 other kernels in
a large one, bit for bit."""

import itertools

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import llvm  # noqa: E402
from graphc.ir import parse  # noqa: E402

# the module size from which graphc compiled at O2 (O3 below): the large module must pass it
FORMER_LARGE_MODULE_CHARS = 150_000
CONV = "kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1"
UNARY = ("exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "sqrt", "log1p")


def _graph(fillers: int):
    """LeNet's first-layer weight gradient (the few-rows direct kernel, reassociable sums per
    tap) and its bias gradient (a reduce_sum), plus `fillers` distinct unary chains whose
    kernels only make the module larger."""
    chains = list(itertools.product(UNARY, repeat=3))[:fillers]
    inputs = "".join(f", %x{i}: f32[64]" for i in range(fillers))
    outputs = "".join(", f32[64]" for _ in range(fillers))
    body = "".join(f"  %a{i}: f32[64] = {a}(%x{i})\n  %b{i}: f32[64] = {b}(%a{i})\n"
                   f"  %c{i}: f32[64] = {c}(%b{i})\n" for i, (a, b, c) in enumerate(chains))
    returns = "".join(f", %c{i}" for i in range(fillers))
    return parse(f'''graph @g(%gy: f32[32,4,8,8], %x: f32[32,1,8,8]{inputs})
        -> (f32[4,1,3,3], f32[4]{outputs}) {{
  %w: f32[4,1,3,3] = conv2d_weight_grad[{CONV}](%gy, %x)
  %s: f32[4] = reduce_sum[axes=(0, 2, 3), keepdim=false](%gy)
{body}  return (%w, %s{returns})
}}''')


def test_a_kernel_gives_the_same_bits_in_a_small_and_a_large_module():
    rng = np.random.default_rng(20261126)
    gy = rng.standard_normal((32, 4, 8, 8)).astype(np.float32)
    x = rng.standard_normal((32, 1, 8, 8)).astype(np.float32)
    small = compile_graph(_graph(0), "cpu")
    large = compile_graph(_graph(200), "cpu")
    sizes = [len(llvm.deduplicated(e.lowered.ir_text)[0]) for e in (small, large)]
    assert sizes[0] < FORMER_LARGE_MODULE_CHARS <= sizes[1], sizes
    fillers = [rng.uniform(0.5, 1.5, 64).astype(np.float32) for _ in range(200)]
    alone = small.run(gy, x)
    among_others = large.run(gy, x, *fillers)
    for name, a, b in zip(("conv2d_weight_grad", "reduce_sum"), alone, among_others[:2]):
        np.testing.assert_array_equal(a, b, err_msg=name)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    reference = np.array([[np.einsum("nohw,nhw->o", gy, padded[:, 0, i:i + 8, j:j + 8])
                           for j in range(3)] for i in range(3)]).transpose(2, 0, 1)
    np.testing.assert_allclose(alone[0][:, 0], reference, rtol=1e-5, atol=1e-5)
