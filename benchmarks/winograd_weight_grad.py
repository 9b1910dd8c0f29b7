"""ResNet-18's weight gradients by im2col + GEMM and by Winograd F(2x2, 3x3), in one process.

    python -m benchmarks.winograd_weight_grad               # batch 32, 7 interleaved rounds
    python -m benchmarks.winograd_weight_grad --rounds 3 --batch 8
    python -m benchmarks.winograd_weight_grad --threads 2   # wall clock, kernels split
    python -m benchmarks.winograd_weight_grad --step --threads 2   # the whole training step
    python -m benchmarks.winograd_weight_grad --channels 512 --variants winograd-nt winograd

For each stride-1 3x3 layer shape of benchmarks/model_steps.py's ResNet-18 (CIFAR, width 64:
64 channels at 32x32, 128 at 16x16, 256 at 8x8, 512 at 4x4) the one-op `conv2d_weight_grad`
graph is compiled once per variant, each with its own GRAPHC_CACHE_DIR (the pipeline cache
keys on graphc's source, the same for all): "im2col" with conv_winograd's weight gradient
turned off while it compiles, "winograd-nt" with its GEMMs in the earlier NT form
(conv_winograd.WEIGHT_GRAD_NN = False), "winograd-blas" with the 16 GEMMs of every
Winograd block (forward and input gradient too) as BLAS calls (graphc.backends.cpu.
winograd_gemm.ENABLED = False), "winograd-tile-loop" with the small planes' input
transform as the tile loop through a padded plane (winograd_transforms.PLANE_VECTORS =
False), "winograd-row-loop" with the large planes' (32x32, 16x16) input transform as the
tile loop through a padded plane (winograd_transforms.ROW_VECTORS = False),
"winograd-y-gathers" with the NN form's Y = A gy A^T as the channel loop LLVM vectorises by
gathers (winograd_transforms.CHANNEL_VECTORS = False), "winograd-vt-rows" with
conv_winograd_wide_grad's Vt channel by channel and in rows of all channels (its
CHANNEL_VECTORS and VT_PANELS False), "winograd-nt"
also without conv_winograd_wide_grad (the 512-channel layer in conv_winograd's NT form
through the BLAS), and "winograd" (the default: one call of winograd_gemm's generated
function where it takes the shape, small planes by vectors, large ones along tile rows, Y in
vectors of output channels, the 512-channel layer by conv_winograd_wide_grad); `--variants`
picks, `--channels` the layers.
Each kernel is called natively (benchmarks.profiles.native_call), the variants in
alternation, each sample >= 40 ms of this
process's CPU time (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1, or `--threads N` of them
and the wall clock: the kernels built split over the cores, conv_threads.py); it prints the
medians, GFLOP/s of the direct convolution's 2*N*O*C*9*H*W, and each variant's distance
from a float64 run over eager graphc's (the rounding rule of docs/performance.md, at most 2;
inputs as in the step: x after a ReLU, gy normal). `--step`: the whole ResNet-18 training
step (batch `--batch`) compiled per variant the same way from one set of weights
(benchmarks.harness.compiled_variants), the steps timed in alternation
(harness.interleaved_process_times at one thread; median and quartiles of each variant's
rounds).
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import time
from contextlib import contextmanager

LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))  # (channels, plane side)
VARIANTS = ("im2col", "winograd-nt", "winograd-blas", "winograd-tile-loop", "winograd-row-loop",
            "winograd-y-gathers", "winograd-vt-rows", "winograd")
_clock = time.process_time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    parser.add_argument("--batch", type=int, default=32, help="images (32)")
    parser.add_argument("--threads", type=int, default=1, help="threads (1: CPU time; "
                        "more: wall clock)")
    parser.add_argument("--step", action="store_true", help="the whole training step")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="what to compare (all)")
    parser.add_argument("--channels", nargs="+", type=int, choices=[c for c, _ in LAYERS],
                        default=[c for c, _ in LAYERS], help="the layers (all)")
    args = parser.parse_args(argv)
    for flag, value in (("--rounds", args.rounds), ("--batch", args.batch),
                        ("--threads", args.threads)):
        if value < 1:  # else layers compile for minutes, then each median is of nothing (nan)
            parser.error(f"{flag} must be at least 1, got {value}")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    global _clock
    _clock = time.process_time if args.threads == 1 else time.perf_counter
    from benchmarks.harness import cache_root

    with cache_root("winograd_weight_grad.") as root:
        if args.step:
            _compare_steps(root, args.batch, args.rounds, args.variants)
        for channels, side in () if args.step else LAYERS:
            if channels not in args.channels:
                continue
            _compare(root, args.batch, channels, side, args.rounds, args.variants)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def _compile(root: str, variant: str, graph):
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, variant)
    with _variant(variant):
        plan_buffers(graph)
        exe = CpuExecutable(graph)
    marker = any(kernel in exe.lowered.ir_text for kernel in
                 ("conv2d_winograd_weight_grad", "conv2d_winograd_wide_weight_grad"))
    assert marker == (variant != "im2col"), variant
    return exe


@contextmanager
def _variant(variant: str):
    """conv_winograd as `variant` wants it while a graph compiles."""
    from graphc.backends.cpu import (
        conv_winograd,
        conv_winograd_wide_grad,
        winograd_gemm,
        winograd_transforms,
    )

    kept = conv_winograd.conv2d_weight_grad, conv_winograd.WEIGHT_GRAD_NN, \
        winograd_gemm.ENABLED, winograd_transforms.PLANE_VECTORS, \
        winograd_transforms.ROW_VECTORS, conv_winograd_wide_grad.WIDE_GRAD, \
        winograd_transforms.CHANNEL_VECTORS, conv_winograd_wide_grad.CHANNEL_VECTORS, \
        conv_winograd_wide_grad.VT_PANELS
    winograd_transforms.CHANNEL_VECTORS = variant != "winograd-y-gathers"
    conv_winograd_wide_grad.CHANNEL_VECTORS = conv_winograd_wide_grad.VT_PANELS = \
        variant != "winograd-vt-rows"
    conv_winograd_wide_grad.WIDE_GRAD = variant != "winograd-nt"
    if variant == "im2col":
        conv_winograd.conv2d_weight_grad = _not_taken
    conv_winograd.WEIGHT_GRAD_NN = variant != "winograd-nt"
    winograd_gemm.ENABLED = variant in ("winograd", "winograd-tile-loop", "winograd-row-loop",
                                        "winograd-y-gathers", "winograd-vt-rows")
    winograd_transforms.PLANE_VECTORS = variant != "winograd-tile-loop"
    winograd_transforms.ROW_VECTORS = variant != "winograd-row-loop"
    try:
        yield
    finally:
        conv_winograd.conv2d_weight_grad, conv_winograd.WEIGHT_GRAD_NN, \
            winograd_gemm.ENABLED, winograd_transforms.PLANE_VECTORS, \
            winograd_transforms.ROW_VECTORS, conv_winograd_wide_grad.WIDE_GRAD, \
            winograd_transforms.CHANNEL_VECTORS, conv_winograd_wide_grad.CHANNEL_VECTORS, \
            conv_winograd_wide_grad.VT_PANELS = kept


def _not_taken(lw, node, g) -> bool:
    return False


def _compare_steps(root: str, batch: int, rounds: int, variants) -> None:
    import numpy as np

    import graphc
    from benchmarks import model_steps, models
    from benchmarks.harness import compiled_variants, interleaved_process_times

    shape = dict(model_steps.FULL["resnet18"], batch=batch)
    graphc.manual_seed(0)
    model = model_steps.build(graphc, "resnet18", shape)
    x, y = (graphc.tensor(a) for a in model_steps.batch_of("resnet18", shape))

    @contextmanager
    def variant(name: str):
        os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)  # read at each use
        with _variant(name):
            yield

    def make():  # every variant from the same weights
        return models.graphc_step(copy.deepcopy(model)), (x, y)

    steps, arguments = compiled_variants(variants, variant, make)
    calls = {v: functools.partial(steps[v], *arguments[v]) for v in steps}
    if _clock is time.process_time:
        times = interleaved_process_times(calls, rounds, 0.1)
    else:
        times = {v: [] for v in steps}
        for _ in range(rounds):
            for v, call in calls.items():
                call()
                start = _clock()
                call()
                call()
                times[v].append((_clock() - start) / 2)
    print(f"ResNet-18 step, batch {batch}, median (quartiles): " + "; ".join(
        f"{v} {float(np.median(t)) * 1e3:.0f} ms ({float(np.percentile(t, 25)) * 1e3:.0f}-"
        f"{float(np.percentile(t, 75)) * 1e3:.0f})" for v, t in times.items()), flush=True)


def _compare(root: str, n: int, c: int, side: int, rounds: int, variants) -> None:
    import numpy as np

    from benchmarks.profiles import native_call
    from graphc.ir.interpreter import run as interpret
    from graphc.testing.rounding import rounding_distance
    from tests.test_cpu_conv_paths import _graphs

    xs, ws = (n, c, side, side), (c, c, 3, 3)
    rng = np.random.default_rng(c)
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
    gs, _ = _graphs(xs, ws, (1, 1), (1, 1), 1)
    gy = (rng.standard_normal(gs) * 1e-2).astype(np.float32)
    exes = {v: _compile(root, v, _graphs(xs, ws, (1, 1), (1, 1), 1)[1]["gw"])
            for v in variants}
    _, graphs = _graphs(xs, ws, (1, 1), (1, 1), 1)
    _, wide = _graphs(xs, ws, (1, 1), (1, 1), 1, "float64")
    eager = interpret(graphs["gw"], gy, x)[0]
    reference = interpret(wide["gw"], gy.astype(np.float64), x.astype(np.float64))[0]
    eager_distance = rounding_distance(eager, reference)
    calls = {v: native_call(exes[v], [gy, x]) for v in variants}
    times = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            calls[v]()
            count, start = 0, _clock()
            while _clock() - start < 0.04:
                calls[v]()
                count += 1
            times[v].append((_clock() - start) / count)
    flop = 2 * n * c * c * 9 * side * side
    parts = []
    for v in variants:
        t = float(np.median(times[v]))
        ratio = rounding_distance(exes[v].run(gy, x)[0], reference) / eager_distance
        parts.append(f"{v} {t * 1e3:.2f} ms ({flop / t / 1e9:.0f} GFLOP/s, "
                     f"{ratio:.2f}x eager's distance)")
    print(f"{c}->{c} 3x3 {side}x{side}, N={n}: " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
