"""fuse_batch_norm_backward (graphc.passes.batch_norm_backward), the `batch_norm_relu_backward`
op (graphc.ops.batch_norm_relu) and its cpu lowering (graphc.backends.cpu.batch_norm_backward):
a batch norm's training backward after a ReLU (and a residual's gradient added), two fused
nodes after the row passes, becomes one node whose kernel walks blocks of channels twice.

The kernel sums in float64 and takes the per-channel factors out of the element loop, so its
results are judged by their distance from a float64 run (docs/performance.md, Rounding:
within 2x eager graphc's); the op's reference kernel (the interpreter) gives the replaced
nodes' bits."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc import nn  # noqa: E402
from graphc.backends.cpu import batch_norm_backward as kernel_module  # noqa: E402
from graphc.backends.cpu import pool, prefetch, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.errors import ShapeError  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes import batch_norm_backward as module  # noqa: E402
from graphc.passes.batch_norm_backward import fuse_batch_norm_backward  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.conftest import pass_training_steps  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()

SUMS_RELU = ('{zero}, ("where", (0, 1, 5), ()), {zero}, ("where", (0, 1, 7), ()), '
             '("sub", (2, 3), ()), ("mul", (9, 4), ()), ("mul", (8, 10), ()), {sum6}, {sum11}'
             '), outputs=(12, 13)](%p, %dy, %x, %mr, %ir)')
SUMS_RESIDUAL = ('("add", (0, 1), ()), {zero}, ("where", (2, 6, 7), ()), ("sub", (3, 4), ()), '
                 '("mul", (9, 5), ()), ("mul", (8, 10), ()), {sum8}, {sum11}), '
                 'outputs=(8, 12, 13)](%dy, %dr, %p, %x, %mr, %ir)')
APPLY_RELU = ('("sub", (6, 7), ()), ("mul", (8, 1), ()), {zero}, ("where", (4, 5, 10), ()), '
              '("mul", (0, 1), ()), {count}, ("div", (2, 13), ()), ("sub", (11, 14), ()), '
              '("mul", (9, 3), ()), ("div", (16, 13), ()), ("sub", (15, 17), ()), '
              '("mul", (12, 18), ())), outputs=(19,)](%wr, %ir, %sgr, %sgxr, %p, %dy, %x, %mr)')
APPLY_RESIDUAL = ('("sub", (5, 6), ()), ("mul", (7, 1), ()), ("mul", (0, 1), ()), {count}, '
                  '("div", (2, 10), ()), ("sub", (3, 11), ()), ("mul", (8, 4), ()), '
                  '("div", (13, 10), ()), ("sub", (12, 14), ()), ("mul", (9, 15), ())), '
                  'outputs=(16,)](%wr, %ir, %sgr, %g, %sgxr, %x, %mr)')


def backward_graph(shape=(4, 3, 5, 6), residual=False, dtype="f32", count=None) -> str:
    """The backward of relu(batch_norm(x) [+ r]) as the cpu pipeline's row passes leave it:
    the sums node, then the apply node (with `residual`, the sums node adds dr and writes g,
    which the graph returns: a shortcut reads it)."""
    name = "float32" if dtype == "f32" else "float64"
    t, c = f"{dtype}[{','.join(map(str, shape))}]", f"{dtype}[{shape[1]}]"
    channel = (shape[1],) + (1,) * (len(shape) - 2)
    ct = f"{dtype}[{','.join(map(str, channel))}]"
    m = float(np.prod(shape) // shape[1]) if count is None else count
    zero = f'("full", (), (("shape", {tuple(shape)}), ("value", 0.0), ("dtype", "{name}")))'
    axes = (0,) + tuple(range(2, len(shape)))

    def total(ref):
        return f'("reduce_sum", ({ref},), (("axes", {axes}), ("keepdim", false)))'

    fill = {"zero": zero, "count": f'("full", (), (("shape", ()), ("value", {m}), ("dtype", '
                                    f'"{name}")))',
            "sum6": total(6), "sum8": total(8), "sum11": total(11)}
    reshape = f"reshape[shape={channel}]"
    if residual:
        sums = f"%g: {t}, %sg: {c}, %sgx: {c} = fused[body=(" + SUMS_RESIDUAL.format(**fill)
        apply = APPLY_RESIDUAL.format(**fill)
    else:
        sums = f"%sg: {c}, %sgx: {c} = fused[body=(" + SUMS_RELU.format(**fill)
        apply = APPLY_RELU.format(**fill)
    extra_in = f", %dr: {t}" if residual else ""
    extra_out, extra_type = (", %g", f", {t}") if residual else ("", "")
    return f"""graph @f(%dy: {t}, %p: bool{t[len(dtype):]}, %x: {t}, %w: {c}, %mean: {c}, %invstd: {c}{extra_in}) -> ({t}, {c}, {c}{extra_type}) {{
  %mr: {ct} = {reshape}(%mean)
  %ir: {ct} = {reshape}(%invstd)
  {sums}
  %wr: {ct} = {reshape}(%w)
  %sgr: {ct} = {reshape}(%sg)
  %sgxr: {ct} = {reshape}(%sgx)
  %dx: {t} = fused[body=({apply}
  return (%dx, %sgx, %sg{extra_out})
}}"""  # noqa: E501


def backward_inputs(shape, residual=False, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    axes = (0,) + tuple(range(2, len(shape)))
    x = 3.0 + 2.0 * rng.standard_normal(shape)
    mean = x.astype(dtype).astype(np.float64).mean(axis=axes)
    invstd = 1.0 / np.sqrt(x.astype(dtype).astype(np.float64).var(axis=axes) + 1e-5)
    dy = rng.standard_normal(shape)
    dy.flat[::13] = np.nan  # where the mask is False a NaN gradient gives 0
    positive = rng.random(shape) < 0.6
    positive.flat[::13] = False
    arrays = [dy.astype(dtype), positive, x.astype(dtype), rng.uniform(0.5, 2, c).astype(dtype),
              mean.astype(dtype), invstd.astype(dtype)]
    if residual:
        arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


@pytest.fixture(autouse=True)
def _pass_on(monkeypatch):
    """The pass is off by default (its FUSE: it did not pay in the step); these tests run it."""
    monkeypatch.setattr(module, "FUSE", True)


def _compiled(graph, count: int = 1):
    graph = parse(str(graph))
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe


def _assert_same_bits(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))


def test_the_pass_writes_one_node_at_the_sums_place():
    out = fuse_batch_norm_backward(parse(backward_graph(residual=True)))
    assert str(out) == """graph @f(%dy: f32[4,3,5,6], %p: bool[4,3,5,6], %x: f32[4,3,5,6], %w: f32[3], %mean: f32[3], %invstd: f32[3], %dr: f32[4,3,5,6]) -> (f32[4,3,5,6], f32[3], f32[3], f32[4,3,5,6]) {
  %dx: f32[4,3,5,6], %sgx: f32[3], %sg: f32[3], %g: f32[4,3,5,6] = batch_norm_relu_backward[relu_grad=true](%dy, %p, %x, %w, %mean, %invstd, %dr)
  return (%dx, %sgx, %sg, %g)
}"""  # noqa: E501
    assert parse(str(out)) == out
    relu = fuse_batch_norm_backward(parse(backward_graph()))
    assert [(n.op, n.attrs, len(n.inputs)) for n in relu.nodes] == [
        ("batch_norm_relu_backward", {"relu_grad": False}, 6)]


@pytest.mark.parametrize("case,swap", [
    ({"count": 7.0}, None),  # not the reduced element count: not batch norm's VJP
    ({}, ("%p, %dy, %x, %mr)", "%p, %dy, %dy, %mr)")),  # the apply centres another tensor
    ({}, ("%p, %dy, %x, %mr)", "%p, %x, %x, %mr)")),  # ... or masks another gradient
])
def test_what_is_not_the_backward_stays_apart(case, swap):
    text = backward_graph(**case)
    graph = parse(text if swap is None else text.replace(*swap))
    assert fuse_batch_norm_backward(graph) is graph


def test_the_op_refuses_mismatched_inputs():
    from graphc.ops.registry import REGISTRY
    from graphc.types import TensorType, bool_, float32

    t, c = TensorType((2, 3, 4, 4), float32), TensorType((3,), float32)
    with pytest.raises(ShapeError, match="batch_norm_relu_backward: expected.*positive"):
        REGISTRY["batch_norm_relu_backward"].infer(t, t, t, c, c, c, relu_grad=False)
    assert REGISTRY["batch_norm_relu_backward"].infer(
        t, TensorType(t.shape, bool_), t, c, c, c, t, relu_grad=True) == (t, c, c, t)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape,dtype", [((4, 3, 5, 6), "f32"), ((3, 4, 9), "f32"),
                                         ((6, 5), "f32"), ((32, 8, 4, 4), "f32"),
                                         ((2, 3, 4, 5), "f64")])
def test_the_kernel_is_within_twice_eager_rounding_of_float64(residual, shape, dtype):
    """Compiled, the fused node against the interpreter on the two nodes (eager graphc's
    kernels) and on the same graph in float64; interpreted, the op's reference kernel gives
    the two nodes' bits."""
    np_dtype = np.float32 if dtype == "f32" else np.float64
    before = parse(backward_graph(shape, residual, dtype))
    after = fuse_batch_norm_backward(before)
    assert [n.op for n in after.nodes] == ["batch_norm_relu_backward"]
    arrays = backward_inputs(shape, residual, np_dtype, seed=len(shape) + residual)
    got = _compiled(after).run(*[a.copy() for a in arrays])
    eager = interpret(before, *[a.copy() for a in arrays])
    _assert_same_bits(interpret(after, *[a.copy() for a in arrays]), eager)
    wide = parse(backward_graph(shape, residual, "f64"))
    reference = interpret(wide, *[a.astype(np.float64) if a.dtype != bool else a
                                  for a in arrays])
    assert not any(np.isnan(g).any() for g in got)
    for k, (g, e, r) in enumerate(zip(got, eager, reference, strict=True)):
        try:
            assert_rounding_within(g, e, r)
        except AssertionError as err:
            raise AssertionError(f"output {k}: {err}") from None


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("block", [256, 16, None])
def test_the_two_nodes_long_rows_within_twice_eager_rounding_of_float64(residual, block,
                                                                       monkeypatch):
    """The two nodes as the cpu pipeline compiles them (FUSE off): the sums node's rows (planes
    of 2048) summed a block at a time (graphc.backends.cpu.prefetch.blocked_rows: 256, 16, or
    whole rows), within 2x eager graphc's distance from the same graph in float64."""
    monkeypatch.setattr(prefetch, "REDUCED_ROW_BLOCK", block)
    shape = (3, 4, 32, 64)
    graph = parse(backward_graph(shape, residual))
    arrays = backward_inputs(shape, residual, seed=7 + residual)
    got = _compiled(graph).run(*[a.copy() for a in arrays])
    eager = interpret(graph, *[a.copy() for a in arrays])
    reference = interpret(parse(backward_graph(shape, residual, "f64")),
                          *[a.astype(np.float64) if a.dtype != bool else a for a in arrays])
    for k, (g, e, r) in enumerate(zip(got, eager, reference, strict=True)):
        try:
            assert_rounding_within(g, e, r)
        except AssertionError as err:
            raise AssertionError(f"output {k}: {err}") from None


@pytest.mark.parametrize("residual", [False, True])
def test_channel_blocks_and_threads_give_the_same_bits(residual, monkeypatch):
    """One block, blocks of 2 channels (a partial last one), and the blocks split over the
    cores: the same bits (a channel's sums go plane by plane in image order)."""
    graph = fuse_batch_norm_backward(parse(backward_graph((4, 5, 6, 7), residual)))
    arrays = backward_inputs((4, 5, 6, 7), residual, seed=5)
    monkeypatch.setattr(kernel_module, "CHANNEL_BLOCK_BYTES", None)
    one = _compiled(graph, 1).run(*[a.copy() for a in arrays])
    per_channel = 4 * 6 * 7 * (4 + 1 + 4 + 4 * (2 if residual else 0) + (4 if residual else 0))
    monkeypatch.setattr(kernel_module, "CHANNEL_BLOCK_BYTES", 2 * per_channel)
    _assert_same_bits(_compiled(graph, 1).run(*[a.copy() for a in arrays]), one)
    if ALL_CORES < 2:
        pytest.skip("one core (or a BLAS whose thread count cannot be held): never split")
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    exe = _compiled(graph, ALL_CORES)
    _assert_same_bits(exe.run(*[a.copy() for a in arrays]), one)
    assert ".split" in exe.lowered.ir_text


class _Blocks(nn.Module):
    """A stem (conv-bn-relu), a ResNet basic block and a downsample block (4 -> 8 channels,
    stride 2, a 1x1 shortcut), a linear head: ResNet-18's patterns. The stem's and the basic
    block's second batch norm backward add the residual's gradient, the block's writing g for
    the stem's; the downsample block's second and shortcut batch norms, summed in one walk,
    stay fused nodes."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(4)
        self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv3 = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(8)
        self.conv4, self.bn4 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.short, self.bn_s = nn.Conv2d(4, 8, 1, stride=2, bias=False), nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 3 * 3, 3)

    def forward(self, x):
        h = self.bn0(self.stem(x)).relu()
        y = self.bn1(self.conv1(h)).relu()
        h = (self.bn2(self.conv2(y)) + h).relu()
        y = self.bn3(self.conv3(h)).relu()
        h = (self.bn4(self.conv4(y)) + self.bn_s(self.short(h))).relu()
        return self.head(h.reshape(x.shape[0], -1))


def _steps(fuse: bool, monkeypatch):
    losses, state, made = pass_training_steps(
        module, "fuse_batch_norm_backward", "batch_norm_relu_backward", fuse, monkeypatch,
        _Blocks, (5, 3, 6, 6))
    return losses, state, made


def test_a_training_step_with_and_without_the_pass_against_float64(monkeypatch, tmp_path):
    """Three SGD steps of `_Blocks`, compiled with the pass and without: four batch norms'
    backwards fuse (two adding a residual's gradient, one writing g for the stem's); losses,
    parameters and running statistics within 2x the unfused step's distance from the same
    steps interpreted in float64 (the model's .double())."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "fused"))
    fused = _steps(True, monkeypatch)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "plain"))
    plain = _steps(False, monkeypatch)
    assert sorted((len(n.inputs), n.attrs["relu_grad"]) for n in fused[2]) == [
        (6, False)] * 2 + [(7, False), (7, True)]
    assert not plain[2]
    wide = _float64_steps()
    results = list(zip(fused[0] + fused[1], plain[0] + plain[1], wide, strict=True))
    assert any(not np.array_equal(f, p) for f, p, _ in results), "the same bits: not fused?"
    for k, (got, eager, reference) in enumerate(results):
        try:
            assert_rounding_within(got, eager, reference)
        except AssertionError as err:
            raise AssertionError(f"result {k}: {err}") from None


def _float64_steps(calls: int = 3):
    """The same three steps as `pass_training_steps`, interpreted in float64."""
    from tests.conftest import sgd_training_step

    model, train = sgd_training_step(lambda: _Blocks().double(), lr=0.1)
    step = graphc.compile(train, backend="interp")
    rng = np.random.default_rng(0)
    x = graphc.tensor(rng.standard_normal((5, 3, 6, 6)).astype(np.float32).astype(np.float64))
    y = graphc.tensor(rng.integers(0, 3, 5))
    losses = [step(x, y).detach().numpy() for _ in range(calls)]
    return losses + [v.detach().numpy().copy() for v in (*model.parameters(), *model.buffers())]
