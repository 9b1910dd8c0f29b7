"""MLP 784-256-256-10 training step at batch 64 (SGD-momentum): graphc eager, graphc compiled
(interp and cpu backends) and PyTorch eager side by side in one process; medians and ratios.

    python benchmarks/train_step.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import graphc
import graphc.nn as gnn
import graphc.optim as goptim


def median_ms(fn, repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def graphc_step():
    model = gnn.Sequential(gnn.Flatten(), gnn.Linear(784, 256), gnn.ReLU(), gnn.Linear(256, 256),
                           gnn.ReLU(), gnn.Linear(256, 10))
    opt = goptim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = gnn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    rows = {"graphc eager": graphc_step()}
    for backend in ("interp", "cpu"):
        compiled = graphc.compile(graphc_step(), backend=backend)
        start = time.perf_counter()
        compiled(gx, gy)
        compiled(gx, gy)  # the second call traces again: optimizer state now exists
        print(f"graphc {backend}: first two calls (traces + compiles) "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms")
        rows[f"graphc {backend}"] = compiled
    results = {name: median_ms(lambda f=f: f(gx, gy), args.repeats) for name, f in rows.items()}
    try:
        import torch
        import torch.nn as tnn

        torch.set_num_threads(2)
        tm = tnn.Sequential(tnn.Linear(784, 256), tnn.ReLU(), tnn.Linear(256, 256), tnn.ReLU(),
                            tnn.Linear(256, 10))
        topt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)
        tloss = tnn.CrossEntropyLoss()
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def torch_step():
            topt.zero_grad()
            tloss(tm(tx), ty).backward()
            topt.step()

        results["torch eager"] = median_ms(torch_step, args.repeats)
    except ImportError:
        print("torch is not installed: no PyTorch anchor")
    anchor = results.get("torch eager", results["graphc eager"])
    print("\n| implementation | median ms | ratio to anchor |\n|---|---|---|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.2f} | {ms / anchor:.2f} |")


if __name__ == "__main__":
    main()
