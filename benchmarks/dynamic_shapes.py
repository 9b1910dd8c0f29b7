"""Dynamic shapes: how often graphc.compile compiles over shape sweeps, and what a symbolic
graph costs per call against the static graph of the same shape.

    python -m benchmarks.dynamic_shapes            # every part, backend cpu
    python -m benchmarks.dynamic_shapes --quick    # small sizes, few repeats
    python -m benchmarks.dynamic_shapes --parts speed --threads 1,2 --realtime
    python -m benchmarks.dynamic_shapes --parts speed --threads 1 --clock cpu --models mlp,lenet

Parts:
- sweep: a GPT (graphc.tools.demo_gpt.TinyGPT) in inference over batch 1..16 at length 32,
  then length 8..32 at batch 4 (dynamic=None, True, then False as the baseline): traces,
  backend compiles, seconds;
- epochs: an MLP training step over 3 epochs whose last batch is smaller: traces;
- speed: medians of the MLP 784-256-256-10 batch-64 and batch-1 training steps (`mlp`,
  `mlp_b1`; at batch 1 dynamic=True specialises the size 1, and the entry keeps a shape
  guard), the LeNet-5 batch-64 training step and the GPT forward (n_embd 128, 4 layers,
  length 64, batch 16; `--models` picks), static (dynamic=False) against symbolic
  (dynamic=True) at the same shape, interleaved in one process, timed with `--clock`
  (wall, or the process's CPU time: steadier on a shared machine at one thread);
  `--threads 1,2`: on each count forced (`ThreadChooser(fixed=n)`) instead of the default
  chooser, the counts interleaved too, and the loops each build forks (`.omp` functions:
  the symbolic build's decide per call, graphc.backends.cpu.kernels.WorkPerCall);
  `--realtime` (root): each timed round under SCHED_FIFO (benchmarks.mlp_threads.realtime),
  as if a core were free.

Counts: "traces" are the compiled callable's graphs (`len(f.graphs)`); "backend compiles"
count the executables the backend built (a symbolic graph on cpu compiles once for every
size where its ops take sizes per call, graphc.backends.cpu.runtime_sizes, and once per
distinct sizes otherwise: graphc.backends.specializing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import graphc
from benchmarks import model_steps
from benchmarks.harness import now, set_clock
from benchmarks.models import MlpSizes, batch, graphc_model, graphc_step


def _backend_compiles(f) -> int:
    total = 0
    for entry in f._entries:
        ex = entry.executable
        if hasattr(ex, "compiled_sizes"):  # per-size executables, and the one for every size
            total += len(ex.compiled_sizes) + bool(getattr(ex, "runs_generic", False))
        else:
            total += 1
    return total


def sweep(backend: str, quick: bool) -> None:
    for dynamic in (None, True, False):  # False: every shape traced, the old behaviour
        _sweep(backend, quick, dynamic)


def _sweep(backend: str, quick: bool, dynamic) -> None:
    from graphc.tools.demo_gpt import TinyGPT

    graphc.manual_seed(0)
    model = TinyGPT().eval()
    f = graphc.compile(model, backend=backend, dynamic=dynamic, recompile_limit=100)
    batches = range(1, 5) if quick else range(1, 17)
    lengths = range(8, 12) if quick else range(8, 33)
    start = time.perf_counter()
    with graphc.no_grad():
        for b in batches:
            f(graphc.randint(0, 128, (b, 32)))
        for t in lengths:
            f(graphc.randint(0, 128, (4, t)))
    seconds = time.perf_counter() - start
    shapes = len(batches) + len(lengths)
    print(f"sweep   GPT inference, {shapes} shapes on {backend}, dynamic={dynamic}: "
          f"{len(f.graphs)} traces "
          f"({', '.join(str(g.inputs[0].type) for g in f.graphs)}), "
          f"{_backend_compiles(f)} backend compiles, {seconds:.1f} s")


def epochs(backend: str, quick: bool) -> None:
    model = graphc_model("mlp")
    step = graphc.compile(graphc_step(model), backend=backend)
    x, y = batch("mlp", 200)
    xs, ys = graphc.from_numpy(x), graphc.from_numpy(y)
    for _ in range(3):
        for i in range(0, 200, 64):  # 64, 64, 64, 8
            step(xs[i:i + 64], ys[i:i + 64])
    print(f"epochs  MLP step, 3 epochs of batches 64,64,64,8 on {backend}: "
          f"{len(step.graphs)} traces ({', '.join(str(g.inputs[0].type) for g in step.graphs)})"
          f", {_backend_compiles(step)} backend compiles")


def _median_ms(fn, args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = now()
        fn(*args)
        times.append(now() - t0)
    return statistics.median(times) * 1e3


def _cpu_executable(f, args):
    """The cpu executable a compiled callable's last graph runs on `args` (a symbolic
    graph's: its one executable for every size), or None on other backends."""
    from graphc.symbolic import Sym

    ex = f.executable
    if hasattr(ex, "executable_for"):  # graphc.backends.specializing: bind the symbols
        values = {}
        for v, arg in zip(f.graphs[-1].inputs, args):  # the arguments lead the inputs
            for size, actual in zip(v.type.shape, arg.shape):
                if type(size) is Sym and size.is_symbol():
                    values[size.name] = actual
        ex = getattr(ex.executable_for(values), "executable", None)
    return ex if hasattr(ex, "thread_chooser") else None


def _forked(ex) -> str:
    """How many loops the executable's module forks, and how many of them decide per call."""
    import re

    text = ex.lowered.ir_text
    names = re.findall(r'define[^@]*@"?([\w.]+)\.omp"?\(', text)
    per_call = sum(1 for n in names if re.search(
        r'define[^@]*@"?%s"?\(ptr[^{]*\{[^}]*?icmp slt' % re.escape(n), text))
    return f"{len(names)} forked loops ({per_call} checked per call)"


def _compare(label: str, make, args, repeats: int, rounds: int, counts=(None,),
             fifo: bool = False) -> None:
    from benchmarks.mlp_threads import realtime

    static, symbolic = make(False), make(True)
    for f in (static, symbolic):  # compile, warm up
        for _ in range(3):
            f(*args)
    kinds = str(symbolic.graphs[-1].inputs[0].type)
    executables = {"static": _cpu_executable(static, args),
                   "symbolic": _cpu_executable(symbolic, args)}
    if counts != (None,):
        if None in executables.values():
            raise SystemExit(f"benchmarks/dynamic_shapes.py: --threads needs the cpu backend's "
                             f"executables, found {executables}")
        for name, ex in executables.items():
            print(f"speed   {label}, {name}: {_forked(ex)}")
    times = {(name, n): [] for n in counts for name in ("static", "symbolic")}
    for r in range(rounds):  # interleaved: the machine's load hits both alike
        order = list(times)
        shift = r % len(order)
        for name, n in order[shift:] + order[:shift]:
            f = static if name == "static" else symbolic
            if n is not None:
                from graphc.backends.cpu import threads

                executables[name].thread_chooser = threads.ThreadChooser(
                    threads.most_threads(), fixed=n)
            with realtime(fifo):
                for _ in range(3):  # the team wakes or parks: not timed
                    f(*args)
                times[(name, n)].append(_median_ms(f, args, repeats))
    for n in counts:
        ms_a = statistics.median(times[("static", n)])
        ms_b = statistics.median(times[("symbolic", n)])
        on = "" if n is None else f" on {n} thread{'s' * (n > 1)}"
        print(f"speed   {label}{on}: static {ms_a:.3f} ms, symbolic ({kinds}) {ms_b:.3f} ms, "
              f"ratio {ms_b / ms_a:.3f}")


MODELS = ("mlp", "mlp_b1", "lenet", "gpt")


def speed(backend: str, quick: bool, counts=(None,), fifo: bool = False,
          models=MODELS) -> None:
    repeats, rounds = (20, 3) if quick else (50, 7)
    for key, name, n, label in (("mlp", "mlp", 64, "MLP 784-256-256-10 b64"),
                                ("mlp_b1", "mlp", 1, "MLP 784-256-256-10 b1"),
                                ("lenet", "lenet", 64, "LeNet-5 b64")):
        if key not in models:
            continue
        x, y = batch(name, n, MlpSizes())

        def make_step(dynamic: bool, name=name):
            return graphc.compile(graphc_step(graphc_model(name)), backend=backend,
                                  dynamic=dynamic)

        _compare(f"{label} training step", make_step,
                 (graphc.from_numpy(x), graphc.from_numpy(y)), repeats, rounds, counts, fifo)
    if "gpt" not in models:
        return

    shape = model_steps.QUICK["gpt"] if quick else model_steps.FULL["gpt"]
    graphc.manual_seed(0)
    gpt = model_steps.gpt(graphc, **shape).eval()
    idx = graphc.from_numpy(np.random.default_rng(0).integers(
        0, model_steps.VOCAB, (shape["batch"], shape["block"])))

    def make_gpt(dynamic: bool):
        return _Forward(graphc.compile(gpt, backend=backend, dynamic=dynamic))

    _compare(f"GPT forward (n_embd {shape['embed']}, {shape['layers']} layers, length "
             f"{shape['block']}, batch {shape['batch']})", make_gpt, (idx,), repeats, rounds,
             counts, fifo)


class _Forward:
    """A compiled model called under no_grad (inference), with its graphs."""

    def __init__(self, f) -> None:
        self.f = f

    @property
    def graphs(self):
        return self.f.graphs

    @property
    def executable(self):
        return self.f.executable

    def __call__(self, *args):
        with graphc.no_grad():
            return self.f(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--parts", default="sweep,epochs,speed")
    parser.add_argument("--threads", default=None,
                        help="speed: thread counts forced, e.g. 1,2 (default: the chooser)")
    parser.add_argument("--realtime", action="store_true",
                        help="speed: each timed round under SCHED_FIFO (root)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="speed: the wall clock or the process's CPU time")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"speed: which of {','.join(MODELS)} to time")
    args = parser.parse_args()
    models = tuple(args.models.split(","))
    if not set(models) <= set(MODELS):
        parser.error(f"--models: expected names from {','.join(MODELS)}, got {args.models!r}")
    set_clock(args.clock)
    counts = (None,)
    if args.threads is not None:
        try:
            counts = tuple(int(n) for n in args.threads.split(","))
        except ValueError:
            parser.error(f"--threads takes counts such as 1,2, got {args.threads!r}")
        if min(counts) < 1:
            parser.error(f"--threads: each count must be at least 1, got {args.threads!r}")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; "
          f"backend {args.backend}; clock {args.clock}")
    for part in args.parts.split(","):
        if part == "speed":
            speed(args.backend, args.quick, counts, args.realtime, models)
        else:
            {"sweep": sweep, "epochs": epochs}[part](args.backend, args.quick)
    print(f"at the end: load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")

if __name__ == "__main__":
    main()
