"""Samplers: which indices a DataLoader draws, in what order, and how they are batched."""

from __future__ import annotations

from typing import Iterator, Sequence

from graphc.errors import ArgumentError

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler",
           "SubsetRandomSampler"]


class Sampler:
    """Yields dataset indices; subclasses define `__iter__` (and `__len__`)."""

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


def _permutation(n: int, generator) -> list[int]:
    from graphc.ops.random import Generator, randperm

    if generator is None:  # as PyTorch: a fresh generator seeded from the default stream
        from graphc.ops.random import default_generator, randint

        generator = Generator().manual_seed(
            int(randint(0, 2**62, (1,), generator=default_generator).item()))
    return randperm(n, generator=generator).tolist()


class RandomSampler(Sampler):
    """A random permutation of the indices (or `num_samples` drawn with replacement)."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator=None) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement="
                            f"{replacement}")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ArgumentError(f"num_samples should be a positive integer value, but got "
                                f"num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        if self.replacement:
            from graphc.ops.random import default_generator, randint

            drawn = randint(0, n, (self.num_samples,),
                            generator=self.generator or default_generator)
            return iter(drawn.tolist())
        order: list[int] = []
        while len(order) < self.num_samples:
            order += _permutation(n, self.generator)
        return iter(order[:self.num_samples])

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices: Sequence[int], generator=None) -> None:
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        return (self.indices[i] for i in _permutation(len(self.indices), self.generator))

    def __len__(self) -> int:
        return len(self.indices)


class BatchSampler(Sampler):
    """Groups the indices of `sampler` into lists of `batch_size` (the last one shorter
    unless `drop_last`)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ArgumentError(f"batch_size should be a positive integer value, but got "
                                f"batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ArgumentError(f"drop_last should be a boolean value, but got "
                                f"drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
