"""DistributedSampler: each rank of a data-parallel job reads its own share of the data."""

from __future__ import annotations

import math
from typing import Iterator

from graphc.errors import ArgumentError
from graphc.utils.data.sampler import Sampler

__all__ = ["DistributedSampler"]


class DistributedSampler(Sampler):
    """Rank `rank` of `num_replicas` gets every num_replicas-th index of one (shuffled, with
    seed + epoch) order, padded by repeating its start so every rank gets as many
    (`drop_last=False`) or cut to a multiple of num_replicas (`drop_last=True`), as PyTorch.
    Call `set_epoch(epoch)` before each epoch so the shuffle changes. `num_replicas` and
    `rank` default to the process group's (graphc.distributed)."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None or rank is None:
            world, me = _group()
            num_replicas = world if num_replicas is None else num_replicas
            rank = me if rank is None else rank
        if rank >= num_replicas or rank < 0:
            raise ArgumentError(f"Invalid rank {rank}, rank should be in the interval "
                                f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        if self.shuffle:
            from graphc.ops.random import Generator, randperm

            indices = randperm(n, generator=Generator().manual_seed(self.seed + self.epoch))
            indices = indices.tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            while padding > 0:
                indices += indices[:padding]
                padding = self.total_size - len(indices)
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration shuffles for (all ranks must agree)."""
        self.epoch = epoch


def _group() -> tuple[int, int]:
    try:
        from graphc import distributed
    except ImportError:
        distributed = None
    if distributed is None or not distributed.is_initialized():
        raise ArgumentError("DistributedSampler: Default process group has not been "
                            "initialized, please make sure to call init_process_group "
                            "(graphc.distributed), or pass num_replicas and rank")
    return distributed.get_world_size(), distributed.get_rank()
