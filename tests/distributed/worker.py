"""Run under `mpiexec -n 2 python tests/distributed/worker.py MODE`: one scenario of
tests/test_distributed.py per MODE. Prints `OK <details>` on rank 0 when the scenario holds."""

import sys

import numpy as np

import graphc
import graphc.distributed as dist
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.ir.printer import format_graph
from graphc.nn.parallel import DistributedDataParallel
from graphc.utils.data import DataLoader, DistributedSampler, TensorDataset


def mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))


def lenet():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 4))


def data(kind, n=64):
    rng = np.random.default_rng(0)
    shape = (n, 20) if kind == "mlp" else (n, 1, 8, 8)
    return (graphc.tensor(rng.standard_normal(shape).astype(np.float32)),
            graphc.tensor(rng.integers(0, 4, n)))


def train(model, opt_name, batches, steps=10, backend=None):
    opt = (graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else graphc.optim.Adam(model.parameters(), lr=0.01))

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = step if backend is None else graphc.compile(step, backend=backend)
    losses = [run(x, y).item() for _ in range(steps) for x, y in batches]
    if backend is not None:  # the averaging is in the graph; cpu compiles one graph
        assert "all_reduce" in format_graph(run.executable.graph)
        assert backend != "cpu" or len(run.graphs) == 1, f"{len(run.graphs)} graphs"
    return losses


def equivalence(kind, opt_name, backend=None, view=False):
    graphc.manual_seed(1)
    build = mlp if kind == "mlp" else lenet
    reference = build()
    replica = build()
    replica.load_state_dict(reference.state_dict())
    if dist.get_rank() == 1:  # DDP must broadcast rank 0's weights
        for p in replica.parameters():
            p.detach().numpy()[...] += 1.0
    x, y = data(kind)
    ddp = DistributedDataParallel(replica, gradient_as_bucket_view=view)
    share = DataLoader(TensorDataset(x, y), batch_size=32,
                       sampler=DistributedSampler(TensorDataset(x, y), shuffle=False))
    ddp_losses = train(ddp, opt_name, list(share), backend=backend)
    full_losses = train(reference, opt_name, [(x, y)])
    # the global loss is the mean of the ranks' losses
    mean_losses = np.array(ddp_losses, np.float64)
    dist.all_reduce(graphc.from_numpy(mean_losses), op=dist.ReduceOp.AVG)
    worst = 0.0
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        a, b = p.detach().numpy(), q.detach().numpy()
        worst = max(worst, float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12)))
    loss_gap = float(np.max(np.abs(mean_losses - full_losses) / np.abs(full_losses)))
    assert worst < 1e-6 and loss_gap < 1e-6, (worst, loss_gap)
    return (f"{kind}/{opt_name}/{backend or 'eager'}{'/view' if view else ''} parameters "
            f"{worst:.1e} losses {loss_gap:.1e}")


def collectives():
    rank, world = dist.get_rank(), dist.get_world_size()
    t = graphc.full((3,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 3
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    m = graphc.full((2,), float(rank))
    dist.all_reduce(m, op=dist.ReduceOp.MIN)
    assert m.tolist() == [0.0, 0.0]
    b = graphc.full((2,), float(rank * 7))
    dist.broadcast(b, src=1)
    assert b.tolist() == [7.0, 7.0]
    parts = [graphc.zeros(2) for _ in range(world)]
    dist.all_gather(parts, graphc.full((2,), float(rank)))
    assert [p.tolist() for p in parts] == [[0.0, 0.0], [1.0, 1.0]]
    out = graphc.zeros(2)
    dist.reduce_scatter(out, [graphc.full((2,), float(rank + r)) for r in range(world)])
    assert out.tolist() == [float(2 * rank + 1)] * 2
    dist.barrier()
    return "collectives"


def mismatch():
    t = graphc.zeros(3 if dist.get_rank() == 0 else 4)
    try:
        dist.all_reduce(t)
    except dist.DistributedError as err:
        assert "the ranks disagree (rank 0: all_reduce of [3]; rank 1: all_reduce of [4])" \
            in str(err), err
        return "mismatch reported"
    raise AssertionError("a mismatched all_reduce ran")


def main():
    mode = sys.argv[1]
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    dist.init_process_group("mpi", timeout=timeout)
    if mode == "equivalence":
        done = [equivalence(k, o) for k in ("mlp", "lenet") for o in ("sgd", "adam")]
    elif mode == "compiled":
        done = [equivalence(k, o, b) for b in ("interp", "cpu") for k in ("mlp", "lenet")
                for o in ("sgd", "adam")]
    elif mode == "views":  # DistributedDataParallel(gradient_as_bucket_view=True)
        done = [equivalence(k, o, b, view=True) for b in (None, "cpu") for k in ("mlp", "lenet")
                for o in ("sgd", "adam")]
    elif mode == "collectives":
        done = [collectives()]
    elif mode == "mismatch":
        done = [mismatch()]
    elif mode == "raise":
        if dist.get_rank() == 1:
            raise ValueError("rank 1 fails mid-step")
        dist.all_reduce(graphc.ones(2))
        done = ["unreachable"]
    elif mode == "exit":
        if dist.get_rank() == 1:
            import os

            os._exit(int(os.environ.get("GRAPHC_TEST_EXIT", "0")))  # gone without a word
        dist.all_reduce(graphc.ones(2))
        done = ["unreachable"]
    else:
        raise SystemExit(f"unknown mode {mode}")
    dist.barrier()
    if dist.get_rank() == 0:
        print("OK", "; ".join(done), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
