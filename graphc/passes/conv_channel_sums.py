"""fuse_conv_channel_sums: a training `batch_norm_relu` whose input a 3x3 stride-1 convolution
(or a 3x3 stride-2 one, padding 1) makes takes its statistics from sums the convolution
computes while it writes its output, so
the batch norm's kernel no longer walks its input once for the statistics.

In a ResNet step, `conv2d` writes y (the largest tensors of the step: 8 MB a 64-channel layer
at batch 32) and the batch norm after it reads y twice: a statistics walk (the per-channel
shifted sums) and an output walk. The cpu backend's Winograd kernel (graphc.backends.cpu.
conv_winograd) has each part of a plane in L1 right after its output transform, so it can sum
it there, and so has the stride-2 polyphase kernel (conv_polyphase); the batch norm's
statistics walk, its one read of y from memory, goes.

The rewrite, for a `batch_norm_relu` node B (training, without sums) whose input x is the
output of a `conv2d` node C of the Winograd kernel's form (`winograd_form`),
- C becomes `conv2d_channel_sums(x_in, w) -> (x, sums)` (graphc.ops.batch_norm_relu: sums the
  per-image shift K = x[n, c, 0, 0], sum(x - K) and sum((x - K)^2) in float64, [N, 3, C]),
  at C's place, x keeping its name and its other readers;
- B becomes `batch_norm_relu[..., sums=true](x, weight, bias, running_mean, running_var,
  sums[, r])`, whose statistics are the images' sums merged in image order.
The interpreter computes both ops from their reference kernels, so the rewritten graph means
the same up to the statistics' rounding (float64 sums in another order: docs/performance.md,
§ Rounding; tests/test_conv_channel_sums.py).

Run after `fuse_batch_norm_relu` and before `plan_buffers`; cpu pipeline only (the cuda backend
refuses both ops). Static graphs only (the sums' lowering is compiled per shape, and one
such op in a symbolic graph would have the cpu backend compile it per size). Guarantees:
every value read outside keeps its name; nodes in a topological order (the sums are made where
C was, before B); the result verifies; the input graph is left unchanged.

>>> from graphc.ir import parse
>>> g = fuse_conv_channel_sums(parse('''graph @f(%x: f32[2,16,4,4], %k: f32[16,16,3,3],
...     %w: f32[16], %b: f32[16], %m: f32[16], %v: f32[16]) -> (f32[2,16,4,4],
...     bool[2,16,4,4]) {
...   %0: f32[2,16,4,4] = conv2d[stride=(1, 1), padding=(1, 1), dilation=(1, 1),
...       groups=1](%x, %k)
...   %1: f32[2,16,4,4], %2: bool[2,16,4,4], %3: f32[16], %4: f32[16] =
...       batch_norm_relu[training=true, eps=1e-05](%0, %w, %b, %m, %v)
...   return (%1, %2)
... }'''))
>>> [node.op for node in g.nodes], str(g.nodes[0].outputs[1].type)
(['conv2d_channel_sums', 'batch_norm_relu'], 'f64[2,3,16]')
"""

from __future__ import annotations

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.batch_norm_relu import sums_type
from graphc.types import float32, float64

__all__ = ["fuse_conv_channel_sums", "winograd_form"]

FUSE = True  # False: the pass leaves every graph as it is (benchmarks' A/B)
# the Winograd kernel's least channel count in and out (graphc.backends.cpu.conv_winograd.
# MIN_CHANNELS and conv_polyphase.MIN_CHANNELS), the polyphase kernel's most (winograd_gemm.
# MAX_K); tests/test_conv_channel_sums.py checks they agree
MIN_CHANNELS = 16
MAX_STRIDE_2_CHANNELS = 512
# the few-channel kernel's most input channels (graphc.backends.cpu.conv_few_channels.
# MAX_CHANNELS: ResNet's stem, 3 -> 64)
FEW_CHANNELS = 8


def winograd_form(conv: Node) -> bool:
    """Whether the cpu backend runs `conv` (a conv2d node) by a Winograd kernel whose output
    transform sums the channels: a static batched 3x3 convolution, dilation 1, one group, at
    least MIN_CHANNELS channels in and out, an even output height and width, and either
    stride 1, float32 or float64 (graphc.backends.cpu.conv_winograd `_applies`), or stride 2,
    padding 1, float32, at most MAX_STRIDE_2_CHANNELS channels in and out (conv_polyphase
    `_applies`; on a host without its GEMM the lowering sums in a walk of its own); or, by
    the few-channel kernel (conv_few_channels), a float32 stride-1 one of at most
    FEW_CHANNELS input channels, any output plane."""
    x, w = conv.inputs
    y = conv.outputs[0]
    if x.type.is_symbolic or y.type.ndim != 4 or y.type.dtype not in (float32, float64):
        return False
    o, c, kh, kw = w.type.shape
    stride = tuple(conv.attrs["stride"])
    stride_2 = (stride == (2, 2) and tuple(conv.attrs["padding"]) == (1, 1)
                and y.type.dtype == float32 and max(o, c) <= MAX_STRIDE_2_CHANNELS)
    if ((kh, kw) != (3, 3) or tuple(conv.attrs["dilation"]) != (1, 1)
            or conv.attrs["groups"] != 1 or y.type.shape[0] == 0):
        return False
    if stride == (1, 1) and c <= FEW_CHANNELS and y.type.dtype == float32:
        return True
    return ((stride == (1, 1) or stride_2) and min(o, c) >= MIN_CHANNELS
            and y.type.shape[2] % 2 == 0 and y.type.shape[3] % 2 == 0)


def fuse_conv_channel_sums(graph: Graph) -> Graph:
    """Hand each eligible batch norm its convolution's sums (see the module docstring).
    Returns a new graph, or the same one when nothing changed."""
    if not FUSE or any(v.type.is_symbolic for v in graph.inputs):
        return graph  # (a symbolic graph: its lowerings take sizes per call, this one not)
    maker = graph.producers()
    names = {v.name for v in graph.inputs} | set().union(*(
        {v.name for v in node.outputs} for node in graph.nodes))
    replaced: dict[int, Node] = {}
    for node in graph.nodes:
        if (node.op != "batch_norm_relu" or not node.attrs.get("training")
                or node.attrs.get("sums")):
            continue
        x = node.inputs[0]
        conv = maker.get(x)
        if conv is None or conv.op != "conv2d" or id(conv) in replaced or not winograd_form(conv):
            continue
        name = _fresh(f"{x.name}_sums", names)
        sums = Value(name, sums_type(x.type))
        replaced[id(conv)] = Node("conv2d_channel_sums", list(conv.inputs), dict(conv.attrs),
                                  [x, sums], conv.loc)
        replaced[id(node)] = Node("batch_norm_relu", [*node.inputs[:5], sums, *node.inputs[5:]],
                                  dict(node.attrs, sums=True), list(node.outputs), node.loc)
    if not replaced:
        return graph
    nodes = [replaced.get(id(n), n) for n in graph.nodes]
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or `name` with a number, not in `taken` (which it joins)."""
    k, fresh = 0, name
    while fresh in taken:
        k += 1
        fresh = f"{name}{k}"
    taken.add(fresh)
    return fresh
