"""One command for graphc's performance table: graphc next to numpy, PyTorch eager and
torch.compile in one process, medians and ratios against the issue's targets.

    python -m benchmarks.run                        # the full run (~10 minutes on 2 cores)
    python benchmarks/run.py --quick                # tiny sizes, no torch.compile: a smoke run
    python -m benchmarks.run --only mlp_b64 --only sgemm --repeat 15
    python -m benchmarks.run --markdown docs/table.md --json results.json --profile
    python -m benchmarks.run --threads 1 --clock cpu   # one thread each, CPU time
    python -m benchmarks.run --contention              # with a busy process on one core

Cases (names for --only; a name selects every case that starts with it): mlp_b64, mlp_b1,
lenet5_b64, gpt_b16, resnet18_b32 (benchmarks/model_steps.py), lstm_b16, vae_b64, dcgan_b32,
mobilenet_b32 (benchmarks/family_steps.py), elementwise_chain, sgemm
(sgemm_256, sgemm_1024, sgemm_2048), conv2d, compile (compile_cold, compile_warm). How each is
measured: benchmarks/cases.py, benchmarks/compile_time.py; timing and agreement rules:
benchmarks/harness.py. With --profile, every case that missed its target gets a profile
(benchmarks/profiles.py) after the table. `--threads N` sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS (graphc's OpenMP loops, numpy's and graphc's OpenBLAS) and PyTorch's
intra-op threads to N, restarting the process so the libraries read them at load; on a machine
shared with other work, one thread each keeps spin-waiting thread pools from distorting the
ratios. `--contention` runs a busy process pinned to one core while measuring
(benchmarks/contention.py), as on a machine that is not idle; `python -m benchmarks.contention`
runs the training steps at 1 thread, 2 threads and 2 threads contended and prints graphc's
three figures side by side. The exit status is 0 when every
contender agreed with its case's reference (or was skipped for a stated reason), 1 otherwise; a
missed target is not an error. Before any case runs, glibc is told to keep freed blocks of up
to 32 MiB (`harness.keep_freed_memory`, for every contender alike; the report's header says so).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys

if __package__ in (None, ""):  # `python benchmarks/run.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import cases  # noqa: E402
from benchmarks.compile_time import compile_time_cases  # noqa: E402
from benchmarks.contention import busy_core  # noqa: E402
from benchmarks.family_steps import family_step  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    as_json,
    keep_freed_memory,
    markdown_table,
    run_with_threads,
    set_clock,
)
from benchmarks.model_steps import model_step  # noqa: E402

CASE_NAMES = ("mlp_b64", "mlp_b1", "lenet5_b64", "gpt_b16", "resnet18_b32", "lstm_b16",
              "vae_b64", "dcgan_b32", "mobilenet_b32", "elementwise_chain", "sgemm_256",
              "sgemm_1024", "sgemm_2048", "conv2d", "compile_cold", "compile_warm")


def _selected(only: list[str] | None) -> list[str]:
    if not only:
        return list(CASE_NAMES)
    chosen = [n for n in CASE_NAMES if any(n.startswith(o) for o in only)]
    unknown = [o for o in only if not any(n.startswith(o) for n in CASE_NAMES)]
    if unknown:
        raise SystemExit(f"benchmarks/run.py: --only {unknown[0]!r} matches no case; the cases "
                         f"are {', '.join(CASE_NAMES)}")
    return chosen


def run_cases(names: list[str], sizes: cases.Sizes, repeat: int, log,
              clock: str = "wall") -> list:
    """Run the named cases in table order; `log` gets one progress line per case."""
    results = []
    quick_sgemm = dict(zip(("sgemm_256", "sgemm_1024", "sgemm_2048"), sizes.sgemm))
    for name in names:
        log(f"running {name} ...")
        if name in ("mlp_b64", "mlp_b1"):
            batch = sizes.mlp_batch if name == "mlp_b64" else 1
            results.append(cases.train_step("mlp", batch, sizes, repeat))
        elif name == "lenet5_b64":
            results.append(cases.train_step("lenet5", sizes.lenet_batch, sizes, repeat))
        elif name in ("gpt_b16", "resnet18_b32"):
            results.append(model_step(name.split("_")[0], not sizes.torch_compile, repeat,
                                      sizes.torch_compile, sizes.warmup_seconds))
        elif name in ("lstm_b16", "vae_b64", "dcgan_b32", "mobilenet_b32"):
            results.append(family_step(name.split("_")[0], not sizes.torch_compile, repeat,
                                       sizes.torch_compile, sizes.warmup_seconds))
        elif name == "elementwise_chain":
            results.append(cases.elementwise_chain(sizes, repeat))
        elif name.startswith("sgemm"):
            if name in quick_sgemm:
                results.append(cases.sgemm(quick_sgemm[name], sizes, repeat))
        elif name == "conv2d":
            results.append(cases.conv2d(sizes, repeat))
        elif name == "compile_cold":
            results += compile_time_cases(sizes.compile_lenet_batch, sizes.compile_runs, clock)
        elif name == "compile_warm" and "compile_cold" not in names:
            results += [r for r in compile_time_cases(sizes.compile_lenet_batch,
                                                      sizes.compile_runs, clock)
                        if r.name == "compile_warm"]
    return results


def header(argv: list[str], clock: str, contention: int | None = None,
           malloc: str | None = None) -> str:
    """The command, the machine and the date, for the top of a report."""
    import numpy as np

    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    threads = os.environ.get("OMP_NUM_THREADS", f"default ({os.cpu_count()})")
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"command: `python -m benchmarks.run {' '.join(argv)}`".rstrip() + "\n"
            f"date: {datetime.datetime.now().isoformat(timespec='seconds')}; machine: {cpu}, "
            f"{os.cpu_count()} cores, {platform.system()} {platform.release()}; Python "
            f"{platform.python_version()}, numpy {np.__version__}, torch {torch_version}; "
            f"threads: {threads}; clock: {clock}; load average at the end {load[0]:.2f} "
            f"{load[1]:.2f} {load[2]:.2f}"
            + ("" if contention is None else
               f"; contention: a busy process pinned to core {contention}")
            + ("" if malloc is None else f"; {malloc}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, few repetitions, no torch.compile (a smoke run)")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only the cases whose name starts with NAME (repeatable): "
                        + ", ".join(CASE_NAMES))
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed rounds per case (default 25, 3 with --quick)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the report to PATH")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="threads for OpenMP, OpenBLAS and PyTorch (default: every core)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time samples by wall clock, or by this process's CPU time "
                        "(steadier on a shared machine; use with --threads 1)")
    parser.add_argument("--contention", action="store_true",
                        help="run a busy process on one core while measuring")
    parser.add_argument("--profile", action="store_true",
                        help="profile every case that missed its target (after the table)")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    run_with_threads("benchmarks.run", args.threads, argv)
    names = _selected(args.only)
    sizes = cases.Sizes.quick() if args.quick else cases.Sizes()
    repeat = args.repeat or (3 if args.quick else 25)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    set_clock(args.clock)
    malloc = keep_freed_memory()  # the same for every contender (harness.keep_freed_memory)
    with contextlib.ExitStack() as stack:
        busy = stack.enter_context(busy_core()) if args.contention else None
        results = run_cases(names, sizes, repeat, log, args.clock)
        top = header(argv, args.clock, busy, malloc)
    report = top + "\n\n" + markdown_table(results) + "\n"
    print(report, flush=True)  # the table first: profiling takes minutes
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": top, "cases": as_json(results)}, f, indent=1)
    if args.profile:
        from benchmarks.profiles import profile_missed

        profiles = profile_missed(results, sizes, log)
        print(profiles)
        report += "\n" + profiles
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    return 0 if all(r.agreed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
