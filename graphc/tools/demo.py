"""`graphc demo`: train a small CNN on scikit-learn's digits with one compiled training step.

What a run does, in order:
1. loads `sklearn.datasets.load_digits` (1797 8x8 images shipped inside scikit-learn, no
   download), scales the pixels to [0, 1] and splits them 80/20, stratified, by `--seed`
   (`--limit N` keeps N images first, for quick runs and tests);
2. builds `build_model()` (graphc.tools.demo_model) and Adam, both seeded by `--seed`;
3. compiles the whole training step (zero_grad, forward, loss, backward, Adam's update) with
   `graphc.compile(step, backend=...)` and trains `--epochs` epochs, one tqdm bar each;
4. prints train and test accuracy, the compile time, and the median step time of the compiled
   step against eager graphc and PyTorch eager (graphc.tools.demo_bench);
5. writes the output folder (graphc.tools.demo_outputs): the IR after each pass, an SVG of the
   optimized step, a PNG of its memory plan and `summary.txt`.

Invariants:
- Every call of the compiled step has the same shapes: each epoch reshuffles the training set
  and drops the partial last batch, so the step compiles once: the first step, which creates
  Adam's state, runs on the interpreter and traces the steady graph every later step replays
  (graphc.jit.compiler), and nothing traces again.
- The same options train the same model: the split, the initialisation and the shuffles all
  come from `--seed`; only the timings vary between runs.
- Whatever the user can fix (a bad option, a backend that cannot run here, a missing package)
  raises `DemoError`: one line, printed by `graphc demo`, with a non-zero exit code.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.errors import GraphcError
from graphc.tools.demo_bench import step_timings
from graphc.tools.demo_model import MODEL_TEXT, DemoError, build_model, make_step
from graphc.tools.demo_outputs import prepare_folder, write_artifacts, write_summary

BACKENDS = ("cpu", "interp", "cuda")
DEFAULT_EPOCHS = 30
DEFAULT_BATCH_SIZE = 32
DEFAULT_OUT = "graphc-out/demo"
LEARNING_RATE = 3e-3
TEST_FRACTION = 0.2
MIN_LIMIT = 50  # a stratified 80/20 split needs at least one test image per digit


@dataclass(frozen=True)
class DemoOptions:
    backend: str = "cpu"
    epochs: int = DEFAULT_EPOCHS
    batch_size: int = DEFAULT_BATCH_SIZE
    out: str = DEFAULT_OUT
    seed: int = 0
    limit: int | None = None  # use only this many images (None: all 1797)
    model: str = "cnn"  # "cnn" (the digits CNN) or "gpt" (graphc.tools.demo_gpt)
    steps: int = 200  # training steps of the gpt model


@dataclass
class Digits:
    """The split: images as f32[N,1,8,8] in [0, 1], labels as i64[N]."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


@dataclass
class Training:
    """What training produced and measured."""

    model: nn.Module
    step: graphc.jit.compiler.Compiled
    compile_seconds: float = 0.0  # wall time of the calls that traced and compiled
    cache_note: str = ""  # where the cpu backend's object code came from
    step_seconds: list[float] = field(default_factory=list)  # the calls that ran the executable
    test_accuracy_per_epoch: list[float] = field(default_factory=list)


# ---- command-line options -------------------------------------------------------------------
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected 0 <= seed < 2**32, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `graphc demo` (see DemoOptions)."""
    parser.add_argument("--backend", choices=BACKENDS, default="cpu",
                        help="where the compiled step runs (default: cpu)")
    parser.add_argument("--epochs", type=_positive_int, default=DEFAULT_EPOCHS,
                        help=f"passes over the training set (default: {DEFAULT_EPOCHS})")
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULT_BATCH_SIZE,
                        help=f"images per step (default: {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--seed", type=_seed, default=0,
                        help="seeds the split, the initialisation and the shuffles (default: 0)")
    parser.add_argument("--model", choices=("cnn", "gpt"), default="cnn",
                        help="cnn: the digits CNN (default); gpt: a character-level GPT on "
                             "Python's own source (graphc.tools.demo_gpt)")
    parser.add_argument("--steps", type=_positive_int, default=200,
                        help="training steps of --model gpt (default: 200)")
    parser.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                        help=f"use only N of the 1797 images (at least {MIN_LIMIT}), for a "
                             "quick run")


def options_from(args: argparse.Namespace) -> DemoOptions:
    return DemoOptions(backend=args.backend, epochs=args.epochs, batch_size=args.batch_size,
                       out=args.out, seed=args.seed, limit=args.limit, model=args.model,
                       steps=args.steps)


def require(module: str, package: str):
    """Import `module`, or raise DemoError saying which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise DemoError(f"graphc demo needs {package} ({err}): pip install {package}") from err


# ---- data and model -------------------------------------------------------------------------
def load_digits(seed: int, limit: int | None = None) -> Digits:
    """scikit-learn's digits, scaled to [0, 1], split 80/20 stratified by `seed`."""
    datasets = require("sklearn.datasets", "scikit-learn")
    model_selection = require("sklearn.model_selection", "scikit-learn")
    bunch = datasets.load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    labels = bunch.target.astype(np.int64)
    if limit is not None:
        if not MIN_LIMIT <= limit <= len(images):
            raise DemoError(f"--limit {limit}: expected {MIN_LIMIT} to {len(images)} images "
                            f"(the data set has {len(images)}; leave --limit out to use all)",
                            exit_code=2)
        keep = np.random.default_rng(seed).permutation(len(images))[:limit]
        images, labels = images[keep], labels[keep]
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        images, labels, test_size=TEST_FRACTION, random_state=seed, stratify=labels)
    return Digits(x_train, y_train, x_test, y_test)


def accuracy(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of `images` the model classifies right (eager, no grad)."""
    with graphc.no_grad():
        logits = model(graphc.tensor(images)).numpy()
    return float((logits.argmax(axis=1) == labels).mean())


def _probe(x):
    return (x * 2.0).relu()


def check_backend(backend: str) -> None:
    """Compile and run a tiny function on `backend`; DemoError with its message if it fails."""
    try:
        with graphc.no_grad():
            graphc.compile(_probe, backend=backend)(graphc.ones(4))
    except GraphcError as err:
        raise DemoError(f"--backend {backend}: {err}") from err
    except ImportError as err:
        raise DemoError(f"--backend {backend} is not available in this installation ({err}); "
                        "use --backend cpu") from err


def backend_label(backend: str) -> str:
    """The backend's name, saying so when cuda runs on the CPU emulation (GRAPHC_CUDA=emu)."""
    if backend != "cuda":
        return backend
    try:
        from graphc.backends.cuda.rt import requested_kind

        emulated = requested_kind() == "emu"
    except (ImportError, GraphcError):
        return backend
    return "cuda, emulated on the CPU" if emulated else backend


# ---- training -------------------------------------------------------------------------------
def batches(rng: np.random.Generator, n: int, batch_size: int) -> list[np.ndarray]:
    """Indices of the full batches of one shuffled epoch (the partial last batch is dropped)."""
    order = rng.permutation(n)
    return [order[i:i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]


def train(options: DemoOptions, data: Digits) -> Training:
    """Train with the compiled step, one tqdm bar per epoch (on stderr)."""
    tqdm = require("tqdm", "tqdm").tqdm
    graphc.manual_seed(options.seed)
    model = build_model()
    optimizer = optim.Adam(model.parameters(), lr=LEARNING_RATE)
    compiled = graphc.compile(make_step(model, optimizer), backend=options.backend)
    result = Training(model, compiled)
    rng = np.random.default_rng(options.seed)
    width = len(str(options.epochs))
    cache_before = _object_cache_counts(options.backend)
    for epoch in range(1, options.epochs + 1):
        epoch_batches = batches(rng, len(data.x_train), options.batch_size)
        losses = []
        with tqdm(total=len(epoch_batches), desc=f"epoch {epoch:>{width}}/{options.epochs}",
                  unit="step", file=sys.stderr, leave=True) as bar:
            for index in epoch_batches:
                images = graphc.tensor(data.x_train[index])
                labels = graphc.tensor(data.y_train[index])
                traces = len(compiled.graphs)
                if traces < 1:  # the first step traces and compiles (module docstring)
                    bar.set_postfix_str("tracing and compiling the step", refresh=True)
                start = time.perf_counter()
                try:
                    loss = compiled(images, labels)
                except GraphcError as err:
                    raise DemoError(f"--backend {options.backend}: the training step failed: "
                                    f"{err}") from err
                seconds = time.perf_counter() - start
                if len(compiled.graphs) > traces:
                    result.compile_seconds += seconds
                else:
                    result.step_seconds.append(seconds)
                losses.append(loss.item())
                bar.update()
            test = accuracy(model, data.x_test, data.y_test)
            result.test_accuracy_per_epoch.append(test)
            bar.set_postfix_str(f"loss {statistics.fmean(losses):.3f}, test {test:.1%}")
    result.cache_note = _cache_note(cache_before, _object_cache_counts(options.backend))
    return result


def _object_cache_counts(backend: str) -> tuple[int, int] | None:
    """(hits, misses) of the cpu backend's on-disk object cache so far; None for others."""
    if backend != "cpu":
        return None
    from graphc.backends.cpu.llvm import cache_info

    info = cache_info()
    return info["hits"], info["misses"]


def _cache_note(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    if before is None or after is None:
        return ""
    hits, misses = after[0] - before[0], after[1] - before[1]
    if hits and not misses:
        return "its object code came from the disk cache (`graphc cache clear` for a cold start)"
    if hits:
        return f"{hits} of its {hits + misses} object files came from the disk cache"
    return "LLVM compiled its object code (cached on disk for the next run)"


# ---- the run --------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def summary_lines(options: DemoOptions, data: Digits, result: Training,
                  timings: dict[str, float | str]) -> list[str]:
    """The report a run prints (and writes to summary.txt), one fact per line."""
    compiled = result.step
    train_acc = accuracy(result.model, data.x_train, data.y_train)
    test_acc = result.test_accuracy_per_epoch[-1]
    traces = len(compiled.graphs)
    why = " (the first step, which creates Adam's state, ran on the interpreter)" \
        if traces == 1 else ""
    compiled_time = statistics.median(result.step_seconds) if result.step_seconds else None
    lines = [f"accuracy        train {train_acc:.1%}   test {test_acc:.1%} "
             f"({len(data.y_test)} held-out images)",
             f"compile time    {result.compile_seconds:.2f} s for {traces} graph"
             f"{'s' * (traces != 1)}{why}"]
    if result.cache_note:
        lines.append(f"                {result.cache_note}")
    optimized = compiled.optimized_graph
    plan = optimized.meta.get("memory_plan")
    arena = f"; arena {plan.arena_bytes / 1024:.1f} KiB" if plan is not None else ""
    lines.append(f"graph           {len(compiled.graph.nodes)} traced ops -> "
                 f"{len(optimized.nodes)} nodes after simplify and fuse{arena}")
    if compiled_time is None:
        lines.append("step time       no step ran the compiled executable: use more epochs "
                     "or a smaller --batch-size to time it")
        return lines
    lines.append(f"step time       median, batch of {options.batch_size}: zero_grad, "
                 "forward, loss, backward, Adam")
    label = f"graphc compiled ({options.backend})"
    lines.append(f"  {label:<26} {_ms(compiled_time):>9}")
    for label, value in timings.items():
        if isinstance(value, str):
            lines.append(f"  {label:<26} {value}")
            continue
        ratio = value / compiled_time
        relative = f"{ratio:.1f}x slower" if ratio >= 1 else f"{1 / ratio:.1f}x faster"
        lines.append(f"  {label:<26} {_ms(value):>9}   {relative} than compiled")
    return lines


def run(options: DemoOptions, out: TextIO | None = None) -> int:
    """Run the demo (see the module docstring); returns 0, raises DemoError."""

    if options.model == "gpt":
        from graphc.tools import demo_gpt

        return demo_gpt.run(options, out)
    out = out or sys.stdout
    started = time.perf_counter()
    data = load_digits(options.seed, options.limit)
    if options.batch_size > len(data.x_train):
        raise DemoError(f"--batch-size {options.batch_size}: larger than the "
                        f"{len(data.x_train)} training images; use at most "
                        f"{len(data.x_train)}", exit_code=2)
    folder = prepare_folder(options.out)
    check_backend(options.backend)
    header = [f"graphc demo: a small CNN on scikit-learn's digits, the whole training step "
              f"compiled (backend {backend_label(options.backend)})",
              f"  model  {MODEL_TEXT}",
              f"  data   {len(data.y_train)} training / {len(data.y_test)} test images (8x8); "
              f"Adam lr {LEARNING_RATE}, batch {options.batch_size}, {options.epochs} "
              f"epoch{'s' * (options.epochs != 1)}, seed {options.seed}"]
    print("\n".join(header), file=out, flush=True)
    result = train(options, data)
    timings = step_timings(result.model, data, options.batch_size, LEARNING_RATE) \
        if result.step_seconds else {}
    lines = summary_lines(options, data, result, timings)
    written = write_artifacts(folder, result.step)
    lines.append(f"total time      {time.perf_counter() - started:.1f} s")
    lines.append(f"wrote           {folder}/")
    lines += [f"  {name:<13} {what}" for name, what in written.items()]
    write_summary(folder, header + lines, result.step)
    print("\n".join(lines), file=out)
    return 0
