"""The symbolic MLP step's kernels against the static step's, by graphc.profile.

    python -m benchmarks.dynamic_profile                 # one thread, 7 rounds
    python -m benchmarks.dynamic_profile --quick         # 2 rounds, few runs
    python -m benchmarks.dynamic_profile --model gpt     # the GPT forward instead

The MLP 784-256-256-10 batch-64 SGD training step (benchmarks.models), compiled static
(dynamic=False) and symbolic (dynamic=True: one runtime-sized executable for every batch),
each profiled kernel by kernel (graphc.profile, which profiles a symbolic graph at the call's
sizes), the two in alternating order each round (benchmarks.harness.interleaved_profiles);
medians over the rounds. Prints the native call of each, the kernels by op class (matmul-led
fused nodes, other fused nodes, the rest), and each variant's slowest kernels. One thread
(OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set to 1 for the process). `--model gpt`: the GPT
forward of benchmarks.dynamic_shapes (n_embd 128, 4 layers, length 64, batch 16; batch and
length symbolic), under no_grad.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import numpy as np

import graphc
from benchmarks import model_steps
from benchmarks.harness import interleaved_profiles, run_with_threads
from benchmarks.models import MlpSizes, batch, graphc_model, graphc_step

VARIANTS = ("static", "symbolic")


def _kind(op: str) -> str:
    if op.startswith("fused(matmul") or op == "matmul":
        return "matmul (and its epilogue)"
    if op.startswith("fused("):
        return "other fused"
    return op


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--limit", type=int, default=6, help="slowest kernels shown")
    parser.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    args = parser.parse_args(argv)
    run_with_threads("benchmarks.dynamic_profile", 1, sys.argv[1:] if argv is None else argv)
    rounds, repeat = (2, 5) if args.quick else (7, 20)
    arguments, make, label, mode = _model(args.model)
    steps = {}
    for name in VARIANTS:
        graphc.manual_seed(0)
        steps[name] = graphc.compile(make(), backend="cpu", dynamic=name == "symbolic")
        with mode():
            for _ in range(3):
                steps[name](*arguments)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; {label}; "
          f"{rounds} rounds of {repeat} runs; one thread")
    profiles = interleaved_profiles(steps, {n: arguments for n in VARIANTS}, rounds,
                                    lambda name: mode(), repeat)
    for name, (rows, seconds) in profiles.items():
        total = sum(seconds.values())
        kinds: dict[str, float] = {}
        for row in rows:
            kinds[_kind(row.op)] = kinds.get(_kind(row.op), 0.0) + seconds[row.step]
        print(f"{name}: {len(rows)} kernels, {total * 1e6:.1f} us in kernels "
              f"({str(steps[name].graphs[-1].inputs[0].type)})")
        for kind, t in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"  {t * 1e6:8.1f} us  {kind}")
        slowest = sorted(rows, key=lambda r: -seconds[r.step])[:args.limit]
        for row in slowest:
            print(f"    {seconds[row.step] * 1e6:8.1f} us  {row.op[:40]:<40} {row.shape[:40]}")
    print("kernels of one op and shape in both, the largest differences (symbolic - static):")
    by_key = {}
    for name, (rows, seconds) in profiles.items():
        for row in rows:  # a key met twice: its occurrences in schedule order
            key = (row.op, row.shape)
            by_key.setdefault(key, {}).setdefault(name, []).append(seconds[row.step])
    pairs = [(b - a, key) for key, times in by_key.items() if len(times) == 2
             for a, b in zip(times["static"], times["symbolic"])]
    for gap, (op, shape) in sorted(pairs, key=lambda p: -abs(p[0]))[:args.limit]:
        print(f"  {gap * 1e6:+8.1f} us  {op[:40]:<40} {shape[:40]}")
    unmatched = [key for key, times in by_key.items() if len(times) == 1]
    for op, shape in unmatched:
        print(f"  in one variant only: {op} {shape}")
    print(f"at the end: load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


def _model(name: str):
    """(arguments, a function making the module or step to compile, its label, the context
    it runs in) of `--model`."""
    if name == "mlp":
        x, y = batch("mlp", 64, MlpSizes())
        return ((graphc.from_numpy(x), graphc.from_numpy(y)),
                lambda: graphc_step(graphc_model("mlp")), "MLP 784-256-256-10 b64 training step",
                contextlib.nullcontext)
    shape = model_steps.FULL["gpt"]
    idx = graphc.from_numpy(np.random.default_rng(0).integers(
        0, model_steps.VOCAB, (shape["batch"], shape["block"])))
    return ((idx,), lambda: model_steps.gpt(graphc, **shape).eval(),
            f"GPT forward (n_embd {shape['embed']}, {shape['layers']} layers, length "
            f"{shape['block']}, batch {shape['batch']})", graphc.no_grad)


if __name__ == "__main__":
    main()
