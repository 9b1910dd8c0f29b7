"""`graphc.profile`: where a compiled call's time goes, kernel by kernel, timed natively.

    >>> import graphc
    >>> f = graphc.compile(lambda x: (x @ x).relu().sum(), backend="cpu")
    >>> report = graphc.profile(f, graphc.randn(64, 64), repeat=3)
    >>> any("matmul" in row.op and row.gflops > 0 for row in report.rows)
    True

How: the graph of the call's compiled entry is compiled again with a profiling driver (the
same kernels; the driver reads CLOCK_MONOTONIC before every kernel and after the last,
graphc.backends.cpu.codegen), and run `repeat` times on copies of the arrays the real call
binds (its inputs, parameters and optimizer state), so profiling never changes the user's
model. Each kernel's figure is its median over the runs. A callable that was never called is
called once first (a real call, with its effects), to trace it. A graph with symbolic sizes
(graphc.compile(dynamic=True)) is profiled at the sizes of the call: its runtime-sized
executable run at them, or the graph specialised to them where the cpu backend compiles it
per size; the rows' shapes, bytes and flops are those of the call. A call whose outputs need
a grad_fn (a module's forward with gradients on) runs its entry's forward part, a graph of its
own (named `<fn>_forward`): that graph is the one profiled.

Threads: the runs use the thread count the real executable runs now (its ThreadChooser's
current count), or `threads=n`. A freshly compiled executable starts on one thread and tries
all cores only after some calls (graphc.backends.cpu.threads.ThreadChooser), so profiling a
callable called once times its one-thread kernels even in a process with more cores: pass
`threads=` to time another count. The report says which count it timed.

`Profile.table()` is a text table sorted by time: op, output shape, bytes read and written,
GB/s, GFLOP/s (for GEMMs and convolutions) and the user's source line.
`Profile.chrome_trace(path)` writes a Chrome / Perfetto trace (JSON, one event per kernel of
one run), which chrome://tracing and ui.perfetto.dev open.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.errors import GraphcError
from graphc.symbolic import evaluate
from graphc.types import TensorType

__all__ = ["KernelTime", "Profile", "kernel_label", "profile", "profile_builder"]


@dataclass(frozen=True)
class KernelTime:
    """One kernel of the compiled step: what it computes and its median time."""

    step: int  # position in the driver
    op: str  # the node's op ("fused(add,relu)" for fused nodes; "output copy")
    shape: str  # its output types
    seconds: float
    bytes: int  # input + output bytes of the node
    flops: int  # for GEMMs and convolutions; 0 where not counted
    source: str  # the user's source line the node was traced from
    values: tuple[str, ...] = ()  # the node's output value names (the IR's %names)

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 and self.flops else 0.0


@dataclass
class Profile:
    """The kernels of one compiled call, slowest first, and the whole call's median."""

    graph_name: str
    rows: list[KernelTime]
    total: float  # median seconds of the whole native call
    runs: int
    starts: list[float]  # one run's kernel start times (seconds from its start), by step
    graph: Any = None  # the profiled executable's graph (fused and planned)
    threads: int = 1  # the thread count the runs used

    def table(self, limit: int | None = None) -> str:
        lines = [f"graph @{self.graph_name}: {len(self.rows)} kernels, native call "
                 f"{_time(self.total)} (median of {self.runs} runs, {self.threads} "
                 f"thread{'s' if self.threads != 1 else ''})",
                 f"{'time':>10} {'share':>6} {'GB/s':>7} {'GFLOP/s':>8}  "
                 f"{'op':<28} {'output':<28} source"]
        for row in self.rows[:limit]:
            gflops = f"{row.gflops:8.1f}" if row.flops else f"{'-':>8}"
            lines.append(f"{_time(row.seconds):>10} {row.seconds / self.total:6.1%} "
                         f"{row.gbps:7.2f} {gflops}  {row.op[:28]:<28} {row.shape[:28]:<28} "
                         f"{row.source}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def chrome_trace(self, path: str) -> str:
        """Write one run as Chrome trace events ("X" complete events, microseconds)."""
        by_step = sorted(self.rows, key=lambda r: r.step)
        events = [{"name": row.op, "cat": "kernel", "ph": "X", "pid": 1, "tid": 1,
                   "ts": self.starts[row.step] * 1e6, "dur": row.seconds * 1e6,
                   "args": {"output": row.shape, "bytes": row.bytes, "flops": row.flops,
                            "source": row.source, "step": row.step,
                            "values": ["%" + v for v in row.values]}}
                  for row in by_step]
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"graph": self.graph_name, "runs": self.runs}}, f)
        return path


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


class _Captured(Exception):
    """Raised by the capturing shim to stop the real call before it runs."""


def profile(fn, *args, repeat: int = 20, trace: str | None = None,
            threads: int | None = None, **kwargs) -> Profile:
    """Time every kernel of `fn(*args, **kwargs)` compiled on the cpu backend (see the
    module docstring). `fn` is a graphc.compile'd callable, or a plain function (compiled
    here with backend="cpu"). `trace`: also write a Chrome trace to that path. `threads`:
    the thread count of the runs (1 to the most the executable uses); None: the count the
    executable runs now."""
    import graphc
    from graphc.backends.cpu.threads import ThreadChooser

    if repeat < 1:
        raise GraphcError(f"graphc.profile: repeat must be at least 1, got {repeat}")
    if threads is not None and (type(threads) is not int or threads < 1):
        raise GraphcError(f"graphc.profile: threads must be a whole number of at least 1 "
                          f"(or None: the executable's current count), got {threads!r}")
    compiled = fn if hasattr(fn, "_entries") else graphc.compile(fn, backend="cpu")
    if not compiled._entries:
        compiled(*args, **kwargs)
    executable = compiled.executable
    if getattr(executable, "backend", None) != "cpu":
        raise GraphcError(f"graphc.profile times the cpu backend's kernels; this callable "
                          f"runs on {getattr(executable, 'backend', '?')!r}: compile it with "
                          "backend=\"cpu\"")
    executable, arrays = _bound_arrays(compiled, executable, args, kwargs)
    sizes = _call_sizes(executable.graph, arrays)
    real, timed, run = _profiling_twin(executable, sizes)
    # the thread count the real executable settled on, not a fresh exploration
    chosen = real.thread_chooser
    count = chosen.current if threads is None else threads
    if count > chosen.most:
        raise GraphcError(f"graphc.profile: threads={threads}, but this executable runs on "
                          f"at most {chosen.most} thread(s) (none of its kernels forks, or "
                          "libgomp's team, OMP_NUM_THREADS or the cores this process may use "
                          f"allow no more): pass at most {chosen.most}")
    timed.thread_chooser = ThreadChooser(chosen.most, fixed=count)
    stamps, totals = [], []
    for _ in range(repeat):
        run(*[a.copy() for a in arrays])
        stamps.append(timed.last_stamps.copy())
        totals.append((timed.last_stamps[-1] - timed.last_stamps[0]) / 1e9)
    stamps = np.array(stamps, np.float64)
    durations = np.median(np.diff(stamps, axis=1), axis=0) / 1e9
    starts = list((stamps[0, :-1] - stamps[0, 0]) / 1e9)
    rows = [_row(k, node, float(seconds), sizes)
            for k, (node, seconds) in enumerate(zip(timed.lowered.kernel_nodes, durations))]
    rows.sort(key=lambda r: r.seconds, reverse=True)
    result = Profile(executable.graph.name, rows, float(np.median(totals)), repeat, starts,
                     executable.graph, count)
    if trace is not None:
        result.chrome_trace(trace)
    return result


def _call_sizes(graph, arrays) -> dict[str, int]:
    """The value of each symbol of a symbolic graph in this call ({} for a static graph)."""
    from graphc.symbolic import bind

    symbolic = [(v.type.shape, np.shape(a)) for v, a in zip(graph.inputs, arrays)
                if v.type.is_symbolic]
    if not symbolic:
        return {}
    return bind([shape for shape, _ in symbolic], [got for _, got in symbolic])


def _profiling_twin(executable, sizes: dict[str, int]):
    """(the executable that serves the call, its profiling twin, the twin's run): the same
    graph compiled again with a profiling driver. A symbolic graph's call is served either by
    its one runtime-sized executable (graphc.backends.cpu.runtime_sizes), profiled as it is
    and run at the call's sizes, or by the graph specialised to those sizes (compiled per
    size), profiled so."""
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.backends.cpu.runtime_sizes import RuntimeSizedExecutable

    if not sizes:
        timed = CpuExecutable(executable.graph, {"profile": True})
        return executable, timed, timed.run
    served = executable.executable_for(sizes)
    if getattr(served, "generic", False):  # the runtime-sized executable at these sizes
        real = served.executable
        timed = RuntimeSizedExecutable(real.graph, {"profile": True}, hints=sizes)
        return real, timed, timed.at(sizes).run
    timed = CpuExecutable(served.graph, {"profile": True})
    return served, timed, timed.run


def _bound_arrays(compiled, executable, args, kwargs) -> tuple:
    """(the executable this call runs, copies of the arrays the call binds to it), caught
    before it runs. A call whose outputs need a grad_fn runs its entry's forward part (an
    executable of its own, under autograd: graphc.jit.general_path.run_with_gradient), so
    that one is caught too."""
    captured: list = []
    gradient = compiled._entries[-1].gradient
    candidates = [executable] + ([gradient.forward] if gradient is not None else [])

    def capturing(candidate):
        def capture(*arrays):
            captured.append((candidate, [np.array(a, copy=True) for a in arrays]))
            raise _Captured
        return capture

    for candidate in candidates:  # an instance attribute shadows the method for one call
        candidate.run = capturing(candidate)
    try:
        compiled(*args, **kwargs)
    except _Captured:
        pass
    finally:
        for candidate in candidates:
            del candidate.run
    if not captured or compiled.executable is not executable:
        raise GraphcError("graphc.profile: these arguments do not replay the compiled entry "
                          "(they traced again); call the function with them once first")
    return captured[0]


def kernel_label(node) -> str:
    """A node's name in a profile: its op, or `fused(add,relu,...)` for a fused group."""
    if node.op != "fused":
        return node.op
    ops = [op for op, _, _ in node.attrs["body"] if op != "full"]
    return "fused(" + ",".join(ops) + ")"


def _nbytes(values, sizes: dict[str, int]) -> int:
    return sum(math.prod(evaluate(v.type.shape, sizes)) * v.type.dtype.itemsize
               for v in values)


def _row(step: int, node, seconds: float, sizes: dict[str, int]) -> KernelTime:
    """One kernel's row; a symbolic graph's sizes (shapes, bytes, flops) at the call's."""
    if node is None:
        return KernelTime(step, "output copy", "", seconds, 0, 0, "")
    shape = ", ".join(str(TensorType(evaluate(v.type.shape, sizes), v.type.dtype))
                      for v in node.outputs)
    return KernelTime(step, kernel_label(node), shape, seconds,
                      _nbytes(node.inputs, sizes) + _nbytes(node.outputs, sizes),
                      int(evaluate(_flops(node), sizes)), node.loc or "",
                      tuple(v.name for v in node.outputs))


def _flops(node):
    """2 x the multiply-adds of a GEMM or a forward convolution (also as a fused node's
    anchor), an int or, in a symbolic graph, a Sym; 0 for other ops (their figure is GB/s)."""
    from graphc.ops.fused import FusedBody

    if node.op != "fused" and node.op not in ("matmul", "conv2d"):
        return 0
    body = FusedBody.of_node(node)
    first = body.instructions[0] if body.instructions else None
    if first is None or first.op not in ("matmul", "conv2d"):
        return 0
    a, b = (body.types[r].shape for r in first.args[:2])
    out = body.types[body.ref(0)].shape
    if first.op == "matmul":
        return 2 * math.prod(out) * (a[-1] if a else 1)
    return 2 * math.prod(out) * math.prod(b[1:])  # weight (C_out, C_in / groups, kH, kW)


def profile_builder(fn, inputs, *, repeat: int = 20) -> Profile:
    """What `graphc profile FILE.py:builder` runs on what the builder returned,
    `(fn, inputs)`:

    - `fn` a function (a training step that calls `backward()` and `opt.step()`, or any
      function of tensors) or a `graphc.compile`d callable: `fn(*inputs)` is compiled on the
      cpu backend and profiled as it is, grad mode on;
    - `fn` an `nn.Module`: its forward on `inputs`, under `graphc.no_grad()` (inference).

    A step with side effects (an optimizer update) runs once for real, to trace it; the
    profiled runs work on copies of its arrays (see `profile`).
    """
    import graphc

    if isinstance(fn, graphc.nn.Module):
        with graphc.no_grad():
            return profile(fn, *inputs, repeat=repeat)
    return profile(fn, *inputs, repeat=repeat)
