"""graphc's generated GEMM against the BLAS it would call, in one process (alternating rounds).

    python -m benchmarks.own_gemm --threads 1                     # the products alone
    python -m benchmarks.own_gemm --threads 1 --step lenet5_b64 --step resnet18_b32
    python -m benchmarks.own_gemm --threads 2 --clock wall --step dcgan_b32

"before" compiles with `switches` off (graphc.backends.cpu.small_gemm.LARGE_PRODUCTS "off":
large float32 products on the BLAS, as before the thirteenth session), "after" with them on
(the generated panel GEMM for them too, and Conv.gemm's), each with its own
GRAPHC_CACHE_DIR. Products: a compiled `a @ b` per shape of PRODUCTS, GFLOP/s medians over
`--rounds` interleaved rounds (CPU clock; `--clock wall` for several threads). Steps:
benchmarks/model_steps.py's and family_steps.py's training steps, ms medians. Each line
prints after / before; the load average closes the report. Where the BLAS already runs
AVX-512 kernels, "auto" keeps the BLAS: this benchmark shows what forcing it
would gain or lose (docs/performance.md, "thirteenth session: graphc's own GEMM").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.harness import cache_root, interleaved_process_times, run_with_threads, switched

# (m, n, k, a read transposed, b read transposed): the square SGEMMs of benchmarks.run and
# a transformer's and ResNet-18's large products
PRODUCTS = ((1024, 1024, 1024, False, False), (2048, 2048, 2048, False, False),
            (512, 2048, 512, False, False), (1024, 1024, 1024, False, True),
            (2304, 512, 512, True, False), (768, 3072, 768, False, True))
STEPS = ("lenet5_b64", "resnet18_b32", "gpt_b16", "dcgan_b32", "mobilenet_b32")
VARIANTS = ("before", "after")


def switches(name: str) -> dict:
    """The module attributes variant `name` compiles under."""
    from graphc.backends.cpu import small_gemm

    return {(small_gemm, "LARGE_PRODUCTS"): "on" if name == "after" else "off"}


def _product(m: int, n: int, k: int, a_t: bool, b_t: bool):
    """(a compiled call of the product, its operands' float64 result, its output)."""
    import graphc

    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if a_t else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if b_t else (k, n)).astype(np.float32)
    ga, gb = graphc.tensor(a), graphc.tensor(b)
    f = graphc.compile(lambda x, y: (x.T if a_t else x) @ (y.T if b_t else y), backend="cpu")

    def call():
        with graphc.no_grad():
            return f(ga, gb)

    reference = (a.T if a_t else a).astype(np.float64) @ (b.T if b_t else b)
    return call, reference


def _step(name: str):
    """(compiled training step of `name`, its arguments)."""
    import graphc
    from benchmarks import family_steps, model_steps, models

    family = name.split("_")[0]
    if family == "lenet5":
        x, y = models.batch(family, 64)
        step, arguments = models.graphc_step(models.graphc_model(family)), (x, y)
    elif family in family_steps.BUILDERS:
        shape = family_steps.FULL[family]
        graphc.manual_seed(0)
        _, step = family_steps.build(graphc, family, shape)
        arguments = family_steps.batch(family, shape)
    else:
        shape = model_steps.FULL[family]
        graphc.manual_seed(0)
        step = models.graphc_step(model_steps.build(graphc, family, shape))
        arguments = model_steps.batch_of(family, shape)
    return graphc.compile(step, backend="cpu"), tuple(graphc.tensor(a) for a in arguments)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step", action="append", choices=STEPS)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="CPU time (one thread) or wall time (several)")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    run_with_threads("benchmarks.own_gemm", args.threads,
                     sys.argv[1:] if argv is None else argv)
    with cache_root("graphc-own-gemm-") as root:
        def variant(name):
            return switched(root, name, switches(name), True)

        if args.step:
            for name in args.step:
                _time_step(name, variant, args.rounds, clock)
        else:
            for shape in PRODUCTS:
                _time_product(shape, variant, args.rounds, clock)
    print("load:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


def _time_product(shape, variant, rounds: int, clock) -> None:
    calls, errors = {}, {}
    for name in VARIANTS:
        with variant(name):
            call, reference = _product(*shape)
            out = call().numpy()
            errors[name] = float(np.abs(out - reference).max() / np.abs(reference).max())
        calls[name] = call
    times = interleaved_process_times(calls, rounds, clock=clock)
    flops = 2.0 * shape[0] * shape[1] * shape[2]
    rates = {name: flops / statistics.median(t) / 1e9 for name, t in times.items()}
    label = "x".join(map(str, shape[:3])) + (" a^T" if shape[3] else "") + \
        (" b^T" if shape[4] else "")
    print(f"{label:24s} before {rates['before']:6.1f}  after {rates['after']:6.1f} GFLOP/s"
          f"  {rates['after'] / rates['before']:.2f}x  err {errors['before']:.1e} / "
          f"{errors['after']:.1e}")


def _time_step(name: str, variant, rounds: int, clock) -> None:
    steps = {}
    for v in VARIANTS:
        with variant(v):
            step, arguments = _step(name)
            for _ in range(3):
                step(*arguments)
        steps[v] = (step, arguments)
    times = interleaved_process_times({v: lambda v=v: steps[v][0](*steps[v][1])
                                       for v in VARIANTS}, rounds, 0.3, clock)
    ms = {v: statistics.median(t) * 1e3 for v, t in times.items()}
    print(f"{name:16s} before {ms['before']:8.2f}  after {ms['after']:8.2f} ms  "
          f"{ms['after'] / ms['before']:.3f}x")


if __name__ == "__main__":
    main()
