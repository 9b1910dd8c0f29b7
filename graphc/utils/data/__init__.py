"""graphc.utils.data: datasets, samplers and the DataLoader, with PyTorch's semantics.

    >>> import graphc
    >>> from graphc.utils.data import DataLoader, TensorDataset
    >>> data = TensorDataset(graphc.arange(10.0), graphc.arange(10) % 2)
    >>> [tuple(x.shape) for x, y in DataLoader(data, batch_size=4)]
    [(4,), (4,), (2,)]

Shuffling draws from graphc's generators (`graphc.Generator`, `graphc.manual_seed`), so an
order is reproducible in graphc; it is not PyTorch's order for the same seed (the two
libraries' random streams differ).
"""

from graphc.utils.data.dataloader import DataLoader, default_collate
from graphc.utils.data.dataset import (
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from graphc.utils.data.distributed import DistributedSampler
from graphc.utils.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)

__all__ = ["BatchSampler", "ConcatDataset", "DataLoader", "Dataset", "DistributedSampler",
           "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler", "Subset",
           "SubsetRandomSampler", "TensorDataset", "default_collate", "random_split"]
