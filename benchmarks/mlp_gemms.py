"""The MLP 784-256-256-10 batch-64 step's first-layer GEMMs in OpenBLAS or in small_gemm's
generated kernels, alone and in the step, in one process.

    python -m benchmarks.mlp_gemms                       # products alone, then the step
    python -m benchmarks.mlp_gemms --rounds 9 --variant before --variant after

Variants, each compiled with its own GRAPHC_CACHE_DIR (the pipeline cache keys on graphc's
source, the same for all) by setting graphc.backends.cpu.small_gemm's thresholds while it
compiles:
- "before": medium products up to k = 512 (`MEDIUM_K`) and no short-k weight gradients
  (`SHORT_K_MAX = 0`): the first Linear's forward W [256 x 784] @ x^T and the second's
  weight gradient dh^T @ h (256 x 256 x 64) in OpenBLAS;
- "forward": the forward in the medium kernel (k = 784), the weight gradients in OpenBLAS;
- "after": the default: also the weight gradients with a short k (the batch) in the k-outer
  kernel where n is a whole number of two-vector panels (not the first Linear's 784).
Each product alone is a one-matmul graph in the layout graphc chose in the step; the step is
benchmarks/models.py's MLP with SGD. Times are medians of interleaved rounds, CPU clock, one
thread for OpenMP and OpenBLAS (docs/performance.md, "The MLP's first layer").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from benchmarks.harness import (
    cache_root,
    interleaved_process_times,
    run_with_threads,
    step_ab,
)

VARIANTS = {"before": {"MEDIUM_K": 512, "SHORT_K_MAX": 0},
            "forward": {"SHORT_K_MAX": 0},
            "after": {}}


def weight_times_transposed(m: int, n: int, k: int) -> str:
    """W [m, k] @ x^T [k, n], x read transposed (packed first): a Linear's forward."""
    return f"""graph @f(%w: f32[{m},{k}], %x: f32[{n},{k}]) -> (f32[{m},{n}]) {{
  %0: f32[{k},{n}] = permute[dims=(1, 0)](%x)
  %1: f32[{m},{n}] = matmul(%w, %0)
  return (%1)
}}"""


def transposed_times(m: int, n: int, k: int) -> str:
    """dh^T [m, k] @ x [k, n], dh read transposed: a Linear's weight gradient."""
    return f"""graph @f(%d: f32[{k},{m}], %x: f32[{k},{n}]) -> (f32[{m},{n}]) {{
  %0: f32[{m},{k}] = permute[dims=(1, 0)](%d)
  %1: f32[{m},{n}] = matmul(%0, %x)
  return (%1)
}}"""


# (label, IR text of the product as the step lays it out, its flops)
PRODUCTS = [
    ("forward W1 [256 x 784] @ x^T [784 x 64]", weight_times_transposed(256, 64, 784),
     2 * 256 * 64 * 784),
    ("weight gradient dh1^T [256 x 64] @ x [64 x 784]", transposed_times(256, 784, 64),
     2 * 256 * 784 * 64),
    ("weight gradient dh2^T [256 x 64] @ h1 [64 x 256]", transposed_times(256, 256, 64),
     2 * 256 * 256 * 64),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (15)")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="compare these variants only (repeatable; default: all)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}: nothing would be timed")
    # one thread for OpenMP and OpenBLAS, set before numpy loads OpenBLAS
    run_with_threads("benchmarks.mlp_gemms", 1, sys.argv[1:] if argv is None else argv)
    variants = args.variant or list(VARIANTS)
    with cache_root("mlp_gemms.") as root:
        _products(args.rounds, root, variants)
        _step(args.rounds, root, variants)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


@contextlib.contextmanager
def _variant(name: str, root: str, part: str):
    """While lowering variant `name`: its cache dir and small_gemm's thresholds."""
    from graphc.backends.cpu import small_gemm

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, part, name)  # read at each use
    saved = {attr: getattr(small_gemm, attr) for attr in VARIANTS[name]}
    for attr, value in VARIANTS[name].items():
        setattr(small_gemm, attr, value)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(small_gemm, attr, value)


def _products(rounds: int, root: str, variants: list[str]) -> None:
    import re

    import numpy as np

    from graphc.backends import compile as compile_graph
    from graphc.ir import parse

    rng = np.random.default_rng(0)
    for i, (label, text, flops) in enumerate(PRODUCTS):
        g = parse(text)
        a, b = (rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs)
        calls, kernels = {}, {}
        for name in variants:
            with _variant(name, root, f"product{i}"):
                executable = compile_graph(parse(text), "cpu")
                executable.run(a, b)
            kernels[name] = sorted(set(re.findall(r'define[^@]*@"?(graphc_small_sgemm_\w+)',
                                                  executable.lowered.ir_text))) or ["BLAS"]
            calls[name] = lambda e=executable, a=a, b=b: e.run(a, b)
        times = interleaved_process_times(calls, rounds, seconds=0.05)
        print(label)
        for name in variants:
            median = float(np.median(times[name]))
            print(f"    {name:<8} {median * 1e6:7.1f} us  {flops / median / 1e9:5.0f} GFLOP/s  "
                  f"{', '.join(kernels[name])}")


def _step(rounds: int, root: str, variants: list[str]) -> None:
    import numpy as np

    import graphc
    from benchmarks import models

    x, y = models.batch("mlp", 64)
    times, profiled = step_ab(variants, lambda n: _variant(n, root, "step"),
                              lambda: (models.graphc_step(models.graphc_model("mlp")),
                                       (graphc.tensor(x), graphc.tensor(y))),
                              rounds, 3, repeat=101, seconds=0.05)
    for name in profiled:
        rows, seconds = profiled[name]
        gemms = [row for row in rows if "matmul" in row.op]
        print(f"mlp_b64 {name}: step {np.median(times[name]) * 1e3:.3f} ms (median of "
              f"{rounds}); {len(rows)} kernels {sum(seconds.values()) * 1e6:.1f} us, of which "
              f"{len(gemms)} GEMMs {sum(seconds[row.step] for row in gemms) * 1e6:.1f} us")
        for row in sorted(gemms, key=lambda row: -seconds[row.step])[:4]:
            print(f"    {seconds[row.step] * 1e6:7.1f} us  {row.op[:28]:<28} {row.shape}")


if __name__ == "__main__":
    main()
