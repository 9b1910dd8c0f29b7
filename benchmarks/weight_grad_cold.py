"""The GPT step's weight gradients x^T @ dy alone, hot and with their operands swept from cache.

    python -m benchmarks.weight_grad_cold                      # every variant, 15 rounds
    python -m benchmarks.weight_grad_cold --variant blas --variant prefetch --rounds 9

The three shapes of the step (k = 1024 tokens, a = x^T read transposed): [128 x 1024] @
[1024 x 128] (the projections, 17 a step), [128 x 1024] @ [1024 x 512] (linear2, 4) and
[512 x 1024] @ [1024 x 128] (linear1, 4). Each variant compiles the one-op graph
`x.t() @ dy` with its own GRAPHC_CACHE_DIR while small_gemm's settings are set as it says
(see VARIANTS). "hot" times a call right after the same call; "cold" first writes a buffer
of --sweep-mb MB (L2 is 2 MB a core; a step's activations lie in L3 when read back, as
here), then times the call alone. One thread (OpenMP and OpenBLAS), CPU clock, one sample a
round per (shape, variant, hot|cold), variants interleaved; medians and GFLOP/s printed,
then the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.harness import cache_root, run_with_threads

SHAPES = [(128, 128), (128, 512), (512, 128)]  # (m: x's columns, n: dy's columns), k = 1024
TOKENS = 1024
# small_gemm's settings per variant (module attributes, set while the variant compiles)
BLAS = {"LONG_K_MIN": 1 << 40}
VARIANTS = {
    "blas": BLAS,  # OpenBLAS for all three
    "kernel": {"PREFETCH_A_K": None},  # the k-outer kernel for all three, no prefetch
    # a's line of the row block's last row, k ahead: 16, 32 (the default), 64
    "pf_k16": {"PREFETCH_A_K": 16},
    "pf_k32": {},
    "pf_k64": {"PREFETCH_A_K": 64},
    # the next row block's line (12 rows on), at the same k or 32 ahead
    "pf_next_block": {"PREFETCH_A_ROWS": 12, "PREFETCH_A_K": 0},
    "pf_next_k32": {"PREFETCH_A_ROWS": 12, "PREFETCH_A_K": 32},
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (15)")
    parser.add_argument("--sweep-mb", type=int, default=32, help="buffer written before a "
                        "cold call, MB (32)")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="these variants only (repeatable; default: all)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}: nothing would be timed")
    run_with_threads("benchmarks.weight_grad_cold", 1, sys.argv[1:] if argv is None else argv)
    with cache_root("weight_grad_cold.") as root:
        table = measure(args.variant or list(VARIANTS), args.rounds, args.sweep_mb, root)
    for (m, n), rows in table.items():
        flop = 2 * m * n * TOKENS
        print(f"[{m} x {TOKENS}] @ [{TOKENS} x {n}]")
        for name, (hot, cold) in rows.items():
            print(f"    {name:<16} hot {hot * 1e6:7.1f} us ({flop / hot / 1e9:5.1f} GFLOP/s)"
                  f"   cold {cold * 1e6:7.1f} us ({flop / cold / 1e9:5.1f} GFLOP/s)")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def measure(variants: list[str], rounds: int, sweep_mb: int, root: str) -> dict:
    """{(m, n): {variant: (hot seconds, cold seconds)}}, medians over interleaved rounds;
    each variant's result checked against OpenBLAS's first (rounding: tests)."""
    import numpy as np

    import graphc
    from benchmarks.gpt_gemms import owner

    rng = np.random.default_rng(14)
    sweep = np.zeros(sweep_mb << 18, np.float32)
    runs = {}
    for m, n in SHAPES:
        x = rng.standard_normal((TOKENS, m)).astype(np.float32)
        dy = rng.standard_normal((TOKENS, n)).astype(np.float32)
        want = x.T @ dy
        for name in variants:
            os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)
            saved = {key: getattr(*owner(key)) for key in VARIANTS[name]}
            for key, value in VARIANTS[name].items():
                setattr(*owner(key), value)
            try:
                compiled = graphc.compile(_weight_gradient, backend="cpu")
                compiled(graphc.tensor(x), graphc.tensor(dy))
            finally:
                for key, value in saved.items():
                    setattr(*owner(key), value)
            run = compiled.executable.run
            got = run(x, dy)[0]
            if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
                raise AssertionError(f"variant {name}, {m} x {n}: wrong result")
            runs[(m, n, name)] = (run, x, dy)
    samples = {key: ([], []) for key in runs}
    for _ in range(rounds):
        for key, (run, x, dy) in runs.items():
            run(x, dy)
            start = time.process_time()
            run(x, dy)
            samples[key][0].append(time.process_time() - start)
            sweep += 1.0  # writes every line of the buffer: x and dy leave L1 and L2
            start = time.process_time()
            run(x, dy)
            samples[key][1].append(time.process_time() - start)
    table: dict = {}
    for (m, n, name), (hot, cold) in samples.items():
        table.setdefault((m, n), {})[name] = (float(np.median(hot)), float(np.median(cold)))
    return table


def _weight_gradient(x, dy):
    return x.t() @ dy


if __name__ == "__main__":
    main()
