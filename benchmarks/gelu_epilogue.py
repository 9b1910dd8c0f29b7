"""The GPT step's GELU epilogue before and after issue 14's mathlib changes, in one process.

    python -m benchmarks.gelu_epilogue                  # the GPT, 30 interleaved rounds
    python -m benchmarks.gelu_epilogue --rounds 10 --quick
    python -m benchmarks.gelu_epilogue --variant "own erf" --variant after

Variants (all by default) are compiled from the same weights (benchmarks/model_steps.py's
GPT, n_embd 128, 4 layers, context 64, batch 16; `--quick`: its smoke size), each with its own
GRAPHC_CACHE_DIR (the pipeline cache keys on graphc's source, which is the same for all):
- "before": float32 erfc tail in the three ranges it had (`THREE_RANGE_ERFC_TAIL_F32`, put
  back into mathlib while it compiles) and no loop marked to prefer 512-bit vectors
  (`scalars.WIDE_VECTOR_FUNCTIONS` emptied: LLVM's default 256 bits on Intel cores);
- "two ranges": the current tail, still 256-bit;
- "own erf": two ranges at 512 bits, the derivative's erf evaluating its own polynomials
  (`mathlib.ERF_AFTER_GELU` off), as the eighth session left it;
- "after": the default (two ranges, 512-bit vectors where the host has AVX-512, the
  derivative's erf taken from gelu's);
- "in gemm, own erf" and "in gemm": the last two with the epilogue run inside
  linear1's GEMM kernel row chunk by row chunk (`gemm_epilogue.FOLD`, the default step);
  their gelu rows in the profile are the GEMM and its epilogue together.
It prints each variant's median step time over interleaved rounds (CPU clock, one thread for
OpenMP and OpenBLAS), then from `graphc.profile` (5 interleaved profiles, each lowered again
as its variant, each kernel's median) the time of the kernels that compute gelu or erf (the
linear1 epilogues: gelu(h) and the derivative the backward reads) and of all kernels
(docs/performance.md, "GELU epilogue").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from benchmarks.harness import (
    cache_root,
    run_with_threads,
    step_ab,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (30)")
    parser.add_argument("--quick", action="store_true", help="the GPT's smoke size")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="compare these variants only (repeatable; default: all)")
    args = parser.parse_args(argv)
    # one thread for OpenMP and OpenBLAS, set before they load: numpy (imported with the
    # harness) has loaded OpenBLAS already, so the process starts again with them set (set
    # here, its GEMMs had run on two threads, CPU time counting both)
    run_with_threads("benchmarks.gelu_epilogue", 1, sys.argv[1:] if argv is None else argv)
    with cache_root("gelu_epilogue.") as root:
        _compare(args.rounds, args.quick, root, args.variant or list(VARIANTS))
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


# graphc.backends.cpu.mathlib's float32 erfc tail before issue 14's GELU epilogue work
# (commit 48874a2): three ranges of u = 1/a, (upper bound, centre, coefficients)
THREE_RANGE_ERFC_TAIL_F32 = (
    (0.4, 0.245, (
        1.3661614656448364, -0.8126356601715088, -0.06472652405500412, 0.4146755039691925,
        -0.2851734459400177, -0.02111780270934105, 0.220005601644516, -0.1710827350616455,
        -0.11775259673595428, 0.5485908389091492,
    )),
    (1.0, 0.7, (
        -0.02882738597691059, 0.025693239644169807, -0.005387837067246437, -0.01775379292666912,
        0.04305412620306015, -0.060550935566425323, 0.05137384310364723, 0.012497949413955212,
        -0.17068712413311005, 0.4766766428947449,
    )),
    (2.0, 1.5, (
        0.0001858369359979406, -0.0004537900385912508, 0.0008449564920738339,
        -0.0014842994278296828, 0.0020638422574847937, -0.0011654890840873122,
        -0.005933205131441355, 0.033156976103782654, -0.118398018181324, 0.3595229387283325,
    )),
)


VARIANTS = ("before", "two ranges", "own erf", "after", "in gemm, own erf", "in gemm")


@contextlib.contextmanager
def _variant(name: str, root: str):
    """While lowering variant `name`: its cache dir, and mathlib / scalars as it had them.
    Every variant keeps the epilogue its own kernel (gemm_epilogue.FOLD off; by default it
    runs inside linear1's GEMM kernel, which would time both together), except the "in gemm"
    ones."""
    from graphc.backends.cpu import gemm_epilogue, mathlib, scalars

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)  # read at each use
    wide, tail = scalars.WIDE_VECTOR_FUNCTIONS, mathlib._ERFC_TAIL_F32
    fold, after_gelu = gemm_epilogue.FOLD, mathlib.ERF_AFTER_GELU
    gemm_epilogue.FOLD = name.startswith("in gemm")
    mathlib.ERF_AFTER_GELU = name in ("after", "in gemm")
    if name in ("before", "two ranges"):
        scalars.WIDE_VECTOR_FUNCTIONS = frozenset()
    if name == "before":
        mathlib._ERFC_TAIL_F32 = THREE_RANGE_ERFC_TAIL_F32
    try:
        yield
    finally:
        scalars.WIDE_VECTOR_FUNCTIONS, mathlib._ERFC_TAIL_F32 = wide, tail
        gemm_epilogue.FOLD, mathlib.ERF_AFTER_GELU = fold, after_gelu


def _is_gelu_kernel(op: str) -> bool:
    return op.startswith("fused(") and ("gelu" in op or "erf" in op)


def _compare(rounds: int, quick: bool, root: str, variants: list[str]) -> None:
    import numpy as np

    from benchmarks import model_steps

    times, profiled = step_ab(variants, lambda n: _variant(n, root),
                              lambda: model_steps.graphc_gpt_step(quick),
                              rounds, 5, repeat=11)
    for name in profiled:
        rows, seconds = profiled[name]
        # a fused GEMM is two rows with the same label, its GEMM then its epilogue
        epilogues = [row for row in rows if _is_gelu_kernel(row.op)
                     and not ("matmul" in row.op and _next_same(rows, row))]
        total = sum(seconds.values())
        gelu = sum(seconds[row.step] for row in epilogues)
        print(f"gpt {name}: step {np.median(times[name]) * 1e3:.3f} ms (median of {rounds}); "
              f"kernels {total * 1e3:.2f} ms; gelu/erf epilogues {gelu * 1e3:.3f} ms in "
              f"{len(epilogues)} kernels: "
              + ", ".join(f"{seconds[row.step] * 1e6:.0f}" for row in epilogues) + " us")


def _next_same(rows: list, row) -> bool:
    """Whether the row just after `row` is the same node (then `row` is its GEMM)."""
    later = [q for q in rows if q.step == row.step + 1]
    return bool(later) and later[0].op == row.op and later[0].values == row.values

if __name__ == "__main__":
    main()
