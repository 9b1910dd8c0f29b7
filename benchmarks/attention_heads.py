"""GPT's attention heads alone: the one-block `attention` and `attention_backward` kernels.

    python -m benchmarks.attention_heads                    # the tree's kernels, 31 rounds
    python -m benchmarks.attention_heads --against HEAD~1   # also attention_small.py of REV
    python -m benchmarks.attention_heads --against HEAD~1 --step   # the GPT b16 step A/B

The GPT b16 step's heads ([16, 4, 64, 32], causal, benchmarks/models.py) through
scaled_dot_product_attention, forward and backward (the gradients of q, k and v of
sum(out * w)), compiled on the cpu backend, where graphc.backends.cpu.attention_small's
one-block kernels take each head. Variants, each compiled in this process under a
GRAPHC_CACHE_DIR of its own (benchmarks.harness `switched`): "tree" (the working tree's
kernels) and, with `--against REV`, "REV" (attention_small.py as git revision REV has it, in
attention_small's place while it compiles). It prints, per variant, the medians over
interleaved rounds of the forward and backward kernels' own times (`graphc.profile`, 20 runs
each round) and of the whole call (CPU time), how far apart the variants' results are, and
the load average. One thread unless `--threads`. With `--step`, the same variants of
benchmarks/model_steps.py's GPT b16 training step instead (benchmarks.harness `step_ab`): the
step's median CPU time and its attention kernels' (`graphc.profile`, 3 rounds of 11 runs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPE = (16, 4, 64, 32)  # batch, heads, context, head size: the GPT b16 step's


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31, help="interleaved rounds (31)")
    parser.add_argument("--against", metavar="REV",
                        help="also time attention_small.py as git revision REV has it")
    parser.add_argument("--mode", choices=("causal", "none"), default="causal")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--step", action="store_true", help="the GPT b16 step's A/B instead")
    args = parser.parse_args(argv)
    from benchmarks.harness import run_with_threads

    run_with_threads("benchmarks.attention_heads", args.threads,
                     sys.argv[1:] if argv is None else argv)
    if args.step:
        return _step(args)
    import numpy as np

    import graphc
    import graphc.nn.functional as F
    from benchmarks.harness import cache_root, interleaved_process_times, switched

    def step(q, k, v, w):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=args.mode == "causal")
        (out * w).sum().backward()
        return out.detach(), q.grad, k.grad, v.grad

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4)]
    tensors = [graphc.tensor(a, requires_grad=i < 3) for i, a in enumerate(arrays)]
    variants = ("tree",) + ((args.against,) if args.against else ())
    compiled, results = {}, {}
    with cache_root("attention_heads_") as root:
        for name in variants:
            with switched(root, name, {}, False), _variant(name):
                compiled[name] = graphc.compile(step, backend="cpu")
                results[name] = [r.numpy().copy() for r in _call(compiled[name], tensors)]
                ops = [n.op for n in compiled[name].optimized_graph.nodes]
                if "attention_backward" not in ops:
                    raise SystemExit(f"attention_heads: {name}: the chain was not fused ({ops})")
        kernels = {name: {"forward": [], "backward": []} for name in variants}
        for r in range(args.rounds):
            for name in (variants if r % 2 else variants[::-1]):
                for t in tensors[:3]:
                    t.grad = None  # as the compiled call saw them
                with switched(root, name, {}, False), _variant(name):
                    report = graphc.profile(compiled[name], *tensors, repeat=20)
                for row in report.rows:
                    if row.op in ("attention", "attention_backward"):
                        key = "forward" if row.op == "attention" else "backward"
                        kernels[name][key].append(row.seconds)
        times = interleaved_process_times(
            {name: (lambda n=name: _call(compiled[n], tensors)) for name in variants},
            args.rounds, 0.05)
    for name in variants:
        fwd, bwd = (statistics.median(kernels[name][key]) * 1e6
                    for key in ("forward", "backward"))
        print(f"{name}: attention {fwd:.1f} us, attention_backward {bwd:.1f} us, "
              f"the call {statistics.median(times[name]) * 1e6:.0f} us "
              f"(medians of {args.rounds} rounds)")
    if args.against:
        for label, ours, theirs in zip(("out", "dq", "dk", "dv"), results["tree"],
                                       results[args.against]):
            apart = np.abs(ours.astype(np.float64) - theirs).max() / np.abs(theirs).max()
            print(f"{label}: at most {apart:.2e} of its largest value apart")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def _step(args) -> None:
    import numpy as np

    from benchmarks import model_steps
    from benchmarks.harness import cache_root, step_ab, switched

    variants = ("tree",) + ((args.against,) if args.against else ())
    with cache_root("attention_heads_") as root:
        @contextlib.contextmanager
        def variant(name):
            with switched(root, name, {}, False), _variant(name):
                yield

        times, profiled = step_ab(variants, variant,
                                  lambda: model_steps.graphc_gpt_step(False), args.rounds, 3,
                                  repeat=11)
    for name in variants:
        rows, seconds = profiled[name]
        heads = {op: sum(seconds[row.step] for row in rows if row.op == op)
                 for op in ("attention", "attention_backward")}
        print(f"{name}: step {np.median(times[name]) * 1e3:.2f} ms (median of {args.rounds}); "
              f"attention {heads['attention'] * 1e3:.3f} ms, attention_backward "
              f"{heads['attention_backward'] * 1e3:.3f} ms (4 layers, profiles' medians)")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def _call(compiled, tensors):
    for t in tensors[:3]:
        t.grad = None  # else the gradients add up from call to call
    return compiled(*tensors)


@contextlib.contextmanager
def _variant(name: str):
    """attention_small.py as git revision `name` has it in its place ("tree": as it is)."""
    if name == "tree":
        yield
        return
    import graphc.backends.cpu.attention as attention

    kept = attention.attention_small
    attention.attention_small = module_at(name, "graphc/backends/cpu/attention_small.py")
    try:
        yield
    finally:
        attention.attention_small = kept


def module_at(revision: str, path: str):
    """The file `path` as git `revision` has it, as a module of its own."""
    import subprocess
    import types

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=root,
                            capture_output=True, text=True)
    if source.returncode:
        raise SystemExit(f"attention_heads --against: no {path} at {revision!r} "
                         f"({source.stderr.strip()}); give a revision of this repository")
    module = types.ModuleType(f"{os.path.basename(path)[:-3]}_at_{revision}")
    exec(compile(source.stdout, f"{path}@{revision}", "exec"), module.__dict__)
    return module


if __name__ == "__main__":
    main()
