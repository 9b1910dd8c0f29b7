"""Run under `mpiexec -n 2 python tests/distributed/buckets.py MODE`: one scenario of
tests/test_distributed_buckets.py per MODE (gradient buckets, start/wait overlap). Prints
`OK <details>` on rank 0 when the scenario holds."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker import data, lenet, mlp  # noqa: E402

import graphc  # noqa: E402
import graphc.distributed as dist  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.ir.printer import format_graph  # noqa: E402
from graphc.nn.parallel import DistributedDataParallel  # noqa: E402
from graphc.ops import collective  # noqa: E402
from graphc.passes.fuse import fuse  # noqa: E402
from graphc.passes.fuse_waits import wait_bucket  # noqa: E402
from graphc.passes.plan import check_plan, plan_buffers  # noqa: E402
from graphc.passes.simplify import simplify  # noqa: E402

UNBUCKETED = [simplify, fuse, plan_buffers]  # the pipeline without bucket_allreduce
SMALL = 0.0005  # MB: LeNet's gradients in several buckets


def make(kind, opt_name, bucket_cap_mb=None, backend="cpu", passes=None):
    """A compiled (or eager: backend None) DDP step and this rank's half of the batch."""
    graphc.manual_seed(1)
    model = DistributedDataParallel(mlp() if kind == "mlp" else lenet(),
                                    bucket_cap_mb=bucket_cap_mb)
    opt = (graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else graphc.optim.Adam(model.parameters(), lr=0.01))

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = step if backend is None else graphc.compile(step, backend=backend, passes=passes)
    x, y = data(kind)
    half = slice(32 * dist.get_rank(), 32 * (dist.get_rank() + 1))
    return model, run, graphc.tensor(x.numpy()[half]), graphc.tensor(y.numpy()[half])


def train(kind, opt_name, bucket_cap_mb=None, backend="cpu", passes=None, steps=5):
    """Parameters after `steps` DDP steps, and the compiled step's final graph."""
    model, run, x, y = make(kind, opt_name, bucket_cap_mb, backend, passes)
    for _ in range(steps):
        run(x, y)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    if backend == "cpu":
        TRANSPORTS.update(transports(run.executable))
        FUSED_WAITS.update((kind, opt_name) for n in run.executable.graph.nodes
                           if n.op == "fused" and wait_bucket(n) is not None)
    return params, (None if backend is None else run.executable.graph)


TRANSPORTS: set[str] = set()  # how the compiled cpu steps' buckets were reduced
FUSED_WAITS: set[tuple] = set()  # (model, optimizer) of steps with a wait fused into its update


def transports(executable) -> set[str]:
    """"window" for buckets reduced through the node's shared memory, "mpi" for buckets
    reduced by MPI_Iallreduce (graphc.backends.cpu.collective_shm and .collective)."""
    kernels = executable.lowered.kernels
    found = set()
    if any(k.endswith("_all_reduce_start_window") for k in kernels):
        found.add("window")
    if any(k.endswith("_all_reduce_start") for k in kernels):
        found.add("mpi")
    return found


def worst(a, b):
    return max(float(np.abs(p - q).max() / (np.abs(q).max() + 1e-12)) for p, q in zip(a, b))


def equal():
    """Bucketed steps (several caps, interp and cpu, and eager buckets) give the parameters
    of the unbucketed compiled step."""
    done = []
    for kind in ("mlp", "lenet"):
        for opt_name in ("sgd", "adam"):
            reference, graph = train(kind, opt_name, passes=UNBUCKETED)
            assert "all_reduce_start" not in format_graph(graph)
            # SMALL: buckets of several gradients; None (DDP's default): on the window a
            # bucket per gradient, each wait fused with its update (fuse_waits)
            caps = (SMALL, None, 0.0) if (kind, opt_name) == ("lenet", "sgd") else (SMALL, None)
            for cap in caps:
                params, graph = train(kind, opt_name, cap)
                assert "all_reduce_start" in format_graph(graph)
                assert worst(params, reference) == 0.0, (kind, opt_name, cap)
            eager, _ = train(kind, opt_name, SMALL, backend=None)
            gap = worst(eager, reference)
            for cap in caps[::2]:  # SMALL, and 0.0 (one-gradient buckets: one-output waits)
                interp, _ = train(kind, opt_name, cap, backend="interp")
                gap = max(gap, worst(interp, reference))
            assert gap < 1e-6, (kind, opt_name, gap)
            done.append(f"{kind}/{opt_name} bucketed == unbucketed (interp, eager {gap:.1e})")
    return "; ".join(done) + (f"; {len(FUSED_WAITS)} of 4 steps with fused waits; buckets "
                              f"through {'+'.join(sorted(TRANSPORTS))}")


COMPUTE = ("matmul", "fused", "conv2d_weight_grad", "conv2d_input_grad", "max_pool2d_grad",
           "reduce_sum")


def ir():
    """The compiled LeNet step with a bucket per gradient: each bucket started before the last has
    backward compute between its start and its wait; waits come in start order; the bucket
    buffer stays live until its wait; the text round-trips."""
    _, graph = train("lenet", "sgd", 0.0, steps=1)  # a bucket per gradient
    text = format_graph(graph)
    assert format_graph(parse(text)) == text
    nodes = graph.nodes
    starts = [i for i, n in enumerate(nodes) if n.op == "all_reduce_start"]
    waits = [i for i, n in enumerate(nodes) if wait_bucket(n) is not None]
    assert len(starts) == 4 and len(waits) == len(starts), text
    assert max(starts) < min(waits), "a wait before the last start"
    # each one-gradient wait is fused with the update that reads it (fuse_waits)
    assert all(nodes[w].op == "fused" for w in waits), [nodes[w].op for w in waits]
    plan = graph.meta["memory_plan"]
    check_plan(graph, plan)
    n_compute = 0
    for k, (s, w) in enumerate(zip(starts, waits)):  # waits in start order
        assert wait_bucket(nodes[w]) is nodes[s].outputs[0], (k, nodes[s], nodes[w])
        compute = [n.op for n in nodes[s + 1:w] if n.op in COMPUTE]
        assert compute or k == len(starts) - 1, (k, [n.op for n in nodes[s + 1:w]])
        n_compute += len(compute)
        # the in-flight buffer is live (never lent to another value) from start to wait
        buf = plan.buffers[plan.buffer_of[nodes[s].outputs[0].name]]
        assert buf.start <= s and buf.end >= w, (buf, s, w)
    return f"ir: {len(starts)} buckets, {n_compute} compute nodes between starts and waits"


def eager_details():
    """Eager buckets: async all_reduce's Work, and a parameter the forward skips reported at
    the next forward as PyTorch does."""
    t = graphc.full((3,), float(dist.get_rank() + 1))
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    work.wait()
    assert t.tolist() == [1.5] * 3 and work.is_completed()

    class Skips(graphc.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = graphc.nn.Linear(4, 2), graphc.nn.Linear(4, 2)

        def forward(self, x):
            return self.used(x)

    model = DistributedDataParallel(Skips(), bucket_cap_mb=0)
    model(graphc.ones(3, 4)).sum().backward()
    try:
        model(graphc.ones(3, 4))
    except dist.DistributedError as err:
        assert "Expected to have finished reduction in the prior iteration" in str(err), err
        assert "2 parameter(s) received no gradient" in str(err), err
    else:
        raise AssertionError("an incomplete reduction went unreported")
    return "eager: async Work, unused parameters reported"


def raise_in_compiled():
    """Rank 1 raises between two compiled bucketed steps; rank 0 is in the next one."""
    _, run, x, y = make("lenet", "sgd", SMALL)
    for _ in range(3):
        run(x, y)
    if dist.get_rank() == 1:
        raise ValueError("rank 1 fails between compiled steps")
    run(x, y)
    return "unreachable"


def stale_window():
    """A step compiled for the window, run after destroy_process_group and a new process
    group whose window is too small for it: a clear error, not a write out of bounds."""
    def f(a):
        a2 = a * 2.0
        dist.all_reduce(a2, op=dist.ReduceOp.AVG)
        return a2 + 1.0

    step = graphc.compile(f, backend="cpu")
    x = graphc.tensor(np.ones(5000, np.float32))
    assert float(step(x).numpy()[0]) == 3.0
    dist.destroy_process_group()
    dist.init_process_group("mpi", timeout=60.0, pg_options={"node_window_bytes": 1024})
    try:
        step(x)
    except graphc.GraphcError as err:
        assert "this step was compiled for a shared-memory window of 2 ranks" in str(err), err
        return "stale: the step compiled for another window is refused"
    raise AssertionError("a step ran on a window too small for it")


def mismatched_steps():
    """After steady steps of two compiled DDP steps on both ranks, rank 0 runs the first and
    rank 1 the second: rank 0 reports it before any collective of its step runs."""
    _, run_a, xa, ya = make("lenet", "sgd", SMALL)
    _, run_b, xb, yb = make("mlp", "sgd", SMALL)
    for _ in range(3):
        run_a(xa, ya)
    for _ in range(3):
        run_b(xb, yb)
    if dist.get_rank() == 0:
        run_a(xa, ya)
    else:
        run_b(xb, yb)
    return "unreachable"


def direct():
    """Window buckets: a gradient the backward computes into a buffer of its own is written
    straight into the window (no pack kernel); a view, a graph input and a value the step
    also returns are packed there; all reduce to the right values, on every rank."""
    r = float(dist.get_rank())

    def f(a, b, c):
        made = a * 2.0 + r  # its own buffer: computed straight into the window
        flipped = (b * 3.0 + r).t()  # a transposed view: packed in tiles
        kept = c - r  # also returned: packed
        reduced = [collective.all_reduce(t, "avg") for t in (made, flipped, c, kept)]
        return (*reduced, kept * 1.0)  # c: a graph input, packed

    step = graphc.compile(f, backend="cpu")
    a = np.arange(300, dtype=np.float32).reshape(20, 15)
    b = np.arange(70, dtype=np.float32).reshape(7, 10)
    for _ in range(3):  # steps reuse the window: the fence keeps them apart
        c = np.full(9, 2.0 + r, np.float32)
        made, flipped, c_avg, kept, kept2 = step(graphc.tensor(a), graphc.tensor(b),
                                                 graphc.tensor(c))
        np.testing.assert_array_equal(made.numpy(), a * 2.0 + 0.5)
        np.testing.assert_array_equal(flipped.numpy(), (b * 3.0 + 0.5).T)
        np.testing.assert_array_equal(c_avg.numpy(), np.full(9, 2.5, np.float32))
        np.testing.assert_array_equal(kept.numpy(), np.full(9, 2.0, np.float32))
        np.testing.assert_array_equal(kept2.numpy(), np.full(9, 2.0, np.float32))
    kernels = step.executable.lowered.kernels
    packs = sum(k.endswith("_bucket_pack") for k in kernels)
    fence = next(i for i, k in enumerate(kernels) if k.endswith("_window_fence"))
    assert "window" in transports(step.executable) and packs == 3, kernels
    assert fence < min(i for i, k in enumerate(kernels) if k.endswith("_bucket_pack")), kernels
    # DDP's default on the window: a bucket per gradient, where they all fit
    assert dist.node_window_fits(255, 4096) and not dist.node_window_fits(256, 4096)
    assert not dist.node_window_fits(1, 2**40)
    for kind in ("mlp", "lenet"):  # the models' gradients: every one written in place
        _, run, x, y = make(kind, "sgd", SMALL)
        run(x, y)
        kernels = run.executable.lowered.kernels
        assert not any(k.endswith("_bucket_pack") for k in kernels), (kind, kernels)
        assert transports(run.executable) == {"window"}, kernels
        # every collective is a window bucket: the code checks the ranks agree, not MPI
        communicator = collective.communicator()
        assert communicator._pending is None and communicator._agreed is None
        assert run.executable._collectives in communicator.group.window.window.checked
    return ("direct: gradients written into the window, 3 packed (view, input, kept); "
            "no MPI agreement")


def fused_updates():
    """One-gradient buckets whose result an elementwise node reads are fused with it
    (graphc.passes.fuse_waits): a result the step also returns and one it does not; on the
    window one loop sums and updates, on the MPI path the wait runs, then the update."""
    r = float(dist.get_rank())

    def f(a, w):
        g = collective.all_reduce(a * 2.0 + r, "avg", bucket_cap=0)  # read by the update only
        h = collective.all_reduce(a * 3.0 + r, "avg", bucket_cap=0)  # also returned
        return w - g * 0.5, h * 2.0 + 1.0, h

    step = graphc.compile(f, backend="cpu")
    a = np.arange(300, dtype=np.float32).reshape(20, 15)
    w = np.linspace(-1.0, 1.0, 300, dtype=np.float32).reshape(20, 15)
    g, h = a * 2.0 + np.float32(0.5), a * 3.0 + np.float32(0.5)  # the averages, exact here
    for _ in range(3):
        updated, scaled, h_avg = step(graphc.tensor(a), graphc.tensor(w))
        np.testing.assert_array_equal(updated.numpy(), w - g * np.float32(0.5))
        np.testing.assert_array_equal(scaled.numpy(), h * np.float32(2.0) + np.float32(1.0))
        np.testing.assert_array_equal(h_avg.numpy(), h)
    graph = step.executable.graph
    fused = [n for n in graph.nodes if n.op == "fused" and wait_bucket(n) is not None]
    assert len(fused) == 2 and not any(n.op == "all_reduce_wait" for n in graph.nodes), \
        format_graph(graph)
    assert [len(n.outputs) for n in fused] == [1, 2], format_graph(graph)  # h kept, g not
    kernels = step.executable.lowered.kernels
    in_one_loop = sum(k.endswith("_all_reduce_wait_done") for k in kernels)
    via = "window" if in_one_loop == 2 else "mpi"
    assert in_one_loop in (0, 2) and transports(step.executable) == {via}, kernels
    return f"fused: 2 waits fused with their updates, through the {via}"


WINDOWS = {"equal": None, "equal-mpi": 0, "equal-mixed": 1024, "fused": None,
           "fused-mpi": 0}  # node_window_bytes


def main():
    mode = sys.argv[1]
    window = WINDOWS.get(mode)
    dist.init_process_group("mpi", timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 60.0,
                            pg_options=None if window is None else {"node_window_bytes": window})
    done = {"equal": equal, "equal-mpi": equal, "equal-mixed": equal, "ir": ir,
            "eager": eager_details, "raise": raise_in_compiled, "stale": stale_window,
            "mismatch": mismatched_steps, "direct": direct, "fused": fused_updates,
            "fused-mpi": fused_updates}[mode]()
    dist.barrier()
    if dist.get_rank() == 0:
        print("OK", done, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
