"""Large elementwise kernels with and without the 512-bit hint and the prefetching blocks, in
one process.

    python -m benchmarks.elementwise_prefetch                      # 16M float32, 15 rounds
    python -m benchmarks.elementwise_prefetch --elements 131072 --rounds 31   # data in cache

Four variants of each expression are compiled through `graphc.compile`, each with its own
GRAPHC_CACHE_DIR (the pipeline cache keys on graphc's source, the same for all):
- "256": no loop prefers 512-bit vectors (`scalars.WIDE_VECTOR_FUNCTIONS` emptied) and every
  loop is nested as before the blocks (`prefetch.PREFETCH_MIN_ELEMENTS` out of reach);
- "512": the 512-bit hint, no blocks (the code of the fifth session);
- "256 + prefetch": blocks, no hint;
- "512 + prefetch": both (the default).
The expressions: the benchmark's elementwise chain tanh(x*0.5+1)*sigmoid(x)+relu(x-0.1) and
single tanh, sigmoid, exp and relu kernels. It prints each variant's median time per call over
interleaved rounds (CPU clock; one OpenMP thread), in ms and ns per element, then the load
average (docs/performance.md, "Elementwise chain, seventh session").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

from benchmarks.harness import cache_root

VARIANTS = ("256", "512", "256 + prefetch", "512 + prefetch")
EXPRESSIONS = ("chain", "tanh", "sigmoid", "exp", "relu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 24, help="float32 elements (16M)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (15)")
    parser.add_argument("--only", action="append", choices=EXPRESSIONS,
                        help="an expression to measure (repeatable; default all)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    with cache_root("elementwise_prefetch.") as root:
        for expression in args.only or EXPRESSIONS:
            _compare(expression, args.elements, args.rounds, root)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def _expression(name: str):
    functions = {
        "chain": lambda x: (x * 0.5 + 1).tanh() * x.sigmoid() + (x - 0.1).relu(),
        "tanh": lambda x: x.tanh(),
        "sigmoid": lambda x: x.sigmoid(),
        "exp": lambda x: x.exp(),
        "relu": lambda x: x.relu(),
    }
    return functions[name]


@contextlib.contextmanager
def _variant(name: str, root: str, expression: str):
    """While compiling variant `name`: its cache dir, scalars and prefetch as it has them."""
    from graphc.backends.cpu import prefetch, scalars

    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, f"{expression}.{name}")
    wide, least = scalars.WIDE_VECTOR_FUNCTIONS, prefetch.PREFETCH_MIN_ELEMENTS
    if not name.startswith("512"):
        scalars.WIDE_VECTOR_FUNCTIONS = frozenset()
    if not name.endswith("prefetch"):
        prefetch.PREFETCH_MIN_ELEMENTS = 1 << 62
    try:
        yield
    finally:
        scalars.WIDE_VECTOR_FUNCTIONS, prefetch.PREFETCH_MIN_ELEMENTS = wide, least


def _compare(expression: str, elements: int, rounds: int, root: str) -> None:
    import numpy as np

    import graphc

    x = graphc.tensor(np.random.default_rng(2).standard_normal(elements).astype(np.float32))
    compiled, results = {}, {}
    for name in VARIANTS:
        with _variant(name, root, expression), graphc.no_grad():
            f = graphc.compile(_expression(expression), backend="cpu")
            f(x)  # traces and compiles
            results[name] = f(x).numpy()
        compiled[name] = f
    first = results[VARIANTS[0]]
    for name, result in results.items():  # each element by the same instructions
        if not np.array_equal(result, first):
            raise AssertionError(f"{expression}: variant {name!r} differs from {VARIANTS[0]!r}")
    times: dict[str, list[float]] = {name: [] for name in compiled}
    with graphc.no_grad():
        for r in range(rounds):
            for name in (list(compiled) if r % 2 else list(compiled)[::-1]):
                start = time.process_time()
                compiled[name](x)
                times[name].append(time.process_time() - start)
    print(f"{expression} over {elements:,} float32 (median of {rounds}): " + "; ".join(
        f"{name} {statistics.median(t) * 1e3:.2f} ms "
        f"({statistics.median(t) * 1e9 / elements:.2f} ns/el)" for name, t in times.items()),
        flush=True)


if __name__ == "__main__":
    main()
