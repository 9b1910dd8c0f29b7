"""GPT's and ResNet-18's training steps at one thread and at two, kernel by kernel, in one
process: which kernels do not scale, and what the whole step gains.

    python -m benchmarks.step_threads --model gpt                 # kernels, then the step
    python -m benchmarks.step_threads --model resnet18 --runs 10 --rounds 4
    python -m benchmarks.step_threads --model gpt --realtime      # each round under SCHED_FIFO
    python -m benchmarks.step_threads --model gpt --only step     # the whole step only
    python -m benchmarks.step_threads --model gpt --quick         # smoke sizes (tests)

The steps are benchmarks/model_steps.py's (GPT n_embd 128, 4 layers, context 64, batch 16;
ResNet-18 CIFAR, width 64, batch 32; `--quick`: model_steps.QUICK's smoke sizes), compiled
on the cpu backend.

`kernels`: a profiling build of the step (the driver stamps the clock around every kernel,
as graphc.profile's) run on copies of the arrays the real call binds, `--runs` times back to
back per round, the rounds alternating one thread and two (`ThreadChooser(fixed=n)`), two
untimed runs first in each round. Back to back, not as graphc.profile runs them: it copies
the arrays before every run, long enough for libgomp's team to fall asleep, so its first
forked kernel would carry a wake-up that a loop of steps does not pay. Per kernel: the
median (or `--quantile q` of its runs: 0.1 leaves out the runs another task interrupted) at
one thread and at two, the speed-up, and the time lost to perfect scaling (two
threads' time minus half of one's), with how the kernel runs on two threads:
- `omp`: a generated kernel that forks its outer loop (kernels.py: elementwise over
  PARALLEL_MIN_ELEMENTS, loops of generated GEMMs over `gemm_work`);
- `split`: a convolution or pooling kernel split over units (conv_threads.py);
- `forked`: calls a function that forks (a Winograd kernel's block GEMMs,
  winograd_gemm.function(forked=True));
- `blas`: calls the BLAS, which splits by its own thresholds (threads.py's callback);
- `serial`: none of these.
Kernels are listed by the time lost, then summed by class (`kernel_class`: a convolution's
pass, geometry and channels, with its filter and transform kernels; a markdown table), then
by op and how they run.

`step`: the compiled step itself, blocks of `--calls` calls alternating one thread and two
forced, wall clock (median over blocks of each block's median), and CPU time per call.
`--ab [SWITCH]`: the step compiled twice, each in its own GRAPHC_CACHE_DIR, "before" with
SWITCH off while compiling (`SWITCHES`; `forks`, the default: the tenth session's forks,
`kernels.forks` False: a Winograd kernel not split over its images keeps its filter
transform and 16 block GEMMs serial, reductions stay serial; `column_parts`: column sums
serial, not cut into forked parts; `polyphase_grad`: the stride-2 weight gradients on
im2col; `channel_forks`: a one-block Winograd kernel's input and output transforms inside
it, on the calling thread; `wide_grad_forks`: the same for conv_winograd_wide_grad's Vt and
Y; `polyphase_forks`: for conv_polyphase's; `more_channel_forks`: these two;
`polyphase_grad_forks`: conv_polyphase_grad's x and gy transforms) and "after" as
it is; the blocks rotate over both variants and both counts (the kernels part profiles
"after"; `--only kernels --ab` both, "before" first).

Two threads wait for a core the OS gives to other work: read the load averages printed at
the start and the end (docs/performance.md, "Threads: one owner of the cores"). `--realtime`
(root) runs each timed run or call under SCHED_FIFO (benchmarks.mlp_threads.realtime) as if
the machine were idle: one untimed run and the timed one in a stretch, then a pause as long
(`fifo_stretch`: Linux parks SCHED_FIFO tasks that ran 0.95 s of a second). `--json PATH`
also writes every run's kernel times to PATH.npz (`us_1`, `us_2`: runs x kernels).

FIFO keeps the other tasks of this machine off the cores, not what shares the host with it:
on the Zen 5 host (fourteenth session) the same build's kernel sums read 284 / 143 ms at one
/ two threads (1.98x) with the other helpers just starting, 265-290 / 149-161 ms (1.72-
1.80x) half an hour later, with no change of code; the kernels that lose are the ones that
stream memory (the 512-channel filter transforms, the weight updates, batch norm), and the
rest lose ~10% alike. Compare variants alternated in one process (`--ab`), never runs made
at different times.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import time
from collections import defaultdict

import numpy as np

from benchmarks.harness import cache_root, compiled_variants, switched
from benchmarks.mlp_threads import bound_arrays, load, realtime, two_thread_setup


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt", "resnet18"), required=True)
    parser.add_argument("--only", choices=("kernels", "step"), help="one part (default both)")
    parser.add_argument("--runs", type=int, default=20, help="profiled runs a round (20)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds, alternating one thread and two (4)")
    parser.add_argument("--calls", type=int, default=10, help="step: timed calls a block (10)")
    parser.add_argument("--blocks", type=int, default=8, help="step: blocks (8)")
    parser.add_argument("--top", type=int, default=30, help="kernels listed (30)")
    parser.add_argument("--realtime", action="store_true",
                        help="SCHED_FIFO while timing each round or block (root)")
    parser.add_argument("--quantile", type=float, default=0.5,
                        help="kernels: the quantile of each kernel's runs (0.5: the median; "
                        "0.2: the runs no other task interrupted)")
    parser.add_argument("--json", help="kernels: write every kernel's row to this file")
    parser.add_argument("--quick", action="store_true", help="smoke sizes (model_steps.QUICK)")
    parser.add_argument("--ab", nargs="?", const="forks", choices=sorted(SWITCHES),
                        help="step: also the variant with SWITCH off (default forks: the "
                        "unsplit Winograd kernels' and reductions' forks)")
    args = parser.parse_args(argv)
    if not 0 <= args.quantile <= 1:
        parser.error(f"--quantile must be in [0, 1], got {args.quantile}")
    most = two_thread_setup(parser, "step_threads", f"{args.model}: ", args.realtime,
                            runs=args.runs, rounds=args.rounds, calls=args.calls,
                            blocks=args.blocks)
    with cache_root("step_threads.") as root:
        names = VARIANTS if args.ab else VARIANTS[1:]
        switch = args.ab or "forks"
        steps, arguments = compiled_variants(names, lambda name: variant(name, root, switch),
                                             lambda: training_step(args.model, args.quick))
        if args.only in (None, "kernels"):
            for name in ("before", "after") if args.ab and args.only == "kernels" else \
                    ("after",):
                print(f"{name}:", flush=True)
                with variant(name, root, switch):  # its profiling build: the same switches
                    kernel_table(steps[name], arguments[name], most, args.runs, args.rounds,
                                 args.top, args.realtime,
                                 args.json if name == "after" else None,
                                 args.quantile)
                print(f"{load()}", flush=True)
        if args.only in (None, "step"):
            step_table(steps, arguments, most, args.blocks, args.calls, args.realtime)
    print(f"at the end: {load()}")


VARIANTS = ("before", "after")


def never_forks(openmp: bool, work: int) -> bool:
    return False


def _forks_off() -> dict:
    from graphc.backends.cpu import kernels

    return {(kernels, "forks"): never_forks}


def _column_parts_off() -> dict:
    from graphc.backends.cpu import column_parts

    return {(column_parts, "SPLIT"): False}


def _polyphase_grad_off() -> dict:
    from graphc.backends.cpu import conv_polyphase_grad

    return {(conv_polyphase_grad, "ENABLED"): False}


def _channel_forks_off() -> dict:
    from graphc.backends.cpu import conv_winograd

    return {(conv_winograd, "FORKED_TRANSFORMS"): False}


def _wide_grad_forks_off() -> dict:
    from graphc.backends.cpu import conv_winograd_wide_grad

    return {(conv_winograd_wide_grad, "FORKED_TRANSFORMS"): False}


def _polyphase_forks_off() -> dict:
    from graphc.backends.cpu import conv_polyphase

    return {(conv_polyphase, "FORKED_TRANSFORMS"): False}


def _polyphase_grad_forks_off() -> dict:
    from graphc.backends.cpu import conv_polyphase_grad

    return {(conv_polyphase_grad, "FORKED_TRANSFORMS"): False}


def _more_channel_forks_off() -> dict:
    return _wide_grad_forks_off() | _polyphase_forks_off()


# --ab SWITCH: what "before" turns off while compiling ({(module, attribute): value})
SWITCHES = {
    # the tenth session's forks: a Winograd kernel not split over images keeps its filter
    # transform and GEMMs serial, and reductions stay serial
    "forks": _forks_off,
    # the eleventh's column sums cut into forked parts (graphc.backends.cpu.column_parts)
    "column_parts": _column_parts_off,
    # the twelfth's stride-2 weight gradients by polyphase Winograd (conv_polyphase_grad)
    "polyphase_grad": _polyphase_grad_off,
    # the twelfth's one-block Winograd kernels' transforms forked over channels
    "channel_forks": _channel_forks_off,
    # the wide (512 x 512) Winograd weight gradient's transforms forked over channels
    "wide_grad_forks": _wide_grad_forks_off,
    # the one-block stride-2 polyphase kernel's (256 -> 512 forward) transforms forked
    "polyphase_forks": _polyphase_forks_off,
    # both of these
    "more_channel_forks": _more_channel_forks_off,
    # the one-block stride-2 weight gradient's (256 -> 512) x and gy transforms forked
    "polyphase_grad_forks": _polyphase_grad_forks_off,
}


@contextlib.contextmanager
def variant(name: str, root: str, switch: str = "forks"):
    """While compiling variant `name`: its cache dir; "before": SWITCHES[switch] off."""
    with switched(root, name, SWITCHES[switch](), name == "before"):
        yield


def training_step(name: str, quick: bool = False):
    """(the training step of model_steps' `name` at its full size, or its smoke size, its
    arguments)."""
    import graphc
    from benchmarks import model_steps, models

    shape = (model_steps.QUICK if quick else model_steps.FULL)[name]
    model = model_steps.build(graphc, name, shape)
    x, y = model_steps.batch_of(name, shape)
    return models.graphc_step(model), (graphc.tensor(x), graphc.tensor(y))


def how_it_runs(kernel: str, ir_text: str) -> str:
    """`split`, `omp`, `forked`, `blas` or `serial` (the module docstring) for the driver's
    kernel."""
    if kernel.endswith(".split"):
        return "split"
    if f'@"{kernel}.omp"' in ir_text or f"@{kernel}.omp(" in ir_text:
        return "omp"
    body = re.search(r"define [^\n]*@\"?" + re.escape(kernel) + r"\"?\((.*?)\n}\n", ir_text,
                     re.S)
    if body and re.search(r"call [^\n]*\.forked\"?\(", body.group(1)):
        return "forked"
    if body and re.search(r"call [^\n]*@\"?cblas_", body.group(1)):
        return "blas"
    return "serial"


def kernel_table(step, arguments, most: int, runs: int, rounds: int, top: int,
                 fifo: bool, path: str | None = None, quantile: float = 0.5) -> None:
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.tools.profile import kernel_label

    timed = CpuExecutable(step.executable.graph, {"profile": True})
    arrays = bound_arrays(step, arguments)
    stamps: dict[int, list] = {1: [], most: []}
    for round_ in range(rounds):
        count = 1 if round_ % 2 == 0 else most
        timed.thread_chooser = threads.ThreadChooser(most, fixed=count)
        if not fifo:
            for _ in range(2):
                timed.run(*arrays)
        for _ in range(runs):
            with fifo_stretch(fifo):
                if fifo:  # wake or park the team inside the same SCHED_FIFO stretch
                    timed.run(*arrays)
                timed.run(*arrays)
            stamps[count].append(np.diff(timed.last_stamps) / 1e3)
    one, two = (np.quantile(np.array(stamps[c]), quantile, axis=0) for c in (1, most))
    lowered = timed.lowered
    rows = []
    for k, node in enumerate(lowered.kernel_nodes):
        label = kernel_label(node) if node is not None else "output copy"
        shape = "" if node is None else ", ".join(str(v.type) for v in node.outputs)
        rows.append((two[k] - one[k] / 2, one[k], two[k], label, shape,
                     how_it_runs(lowered.kernels[k], lowered.ir_text), k))
    if path is not None:
        np.savez(path + ".npz", **{f"us_{c}": np.array(stamps[c]) for c in (1, most)},
                 kernels=np.array(timed.lowered.kernels))
        with open(path, "w") as f:
            json.dump([{"step": k, "one_us": t1, "all_us": t2, "op": label, "shape": shape,
                        "runs_as": how, "kernel": lowered.kernels[k]}
                       for _, t1, t2, label, shape, how, k in rows], f, indent=1)
    total1, total2 = one.sum(), two.sum()
    print(f"native call (sum of kernels): {total1 / 1e3:.2f} ms at 1 thread, "
          f"{total2 / 1e3:.2f} ms at {most} ({total1 / total2:.2f}x); quantile {quantile} of "
          f"{runs * ((rounds + 1) // 2)} / {runs * (rounds // 2)} runs; lost to perfect "
          f"scaling {(total2 - total1 / most) / 1e3:.2f} ms")
    print(f"  the {top} kernels losing most: step, us at 1 / {most} threads, speed-up, lost")
    for lost, t1, t2, label, shape, how, k in sorted(rows, reverse=True)[:top]:
        print(f"  {k:4d} {t1:8.1f} {t2:8.1f} {t1 / t2:5.2f}x {lost:7.1f}  {how:<6} "
              f"{label[:34]:<34} {shape[:40]}")
    print(class_table(rows, lowered.kernel_nodes, most))
    groups: dict = defaultdict(lambda: [0.0, 0.0, 0])
    for _, t1, t2, label, _, how, _ in rows:
        group = groups[(label.split("(")[0] if label.startswith("fused") else label, how)]
        group[0] += t1
        group[1] += t2
        group[2] += 1
    print(f"  by op and how it runs: kernels, ms at 1 / {most}, speed-up, lost ms")
    ordered = sorted(groups.items(), key=lambda kv: kv[1][1] - kv[1][0] / 2, reverse=True)
    for (label, how), (t1, t2, n) in ordered[:top]:
        print(f"  {label[:28]:<28} {how:<6} {n:4d} {t1 / 1e3:8.2f} {t2 / 1e3:8.2f} "
              f"{t1 / max(t2, 1e-9):5.2f}x {(t2 - t1 / 2) / 1e3:7.2f}")


# Linux lets SCHED_FIFO tasks run 0.95 s of every second (sched_rt_runtime_us) and then
# parks them for the rest of it: a stretch under `realtime` is one untimed and one timed run
# (at most ~0.6 s of a ResNet-18 step at one thread), and a pause as long as the stretch
# follows, which gives the budget back. A round of `--runs` steps under one stretch ran past
# the budget (five ResNet-18 steps at one thread: 1.4 s), and Linux would park it mid-kernel.
@contextlib.contextmanager
def fifo_stretch(fifo: bool):
    """`realtime(fifo)` for one stretch, then (fifo) a pause as long as the stretch."""
    start = time.perf_counter()
    with realtime(fifo):
        yield
    if fifo:
        time.sleep(time.perf_counter() - start)


def kernel_class(node) -> str:
    """The class of the node a kernel runs: a convolution's pass, geometry and channels
    ("conv2d_weight_grad 3x3 s1 512x512"; conv2d_channel_sums is conv2d's forward, summing
    its output for the batch norm), a batch norm's op and channels, else the op (fused:
    "fused")."""
    if node is None:
        return "output copy"
    op = "conv2d" if node.op == "conv2d_channel_sums" else node.op
    if op in ("conv2d", "conv2d_input_grad", "conv2d_weight_grad"):
        w = node.outputs[0].type.shape if op == "conv2d_weight_grad" else \
            node.inputs[1].type.shape
        stride = tuple(node.attrs.get("stride", (1, 1)))
        return f"{op} {w[2]}x{w[3]} s{stride[0]} {w[0]}x{w[1]}"
    if op.startswith("batch_norm"):
        return f"{op} {node.inputs[0].type.shape[1]} ch"
    return op


def class_table(rows: list, nodes: list, most: int) -> str:
    """A markdown table of the kernels by class (`kernel_class`: every kernel of a node, its
    filter or transform kernels too), the most time lost to perfect scaling first."""
    classes: dict = defaultdict(lambda: [0, 0.0, 0.0])
    for _, t1, t2, _, _, _, k in rows:
        entry = classes[kernel_class(nodes[k])]
        entry[0] += 1
        entry[1] += t1
        entry[2] += t2
    lines = [f"| kernel class | kernels | ms at 1 / {most} threads | speed-up | lost ms |",
             "|---|---|---|---|---|"]
    for name, (n, t1, t2) in sorted(classes.items(), key=lambda kv: kv[1][1] / most
                                    - kv[1][2]):
        lines.append(f"| {name} | {n} | {t1 / 1e3:.2f} / {t2 / 1e3:.2f} | "
                     f"{t1 / max(t2, 1e-9):.2f}x | {(t2 - t1 / most) / 1e3:.2f} |")
    return "\n".join(lines)


def step_table(steps: dict, arguments: dict, most: int, blocks: int, calls: int,
               fifo: bool) -> None:
    from graphc.backends.cpu import threads

    order = [(name, count) for count in (1, most) for name in steps]
    results = {key: {"median": [], "cpu": []} for key in order}
    for block in range(blocks):
        shift = block % len(order)
        for name, count in order[shift:] + order[:shift]:
            step, args = steps[name], arguments[name]
            step.executable.thread_chooser = threads.ThreadChooser(most, fixed=count)
            if not fifo:
                step(*args)  # wake or park the team; not timed
            seconds, cpu = [], 0.0
            for _ in range(calls):
                with fifo_stretch(fifo):
                    if fifo:  # wake or park the team inside the same SCHED_FIFO stretch
                        step(*args)
                    start, used = time.perf_counter(), time.process_time()
                    step(*args)
                    seconds.append(time.perf_counter() - start)
                    cpu += time.process_time() - used
            results[(name, count)]["median"].append(float(np.median(seconds)))
            results[(name, count)]["cpu"].append(cpu / calls)
    for (name, count), r in results.items():
        median = np.median(r["median"])
        one = np.median(results[(name, 1)]["median"])
        print(f"{name}: step on {count} thread(s): median {median * 1e3:.2f} ms "
              f"({one / median:.2f}x its one thread's), CPU {np.median(r['cpu']) * 1e3:.2f} "
              f"ms a call", flush=True)


if __name__ == "__main__":
    main()
