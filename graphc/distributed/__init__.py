"""graphc.distributed: data-parallel training over MPI, with torch.distributed's names.

    import graphc.distributed as dist
    dist.init_process_group(backend="mpi")      # rank and world size come from MPI
    dist.all_reduce(t, op=dist.ReduceOp.SUM)    # in place, on every rank

Launch with `graphc launch -n 2 script.py` or `mpirun -n 2 python script.py`. MPI comes from
mpi4py with an MPI built from pip (`pip install graphc[distributed]`: mpi4py and mpich);
importing graphc, or this module, never loads MPI: `init_process_group` does.

Collectives work on tensors in place (all_reduce, broadcast) or into given tensors
(all_gather, reduce_scatter), in the calling rank's order; every rank must call them in the
same order with the same shapes and dtypes, as with any MPI program. A collective whose
shapes differ across ranks is detected and reported before any data moves (each collective
first agrees on a small header). A collective waits at most the group's timeout for the
other ranks, then aborts the job with an error naming the rank; an exception that escapes
on one rank aborts the whole job (MPI_Abort), so the other ranks fail at once instead of
waiting forever (see `init_process_group`).
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import os
import sys
import time
from typing import Any

import numpy as np

from graphc.autograd.grad_mode import no_grad
from graphc.errors import GraphcError

__all__ = ["DistributedError", "ReduceOp", "Work", "all_gather", "all_reduce", "barrier",
           "broadcast", "destroy_process_group", "get_rank", "get_world_size",
           "init_process_group", "is_available", "is_initialized", "reduce_scatter",
           "node_window_fits"]


class DistributedError(GraphcError, RuntimeError):
    """A collective could not run: no process group, or ranks that disagree."""


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MAX = "max"
    MIN = "min"


class _Group:
    def __init__(self, comm, timeout: float) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout  # seconds a collective may wait for the other ranks
        self.window = None  # node_window.OpenWindow: the ranks' shared memory, if they share


DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # as torch.distributed's default


_group: _Group | None = None


def is_available() -> bool:
    """Whether mpi4py can be imported (the `distributed` extra is installed)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise DistributedError("graphc.distributed needs mpi4py and an MPI: pip install "
                               "'graphc[distributed]' (mpi4py and mpich from pip)") from None
    return MPI


def init_process_group(backend: str | None = "mpi", init_method: str | None = None,
                       timeout: Any = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None) -> None:
    """Join the job's process group. Only `backend="mpi"` (or None) exists; rank and world
    size come from MPI (`world_size`/`rank`, when given, must agree with it). A collective
    that waits longer than `timeout` (a timedelta or seconds; default 30 minutes) for the
    other ranks raises DistributedError and aborts the job; so does an uncaught exception
    on any rank, naming the rank. When every rank runs on this machine, compiled steps
    reduce their gradient buckets through a shared-memory window opened here
    (graphc.distributed.node_window); `pg_options={"node_window_bytes": N}` sizes it per rank
    (default 64 MiB of address space; 0: no window, buckets go through MPI_Iallreduce)."""
    global _group
    if backend not in (None, "mpi"):
        raise DistributedError(f"init_process_group: backend {backend!r} is not available; "
                               "graphc's backend is \"mpi\" (launch with graphc launch or "
                               "mpirun)")
    if _group is not None:
        raise DistributedError("trying to initialize the default process group twice!")
    MPI = _mpi()
    if timeout is None:
        timeout = DEFAULT_TIMEOUT
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) \
        else float(timeout)
    group = _Group(MPI.COMM_WORLD, seconds)
    if world_size not in (-1, group.size) or rank not in (-1, group.rank):
        raise DistributedError(f"init_process_group: world_size={world_size}, rank={rank} "
                               f"disagree with MPI's world of {group.size} (this is rank "
                               f"{group.rank}); leave them out")
    from graphc.distributed import node_window

    group.window = node_window.open_window(MPI, group.comm, _window_bytes(pg_options))
    _group = group
    _install_abort_on_error(MPI)
    from graphc.ops import collective

    collective.set_communicator(_MpiCommunicator(group))


def _window_bytes(pg_options) -> int:
    """pg_options={"node_window_bytes": N}: the shared-memory window per rank through which
    compiled steps reduce their buckets when all ranks share one machine (0: none, buckets
    go through MPI_Iallreduce)."""
    from graphc.distributed.node_window import DEFAULT_DATA_BYTES

    options = dict(pg_options or {})
    unknown = set(options) - {"node_window_bytes"}
    if unknown:
        raise DistributedError(f"init_process_group: unknown pg_options {sorted(unknown)}; the "
                               "mpi backend takes {'node_window_bytes': bytes per rank}")
    size = options.get("node_window_bytes", DEFAULT_DATA_BYTES)
    if not isinstance(size, int) or size < 0:
        raise DistributedError(f"init_process_group: pg_options['node_window_bytes'] must be "
                               f"a byte count >= 0, got {size!r}")
    return size


def _install_abort_on_error(MPI) -> None:
    previous = sys.excepthook

    def abort(kind, value, traceback):
        if _group is not None and _group.size > 1:
            # the error itself first: once Abort runs, mpiexec may drop output it has not
            # forwarded yet, and the traceback is the long part
            print(f"graphc.distributed: rank {_group.rank} raised {kind.__name__}: {value}\n"
                  "aborting the job so the other ranks do not wait forever", file=sys.stderr,
                  flush=True)
        previous(kind, value, traceback)
        if _group is not None and _group.size > 1:
            sys.stderr.flush()
            time.sleep(0.5)  # let mpiexec forward what this rank wrote
            MPI.COMM_WORLD.Abort(1)

    sys.excepthook = abort


def is_initialized() -> bool:
    return _group is not None


def node_window_fits(buckets: int, nbytes: int) -> bool:
    """Whether compiled steps can reduce `buckets` buckets of `nbytes` bytes in all through
    the process group's shared-memory window (every rank on this machine, and room for them:
    graphc.distributed.node_window); buckets that do not fit go through MPI_Iallreduce."""
    from graphc.distributed.node_window import LINE

    open_window = _current().window
    if open_window is None:
        return False
    window = open_window.window
    padded = nbytes + buckets * (LINE - 1)  # each bucket starts on a cache line
    return buckets <= window.slots and padded <= window.data_bytes


def before_window_closes(callback) -> None:
    """Run callback(memory) when the group's shared-memory window is freed
    (destroy_process_group), `memory` being this rank's segment as a uint8 array: DDP's
    gradient_as_bucket_view copies the `.grad`s that are views of it. Nothing without one."""
    window = _current().window
    if window is not None:
        window.before_close.append(callback)


def _current() -> _Group:
    if _group is None:
        raise DistributedError("Default process group has not been initialized, please make "
                               "sure to call init_process_group.")
    return _group


def get_rank(group=None) -> int:
    return _current().rank


def get_world_size(group=None) -> int:
    return _current().size


def barrier(group=None, async_op: bool = False, device_ids=None) -> None:
    g = _current()
    _wait(g, g.comm.Ibarrier(), "barrier")


def destroy_process_group(group=None) -> None:
    """Leave the process group (MPI itself is finalised when the process exits)."""
    global _group
    _current()
    from graphc.ops import collective

    previous = collective.set_communicator(None)
    group, _group = _group, None
    if isinstance(previous, _MpiCommunicator):
        previous.finish()
    if group.window is not None:
        group.window.close()


# ---- collectives ---------------------------------------------------------------------------------
def _array(tensor, what: str) -> np.ndarray:
    from graphc.tensor import Tensor

    if not isinstance(tensor, Tensor):
        raise TypeError(f"{what}: expected a graphc.Tensor, got {type(tensor).__name__}")
    if tensor.is_abstract:
        raise DistributedError(f"{what} inside graphc.compile: only all_reduce is a graph op "
                               "(DistributedDataParallel uses it); call this one outside "
                               "graphc.compile (docs/distributed.md)")
    return tensor.detach().numpy()


_WHAT = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
_HEADER = 12  # what, ndim, dtype, and up to 9 sizes


def _header(what: str, array: np.ndarray) -> np.ndarray:
    shape = list(array.shape)[:_HEADER - 3]
    dtype = int.from_bytes(array.dtype.str.encode()[:8].ljust(8, b"\0"), "little")
    header = [_WHAT.index(what), array.ndim, dtype] + shape
    return np.array(header + [-1] * (_HEADER - len(header)), np.int64)


_SPINS = 50  # Test() calls before a wait starts yielding the core (~50 us)


def _wait(g: _Group, request, what: str) -> None:
    """Wait for a non-blocking MPI request, at most the group's timeout; past it, abort."""
    deadline = time.monotonic() + g.timeout
    spins = 0
    while not request.Test():
        spins += 1
        if spins > _SPINS:
            # polite: the ranks share cores with each other (and other work), so give the
            # core away between tests; past ~10k yields, sleep between them
            os.sched_yield() if spins < 10_000 else time.sleep(1e-4)
            if time.monotonic() > deadline:
                message = (f"{what} on rank {g.rank} waited {g.timeout:g} s for the other "
                           "ranks (one has died or is stuck); aborting the job")
                print(f"graphc.distributed: {message}", file=sys.stderr, flush=True)
                g.comm.Abort(1)
                raise DistributedError(message)


def _agree(g: _Group, what: str, array: np.ndarray) -> None:
    """Every rank states (collective, shape, dtype); a mismatch is reported on every rank
    before any data moves."""
    mine = _header(what, array)
    everyone = np.empty((g.size, _HEADER), np.int64)
    _wait(g, g.comm.Iallgather(mine, everyone), what)
    if (everyone != mine).any():
        def describe(row):
            dims = [int(n) for n in row[3:3 + int(row[1])]]
            return f"{_WHAT[int(row[0])]} of {dims}"

        lines = "; ".join(f"rank {r}: {describe(row)}" for r, row in enumerate(everyone))
        raise DistributedError(f"{what}: the ranks disagree ({lines}); every rank must call "
                               "the same collectives with the same shapes and dtypes")


_OP_NAMES = {ReduceOp.SUM: "sum", ReduceOp.AVG: "avg", ReduceOp.MAX: "max",
             ReduceOp.MIN: "min"}



class _MpiCommunicator:
    """graphc.ops.collective's Communicator over MPI.COMM_WORLD: the reference kernel's
    allreduce, the agreement check of compiled steps, and the handles generated code uses."""

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.world_size, self.rank = group.size, group.rank
        self._native = None
        self._agreed = None  # the signature every rank last agreed on
        self._pending = None  # a background agreement: (request, mine, everyone, what, sig)
        self._digests: dict[tuple, np.ndarray] = {}  # signature -> its 24-byte digest

    def allreduce(self, array: np.ndarray, op: str) -> None:
        g, MPI = self.group, _mpi()
        _agree(g, "all_reduce", array)
        _wait(g, g.comm.Iallreduce(MPI.IN_PLACE, array, op=_op(MPI, _BY_NAME[op])),
              "all_reduce")
        if op == "avg":
            array /= g.size

    def agree(self, what: str, signature: tuple) -> None:
        """Every rank is about to run the same collectives (`signature`), else a
        DistributedError before any of them runs.

        A signature this rank differs from the one all ranks last agreed on is agreed on at
        once (a blocking allgather of its digest): a rank that retraced into other
        collectives is stopped there, before its first collective. The same signature again
        (the steady state of a training loop) is agreed on in the background: its allgather
        is posted now and checked at the next call, so the step does not wait for the other
        ranks twice (here and at its last collective). A rank that retraced posts its blocking
        allgather in the same order, so it still meets the others' and reports the mismatch;
        the other ranks then wait in their step until the job is aborted or times out.

        A step whose every collective is a bucket of the node's shared-memory window is not
        agreed on here: its code stores a digest of `signature` with each bucket's counter
        and compares the other ranks' before it sums (graphc.backends.cpu.collective_shm),
        which costs a load per bucket where this allgather cost a meeting through MPI per
        step (~50 us of the MLP's step)."""
        g = self.group
        if g.window is not None and signature in g.window.window.checked:
            return  # every collective is a window bucket: the step's code checks (see below)
        self.finish()
        mine = self._digests.get(signature)
        if mine is None:
            digest = hashlib.sha256(repr(signature).encode()).digest()
            mine = self._digests[signature] = np.frombuffer(digest[:24], np.int64).copy()
        everyone = np.empty((g.size, 3), np.int64)
        request = g.comm.Iallgather(mine, everyone)
        if signature == self._agreed:
            self._pending = (request, mine, everyone, what, signature)
            return
        self._agreed = None
        self._check(request, mine, everyone, what, signature)
        self._agreed = signature

    def finish(self) -> None:
        """Complete and check the background agreement, if one is pending."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._check(*pending)

    def _check(self, request, mine, everyone, what: str, signature: tuple) -> None:
        g = self.group
        _wait(g, request, what)
        if (everyone != mine).any():
            self._agreed = None
            raise DistributedError(f"{what}: the ranks are about to run different collectives "
                                   f"(this rank, {g.rank}: {signature!r:.200}); every rank must "
                                   "run the same compiled step on same-shaped batches (one "
                                   "rank retraced for another shape?)")

    def native(self):
        """MPI_Allreduce's address and MPICH's handles, or None for another MPI ABI."""
        if self._native is None:
            self._native = _native_mpi(self.group) or False
        return self._native or None


def _native_mpi(g: _Group):
    import ctypes
    import re

    from graphc.distributed.node_window import NodeNativeMpi

    MPI = _mpi()
    if not MPI.Get_library_version().startswith("MPICH") or MPI._sizeof(MPI.Datatype) != 4:
        return None
    try:
        with open("/proc/self/maps") as f:
            paths = sorted(set(re.findall(r"\S*/libmpi\.so\S*", f.read())))
        library = ctypes.CDLL(paths[0])
        allreduce, iallreduce, test = (ctypes.cast(getattr(library, name), ctypes.c_void_p).value
                                       for name in ("MPI_Allreduce", "MPI_Iallreduce",
                                                    "MPI_Test"))
    except (OSError, IndexError, AttributeError):
        return None
    window = g.window.window if g.window is not None else None
    return NodeNativeMpi(allreduce, -1, MPI.COMM_WORLD.handle,
                         {"float32": MPI.FLOAT.handle, "float64": MPI.DOUBLE.handle,
                          "int64": MPI.INT64_T.handle},
                         {"sum": MPI.SUM.handle, "max": MPI.MAX.handle, "min": MPI.MIN.handle},
                         g.size, iallreduce, test, g.timeout, window)


_BY_NAME = {name: op for op, name in _OP_NAMES.items()}


def _op(MPI, op: ReduceOp):
    table = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD,
             ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN}
    if op not in table:
        raise DistributedError(f"unknown reduce op {op!r}; use graphc.distributed.ReduceOp")
    return table[op]


class Work:
    """A collective in flight (`all_reduce(..., async_op=True)`), as torch.distributed's Work:
    `wait()` blocks until it is done (at most the group's timeout, then the job aborts)."""

    def __init__(self, group: _Group, request, what: str, finish=None) -> None:
        self._group, self._request, self._what, self._finish = group, request, what, finish
        self._done = False

    def is_completed(self) -> bool:
        return self._done or bool(self._request.Test())

    def wait(self, timeout=None) -> bool:
        if not self._done:
            _wait(self._group, self._request, self._what)
            self._done = True
            if self._finish is not None:
                self._finish()
        return True


def all_reduce(tensor, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over every rank, in place (AVG divides the sum by the world size).
    With `async_op=True` it returns a `Work` and `tensor` holds the result once `wait()`
    returns. Inside graphc.compile it is the graph op `all_reduce`, written back into
    `tensor`."""
    from graphc.tensor import Tensor

    if isinstance(tensor, Tensor) and tensor.is_abstract:
        from graphc.ops import collective

        _current()
        if op not in _OP_NAMES:
            raise DistributedError(f"unknown reduce op {op!r}; use graphc.distributed.ReduceOp")
        with no_grad():
            tensor.copy_(collective.all_reduce(tensor, _OP_NAMES[op]))
        return None
    g, MPI = _current(), _mpi()
    array = _array(tensor, "all_reduce")
    if op is ReduceOp.AVG and array.dtype.kind != "f":
        raise DistributedError("all_reduce with ReduceOp.AVG needs a floating tensor")
    _agree(g, "all_reduce", array)
    buffer = np.ascontiguousarray(array)

    def finish():
        if op is ReduceOp.AVG:
            buffer[...] /= g.size
        if buffer is not array:
            array[...] = buffer

    work = Work(g, g.comm.Iallreduce(MPI.IN_PLACE, buffer, op=_op(MPI, op)), "all_reduce",
                finish)
    if async_op:
        return work
    work.wait()
    return None


def broadcast(tensor, src: int, group=None, async_op: bool = False):
    """Copy rank `src`'s `tensor` into every rank's, in place. Inside graphc.compile it is
    the graph op `all_reduce` of the tensor kept on `src` and zeroed elsewhere."""
    from graphc.tensor import Tensor

    g = _current()
    if isinstance(tensor, Tensor) and tensor.is_abstract:
        from graphc.ops import collective

        with no_grad():
            kept = tensor if g.rank == src else tensor.new_zeros(tuple(tensor.shape))
            tensor.copy_(collective.all_reduce(kept, "sum"))
        return None
    array = _array(tensor, "broadcast")
    _agree(g, "broadcast", array)
    buffer = np.ascontiguousarray(array)
    _wait(g, g.comm.Ibcast(buffer, root=src), "broadcast")
    if buffer is not array:
        array[...] = buffer


def all_gather(tensor_list: list, tensor, group=None, async_op: bool = False):
    """`tensor_list[r]` receives rank r's `tensor`, on every rank."""
    g = _current()
    array = np.ascontiguousarray(_array(tensor, "all_gather"))
    _agree(g, "all_gather", array)
    if len(tensor_list) != g.size:
        raise DistributedError(f"all_gather: tensor_list has {len(tensor_list)} tensors, "
                               f"expected one per rank ({g.size})")
    gathered = np.empty((g.size,) + array.shape, array.dtype)
    _wait(g, g.comm.Iallgather(array, gathered), "all_gather")
    for out, part in zip(tensor_list, gathered):
        _array(out, "all_gather")[...] = part


def reduce_scatter(output, input_list: list, op: ReduceOp = ReduceOp.SUM, group=None,
                   async_op: bool = False):
    """Rank r's `output` receives the reduction over ranks of their `input_list[r]`."""
    g, MPI = _current(), _mpi()
    if len(input_list) != g.size:
        raise DistributedError(f"reduce_scatter: input_list has {len(input_list)} tensors, "
                               f"expected one per rank ({g.size})")
    out = _array(output, "reduce_scatter")
    stacked = np.ascontiguousarray(np.stack([_array(t, "reduce_scatter") for t in input_list]))
    _agree(g, "reduce_scatter", stacked)
    received = np.empty_like(stacked[0])
    _wait(g, g.comm.Ireduce_scatter_block(stacked, received, op=_op(MPI, op)),
          "reduce_scatter")
    if op is ReduceOp.AVG:
        received /= g.size
    out[...] = received
