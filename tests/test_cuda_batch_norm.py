"""batch_norm in training mode on the cuda backend (graphc.backends.cuda.ops
`_batch_norm_train`), emulated: one shifted pass of statistics (sums of d and d * d, d = x
minus a value of the channel, in double), then one elementwise pass. Covers: y, the saved
mean and invstd within float32 rounding of a float64 reference on channels whose mean is
10^6 standard deviations from zero (unshifted sums of squares
would cancel 12 digits) and on a channel whose shift value is its outlier; the
launch count (two kernels a batch norm, three when the statistics split over the batch); the
elementwise pass reads only x and a per-channel table (several items a thread when large)."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.backends import compile as compile_graph
from graphc.backends.cuda import cudagen
from graphc.backends.cuda.lowering import Launch
from graphc.ir import parse

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _graph(shape) -> str:
    t = f"f32[{','.join(map(str, shape))}]"
    c = f"f32[{shape[1]}]"
    return f'''graph @f(%x: {t}, %w: {c}, %b: {c}, %rm: {c}, %rv: {c}) -> ({t}, {c}, {c}) {{
  %0: {t}, %1: {c}, %2: {c} = batch_norm[training=true, eps=1e-05](%x, %w, %b, %rm, %rv)
  return (%0, %1, %2)
}}'''


def _reference(x, w, b, eps=1e-5):
    x64 = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    mean = x64.mean(axis=axes)
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    var = ((x64 - mean.reshape(bshape)) ** 2).mean(axis=axes)
    invstd = 1 / np.sqrt(var + eps)
    y = (x64 - mean.reshape(bshape)) * (invstd * w).reshape(bshape) + b.reshape(bshape)
    return y, mean, invstd


def _run(x, rng):
    c = x.shape[1]
    w = rng.standard_normal(c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    ex = compile_graph(parse(_graph(x.shape)), "cuda")
    got = ex.run(x, w, b, np.zeros(c, np.float32), np.ones(c, np.float32))
    return ex, got, _reference(x, w, b)


def _assert_float32_close(got, want):
    for g, r in zip(got, want):
        # one float32 rounding of each result, a few more of its inputs' products
        np.testing.assert_allclose(g, r, rtol=4e-7 * 8, atol=1e-6 * np.abs(r).max())


@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (2, 3, 40, 40), (8, 64, 2, 2)])
def test_statistics_and_output_match_float64_far_from_zero(rng, shape):
    x = (1e6 + rng.standard_normal(shape)).astype(np.float32)  # mean 10^6 std from 0
    _, got, want = _run(x, rng)
    _assert_float32_close(got, want)


def test_a_channel_whose_shift_value_is_its_outlier(rng):
    x = rng.standard_normal((4, 2, 6, 6)).astype(np.float32)
    x[0, 1, 0, 0] = 3e3  # the value the statistics are shifted by, far from the rest
    x[:, 0] = 7.0  # and a constant channel: variance 0
    _, got, want = _run(x, rng)
    _assert_float32_close(got, want)


def test_two_kernels_a_batch_norm_three_when_split(rng):
    ex, _, _ = _run(rng.standard_normal((4, 8, 5, 5)).astype(np.float32), rng)
    assert len([s for s in ex.lowered.steps if isinstance(s, Launch)]) == 2
    ex, _, _ = _run(rng.standard_normal((2, 3, 40, 40)).astype(np.float32), rng)
    launches = [s for s in ex.lowered.steps if isinstance(s, Launch)]
    assert len(launches) == 3 and launches[0].lanes >= 256


def test_the_elementwise_pass_runs_items_when_large(rng):
    n = -(-cudagen.ITEMS_FROM // (3 * 64)) + 1
    ex, got, want = _run(rng.standard_normal((n, 3, 8, 8)).astype(np.float32), rng)
    _assert_float32_close(got, want)
    assert ex.lowered.steps[-1].items == cudagen.ITEMS


def _bn_relu_graph(shape, also_return_y: bool = False, source: str = "%x") -> str:
    t, c = f"f32[{','.join(map(str, shape))}]", f"f32[{shape[1]}]"
    pre = "  %s: " + t + " = exp(%x)\n" if source != "%x" else ""
    outs = f"{t}, {t}" if also_return_y else t
    ret = "%r, %0" if also_return_y else "%r"
    return f'''graph @f(%x: {t}, %w: {c}, %b: {c}, %rm: {c}, %rv: {c}) -> ({outs}) {{
{pre}  %0: {t}, %1: {c}, %2: {c} = batch_norm[training=true, eps=1e-05]({source}, %w, %b, %rm, %rv)
  %r: {t} = relu(%0)
  return ({ret})
}}'''


@pytest.mark.parametrize("also_return_y, launches", [(False, 2), (True, 3)])
def test_an_output_read_by_one_elementwise_node_is_computed_there(rng, also_return_y,
                                                                   launches):
    """y of a batch norm read only by a relu is not stored: the relu reads x and the
    per-channel table (two launches, not three); returned, y is stored as before."""
    shape = (4, 3, 6, 6)
    x = rng.standard_normal(shape).astype(np.float32)
    w, b = (rng.standard_normal(3).astype(np.float32) for _ in range(2))
    ex = compile_graph(parse(_bn_relu_graph(shape, also_return_y)), "cuda")
    got = ex.run(x, w, b, np.zeros(3, np.float32), np.ones(3, np.float32))
    y = _reference(x, w, b)[0]
    _assert_float32_close([got[0]], [np.maximum(y, 0)])
    if also_return_y:
        _assert_float32_close([got[1]], [y])
    assert len([s for s in ex.lowered.steps if isinstance(s, Launch)]) == launches


def test_a_source_freed_at_the_batch_norm_still_gives_the_right_output(rng):
    """x = exp(input) dies at the batch norm in the plan: the relu may compute y from x only
    where x's buffer outlives it (graphc.backends.cuda.lowering.Lowerer.live_until)."""
    shape = (2, 3, 5, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    w, b = (rng.standard_normal(3).astype(np.float32) for _ in range(2))
    ex = compile_graph(parse(_bn_relu_graph(shape, source="%s")), "cuda")
    (got,) = ex.run(x, w, b, np.zeros(3, np.float32), np.ones(3, np.float32))
    _assert_float32_close([got], [np.maximum(_reference(np.exp(x.astype(np.float64)), w, b)[0],
                                             0)])
    # here the plan frees x's buffer at the batch norm: y is stored (exp, statistics, y, relu)
    assert ex.memory_plan.buffers["s"].end == 1
    assert len([s for s in ex.lowered.steps if isinstance(s, Launch)]) == 4


def test_two_batch_norms_feeding_one_residual_add(rng):
    """A residual block's end: relu(bn(a) + bn(b)), both outputs computed in the add."""
    shape = (2, 4, 3, 3)
    t, c = f"f32[{','.join(map(str, shape))}]", "f32[4]"
    text = f'''graph @f(%a: {t}, %x: {t}, %w: {c}, %b: {c}, %rm: {c}, %rv: {c}) -> ({t}) {{
  %0: {t}, %1: {c}, %2: {c} = batch_norm[training=true, eps=1e-05](%a, %w, %b, %rm, %rv)
  %3: {t}, %4: {c}, %5: {c} = batch_norm[training=true, eps=1e-05](%x, %w, %b, %rm, %rv)
  %6: {t} = fused[body=(("add", (0, 1), ()), ("relu", (2,), ())), outputs=(3,)](%0, %3)
  return (%6)
}}'''
    a, x = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    ex = compile_graph(parse(text), "cuda")
    (got,) = ex.run(a, x, w, b, np.zeros(4, np.float32), np.ones(4, np.float32))
    want = np.maximum(_reference(a, w, b)[0] + _reference(x, w, b)[0], 0)
    _assert_float32_close([got], [want])
    assert len([s for s in ex.lowered.steps if isinstance(s, Launch)]) == 3


@pytest.mark.parametrize("shape, launches", [((4, 3, 5, 5), 3), ((2, 3, 40, 40), 4)])
def test_running_statistics_are_updated_by_the_statistics_kernel(rng, shape, launches):
    """BatchNorm2d in training: the running mean and variance updates (nodes reading the
    batch norm's mean and invstd) run in its statistics kernel's finish; after two compiled
    steps the buffers equal eager graphc's within float32 rounding, and the step has no
    kernel of their own."""
    import graphc
    from graphc import nn

    eager, compiled_bn = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    fn = graphc.compile(lambda v: compiled_bn(v) * 2, backend="cuda")
    for _ in range(2):
        x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
        fn(graphc.tensor(x))
        eager(graphc.tensor(x))
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(compiled_bn, name).numpy(),
                                   getattr(eager, name).numpy(), rtol=2e-6, atol=1e-7)
    assert int(compiled_bn.num_batches_tracked.numpy()) == 2
    ex = fn.executable
    names = {n.op for k, s in enumerate(ex.lowered.steps) for n in ex.lowered.step_nodes[k]}
    assert "batch_norm" in names
    # the statistics' last pass serves the batch norm and both running updates
    last = max(k for k, s in enumerate(ex.lowered.steps)
               if any(n.op == "batch_norm" for n in ex.lowered.step_nodes[k]) and s.lanes > 1)
    assert len(ex.lowered.step_nodes[last]) == 3
    # num_batches_tracked + 1, the statistics (two passes when split), the output and its
    # * 2 (one kernel: y is inlined)
    found = [s.function for s in ex.lowered.steps if isinstance(s, Launch)]
    assert len(found) == launches, found
