"""What the passes do to compiled training steps (batch 64): node counts, fused kernels, the
planned arena against its bounds, pass times, and 10 compiled steps against eager.

    python benchmarks/pipeline_report.py      (or python -m benchmarks.pipeline_report)

The timing table of the same steps is benchmarks/run.py.
"""

from __future__ import annotations

import copy
import os
import sys

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
import graphc.optim as optim  # noqa: E402
from benchmarks.models import lenet5  # noqa: E402
from benchmarks.models import mlp as mlp_784  # noqa: E402
from graphc.ops.registry import REGISTRY  # noqa: E402


def mlp():
    return nn.Sequential(nn.Flatten(), mlp_784())


OPTIMIZERS = {"sgd_momentum": lambda p: optim.SGD(p, lr=0.01, momentum=0.9),
              "adam": lambda p: optim.Adam(p, lr=1e-3)}


def run(make, make_opt):
    graphc.manual_seed(0)
    model = make()
    reference = copy.deepcopy(model)
    opt, ref_opt = make_opt(model.parameters()), make_opt(reference.parameters())
    loss_fn = nn.CrossEntropyLoss()

    def step(m, o):
        def fn(x, y):
            o.zero_grad()
            loss = loss_fn(m(x), y)
            loss.backward()
            o.step()
            return loss.detach()
        return fn

    compiled, eager = graphc.compile(step(model, opt), backend="interp"), step(reference, ref_opt)
    x, y = graphc.randn(64, 1, 28, 28), graphc.randint(0, 10, (64,))
    for _ in range(10):
        compiled(x, y)
        eager(x, y)
    rel = max(float(np.max(np.abs(p.detach().numpy() - q.detach().numpy())
                           / (np.abs(q.detach().numpy()) + 1e-6)))
              for p, q in zip(model.parameters(), reference.parameters()))
    return compiled, rel


def main() -> None:
    print("| step | ops | kernels | kernels/ops | arena KiB | arena/max-live | arena/naive |"
          " pass ms | max rel vs eager |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, make in (("mlp", mlp), ("lenet5", lenet5)):
        for oname, make_opt in OPTIMIZERS.items():
            compiled, rel = run(make, make_opt)
            g = compiled.optimized_graph
            plan = g.meta["memory_plan"]
            ops = len(compiled.graph.nodes)
            kernels = sum(1 for n in g.nodes if not REGISTRY[n.op].view)
            print(f"| {name} {oname} | {ops} | {kernels} | {kernels / ops:.2f} | "
                  f"{plan.arena_bytes / 1024:.0f} | {plan.arena_bytes / plan.max_live_bytes:.3f} |"
                  f" {plan.arena_bytes / plan.naive_bytes:.3f} | "
                  f"{compiled.report.seconds * 1e3:.1f} | {rel:.1e} |")


if __name__ == "__main__":
    main()
