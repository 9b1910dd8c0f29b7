"""The cuda backend's launch list of a model step, read without a GPU: every step with its
node, grid and the bytes it reads and writes, and the sum of those bytes at a bandwidth.

`python -m benchmarks.cuda_launch_list [--model resnet18|gpt] [--quick] [--all] [--tbps 3]`
traces the step of benchmarks.model_steps (`build`, `models.graphc_step`), runs the cuda
pipeline's passes and lowers the planned graph (graphc.backends.cuda.lowering) in this
process: no runtime library is loaded and nothing runs. It prints the launches by kind (the
kernel's op, or the library function), each kind's bytes and their time at `--tbps` TB/s,
and with `--all` every launch that is not a convolution or GEMM.

Bytes of a generated kernel: the span of each pointer parameter (lowering.KernelText.spans;
a broadcast operand counts once), read or written; a parameter reached through a raw
pointer counts its whole value. Library calls are listed by name only. These are the bytes a
perfect kernel moves: a kernel that takes much longer than its bytes at the device's
bandwidth wastes its time elsewhere (too few blocks, strided access).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from dataclasses import dataclass

import graphc
from benchmarks import model_steps, models

LIBRARY_HEAVY = ("gc_conv2d", "gc_gemm")


class _Captured(Exception):
    def __init__(self, graph) -> None:
        super().__init__("captured")
        self.graph = graph


@dataclass
class StepInfo:
    """One step of the launch list: its kind, the node that made it, and its traffic."""

    kind: str
    function: str
    node: str
    blocks: int
    items: int
    lanes: int
    read: int
    written: int


def traced_graph(name: str, quick: bool):
    """The planned graph of `name`'s training step as the cuda backend gets it."""
    from graphc import backends

    shape = (model_steps.QUICK if quick else model_steps.FULL)[name]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, name, shape)
    x, y = model_steps.batch_of(name, shape)

    def capture(graph, options):
        raise _Captured(graph)

    saved = backends.BACKENDS["cuda"]
    backends.BACKENDS["cuda"] = capture
    try:
        graphc.compile(models.graphc_step(model), backend="cuda")(graphc.tensor(x),
                                                                   graphc.tensor(y))
    except _Captured as done:
        return done.graph
    finally:
        backends.BACKENDS["cuda"] = saved
    raise RuntimeError("the step compiled without reaching the cuda backend")


def _loaded_params(k) -> set[int]:
    """The parameters of kernel text `k` read somewhere (on the right of an assignment)."""
    loaded = set()
    for line in k.lines:
        for part in line.split(";"):
            right = part.split(" = ", 1)[-1] if " = " in part else part
            for index in re.findall(r"\*\)p(\d+)\)\[", right):
                loaded.add(k.params[int(index)])
    return loaded


def describe(node) -> str:
    """A short text of `node`: outputs, op (a fused body as its ops) and input names."""
    if node.op == "fused":
        ops = ",".join(op for op, _, _ in node.attrs["body"] if op != "full")
        op = f"fused({ops})"
    else:
        op = node.op
    outs = " ".join(f"{v.type}" for v in node.outputs)
    return f"{outs} = {op}({', '.join('%' + v.name for v in node.inputs)})"


def launch_list(graph) -> list[StepInfo]:
    """Lower `graph` (graphc.backends.cuda.lowering.lower), recording each launch's traffic."""
    from graphc.backends.common import planned
    from graphc.backends.cuda import lowering

    planned(graph)
    traffic: dict[str, tuple[int, int]] = {}
    launch = lowering.Lowerer._launch

    def recording_launch(self, k):
        read = written = 0
        loaded = _loaded_params(k)
        for offset in k.params:
            lo, hi = k.spans.get(offset, (0, 0))
            if offset in k.written:
                written += hi - lo
            if offset not in k.written or offset in loaded:
                read += hi - lo
        traffic[k.name] = (read, written)
        launch(self, k)

    lowering.Lowerer._launch = recording_launch
    try:
        lowered = lowering.lower(graph)
    finally:
        lowering.Lowerer._launch = launch
    found = []
    for step, nodes in zip(lowered.steps, lowered.step_nodes):
        text = "; ".join(describe(n) for n in nodes) or "(copying the results out)"
        if isinstance(step, lowering.Launch):
            read, written = traffic[step.function]
            blocks = -(-step.threads // (256 * step.items))
            kind = step.function.split("_", 1)[-1]
            found.append(StepInfo(kind, step.function, text, blocks, step.items, step.lanes,
                                  read, written))
        else:
            found.append(StepInfo(step.function, step.function, text, 0, 1, 1, 0, 0))
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18", choices=("resnet18", "gpt"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--all", action="store_true", help="list every non-GEMM/conv step")
    parser.add_argument("--tbps", type=float, default=3.0)
    args = parser.parse_args(argv)
    steps = launch_list(traced_graph(args.model, args.quick))
    kinds: dict[str, list[StepInfo]] = defaultdict(list)
    for s in steps:
        kinds[s.kind].append(s)
    print(f"{len(steps)} steps, {sum(s.blocks > 0 for s in steps)} generated kernels")
    light = 0
    for kind, group in sorted(kinds.items(), key=lambda kv: -sum(s.read + s.written
                                                                 for s in kv[1])):
        moved = sum(s.read + s.written for s in group)
        if not kind.startswith(LIBRARY_HEAVY):
            light += moved
        print(f"  {kind:28s} x{len(group):<4d} {moved / 1e6:9.2f} MB "
              f"{moved / args.tbps / 1e9:7.3f} ms at {args.tbps} TB/s")
    print(f"non-conv/GEMM bytes: {light / 1e6:.2f} MB = {light / args.tbps / 1e9:.3f} ms "
          f"at {args.tbps} TB/s")
    if args.all:
        for k, s in enumerate(steps):
            if s.kind.startswith(LIBRARY_HEAVY):
                continue
            print(f"{k:4d} {s.function:24s} blocks {s.blocks:6d} items {s.items} lanes "
                  f"{s.lanes:5d} r {s.read / 1e6:7.3f} w {s.written / 1e6:7.3f} MB  "
                  f"{s.node[:150]}")


if __name__ == "__main__":
    main()
