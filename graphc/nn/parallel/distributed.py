"""DistributedDataParallel: one model replica per rank, gradients averaged over the ranks.

As PyTorch's DDP: wrapping broadcasts rank 0's parameters and buffers to every rank; each
forward first broadcasts rank 0's buffers (`broadcast_buffers=True`, e.g. batch-norm
statistics); during backward, gradients are averaged over the ranks in buckets
(`bucket_cap_mb`, 25 by default; the first bucket 1 MiB), each bucket's allreduce starting
as soon as autograd has produced all its gradients, so communication overlaps the rest of
the backward. Ranks must run the same model on same-shaped batches: the collectives check
shapes first and report a mismatch. The state_dict of the wrapper has the `module.` prefix,
as in PyTorch.

Eager: a post-accumulate-grad hook per parameter feeds graphc.nn.parallel.reducer's buckets
(non-blocking MPI allreduces through mpi4py). Compiled (graphc.compile of a training step):
a tensor hook makes each gradient's averaging the graph op `all_reduce` (with the
`bucket_cap` attribute when `bucket_cap_mb` is given; without it, when every rank shares
this machine and the window has room for them, a bucket per gradient: WINDOW_BUCKET_CAP_MB),
and the compiler's bucketing pass
(graphc.passes.bucket) groups them into buckets whose reduction (through the node's
shared-memory window, or MPI_Iallreduce) the generated code starts right after the backward
produced them and waits for just before the optimizer update: the whole DDP step is one
native call per rank (docs/distributed.md).

`gradient_as_bucket_view=True` (PyTorch's keyword, default False): each `.grad` is a view
of its slot in the communication bucket, which the next backward overwrites, instead of a
tensor of its own. Eager: the Reducer's flat buffers. Compiled: the all_reduce nodes carry
`bucket_view`, and on the node's shared-memory window the step averages each bucket in
place in this rank's window bytes (which the backward wrote) and returns the `.grad`s as
views of them, so no separate `.grad` copy is written (graphc.backends.cpu.collective_shm;
elsewhere the `.grad`s are arrays of their own, as without the keyword). Before the window
goes away (destroy_process_group) such a `.grad` is copied out of it.
"""

from __future__ import annotations

import numpy as np

from graphc.autograd.grad_mode import no_grad
from graphc.nn.module import Module
from graphc.nn.parallel.reducer import Reducer

__all__ = ["DistributedDataParallel"]

DEFAULT_BUCKET_CAP_MB = 25.0  # PyTorch's
# Compiled steps whose ranks share one machine, when the window holds every gradient in a
# bucket of its own (at most 255 of them): a bucket per gradient. A bucket there costs
# no MPI call, only a meeting the other rank has usually passed already, and each
# gradient's sum is then followed by its optimizer update while it is still in cache (the
# MLP's 2-rank step: ~30 us, 3%, faster than one 1 MB bucket summed before all updates).
WINDOW_BUCKET_CAP_MB = 0.0


class DistributedDataParallel(Module):
    """Data parallelism over graphc.distributed's process group (see the module docstring)."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, **kwargs) -> None:
        import graphc.distributed as dist

        super().__init__()
        if bucket_cap_mb is not None and bucket_cap_mb < 0:
            raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb}")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.world_size = dist.get_world_size()
        self.bucket_cap_mb = bucket_cap_mb
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        with no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        params = [p for p in module.parameters() if p.requires_grad]
        cap = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.reducer = Reducer(params, int(cap * 2**20), self.gradient_as_bucket_view)
        # in a trace, the averaging is an all_reduce node per gradient (the compiler buckets)
        traced_cap = bucket_cap_mb
        if traced_cap is None and dist.node_window_fits(
                len(params), sum(p.numel() * p.element_size() for p in params)):
            traced_cap = WINDOW_BUCKET_CAP_MB
        attrs = {} if traced_cap is None else {"bucket_cap": int(traced_cap * 2**20)}
        if self.gradient_as_bucket_view:
            attrs["bucket_view"] = True
            dist.before_window_closes(_GradsOutOfWindow(params))
        self._handles = [p.register_hook(_TracedAverage(attrs)) for p in params]

    def forward(self, *args, **kwargs):
        import graphc.distributed as dist
        from graphc.dispatch import current_tracer

        if current_tracer() is None:
            self.reducer.check_finished()
        if self.broadcast_buffers and self.world_size > 1:
            with no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, src=0)
        return self.module(*args, **kwargs)


class _GradsOutOfWindow:
    """Called before the process group frees its shared-memory window: every parameter
    `.grad` that is a view of the window gets an array of its own, same values, in the same
    tensor (a compiled step's gradient_as_bucket_view `.grad`s would otherwise point at
    unmapped memory). Holds the parameters weakly."""

    def __init__(self, params: list) -> None:
        import weakref

        self.params = [weakref.ref(p) for p in params]

    def __call__(self, window_memory) -> None:
        for ref in self.params:
            p = ref()
            grad = None if p is None else p._grad
            if grad is not None and np.shares_memory(grad._data, window_memory):
                grad._data = grad._data.copy()


class _TracedAverage:
    """The tensor hook of a parameter: inside a trace, its gradient averaged over the ranks
    by the graph op `all_reduce` (autograd accumulates the result); eagerly nothing (the
    Reducer's buckets average `.grad` after accumulation)."""

    def __init__(self, attrs: dict) -> None:
        self.attrs = attrs

    def __call__(self, grad):
        if not grad.is_abstract:
            return None
        from graphc.ops.collective import all_reduce

        return all_reduce(grad.detach(), "avg", **self.attrs)
