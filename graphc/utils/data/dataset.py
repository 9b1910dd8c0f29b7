"""Datasets: map-style (`__getitem__` + `__len__`) and iterable, with PyTorch's semantics."""

from __future__ import annotations

import bisect
import math
from typing import Any, Iterator, Sequence

from graphc.errors import ArgumentError

__all__ = ["ConcatDataset", "Dataset", "IterableDataset", "Subset", "TensorDataset",
           "random_split"]


class Dataset:
    """A map-style dataset: `dataset[i]` is sample i. Subclasses define `__getitem__` (and
    `__len__` for samplers that need it); `a + b` concatenates."""

    def __getitem__(self, index) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset that is a stream: subclasses define `__iter__`; the DataLoader batches what
    it yields (no sampler, no shuffle)."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class TensorDataset(Dataset):
    """Sample i is `tuple(t[i] for t in tensors)`; every tensor has the same first size."""

    def __init__(self, *tensors) -> None:
        if any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            raise ArgumentError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of `dataset` at `indices`, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index):
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Datasets one after another."""

    def __init__(self, datasets) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ArgumentError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise ArgumentError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = []
        total = 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int):
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index += len(self)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = 0 if which == 0 else self.cumulative_sizes[which - 1]
        return self.datasets[which][index - start]


def random_split(dataset: Dataset, lengths: Sequence[int | float], generator=None) -> list:
    """Split `dataset` into non-overlapping random subsets of the given lengths (counts, or
    fractions summing to 1, as PyTorch: the remainder goes round-robin to the first ones)."""
    from graphc.ops.random import default_generator, randperm

    n = len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts = [int(math.floor(n * frac)) for frac in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if sum(lengths) != n:
        raise ArgumentError("Sum of input lengths does not equal the length of the input "
                            "dataset!")
    order = randperm(n, generator=generator or default_generator).tolist()
    subsets, offset = [], 0
    for length in lengths:
        subsets.append(Subset(dataset, order[offset:offset + length]))
        offset += length
    return subsets
