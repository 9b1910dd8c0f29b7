"""collective ops: communication between the ranks of a data-parallel job, as graph ops.

`all_reduce(x, op)` returns x reduced elementwise over every rank (op "sum", "avg", "max" or
"min"). It is an op like any other: it prints, parses, verifies and interprets, and the CPU
backend calls MPI from the generated code (graphc.backends.cpu.collective), so a whole DDP
training step stays one native call per rank. It is `effectful` (no pass merges or drops
two of them) and has no VJP (it is applied to gradients, inside the backward). An optional
`bucket_cap` attribute (bytes; DistributedDataParallel's `bucket_cap_mb`) tells the
bucketing pass how large a bucket it may join; `bucket_view=True`
(DistributedDataParallel's `gradient_as_bucket_view`) lets the result stay in the bucket's
memory (all_reduce_start carries it to the backend).

The bucketing pass (graphc.passes.bucket_allreduces) splits a bucket of all_reduces into a
pair that the scheduler can pull apart, with compute between:
- `all_reduce_start(x1, ..., xk, op)` packs the xi (any strides) one after the other into a
  flat buffer and starts reducing it over the ranks (MPI_Iallreduce, in place). Its value is
  the buffer *in flight*: only `all_reduce_wait` may read it. The reduction is the op's
  combiner: "avg" sums here and divides at the wait.
- `all_reduce_wait(b, op, shapes)` waits for the reduction of b (MPI_Wait) and returns it
  ("avg": divided by the world size), split back into one output per packed tensor with
  `shapes` (so a reduced gradient that the step returns can be written straight into its
  output array), or flat without. Reading b keeps its memory live, so the plan never
  reuses the buffer while the request is in flight.
Both are effectful, so every rank starts its buckets in the same order (plan_buffers keeps
effectful ops in program order). The interpreter runs the reduction, blocking, at the start.

A one-gradient wait may also be the first instruction of a `fused` body (its
`epilogue_anchor`: graphc.passes.fuse_waits puts it there), followed by the elementwise
optimizer update that reads the reduced gradient, so a backend renders the sum and the
update in one pass over memory (graphc.backends.cpu.collective_shm):

    %58: f32[256,784], %62: ..., %65: ... = fused[body=(("all_reduce_wait", (0,),
        (("op", "avg"), ("shapes", ((256, 784),)))), ("mul", ...), ...)](%bucket5, %m, %w)

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
COLLECTIVE_OPS = ("all_reduce", "all_reduce_start")  # the ops that each run a collective


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
    iallreduce: int = 0  # address of MPI_Iallreduce (0: unknown)
    test: int = 0  # address of MPI_Test
    timeout: float = 1800.0  # seconds a wait may take before the step fails


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


def _check_op(name: str, x: TensorType, op: str) -> None:
    if op not in REDUCE_OPS:
        raise ArgumentError(f"{where(name)}: op must be one of {REDUCE_OPS}, got {op!r}")
    if op == "avg" and not x.dtype.is_floating:
        raise DTypeError(f"{where(name)}: op 'avg' needs a floating tensor, got {x}")


def _all_reduce_infer(x: TensorType, op: str, bucket_cap: int | None = None,
                      bucket_view: bool = False) -> TensorType:
    _check_op("all_reduce", x, op)
    if bucket_cap is not None and bucket_cap < 0:
        raise ArgumentError(f"{where('all_reduce')}: bucket_cap must be >= 0 bytes, got "
                            f"{bucket_cap}")
    return x


def _all_reduce_kernel(x: np.ndarray, op: str, bucket_cap: int | None = None,
                       bucket_view: bool = False) -> np.ndarray:
    out = np.array(x, copy=True, order="C")
    communicator().allreduce(out, op)
    return out


register(OpDef("all_reduce", COLLECTIVE, ("x",), _all_reduce_infer, _all_reduce_kernel, None,
               attrs={"op": str, "bucket_cap": int, "bucket_view": bool}, effectful=True,
               doc="x reduced elementwise over every rank of the job (sum, avg, max, min)."))


def _combiner(op: str) -> str:
    """The reduction MPI runs for `op` ("avg" is a sum divided at the wait)."""
    return "sum" if op == "avg" else op


def _all_reduce_start_infer(*xs: TensorType, op: str, bucket_view: bool = False) -> TensorType:
    if not xs:
        raise ArgumentError(f"{where('all_reduce_start')}: expected at least one tensor")
    for x in xs:
        if x.dtype != xs[0].dtype:
            raise DTypeError(f"{where('all_reduce_start')}: a bucket holds one dtype, got "
                             f"{xs[0]} and {x}")
        _check_op("all_reduce_start", x, op)
    return TensorType((sum(x.numel for x in xs),), xs[0].dtype)


def _all_reduce_start_kernel(*xs: np.ndarray, op: str, bucket_view: bool = False) -> np.ndarray:
    bucket = np.concatenate([np.ravel(x) for x in xs]).astype(xs[0].dtype, copy=False)
    communicator("all_reduce_start").allreduce(bucket, _combiner(op))  # blocking, here
    return bucket


register(OpDef("all_reduce_start", COLLECTIVE, ("*xs",), _all_reduce_start_infer,
               _all_reduce_start_kernel, None, attrs={"op": str, "bucket_view": bool},
               effectful=True,
               doc="The xi packed into one flat buffer whose reduction over the ranks starts "
                   "(MPI_Iallreduce); only all_reduce_wait reads it."))


def _all_reduce_wait_infer(bucket: TensorType, op: str,
                           shapes: tuple | None = None) -> TensorType | tuple[TensorType, ...]:
    _check_op("all_reduce_wait", bucket, op)
    if bucket.ndim != 1:
        raise ArgumentError(f"{where('all_reduce_wait')}: expected the flat buffer of an "
                            f"all_reduce_start, got {bucket}")
    if shapes is None:
        return bucket
    pieces = tuple(TensorType(tuple(shape), bucket.dtype) for shape in shapes)
    if not pieces or sum(t.numel for t in pieces) != bucket.numel:
        raise ArgumentError(f"{where('all_reduce_wait')}: shapes {shapes} must split the "
                            f"bucket's {bucket.numel} elements, one shape per packed tensor")
    return pieces[0] if len(pieces) == 1 else pieces  # one output: its type, as other ops


def _all_reduce_wait_kernel(bucket: np.ndarray, op: str, shapes: tuple | None = None):
    if op == "avg":
        bucket = bucket / np.asarray(communicator("all_reduce_wait").world_size, bucket.dtype)
    else:
        bucket = np.array(bucket, copy=True)
    if shapes is None:
        return bucket
    ends = np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1]
    pieces = tuple(piece.reshape(shape) for piece, shape in zip(np.split(bucket, ends), shapes))
    return pieces[0] if len(pieces) == 1 else pieces  # one output: the array, as other ops


register(OpDef("all_reduce_wait", COLLECTIVE, ("bucket",), _all_reduce_wait_infer,
               _all_reduce_wait_kernel, None, attrs={"op": str, "shapes": tuple},
               effectful=True, epilogue_anchor=True,
               doc="The reduction an all_reduce_start began, once complete (MPI_Wait); 'avg' "
                   "divides by the world size. With `shapes`, one output per packed tensor "
                   "(the bucket split back), else the flat buffer."))


def all_reduce(x, op: str = "sum", bucket_cap: int | None = None, bucket_view: bool = False):
    """`x` reduced elementwise over every rank (a new tensor; graph op `all_reduce`);
    `bucket_cap`: the bytes of the bucket the bucketing pass may put it in; `bucket_view`:
    the result may stay in the bucket's memory (DDP's gradient_as_bucket_view)."""
    attrs = {} if bucket_cap is None else {"bucket_cap": bucket_cap}
    if bucket_view:
        attrs["bucket_view"] = True
    return call("all_reduce", x, op=op, **attrs)


# graphc.distributed.all_reduce is the public, torch.distributed-shaped entry point
PUBLIC: tuple[str, ...] = ()
TENSOR_METHODS: dict = {}
__all__ = ["COLLECTIVE_OPS", "Communicator", "NativeMpi", "REDUCE_OPS", "all_reduce",
           "communicator", "set_communicator"]
