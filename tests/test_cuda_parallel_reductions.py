"""Cooperative reductions of the cuda backend (graphc.backends.cuda.reductions), emulated.

Each case compiles a small graph with backend="cuda" (GRAPHC_CUDA=emu), compares it with the
interpreter (float sums against a float64 reference with tolerances, since the summation order
legitimately differs; arg-reductions, integer and boolean results exactly), and counts the
threads that work on each output from the launch list the lowering records
(`Launch.lanes`): at least 256 wherever the reduced extent allows it, and at least the extent
(rounded up to a warp) where it is shorter. Two runs give the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphc.backends import compile as compile_graph
from graphc.ir import parse

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _compile(text: str):
    from graphc.backends.cuda.lowering import Launch

    ex = compile_graph(parse(text), "cuda")
    launches = [s for s in ex.lowered.steps if isinstance(s, Launch)]
    return ex, launches


def _check(text: str, *arrays, exact: bool = False):
    """Run on cuda and on the interpreter (float64 copies of float inputs for the reference)."""
    ex, launches = _compile(text)
    got = ex.run(*arrays)
    again = ex.run(*arrays)
    for a, b in zip(got, again):
        assert a.tobytes() == b.tobytes(), "two runs differ"
    want = compile_graph(parse(text), "interp").run(*arrays)
    ref = compile_graph(parse(text.replace("f32", "f64")), "interp").run(
        *[a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays])
    for a, b, r in zip(got, want, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        if exact or a.dtype.kind in "ib":
            np.testing.assert_array_equal(a, b)
        else:
            scale = np.nanmax(np.abs(r), initial=0.0)
            np.testing.assert_allclose(a, r, rtol=2e-5, atol=2e-6 * max(scale, 1.0))
    return got, launches


def _lanes(launches) -> int:
    """The threads per output of the widest kernel (pass 1 of a split reduction)."""
    return max(launch.lanes for launch in launches)


def test_row_sum_uses_a_block_per_row(rng):
    x = rng.standard_normal((6, 1000)).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[6,1000]) -> (f32[6]) {
  %0: f32[6] = reduce_sum[axes=(1,), keepdim=false](%x)
  return (%0)
}''', x)
    assert _lanes(launches) >= 256


def test_full_sum_is_split_over_many_blocks(rng):
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[64,1024]) -> (f32[]) {
  %0: f32[] = reduce_mean[axes=(0, 1), keepdim=false](%x)
  return (%0)
}''', x)
    assert len(launches) == 2  # partials per chunk, then the chunks merged in order
    assert launches[0].lanes >= 4 * 256 and launches[0].threads >= 4 * 256


def test_column_and_channel_reductions(rng):
    x = rng.standard_normal((300, 7)).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[300,7]) -> (f32[1,7]) {
  %0: f32[1,7] = reduce_max[axes=(0,), keepdim=true](%x)
  return (%0)
}''', x, exact=True)
    assert _lanes(launches) >= 256
    y = rng.standard_normal((4, 3, 9, 9)).astype(np.float32)
    _, launches = _check('''graph @f(%y: f32[4,3,9,9]) -> (f32[3]) {
  %0: f32[4,3,9,9] = fused[body=(("mul", (0, 0), ()), ("reduce_sum", (1,), (("axes", (0, 2, 3)), ("keepdim", false)))), outputs=(2,)](%y)
  return (%0)
}'''.replace("%0: f32[4,3,9,9]", "%0: f32[3]"), y)  # noqa: E501
    assert _lanes(launches) >= 256


def test_sums_over_the_batch_read_neighbouring_columns(rng):
    """(B, F) summed over B (a bias gradient): 32 neighbouring outputs a block, 8 slices of
    the batch a block, chunks until each output has min(256, B) threads."""
    x = rng.standard_normal((64, 200)).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[64,200]) -> (f32[200]) {
  %0: f32[200] = reduce_sum[axes=(0,), keepdim=false](%x)
  return (%0)
}''', x)
    assert launches[0].lanes == 64 and launches[0].threads == 7 * 8 * 256  # 7 blocks x 8 chunks
    x = rng.standard_normal((600, 40)).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[600,40]) -> (i64[40], f32[40]) {
  %0: i64[40] = argmin[axis=0, keepdim=false](%x)
  %1: f32[40] = reduce_max[axes=(0,), keepdim=false](%x)
  return (%0, %1)
}''', x)
    # pass 1 (32 chunks x 8 slices per output), then pass 2 merging the 32 chunks in order
    assert [launch.lanes for launch in launches] == [256, 32, 256, 32]


def test_short_rows_share_a_block(rng):
    x = rng.standard_normal((50, 10)).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[50,10]) -> (f32[50]) {
  %0: f32[50] = reduce_min[axes=(1,), keepdim=false](%x)
  return (%0)
}''', x, exact=True)
    assert _lanes(launches) == 32  # a warp per row of 10: 8 rows per 256-thread block
    assert launches[0].threads == -(-50 * 32 // 256) * 256


def test_integer_and_boolean_reductions(rng):
    x = rng.integers(-50, 50, (5, 600))
    b = rng.random((5, 600)) < 0.001
    _check('''graph @f(%x: i64[5,600], %b: bool[5,600]) -> (i64[5], i64[600], bool[5], bool[600]) {
  %0: i64[5] = reduce_sum[axes=(1,), keepdim=false](%x)
  %1: i64[600] = reduce_max[axes=(0,), keepdim=false](%x)
  %2: bool[5] = reduce_max[axes=(1,), keepdim=false](%b)
  %3: bool[600] = reduce_min[axes=(0,), keepdim=false](%b)
  return (%0, %1, %2, %3)
}''', x, b)


def test_nan_propagates_through_max_and_sum(rng):
    x = rng.standard_normal((3, 700)).astype(np.float32)
    x[1, 650] = np.nan
    got, _ = _check('''graph @f(%x: f32[3,700]) -> (f32[3], f32[3]) {
  %0: f32[3] = reduce_max[axes=(1,), keepdim=false](%x)
  %1: f32[3] = reduce_sum[axes=(1,), keepdim=false](%x)
  return (%0, %1)
}''', x)
    assert np.isnan(got[0][1]) and np.isnan(got[1][1]) and not np.isnan(got[0][0])


@pytest.mark.parametrize("shape,dim", [((4, 3000), 1), ((2, 40000), 1), ((3, 500, 4), 1),
                                       ((8, 10), 1)])
def test_softmax_and_log_softmax(rng, shape, dim):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    s = ",".join(map(str, shape))
    _, launches = _check(f'''graph @f(%x: f32[{s}]) -> (f32[{s}], f32[{s}]) {{
  %0: f32[{s}] = fused[body=(("neg", (0,), ()), ("softmax", (1,), (("dim", {dim}),))), outputs=(2,)](%x)
  %1: f32[{s}] = log_softmax[dim={dim}](%x)
  return (%0, %1)
}}''', x)  # noqa: E501
    assert _lanes(launches) >= min(256, max(32, shape[dim]))
    if shape == (2, 40000):  # few long rows: split, merged per row, then written
        assert _lanes(launches) > 256


def test_softmax_reads_each_element_a_fixed_number_of_times(rng):
    """O(n): the generated text has one loop over the row to reduce and one to write."""
    ex, _ = _compile('''graph @f(%x: f32[4,5000,2]) -> (f32[4,5000,2]) {
  %0: f32[4,5000,2] = fused[body=(("exp", (0,), ()), ("softmax", (1,), (("dim", 1),))), outputs=(2,)](%x)
  return (%0)
}''')  # noqa: E501
    source = ex.lowered.source
    assert source.count("for (long long r = ") + source.count("for (long long t = ") <= 3


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_argmax_argmin(rng, axis):
    x = rng.standard_normal((40, 900)).astype(np.float32)
    x[3, 17] = x[3, 800] = 9.0  # ties: the first wins
    x[7, 5] = np.nan
    ax = "none" if axis is None else axis
    shape = {None: "", 0: "900", 1: "40"}[axis]
    _, launches = _check(f'''graph @f(%x: f32[40,900]) -> (i64[{shape}], i64[{shape}]) {{
  %0: i64[{shape}] = argmax[axis={ax}, keepdim=false](%x)
  %1: i64[{shape}] = argmin[axis={ax}, keepdim=false](%x)
  return (%0, %1)
}}''', x)
    assert _lanes(launches) >= (256 if axis != 0 else 40)  # axis 0: the extent, 40


def test_nll_loss_over_many_targets(rng):
    n, c = 5000, 7
    x = rng.standard_normal((n, c)).astype(np.float32)
    t = rng.integers(0, c, n)
    t[::13] = -100
    w = rng.random(c).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        out = "f32[]" if reduction != "none" else f"f32[{n}]"
        _, launches = _check(f'''graph @f(%x: f32[{n},{c}], %t: i64[{n}], %w: f32[{c}]) -> ({out}, f32[]) {{
  %0: {out}, %1: f32[] = nll_loss[ignore_index=-100, reduction="{reduction}"](%x, %t, %w)
  return (%0, %1)
}}''', x, t, w)  # noqa: E501
        assert _lanes(launches) >= 256


def test_nll_loss_bad_target_is_reported(rng):
    from graphc.errors import IndexOutOfRangeError

    ex, _ = _compile('''graph @f(%x: f32[4,3], %t: i64[4], %w: f32[3]) -> (f32[], f32[]) {
  %0: f32[], %1: f32[] = nll_loss[ignore_index=-100, reduction="mean"](%x, %t, %w)
  return (%0, %1)
}''')
    x, w = np.zeros((4, 3), np.float32), np.ones(3, np.float32)
    ex.run(x, np.array([0, 1, 2, -100]), w)
    with pytest.raises(IndexOutOfRangeError, match="nll_loss: a target is out of bounds"):
        ex.run(x, np.array([0, 3, 2, 1]), w)


def test_elementwise_kernels_stay_one_thread_per_element(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    _, launches = _check('''graph @f(%x: f32[1000]) -> (f32[1000]) {
  %0: f32[1000] = tanh(%x)
  return (%0)
}''', x)
    assert [(launch.threads, launch.lanes) for launch in launches] == [(1000, 1)]


def test_conv_batch_norm_training_step_has_no_serial_reduction(rng):
    """Every reduction of a conv + batch-norm + linear training step (forward, backward,
    update) runs on a segment of threads: the batch-norm and conv-bias gradients (sums over
    N, H, W of 4 x 8 x 8 = 256 elements) on 256 threads per channel; no kernel with one
    thread per output walks a reduced extent."""
    import graphc
    from graphc import nn
    from graphc.backends.cuda.lowering import Launch
    from tests.conftest import sgd_training_step

    _, step = sgd_training_step(lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10)))
    step = graphc.compile(step, backend="cuda")
    x = graphc.tensor(rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 10, 4))
    for _ in range(2):  # the first call of a signature may run eagerly
        step(x, y)
    lowered = step.executable.lowered
    launches = [s for s in lowered.steps if isinstance(s, Launch)]
    cooperative = [launch for launch in launches if launch.lanes > 1]
    assert cooperative and min(launch.lanes for launch in cooperative) >= 32
    assert max(launch.lanes for launch in cooperative) >= 256
    kernels = lowered.source.split('extern "C" __global__ void ')[1:]
    for launch in launches:
        (text,) = [k for k in kernels if k.startswith(launch.function + "(")]
        if launch.lanes == 1:  # elementwise: no loop over a reduced extent
            assert "for (long long r" not in text, launch.function


def test_batch_norm_training_statistics_split_over_the_batch(rng):
    """3 channels of 2 x 40 x 40: the mean and variance passes run >= 256 threads per channel
    (split over N * H * W), not one block per channel."""
    x = (rng.standard_normal((2, 3, 40, 40)) * 3 + 5).astype(np.float32)
    w, b = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    _, launches = _check('''graph @f(%x: f32[2,3,40,40], %w: f32[3], %b: f32[3], %rm: f32[3], %rv: f32[3]) -> (f32[2,3,40,40], f32[3], f32[3]) {
  %0: f32[2,3,40,40], %1: f32[3], %2: f32[3] = batch_norm[training=true, eps=1e-05](%x, %w, %b, %rm, %rv)
  return (%0, %1, %2)
}''', x, w, b, rm, rv)  # noqa: E501
    assert _lanes(launches) >= 256


def _channel_gradient_reductions(ex) -> dict[str, int]:
    """node text -> the most threads per output among its kernels, for every node whose
    result is a sum over (N, H, W) of an NCHW tensor: the batch-norm weight and bias
    gradients and the conv bias gradient (autodiff's `_sum(g, (0, 2, 3))`), fused with the
    elementwise work before them or alone."""
    from graphc.backends.cuda.lowering import Launch
    from graphc.ir.printer import format_node
    from graphc.ops.fused import FusedBody

    found: dict[str, int] = {}
    for k, step in enumerate(ex.lowered.steps):
        node = ex.node_of_step(k)
        if node is None or node.op not in ("fused", "reduce_sum"):
            continue
        op, _, attrs = FusedBody.of_node(node).instructions[-1] if node.op == "fused" else \
            (node.op, (), node.attrs)
        if op != "reduce_sum" or tuple(attrs["axes"]) != (0, 2, 3):
            continue
        lanes = step.lanes if isinstance(step, Launch) else 256  # a library call: a block
        text = format_node(node).strip()
        found[text] = max(found.get(text, 0), lanes)
    return found


@pytest.mark.parametrize("shape", [(4, 3, 8, 8), (8, 3, 16, 16)])
def test_batch_norm_and_conv_bias_gradients_match_the_interpreter(rng, shape):
    """Issue 18, finding 1: the batch-norm weight/bias gradients and the conv bias gradient of
    a Conv2d + BatchNorm2d training step are sums over N, H, W that autodiff writes as
    reduce_sum and fusion merges with the elementwise backward (relu's mask, the batch-norm
    input gradient), so no library call can take them whole; each runs as a cooperative
    reduction with >= 256 threads per channel (N*H*W >= 256 here), and three steps give the
    interpreter's parameters and gradients within float32 summation tolerance."""
    import graphc
    from graphc import nn
    from tests.conftest import sgd_training_step

    def model():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Flatten(), nn.Linear(8 * shape[2] * shape[3], 5))

    (net, step), (ref_net, ref_step) = sgd_training_step(model), sgd_training_step(model)
    step, ref_step = graphc.compile(step, backend="cuda"), graphc.compile(ref_step,
                                                                          backend="interp")
    for _ in range(3):
        x = graphc.tensor(rng.standard_normal(shape).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 5, shape[0]))
        np.testing.assert_allclose(step(x, y).numpy(), ref_step(x, y).numpy(), rtol=1e-5)
    # the conv bias gradient is zero up to rounding (batch norm removes the channel mean):
    # gradients are compared against the largest one, as float32 sums of this size round
    scale = max(float(np.abs(q.grad.numpy()).max()) for q in ref_net.parameters())
    for (name, p), q in zip(net.named_parameters(), ref_net.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4,
                                   atol=1e-6 * scale, err_msg=f"{name}.grad")
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    reductions = _channel_gradient_reductions(step.executable)
    assert len(reductions) >= 3, reductions  # batch-norm weight, bias; conv bias
    assert min(reductions.values()) >= 256, reductions


@pytest.mark.parametrize("shape, axes", [((4, 3, 5, 5), (0, 2, 3)), ((2, 3, 40, 40), (0, 2, 3)),
                                         ((300, 64), (0,)), ((5, 700), (1,))])
def test_an_intermediate_of_a_reduce_group_is_stored_by_the_reduction(rng, shape, axes):
    """where(mask, g, 0) returned and summed (a relu gradient and its batch-norm bias
    gradient): the fused group's first reduction pass stores the intermediate (no kernel of
    its own reads the inputs again), in the segment and column layouts, split or not."""
    from graphc.ops.fused import FusedBody
    from graphc.passes.fuse import fuse

    t = ",".join(map(str, shape))
    r = ",".join(str(n) for d, n in enumerate(shape) if d not in axes)
    text = f'''graph @f(%g: f32[{t}], %y: f32[{t}]) -> (f32[{t}], f32[{r}]) {{
  %z: f32[] = full[shape=(), value=0.0, dtype="float32"]()
  %m: bool[{t}] = gt(%y, %z)
  %0: f32[{t}] = where(%m, %g, %z)
  %1: f32[{r}] = reduce_sum[axes={axes}, keepdim=false](%0)
  return (%0, %1)
}}'''
    graph = fuse(parse(text))
    (node,) = [n for n in graph.nodes if n.op == "fused"]
    assert len(node.outputs) == 2 and FusedBody.of_node(node).ending is not None
    g, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    ex = compile_graph(graph, "cuda")
    got = ex.run(g, y)
    want = np.where(y > 0, g, 0)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_allclose(got[1], want.astype(np.float64).sum(axis=axes), rtol=1e-5,
                               atol=1e-5)
    from graphc.backends.cuda.lowering import Launch

    launches = [s for s in ex.lowered.steps if isinstance(s, Launch)]
    assert all(launch.lanes > 1 for launch in launches)  # no elementwise kernel of its own
    assert len(launches) <= 2  # one pass, or two when split


def _bn_backward_sums(shape) -> str:
    """sum(g) and sum(g * x-hat) of a batch-norm backward, g = where(y > 0, dy, 0): two
    fused reduce groups, the second reading the first's intermediate g."""
    t = ",".join(map(str, shape))
    c = f"f32[1,{shape[1]},1,1]"
    return f'''graph @f(%dy: f32[{t}], %y: f32[{t}], %x: f32[{t}], %m: {c}, %s: {c}) -> (f32[{t}], f32[{shape[1]}], f32[{t}], f32[{shape[1]}]) {{
  %z: f32[] = full[shape=(), value=0.0, dtype="float32"]()
  %k: bool[{t}] = gt(%y, %z)
  %g: f32[{t}] = where(%k, %dy, %z)
  %gb: f32[{shape[1]}] = reduce_sum[axes=(0, 2, 3), keepdim=false](%g)
  %c: f32[{t}] = sub(%x, %m)
  %h: f32[{t}] = mul(%c, %s)
  %p: f32[{t}] = mul(%g, %h)
  %gw: f32[{shape[1]}] = reduce_sum[axes=(0, 2, 3), keepdim=false](%p)
  return (%g, %gb, %h, %gw)
}}'''  # noqa: E501


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 3, 40, 40)])
def test_sibling_reductions_share_one_kernel(rng, shape):
    """A batch-norm backward's two channel sums run in one cooperative kernel (one pass, or
    two when split), the second reading g from the first's registers; both stored
    intermediates and both sums match numpy."""
    from graphc.backends.cuda.lowering import Launch
    from graphc.passes.fuse import fuse

    graph = fuse(parse(_bn_backward_sums(shape)))
    assert len([n for n in graph.nodes if n.op == "fused"]) == 2
    dy, y, x = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    m, s = (rng.standard_normal((1, shape[1], 1, 1)).astype(np.float32) for _ in range(2))
    ex = compile_graph(graph, "cuda")
    g, gb, h, gw = ex.run(dy, y, x, m, s)
    want_g = np.where(y > 0, dy, 0)
    want_h = (x - m) * s
    np.testing.assert_array_equal(g, want_g)
    np.testing.assert_allclose(h, want_h, rtol=1e-6, atol=1e-6)
    axes = (0, 2, 3)
    g64, h64 = want_g.astype(np.float64), want_h.astype(np.float64)
    np.testing.assert_allclose(gb, g64.sum(axis=axes), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, (g64 * h64).sum(axis=axes), rtol=1e-5, atol=1e-5)
    launches = [(k, st) for k, st in enumerate(ex.lowered.steps) if isinstance(st, Launch)]
    assert len(launches) <= 2
    assert all(len(ex.lowered.step_nodes[k]) == 2 for k, _ in launches)
