"""gpu_host: where a compiled cuda training step's wall time goes on the host, phase by phase.

`python -m benchmarks.gpu_host [--quick] [--steps N] [--only gpt_b16|resnet18_b32]` needs a
CUDA GPU and PyTorch with CUDA (as benchmarks.gpu). It runs benchmarks.gpu's training steps
(graphc's compiled step, the loss read every step) and stamps the wall clock at the phases of
each step, by wrapping the runtime's graph launch and stream synchronisation:

- `before launch`: from the call to the launch of the captured CUDA graph (the compiled
  callable's guards, the executable's input checks and uploads);
- `after launch`: from the launch to the call's return (output copies enqueued, residency
  marks, the compiled callable wrapping results in tensors and assigning `.grad`s): a call
  returns before its device work ends, so this is host work the device's run hides;
- `device wait`: the loss read's synchronisation (the device still running);
- `loss read`: the rest of the `.item()` (its copy and Python).

It prints the median of each phase over the steps and the device time of one replay of the
launch list, next to PyTorch's step with the same loss read. What the device does not hide
(before launch, and after launch beyond the device's own time) is what the step costs above
its replay.

`--emulated` needs no GPU: the same steps at the quick shapes (ResNet-18's has the full
model's 186 inputs and 63 outputs; GPT's one layer) on the emulation (GRAPHC_CUDA=emu), the
device work stubbed out (the launch list and the batched output copies do nothing, so the
loss read is not a value), the host's `before launch` and `after launch` timed the same way
(wall clock: medians, so a loaded machine's preemptions stay out).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import graphc
from benchmarks import model_steps, models
from benchmarks.gpu import _samples, _torch

PHASES = ("before launch", "after launch", "device wait", "loss read")


def phases(step, gx, gy, steps: int) -> dict[str, float]:
    """{phase: median seconds} over `steps` calls of the compiled `step` (see the module
    docstring), the runtime's launch and synchronisation wrapped while it runs."""
    rt = step.executable.rt
    launch, sync = rt.gc_graph_launch, rt.gc_stream_synchronize
    stamps: dict[str, float] = {}

    def stamped_launch(*args):
        stamps["launch"] = time.perf_counter()
        return launch(*args)

    def stamped_sync(*args):
        started = time.perf_counter()
        result = sync(*args)
        if "returned" in stamps and "sync" not in stamps:  # the loss read's first wait
            stamps["sync"], stamps["synced"] = started, time.perf_counter()
        return result

    rows = {name: [] for name in PHASES}
    rt.gc_graph_launch, rt.gc_stream_synchronize = stamped_launch, stamped_sync
    try:
        for _ in range(steps):
            stamps.clear()
            start = time.perf_counter()
            loss = step(gx, gy)
            stamps["returned"] = time.perf_counter()
            loss.item()
            read = time.perf_counter()
            if not {"launch", "sync", "synced"} <= stamps.keys():
                raise SystemExit("benchmarks.gpu_host: the step did not launch a captured "
                                 "graph and wait for it in the loss read (the emulation?)")
            rows["before launch"].append(stamps["launch"] - start)
            rows["after launch"].append(stamps["returned"] - stamps["launch"])
            rows["device wait"].append(stamps["synced"] - stamps["sync"])
            rows["loss read"].append(read - stamps["returned"] - rows["device wait"][-1])
    finally:
        rt.gc_graph_launch, rt.gc_stream_synchronize = launch, sync
    return {name: statistics.median(v) for name, v in rows.items()}


def report(torch, name: str, quick: bool, steps: int) -> str:
    """One row: the phases' medians, their sum, the whole step, a replay, PyTorch's step."""
    key = name.split("_")[0]
    shape = (model_steps.QUICK if quick else model_steps.FULL)[key]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, key, shape)
    tmodel = model_steps.build(torch, key, shape).cuda()
    x, y = model_steps.batch_of(key, shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    step = graphc.compile(models.graphc_step(model), backend="cuda")
    tstep = models.torch_step(tmodel)
    for _ in range(3):  # the first call, the capture, one replayed call
        step(gx, gy).item()
    median = phases(step, gx, gy, steps)
    replay = _samples(lambda n: step.executable.replay(n), 5)
    whole = _samples(lambda n: [step(gx, gy).item() for _ in range(n)], 5)
    torch_step = _samples(lambda n: [tstep(tx, ty).item() for _ in range(n)], 5)
    cells = " | ".join(f"{p} {median[p] * 1e3:.3f} ms" for p in PHASES)
    return (f"{name:13s}{cells} | sum {sum(median.values()) * 1e3:.3f} ms | step "
            f"{whole * 1e3:.3f} ms | replay {replay * 1e3:.3f} ms | torch step "
            f"{torch_step * 1e3:.3f} ms")


def emulated(name: str, steps: int) -> str:
    """One row of `--emulated` (see the module docstring): the host phases' medians."""
    key = name.split("_")[0]
    shape = model_steps.QUICK[key]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, key, shape)
    x, y = model_steps.batch_of(key, shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    step = graphc.compile(models.graphc_step(model), backend="cuda")
    for _ in range(3):  # the first call, the second (the emulation refuses the capture)
        step(gx, gy).item()
    exe, launched = step.executable, [0.0]

    def stub_launch_list() -> None:
        launched[0] = time.perf_counter()

    exe._execute = stub_launch_list
    exe.rt.gc_memcpy_d2d_batch = lambda *args: None
    before, after = [], []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step(gx, gy)
        returned = time.perf_counter()
        loss.item()
        before.append(launched[0] - start)
        after.append(returned - launched[0])
    return (f"{name:13s}(emulated, quick shape) before launch "
            f"{statistics.median(before) * 1e6:.1f} us | after launch "
            f"{statistics.median(after) * 1e6:.1f} us | {steps} steps | load average "
            f"{os.getloadavg()[0]:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", action="append", choices=("gpt_b16", "resnet18_b32"))
    parser.add_argument("--emulated", action="store_true",
                        help="the host phases on the emulation, device work stubbed (no GPU)")
    args = parser.parse_args(argv)
    if args.emulated:
        os.environ["GRAPHC_CUDA"] = "emu"
        for name in args.only or ("gpt_b16", "resnet18_b32"):
            print(emulated(name, max(args.steps, 200)), flush=True)
        return
    torch = _torch()
    for name in args.only or ("gpt_b16", "resnet18_b32"):
        print(report(torch, name, args.quick, args.steps), flush=True)


if __name__ == "__main__":
    main()
