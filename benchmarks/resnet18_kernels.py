"""Where ResNet-18's training step spends its time, by kernel class, and the Winograd
kernels' transform share.

    python -m benchmarks.resnet18_kernels                 # classes, then transforms
    python -m benchmarks.resnet18_kernels --only classes --repeat 5

`classes`: benchmarks/model_steps.py's ResNet-18 step (CIFAR, width 64, batch 32) under
graphc.profile (1 thread: OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1; each kernel's median
of `--repeat` runs, timed inside the step), its rows grouped by class: each convolution
kernel by pass (forward, input gradient, weight gradient) and geometry (3x3 stride 1 with 16
channels or more, the shapes conv_winograd takes; 3x3 stride 2; 1x1; the few-channel
stem), the rest by op. GFLOP/s are the direct convolution's 2*N*O*C*kH*kW*H_out*W_out over
the time, so a Winograd kernel can pass the machine's SGEMM rate.
`transforms`: each stride-1 3x3 layer shape of the step (batch 32), each pass, compiled as
a one-op graph twice, as is and with its GEMMs removed (conv_im2col.Conv.gemm emits nothing
while it compiles: what is left is the transforms and copies), timed natively in alternation
(5 rounds of >= 40 ms of CPU time, medians); the GEMMs' rate is the transform-domain work
2*N*O*C*16*(H/2)*(W/2) over the difference.
`block-gemm`: the same one-op graphs compiled with the block's 16 GEMMs as one call of
graphc.backends.cpu.winograd_gemm's generated function (where it takes the shape) and as
16 BLAS calls (winograd_gemm.ENABLED off while it compiles), timed the same way
(`--rounds` rounds).
`transform-parts`: each pass's kernel without its GEMMs (as `transforms`), and again with
one transform also emitting nothing (conv_winograd's filter_transform or, in the weight
gradient, weight_out: G^T dU G; input_tiles; winograd_transforms.pad_plane, the padded
plane's copy, inside input_tiles), timed the same way (`--rounds` rounds): what each
saves; the rest is the output transform (or the weight gradient's Y = A gy A^T) and loop
overhead. (Removing a part also changes what the others find in cache.)
`plane-vectors`: the same with the small planes' input transform in vectors of 16 tiles
(graphc.backends.cpu.winograd_transforms.planes_by_vectors) and as the tile loop through a
padded plane (PLANE_VECTORS off while it compiles); the 64- and 128-channel layers do not
take it.
`row-vectors`: the same for the 64- and 128-channel layers, their input transform 16 tiles a
vector along tile rows (winograd_transforms.rows_by_vectors) and as the tile loop
(ROW_VECTORS off while it compiles).
`row-split`: the whole step compiled twice, the stride-2 forward and input-gradient GEMMs
by the generated function (graphc.backends.cpu.conv_row_split) and in their BLAS calls, each
with its own GRAPHC_CACHE_DIR; the steps timed in alternation (`--rounds` samples), then the
stride-2 and 1x1 kernels by weight shape (graphc.profile, `--repeat` runs, 3 alternated
rounds). `switches`: the same with the tenth session's three changes turned back by their
switches (TENTH_SESSION) against the defaults; `eleventh`: with the eleventh session's
(ELEVENTH_SESSION: the 512-channel weight gradient of conv_winograd_wide_grad, the stride-2
forward and input gradient of conv_polyphase) turned back, the stride-1 weight gradients'
class shown too. `eleventh-kernels`: the kernels those switches change (the 512-channel
weight gradient, the three stride-2 forwards, the 64 -> 128 and 128 -> 256 input
gradients), each as a one-op graph at batch 32 compiled with the switches off and on,
timed natively in alternation (`--rounds` rounds), with each one's distance from a float64
run over eager graphc's.
`switch`: each pass of the `--channels` layers (batch 32) compiled with a module-level
switch under graphc.backends.cpu (`--switch winograd_filters.FILTER_VECTORS`) set to each
of `--values` (default False, True), timed natively in alternation (`--rounds` rounds), with
each build's largest difference from the first's (relative to the largest output).
`thirteenth`: as `switches` with the thirteenth session's switches (THIRTEENTH_SESSION: the
Winograd filter transforms one filter at a time) against the defaults, the stride-1 3x3
classes shown; `fourteenth` the same with the fourteenth session's (FOURTEENTH_SESSION:
the stride-1 Winograd transforms' streamed stores, loop order, prefetches and sums).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))  # (channels, plane side)
PASSES = ("conv2d", "conv2d_input_grad", "conv2d_weight_grad")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("classes", "transforms", "block-gemm",
                                           "plane-vectors", "row-vectors", "transform-parts",
                                           "row-split", "row-split-kernels", "switches",
                                           "eleventh", "eleventh-kernels", "switch",
                                           "thirteenth", "fourteenth"),
                        help="one of them (default: classes and transforms)")
    parser.add_argument("--repeat", type=int, default=5, help="profiled runs (5)")
    parser.add_argument("--rounds", type=int, default=15, help="block-gemm: alternated "
                        "rounds (15)")
    parser.add_argument("--switch", help="switch: a module.NAME under graphc.backends.cpu")
    parser.add_argument("--values", nargs="+", default=["False", "True"],
                        help="switch: the values to compare (Python literals)")
    parser.add_argument("--channels", type=int, nargs="+", default=[c for c, _ in LAYERS],
                        help="switch: the layers (channels) to time")
    args = parser.parse_args(argv)
    for flag, value in (("--repeat", args.repeat), ("--rounds", args.rounds)):
        if value < 1:  # else the step compiles, then every figure is the median of nothing
            parser.error(f"{flag} must be at least 1, got {value}")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if args.only in (None, "classes"):
        print(kernel_classes(args.repeat), flush=True)
    if args.only in (None, "transforms"):
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            for channels, side in LAYERS:
                print(transform_share(root, channels, side), flush=True)
    if args.only == "block-gemm":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            for channels, side in LAYERS:
                print(block_gemm_gain(root, channels, side, args.rounds), flush=True)
    if args.only in ("thirteenth", "fourteenth"):
        from benchmarks.harness import cache_root

        off = THIRTEENTH_SESSION if args.only == "thirteenth" else FOURTEENTH_SESSION
        with cache_root("resnet18_kernels.") as root:
            print(switches_gain(root, args.rounds, args.repeat, off=off,
                                shown=("3x3 stride 1",)), flush=True)
    if args.only == "switch":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            for channels, side in LAYERS:
                if channels in args.channels:
                    print(switch_gain(root, channels, side, args.rounds, args.switch,
                                      args.values), flush=True)
    if args.only == "transform-parts":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            for channels, side in LAYERS:
                print(transform_parts(root, channels, side, args.rounds), flush=True)
    if args.only == "plane-vectors":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            for channels, side in LAYERS[2:]:
                print(plane_vectors_gain(root, channels, side, args.rounds), flush=True)
    if args.only == "row-vectors":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            for channels, side in LAYERS[:2]:
                print(plane_vectors_gain(root, channels, side, args.rounds,
                                         flag="ROW_VECTORS"), flush=True)
    if args.only == "row-split":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            print(row_split_gain(root, args.rounds, args.repeat), flush=True)
    if args.only == "switches":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            print(switches_gain(root, args.rounds, args.repeat), flush=True)
    if args.only == "eleventh":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            print(switches_gain(root, args.rounds, args.repeat, off=ELEVENTH_SESSION,
                                shown=("stride 2", "1x1", "weight_grad 3x3 stride 1")),
                  flush=True)
    if args.only == "eleventh-kernels":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            print(eleventh_kernels(root, args.rounds), flush=True)
    if args.only == "row-split-kernels":
        from benchmarks.harness import cache_root

        with cache_root("resnet18_kernels.") as root:
            print(row_split_kernels(root, args.rounds), flush=True)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def _conv_class(node, by_shape: bool = False) -> tuple[str, int] | None:
    """(class, direct-convolution flops) of a convolution node or fused convolution, or
    None; `by_shape`: a stride-2 or 1x1 class per weight shape."""
    if node.op not in PASSES + ("conv2d_channel_sums",):  # (the forward, summing its output
        return None                                      # for the batch norm: conv2d's class)
    if node.op == "conv2d_weight_grad":
        gy = node.inputs[0]
        w = node.outputs[0].type.shape
        out_hw = gy.type.shape[-2:]
    elif node.op == "conv2d_input_grad":
        gy, weight = node.inputs
        w, out_hw = weight.type.shape, gy.type.shape[-2:]
    else:
        w, out_hw = node.inputs[1].type.shape, node.outputs[0].type.shape[-2:]
    n = node.inputs[0].type.shape[0]
    stride = tuple(node.attrs.get("stride", (1, 1)))
    if tuple(w[2:]) == (3, 3) and stride == (1, 1) and min(w[0], w[1]) >= 16:
        geometry = "3x3 stride 1"
    elif w[1] <= 8:
        geometry = "stem"
    elif tuple(w[2:]) == (1, 1):
        geometry = "1x1"
    else:
        geometry = f"{w[2]}x{w[3]} stride {stride[0]}"
    if by_shape and geometry in ("1x1", "3x3 stride 2"):
        geometry += f" {w[1]} -> {w[0]}"
    op = "conv2d" if node.op == "conv2d_channel_sums" else node.op
    return f"{op} {geometry}", 2 * n * w[0] * w[1] * w[2] * w[3] * out_hw[0] * out_hw[1]


def kernel_classes(repeat: int) -> str:
    """A markdown table of the step's kernel time by class (see the module docstring)."""
    import graphc
    from benchmarks import model_steps, models

    shape = model_steps.FULL["resnet18"]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, "resnet18", shape)
    x, y = model_steps.batch_of("resnet18", shape)
    step = graphc.compile(models.graphc_step(model), backend="cpu")
    report = graphc.profile(step, graphc.tensor(x), graphc.tensor(y), repeat=repeat)
    classes = _classify(report)
    total = sum(e[1] for e in classes.values())
    lines = [f"native step {report.total * 1e3:.1f} ms, kernels {total * 1e3:.1f} ms", "",
             "| kernel class | count | time | share | GFLOP/s |", "|---|---|---|---|---|"]
    for name, (count, seconds, flops) in sorted(classes.items(), key=lambda kv: -kv[1][1]):
        rate = f"{flops / seconds / 1e9:.0f}" if flops and seconds else ""
        lines.append(f"| {name} | {count} | {seconds * 1e3:.1f} ms | {seconds / total:.0%} | "
                     f"{rate} |")
    return "\n".join(lines)


def _classify(report, by_shape: bool = False) -> dict[str, list]:
    """{class: [kernels, seconds, direct-convolution flops]} of a graphc.profile report
    (`by_shape`: as _conv_class)."""
    from graphc.ops.fused import FusedBody

    producer = {v.name: node for node in report.graph.nodes for v in node.outputs}
    classes: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])
    counted = set()  # a node's flops once: a Winograd forward or input gradient is two
    for row in report.rows:  # kernels (its filter transform's and its own)
        node = producer.get(row.values[0]) if row.values else None
        found = None
        if node is not None and node.op == "fused":
            first = FusedBody.of_node(node).instructions[0]
            found = ("fused conv2d epilogue", 0) if first.op == "conv2d" else None
        elif node is not None:
            found = _conv_class(node, by_shape)
        name, flops = found or (row.op.split("(")[0], 0)
        flops = 0 if id(node) in counted else flops
        counted.add(id(node))
        entry = classes[name]
        entry[0] += 1
        entry[1] += row.seconds
        entry[2] += flops
    return classes


def row_split_gain(root: str, rounds: int, repeat: int) -> str:
    """The step with the stride-2 forward and input-gradient GEMMs by the generated function
    (graphc.backends.cpu.conv_row_split) and with their BLAS calls (ENABLED off while it
    compiles): `switches_gain`."""
    return switches_gain(root, rounds, repeat, ("blas", "slabs"),
                         {("conv_row_split", "ENABLED"): False})


# The tenth session's changes, each turned back by one switch (`--only switches`): the large
# planes' input transform in vectors, the stride-2 image GEMM as one product (16 row slabs
# before), the stride-2 weight gradients by the generated function, im2col and col2im by rows
TENTH_SESSION = {("winograd_transforms", "ROW_VECTORS"): False,
                 ("conv_row_split", "SLABS"): 16,
                 ("conv_row_split", "WEIGHT_GRAD"): False,
                 ("conv_im2col", "BY_ROWS"): False}
# The eleventh session's (`--only eleventh`): the 512-channel Winograd weight gradient from a
# tile-major V, and the stride-2 forward and input gradient by polyphase Winograd
ELEVENTH_SESSION = {("conv_winograd_wide_grad", "WIDE_GRAD"): False,
                    ("conv_polyphase", "ENABLED"): False}
# The thirteenth session's (`--only thirteenth`): the Winograd filter transforms (U and
# gw = G^T dU G) 16 filters a vector
THIRTEENTH_SESSION = {("winograd_filters", "FILTER_VECTORS"): False}
# The fourteenth session's (`--only fourteenth`): the large U and gw stored non-temporally,
# the small planes' transforms with the channels inside, the large planes' rows prefetched,
# the output transforms' sums one channel behind
FOURTEENTH_SESSION = {("winograd_filters", "STREAMED_U"): False,
                      ("conv_winograd", "STREAMED_GW"): False,
                      ("winograd_transforms", "PLANE_CHANNELS_INNER"): False,
                      ("winograd_transforms", "ROW_PREFETCH"): 0,
                      ("winograd_transforms", "SUMS_BEHIND"): False,
                      ("conv_winograd", "WEIGHT_OUT_BLOCKS"): False}


def switches_gain(root: str, rounds: int, repeat: int, names=("before", "after"),
                  off=None, shown=("stride", "1x1")) -> str:
    """The step compiled twice, the first with graphc.backends.cpu's switches `off`
    ({(module, attribute): value}, TENTH_SESSION by default) set while it compiles, each
    with its own GRAPHC_CACHE_DIR: the steps' CPU time in alternation (`rounds` samples of
    >= 0.1 s, medians and quartiles), then the stride-2 and 1x1 kernels' time by weight
    shape and the stride-1 3x3 kernels by class (graphc.profile, `repeat` runs, 3 alternated
    rounds, medians; the classes whose names hold one of `shown`)."""
    import copy
    import importlib
    import statistics

    import numpy as np

    import graphc
    from benchmarks import model_steps, models
    from benchmarks.harness import compiled_variants, interleaved_process_times, switched

    off = TENTH_SESSION if off is None else off
    switches = {(importlib.import_module(f"graphc.backends.cpu.{m}"), a): v
                for (m, a), v in off.items()}
    shape = model_steps.FULL["resnet18"]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, "resnet18", shape)
    x, y = (graphc.tensor(a) for a in model_steps.batch_of("resnet18", shape))

    def variant(name: str):
        return switched(root, name, switches, name == names[0])

    def make():  # every variant from the same weights
        return models.graphc_step(copy.deepcopy(model)), (x, y)

    steps, arguments = compiled_variants(names, variant, make)
    times = interleaved_process_times(
        {v: lambda v=v: steps[v](*arguments[v]) for v in names}, rounds, 0.1)
    lines = ["ResNet-18 step, batch 32, 1 thread, CPU time, median (quartiles): " + "; ".join(
        f"{v} {np.median(t) * 1e3:.1f} ms ({np.percentile(t, 25) * 1e3:.1f}-"
        f"{np.percentile(t, 75) * 1e3:.1f})" for v, t in times.items())]
    seconds: dict[str, dict[str, list]] = {v: defaultdict(list) for v in names}
    for r in range(3):
        for v in (names if r % 2 else names[::-1]):
            with variant(v):
                report = graphc.profile(steps[v], *arguments[v], repeat=repeat)
            for name, (_, spent, _) in _classify(report, by_shape=True).items():
                seconds[v][name].append(spent)
    rows = sorted(c for c in seconds[names[0]] if any(part in c for part in shown))
    lines.append("| kernel class | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for c in rows:
        lines.append(f"| {c} | " + " | ".join(
            f"{statistics.median(seconds[v][c]) * 1e3:.2f} ms" for v in names) + " |")
    return "\n".join(lines)


def eleventh_kernels(root: str, rounds: int, n: int = 32) -> str:
    """A markdown table: each kernel ELEVENTH_SESSION's switches change, as a one-op graph
    compiled with them off ("before") and on ("after"), timed natively in alternation, and
    each one's distance from float64 over eager graphc's (x after a ReLU)."""
    import importlib

    import numpy as np

    from benchmarks.harness import switched
    from benchmarks.profiles import native_call
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.ir.interpreter import run as interpret
    from graphc.passes.plan import plan_buffers
    from graphc.testing.rounding import rounding_distance
    from tests.test_cpu_conv_paths import _graphs

    switches = {(importlib.import_module(f"graphc.backends.cpu.{m}"), a): v
                for (m, a), v in ELEVENTH_SESSION.items()}
    kernels = [("weight gradient 512 -> 512, 4x4", (n, 512, 4, 4), (512, 512, 3, 3), 1, "gw")]
    kernels += [(f"{pass_} 3x3 stride 2 {c} -> {2 * c}, {side}x{side}", (n, c, side, side),
                 (2 * c, c, 3, 3), 2, kind)
                for pass_, kind, layers in (("forward", "fwd", LAYERS[:3]),
                                            ("input gradient", "gx", LAYERS[:2]))
                for c, side in layers]
    lines = ["| kernel | before | after | distance from float64 (x eager's) |",
             "|---|---|---|---|"]
    rng = np.random.default_rng(11)
    for label, xs, ws, stride, kind in kernels:
        gs, _ = _graphs(xs, ws, (stride, stride), (1, 1), 1)
        x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(ws[1] * 9)).astype(np.float32)
        gy = (rng.standard_normal(gs) * 1e-2).astype(np.float32)
        args = {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}[kind]
        exes = []
        for name in ("before", "after"):
            with switched(root, f"{label}-{name}", switches, name == "before"):
                graph = _graphs(xs, ws, (stride, stride), (1, 1), 1)[1][kind]
                plan_buffers(graph)
                exes.append(CpuExecutable(graph))
        before, after = (float(np.median(t)) * 1e3 for t in
                         _alternated([native_call(e, args) for e in exes], rounds))
        graph = _graphs(xs, ws, (stride, stride), (1, 1), 1)[1][kind]
        wide = _graphs(xs, ws, (stride, stride), (1, 1), 1, "float64")[1][kind]
        reference = interpret(wide, *[a.astype(np.float64) for a in args])[0]
        eager = rounding_distance(interpret(graph, *args)[0], reference)
        ratios = [rounding_distance(e.run(*args)[0], reference) / eager for e in exes]
        lines.append(f"| {label} | {before:.2f} ms | {after:.2f} ms | "
                     f"{ratios[0]:.2f} -> {ratios[1]:.2f} |")
    return "\n".join(lines)


def _layer_passes(channels: int, side: int, n: int):
    """(kind, a function making that pass's one-op graph afresh, its arguments) for the
    forward ("fwd"), input gradient ("gx") and weight gradient ("gw") of a 3x3 stride-1
    convolution of `channels` -> `channels` on n images side x side (ResNet-18's layers)."""
    import numpy as np

    from tests.test_cpu_conv_paths import _graphs

    xs, ws = (n, channels, side, side), (channels, channels, 3, 3)
    gs, _ = _graphs(xs, ws, (1, 1), (1, 1), 1)
    rng = np.random.default_rng(channels)
    for kind, arg_shapes in {"fwd": (xs, ws), "gx": (gs, ws), "gw": (gs, xs)}.items():
        args = [rng.standard_normal(s).astype(np.float32) for s in arg_shapes]
        yield kind, (lambda kind=kind: _graphs(xs, ws, (1, 1), (1, 1), 1)[1][kind]), args


def transform_share(root: str, channels: int, side: int, n: int = 32) -> str:
    """One line: each pass of the layer, its time and its time without GEMMs."""
    import numpy as np

    from benchmarks.profiles import native_call
    gemm_flops = 2 * n * channels * channels * 16 * (side // 2) ** 2
    parts = []
    for kind, fresh, args in _layer_passes(channels, side, n):
        calls = [native_call(_compiled(root, fresh(),
                                       f"{channels}-{kind}-{gemms}", gemms), args)
                 for gemms in (True, False)]
        full, rest = (float(np.median(t)) for t in _alternated(calls, 5))
        parts.append(f"{kind} {full * 1e3:.2f} ms (transforms {rest * 1e3:.2f} ms, "
                     f"{rest / full:.0%}; GEMMs {gemm_flops / (full - rest) / 1e9:.0f} GFLOP/s)")
    return f"{channels} channels {side}x{side}: " + "; ".join(parts)


def block_gemm_gain(root: str, channels: int, side: int, rounds: int, n: int = 32) -> str:
    """One line: each pass of the layer with the generated block GEMM and with the BLAS's."""
    import numpy as np

    from benchmarks.profiles import native_call
    gemm_flops = 2 * n * channels * channels * 16 * (side // 2) ** 2
    parts = []
    for kind, fresh, args in _layer_passes(channels, side, n):
        exes = [_compiled(root, fresh(),
                          f"{channels}-{kind}-kernel{kernel}", True, kernel)
                for kernel in (True, False)]
        if "graphc_winograd_gemm" not in exes[0].lowered.ir_text:
            parts.append(f"{kind} BLAS (not taken)")
            continue
        kernel, blas = (float(np.median(t)) for t in
                        _alternated([native_call(e, args) for e in exes], rounds))
        parts.append(f"{kind} {blas * 1e3:.2f} -> {kernel * 1e3:.2f} ms "
                     f"({(blas - kernel) * 1e3:+.2f}; {gemm_flops / 1e9:.2f} GFLOP)")
    return f"{channels} channels {side}x{side}, BLAS -> kernel: " + "; ".join(parts)


PARTS = {"filter": ("conv_winograd", "filter_transform"),
         "weight_out": ("conv_winograd", "weight_out"),
         "input": ("conv_winograd", "input_tiles"),
         "pad": ("winograd_transforms", "pad_plane")}


def transform_parts(root: str, channels: int, side: int, rounds: int, n: int = 32) -> str:
    """One line: each pass's kernel without GEMMs, and what removing each transform saves."""
    import numpy as np

    from benchmarks.profiles import native_call
    lines = []
    for kind, fresh, args in _layer_passes(channels, side, n):
        parts = (None, "weight_out" if kind == "gw" else "filter", "input", "pad")
        exes = [_without(part, root, fresh(),
                         f"{channels}-{kind}-without-{part}") for part in parts]
        times = [float(np.median(t)) * 1e3 for t in
                 _alternated([native_call(e, args) for e in exes], rounds)]
        lines.append(f"{kind} {times[0]:.2f} ms: " + ", ".join(
            f"{part} {times[0] - t:.2f}" for part, t in zip(parts[1:], times[1:])))
    return f"{channels} channels {side}x{side}, no GEMMs, then what each part takes: " + \
        "; ".join(lines)


def switch_gain(root: str, channels: int, side: int, rounds: int, switch: str,
                values: list[str], n: int = 32) -> str:
    """One line: each pass of the layer compiled with `switch` ("module.NAME" under graphc.
    backends.cpu) set to each of `values` (Python literals), timed natively in alternation
    (`rounds` rounds, medians), with each build's largest difference from the first's."""
    import ast
    import importlib

    import numpy as np

    from benchmarks.profiles import native_call
    module_name, name = switch.rsplit(".", 1)
    module = importlib.import_module(f"graphc.backends.cpu.{module_name}")
    kept = getattr(module, name)
    parts = []
    for kind, fresh, args in _layer_passes(channels, side, n):
        exes = []
        for value in values:
            setattr(module, name, ast.literal_eval(value))
            try:
                exes.append(_compiled(root, fresh(), f"{channels}-{kind}-{name}-{value}", True))
            finally:
                setattr(module, name, kept)
        results = [_first_output(e.run(*args)) for e in exes]
        scale = float(np.max(np.abs(results[0]))) or 1.0
        times = [float(np.median(t)) * 1e3 for t in
                 _alternated([native_call(e, args) for e in exes], rounds)]
        parts.append(f"{kind} " + " / ".join(f"{t:.2f}" for t in times) + " ms (max diff "
                     + ", ".join(f"{float(np.max(np.abs(r - results[0]))) / scale:.1e}"
                                 for r in results[1:]) + ")")
    return (f"{channels} channels {side}x{side}, {switch} = " + " / ".join(values) + ": "
            + "; ".join(parts))


def _first_output(outputs):
    import numpy as np

    return np.asarray(outputs[0] if isinstance(outputs, (list, tuple)) else outputs)


def _without(part, root: str, graph, tag: str):
    """The graph compiled without GEMMs and with the transform `part` (a PARTS key, or
    None) emitting nothing."""
    import importlib

    if part is None:
        return _compiled(root, graph, tag, False)
    module = importlib.import_module(f"graphc.backends.cpu.{PARTS[part][0]}")
    kept = getattr(module, PARTS[part][1])
    setattr(module, PARTS[part][1], _no_gemm)
    try:
        return _compiled(root, graph, tag, False)
    finally:
        setattr(module, PARTS[part][1], kept)


def plane_vectors_gain(root: str, channels: int, side: int, rounds: int, n: int = 32,
                       flag: str = "PLANE_VECTORS") -> str:
    """One line: each pass of the layer with the input transform (and for small planes the
    output transform) as the tile loop and in vectors: `flag`, winograd_transforms'
    PLANE_VECTORS (small planes) or ROW_VECTORS (large planes), off and on."""
    import numpy as np

    from benchmarks.profiles import native_call
    from graphc.backends.cpu import winograd_transforms
    parts = []
    for kind, fresh, args in _layer_passes(channels, side, n):
        exes = []
        for vectors in (False, True):
            kept = getattr(winograd_transforms, flag)
            setattr(winograd_transforms, flag, vectors)
            try:
                exes.append(_compiled(root, fresh(), f"{channels}-{kind}-{flag}{vectors}",
                                      True, plane_vectors=vectors if flag == "PLANE_VECTORS"
                                      else winograd_transforms.PLANE_VECTORS))
            finally:
                setattr(winograd_transforms, flag, kept)
        same = np.array_equal(exes[0].run(*args)[0], exes[1].run(*args)[0])
        loop, vectors = (float(np.median(t)) for t in
                         _alternated([native_call(e, args) for e in exes], rounds))
        parts.append(f"{kind} {loop * 1e3:.2f} -> {vectors * 1e3:.2f} ms "
                     f"({(vectors - loop) * 1e3:+.2f}{'' if same else ', results differ'})")
    return f"{channels} channels {side}x{side}, tile loop -> vectors: " + "; ".join(parts)


def row_split_kernels(root: str, rounds: int, n: int = 32) -> str:
    """A markdown table: each stride-2 convolution of the step (3x3 padding 1 and the 1x1
    shortcut), forward and input gradient, as one-op graphs compiled with the row slabs
    (graphc.backends.cpu.conv_row_split) and with the BLAS calls, timed natively in
    alternation (`rounds` rounds of >= 40 ms, medians)."""
    import numpy as np

    from benchmarks.profiles import native_call
    from graphc.backends.cpu import conv_row_split
    from tests.test_cpu_conv_paths import _graphs

    lines = ["| kernel | BLAS | slabs | taken |", "|---|---|---|---|"]
    for (c, side), k in ((layer, k) for layer in LAYERS[:3] for k in (3, 1)):
        xs, ws = (n, c, side, side), (2 * c, c, k, k)
        gs, graphs = _graphs(xs, ws, (2, 2), (k // 2, k // 2), 1)
        rng = np.random.default_rng(c + k)
        for kind, shapes in (("fwd", (xs, ws)), ("gx", (gs, ws))):
            args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
            exes = []
            for enabled in (False, True):
                kept, conv_row_split.ENABLED = conv_row_split.ENABLED, enabled
                try:
                    graph = _graphs(xs, ws, (2, 2), (k // 2, k // 2), 1)[1][kind]
                    exes.append(_compiled(root, graph, f"{c}-{k}-{kind}-{enabled}", True))
                finally:
                    conv_row_split.ENABLED = kept
            taken = "graphc_winograd_gemm_" in exes[1].lowered.ir_text
            blas, slabs = (float(np.median(t)) for t in
                           _alternated([native_call(e, args) for e in exes], rounds))
            lines.append(f"| {k}x{k} {c} -> {2 * c}, {side}x{side} {kind} | "
                         f"{blas * 1e3:.2f} ms | {slabs * 1e3:.2f} ms | {taken} |")
    return "\n".join(lines)


def _compiled(root: str, graph, tag: str, gemms: bool, block_gemm: bool = True,
              plane_vectors: bool = True):
    from graphc.backends.cpu import conv_im2col, conv_row_split, winograd_gemm, winograd_transforms
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, tag)
    kept = conv_im2col.Conv.gemm, winograd_gemm.ENABLED, winograd_transforms.PLANE_VECTORS
    kept_slabs = conv_row_split.ENABLED
    if not gemms:  # the row slabs' call too is a GEMM: off, so Conv.gemm makes them all
        conv_im2col.Conv.gemm = _no_gemm
        winograd_gemm.ENABLED = conv_row_split.ENABLED = False
    winograd_gemm.ENABLED = winograd_gemm.ENABLED and block_gemm
    winograd_transforms.PLANE_VECTORS = plane_vectors
    try:
        plan_buffers(graph)
        return CpuExecutable(graph)
    finally:
        conv_im2col.Conv.gemm, winograd_gemm.ENABLED, winograd_transforms.PLANE_VECTORS = kept
        conv_row_split.ENABLED = kept_slabs


def _no_gemm(self, *args) -> None:
    return None


def _alternated(calls, rounds: int) -> list[list[float]]:
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for call, samples in zip(calls, times):
            call()
            count, start = 0, time.process_time()
            while time.process_time() - start < 0.04:
                call()
                count += 1
            samples.append((time.process_time() - start) / count)
    return times


if __name__ == "__main__":
    main()
