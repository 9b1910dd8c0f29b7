"""`--contention`: a busy process on one core while the benchmarks run; and the thread table.

A user's machine is never idle. `busy_core()` starts one child process that spins in a loop,
pinned to the last core this process may use, and stops it on exit; the report's header says
so. Under it, a thread pool that waits on a thread the OS parked shows up at once (a 2-thread
SGEMM that takes 0.2 ms idle took 8-16 ms with one core busy before graphc's thread chooser,
graphc/backends/cpu/threads.py).

`python -m benchmarks.contention [--repeat N] [--only NAME ...]` gives the threads table of
docs/performance.md: every training-step case (or the `--only` ones) run four times by
`benchmarks.run`, each in a fresh process: one thread with CPU-clock samples
(`--threads 1 --clock cpu`), every core on the wall clock, every core with a busy core
(`--contention`), and one thread with a busy core on the wall clock (`--threads 1
--contention`); then one row per case with graphc's four figures, its contended figure over
its own 1-thread figure (the runtime-speed issue allows 1.2x), and its contended figure over
the fourth, the floor that the machine's other load sets for one thread: that last ratio is
what graphc's choice of threads adds (about 1.00x when it keeps one thread, as it should
with no core free). Then the load averages each run ended with.
`python -m benchmarks.contention_steps` measures the same in one process, and
`python -m benchmarks.contention_chooser` logs what each executable's chooser did in a run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

TRAINING_STEPS = ("mlp_b64", "mlp_b1", "lenet5_b64", "gpt_b16", "resnet18_b32", "lstm_b16",
                  "vae_b64", "dcgan_b32", "mobilenet_b32")
RUNS = (("1 thread, CPU clock", ["--threads", "1", "--clock", "cpu"]),
        ("2 threads, wall, idle", []),
        ("2 threads, wall, one core busy", ["--contention"]),
        ("1 thread, wall, one core busy", ["--threads", "1", "--contention"]))
ALLOWED = 1.2  # contended / own 1-thread figure


@contextlib.contextmanager
def busy_core():
    """Run a spinning process on one core for the duration of the block; yields its core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1]
    spinner = subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
    try:
        os.sched_setaffinity(spinner.pid, {core})
        yield core
    finally:
        spinner.kill()
        spinner.wait()


def _run(flags: list[str], only: list[str], repeat: int, folder: str, k: int) -> dict:
    path = os.path.join(folder, f"run{k}.json")
    command = [sys.executable, "-m", "benchmarks.run", "--repeat", str(repeat), "--json", path,
               *flags, *[a for name in only for a in ("--only", name)]]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(command, cwd=root, check=False, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def _graphc_ms(case: dict) -> float | None:
    found = [c["figure"] for c in case["contenders"] if c["name"] == case["graphc"]]
    return found[0] if found else None


def thread_table(runs: list[dict]) -> str:
    """The markdown table of graphc's figures in `runs` (the RUNS' JSON, in order; a run left
    out at the end shows as "-")."""
    lines = ["| training step | " + " | ".join(label for label, _ in RUNS)
             + " | contended / own 1-thread | contended / 1 thread contended |",
             "|---" * (len(RUNS) + 3) + "|"]
    by_name = [{case["name"]: case for case in run["cases"]} for run in runs]
    for name, case in by_name[0].items():
        figures = [_graphc_ms(r[name]) if name in r else None for r in by_name]
        figures += [None] * (len(RUNS) - len(figures))
        cells = ["-" if f is None else f"{f:.3f} ms" if f < 1 else f"{f:.2f} ms"
                 for f in figures]
        ratio = "-"
        if figures[0] and figures[2]:
            over = figures[2] / figures[0]
            ratio = f"{over:.2f}x" + (f" **over {ALLOWED}x**" if over > ALLOWED else "")
        floor = f"{figures[2] / figures[3]:.2f}x" if figures[2] and figures[3] else "-"
        lines.append(f"| {case['description']} | " + " | ".join(cells)
                     + f" | {ratio} | {floor} |")
    loads = [run["header"].split("load average at the end ")[1].split(";")[0] for run in runs]
    return "\n".join(lines) + "\n\nload average at the end of each run: " + "; ".join(
        f"{label}: {load}" for (label, _), load in zip(RUNS, loads))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="timed rounds per case")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="only these training steps (repeatable): " + ", ".join(
                            TRAINING_STEPS))
    args = parser.parse_args(argv)
    only = args.only or list(TRAINING_STEPS)
    with tempfile.TemporaryDirectory() as folder:
        runs = []
        for k, (label, flags) in enumerate(RUNS):
            print(f"running {label} ...", file=sys.stderr, flush=True)
            runs.append(_run(flags, only, args.repeat, folder, k))
    command = " ".join(["python -m benchmarks.contention", *(sys.argv[1:] if argv is None
                                                             else argv)])
    print(f"command: `{command}`")
    print(thread_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
