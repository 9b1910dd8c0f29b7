"""DataLoader: batches of samples from a dataset, with PyTorch's arguments and semantics.

`DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
num_workers=0, collate_fn=None, ..., drop_last=False, generator=None)`. Samples are loaded in
the calling process: `num_workers` is accepted for PyTorch programs and changes nothing in
the results (they are the same as PyTorch's with num_workers=0), only in where the loading
runs; `pin_memory` has no meaning without a GPU and is accepted likewise.

`default_collate` stacks tensors and numpy arrays into a tensor, turns numbers into a tensor,
and recurses into tuples, lists, named tuples and dicts, as PyTorch's does.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Iterator

import numpy as np

from graphc.errors import ArgumentError
from graphc.utils.data.dataset import IterableDataset
from graphc.utils.data.sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "default_collate"]


def default_collate(batch: list) -> Any:
    """One batch from a list of samples (see the module docstring)."""
    import graphc
    from graphc.tensor import Tensor

    first = batch[0]
    if isinstance(first, Tensor):
        return graphc.stack(list(batch), 0)
    if isinstance(first, np.ndarray):
        if first.dtype.kind in "OSU":
            raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, "
                            f"numbers, dicts or lists; found {first.dtype}")
        return graphc.as_tensor(np.stack(batch))
    if isinstance(first, np.generic):
        return graphc.as_tensor(np.array(batch))
    if isinstance(first, bool):
        return graphc.tensor(batch)
    if isinstance(first, float):
        return graphc.tensor(batch, dtype=graphc.float64)
    if isinstance(first, int):
        return graphc.tensor(batch)
    if isinstance(first, (str, bytes)):
        return batch
    if isinstance(first, collections.abc.Mapping):
        collated = {k: default_collate([d[k] for d in batch]) for k in first}
        try:
            return type(first)(collated)  # dict, OrderedDict, ... keep their type
        except TypeError:
            return collated
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a named tuple
        return type(first)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(first, collections.abc.Sequence):
        if any(len(s) != len(first) for s in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        # one batch per position; a list, for tuples too, as PyTorch
        return [default_collate(list(s)) for s in zip(*batch)]
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, "
                    f"dicts or lists; found {type(first)}")


class DataLoader:
    """Iterates over `dataset` in batches (see the module docstring).

    >>> import graphc
    >>> from graphc.utils.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(graphc.arange(5.0)), batch_size=2, drop_last=True)
    >>> len(loader), [b[0].tolist() for b in loader]
    (2, [[0.0, 1.0], [2.0, 3.0]])
    """

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler=None, batch_sampler=None, num_workers: int = 0,
                 collate_fn: Callable | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None,
                 persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True) -> None:
        if num_workers < 0:
            raise ArgumentError("num_workers option should be non-negative; use "
                                "num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ArgumentError("timeout option should be non-negative")
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.generator = generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (None, False):
                raise ArgumentError(f"DataLoader with IterableDataset: expected unspecified "
                                    f"shuffle option, but got shuffle={shuffle}")
            if sampler is not None or batch_sampler is not None:
                raise ArgumentError("DataLoader with IterableDataset: expected unspecified "
                                    "sampler and batch_sampler options")
        if sampler is not None and shuffle:
            raise ArgumentError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ArgumentError("batch_sampler option is mutually exclusive with "
                                    "batch_size, shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ArgumentError("batch_size=None option disables auto-batching and is "
                                "mutually exclusive with drop_last")
        if sampler is None and not self._iterable:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or (default_collate if batch_size is not None or
                                         batch_sampler is not None else _identity)

    def __iter__(self) -> Iterator:
        if self._iterable:
            yield from self._iterate_stream()
        elif self.batch_sampler is not None:
            for indices in self.batch_sampler:
                yield self.collate_fn([self.dataset[i] for i in indices])
        else:
            for index in self.sampler:
                yield self.collate_fn(self.dataset[index])

    def _iterate_stream(self) -> Iterator:
        if self.batch_size is None:
            for sample in self.dataset:
                yield self.collate_fn(sample)
            return
        batch: list = []
        for sample in self.dataset:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)


def _identity(sample):
    return sample
