"""DistributedDataParallel: one model replica per rank, gradients averaged over the ranks.

As PyTorch's DDP: wrapping broadcasts rank 0's parameters and buffers to every rank; each
forward first broadcasts rank 0's buffers (`broadcast_buffers=True`, e.g. batch-norm
statistics); during backward, every parameter's gradient is averaged over the ranks as soon
as autograd produces it (a tensor hook per parameter, so communication starts while the rest
of the backward still runs on the later layers' inputs). Ranks must run the same model on
same-shaped batches: the collectives check shapes first and report a mismatch.
The state_dict of the wrapper has the `module.` prefix, as in PyTorch.

Compiled steps (graphc.compile) do not yet place the allreduce in the graph: a DDP model
inside graphc.compile raises a DistributedError that says so; train it eagerly.
"""

from __future__ import annotations

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
        with _no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
        self._handles = [p.register_hook(_average) for p in module.parameters()
                         if p.requires_grad]

    def forward(self, *args, **kwargs):
        import graphc.distributed as dist

        if self.broadcast_buffers and self.world_size > 1:
            with _no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, src=0)
        return self.module(*args, **kwargs)


def _average(grad):
    """The gradient averaged over the ranks (a new tensor; autograd accumulates it)."""
    import graphc.distributed as dist

    averaged = grad.detach().clone()
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
    return averaged


def _no_grad():
    from graphc.autograd.grad_mode import no_grad

    return no_grad()
