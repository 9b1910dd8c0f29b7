"""Review of the eleventh session's batch norm statistics from the convolution (h1:
graphc.passes.conv_channel_sums, conv2d_channel_sums, batch_norm_relu[sums=true]), as a
seeded fuzzer over what its own tests leave out: batches of 1 and odd sizes, channel counts
off the vector width (17, 20, 24 in; 17, 20 out), non-square planes, padding 0, 1 and 2,
float64, a residual, 1 and 2 threads, and NaN / inf in the convolution's input.

Each case compiles the rewritten graph and checks: the pass made the sums; the results on two
threads are the same bits as on one; relu output, mean and invstd within 2x eager graphc's
distance from a float64 run (docs/performance.md, "Rounding"); the non-finite patterns equal
the graph compiled without the pass. Skipped where the pass has not landed.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
conv_channel_sums = pytest.importorskip(
    "graphc.passes.conv_channel_sums", reason="h1's conv_channel_sums has not landed")

from graphc.backends.cpu import threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ops.registry import REGISTRY  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing.rounding import assert_rounding_within  # noqa: E402

resolve_blas()
TWO_THREADS = threads.image_threads() >= 2


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _graph(n, c, o, h, w, pad, dtype, residual) -> str:
    ho, wo = h + 2 * pad - 2, w + 2 * pad - 2
    t_in, t = f"{dtype}[{n},{c},{h},{w}]", f"{dtype}[{n},{o},{ho},{wo}]"
    p, m = f"{dtype}[{o}]", f"bool[{n},{o},{ho},{wo}]"
    extra = ", %r" if residual else ""
    return f"""graph @f(%x: {t_in}, %k: {dtype}[{o},{c},3,3], %w: {p}, %b: {p}, %m: {p}, %v: {p},
    %r: {t}) -> ({t}, {m}, {p}, {p}, {t}) {{
  %0: {t} = conv2d[stride=(1, 1), padding=({pad}, {pad}), dilation=(1, 1), groups=1](%x, %k)
  %1: {t}, %2: {m}, %3: {p}, %4: {p} = batch_norm_relu[training=true, eps=1e-05](%0, %w,
      %b, %m, %v{extra})
  return (%1, %2, %3, %4, %0)
}}"""


def _arrays(rng, n, c, o, h, w, pad, dt):
    ho, wo = h + 2 * pad - 2, w + 2 * pad - 2
    x = rng.standard_normal((n, c, h, w)) * rng.uniform(0.5, 3) + rng.uniform(-2, 2)
    k = rng.uniform(-1, 1, (o, c, 3, 3)) / np.sqrt(9 * c)
    params = [rng.uniform(0.5, 2, o), rng.uniform(-1, 1, o), np.zeros(o), np.ones(o)]
    return [a.astype(dt) for a in [x, k, *params, rng.standard_normal((n, o, ho, wo))]]


def _run(text, arrays, count):
    graph = parse(text)
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe.run(*[a.copy() for a in arrays])


def _reference(arrays, pad, residual, dt):
    """relu output, mean, invstd: eager graphc's kernels in `dt`, or float64 when dt is."""
    x, k = arrays[0].astype(dt), arrays[1].astype(dt)
    y = REGISTRY["conv2d"].kernel(x, k, stride=(1, 1), padding=(pad, pad), dilation=(1, 1),
                                  groups=1)
    out, mean, invstd = REGISTRY["batch_norm"].kernel(
        y, *(a.astype(dt) for a in arrays[2:6]), training=True, eps=1e-5)
    out = out + arrays[6].astype(dt) if residual else out
    return np.maximum(out, 0), mean, invstd


def _cases(seed, count):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.choice([1, 2, 3, 5]))
        c, o = int(rng.choice([16, 17, 20, 24])), int(rng.choice([16, 17, 20, 32]))
        pad = int(rng.choice([0, 1, 2]))
        ho, wo = (int(v) for v in rng.choice([2, 4, 6, 10, 14], 2))
        h, w = ho + 2 - 2 * pad, wo + 2 - 2 * pad
        if min(h, w) < 1:
            h, w, pad = ho + 2, wo + 2, 0
        dtype = "f64" if rng.random() < 0.25 else "f32"
        yield (n, c, o, h, w, pad, dtype, bool(rng.integers(2))), int(rng.integers(1 << 30))


@pytest.mark.parametrize("seed", range(4))
def test_fused_statistics_match_float64_and_are_the_same_bits_on_two_threads(seed):
    for (n, c, o, h, w, pad, dtype, residual), data_seed in _cases(seed, 3):
        text = _graph(n, c, o, h, w, pad, dtype, residual)
        fused = conv_channel_sums.fuse_conv_channel_sums(parse(text))
        assert any(node.op == "conv2d_channel_sums" for node in fused.nodes), text
        dt = np.float32 if dtype == "f32" else np.float64
        arrays = _arrays(np.random.default_rng(data_seed), n, c, o, h, w, pad, dt)
        one = _run(str(fused), arrays, 1)
        if TWO_THREADS:
            for a, b in zip(one, _run(str(fused), arrays, 2)):
                np.testing.assert_array_equal(a, b, err_msg=f"{text}\n1 vs 2 threads")
        eager = _reference(arrays, pad, residual, dt)
        if dt is np.float64:  # eager is the float64 run: agree to float64 rounding
            for got, want in zip([one[0], one[2], one[3]], eager):
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=text)
            continue
        wide = _reference(arrays, pad, residual, np.float64)
        for got, e, want in zip([one[0], one[2], one[3]], eager, wide):
            assert_rounding_within(got, e, want)


NON_FINITE = {
    "nan inside": lambda x: x.__setitem__((0, 3, 2, 1), np.nan),
    "inf inside": lambda x: x.__setitem__((-1, 1, 1, 2), np.inf),
    "-inf at a plane's first element": lambda x: x.__setitem__((0, 0, 0, 0), -np.inf),
    "a whole image inf": lambda x: x.__setitem__((0,), np.inf),
}


@pytest.mark.parametrize("kind", sorted(NON_FINITE))
def test_non_finite_inputs_give_the_plain_graphs_nan_pattern(kind):
    text = _graph(3, 16, 16, 6, 6, 1, "f32", False)
    arrays = _arrays(np.random.default_rng(7), 3, 16, 16, 6, 6, 1, np.float32)
    NON_FINITE[kind](arrays[0])
    fused = _run(str(conv_channel_sums.fuse_conv_channel_sums(parse(text))), arrays, 1)
    plain = _run(text, arrays, 1)
    for name, got, want in zip(("out", "mask", "mean", "invstd"), fused[:4], plain[:4]):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{kind}: {name}")
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"{kind}: {name}")


@pytest.mark.parametrize("affine,track", [(False, True), (True, False), (False, False)])
def test_batch_norms_without_weights_or_running_statistics_take_the_sums(affine, track):
    """BatchNorm2d(affine=False) and/or track_running_stats=False after a Winograd
    convolution: the pass still hands the sums over; the compiled step's output and gradients
    within 2x eager graphc's distance from PyTorch in float64."""
    import graphc
    import graphc.nn.functional as F

    torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")

    def build(lib):
        nn = lib.nn
        return [nn.Conv2d(16, 16, 3, padding=1, bias=False),
                nn.Conv2d(16, 16, 3, padding=1, bias=False),
                nn.BatchNorm2d(16, affine=affine, track_running_stats=track),
                nn.BatchNorm2d(16, affine=affine, track_running_stats=track)]

    graphc.manual_seed(0)
    ours, ref = build(graphc), build(torch)
    for a, b in zip(ours, ref):
        b.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in a.state_dict().items()})
        b.double()

    def make_step(mods, functional):
        params = [p for m in mods for p in m.parameters()]

        def step(x):
            for p in params:
                p.grad = None
            h = functional.relu(mods[2](mods[0](x)))
            y = functional.relu(mods[3](mods[1](h)) + h)
            (y * y.sin()).sum().backward()
            return [y.detach()] + [p.grad for p in params]

        return step

    x = np.random.default_rng(3).standard_normal((3, 16, 8, 8)).astype(np.float32)
    step = make_step(ours, F)
    compiled = graphc.compile(step, backend="cpu")
    got = [v.numpy().copy() for v in compiled(graphc.tensor(x))]
    assert "conv2d_channel_sums" in [n.op for n in compiled.optimized_graph.nodes]
    eager = [v.numpy() for v in step(graphc.tensor(x))]
    want = [v.detach().numpy() for v in make_step(ref, torch.nn.functional)(
        torch.tensor(x).double())]
    for g, e, w in zip(got, eager, want):
        assert_rounding_within(g, e, w)


def test_every_stride_1_batch_norm_of_resnet18_takes_its_convolutions_sums(tmp_path):
    import graphc
    import graphc.nn.functional as F
    from benchmarks.model_steps import resnet18

    graphc.manual_seed(0)
    model = resnet18(graphc, width=16)
    opt = graphc.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = graphc.compile(step, backend="cpu")
    compiled(graphc.randn(2, 3, 16, 16), graphc.tensor(np.zeros(2, np.int64)))
    ops = [node.op for node in compiled.optimized_graph.nodes]
    # 20 batch norms: the 3 shortcuts' (1x1) have no convolution that sums before them; the
    # other 13 stride-1 3x3 (Winograd), the 3 after stride-2 convolutions (polyphase) and
    # the stem's (the few-channel kernel) do
    assert ops.count("conv2d_channel_sums") == 17, (ops.count("conv2d_channel_sums"),
                                                    ops.count("batch_norm"))
