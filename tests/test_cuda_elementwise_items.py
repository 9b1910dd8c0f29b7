"""Large elementwise kernels of the cuda backend run several items per thread with
`__restrict__` parameters (graphc.backends.cuda.cudagen.ITEMS), on the emulation (or the GPU
with GRAPHC_TEST_ON_GPU=1). Covers: results equal to numpy with a partial last block, a
broadcast operand, an in-place update; small kernels keep one item per thread; the
disjointness check that decides `__restrict__` (a write overlapping another parameter's bytes,
or a pointer reached without a known span, keeps one item per thread)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.backends.cuda import cudagen
from graphc.backends.cuda.lowering import KernelText, Launch, Layout, contiguous_strides
from graphc.types import TensorType, float32

N = cudagen.ITEMS_FROM + 77  # a partial last block


pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _launches(compiled) -> list[Launch]:
    return [s for s in compiled.executable.lowered.steps if isinstance(s, Launch)]


def test_a_large_chain_runs_four_items_a_thread_and_matches_numpy(rng):
    x = rng.standard_normal(N).astype(np.float32)
    f = graphc.compile(lambda v: graphc.tanh(v * 0.5 + 1) * graphc.sigmoid(v)
                       + graphc.relu(v - 0.1), backend="cuda")
    got = f(graphc.tensor(x)).numpy()
    x64 = x.astype(np.float64)
    want = np.tanh(x64 * 0.5 + 1) / (1 + np.exp(-x64)) + np.maximum(x64 - 0.1, 0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
    assert [launch.items for launch in _launches(f)] == [cudagen.ITEMS]
    assert "__restrict__" in f.executable.lowered.source


def test_broadcast_operand_and_small_kernels(rng):
    x = rng.standard_normal((N // 64, 64)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    f = graphc.compile(lambda u, v: u * v + 1, backend="cuda")
    # on a GPU nvcc contracts u * v + 1 into one fma: compare with float64 (one rounding)
    want = x.astype(np.float64) * b + 1
    np.testing.assert_allclose(f(graphc.tensor(x), graphc.tensor(b)).numpy(), want,
                               rtol=1e-6, atol=5e-7)
    assert [launch.items for launch in _launches(f)] == [cudagen.ITEMS]
    small = graphc.compile(lambda u: u * 2, backend="cuda")
    np.testing.assert_array_equal(small(graphc.tensor(x[:3])).numpy(), x[:3] * 2)
    assert [launch.items for launch in _launches(small)] == [1]


def test_in_place_update_of_a_large_tensor(rng):
    x = rng.standard_normal(N).astype(np.float32)
    t = graphc.tensor(x.copy())

    def bump(v):
        v.mul_(3).add_(1)

    f = graphc.compile(bump, backend="cuda")
    once = x.astype(np.float64) * 3 + 1  # float64: a GPU fuses the two into one fma
    f(t)
    np.testing.assert_allclose(t.numpy(), once, rtol=1e-6, atol=5e-7)
    f(t)
    np.testing.assert_allclose(t.numpy(), once * 3 + 1, rtol=1e-6, atol=2e-6)


def _layout(offset: int, n: int) -> Layout:
    return Layout(offset, contiguous_strides((n,)), TensorType((n,), float32))


def test_disjointness_decides_restrict():
    k = KernelText("k", 1 << 22)
    k.read(_layout(0, 100), ["gi"], (100,))
    k.read(_layout(200, 100), ["gi"], (100,))  # reads may overlap nothing or each other
    k.at(_layout(1000, 100), ["gi"])
    assert k.disjoint()
    k.at(_layout(396, 10), ["gi"])  # writes bytes 396..436, which parameter 2 reads
    assert not k.disjoint()
    raw = KernelText("r", 1 << 22)
    raw.read(_layout(0, 100), ["gi"], (100,))
    raw.ptr(4096)  # a word reached without a span (an error flag, a scratch buffer)
    assert not raw.disjoint()


def test_whole_blocks_issue_every_items_loads_first():
    body = ["long long c0 = gi;", "float a0 = ((float *)p0)[c0];",
            "float v1 = (a0 * a0);", "((float *)p1)[c0] = v1;"]
    text = cudagen.Kernel("k", 1 << 22, 2, body, items=4).text()
    whole = text[text.index("if (g0"):text.index("return;")]
    loads = [whole.index(f"float a0_{j} = ((float *)p0)[c0_{j}];") for j in range(4)]
    stores = [whole.index(f"((float *)p1)[c0_{j}] = v1_{j};") for j in range(4)]
    assert max(loads) < min(stores)
    assert "for (int item = 0; item < 4; ++item)" in text  # the last block: checked items
    # a body that is not flat declarations and stores keeps one scope per item
    braced = body[:2] + ["if (a0 > 0) { a0 = 0; }"] + body[2:]
    assert cudagen._phases(braced, 4) is None
    assert "{ long long gi = g0 + 3LL * blockDim.x;" in cudagen.Kernel(
        "k", 1 << 22, 2, braced, items=4).text()
