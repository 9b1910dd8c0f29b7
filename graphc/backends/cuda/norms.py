"""norms: the cuda backend's batch_norm lowering (graphc.backends.cuda.ops lists it in
`LOWERINGS`).

Training mode: one cooperative reduction per channel (graphc.backends.cuda.reductions) of
the shifted sums of x and x * x, whose finish stores (mean, invstd * weight, bias) per channel
in a scratch table and updates the running statistics (the nodes reading mean and invstd,
when nothing else touches their buffers), then one elementwise pass
y = (x - mean) * (invstd * weight) + bias; when y's only reader is an elementwise node and x
outlives it, that pass is left out and the reader computes y where it reads it
(`Lowerer.inline`, read by the fused bodies of graphc.backends.cuda.fused_kernels).
Inference: the library's elementwise kernel (gc_batch_norm_fwd_f32). float32 only.
"""

from __future__ import annotations

import math

from graphc.backends.cuda import cudagen, reductions
from graphc.backends.cuda.fused_kernels import body_lines
from graphc.backends.cuda.lowering import Addr, Layout, Lowerer, unsupported
from graphc.ir.graph import Node
from graphc.ops.fused import FusedBody
from graphc.ops.registry import ELEMENTWISE, REGISTRY
from graphc.types import TensorType


def lower_batch_norm(lw: Lowerer, node: Node) -> None:
    """Training statistics: cooperative reductions per channel (graphc.backends.cuda.
    reductions, split over N * H * W when the channels are few; the library runs one block a
    channel); inference: the library's elementwise kernel."""
    ins = [lw.contiguous(lw.layouts[v], node) for v in node.inputs]
    y, mean, invstd = (lw.layouts[v] for v in node.outputs)
    if not all(layout.type.dtype.name == "float32" for layout in ins):
        raise unsupported(node, f"batch_norm on {ins[0].type.dtype.name} (float32 only)")
    shape = ins[0].type.shape
    if node.attrs["training"] and math.prod(shape) > 0:
        return _batch_norm_train(lw, node, ins, y, mean, invstd)
    lw.call("gc_batch_norm_fwd_f32", shape[0], shape[1], math.prod(shape[2:]),
            int(node.attrs["training"]), float(node.attrs["eps"]),
            *(Addr(i.offset) for i in ins), Addr(y.offset), Addr(mean.offset),
            Addr(invstd.offset), None)


def _batch_norm_train(lw: Lowerer, node: Node, ins, y: Layout, mean: Layout,
                      invstd: Layout) -> None:
    """Two passes over x: the statistics, then y = (x - mean) * (invstd * w) + b.

    The statistics are one cooperative reduction per channel (split over N * H * W when the
    channels are few) of d = x - x[0, c, 0, ...] and d * d in double: shifted by a value of
    the channel, the variance S2 / m - (S1 / m)^2 cancels at most a factor 1 + m (no value
    lies more than sqrt(m) standard deviations from the mean), far inside double precision,
    so the result is the two-pass one's (mean, then centred squares) to float32 rounding,
    with one read of x fewer. Its finish stores (mean, invstd * w, b) per channel in double
    (scratch) for the elementwise pass, which reads x and that triple only (spans known, so
    it runs several items a thread when large, or shares a launch when small), and computes
    the running-statistics updates that read mean and invstd (`_running_updates`)."""
    x, weight, bias = ins[:3]
    shape = x.type.shape
    channels = shape[1]
    red_dims = [0] + list(range(2, len(shape)))
    red = (tuple(shape[d] for d in red_dims), red_dims)
    count = math.prod(red[0])
    coords = [f"c{d}" for d in range(len(shape))]
    # x[0, c, 0, ...] as a tensor of its own (its bytes are a 1/N slice of x's, which keeps
    # the known spans of a split reduction's second pass narrow)
    firsts = Layout(x.offset, (x.strides[1],), TensorType((channels,), x.type.dtype))
    table = lw.scratch(24 * channels)  # (mean, invstd * weight, bias) per channel, double
    span = (table, table + 24 * channels)

    def update(k) -> list[str]:
        return [f"double d = (double){k.read(x, coords, shape)} - "
                f"(double){k.read(firsts, ['c1'], (channels,))};", "s1 += d;", "s2 += d * d;"]

    def merge() -> list[str]:
        return ["s1 += o_s1;", "s2 += o_s2;"]

    running = _running_updates(lw, node)

    def finish(k) -> list[str]:
        eps = float(node.attrs["eps"]).hex()
        w, b = k.read(weight, ["c1"], (channels,)), k.read(bias, ["c1"], (channels,))
        t = k.ptr(table, span)
        return [f"double gc_m1 = s1 / {count}.0, gc_var = s2 / {count}.0 - gc_m1 * gc_m1;",
                f"double gc_mean = (double){k.read(firsts, ['c1'], (channels,))} + gc_m1;",
                f"double gc_inv = 1.0 / sqrt((gc_var > 0.0 ? gc_var : 0.0) + {eps});",
                f"((double *){t})[3 * c1] = gc_mean;",
                f"((double *){t})[3 * c1 + 1] = gc_inv * (double){w};",
                f"((double *){t})[3 * c1 + 2] = (double){b};",
                f"{k.at(mean, ['c1'])} = (float)gc_mean;",
                f"{k.at(invstd, ['c1'])} = (float)gc_inv;",
                *_running_lines(lw, k, node, running)]

    states = [("s1", "double", "0.0"), ("s2", "double", "0.0")]
    lw.co_nodes = [reader for reader, _ in running]
    try:
        reductions.reduce_kernels(lw, node, channels, ((channels,), [1]), count, red,
                                  reductions.Reducer(states, update, merge, finish))
    finally:
        lw.co_nodes = []

    def normalized(k, at: list[str]) -> str:
        t = k.ptr(table, span, written=False)
        m, sc, b = (f"((double *){t})[3 * {at[1]}{part}]" for part in ("", " + 1", " + 2"))
        return f"(float)(((double){k.read(x, at, shape)} - {m}) * {sc} + {b})"

    if _inline_reader(lw, node.outputs[0], node.inputs[0]):
        lw.inline[node.outputs[0]] = normalized
        return
    k = lw.new_kernel(node, x.type.numel)
    k.lines += cudagen.decompose(shape, "gi")
    k.lines.append(f"{k.at(y, coords)} = {normalized(k, coords)};")
    lw.emit(k)


def _elementwise_body(node: Node) -> FusedBody | None:
    """The body of an elementwise node (a lone op, or a fused body without anchor or
    reduction), else None."""
    if node.op == "fused":
        fb = FusedBody.of_node(node)
        return fb if fb.anchor is None and fb.ending is None else None
    return FusedBody.of_node(node) if REGISTRY[node.op].kind == ELEMENTWISE else None


def _running_updates(lw: Lowerer, node: Node) -> list[tuple[Node, FusedBody]]:
    """The readers of the batch norm's mean and invstd that its statistics kernel computes
    per channel in its finish (the running-statistics updates, each otherwise a kernel of
    a few hundred threads): elementwise over (C,), reading only those two and graph inputs
    that nothing but the batch norm and the reader reads, every output computed into a graph
    input's memory (an update) that nothing else reads either. Each is placed and marked
    done (`Lowerer.ahead`)."""
    stats = node.outputs[1:]
    channels = stats[0].type.shape
    found: list[tuple[Node, FusedBody]] = []
    for reader in [r for v in stats for r in lw.readers(v)]:
        fb = _elementwise_body(reader)
        if fb is None or any(reader is r for r, _ in found):
            continue
        lw.place(reader)
        plan, inputs = lw.plan, {v.name: v for v in lw.graph.inputs}
        if any(out.type.shape != channels or out.name not in plan.in_input
               for out in reader.outputs) or any(ref < fb.n_inputs for ref in fb.outputs):
            continue
        if any(v not in stats and v not in lw.graph.inputs for v in reader.inputs):
            continue
        touched = [v for v in reader.inputs if v not in stats] + \
            [inputs[plan.in_input[out.name]] for out in reader.outputs]
        if any(r is not node and r is not reader for v in touched for r in lw.readers(v)):
            continue
        found.append((reader, fb))
        lw.ahead.add(id(reader))
    return found


def _running_lines(lw: Lowerer, k, node: Node, running) -> list[str]:
    """Statements of `running` (see _running_updates) at channel c1, reading the statistics
    as the float32 values the batch norm stores."""
    channels = node.outputs[1].type.shape
    stats = {node.outputs[1]: "((float)gc_mean)", node.outputs[2]: "((float)gc_inv)"}
    lines = []
    for j, (reader, fb) in enumerate(running):
        env = {i: (stats[v], v.type.dtype) for i, v in enumerate(reader.inputs) if v in stats}
        prefix = f"gc_r{j}_"
        lines += body_lines(lw, k, reader, channels, ["c1"], fb, len(fb), env, prefix)
        lines += [f"{k.at(lw.layouts[out], ['c1'])} = {prefix}v{ref};"
                  for out, ref in zip(reader.outputs, fb.outputs)]
    return lines


def _inline_reader(lw: Lowerer, v, source) -> bool:
    """Whether `v` can be left unstored, computed by its reader from `source` instead: one
    reader, an elementwise node (a lone op, or a fused body without anchor or reduction) of
    `v`'s shape, `v` no result of the graph, and `source` still intact at that reader."""
    readers = lw.readers(v)
    if len(readers) != 1 or v in lw.graph.outputs or any(v is u for _, u in lw.graph.updates):
        return False
    (reader,) = readers
    if _elementwise_body(reader) is None:
        return False
    return all(out.type.shape == v.type.shape for out in reader.outputs) and \
        lw.live_until(source, reader)


__all__ = ["lower_batch_norm"]
