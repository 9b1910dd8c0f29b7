"""collective ops: communication between the ranks of a data-parallel job, as graph ops.

`all_reduce(x, op)` returns x reduced elementwise over every rank (op "sum", "avg", "max" or
"min"). It is an op like any other: it prints, parses, verifies and interprets, and the CPU
backend calls MPI from the generated code (graphc.backends.cpu.collective), so a whole DDP
training step stays one native call per rank. It is `effectful` (no pass merges or drops
two of them) and has no VJP (it is applied to gradients, inside the backward).

The ops package never imports MPI: graphc.distributed installs a `Communicator` here when
`init_process_group` runs (`set_communicator`), as graphc.dispatch installs the dispatch
point. Its `allreduce(array, op)` reduces a numpy array in place (the reference kernel and
eager mode use it); `native()` describes the MPI entry point and handles generated code
calls, or is None where the MPI's ABI is not one graphc knows (the CPU backend then refuses
the op with the reason); `agree(what, signature)` checks that every rank is about to run
the same collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from graphc.errors import ArgumentError, DTypeError, GraphcError, where
from graphc.ops.registry import COLLECTIVE, OpDef, call, register
from graphc.types import TensorType

REDUCE_OPS = ("sum", "avg", "max", "min")


@dataclass(frozen=True)
class NativeMpi:
    """What generated code needs to call MPI_Allreduce itself (MPICH's ABI: 32-bit handles,
    MPI_IN_PLACE = (void*)-1)."""

    allreduce: int  # address of MPI_Allreduce
    in_place: int
    comm: int
    datatypes: dict  # "float32"/"float64" -> handle
    ops: dict  # "sum"/"max"/"min" -> handle
    world_size: int


class Communicator(Protocol):
    world_size: int
    rank: int

    def allreduce(self, array: np.ndarray, op: str) -> None: ...

    def agree(self, what: str, signature: tuple) -> None: ...

    def native(self) -> NativeMpi | None: ...


_communicator: Communicator | None = None


def set_communicator(communicator: Communicator | None) -> Communicator | None:
    """Install the job's communicator (graphc.distributed does); returns the previous one."""
    global _communicator
    previous, _communicator = _communicator, communicator
    return previous


def communicator(op: str = "all_reduce") -> Communicator:
    """The installed communicator, or a clear error naming the op when there is none."""
    if _communicator is None:
        raise GraphcError(f"{where(op)}: no process group: call "
                          "graphc.distributed.init_process_group() first (and launch the job "
                          "with graphc launch or mpirun)")
    return _communicator


def _all_reduce_infer(x: TensorType, op: str) -> TensorType:
    if op not in REDUCE_OPS:
        raise ArgumentError(f"{where('all_reduce')}: op must be one of {REDUCE_OPS}, got {op!r}")
    if op == "avg" and not x.dtype.is_floating:
        raise DTypeError(f"{where('all_reduce')}: op 'avg' needs a floating tensor, got {x}")
    return x


def _all_reduce_kernel(x: np.ndarray, op: str) -> np.ndarray:
    out = np.array(x, copy=True, order="C")
    communicator().allreduce(out, op)
    return out


register(OpDef("all_reduce", COLLECTIVE, ("x",), _all_reduce_infer, _all_reduce_kernel, None,
               attrs={"op": str}, effectful=True,
               doc="x reduced elementwise over every rank of the job (sum, avg, max, min)."))


def all_reduce(x, op: str = "sum"):
    """`x` reduced elementwise over every rank (a new tensor; graph op `all_reduce`)."""
    return call("all_reduce", x, op=op)


# graphc.distributed.all_reduce is the public, torch.distributed-shaped entry point
PUBLIC: tuple[str, ...] = ()
TENSOR_METHODS: dict = {}
__all__ = ["Communicator", "NativeMpi", "REDUCE_OPS", "all_reduce", "communicator",
           "set_communicator"]
