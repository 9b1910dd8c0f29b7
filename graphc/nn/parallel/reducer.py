"""Reducer: eager DistributedDataParallel's gradient buckets, as PyTorch's Reducer.

Parameters are assigned to buckets in reverse registration order (roughly the order the
backward produces their gradients), one dtype per bucket, the first bucket up to 1 MiB and
the others up to `bucket_cap_mb` (a bucket closes once it holds at least its cap, as
PyTorch's `compute_bucket_assignment_by_size`). A post-accumulate-grad hook on every
parameter copies its `.grad` into its slot of the bucket's flat buffer; when a bucket has
all its gradients, its allreduce starts (non-blocking, `dist.all_reduce(async_op=True)`),
so communication overlaps the rest of the backward. Buckets start in index order on every
rank (a ready bucket waits for the earlier ones to start), as MPI needs the same order of
collectives everywhere. When the last bucket has started, the reducer waits for all of them
and writes each averaged gradient back into its parameter's `.grad`.

With `gradient_as_bucket_view=True` (PyTorch's keyword) each parameter's `.grad` becomes a
view of its slot in the bucket: once the gradient is in the bucket `.grad` is that view, and
the average is computed in the bucket itself, with no copy back; the next backward
overwrites it (a `.grad` kept from an earlier step changes with it, as in PyTorch).
`zero_grad()` (set_to_none) drops the view and the next backward makes it again;
`zero_grad(set_to_none=False)` zeroes the bucket's bytes in place.

A backward that leaves a bucket incomplete (a parameter that got no gradient) is reported at
the next forward, as PyTorch does without `find_unused_parameters`.

Only eager backward passes go through here: inside graphc.compile the gradients are
abstract and DDP's tensor hook makes each one an `all_reduce` node instead, which the
compiler's bucketing pass (graphc.passes.bucket) groups the same way.
"""

from __future__ import annotations

import numpy as np

FIRST_BUCKET_BYTES = 2**20  # PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES


class _Bucket:
    def __init__(self, params: list) -> None:
        self.params = params
        self.offsets, at = [], 0
        for p in params:
            self.offsets.append(at)
            at += p.numel()
        self.buffer = np.zeros(at, params[0].dtype.np)
        self.views = [self.buffer[start:start + p.numel()].reshape(tuple(p.shape))
                      for p, start in zip(params, self.offsets)]
        self.pending = len(params)
        self.work = None


class Reducer:
    """Buckets of a DDP model's parameters (see the module docstring)."""

    def __init__(self, params: list, bucket_cap_bytes: int,
                 gradient_as_bucket_view: bool = False) -> None:
        import graphc.distributed as dist

        self.world_size = dist.get_world_size()
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.buckets = _assign(params, bucket_cap_bytes)
        self.slot = {}
        for bucket in self.buckets:
            for k, p in enumerate(bucket.params):
                self.slot[id(p)] = (bucket, k)
        self.next_to_start = 0
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for b in self.buckets for p in b.params]

    def _ready(self, param) -> None:
        from graphc.dispatch import current_tracer

        grad = param.grad
        if grad is None or grad.is_abstract or current_tracer() is not None:
            return  # a trace: the all_reduce nodes do the work
        bucket, k = self.slot[id(param)]
        view = bucket.views[k]
        if grad.detach().numpy() is not view:  # else autograd accumulated into the view
            view[...] = grad.detach().numpy()
            if self.gradient_as_bucket_view:
                from graphc.tensor import Tensor

                param.grad = Tensor._wrap(view)
        bucket.pending -= 1
        while self.next_to_start < len(self.buckets) and \
                self.buckets[self.next_to_start].pending == 0:
            self._start(self.buckets[self.next_to_start])
            self.next_to_start += 1
        if self.next_to_start == len(self.buckets):
            self._finish()

    def _start(self, bucket: _Bucket) -> None:
        import graphc.distributed as dist
        from graphc.creation import from_numpy

        bucket.work = dist.all_reduce(from_numpy(bucket.buffer), dist.ReduceOp.SUM,
                                      async_op=True)

    def _finish(self) -> None:
        """Wait for every bucket, then write the averages into the parameters' `.grad` (with
        gradient_as_bucket_view, `.grad` is the bucket's view already: nothing to write)."""
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.buffer /= self.world_size
            if self.gradient_as_bucket_view:
                continue
            for p, view in zip(bucket.params, bucket.views):
                p.grad.detach().numpy()[...] = view
        self.reset()

    def reset(self) -> None:
        for bucket in self.buckets:
            bucket.pending, bucket.work = len(bucket.params), None
        self.next_to_start = 0

    def check_finished(self) -> None:
        """Raise if the previous backward left buckets without all their gradients."""
        import graphc.distributed as dist

        if any(b.pending < len(b.params) for b in self.buckets):  # begun, never finished
            waiting = sum(b.pending for b in self.buckets)
            for bucket in self.buckets:  # every rank started the same ones: complete them
                if bucket.work is not None:
                    bucket.work.wait()
            self.reset()
            raise dist.DistributedError(
                "Expected to have finished reduction in the prior iteration before starting a "
                f"new one: {waiting} parameter(s) received no gradient in the last backward "
                "(the forward did not use them), so their buckets were never reduced; make "
                "every parameter of the DistributedDataParallel module take part in the loss")


def _assign(params: list, bucket_cap_bytes: int) -> list[_Bucket]:
    """Buckets over `params` in reverse order, one dtype each, closed at their cap."""
    buckets: list[_Bucket] = []
    open_: dict = {}
    for p in reversed(params):
        key = p.dtype.name
        members, size = open_.get(key, ([], 0))
        members.append(p)
        size += p.numel() * p.dtype.itemsize
        first = not any(b.params[0].dtype.name == key for b in buckets)
        cap = min(bucket_cap_bytes, FIRST_BUCKET_BYTES) if first else bucket_cap_bytes
        if size >= cap:
            buckets.append(_Bucket(members))
            open_.pop(key, None)
        else:
            open_[key] = (members, size)
    buckets += [_Bucket(members) for members, _ in open_.values()]
    return buckets


__all__ = ["FIRST_BUCKET_BYTES", "Reducer"]
