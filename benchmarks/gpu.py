"""gpu: issue 14's GPU targets, graphc's cuda backend next to PyTorch CUDA on one GPU.

`python -m benchmarks.gpu [--quick] [--only NAME] [--profile] [--json PATH]` needs a CUDA
GPU, nvcc and PyTorch built with CUDA (benchmarks/gpu_check.sh runs it on the device machine,
with cuBLAS and cuDNN where they measure faster, and with GRAPHC_CUDA_LIBS=0, graphc's own
kernels only). `--profile` adds, per training step, where the device time goes by kind of
step and slowest step (`CudaExecutable.step_times`) and the host's cProfile of ten steps.

Rows (each: graphc, its anchor, the ratio, the target):
- `copy`: PyTorch's device-to-device copy of 1 GiB, bytes read plus written: the bandwidth
  ceiling the elementwise row is measured against.
- `sgemm_4096`: a compiled 4096^3 float32 matmul against `torch.mm` with TF32 off (cuBLAS
  fp32); target >= 0.8x cuBLAS's FLOP/s. The row names the provider that ran graphc's GEMM.
- `conv`: conv2d forward N=32, 64->64, 3x3, pad 1, 56x56 against PyTorch (cuDNN, TF32 off,
  cudnn.benchmark on); target >= 0.5x cuDNN's FLOP/s.
- `elementwise`: benchmarks.run's chain tanh(x*0.5+1)*sigmoid(x)+relu(x-0.1) on 64M floats:
  graphc's bytes (read once, written once) per second over the copy's; target >= 0.8x.
- `gpt_b16`, `resnet18_b32`: benchmarks.model_steps' training steps compiled for the cuda
  backend against the same model in PyTorch CUDA eager from the same weights; target <= 1.0x
  time per step. Every step of both ends synchronised (each reads its loss on the host), as a
  training loop that logs its loss does; the row also gives PyTorch's step without the read
  (`torch without the loss read`: its host then runs ahead of its device, which graphc's
  call, waiting for its device every call, cannot do).

The kernel rows time graphc's launch list replayed on the device values of a call
(`CudaExecutable.replay`), so host transfers stay out, and PyTorch's op on tensors already on
the device; every sample is many calls between two device synchronisations by the wall clock,
and a row reports the median of its samples, taken in turns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import graphc
from benchmarks import model_steps, models

ROWS = ("copy", "sgemm_4096", "conv", "elementwise", "gpt_b16", "resnet18_b32")


def _samples(timed, rounds: int, min_seconds: float = 0.05) -> float:
    """Median seconds per call of `timed(n)` (runs n calls and waits for the device)."""
    timed(1)
    n = 1
    while True:
        start = time.perf_counter()
        timed(n)
        if time.perf_counter() - start >= min_seconds or n >= 1 << 16:
            break
        n *= 2
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        timed(n)
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def _in_turns(contenders: dict, rounds: int, min_seconds: float = 0.05) -> dict:
    """{name: median seconds per call}, the contenders' samples (each at least `min_seconds`)
    taken in turns."""
    per_round = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, timed in contenders.items():
            per_round[name].append(_samples(timed, 1, min_seconds))
    return {name: statistics.median(v) for name, v in per_round.items()}


def _torch():
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gpu: PyTorch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 against float32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    return torch


def _graphc_kernel(fn, *arrays):
    """The cuda executable of `fn` compiled and called twice (the second call captures its
    CUDA graph), with its output of the last call; `timed(n)` replays it n times."""
    compiled = graphc.compile(fn, backend="cuda")
    tensors = [graphc.tensor(a) for a in arrays]
    compiled(*tensors)
    out = compiled(*tensors)
    executable = compiled.executable
    return executable, out.numpy(), lambda n: executable.replay(n)


def _torch_timed(torch, op):
    def timed(n):
        for _ in range(n):
            op()
        torch.cuda.synchronize()
    return timed


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(a, np.float64) - ref) / max(np.linalg.norm(ref),
                                                                       1e-30))


def copy_row(torch, quick: bool, rounds: int) -> dict:
    count = (1 << 22) if quick else (1 << 28)
    a = torch.rand(count, device="cuda")
    b = torch.empty_like(a)
    seconds = _samples(_torch_timed(torch, lambda: b.copy_(a)), rounds)
    return dict(name="copy", what=f"device copy, {count * 4 >> 20} MiB",
                torch_s=seconds, gbps=2 * count * 4 / seconds / 1e9)


def sgemm_row(torch, quick: bool, rounds: int) -> dict:
    n = 512 if quick else 4096
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    ex, out, graphc_timed = _graphc_kernel(lambda x, y: x @ y, a, b)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    tc = torch.empty_like(ta)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    times = _in_turns({"graphc": graphc_timed,
                       "torch": _torch_timed(torch, lambda: torch.mm(ta, tb, out=tc))}, rounds)
    flops = 2.0 * n ** 3
    return dict(name="sgemm_4096", what=f"SGEMM {n}^3 float32", graphc_s=times["graphc"],
                torch_s=times["torch"], graphc_tflops=flops / times["graphc"] / 1e12,
                torch_tflops=flops / times["torch"] / 1e12,
                ratio=times["torch"] / times["graphc"], target=">= 0.8x cuBLAS",
                met=times["torch"] / times["graphc"] >= 0.8,
                err_graphc=_rel(out, reference), err_torch=_rel(tc.cpu().numpy(), reference),
                provider=", ".join(sorted(set(ex.gemm_providers()))))


def conv_row(torch, quick: bool, rounds: int) -> dict:
    n, c, hw = (4, 16, 16) if quick else (32, 64, 56)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    ex, out, graphc_timed = _graphc_kernel(
        lambda x, w: graphc.nn.functional.conv2d(x, w, padding=1), x, w)
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    conv = torch.nn.functional.conv2d
    times = _in_turns({"graphc": graphc_timed,
                       "torch": _torch_timed(torch, lambda: conv(tx, tw, padding=1))}, rounds)
    reference = conv(tx.double(), tw.double(), padding=1).cpu().numpy()
    flops = 2.0 * n * c * c * 9 * hw * hw
    return dict(name="conv", what=f"conv2d N={n}, {c}->{c}, 3x3, pad 1, {hw}x{hw}",
                graphc_s=times["graphc"], torch_s=times["torch"],
                graphc_tflops=flops / times["graphc"] / 1e12,
                torch_tflops=flops / times["torch"] / 1e12,
                ratio=times["torch"] / times["graphc"], target=">= 0.5x cuDNN",
                met=times["torch"] / times["graphc"] >= 0.5, err_graphc=_rel(out, reference),
                err_torch=_rel(conv(tx, tw, padding=1).cpu().numpy(), reference),
                provider="; ".join(ex.conv_providers()))


def elementwise_row(torch, quick: bool, rounds: int, copy_gbps: float) -> dict:
    count = (1 << 20) if quick else (1 << 26)
    x = np.random.default_rng(2).standard_normal(count).astype(np.float32)

    def chain(lib, v):
        return lib.tanh(v * 0.5 + 1) * lib.sigmoid(v) + lib.relu(v - 0.1)

    ex, out, graphc_timed = _graphc_kernel(lambda v: chain(graphc, v), x)
    tx = torch.from_numpy(x).cuda()
    times = _in_turns({"graphc": graphc_timed,
                       "torch": _torch_timed(torch, lambda: chain(torch, tx))}, rounds)
    gbps = 2 * count * 4 / times["graphc"] / 1e9
    x64 = x.astype(np.float64)
    reference = np.tanh(x64 * 0.5 + 1) / (1 + np.exp(-x64)) + np.maximum(x64 - 0.1, 0)
    return dict(name="elementwise", what=f"tanh(x*0.5+1)*sigmoid(x)+relu(x-0.1), {count} f32",
                graphc_s=times["graphc"], torch_s=times["torch"], graphc_gbps=gbps,
                ratio=gbps / copy_gbps, target=">= 0.8x copy bandwidth",
                met=gbps / copy_gbps >= 0.8, err_graphc=_rel(out, reference),
                kernels=len(ex.lowered.steps))


def step_row(torch, name: str, quick: bool, rounds: int, profile: bool) -> dict:
    key = name.split("_")[0]
    shape = (model_steps.QUICK if quick else model_steps.FULL)[key]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, key, shape)
    tmodel = model_steps.build(torch, key, shape)
    tmodel.load_state_dict({k: torch.from_numpy(v.detach().numpy().copy())
                            for k, v in model.state_dict().items()})
    tmodel = tmodel.cuda()
    x, y = model_steps.batch_of(key, shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    step = graphc.compile(models.graphc_step(model), backend="cuda")
    tstep = models.torch_step(tmodel)
    losses = [(float(step(gx, gy).item()), float(tstep(tx, ty).item())) for _ in range(3)]

    def graphc_timed(n):
        for _ in range(n):
            step(gx, gy).item()

    def torch_timed(n):  # the loss read every step, as graphc's: both wait for the device
        for _ in range(n):
            tstep(tx, ty).item()

    def torch_ahead(n):  # no read until the end: PyTorch's host runs ahead of its device
        for _ in range(n):
            tstep(tx, ty)
        torch.cuda.synchronize()

    times = _in_turns({"graphc": graphc_timed, "torch": torch_timed,
                       "torch_ahead": torch_ahead}, rounds, min_seconds=0.25)
    ratio = times["graphc"] / times["torch"]
    executable = step.executable
    replay_s = _samples(lambda n: executable.replay(n), 3)
    return dict(name=name, what=f"{key} training step, batch {shape['batch']}",
                graphc_s=times["graphc"], torch_s=times["torch"],
                torch_ahead_s=times["torch_ahead"], ratio=ratio,
                target="<= 1.0x PyTorch CUDA eager", met=ratio <= 1.0, replay_s=replay_s,
                loss_after_3=losses[-1], traces=len(step.graphs),
                provider=_provider_summary(executable),
                profile=(profile_lines(executable) + host_profile_lines(
                    lambda: graphc_timed(10)) + torch_profile_lines(
                    torch, lambda: torch_timed(5))) if profile else [])


def profile_lines(executable, top: int = 12) -> list[str]:
    """The launch list's device time by kind of step (library function, or generated
    kernel by its name without the k<N>_ prefix), then its slowest steps."""
    times = executable.step_times(5)
    total = sum(times)
    kinds: dict[str, list[float]] = {}
    labels = [executable.describe_step(k) for k in range(len(times))]
    for label, t in zip(labels, times):
        words = label.split()
        name = words[2] if words[0] == "library" else words[1].split("_", 1)[-1]
        kinds.setdefault(name, []).append(t)
    lines = [f"  profile: {len(times)} steps, {total * 1e3:.3f} ms run directly"]
    for name, ts in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"    {sum(ts) * 1e3:8.3f} ms {100 * sum(ts) / total:5.1f}%  x{len(ts):<4}"
                     f" {name}")
    lines.append("  slowest steps:")
    for k in sorted(range(len(times)), key=lambda k: -times[k])[:top]:
        lines.append(f"    {times[k] * 1e3:8.3f} ms  {labels[k][:160]}")
    return lines


def host_profile_lines(run, top: int = 14) -> list[str]:
    """Where the host's time goes in `run()` (cProfile, functions by own time)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    body = text.getvalue().splitlines()
    start = next((i for i, line in enumerate(body) if "ncalls" in line), 0)
    return ["  host profile (10 steps, by own time):"] + ["    " + line.strip()[:150]
                                                         for line in body[start:] if line]


def torch_profile_lines(torch, run, top: int = 14) -> list[str]:
    """PyTorch's device time in `run()` (five steps) by kernel, per step (torch.profiler):
    the anchor's side of the profile, kernel for kernel."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    rows = [(e.device_time_total, e.count, e.key) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) / 5
    lines = [f"  PyTorch: {total / 1e3:.3f} ms of kernels per step, by kernel:"]
    for us, count, key in rows[:top]:
        lines.append(f"    {us / 5 / 1e3:8.3f} ms  x{count // 5:<4d} {key[:110]}")
    return lines


def _provider_summary(executable) -> str:
    """How many of a step's GEMM and convolution calls each library runs."""
    counts: dict[str, int] = {}
    for text in executable.gemm_providers() + executable.conv_providers():
        who = "cuBLAS" if "cuBLAS from" in text else "cuDNN" if "from libcudnn" in text \
            else "graphc"
        kind = "conv" if text.startswith("gc_conv2d") else "gemm"
        counts[f"{kind} {who}"] = counts.get(f"{kind} {who}", 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def _line(row: dict) -> str:
    parts = [f"{row['name']:<13}{row['what']}"]
    names = {"replay_s": "graphc replay", "torch_ahead_s": "torch without the loss read"}
    for key in ("graphc_s", "torch_s", "replay_s", "torch_ahead_s"):
        if key in row:
            parts.append(f"{names.get(key, key[:-2])} {row[key] * 1e3:.3f} ms")
    for key in ("graphc_tflops", "torch_tflops", "graphc_gbps", "gbps"):
        if key in row:
            unit = "GB/s" if key.endswith("gbps") else "TFLOP/s"
            parts.append(f"{key.split('_')[0]} {row[key]:.1f} {unit}")
    if "ratio" in row:
        parts.append(f"ratio {row['ratio']:.2f} (target {row['target']}: "
                     f"{'met' if row['met'] else 'MISSED'})")
    for key in ("err_graphc", "err_torch", "provider", "loss_after_3", "traces", "kernels"):
        if key in row:
            parts.append(f"{key} {row[key]}")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", action="append", choices=ROWS, help="rows to run")
    parser.add_argument("--rounds", type=int, default=7, help="samples per contender")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--profile", action="store_true",
                        help="print where each training step's device time goes")
    args = parser.parse_args(argv)
    torch = _torch()
    wanted = args.only or list(ROWS)
    rows: list[dict] = []
    print(f"benchmarks.gpu: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"GRAPHC_CUDA_LIBS={os.environ.get('GRAPHC_CUDA_LIBS', '(unset)')}", flush=True)
    copy = copy_row(torch, args.quick, args.rounds)
    for name in wanted:
        try:
            if name == "copy":
                row = copy
            elif name == "sgemm_4096":
                row = sgemm_row(torch, args.quick, args.rounds)
            elif name == "conv":
                row = conv_row(torch, args.quick, args.rounds)
            elif name == "elementwise":
                row = elementwise_row(torch, args.quick, args.rounds, copy["gbps"])
            else:
                row = step_row(torch, name, args.quick, args.rounds, args.profile)
        except Exception as error:  # noqa: BLE001 (a failing row is reported, the rest run)
            row = dict(name=name, what="FAILED", error=f"{type(error).__name__}: {error}")
            print(f"{name:<13}FAILED: {row['error'][:2000]}", flush=True)
            rows.append(row)
            continue
        rows.append(row)
        print(_line(row), flush=True)
        for line in row.get("profile", ()):
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
