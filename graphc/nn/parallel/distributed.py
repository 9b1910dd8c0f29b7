"""DistributedDataParallel: one model replica per rank, gradients averaged over the ranks.

As PyTorch's DDP: wrapping broadcasts rank 0's parameters and buffers to every rank; each
forward first broadcasts rank 0's buffers (`broadcast_buffers=True`, e.g. batch-norm
statistics); during backward, every parameter's gradient is averaged over the ranks as soon
as autograd produces it (a tensor hook per parameter, so communication starts while the rest
of the backward still runs on the later layers' inputs). Ranks must run the same model on
same-shaped batches: the collectives check shapes first and report a mismatch.
The state_dict of the wrapper has the `module.` prefix, as in PyTorch.

The averaging is the graph op `all_reduce` (graphc.ops.collective): eagerly it calls MPI
through mpi4py; in a compiled training step it is a node of the step's graph, which the cpu
backend lowers to an MPI_Allreduce call made by the generated code, so the whole DDP step is
one native call per rank. Each gradient is reduced where the backward produces it; buckets
and non-blocking overlap are not done yet (docs/distributed.md).
"""

from __future__ import annotations

from graphc.autograd.grad_mode import no_grad
from graphc.nn.module import Module

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(Module):
    """Data parallelism over graphc.distributed's process group (see the module docstring)."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, **kwargs) -> None:
        import graphc.distributed as dist

        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.world_size = dist.get_world_size()
        with no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        self._handles = [p.register_hook(_average) for p in module.parameters()
                         if p.requires_grad]

    def forward(self, *args, **kwargs):
        import graphc.distributed as dist

        if self.broadcast_buffers and self.world_size > 1:
            with no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, src=0)
        return self.module(*args, **kwargs)


def _average(grad):
    """The gradient averaged over the ranks (a new tensor; autograd accumulates it): the
    graph op `all_reduce`, so a compiled step carries it too."""
    from graphc.ops.collective import all_reduce

    return all_reduce(grad.detach(), "avg")

