"""Where a one-op convolution kernel's time goes, generated function by function, with perf.

    perf record -e cpu-clock -o k.data -- python -m benchmarks.kernel_functions fwd 256 8 3
    python -m benchmarks.kernel_functions --report k.data --ms 4.5

The first form compiles ResNet-18's convolution pass `kind` (fwd, gx, gw) of `channels`
input channels on `side` x `side` planes, batch 32, as a one-op graph (tests/
test_cpu_conv_paths `_graphs`: a 3x3 kernel at stride 2 and padding 1, a 1x1 at stride 2
and padding 0, `--stem`: 3x3 at stride 1 into 64 channels), writes perf's map of JIT code
(/tmp/perf-PID.map: every global function of the executable's module, its address and the
distance to the next), then calls it natively (benchmarks.profiles.native_call) for
`--seconds` of CPU time and prints the median per call. perf's cpu-clock sampling then
names the generated functions: a kernel, its forked or prelude kernels, the noinline GEMM
functions (winograd_gemm's, conv_pointwise's), so a kernel's time splits into its GEMMs
and its transforms without building variants that skip a part (those read pages left
unwritten, which are cheaper: docs/performance.md, twelfth session).

`--report`: each generated function's share of the samples that fell in generated code
(perf report --sort sym), and that share of `--ms` (the median the first form printed).
Needs `perf` with cpu-clock events (hardware counters are not needed: a VM has none).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

LAST_SIZE = 1 << 16  # the bytes given to the highest function (nothing after it to measure)
GENERATED = re.compile(r"(graphc_|k\d+_)")  # generated functions' names (gemms, kernels)


def perf_map(library, path: str | None = None) -> str:
    """Append `library`'s global functions (a graphc.backends.cpu.llvm.Library) to perf's map
    of this process's JIT code, "address size name" in hex, each function's size the
    distance to the next one's address (a local function between two, such as a forked
    kernel's `.omp` worker, counts as the one before it); returns the map's path."""
    path = path or f"/tmp/perf-{os.getpid()}.map"
    placed = sorted((library.address(name), name) for name in library.symbols)
    with open(path, "a") as out:
        for (address, name), (following, _) in zip(placed, placed[1:] + [(0, "")]):
            size = following - address if following > address else LAST_SIZE
            out.write(f"{address:x} {size:x} {name}\n")
    return path


def shares(report: str) -> list[tuple[str, float]]:
    """[(function, share of the generated code's samples)] from `perf report --stdio --sort
    sym` text, largest first."""
    rows = []
    for line in report.splitlines():
        found = re.match(r"\s*([\d.]+)%\s+\[\.\]\s+(\S+)", line)
        if found and GENERATED.match(found.group(2)):
            rows.append((found.group(2), float(found.group(1))))
    total = sum(p for _, p in rows) or 1.0
    return sorted(((name, p / total) for name, p in rows), key=lambda r: -r[1])


def one_op(kind: str, channels: int, side: int, kernel: int, stem: bool, n: int = 32):
    """(graph, arguments) of the pass (see the module docstring)."""
    import numpy as np

    from tests.test_cpu_conv_paths import _graphs

    out = 64 if stem else 2 * channels
    xs, ws = (n, channels, side, side), (out, channels, kernel, kernel)
    stride = (1, 1) if stem else (2, 2)
    padding = (1, 1) if kernel == 3 else (0, 0)
    gs, graphs = _graphs(xs, ws, stride, padding, 1)
    rng = np.random.default_rng(1)
    x = np.maximum(rng.standard_normal(xs), 0).astype(np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(channels * kernel * kernel)).astype(np.float32)
    gy = (rng.standard_normal(gs) * 1e-2).astype(np.float32)
    return graphs[kind], {"fwd": [x, w], "gx": [gy, w], "gw": [gy, x]}[kind]


def run(kind: str, channels: int, side: int, kernel: int, stem: bool, seconds: float) -> float:
    """Compile, write the perf map, call for `seconds` of CPU time; the median ms a call."""
    import time

    import numpy as np

    from benchmarks.profiles import native_call
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers

    graph, arguments = one_op(kind, channels, side, kernel, stem)
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    perf_map(exe.library)
    call = native_call(exe, arguments)
    call()
    samples, start = [], time.process_time()
    while time.process_time() - start < seconds:
        began = time.process_time()
        for _ in range(5):
            call()
        samples.append((time.process_time() - began) / 5)
    return float(np.median(samples)) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", nargs="?", choices=("fwd", "gx", "gw"))
    parser.add_argument("channels", nargs="?", type=int)
    parser.add_argument("side", nargs="?", type=int)
    parser.add_argument("kernel", nargs="?", type=int, choices=(1, 3), default=3)
    parser.add_argument("--stem", action="store_true", help="stride 1, 64 output channels")
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU time of calls (3)")
    parser.add_argument("--report", metavar="PERF_DATA", help="the shares of a recording")
    parser.add_argument("--ms", type=float, default=1.0, help="--report: ms a call (1)")
    args = parser.parse_args(argv)
    if args.report:
        text = subprocess.run(["perf", "report", "-i", args.report, "--stdio", "--sort",
                               "sym"], capture_output=True, text=True, check=True).stdout
        for name, share in shares(text):
            if share >= 0.005:
                print(f"{share * 100:5.1f}%  {share * args.ms:6.3f} ms  {name}")
        return
    if args.kind is None or args.channels is None or args.side is None:
        parser.error("give kind, channels and side (or --report PERF_DATA)")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"
    sys.path.insert(0, os.getcwd())  # tests.test_cpu_conv_paths, from the repository root
    ms = run(args.kind, args.channels, args.side, args.kernel, args.stem, args.seconds)
    print(f"{args.kind} {args.channels} ch {args.side}x{args.side} k{args.kernel}: median "
          f"{ms:.3f} ms a call")


if __name__ == "__main__":
    main()
