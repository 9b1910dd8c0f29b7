"""graphc.nn.parallel: DistributedDataParallel, as torch.nn.parallel."""

from graphc.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
