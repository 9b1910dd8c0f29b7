"""Run under `mpiexec -n 2 python tests/distributed/bucket_view.py MODE`: one scenario of
tests/test_distributed_bucket_view.py per MODE (DistributedDataParallel's
gradient_as_bucket_view, eager and compiled). Prints `OK <details>` on rank 0 when the
scenario holds."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker import data, lenet, mlp  # noqa: E402

import graphc  # noqa: E402
import graphc.distributed as dist  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.nn.parallel import DistributedDataParallel  # noqa: E402


def make(kind, opt_name, view, backend="cpu", set_to_none=True, bucket_cap_mb=None):
    """A DDP step (compiled, or eager with backend None) and this rank's half of the batch;
    set_to_none None: no zero_grad at all (gradients accumulate over the steps)."""
    graphc.manual_seed(1)
    model = DistributedDataParallel(mlp() if kind == "mlp" else lenet(),
                                    gradient_as_bucket_view=view, bucket_cap_mb=bucket_cap_mb)
    opt = (graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd"
           else graphc.optim.Adam(model.parameters(), lr=0.01))

    def step(x, y):
        if set_to_none is not None:
            opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    run = step if backend is None else graphc.compile(step, backend=backend)
    x, y = data(kind)
    half = slice(32 * dist.get_rank(), 32 * (dist.get_rank() + 1))
    return model, opt, run, graphc.tensor(x.numpy()[half]), graphc.tensor(y.numpy()[half])


def window_memory():
    """This rank's segment of the process group's shared-memory window (None without)."""
    open_window = dist._group.window  # the test looks inside on purpose
    return None if open_window is None else open_window.memory


def bucket_memory(model, backend):
    """Where the `.grad`s of a view model must lie: the window (compiled), the reducer's
    buckets (eager)."""
    if backend is None:
        return [b.buffer for b in model.reducer.buckets]
    return [window_memory()]


def in_memory(array, memories) -> bool:
    return any(np.shares_memory(array, m) for m in memories)


def train(kind, opt_name, view, backend, steps=5, set_to_none=True, bucket_cap_mb=None):
    model, opt, run, x, y = make(kind, opt_name, view, backend, set_to_none, bucket_cap_mb)
    losses = [run(x, y).item() for _ in range(steps)]
    return model, opt, run, x, y, losses


def values():
    """For both models and optimizers, compiled (cpu, through the window) and eager: the
    parameters, losses, `.grad`s and state_dict of a gradient_as_bucket_view model are those
    of the default model bit for bit; its `.grad`s are views of the bucket memory, and a
    `.grad` kept from one step holds the next step's gradient after it, as in PyTorch."""
    done = []
    in_place = 0
    for kind in ("mlp", "lenet"):
        for opt_name in ("sgd", "adam"):
            for backend in ("cpu", None):
                base, _, _, _, _, base_losses = train(kind, opt_name, False, backend)
                model, _, run, x, y, losses = train(kind, opt_name, True, backend)
                assert losses == base_losses, (kind, opt_name, backend, losses, base_losses)
                for (name, p), q in zip(model.named_parameters(), base.parameters()):
                    np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(),
                                                  err_msg=f"{kind} {opt_name} {name}")
                    np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(),
                                                  err_msg=f"{kind} {opt_name} {name}.grad")
                    assert in_memory(p.grad.numpy(), bucket_memory(model, backend)), name
                    assert not in_memory(q.grad.numpy(), bucket_memory(model, backend)), name
                states = model.state_dict(), base.state_dict()
                assert list(states[0]) == list(states[1])
                for key in states[0]:
                    np.testing.assert_array_equal(states[0][key].numpy(),
                                                  states[1][key].numpy())
                kept = [p.grad for p in model.parameters()]
                before = [g.numpy().copy() for g in kept]
                x2 = graphc.tensor(x.numpy()[::-1].copy())  # another batch: other gradients
                run(x2, y)
                for g, old, p in zip(kept, before, model.parameters()):
                    np.testing.assert_array_equal(g.numpy(), p.grad.numpy())
                    assert not np.array_equal(g.numpy(), old)
                if backend == "cpu":
                    kernels = run.executable.lowered.kernels
                    in_place += sum(k.endswith("_all_reduce_wait_view") for k in kernels)
                done.append(f"{kind}/{opt_name}/{'cpu' if backend else 'eager'}")
    return (f"values: {len(done)} view steps equal the default ones bit for bit, .grad in "
            f"the buckets and overwritten by the next step; {in_place} fused in-place waits")


def zero_grad():
    """Eager, as PyTorch: zero_grad(set_to_none=False) zeroes the bucket views in place
    (`.grad` stays a view); zero_grad() drops them and the next backward makes them views
    again. Compiled, a step that zeroes `.grad` in place (set_to_none=False) updates arrays
    of its own, with the default model's values bit for bit."""
    model, opt, run, x, y, _ = train("mlp", "sgd", True, None, steps=2, set_to_none=False)
    views = [p.grad.numpy() for p in model.parameters()]
    opt.zero_grad(set_to_none=False)
    for p, v in zip(model.parameters(), views):
        assert np.shares_memory(p.grad.numpy(), v) and not p.grad.numpy().any()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    run(x, y)
    memories = bucket_memory(model, None)
    assert all(in_memory(p.grad.numpy(), memories) for p in model.parameters())
    for kind in ("mlp", "lenet"):
        model, *_, losses = train(kind, "sgd", True, "cpu", set_to_none=False)
        base, *_, base_losses = train(kind, "sgd", False, "cpu", set_to_none=False)
        assert losses == base_losses
        for p, q in zip(model.parameters(), base.parameters()):
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    return "zero_grad: set_to_none=False zeroes the views in place; set_to_none drops them"


def accumulate():
    """Steps that accumulate into `.grad` (no zero_grad): the first returns views of its
    window region, the next read them as `.grad` inputs while writing their own buckets;
    every step's values are the default model's bit for bit, eager and compiled."""
    for backend in ("cpu", None):
        model, *_, losses = train("mlp", "sgd", True, backend, steps=4, set_to_none=None)
        base, *_, base_losses = train("mlp", "sgd", False, backend, steps=4, set_to_none=None)
        assert losses == base_losses, (backend, losses, base_losses)
        for p, q in zip(model.parameters(), base.parameters()):
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    return "accumulate: gradients accumulated over steps equal the default's"


def outlive():
    """destroy_process_group copies the compiled `.grad` views out of the window first: the
    tensors keep their values (and the memory is no longer the window's)."""
    model, _, _, _, _, _ = train("mlp", "sgd", True, "cpu", steps=2)
    grads = [p.grad for p in model.parameters()]
    values_ = [g.numpy().copy() for g in grads]
    memory = window_memory()
    assert all(np.shares_memory(g.numpy(), memory) for g in grads)
    dist.barrier()
    dist.destroy_process_group()
    for g, v in zip(grads, values_):
        assert not np.shares_memory(g.numpy(), memory)
        np.testing.assert_array_equal(g.numpy(), v)
    dist.init_process_group("mpi")
    return "outlive: .grad views copied out of the window when the group is destroyed"


def shared():
    """Buckets of several gradients (bucket_cap_mb: plain waits, the updates apart) average
    in place too; and two view models trained in turn keep their own `.grad`s (each
    executable's region is its own: the other model's step does not overwrite them)."""
    for opt_name in ("sgd", "adam"):
        model, *_, losses = train("lenet", opt_name, True, "cpu", bucket_cap_mb=0.0005)
        base, *_, base_losses = train("lenet", opt_name, False, "cpu", bucket_cap_mb=0.0005)
        assert losses == base_losses
        for p, q in zip(model.parameters(), base.parameters()):
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
            assert in_memory(p.grad.numpy(), [window_memory()])
    a, _, run_a, x, y, _ = train("mlp", "sgd", True, "cpu", steps=1)
    b, _, run_b, _, _, _ = train("mlp", "adam", True, "cpu", steps=1)
    kept = [p.grad.numpy().copy() for p in a.parameters()]
    run_b(x, y)
    run_b(x, y)
    for p, g in zip(a.parameters(), kept):
        np.testing.assert_array_equal(p.grad.numpy(), g)
    return "shared: several gradients per view bucket; two view models keep their .grads"


def values_mpi():
    """Without the window (node_window_bytes=0: MPI_Iallreduce) the keyword changes nothing
    in a compiled step: the default's values bit for bit, `.grad`s of their own."""
    assert window_memory() is None
    for opt_name in ("sgd", "adam"):
        model, *_, losses = train("lenet", opt_name, True, "cpu")
        base, *_, base_losses = train("lenet", opt_name, False, "cpu")
        assert losses == base_losses
        for p, q in zip(model.parameters(), base.parameters()):
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    return "values-mpi: the default's values through MPI_Iallreduce"


def misplaced():
    """A rank whose window regions differ from the others' (here: rank 1 reserved one more
    before compiling) fails its view step at the first meeting, naming the mismatch,
    instead of summing the wrong bytes."""
    if dist.get_rank() == 1:
        dist._group.window.window.reserve(4096)  # the test misplaces rank 1 on purpose
    train("mlp", "sgd", True, "cpu", steps=2)
    return "misplaced: not detected"


def main():
    mode = sys.argv[1]
    dist.init_process_group("mpi", timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 60.0,
                            pg_options={"node_window_bytes": 0} if mode == "values-mpi"
                            else None)
    done = {"values": values, "zero_grad": zero_grad, "outlive": outlive,
            "accumulate": accumulate, "values-mpi": values_mpi, "misplaced": misplaced,
            "shared": shared}[mode]()
    dist.barrier()
    if dist.get_rank() == 0:
        print("OK", done, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
