"""conv_channel_sums: the lowering of `conv2d_channel_sums` (graphc.ops.batch_norm_relu, made
by graphc.passes.conv_channel_sums): conv2d's output and, per image and output channel, its
shifted sums (float64 [N, 3, O]: K = out[n, o, 0, 0], sum(out - K), sum((out - K)^2)) for the
batch norm after it (graphc.backends.cpu.batch_norm reads them instead of walking out).

The Winograd kernel (graphc.backends.cpu.conv_winograd) adds the sums in its output transform,
from the rows each part just wrote (in L1), and so does the stride-2 polyphase kernel
(graphc.backends.cpu.conv_polyphase) from each plane it just wrote, and the few-channel kernel
(graphc.backends.cpu.conv_few_channels: the stem) from each image's planes while they are in
cache; the pass only makes the op for convolutions of those forms (graphc.passes.
conv_channel_sums.winograd_form). Any other (a form the kernels decline after all) is lowered
as conv2d, then a kernel that walks out once for the sums (`_sums_kernel`), by the same
per-plane code: correct, and no faster than the batch norm's own statistics walk.

Invariants: each image's sums are one thread's, added in one order fixed by the code, so the
result is the same bits on any number of threads.
"""

from __future__ import annotations

from graphc.backends.cpu import conv, conv_few_channels, conv_polyphase, conv_winograd
from graphc.backends.cpu.conv_im2col import Geometry
from graphc.backends.cpu.image_kernels import (
    called_kernel,
    contiguous_in,
    contiguous_out,
    iadd,
    image_kernel,
    imul,
)
from graphc.backends.cpu.values import loop
from graphc.backends.cpu.winograd_transforms import add_plane_sums
from graphc.ir.graph import Node

__all__ = ["conv2d_channel_sums"]


def conv2d_channel_sums(lw, node: Node) -> None:
    """out = conv2d(x, w) and sums = its per-image shifted sums (the module docstring)."""
    x, w = (lw.locs[v] for v in node.inputs)
    out_v, sums_v = node.outputs
    attrs = node.attrs
    n, c, h, wd = x.type.shape
    o, _, kh, kw = w.type.shape
    g = Geometry(n, c, h, wd, o, attrs["groups"], kh, kw, out_v.type.shape[2],
                 out_v.type.shape[3], tuple(attrs["stride"]), tuple(attrs["padding"]),
                 tuple(attrs["dilation"]))
    out = lw.locs[out_v]
    with contiguous_out(lw, lw.locs[sums_v]) as sums:
        if conv_few_channels.conv2d(lw, node, g, x, w, out, None, sums) is not None or \
                conv_winograd.conv2d(lw, node, g, x, w, out, sums) or \
                conv_polyphase.conv2d(lw, node, g, x, w, out, sums):
            return
        conv.conv2d(lw, node, x, w, out, attrs)
        _sums_kernel(lw, out, sums)


def _sums_kernel(lw, out, sums) -> None:
    """sums of `out` (which the convolution just wrote), one walk, plane by plane."""
    src = contiguous_in(lw, out)
    n, co, ho, wo = out.type.shape
    plane = ho * wo
    kb, (oi, si) = image_kernel(lw, "conv2d_channel_sums", [src, sums], ("planes",))
    b = kb.begin()
    if b is None:
        return lw.calls.append(called_kernel(lw, kb.kernel, None))
    with loop(b, 0, n, "n") as k, loop(b, 0, co, "o") as ch:
        at = imul(b, iadd(b, imul(b, k, co), ch), plane)
        add_plane_sums(b, kb, out.type.dtype, oi, at, at, plane, si, k, ch, co, first=True)
    lw.calls.append(called_kernel(lw, kb.finish(b), None))
