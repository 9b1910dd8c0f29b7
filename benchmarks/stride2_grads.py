"""ResNet-18's stride-2 3x3 gradients as one-op kernels, with a switch off and on.

    python -m benchmarks.stride2_grads --threads 1 --clock cpu --rounds 15
    python -m benchmarks.stride2_grads --threads 2 --clock wall --rounds 15 \
        --ab graphc.backends.cpu.conv_polyphase.GRAD_MIN_TILES=4

Each kernel (the three stride-2 weight gradients, 64 -> 128 at 32x32, 128 -> 256 at 16x16,
256 -> 512 at 8x8, the input gradients, the forwards and, `sums`, the forwards that also sum
their output for the batch norm after them, conv2d_channel_sums; batch 32) is compiled as a
one-op graph (tests/test_cpu_conv_paths `_graphs`) twice, each with its own GRAPHC_CACHE_DIR:
"before" with the `--ab` settings (MODULE.NAME=VALUE; default: the polyphase weight gradient off,
graphc.backends.cpu.conv_polyphase_grad.ENABLED=False) set while it compiles, and "after"
as the code stands. The two are timed natively (benchmarks.profiles.native_call) in
alternation, `--rounds` samples of >= 40 ms of the chosen clock each, medians; then each
one's distance from a float64 run over eager graphc's (largest difference; x after a ReLU,
gy normal at 1e-2). `--threads`: the executables' thread count (ThreadChooser fixed).
"""

from __future__ import annotations

import argparse
import importlib
import os

LAYERS = ((64, 32), (128, 16), (256, 8))  # (input channels, input side): out = 2x, side / 2
DEFAULT_AB = ["graphc.backends.cpu.conv_polyphase_grad.ENABLED=False"]


def settings(pairs: list[str]) -> dict:
    """{(module, attribute): value} from MODULE.NAME=VALUE strings (VALUE a Python literal)."""
    import ast

    out = {}
    for pair in pairs:
        target, sep, value = pair.partition("=")
        module, _, attr = target.rpartition(".")
        if not sep or not module:
            raise SystemExit(f"stride2_grads: --ab expects MODULE.NAME=VALUE, got {pair!r}")
        out[importlib.import_module(module), attr] = ast.literal_eval(value)
    return out


def _kind_graphs(kind: str, xs, ws, dtype: str = "float32"):
    """(gy's shape, the one-op graph of `kind`) for a stride-2, padding-1 layer."""
    from tests.test_cpu_backend import one_op_graph
    from tests.test_cpu_conv_paths import _graphs

    gs, graphs = _graphs(xs, ws, (2, 2), (1, 1), 1, dtype)
    if kind == "sums":
        return gs, one_op_graph("conv2d_channel_sums", [(xs, dtype), (ws, dtype)],
                                stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups=1)
    return gs, graphs[kind]


def kernel_table(root: str, switches: dict, kinds, threads: int, rounds: int,
                 n: int = 32) -> str:
    """A markdown table: each layer's `kinds` kernels before and after (see the module
    docstring)."""
    import numpy as np

    from benchmarks.harness import now, switched
    from benchmarks.profiles import native_call
    from graphc.backends.cpu import threads as cpu_threads
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.backends.cpu.threads import ThreadChooser
    from graphc.ir.interpreter import run as interpret
    from graphc.passes.plan import plan_buffers
    from graphc.testing.rounding import rounding_distance

    lines = ["| kernel | before | after | distance from float64 (x eager's) |",
             "|---|---|---|---|"]
    rng = np.random.default_rng(11)
    for kind in kinds:
        for c, side in LAYERS:
            xs, ws = (n, c, side, side), (2 * c, c, 3, 3)
            gs, _ = _kind_graphs("fwd", xs, ws)
            x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
            w = (rng.standard_normal(ws) / np.sqrt(c * 9)).astype(np.float32)
            gy = (rng.standard_normal(gs) * 1e-2).astype(np.float32)
            args = {"fwd": [x, w], "sums": [x, w], "gx": [gy, w], "gw": [gy, x]}[kind]
            exes = []
            for name in ("before", "after"):
                with switched(root, f"{kind}{c}-{name}", switches, name == "before"):
                    graph = _kind_graphs(kind, xs, ws)[1]
                    plan_buffers(graph)
                    exe = CpuExecutable(graph)
                    exe.thread_chooser = ThreadChooser(cpu_threads.most_threads(), fixed=threads)
                    exes.append(exe)
            calls = [native_call(e, args) for e in exes]
            samples: list[list[float]] = [[], []]
            for r in range(rounds):
                for i in ((0, 1) if r % 2 else (1, 0)):
                    calls[i]()
                    count, start = 0, now()
                    while now() - start < 0.04:
                        calls[i]()
                        count += 1
                    samples[i].append((now() - start) / count)
            before, after = (float(np.median(s)) * 1e3 for s in samples)
            graph = _kind_graphs(kind, xs, ws)[1]
            wide = _kind_graphs(kind, xs, ws, "float64")[1]
            reference = interpret(wide, *[a.astype(np.float64) for a in args])[0]
            eager = rounding_distance(interpret(graph, *args)[0], reference)
            ratios = [rounding_distance(e.run(*args)[0], reference) / eager for e in exes]
            label = {"fwd": "forward", "sums": "forward with sums", "gw": "weight gradient",
                     "gx": "input gradient"}[kind]
            lines.append(f"| {label} {c} -> {2 * c}, {side}x{side} | {before:.2f} ms | "
                         f"{after:.2f} ms | {ratios[0]:.2f} -> {ratios[1]:.2f} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="threads a call uses (1)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--rounds", type=int, default=15, help="alternated samples (15)")
    parser.add_argument("--kinds", nargs="+", choices=("fwd", "sums", "gw", "gx"), default=["gw"])
    parser.add_argument("--ab", nargs="+", metavar="MODULE.NAME=VALUE", default=DEFAULT_AB,
                        help="the settings of 'before' (default: " + DEFAULT_AB[0] + ")")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    from benchmarks.harness import cache_root, set_clock

    set_clock(args.clock)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()), flush=True)
    with cache_root("stride2_grads.") as root:
        print(kernel_table(root, settings(args.ab), args.kinds, args.threads, args.rounds))
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
