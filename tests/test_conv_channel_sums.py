"""Batch norm's statistics computed where the convolution writes its output: the pass
fuse_conv_channel_sums (graphc.passes.conv_channel_sums), the ops conv2d_channel_sums and
batch_norm_relu[sums=true] (graphc.ops.batch_norm_relu), the Winograd output transform's sums
(graphc.backends.cpu.winograd_transforms.add_plane_sums) and the batch norm kernel's merge
(graphc.backends.cpu.batch_norm).

The statistics are float64 sums in another order than before, so results are judged by their
distance from a float64 run (docs/performance.md, Rounding: within 2x eager graphc's), and the
sums must be the same bits whatever the thread count."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import (  # noqa: E402
    conv_few_channels,
    conv_polyphase,
    conv_polyphase_outputs,
    conv_threads,
    conv_winograd,
    pool,
    threads,
    winograd_gemm,
    winograd_transforms,
)
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.ops.batch_norm_relu import image_sums, merged_statistics  # noqa: E402
from graphc.ops.registry import REGISTRY  # noqa: E402
from graphc.passes import conv_channel_sums as module  # noqa: E402
from graphc.passes.conv_channel_sums import fuse_conv_channel_sums  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.testing.rounding import assert_rounding_within  # noqa: E402
from tests.blas_held_support import bits_run  # noqa: E402
from tests.conftest import pass_training_steps, residual_block  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
CONV = "conv2d[stride=({s}, {s}), padding=({p}, {p}), dilation=(1, 1), groups=1]"


def _graph(n=2, c=16, o=16, hw=8, pad=1, stride=1, dtype="f32", training="true",
           residual=False) -> str:
    """conv2d then batch_norm_relu (with a residual, or not), the conv output returned too."""
    ho = (hw + 2 * pad - 3) // stride + 1
    t_in, t = f"{dtype}[{n},{c},{hw},{hw}]", f"{dtype}[{n},{o},{ho},{ho}]"
    p, m = f"{dtype}[{o}]", f"bool[{n},{o},{ho},{ho}]"
    extra = ", %r" if residual else ""
    return f"""graph @f(%x: {t_in}, %k: {dtype}[{o},{c},3,3], %w: {p}, %b: {p}, %m: {p}, %v: {p},
    %r: {t}) -> ({t}, {m}, {p}, {p}, {t}) {{
  %0: {t} = {CONV.format(s=stride, p=pad)}(%x, %k)
  %1: {t}, %2: {m}, %3: {p}, %4: {p} = batch_norm_relu[training={training}, eps=1e-05](%0, %w,
      %b, %m, %v{extra})
  return (%1, %2, %3, %4, %0)
}}"""


def _arrays(n=2, c=16, o=16, hw=8, pad=1, dtype=np.float32, seed=0, make_x=None, stride=1):
    rng = np.random.default_rng(seed)
    ho = (hw + 2 * pad - 3) // stride + 1
    z = rng.standard_normal((n, c, hw, hw))
    x = z + 0.5 if make_x is None else make_x(z)
    k = rng.uniform(-1, 1, (o, c, 3, 3)) / np.sqrt(9 * c)
    params = [rng.uniform(0.5, 2, o), rng.uniform(-1, 1, o), np.zeros(o), np.ones(o)]
    return [a.astype(dtype) for a in [x, k, *params, rng.standard_normal((n, o, ho, ho))]]


def _compiled(graph, count: int = 1):
    graph = parse(str(graph))
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    exe.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return exe


def _float64_run(arrays, pad=1, residual=False, stride=1):
    """The graph's results (relu output, mean, invstd, conv output) in float64."""
    x, k, w, b = (a.astype(np.float64) for a in arrays[:4])
    y = REGISTRY["conv2d"].kernel(x, k, stride=(stride, stride), padding=(pad, pad),
                                  dilation=(1, 1), groups=1)
    mean, var = y.mean(axis=(0, 2, 3)), y.var(axis=(0, 2, 3))
    invstd = 1 / np.sqrt(var + 1e-5)
    out = (y - mean[:, None, None]) * (invstd * w)[:, None, None] + b[:, None, None]
    out = out + arrays[6].astype(np.float64) if residual else out
    return np.maximum(out, 0), mean, invstd, y


def _eager(arrays, pad=1, residual=False, stride=1):
    """The same in eager graphc's kernels (float32): conv2d, batch_norm, add, relu."""
    y = REGISTRY["conv2d"].kernel(arrays[0], arrays[1], stride=(stride, stride),
                                  padding=(pad, pad), dilation=(1, 1), groups=1)
    out, mean, invstd = REGISTRY["batch_norm"].kernel(y, *arrays[2:6], training=True, eps=1e-5)
    out = out + arrays[6] if residual else out
    return np.maximum(out, 0), mean, invstd, y


def test_the_pass_gives_the_batch_norm_its_convolutions_sums():
    out = fuse_conv_channel_sums(parse(_graph(residual=True)))
    assert str(out) == """graph @f(%x: f32[2,16,8,8], %k: f32[16,16,3,3], %w: f32[16], %b: f32[16], %m: f32[16], %v: f32[16], %r: f32[2,16,8,8]) -> (f32[2,16,8,8], bool[2,16,8,8], f32[16], f32[16], f32[2,16,8,8]) {
  %0: f32[2,16,8,8], %0_sums: f64[2,3,16] = conv2d_channel_sums[stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1](%x, %k)
  %1: f32[2,16,8,8], %2: bool[2,16,8,8], %3: f32[16], %4: f32[16] = batch_norm_relu[training=true, eps=1e-05, sums=true](%0, %w, %b, %m, %v, %0_sums, %r)
  return (%1, %2, %3, %4, %0)
}"""  # noqa: E501
    assert parse(str(out)) == out
    assert fuse_conv_channel_sums(out) is out  # once only


@pytest.mark.parametrize("case", [
    {"stride": 2, "hw": 9},        # stride 2, an odd output plane: not the polyphase form
    {"stride": 2, "hw": 8, "pad": 0},  # stride 2 without padding: not the polyphase form
    {"stride": 2, "hw": 8, "dtype": "f64"},  # the polyphase kernel is float32 only
    {"c": 12},                     # fewer channels than Winograd takes, more than few
    {"c": 3, "dtype": "f64"},      # the few-channel kernel is float32 only
    {"hw": 7},                     # an odd output plane
    {"training": "false"},         # eval mode: the running statistics, no sums
])
def test_what_the_winograd_kernel_does_not_take_stays_apart(case):
    graph = parse(_graph(**case))
    assert fuse_conv_channel_sums(graph) is graph


def test_a_symbolic_graph_stays_apart():
    """A symbolic batch anywhere: the graph's lowerings take sizes per call, the sums' not."""
    graph = parse(_graph().replace("%r: f32[2,16,8,8]", "%r: f32[s0,16,8,8]"))
    assert fuse_conv_channel_sums(graph) is graph


def test_the_pass_and_the_kernels_agree_on_the_channel_counts():
    assert module.MIN_CHANNELS == conv_winograd.MIN_CHANNELS == conv_polyphase.MIN_CHANNELS
    assert module.MAX_STRIDE_2_CHANNELS == winograd_gemm.MAX_K
    assert module.FEW_CHANNELS == conv_few_channels.MAX_CHANNELS


def test_merged_statistics_equal_the_two_pass_ones_in_float64():
    rng = np.random.default_rng(1)
    for make in (lambda z: z, lambda z: 1e5 + 0.1 * z, lambda z: np.where(z > 2.5, 1e3, z)):
        y = make(rng.standard_normal((7, 5, 6, 4)))
        mean, var = merged_statistics(image_sums(y), 24)
        np.testing.assert_allclose(mean, y.mean(axis=(0, 2, 3)), rtol=1e-14, atol=1e-12)
        np.testing.assert_allclose(var, y.var(axis=(0, 2, 3)), rtol=1e-9)


# ResNet-18's four plane sizes and their paths through the output transform: 32x32 in parts
# of tile rows (a loop), 16x16 whole images (the tile loop), 8x8 and 4x4 16 tiles a vector
# (wide: 256 channels); 6x6 (no vectors); a last block of fewer images; float64
SHAPES = [
    {"n": 2, "hw": 32}, {"n": 3, "c": 32, "o": 32, "hw": 16}, {"n": 5, "hw": 8},
    {"n": 5, "c": 256, "o": 256, "hw": 4}, {"n": 3, "hw": 6}, {"n": 7, "c": 16, "o": 24, "hw": 8},
    {"n": 3, "c": 3, "o": 16, "hw": 5},  # rows of 5 outputs: conv_channel_lanes' tiles
]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", SHAPES + [{"n": 3, "hw": 8, "dtype": "f64"}],
                         ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_compiled_sums_within_rounding_of_float64(shape, residual):
    """The output, the mean, invstd and the conv output within 2x eager graphc's distance from
    a float64 run; the sums equal the reference kernel's (image_sums) to float64 rounding;
    the interpreter's batch_norm_relu[sums] (merged_statistics) the compiled one's."""
    dtype = np.float64 if shape.get("dtype") == "f64" else np.float32
    dims = {k: v for k, v in shape.items() if k != "dtype"}
    graph = fuse_conv_channel_sums(parse(_graph(**shape, residual=residual)))
    assert [n.op for n in graph.nodes] == ["conv2d_channel_sums", "batch_norm_relu"]
    arrays = _arrays(**dims, dtype=dtype, seed=sum(dims.values()))
    got = _compiled(graph).run(*[a.copy() for a in arrays])
    eager = _eager(arrays, residual=residual)
    for g, e, want in zip([got[0], got[2], got[3], got[4]], eager,
                          _float64_run(arrays, residual=residual)):
        assert g.dtype == dtype
        assert_rounding_within(g, e, want)
    reference = interpret(graph, *[a.copy() for a in arrays])
    for g, r in zip(got, reference):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def _sums_of(graph, arrays, count=1):
    """The graph's outputs with conv2d_channel_sums' sums returned as well."""
    text = str(graph).replace("-> (", "-> (f64[{}], ".format(",".join(
        str(d) for d in graph.nodes[0].outputs[1].type.shape)), 1)
    text = text.replace("return (", f"return (%{graph.nodes[0].outputs[1].name}, ")
    return _compiled(parse(text), count).run(*[a.copy() for a in arrays])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_the_transforms_sums_equal_the_reference_kernels(shape):
    graph = fuse_conv_channel_sums(parse(_graph(**shape)))
    arrays = _arrays(**shape, seed=3)
    got = _sums_of(graph, arrays)
    want = image_sums(got[-1])  # of the compiled conv output itself
    np.testing.assert_array_equal(got[0][:, 0], want[:, 0])  # K: the plane's first element
    np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("shape", SHAPES[:4] + [{"n": 32, "c": 32, "o": 40, "hw": 4}],
                         ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_sums_one_channel_behind(shape, monkeypatch, tmp_path):
    """The Winograd output transform adds a plane's sums after the next channel's tiles
    (winograd_transforms.SUMS_BEHIND), then the last channel's after the loop: the same
    output bits as the sums right after each plane, the sums to float64 rounding, at one
    thread and on all cores (the last shape: one block, the output transform forked over
    the channels)."""
    graph = fuse_conv_channel_sums(parse(_graph(**shape)))
    arrays = _arrays(**shape, seed=8)
    runs = {}
    for behind in (True, False):
        monkeypatch.setattr(winograd_transforms, "SUMS_BEHIND", behind)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache_{behind}"))
        runs[behind] = [_sums_of(graph, arrays, count) for count in (1, ALL_CORES)]
    for got, want in zip(runs[True], runs[False]):
        np.testing.assert_array_equal(got[-1], want[-1])  # the conv output
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-9)  # the sums
        np.testing.assert_allclose(got[0], image_sums(got[-1]), rtol=1e-12, atol=1e-9)


def test_a_convolution_the_kernel_declines_sums_in_a_walk_of_its_own(monkeypatch):
    """The lowering's fallback: conv2d's other path, then a kernel that sums its output: the
    sums of that output, and the results those of the transform's sums to rounding."""
    graph = fuse_conv_channel_sums(parse(_graph(n=3, hw=8)))
    arrays = _arrays(n=3, hw=8, seed=4)
    by_transform = _sums_of(graph, arrays)
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS", 1000)
    by_walk = _sums_of(graph, arrays)
    np.testing.assert_allclose(by_walk[0], image_sums(by_walk[-1]), rtol=1e-12, atol=1e-9)
    for g, w in zip(by_walk[1:], by_transform[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


HOSTILE = {  # conv outputs that defeat unshifted sums, or whose first element is an outlier
    "mean 1e3, deviation ~1e-2": lambda z: 1e3 + 0.1 * z,
    "mean -3e3, deviation ~1": lambda z: -3e3 + 10 * z,
    "first element an outlier": lambda z: np.where((np.arange(8) == 0)[:, None]
                                                   & (np.arange(8) == 0)[None, :], 1e3, z),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_statistics_stay_within_twice_eager_rounding(kind):
    """A large mean over a small spread (positive weights summing to 1: the output is a
    weighted mean of x) and a first element far from its channel (x[:, :, 0, 0], which only
    output (0, 0) reads): each image's shift is its own first element and the merge is
    Chan's, so the results stay within 2x eager graphc's distance from float64."""
    graph = fuse_conv_channel_sums(parse(_graph(n=4, hw=8, pad=0)))
    arrays = _arrays(n=4, hw=8, pad=0, seed=5, make_x=HOSTILE[kind])
    if kind.startswith("mean"):
        k = np.abs(arrays[1].astype(np.float64))
        arrays[1] = (k / k.sum(axis=(1, 2, 3), keepdims=True)).astype(np.float32)
    got = _compiled(graph).run(*[a.copy() for a in arrays])
    for g, e, want in zip([got[0], got[2], got[3]], _eager(arrays, pad=0),
                          _float64_run(arrays, pad=0)):
        assert_rounding_within(g, e, want)


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot be "
                    "held): the Winograd kernel's blocks are never split")
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "-".join(f"{k}{v}" for k, v in
                                                                      s.items()))
def test_two_threads_give_the_same_bits(shape, monkeypatch):
    """The Winograd kernel split over its blocks of images and the batch norm over its
    channels: each image's sums are one share's, merged in image order, so the same bits.
    Where the BLAS rounds otherwise on two threads (numpy's OpenBLAS on a Zen 5: 256
    channels' Winograd GEMMs, a batch too small to split, go to the BLAS's own split), the
    all-cores run compared holds the BLAS to one thread (tests/blas_held_support), and the
    run with the BLAS on all cores is within 2x eager graphc's distance from float64."""
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    graph = fuse_conv_channel_sums(parse(_graph(**shape)))
    arrays = _arrays(**shape, seed=6)
    one = _sums_of(graph, arrays, 1)
    exe = _compiled(parse(str(graph)), ALL_CORES)  # (the split shows in the IR)
    assert exe.lowered.ir_text.count(".split") >= 2
    with bits_run():
        all_cores = _sums_of(graph, arrays, ALL_CORES)
    for got, want in zip(all_cores, one):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                      np.asarray(want).view(np.uint8))
    got = exe.run(*[a.copy() for a in arrays])
    for g, e, want in zip([got[0], got[2], got[3]], _eager(arrays), _float64_run(arrays)):
        assert_rounding_within(g, e, want)


# The stride-2 polyphase kernel's (graphc.backends.cpu.conv_polyphase) output transform paths:
# 16x16 outputs (the tile loop), 8x8 and 4x4 (16 blocks a vector: _output_by_vectors), a last
# block of fewer images (the kernel takes GEMMs a whole number of vectors wide only)
STRIDE_2 = [
    {"n": 2, "c": 16, "o": 32, "hw": 32}, {"n": 3, "c": 16, "o": 32, "hw": 16},
    {"n": 8, "c": 32, "o": 64, "hw": 8}, {"n": 7, "c": 16, "o": 24, "hw": 16},
]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", STRIDE_2, ids=lambda s: "-".join(f"{k}{v}" for k, v in
                                                                     s.items()))
def test_the_polyphase_transforms_sums(shape, residual):
    """A stride-2 convolution's batch norm takes the sums the polyphase kernel adds as it
    writes each plane (not a walk of their own): the sums equal the reference kernel's of the
    compiled conv output; the results within 2x eager graphc's distance from float64."""
    graph = fuse_conv_channel_sums(parse(_graph(**shape, stride=2, residual=residual)))
    assert [n.op for n in graph.nodes] == ["conv2d_channel_sums", "batch_norm_relu"]
    ir_text = _compiled(graph).lowered.ir_text
    assert "conv2d_polyphase" in ir_text and '@"conv2d_channel_sums' not in ir_text
    arrays = _arrays(**shape, stride=2, seed=sum(shape.values()))
    got = _sums_of(graph, arrays)
    want = image_sums(got[-1])
    np.testing.assert_array_equal(got[0][:, 0], want[:, 0])
    np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=1e-9)
    for g, e, w in zip([got[1], got[3], got[4], got[5]],
                       _eager(arrays, residual=residual, stride=2),
                       _float64_run(arrays, residual=residual, stride=2)):
        assert_rounding_within(g, e, w)


@pytest.mark.parametrize("shape", STRIDE_2[:3] + [{"n": 16, "c": 32, "o": 64, "hw": 8}],
                         ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_the_polyphase_sums_behind_and_from_vectors(shape, monkeypatch, tmp_path):
    """The polyphase output transform adds a plane's sums one channel behind (the tile loop:
    conv_polyphase_outputs.SUMS_BEHIND), or from the vector it has just stored (4x4 planes:
    VECTOR_SUMS): the same output bits as the sums right after each plane from memory, the
    sums to float64 rounding, at one thread and on all cores (the last shape: a batch of one
    block)."""
    graph = fuse_conv_channel_sums(parse(_graph(**shape, stride=2)))
    arrays = _arrays(**shape, stride=2, seed=5)
    runs = {}
    for new in (True, False):
        monkeypatch.setattr(conv_polyphase_outputs, "SUMS_BEHIND", new)
        monkeypatch.setattr(conv_polyphase_outputs, "VECTOR_SUMS", new)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / f"cache_{new}"))
        runs[new] = [_sums_of(graph, arrays, count) for count in (1, ALL_CORES)]
    for got, want in zip(runs[True], runs[False]):
        np.testing.assert_array_equal(got[-1], want[-1])  # the conv output
        np.testing.assert_array_equal(got[0][:, 0], want[0][:, 0])  # K: the first element
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-9)  # the sums
        np.testing.assert_allclose(got[0], image_sums(got[-1]), rtol=1e-12, atol=1e-9)
    for got in runs[True][1:]:  # all cores: the same bits as one thread
        for g, w in zip(got, runs[True][0]):
            np.testing.assert_array_equal(np.asarray(g).view(np.uint8),
                                          np.asarray(w).view(np.uint8))


# The few-channel kernel's (graphc.backends.cpu.conv_few_channels): ResNet-18's stem, and
# planes of one and eight channels in, an odd row width
FEW = [{"n": 3, "c": 3, "o": 64, "hw": 32}, {"n": 2, "c": 8, "o": 16, "hw": 16},
       {"n": 5, "c": 1, "o": 24, "hw": 17}]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("shape", FEW, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_the_few_channel_kernels_sums(shape, residual):
    """The stem's batch norm takes the sums the few-channel kernel adds after each image's
    tiles: equal to the reference kernel's of the compiled conv output; the results within
    2x eager graphc's distance from float64."""
    graph = fuse_conv_channel_sums(parse(_graph(**shape, residual=residual)))
    assert [n.op for n in graph.nodes] == ["conv2d_channel_sums", "batch_norm_relu"]
    ir_text = _compiled(graph).lowered.ir_text
    assert "conv2d_few_channels" in ir_text and '@"conv2d_channel_sums' not in ir_text
    arrays = _arrays(**shape, seed=sum(shape.values()))
    got = _sums_of(graph, arrays)
    want = image_sums(got[-1])
    np.testing.assert_array_equal(got[0][:, 0], want[:, 0])
    np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=1e-9)
    for g, e, w in zip([got[1], got[3], got[4], got[5]], _eager(arrays, residual=residual),
                       _float64_run(arrays, residual=residual)):
        assert_rounding_within(g, e, w)


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot be "
                    "held): the few-channel kernel's images are never split")
def test_the_few_channel_sums_are_the_same_bits_on_two_threads(monkeypatch):
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    graph = fuse_conv_channel_sums(parse(_graph(**FEW[0])))
    arrays = _arrays(**FEW[0], seed=9)
    assert _compiled(parse(str(graph)), ALL_CORES).lowered.ir_text.count(".split") >= 2
    for got, want in zip(_sums_of(graph, arrays, ALL_CORES), _sums_of(graph, arrays, 1)):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                      np.asarray(want).view(np.uint8))


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot be "
                    "held): the polyphase kernel's blocks are never split")
@pytest.mark.parametrize("shape", STRIDE_2[1:3], ids=lambda s: "-".join(
    f"{k}{v}" for k, v in s.items()))
def test_the_polyphase_sums_are_the_same_bits_on_two_threads(shape, monkeypatch):
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(pool, "POOL_MIN_SPLIT_TAPS", 0)
    graph = fuse_conv_channel_sums(parse(_graph(**shape, stride=2)))
    arrays = _arrays(**shape, stride=2, seed=8)
    assert _compiled(parse(str(graph)), ALL_CORES).lowered.ir_text.count(".split") >= 2
    for got, want in zip(_sums_of(graph, arrays, ALL_CORES), _sums_of(graph, arrays, 1)):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                      np.asarray(want).view(np.uint8))


def _block():
    """A ResNet basic block of 16 channels on 8 x 8 planes (the Winograd kernel's form)."""
    return residual_block(16, 8)


def _steps(fuse: bool, monkeypatch, calls=3):
    losses, state, made = pass_training_steps(
        module, "fuse_conv_channel_sums", "conv2d_channel_sums", fuse, monkeypatch, _block,
        (5, 16, 8, 8), calls)
    assert len(made) == (2 if fuse else 0)  # both batch norms take their conv's sums
    return losses, state


def test_a_training_step_with_and_without_the_pass_agree(monkeypatch, tmp_path):
    """Three SGD steps of a ResNet block: losses, weights, gradients' effects and the running
    statistics agree to float32 rounding with the statistics computed either way."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "sums"))
    fused = _steps(True, monkeypatch)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "plain"))
    plain = _steps(False, monkeypatch)
    for got, want in zip(fused[0] + fused[1], plain[0] + plain[1]):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_step_within_twice_eager_rounding_of_a_float64_pytorch_run(monkeypatch, tmp_path):
    """The ResNet block's forward and backward compiled with the pass (both batch norms take
    their convolution's sums), two calls: the loss, every gradient and the running statistics
    within 2x eager graphc's distance from the same block in PyTorch, float64."""
    from tests.conftest import torch_or_skip

    torch = torch_or_skip()
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    made = []
    real = module.fuse_conv_channel_sums

    def spy(graph):
        out = real(graph)
        made.extend(n.op for n in out.nodes if n.op == "conv2d_channel_sums")
        return out

    monkeypatch.setattr(module, "fuse_conv_channel_sums", spy)
    rng = np.random.default_rng(7)
    x = (0.5 + rng.standard_normal((5, 16, 8, 8))).astype(np.float32)
    y = rng.integers(0, 3, 5)
    graphc.manual_seed(1)
    weights = {k: v.numpy().copy() for k, v in _block().state_dict().items()}

    def graphc_run(compiled: bool):
        model = _block()
        model.load_state_dict({k: graphc.tensor(v) for k, v in weights.items()})

        def step(xs, ys):
            loss = graphc.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            return loss

        gx = graphc.tensor(x, requires_grad=True)
        run = graphc.compile(step, backend="cpu") if compiled else step
        run(gx, graphc.tensor(y))  # (compiled: the first call runs on the interpreter)
        loss = run(gx, graphc.tensor(y))  # gradients add up, running statistics move twice
        return [loss.detach().numpy(), gx.grad.numpy()] + \
            [p.grad.numpy() for p in model.parameters()] + \
            [b.numpy() for name, b in model.state_dict().items() if "running" in name]

    got, eager = graphc_run(True), graphc_run(False)
    assert made == ["conv2d_channel_sums"] * 2
    t_model = torch.nn.Sequential()  # the same block in PyTorch, float64
    t_model.conv1, t_model.bn1 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), \
        torch.nn.BatchNorm2d(16)
    t_model.conv2, t_model.bn2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), \
        torch.nn.BatchNorm2d(16)
    t_model.head = torch.nn.Linear(16 * 8 * 8, 3)
    t_model = t_model.double()
    t_model.load_state_dict({k: torch.tensor(v, dtype=torch.float64 if v.dtype.kind == "f"
                                             else None) for k, v in weights.items()})
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        h = t_model.bn1(t_model.conv1(tx)).relu()
        h = (t_model.bn2(t_model.conv2(h)) + tx).relu()
        t_loss = torch.nn.functional.cross_entropy(t_model.head(h.reshape(5, -1)),
                                                   torch.tensor(y))
        t_loss.backward()
    want = [t_loss.detach().numpy(), tx.grad.numpy()] + \
        [p.grad.numpy() for p in t_model.parameters()] + \
        [b.numpy() for name, b in t_model.state_dict().items() if "running" in name]
    assert len(got) == len(eager) == len(want) == 2 + 8 + 4
    assert not all(np.array_equal(g, e) for g, e in zip(got, eager)), "compiled = eager?"
    for k, (g, e, r) in enumerate(zip(got, eager, want)):
        try:
            assert_rounding_within(np.asarray(g, np.float32), np.asarray(e, np.float32), r)
        except AssertionError as err:
            raise AssertionError(f"result {k}: {err}") from None
