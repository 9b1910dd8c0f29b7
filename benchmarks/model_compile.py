"""Compile cost of real training steps, cold (empty cache) and warm (the cache the cold run
filled), each in a fresh process, with where the time goes.

    python -m benchmarks.model_compile          # LeNet-5, GPT, ResNet-18, LSTM, ..., MLPs
    python -m benchmarks.model_compile --models gpt --workers 1 --level 2
    python -m benchmarks.model_compile --compare-levels --models lenet5,gpt  # run speed
    python -m benchmarks.model_compile --llvm-only --repeat 3   # LLVM before/after, in turns

Models: `lenet5` (batch 64), `gpt` and `resnet18` (benchmarks/model_steps.py's full sizes),
`lstm`, `vae`, `dcgan`, `mobilenet` (issue 12's families at the sizes of
benchmarks/model_steps.py's COMPILE_ONLY, with their examples' optimizers: Adam for the
first three, two Adam updates per DCGAN step), `mlpN` (N Linear layers of width 256 with
ReLUs, batch 64: `mlp3` is the benchmark MLP's depth, `mlp30` ten times it: compile time
should grow linearly with depth). Each child builds the model and its training step (SGD
momentum unless said above), compiles it with graphc.compile and times the first call (which
traces, runs the passes, lowers and compiles the steady graph, and runs the first step:
`warm-up`, the rest of the first call, i.e. that step's run, compiled where the optimizer's
first step is its steady update on zero state (graphc.jit.first_step), on the interpreter
otherwise), then the next call. Stages come
from timers wrapped around graphc.jit.compiler's and graphc.jit.retrace's functions and the
CPU backend's: `lower` (LLVM IR text), `dedupe` (graphc.backends.cpu.module_text), `llvm`
(optimisation and object code, in parts on several processes when the module is large:
graphc.backends.cpu.workers), `load` (MCJIT loading the objects), `key` (hashing the text for
the cache). `--workers` sets GRAPHC_COMPILE_WORKERS, `--level` the LLVM pipeline of every
module (default graphc's: O2 for every module, llvm.OPT_LEVEL). First calls in wall
seconds, with the CPU seconds of the child itself (workers' time not included) in brackets;
stages in wall seconds, or with `--clock cpu` the child's CPU seconds (robust to load, blind to the
workers). Warm stages: `trace`, `pipeline key` (the traced graph's text and hash:
graphc.jit.pipeline_cache), `lookup` (reading the entry, parsing and loading the planned
graph and its objects), `run` (the step's first run, arena and output pages included), and
the rest of the call. graphc is byte-compiled first, as an installed package is
(`_byte_compile`). The load average is printed: these
2-core machines are shared, and numbers move 2x with load.

`--compare-levels` measures what the pipeline buys at run time instead: in one process, the
same step (same weights, same batch; or `chain`, `conv`: benchmarks/cases.py's elementwise
chain and convolution) compiled at O2 and at O3, called in turns
(`--repeat` rounds after two warm-up calls each), medians of each. `--llvm-only` times the
LLVM work of each step's module as it was before deduplication and parts (whole text, O3,
one process) and as it is now, in turns in one process (wall, and this process's CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("lenet5", "gpt", "resnet18", "lstm", "vae", "dcgan", "mobilenet", "mlp3", "mlp30")
STAGES = ("trace", "passes", "lower", "dedupe", "key", "llvm", "load", "backend")
WARM_STAGES = ("trace", "pipeline key", "lookup", "run")


_clock = time.perf_counter  # --clock cpu: time.process_time (this process's CPU seconds)


def _timed(table: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        start = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            table[key] = table.get(key, 0.0) + _clock() - start
    return wrapper


def _step(name: str):
    """(training step, its arguments) of `name`, as graphc tensors."""
    import graphc
    import graphc.nn as gnn
    from benchmarks import model_steps, models
    from benchmarks.model_steps import COMPILE_ONLY, FULL, batch_of, build

    graphc.manual_seed(0)
    if name in COMPILE_ONLY:
        step, arrays = model_steps.training_step(name, COMPILE_ONLY[name])
        return step, tuple(graphc.tensor(a) for a in arrays)
    if name in ("gpt", "resnet18"):
        shape = FULL[name]
        model = build(graphc, name, shape)
        x, y = batch_of(name, shape)
    elif name.startswith("mlp"):
        depth = int(name[3:])
        layers = [gnn.Linear(784, 256), gnn.ReLU()]
        for _ in range(depth - 2):
            layers += [gnn.Linear(256, 256), gnn.ReLU()]
        model = gnn.Sequential(*layers, gnn.Linear(256, 10))
        x, y = models.batch("mlp", 64)
    else:
        model = models.graphc_model(name)
        x, y = models.batch(name, 64)
    return models.graphc_step(model), (graphc.tensor(x), graphc.tensor(y))


def child(name: str, level: int | None, clock: str = "wall") -> dict:
    global _clock
    import graphc
    import graphc.backends.cpu.executable as executable
    import graphc.jit.compiler as compiler
    import graphc.jit.pipeline as pipeline
    import graphc.jit.pipeline_cache as pipeline_cache
    import graphc.jit.retrace as retrace
    from graphc.backends.cpu import llvm

    if level is not None:
        llvm.OPT_LEVEL = level
    if clock == "cpu":
        _clock = time.process_time
    stages: dict[str, float] = {}
    retrace.trace_call = _timed(stages, "trace", retrace.trace_call)
    pipeline.run_pipeline = _timed(stages, "passes", pipeline.run_pipeline)
    pipeline.compile_graph = _timed(stages, "backend", pipeline.compile_graph)
    pipeline_cache.key_of = _timed(stages, "pipeline key", pipeline_cache.key_of)
    pipeline_cache.lookup = _timed(stages, "lookup", pipeline_cache.lookup)
    compiler.Compiled._run = _timed(stages, "run", compiler.Compiled._run)
    executable.lower = _timed(stages, "lower", executable.lower)
    llvm.deduplicated = _timed(stages, "dedupe", llvm.deduplicated)
    llvm.cache_key = _timed(stages, "key", llvm.cache_key)
    llvm._objects = _timed(stages, "llvm", llvm._objects)
    llvm.Library = _timed(stages, "load", llvm.Library)
    step, args = _step(name)
    compiled = graphc.compile(step, backend="cpu")
    wall, cpu = time.perf_counter(), time.process_time()
    compiled(*args)
    first = (time.perf_counter() - wall, time.process_time() - cpu)
    stages = dict(stages)  # the first call's (the timers go on adding to the old table)
    wall = time.perf_counter()
    compiled(*args)
    second = time.perf_counter() - wall
    ex = compiled.executable
    inside = sum(stages.get(k, 0.0) for k in ("trace", "passes", "backend"))
    stages["warm-up"] = first[0 if _clock is time.perf_counter else 1] - inside
    return {"first": first, "second": second, "stages": stages, "graphs": len(compiled.graphs),
            "kernels": len(set(ex.lowered.kernels)),
            "distinct": len(set(ex.lowered.kernels) - set(ex.library.aliases)),
            "parts": ex.library.parts, "from_cache": ex.library.from_cache,
            "chars": len(ex.lowered.ir_text), "deduped_chars": len(ex.library._ir_text)}


def _case(name: str):
    """(function, args) of `name`: a training step, or the `chain` (elementwise, 16M floats)
    and `conv` (conv2d forward, N=64 3->64 32x32) cases of benchmarks/cases.py."""
    import numpy as np

    import graphc
    from benchmarks import cases

    rng = np.random.default_rng(0)
    if name == "chain":
        return cases.graphc_chain, (graphc.tensor(rng.standard_normal(1 << 24, np.float32)),)
    if name == "conv":
        x, w, b = (graphc.tensor(rng.standard_normal(s).astype(np.float32))
                   for s in ((64, 3, 32, 32), (64, 3, 3, 3), (64,)))
        return (lambda x, w, b: graphc.conv2d(x, w, b, padding=1)), (x, w, b)
    return _step(name)  # same seed: the same weights


def compare_levels(name: str, repeat: int) -> str:
    """One table row: the case's median call at O2 and at O3 (and their first calls)."""
    import numpy as np

    import graphc
    from graphc.backends.cpu import llvm

    row, steps = [], []
    default_level = llvm.OPT_LEVEL
    for level in (2, 3):
        llvm.OPT_LEVEL = level
        fn, args = _case(name)
        compiled = graphc.compile(fn, backend="cpu")
        start = time.perf_counter()
        compiled(*args)
        row.append(time.perf_counter() - start)
        compiled(*args)
        steps.append((compiled, args))
    llvm.OPT_LEVEL = default_level
    times: list[list[float]] = [[], []]
    for _ in range(repeat):
        for k, (compiled, args) in enumerate(steps):
            start = time.perf_counter()
            compiled(*args)
            times[k].append(time.perf_counter() - start)
    o2, o3 = (float(np.median(t)) * 1e3 for t in times)
    return (f"| {name} | {o2:.2f} ms | {o3:.2f} ms | {o2 / o3:.2f} | {row[0]:.2f} s | "
            f"{row[1]:.2f} s |")


def compare_llvm(name: str, rounds: int) -> str:
    """One table row: the LLVM work of the step's module as before this issue (the whole
    text, O3, one object, in this process) and as now (`compile_module`: deduplicated, in
    parts on the workers for a large module), in turns, no cache; medians of wall and of
    this process's CPU seconds."""
    import numpy as np

    import graphc
    import graphc.backends.cpu.executable as executable
    from graphc.backends.cpu import llvm, llvm_worker, workers

    texts = []
    real = executable.llvm.compile_module

    def capture(text, *args, **kwargs):
        texts.append(text)
        return real(text, *args, **kwargs)

    executable.llvm.compile_module = capture
    fn, args = _case(name)
    graphc.compile(fn, backend="cpu")(*args)
    executable.llvm.compile_module = real
    text = texts[-1]
    workers.start()
    times: dict[str, list] = {"before": [], "now": []}
    for _ in range(rounds):
        for how in times:
            wall, cpu = time.perf_counter(), time.process_time()
            if how == "before":
                llvm_worker.object_code(text, "before", 3)
            else:
                llvm.compile_module(text, "now", use_cache=False)
            times[how].append((time.perf_counter() - wall, time.process_time() - cpu))
    (bw, bc), (nw, nc) = (np.median(np.array(t), axis=0) for t in times.values())
    return (f"| {name} | {len(text) // 1000}k | {bw:.2f} s ({bc:.2f}) | {nw:.2f} s ({nc:.2f}) "
            f"| {bw / nw:.1f}x |")


def _byte_compile() -> None:
    """Byte-compile graphc's and the benchmarks' sources (into their __pycache__ folders,
    which git ignores), so the children import graphc as an installed package is imported.
    Without it a checkout run with PYTHONDONTWRITEBYTECODE=1 (as on these machines)
    compiles every module a first call imports lazily (the CPU backend, the passes) in that
    call: ~0.02 s of the LSTM step's warm first call."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                           os.path.join(ROOT, "graphc"), os.path.join(ROOT, "benchmarks")],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:  # a read-only checkout: the children compile what they import
        print(f"note: graphc could not be byte-compiled ({done.stderr.strip()[:200]}); the "
              "first calls include compiling the modules they import", file=sys.stderr)


def _run_child(name: str, cache: str, args) -> dict:
    env = {**os.environ, "GRAPHC_CACHE_DIR": cache,
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if args.workers:
        env["GRAPHC_COMPILE_WORKERS"] = str(args.workers)
    command = [sys.executable, "-m", "benchmarks.model_compile", "--child", name]
    if args.level:
        command += ["--level", str(args.level)]
    command += ["--clock", args.clock]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800,
                          cwd=ROOT)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{name}: the child failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--workers", type=int, default=0, help="GRAPHC_COMPILE_WORKERS")
    parser.add_argument("--level", type=int, default=0, help="LLVM O level (default: graphc's)")
    parser.add_argument("--compare-levels", action="store_true",
                        help="run speed of each step compiled at O2 and at O3")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--llvm-only", action="store_true",
                        help="the LLVM work alone, as before and as now, in turns")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="what the stages read (the first call is given in both)")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.level or None, args.clock)),
              flush=True)
        return 0
    if args.llvm_only:
        print(f"command: `python -m benchmarks.model_compile {' '.join(sys.argv[1:])}`; "
              f"load average {os.getloadavg()[0]:.2f}\n")
        print("| module of | LLVM text | before: whole, O3, one process | now | speed-up |")
        print("|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="graphc-compile-") as cache:
            os.environ["GRAPHC_CACHE_DIR"] = cache
            for name in args.models.split(","):
                print(compare_llvm(name, max(1, args.repeat)), flush=True)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
        return 0
    if args.compare_levels:
        print(f"command: `python -m benchmarks.model_compile {' '.join(sys.argv[1:])}`; "
              f"load average {os.getloadavg()[0]:.2f}\n")
        print("| training step | call at O2 | call at O3 | O2 / O3 | first call O2 | O3 |")
        print("|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory(prefix="graphc-compile-") as cache:
            os.environ["GRAPHC_CACHE_DIR"] = cache
            for name in args.models.split(","):
                print(compare_levels(name, args.repeat), flush=True)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
        return 0
    print(f"command: `python -m benchmarks.model_compile {' '.join(sys.argv[1:])}`; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| training step | cold first call | warm first call | next call | cold stages "
          f"({args.clock} s) | warm stages | kernels (distinct) | LLVM text (deduplicated) "
          "| parts |")
    print("|---|---|---|---|---|---|---|---|---|")
    colds = {}
    _byte_compile()
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="graphc-compile-") as cache:
            cold = _run_child(name, cache, args)
            warm = _run_child(name, cache, args)
        colds[name] = cold
        if cold["from_cache"] or not warm["from_cache"] or cold["graphs"] != 1:
            print(f"| {name} | note: cold from cache {cold['from_cache']}, warm from cache "
                  f"{warm['from_cache']}, {cold['graphs']} graphs compiled |")
        stages = ", ".join(f"{k} {cold['stages'][k]:.2f}" for k in STAGES + ("warm-up",)
                           if k in cold["stages"])
        warm_stages = ", ".join(f"{k} {warm['stages'].get(k, 0.0):.3f}" for k in WARM_STAGES)
        rest = warm["first"][0 if args.clock == "wall" else 1] - sum(
            warm["stages"].get(k, 0.0) for k in WARM_STAGES)
        print(f"| {name} | {cold['first'][0]:.2f} s ({cold['first'][1]:.2f}) | "
              f"{warm['first'][0]:.2f} s ({warm['first'][1]:.2f}) | {cold['second']:.3f} s | "
              f"{stages} | {warm_stages}, other {rest:.3f} | "
              f"{cold['kernels']} ({cold['distinct']}) | "
              f"{cold['chars'] // 1000}k ({cold['deduped_chars'] // 1000}k) | "
              f"{cold['parts']} |")
    if "mlp3" in colds and "mlp30" in colds:
        def compile_s(r):
            return sum(r["stages"].get(k, 0.0) for k in ("trace", "passes", "backend"))
        ratio = compile_s(colds["mlp30"]) / compile_s(colds["mlp3"])
        print(f"\nMLP depth scaling: 30 layers compile (trace + passes + backend) in "
              f"{ratio:.1f}x the time of 3 (target <= 12x); first calls "
              f"{colds['mlp30']['first'][0] / colds['mlp3']['first'][0]:.1f}x")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
