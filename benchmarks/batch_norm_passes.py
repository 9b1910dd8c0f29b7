"""ResNet-18's batch-norm forward kernels, channel by channel and image by image, in one
process, and their rounding on hostile inputs.

    python -m benchmarks.batch_norm_passes                 # 7 alternated rounds
    python -m benchmarks.batch_norm_passes --rounds 3 --accuracy-only
    python -m benchmarks.batch_norm_passes --step --rounds 9   # the whole training step
    python -m benchmarks.batch_norm_passes --relu --rounds 9   # batch norm + ReLU, fused or not
    python -m benchmarks.batch_norm_passes --conv-sums --rounds 9  # statistics in the conv
    python -m benchmarks.batch_norm_passes --backward --rounds 9   # the backward, fused or not
    python -m benchmarks.batch_norm_passes --cold --rounds 64      # two kernels, caches cold

For each batch-norm shape of benchmarks/model_steps.py's ResNet-18 step (batch 32: 64
channels at 32x32, 128 at 16x16, 256 at 8x8, 512 at 4x4) the one-op `batch_norm` graph
(training) is compiled once per variant (`--variants`), each with its own GRAPHC_CACHE_DIR,
graphc.backends.cpu.batch_norm's settings changed while it compiles: "by-channel" (IMAGE_ORDER
= False: the kernel before, channel by channel the mean, the squared deviations and the
output), "no-prefetch" (PREFETCH = False: image by image, shifted sums, then the
output), "one-block" (the same, prefetching ahead: the statistics walk over all of x, then
the output walk) and "by-image" (the default: the same in blocks of channels,
CHANNEL_BLOCK_BYTES, each block's two walks one after the other, so the second reads x from
L2). Each kernel is
called natively (benchmarks.profiles.native_call), the variants alternated, each sample >= 40
ms of this process's CPU time at one thread; it prints the medians and GB/s of the nominal
bytes (x read once, the output written once).

Rounding: per input kind (normal; mean 1e4, deviation 1e-2; mean 1e5, deviation 1e-1; a
channel whose first elements are an outlier 10^4 deviations away), each variant's distance
from a float64 run (numpy, two passes over the float32 input upcast) over eager graphc's
(graphc.ops' numpy kernel), for the output, the mean and invstd: the rule of
docs/performance.md, at most 2.

`--step`: the ResNet-18 training step compiled per variant from one set of weights, timed in
alternation (benchmarks.resnet18_bytes.compare_steps: step medians and the memory-bound
kernels by op list).

`--relu`: per layer, the training batch norm followed by the fused ReLU with its mask
(`fused[relu, gt]`, and `fused[add, relu, gt]` with a residual), as two kernels ("separate")
and as one `batch_norm_relu` (graphc.passes.batch_norm_relu: "fused"), each compiled once,
called natively in alternated rounds as above.

`--conv-sums`: per layer, the 3x3 convolution (C -> C, padding 1: the Winograd kernel; and the
three stride-2 ones, C -> 2C: the polyphase kernel) alone and followed by its
`batch_norm_relu`, each with the statistics walked by the batch norm ("walk") and summed by
the convolution's output transform (graphc.passes.conv_channel_sums: "in conv"), compiled
once, called natively in alternated rounds as above; the pairs checked to agree within
rounding first.

`--backward`: per layer, batch norm + ReLU's backward without and with the residual's
gradient added, as the row passes leave it (two fused nodes: the sums, then the apply;
tests.test_batch_norm_backward.backward_graph) and as one `batch_norm_relu_backward`
(graphc.passes.batch_norm_backward) walking blocks of channels (graphc.backends.cpu.
batch_norm_backward.CHANNEL_BLOCK_BYTES) or all channels in one block, each compiled once,
called natively in alternated rounds as above; the fused ones checked against the two nodes
within float32 rounding first. GB/s: the two nodes' nominal bytes (each input and output of
each node once) over each variant's time.

`--cold`: per layer, with and without a residual, two kernels as they run in the step, where
their inputs come from memory: `batch_norm_relu[sums=true]` alone (given per-image sums; its
output walk with and without prefetch hints, graphc.backends.cpu.batch_norm.
PREFETCH_SUMS_WALK) and the backward's sums node alone (the two-node form of `--backward`:
its rows of 1024 summed whole or 256 at a time, graphc.backends.cpu.prefetch.
REDUCED_ROW_BLOCK). Each call is timed alone (CPU time) after 48 MB are written (past the
32 MB L3), the variants alternated, `--rounds` samples, medians; the variants' results are
checked to agree within float32 rounding first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager

import numpy as np

LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))  # (channels, plane side)
STRIDE_2_LAYERS = ((64, 32), (128, 16), (256, 8))  # (channels in, input side): C -> 2C, stride 2
# graphc.backends.cpu.batch_norm's settings per variant
VARIANTS = {"by-channel": {"IMAGE_ORDER": False},
            "no-prefetch": {"PREFETCH": False, "CHANNEL_BLOCK_BYTES": None},
            "one-block": {"CHANNEL_BLOCK_BYTES": None},
            "by-image": {}}
INPUTS = ("normal", "mean 1e4 sd 1e-2", "mean 1e5 sd 1e-1", "outlier first")


@contextmanager
def variant(root: str, name: str):
    """The variant's settings (see the module docstring) and its own cache folder."""
    from graphc.backends.cpu import batch_norm as module

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)
    kept = {key: getattr(module, key) for key in VARIANTS[name]}
    for key, value in VARIANTS[name].items():
        setattr(module, key, value)
    try:
        yield
    finally:
        for key, value in kept.items():
            setattr(module, key, value)


def compiled(root: str, name: str, shape: tuple):
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers
    from tests.test_cpu_backend import one_op_graph

    c = shape[1]
    graph = one_op_graph("batch_norm", [(shape, "float32")] + [((c,), "float32")] * 4,
                         training=True, eps=1e-5)
    with variant(root, name):
        plan_buffers(graph)
        return CpuExecutable(graph)


def arguments(rng, shape: tuple, kind: str) -> list[np.ndarray]:
    c = shape[1]
    x = rng.standard_normal(shape)
    if kind == "mean 1e4 sd 1e-2":
        x = 1e4 + 1e-2 * x
    elif kind == "mean 1e5 sd 1e-1":
        x = 1e5 + 1e-1 * x
    elif kind == "outlier first":
        x[0, :, 0] = 1e4
    params = [rng.uniform(0.5, 2, c), rng.uniform(-1, 1, c), np.zeros(c), np.ones(c)]
    return [a.astype(np.float32) for a in [x] + params]


def float64_run(x, weight, bias) -> list[np.ndarray]:
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes)
    var = ((xd - mean.reshape(bshape)) ** 2).mean(axis=axes)
    invstd = 1.0 / np.sqrt(var + 1e-5)
    out = (xd - mean.reshape(bshape)) * (invstd * weight).reshape(bshape) + \
        bias.reshape(bshape)
    return [out, mean, invstd]


def distance(got, want) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want),
                                                                       1e-300))


def accuracy(root: str, names) -> list[str]:
    from graphc.ops.registry import REGISTRY

    lines = ["| input | layer | output | mean | invstd |", "|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for kind in INPUTS:
        for channels, side in LAYERS[::3]:
            shape = (32, channels, side, side)
            args = arguments(rng, shape, kind)
            want = float64_run(*args[:3])
            eager = REGISTRY["batch_norm"].kernel(*args, training=True, eps=1e-5)
            cells = []
            for k in range(3):
                base = distance(eager[k], want[k])
                ratios = []
                for name in names:
                    got = compiled(root, name, shape).run(*args)[k]
                    d = distance(got, want[k])
                    ratios.append("=" if d == base else
                                  f"{d / base:.2f}x" if base else f"{d:.1e} (eager 0)")
                cells.append(" / ".join(ratios))
            lines.append(f"| {kind} | {channels} | " + " | ".join(cells) + " |")
    return lines


def speed(root: str, rounds: int, names) -> list[str]:
    from benchmarks.profiles import native_call

    lines = ["| layer (N = 32) | " + " | ".join(names) + " | GB/s |",
             "|---" * (len(names) + 2) + "|"]
    rng = np.random.default_rng(1)
    for channels, side in LAYERS:
        shape = (32, channels, side, side)
        args = arguments(rng, shape, "normal")
        calls = [native_call(compiled(root, name, shape), args) for name in names]
        times = _alternated(calls, rounds)
        medians = [statistics.median(t) for t in times]
        nominal = 2 * args[0].nbytes
        lines.append(f"| {channels} channels, {side}x{side} | " +
                     " | ".join(f"{m * 1e3:.3f} ms" for m in medians) + " | " +
                     " -> ".join(f"{nominal / m / 1e9:.1f}" for m in medians) + " |")
    return lines


def relu_graph(shape: tuple, residual: bool):
    """batch_norm then fused[(add,) relu, gt], as the ResNet-18 step's `fuse` leaves them."""
    from graphc.ir import parse

    t, c = "f32[" + ",".join(map(str, shape)) + "]", f"f32[{shape[1]}]"
    m = "bool" + t[3:]
    full = '("full", (), (("shape", ()), ("value", 0.0), ("dtype", "float32")))'
    body = (f'("add", (0, 1), ()), ("relu", (2,), ()), {full}, ("gt", (3, 4), ())'
            if residual else f'("relu", (0,), ()), {full}, ("gt", (1, 2), ())')
    outs, args = ("(3, 5)", "%0, %r") if residual else ("(1, 3)", "%0")
    return parse(f"""graph @bn_relu(%x: {t}, %w: {c}, %b: {c}, %m: {c}, %v: {c}, %r: {t})
        -> ({t}, {m}, {c}, {c}) {{
      %0: {t}, %1: {c}, %2: {c} = batch_norm[training=true, eps=1e-05](%x, %w, %b, %m, %v)
      %3: {t}, %4: {m} = fused[body=({body}), outputs={outs}]({args})
      return (%3, %4, %1, %2)
    }}""")


def relu_speed(root: str, rounds: int) -> list[str]:
    """The --relu table (module docstring); each layer's variants checked equal first."""
    from benchmarks.profiles import native_call
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.batch_norm_relu import fuse_batch_norm_relu
    from graphc.passes.plan import plan_buffers

    lines = ["| layer (N = 32) | residual | separate | fused | saved |", "|---|---|---|---|---|"]
    rng = np.random.default_rng(2)
    for channels, side in LAYERS:
        shape = (32, channels, side, side)
        args = arguments(rng, shape, "normal") + [rng.standard_normal(shape).astype(np.float32)]
        for residual in (False, True):
            calls, results = [], []
            for name in ("separate", "fused"):
                os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)
                graph = relu_graph(shape, residual)
                if name == "fused":
                    graph = fuse_batch_norm_relu(graph)
                plan_buffers(graph)
                executable = CpuExecutable(graph)
                results.append(executable.run(*[a.copy() for a in args]))
                calls.append(native_call(executable, args))
            if not all(np.array_equal(a, b) for a, b in zip(*results)):
                raise AssertionError(f"{shape}: the fused kernel's bits differ")
            times = _alternated(calls, rounds)
            a, b = (statistics.median(t) for t in times)
            lines.append(f"| {channels} channels, {side}x{side} | {'yes' if residual else 'no'} "
                         f"| {a * 1e3:.3f} ms | {b * 1e3:.3f} ms | {(a - b) * 1e3:.3f} ms |")
    return lines


def conv_sums_graph(shape: tuple, with_bn: bool, in_conv: bool, stride: int = 1):
    """conv2d (3x3, padding 1, C -> C; stride 2: C -> 2C) [then batch_norm_relu], the conv
    output returned too; `in_conv`: after graphc.passes.conv_channel_sums (alone:
    conv2d_channel_sums)."""
    from graphc.ir import parse
    from graphc.passes.conv_channel_sums import fuse_conv_channel_sums

    n, ci, side = shape[0], shape[1], shape[2]
    c, so = ci * stride, side // stride
    t_in = "f32[" + ",".join(map(str, shape)) + "]"
    t, p, m = f"f32[{n},{c},{so},{so}]", f"f32[{c}]", f"bool[{n},{c},{so},{so}]"
    conv = (f"conv2d[stride=({stride}, {stride}), padding=(1, 1), dilation=(1, 1), "
            "groups=1](%x, %k)")
    if not with_bn:
        op = "conv2d_channel_sums" if in_conv else "conv2d"
        outs = f"%0: {t}, %s: f64[{n},3,{c}]" if in_conv else f"%0: {t}"
        rets = ("%0, %s", f"{t}, f64[{n},3,{c}]") if in_conv else ("%0", t)
        return parse(f"""graph @conv(%x: {t_in}, %k: f32[{c},{ci},3,3]) -> ({rets[1]}) {{
          {outs} = {op}{conv[6:]}
          return ({rets[0]})
        }}""")
    graph = parse(f"""graph @conv_bn(%x: {t_in}, %k: f32[{c},{ci},3,3], %w: {p}, %b: {p},
        %m: {p}, %v: {p}) -> ({t}, {m}, {p}, {p}, {t}) {{
      %0: {t} = {conv}
      %1: {t}, %2: {m}, %3: {p}, %4: {p} = batch_norm_relu[training=true, eps=1e-05](%0, %w,
          %b, %m, %v)
      return (%1, %2, %3, %4, %0)
    }}""")
    return fuse_conv_channel_sums(graph) if in_conv else graph


def conv_sums_speed(root: str, rounds: int) -> list[str]:
    """The --conv-sums table (module docstring)."""
    from benchmarks.profiles import native_call
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers

    lines = ["| layer (N = 32) | conv, walk | conv, in conv | conv + bn, walk | "
             "conv + bn, in conv | saved |", "|---|---|---|---|---|---|"]
    rng = np.random.default_rng(3)
    layers = [(c, side, 1) for c, side in LAYERS] + [(c, side, 2) for c, side in STRIDE_2_LAYERS]
    for channels, side, stride in layers:
        shape = (32, channels, side, side)
        x = rng.standard_normal(shape).astype(np.float32)
        co = channels * stride
        k = (rng.uniform(-1, 1, (co, channels, 3, 3)) / np.sqrt(9 * channels)).astype(
            np.float32)
        params = [rng.uniform(0.5, 2, co).astype(np.float32) for _ in range(4)]
        calls, results = [], []
        for with_bn in (False, True):
            for in_conv in (False, True):
                os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, f"{with_bn}{in_conv}")
                graph = conv_sums_graph(shape, with_bn, in_conv, stride)
                plan_buffers(graph)
                executable = CpuExecutable(graph)
                args = [x, k] + (params if with_bn else [])
                results.append(executable.run(*[a.copy() for a in args]))
                calls.append(native_call(executable, args))
        for a, b in zip(results[2], results[3]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        times = _alternated(calls, rounds)
        med = [statistics.median(t) for t in times]
        name = f"{channels} channels, {side}x{side}" if stride == 1 else \
            f"{channels} -> {co}, stride 2, {side}x{side}"
        lines.append(f"| {name} | " +
                     " | ".join(f"{m * 1e3:.3f} ms" for m in med) +
                     f" | {(med[2] - med[3]) * 1e3:.3f} ms |")
    return lines


BACKWARD_VARIANTS = {"two nodes": None, "one block": {"CHANNEL_BLOCK_BYTES": None},
                     "blocks": {}}


def backward_speed(root: str, rounds: int) -> list[str]:
    """The --backward table (module docstring)."""
    from benchmarks.profiles import native_call
    from graphc.backends.cpu import batch_norm_backward as kernel_module
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.ir import parse
    from graphc.passes import batch_norm_backward as backward_pass
    from graphc.passes.plan import plan_buffers
    from tests.test_batch_norm_backward import backward_graph, backward_inputs

    backward_pass.FUSE = True  # (off by default: this table is why)

    names = list(BACKWARD_VARIANTS)
    lines = ["| layer (N = 32) | residual | " + " | ".join(names) + " | GB/s |",
             "|---" * (len(names) + 3) + "|"]
    for channels, side in LAYERS:
        shape = (32, channels, side, side)
        for residual in (False, True):
            args = backward_inputs(shape, residual, seed=channels)
            calls, results = [], []
            for name, settings in BACKWARD_VARIANTS.items():
                os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, "backward " + name)
                graph = parse(backward_graph(shape, residual))
                if settings is not None:
                    graph = backward_pass.fuse_batch_norm_backward(graph)
                    assert graph.nodes[0].op == "batch_norm_relu_backward", graph
                kept = {key: getattr(kernel_module, key) for key in settings or {}}
                for key, value in (settings or {}).items():
                    setattr(kernel_module, key, value)
                try:
                    plan_buffers(graph)
                    executable = CpuExecutable(graph)
                finally:
                    for key, value in kept.items():
                        setattr(kernel_module, key, value)
                results.append(executable.run(*[a.copy() for a in args]))
                calls.append(native_call(executable, args))
            for got in results[1:]:
                for g, w in zip(got, results[0]):
                    np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
            times = _alternated(calls, rounds)
            medians = [statistics.median(t) for t in times]
            big, mask = args[0].nbytes, args[1].nbytes
            # sums: dy (+ dr) and mask and x read (g written); apply: g (or dy, mask) and x
            nominal = (big * (4 if residual else 2) + mask * (1 if residual else 2)
                       + big * (3 if residual else 3))
            lines.append(f"| {channels} channels, {side}x{side} | {'yes' if residual else 'no'}"
                         " | " + " | ".join(f"{m * 1e3:.3f} ms" for m in medians) + " | " +
                         " -> ".join(f"{nominal / m / 1e9:.1f}" for m in medians) + " |")
    return lines


def sums_relu_graph(shape: tuple, residual: bool) -> str:
    """batch_norm_relu[sums=true] alone (graphc.passes.conv_channel_sums makes it)."""
    n, c = shape[:2]
    t, p = "f32[" + ",".join(map(str, shape)) + "]", f"f32[{c}]"
    r, extra = (f", %r: {t}", ", %r") if residual else ("", "")
    return f"""graph @f(%x: {t}, %w: {p}, %b: {p}, %m: {p}, %v: {p}, %s: f64[{n},3,{c}]{r})
        -> ({t}, bool{t[3:]}, {p}, {p}) {{
      %1: {t}, %2: bool{t[3:]}, %3: {p}, %4: {p} = batch_norm_relu[training=true, eps=1e-05,
          sums=true](%x, %w, %b, %m, %v, %s{extra})
      return (%1, %2, %3, %4)
    }}"""


def sums_relu_inputs(shape: tuple, residual: bool, seed: int) -> list[np.ndarray]:
    """x, the parameters, x's per-image shifted sums (K, S1, S2: [N, 3, C]) [and r]."""
    rng = np.random.default_rng(seed)
    n, c = shape[:2]
    x = (2 * rng.standard_normal(shape) + 1).astype(np.float32)
    planes = x.reshape(n, c, -1).astype(np.float64)
    d = planes - planes[:, :, :1]
    sums = np.stack([planes[:, :, 0], d.sum(-1), (d * d).sum(-1)], axis=1)
    params = [rng.uniform(0.5, 2, c).astype(np.float32) for _ in range(4)]
    return [x, *params, sums] + ([rng.standard_normal(shape).astype(np.float32)]
                                 if residual else [])


def backward_sums_graph(shape: tuple, residual: bool) -> str:
    """The sums node of tests.test_batch_norm_backward.backward_graph alone (its outputs
    returned, the apply node dropped)."""
    from tests.test_batch_norm_backward import backward_graph

    t, c = "f32[" + ",".join(map(str, shape)) + "]", f"f32[{shape[1]}]"
    lines = [line for line in backward_graph(shape, residual).splitlines()
             if not any(name in line for name in ("%wr", "%sgr", "%sgxr", "%dx", "return"))]
    lines[0] = lines[0][:lines[0].index("-> (")] + \
        (f"-> ({c}, {c}, {t}) {{" if residual else f"-> ({c}, {c}) {{")
    return "\n".join(lines[:-1] + ["  return (%sgx, %sg" + (", %g)" if residual else ")"),
                                    "}"])


COLD_CASES = {  # name: (graph, inputs, module, switch, (before, after))
    "batch_norm_relu[sums]": (sums_relu_graph, sums_relu_inputs, "batch_norm",
                              "PREFETCH_SUMS_WALK", (True, False)),
    "backward sums": (backward_sums_graph, None, "prefetch", "REDUCED_ROW_BLOCK", (None, 256)),
}


def cold_speed(root: str, rounds: int) -> list[str]:
    """The --cold table (module docstring)."""
    import importlib

    from benchmarks.profiles import native_call
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.ir import parse
    from graphc.passes.plan import plan_buffers
    from tests.test_batch_norm_backward import backward_inputs

    lines = ["| kernel | switch: before -> after | layer (N = 32) | residual | before | after |",
             "|---|---|---|---|---|---|"]
    for case, (make, inputs, module_name, switch, values) in COLD_CASES.items():
        module = importlib.import_module(f"graphc.backends.cpu.{module_name}")
        for channels, side in LAYERS:
            shape = (32, channels, side, side)
            for residual in (False, True):
                args = inputs(shape, residual, channels) if inputs else \
                    backward_inputs(shape, residual, seed=channels)
                calls, results = [], []
                for value in values:
                    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, f"{case} {value}")
                    kept = getattr(module, switch)
                    setattr(module, switch, value)
                    try:
                        graph = parse(make(shape, residual))
                        plan_buffers(graph)
                        executable = CpuExecutable(graph)
                    finally:
                        setattr(module, switch, kept)
                    results.append(executable.run(*[a.copy() for a in args]))
                    calls.append(native_call(executable, args))
                for got, want in zip(*results):
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
                before, after = (statistics.median(t) for t in _cold(calls, rounds))
                lines.append(f"| {case} | {switch}: {values[0]} -> {values[1]} | {channels} "
                             f"channels, {side}x{side} | {'yes' if residual else 'no'} | "
                             f"{before * 1e3:.3f} ms | {after * 1e3:.3f} ms |")
    return lines


def _cold(calls, rounds: int) -> list[list[float]]:
    """Each call's CPU seconds, one call a sample after 48 MB written (the caches cold),
    `rounds` samples a call, the calls' order reversed every other round."""
    flush = np.zeros(12 << 20, np.float32)
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        order = list(enumerate(calls))
        for k, call in (order if r % 2 else order[::-1]):
            flush += 1.0
            start = time.process_time()
            call()
            times[k].append(time.process_time() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds (7)")
    parser.add_argument("--accuracy-only", action="store_true", help="skip the timing")
    parser.add_argument("--step", action="store_true", help="the whole training step")
    parser.add_argument("--relu", action="store_true",
                        help="batch norm and the ReLU after it, two kernels or one")
    parser.add_argument("--conv-sums", action="store_true",
                        help="the statistics walked by batch norm or summed by the conv")
    parser.add_argument("--backward", action="store_true",
                        help="batch norm + ReLU's backward, two fused nodes or one")
    parser.add_argument("--cold", action="store_true",
                        help="batch_norm_relu[sums] and the backward's sums, caches cold")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                        help="which variants (all)")
    args = parser.parse_args(argv)
    from benchmarks.harness import cache_root, run_with_threads

    run_with_threads("benchmarks.batch_norm_passes", 1, sys.argv[1:] if argv is None else argv)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    with cache_root("batch_norm_passes.") as root:
        if args.conv_sums:
            print("\n".join(conv_sums_speed(root, args.rounds)), flush=True)
            return print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
        if args.cold:
            print("\n".join(cold_speed(root, args.rounds)), flush=True)
            return print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
        if args.backward:
            print("\n".join(backward_speed(root, args.rounds)), flush=True)
            return print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
        if args.relu:
            print("\n".join(relu_speed(root, args.rounds)), flush=True)
            return print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
        if args.step:
            from benchmarks.resnet18_bytes import compare_steps

            print(compare_steps(args.variants, lambda name: variant(root, name), args.rounds))
        else:
            print("\n".join(accuracy(root, args.variants)), flush=True)
        if not (args.step or args.accuracy_only):
            print("\n".join(speed(root, args.rounds, args.variants)), flush=True)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))



def _alternated(calls, rounds: int) -> list[list[float]]:
    """Each call's CPU seconds per run, one sample per call per round (>= 40 ms of runs after
    one untimed run), the calls' order reversed every other round."""
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        order = list(enumerate(calls))
        for k, call in (order if r % 2 else order[::-1]):
            call()
            count, start = 0, time.process_time()
            while time.process_time() - start < 0.04:
                call()
                count += 1
            times[k].append((time.process_time() - start) / count)
    return times


if __name__ == "__main__":
    main()
