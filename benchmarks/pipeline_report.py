"""What the passes do to compiled training steps (batch 64): node counts, fused kernels, the
planned arena against its bounds, pass times, and 10 compiled steps against eager.

    python benchmarks/pipeline_report.py
"""

from __future__ import annotations

import copy

import numpy as np

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.ops.registry import REGISTRY


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                         nn.ReLU(), nn.Linear(256, 10))


def lenet5():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


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

    compiled, eager = graphc.compile(step(model, opt)), step(reference, ref_opt)
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
