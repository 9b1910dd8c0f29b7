"""fuse_batch_norm_relu (graphc.passes.batch_norm_relu), the `batch_norm_relu` op
(graphc.ops.batch_norm_relu) and its cpu lowering (graphc.backends.cpu.batch_norm): a batch
norm and the fused ReLU after it, with or without the residual add, become one node whose
kernel writes relu(y [+ r]) and the mask; the same bits as the two kernels before, and as the
interpreter; what may not fuse stays apart.

No new math: the op has no VJP (the pass runs after autodiff) and computes exactly what the
nodes it replaces computed, so the gradients are the same graph as before; the tests compare
bits, not finite differences."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc import nn  # noqa: E402
from graphc.backends.cpu import pool, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.passes import batch_norm_relu as module  # noqa: E402
from graphc.passes.batch_norm_relu import fuse_batch_norm_relu  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from tests.conftest import pass_training_steps, residual_block, sgd_training_step  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
FULL = '("full", (), (("shape", ()), ("value", {value}), ("dtype", "{dtype}")))'


def _graph(shape=(4, 3, 5, 6), residual: str | None = None, dtype="f32", value=0.0,
           extra_reader=False, outputs="(1, 3)", training="true") -> str:
    """batch_norm then fused[relu, gt](%0), or with `residual` "first" / "second" the add of
    %0 and %r in that place; `extra_reader`: %0 is also summed by another node."""
    t = f"{dtype}[{','.join(map(str, shape))}]"
    c = f"{dtype}[{shape[1]}]"
    m = "bool" + t[len(dtype):]
    full = FULL.format(value=value, dtype="float32" if dtype == "f32" else "float64")
    if residual is None:
        body, args = f'("relu", (0,), ()), {full}, ("gt", (1, 2), ())', "%0"
    else:
        body = f'("add", (0, 1), ()), ("relu", (2,), ()), {full}, ("gt", (3, 4), ())'
        args = "%0, %r" if residual == "first" else "%r, %0"
        outputs = "(3, 5)" if outputs == "(1, 3)" else outputs
    more = f"\n  %5: {t} = neg(%0)" if extra_reader else ""
    ret = "%3, %4, %1, %2, %5" if extra_reader else "%3, %4, %1, %2"
    rtypes = f"{t}, {m}, {c}, {c}" + (f", {t}" if extra_reader else "")
    return f"""graph @f(%x: {t}, %w: {c}, %b: {c}, %m: {c}, %v: {c}, %r: {t}) -> ({rtypes}) {{
  %0: {t}, %1: {c}, %2: {c} = batch_norm[training={training}, eps=1e-05](%x, %w, %b, %m, %v)
  %3: {t}, %4: {m} = fused[body=({body}), outputs={outputs}]({args}){more}
  return ({ret})
}}"""


def _arrays(shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = rng.standard_normal(shape)
    r = rng.standard_normal(shape)
    r.flat[::7] = -0.0
    r.flat[::11] = np.nan  # relu(NaN) is NaN, its mask False, as the separate kernels have it
    params = [rng.uniform(0.5, 2, c), rng.uniform(-1, 1, c), np.zeros(c), np.ones(c)]
    return [a.astype(dtype) for a in [x, *params, r]]


def _compiled(graph, count: int = 1):
    graph = parse(str(graph))
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe


def _assert_same_bits(got, want):
    for g, w in zip(got, want, strict=True):
        g, w = np.atleast_1d(g), np.atleast_1d(np.asarray(w))
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def test_the_pass_writes_one_node_at_the_batch_norms_place():
    out = fuse_batch_norm_relu(parse(_graph(residual="first")))
    assert str(out) == """graph @f(%x: f32[4,3,5,6], %w: f32[3], %b: f32[3], %m: f32[3], %v: f32[3], %r: f32[4,3,5,6]) -> (f32[4,3,5,6], bool[4,3,5,6], f32[3], f32[3]) {
  %3: f32[4,3,5,6], %4: bool[4,3,5,6], %1: f32[3], %2: f32[3] = batch_norm_relu[training=true, eps=1e-05](%x, %w, %b, %m, %v, %r)
  return (%3, %4, %1, %2)
}"""  # noqa: E501
    assert parse(str(out)) == out


@pytest.mark.parametrize("residual", [None, "first", "second"])
@pytest.mark.parametrize("shape,dtype", [((4, 3, 5, 6), "f32"), ((6, 5), "f32"),
                                         ((3, 4, 9), "f32"), ((2, 3, 4, 5), "f64")])
def test_fused_kernel_equals_the_two_kernels_and_the_interpreter_bit_for_bit(residual, shape,
                                                                                dtype):
    """relu(y [+ r]) and its mask, NaN and -0.0 in r included: the same bits as batch_norm's
    kernel then the fused ReLU's; interpreted, the op's reference kernel gives the same bits
    as the two nodes' kernels."""
    before = parse(_graph(shape, residual, dtype))
    after = fuse_batch_norm_relu(before)
    assert [n.op for n in after.nodes] == ["batch_norm_relu"]
    arrays = _arrays(shape, np.float32 if dtype == "f32" else np.float64,
                     seed=len(shape) + (residual is None))
    want = _compiled(before).run(*[a.copy() for a in arrays])
    got = _compiled(after).run(*[a.copy() for a in arrays])
    _assert_same_bits(got, want)
    reference = interpret(after, *[a.copy() for a in arrays])
    _assert_same_bits(interpret(before, *[a.copy() for a in arrays]), reference)
    # the compiled statistics are shifted one-pass sums, the reference's two passes: equal
    # within rounding (docs/performance.md, Rounding), not bit for bit
    for g, w in zip(got, reference):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot be "
                    "held): batch norm's channels are never split")
@pytest.mark.parametrize("residual", [None, "first"])
def test_split_over_channels_equals_one_thread(residual, monkeypatch):
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    graph = fuse_batch_norm_relu(parse(_graph((4, 5, 6, 7), residual)))
    arrays = _arrays((4, 5, 6, 7), seed=5)
    one = _compiled(graph, 1).run(*[a.copy() for a in arrays])
    exe = _compiled(graph, ALL_CORES)
    _assert_same_bits(exe.run(*[a.copy() for a in arrays]), one)
    assert ".split" in exe.lowered.ir_text


def _sums_graph(shape, residual: bool) -> str:
    """batch_norm_relu[sums=true] alone: the statistics from given per-image shifted sums
    (graphc.passes.conv_channel_sums makes such nodes)."""
    t, c = f"f32[{','.join(map(str, shape))}]", f"f32[{shape[1]}]"
    m, r = "bool" + t[3:], ", %r" if residual else ""
    return f"""graph @f(%x: {t}, %w: {c}, %b: {c}, %m: {c}, %v: {c}, %s: f64[{shape[0]},3,{shape[1]}],
    %r: {t}) -> ({t}, {m}, {c}, {c}) {{
  %1: {t}, %2: {m}, %3: {c}, %4: {c} = batch_norm_relu[training=true, eps=1e-05, sums=true](%x,
      %w, %b, %m, %v, %s{r})
  return (%1, %2, %3, %4)
}}"""  # noqa: E501


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", [(5, 37, 4, 3), (3, 70, 2, 2), (1, 19, 3, 3)])
def test_statistics_from_sums_equal_the_interpreters_bit_for_bit(shape, residual,
                                                                  monkeypatch):
    """With sums=true the kernel merges the per-image sums by Chan's update, image by image
    over a vector of channels (graphc.backends.cpu.batch_norm._merged_statistics): the
    operations of graphc.ops.batch_norm_relu.merged_statistics per channel, so the mean,
    invstd and output have its bits, on one thread and split over the channels; channel
    counts off the vector width, one image, a channel of zero variance."""
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    arrays = _arrays(shape, seed=shape[1])
    x = arrays[0]
    x[:, 2] = 1.5  # a constant channel: the merged M2 rounds to ~0 (clamped if below)
    planes = x.reshape(shape[0], shape[1], -1).astype(np.float64)
    shift = planes[:, :, :1]
    sums = np.stack([shift[:, :, 0], (planes - shift).sum(-1), ((planes - shift) ** 2).sum(-1)],
                    axis=1)
    arrays = arrays[:5] + [sums] + arrays[5:]
    graph = parse(_sums_graph(shape, residual))
    want = interpret(graph, *[a.copy() for a in arrays])
    _assert_same_bits(_compiled(graph, 1).run(*[a.copy() for a in arrays]), want)
    if ALL_CORES >= 2:
        _assert_same_bits(_compiled(graph, ALL_CORES).run(*[a.copy() for a in arrays]), want)


@pytest.mark.parametrize("case", [
    {"extra_reader": True},            # y is read by another node too
    {"value": 1.0},                    # gt against 1, not the ReLU's mask
    {"outputs": "(1,)"},               # no mask: the step's ReLU always has one (not fused)
])
def test_what_may_not_fuse_stays_apart(case):
    graph = parse(_graph(**case))
    assert fuse_batch_norm_relu(graph) is graph


def _residual_made_after(make_r: str) -> str:
    """_graph(residual="first") with the batch norm's mean read between it and the ReLU (%s,
    as a running-mean update reads it) and %r made there too, by the IR lines `make_r`."""
    text = _graph(residual="first").replace("%r: f32[4,3,5,6]) ->", "%q: f32[4,3,5,6]) ->")
    text = text.replace("  %3:", f"  %s: f32[3] = neg(%1)\n{make_r}\n  %3:")
    return text.replace("return (%3, %4, %1, %2)", "return (%3, %4, %1, %2, %s)").replace(
        "-> (f32[4,3,5,6], bool[4,3,5,6], f32[3], f32[3])",
        "-> (f32[4,3,5,6], bool[4,3,5,6], f32[3], f32[3], f32[3])")


def test_a_residual_made_after_the_batch_norm_fuses_at_the_relus_place():
    """The node stands where the ReLU stood, and what read the batch norm's statistics in
    between (%s) moves right after it; the same bits as the two kernels."""
    graph = parse(_residual_made_after("  %r: f32[4,3,5,6] = neg(%q)"))
    out = fuse_batch_norm_relu(graph)
    assert [(n.op, n.outputs[0].name) for n in out.nodes] == [
        ("neg", "r"), ("batch_norm_relu", "3"), ("neg", "s")]
    assert out.nodes[1].inputs[-1].name == "r"
    arrays = _arrays((4, 3, 5, 6))
    _assert_same_bits(_compiled(out).run(*[a.copy() for a in arrays]),
                      _compiled(graph).run(*[a.copy() for a in arrays]))


def test_without_at_the_relu_a_residual_made_after_stays_apart(monkeypatch):
    monkeypatch.setattr(module, "AT_THE_RELU", False)
    graph = parse(_residual_made_after("  %r: f32[4,3,5,6] = neg(%q)"))
    assert fuse_batch_norm_relu(graph) is graph


def test_a_residual_that_depends_on_the_batch_norm_stays_apart():
    graph = parse(_residual_made_after("""  %u: f32[1,3,1,1] = reshape[shape=(1, 3, 1, 1)](%s)
  %t: f32[4,3,5,6] = broadcast_to[shape=(4, 3, 5, 6)](%u)
  %r: f32[4,3,5,6] = add(%t, %q)"""))
    assert fuse_batch_norm_relu(graph) is graph


def test_two_batch_norms_added_then_relu_fuse_one_of_them():
    """A strided block: relu(bn2(a) + bn_s(b)); the first batch norm in order takes the ReLU
    (at the ReLU's place: its addend is made after it), the other stays a batch_norm."""
    t, c = "f32[2,3,4,4]", "f32[3]"
    full = FULL.format(value=0.0, dtype="float32")
    graph = parse(f"""graph @f(%a: {t}, %b: {t}, %w: {c}, %c: {c}, %m: {c}, %v: {c})
    -> ({t}, bool[2,3,4,4]) {{
  %0: {t}, %1: {c}, %2: {c} = batch_norm[training=true, eps=1e-05](%a, %w, %c, %m, %v)
  %3: {t}, %4: {c}, %5: {c} = batch_norm[training=true, eps=1e-05](%b, %w, %c, %m, %v)
  %6: {t}, %7: bool[2,3,4,4] = fused[body=(("add", (0, 1), ()), ("relu", (2,), ()), {full},
      ("gt", (3, 4), ())), outputs=(3, 5)](%0, %3)
  return (%6, %7)
}}""")
    out = fuse_batch_norm_relu(graph)
    assert [n.op for n in out.nodes] == ["batch_norm", "batch_norm_relu"]
    assert [v.name for v in out.nodes[1].inputs[::5]] == ["a", "3"]
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((2, 3, 4, 4)).astype(np.float32) for _ in range(2)] + \
        [rng.uniform(0.5, 2, 3).astype(np.float32) for _ in range(4)]
    _assert_same_bits(_compiled(out).run(*[a.copy() for a in arrays]),
                      _compiled(graph).run(*[a.copy() for a in arrays]))


def _block():
    """A ResNet basic block of 4 channels on 6 x 6 planes."""
    return residual_block(4, 6)


class _DownBlock(nn.Module):
    """A downsample block: conv(stride 2)-bn-relu, conv-bn, + the shortcut's conv 1x1 (stride 2)
    and bn, made after the body's second batch norm, relu; then a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.short = nn.Conv2d(4, 8, 1, stride=2, bias=False)
        self.bn_s = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 3 * 3, 3)

    def forward(self, x):
        y = self.bn1(self.conv1(x)).relu()
        y = (self.bn2(self.conv2(y)) + self.bn_s(self.short(x))).relu()
        return self.head(y.reshape(x.shape[0], -1))


def _steps(fuse: bool, monkeypatch, calls=3, make_model=_block):
    losses, state, fused_nodes = pass_training_steps(
        module, "fuse_batch_norm_relu", "batch_norm_relu", fuse, monkeypatch, make_model,
        (5, 4, 6, 6), calls)
    # the block's two ReLUs, the second with its residual (a downsample block's: the body's
    # batch norm takes it, at the ReLU's place)
    assert len(fused_nodes) == (2 if fuse else 0)
    if fuse and make_model is _DownBlock:
        (with_residual,) = [n for n in fused_nodes if len(n.inputs) == 6]
        assert with_residual.inputs[1].name.endswith("bn2.weight"), with_residual.inputs[1]
    return losses, state


@pytest.mark.parametrize("make_model", [_block, _DownBlock], ids=["block", "downsample"])
def test_a_training_step_is_the_same_bits_with_and_without_the_pass(make_model, monkeypatch,
                                                                     tmp_path):
    """Losses, parameters and running statistics (a downsample block's body batch norm fused
    at the ReLU's place, its running-statistics updates moved behind it)."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "fused"))
    fused = _steps(True, monkeypatch, make_model=make_model)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "plain"))
    plain = _steps(False, monkeypatch, make_model=make_model)
    for got, want in zip(fused[0] + fused[1], plain[0] + plain[1]):
        _assert_same_bits([got], [want])


def test_a_symbolic_batch_compiles_the_fused_kernel_in_one_block(monkeypatch, tmp_path):
    """dynamic=True: the batch is a symbol, so no channel blocks (their size needs the batch);
    the step agrees with eager for every batch size."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    fused_types = []
    real = module.fuse_batch_norm_relu

    def spy(graph):
        out = real(graph)
        fused_types.extend(n.inputs[0].type for n in out.nodes if n.op == "batch_norm_relu")
        return out

    monkeypatch.setattr(module, "fuse_batch_norm_relu", spy)

    def make():
        return nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 4 * 4, 3))

    _, step = sgd_training_step(make, lr=0.1, momentum=0.0)
    compiled = graphc.compile(step, backend="cpu", dynamic=True)
    _, eager = sgd_training_step(make, lr=0.1, momentum=0.0)
    for b in (4, 6, 3):
        x, y = graphc.randn(b, 2, 6, 6), graphc.randint(0, 3, (b,))
        np.testing.assert_allclose(compiled(x, y).detach().numpy(), eager(x, y).detach().numpy(),
                                   rtol=1e-5)
    assert fused_types and all(t.is_symbolic for t in fused_types), fused_types
