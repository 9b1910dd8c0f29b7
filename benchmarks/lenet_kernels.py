"""LeNet-5's pooling kernels alone and its batch-64 training step, before and after, in one
process (docs/performance.md, "thirteenth session: LeNet-5 at one thread").

    python -m benchmarks.lenet_kernels --rounds 15
    python -m benchmarks.lenet_kernels --rounds 15 --skip-step

Variants, each compiled with its own GRAPHC_CACHE_DIR (the pipeline cache keys on graphc's
source, the same for both) with these module settings while it compiles:
- "before": ENABLED = False in graphc.backends.cpu.pool_vectors (the scalar pooling
  kernels), conv_channel_lanes and conv_input_grad_lanes (im2col + GEMM for LeNet-5's
  second convolution, forward and input gradient);
- "after": the code as it stands.
The kernels are one-op graphs at the step's shapes (max_pool2d of [64, 6, 28, 28] and of
[64, 16, 10, 10] by 2x2 windows, and their gradients, fed the indices max_pool2d returns:
random indices would send every gradient down the scatter path), timed natively
(benchmarks.profiles.native_call); the step is benchmarks/models.py's LeNet-5 with SGD.
Times: medians of interleaved rounds, CPU clock, one thread for OpenMP and OpenBLAS. Each
kernel's outputs are checked equal between the variants (the paths keep every bit).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from benchmarks.harness import cache_root, interleaved_process_times, run_with_threads, step_ab

PATHS = ("pool_vectors", "conv_channel_lanes", "conv_input_grad_lanes")
VARIANTS = {"before": {(f"graphc.backends.cpu.{m}", "ENABLED"): False for m in PATHS},
            "after": {}}
POOLS = ((64, 6, 28, 28), (64, 16, 10, 10))  # max_pool2d inputs, 2x2 windows
WINDOW = dict(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1),
              ceil_mode=False)


@contextlib.contextmanager
def _variant(name: str, root: str, part: str):
    """While lowering variant `name`: its cache folder and module settings."""
    import importlib

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, part, name)  # read at each use
    settings = {(importlib.import_module(m), attr): v for (m, attr), v in VARIANTS[name].items()}
    saved = {key: getattr(*key) for key in settings}
    for (module, attr), value in settings.items():
        setattr(module, attr, value)
    try:
        yield
    finally:
        for (module, attr), value in saved.items():
            setattr(module, attr, value)


def _graph(op: str, types: list, **attrs):
    from graphc.ir.graph import Graph, Node, Value
    from graphc.ops.registry import REGISTRY
    from graphc.types import TensorType, as_dtype

    inputs = [Value(f"x{i}", TensorType(tuple(s), as_dtype(d))) for i, (s, d) in
              enumerate(types)]
    out = REGISTRY[op].infer(*(v.type for v in inputs), **attrs)
    outs = [Value(str(i), t) for i, t in enumerate(out if isinstance(out, tuple) else (out,))]
    return Graph(op, inputs, [Node(op, inputs, attrs, outs)], outs)


def _kernels(rounds: int, root: str) -> None:
    import numpy as np

    from benchmarks.profiles import native_call
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.ir.interpreter import run as interpret
    from graphc.passes.plan import plan_buffers

    rng = np.random.default_rng(0)
    for i, shape in enumerate(POOLS):
        x = rng.standard_normal(shape).astype(np.float32)
        forward = _graph("max_pool2d", [(shape, "float32")], **WINDOW)
        values, indices = interpret(forward, x)
        g = rng.standard_normal(values.shape).astype(np.float32)
        backward = _graph("max_pool2d_grad", [(values.shape, "float32"),
                                              (values.shape, "int64")], input_hw=shape[-2:])
        for label, graph, args in (("max_pool2d", forward, [x]),
                                   ("max_pool2d_grad", backward, [g, indices])):
            exes = {}
            for name in VARIANTS:
                with _variant(name, root, f"{label}{i}"):
                    plan_buffers(graph)
                    exes[name] = CpuExecutable(graph)
            outs = {name: exe.run(*args) for name, exe in exes.items()}
            first, *rest = outs.values()
            same = all(np.array_equal(a, b) for other in rest for a, b in zip(first, other))
            times = interleaved_process_times(
                {name: native_call(exe, args) for name, exe in exes.items()}, rounds, 0.05)
            cells = "  ".join(f"{name} {np.median(t) * 1e6:7.1f} us" for name, t in
                              times.items())
            print(f"{label} {shape if label == 'max_pool2d' else values.shape}: {cells}  "
                  f"outputs {'equal' if same else 'DIFFER'}", flush=True)


def _step(rounds: int, root: str) -> None:
    import numpy as np

    import graphc
    from benchmarks import models

    x, y = models.batch("lenet5", 64)
    times, profiled = step_ab(list(VARIANTS), lambda n: _variant(n, root, "step"),
                              lambda: (models.graphc_step(models.graphc_model("lenet5")),
                                       (graphc.tensor(x), graphc.tensor(y))),
                              rounds, 3, repeat=51, seconds=0.1)
    for name in profiled:
        rows, seconds = profiled[name]
        print(f"lenet5_b64 {name}: step {np.median(times[name]) * 1e3:.3f} ms (median of "
              f"{rounds}); {len(rows)} kernels {sum(seconds.values()) * 1e6:.1f} us")
        for row in sorted(rows, key=lambda row: -seconds[row.step])[:8]:
            print(f"    {seconds[row.step] * 1e6:7.1f} us  {row.op[:40]:<40} {row.shape}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (15)")
    parser.add_argument("--skip-step", action="store_true", help="the kernels only")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}: nothing would be timed")
    # one thread for OpenMP and OpenBLAS, set before numpy loads OpenBLAS
    run_with_threads("benchmarks.lenet_kernels", 1, sys.argv[1:] if argv is None else argv)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()), flush=True)
    with cache_root("lenet_kernels.") as root:
        _kernels(args.rounds, root)
        if not args.skip_step:
            _step(args.rounds, root)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
