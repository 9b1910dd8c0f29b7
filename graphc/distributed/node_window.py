"""node_window: the MPI shared-memory window through which compiled steps reduce their
gradient buckets when every rank of the job runs on one machine.

`init_process_group` opens it (collective over the job): MPI_Comm_split_type(SHARED) finds
the ranks sharing this machine; when that is all of them (and there are two or more),
MPI_Win_allocate_shared gives every rank a segment of CONTROL_BYTES + data_bytes that the
other ranks can address. Untouched pages cost nothing, so the default data size (64 MiB per
rank, ResNet-18's 42.6 MiB of gradients fit) only reserves address space; it is cut to half
the free space of /dev/shm (which backs it) over the ranks, so the window does not reserve
more than the machine has (a touched page past the end of /dev/shm would be a SIGBUS).

The generated code (graphc.backends.cpu.collective_shm, which documents the protocol) finds
the segments through one table of int64 per process, at an address that never changes
(registered as a symbol once): rank, world size, data bytes, then each rank's segment
address. destroy_process_group zeroes it and a later init_process_group rewrites it; a step
compiled earlier checks at each bucket that the window still has room for it.

Who uses which bytes of the data: every executable's ordinary buckets start at offset 0 (they
take turns: a fence orders the steps); buckets whose reduced gradients stay in the window
as the `.grad`s (DDP's gradient_as_bucket_view) need bytes no other step writes, so each
such executable reserves its own region from the top (`NodeWindow.reserve`), below which
the shared low part must stay. Ranks compile the same steps in the same order, so every
rank reserves the same offsets (the steps' digests include them: a rank that did not fails
its step instead of summing the wrong bytes). Regions are held until the group is destroyed.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

import numpy as np

from graphc.ops.collective import NativeMpi

LINE = 64  # bytes between control words (graphc.backends.cpu.collective_shm.LINE)
SLOTS = 255  # bucket counters per segment: an executable's 256th bucket takes the MPI path
CONTROL_BYTES = LINE * (1 + SLOTS)
DEFAULT_DATA_BYTES = 64 * 2**20
MAX_RANKS = 256

_table = (ctypes.c_int64 * (3 + MAX_RANKS))()  # rank, world, data bytes, segment addresses


@dataclass(frozen=True)
class NodeWindow:
    """What the generated code needs: the table's address and the segment layout."""

    table: int
    data_bytes: int
    control_bytes: int = CONTROL_BYTES
    slots: int = SLOTS
    # collective signatures of compiled steps whose every collective is a window bucket:
    # their code checks that all ranks run the same step (each bucket's published digest),
    # so graphc.distributed's agreement skips them
    checked: set = field(default_factory=set, compare=False, hash=False)
    # [highest end of the shared low part used so far, lowest reserved offset]
    _usage: list = field(default_factory=list, compare=False, hash=False)

    def __post_init__(self) -> None:
        self._usage[:] = [0, self.data_bytes]

    @property
    def shared_limit(self) -> int:
        """Ordinary buckets may use data bytes [0, shared_limit): below every reservation."""
        return self._usage[1]

    def use_shared(self, used: int) -> None:
        """An executable's ordinary buckets use data bytes [0, used): later reservations
        stay above them."""
        self._usage[0] = max(self._usage[0], used)

    def reserve(self, nbytes: int) -> int | None:
        """The data offset of a region of nbytes (rounded up to cache lines) that only its
        executable uses, held until the group is destroyed; None when there is no room."""
        low = self._usage[1] - -(-nbytes // LINE) * LINE
        if nbytes <= 0 or low < self._usage[0]:
            return None
        self._usage[1] = low
        return low


@dataclass(frozen=True)
class NodeNativeMpi(NativeMpi):
    """NativeMpi with the node's shared-memory window (None: buckets use MPI_Iallreduce)."""

    node_window: NodeWindow | None = None


class OpenWindow:
    """The MPI objects behind a NodeWindow, kept alive as long as the process group."""

    def __init__(self, window: NodeWindow, win, node_comm, memory: np.ndarray) -> None:
        self.window, self.win, self.node_comm = window, win, node_comm
        self.memory = memory  # this rank's segment, as bytes
        self.before_close: list = []  # callbacks(memory) that copy what must outlive it

    def close(self) -> None:
        """Free the window (collective, as destroy_process_group is); steps compiled for it
        must not run afterwards (the table no longer points at any segment). The
        `before_close` callbacks run first (DDP's: `.grad`s that are views of the window)."""
        for callback in self.before_close:
            callback(self.memory)
        self.before_close.clear()
        for q in range(1, len(_table)):
            _table[q] = 0
        self.win.Free()
        self.node_comm.Free()


def open_window(MPI, comm, data_bytes: int = DEFAULT_DATA_BYTES) -> OpenWindow | None:
    """Collective over `comm`: the window, or None when the ranks do not all share this
    machine, there is one rank, data_bytes is 0, or the shared-memory file system has no
    room for it (every rank gets the same answer and the same data size: the lowering
    decides from it which buckets fit, identically on every rank)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2 or size > MAX_RANKS or data_bytes <= 0:
        return None
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    if node.Get_size() != size:  # some rank is on another machine: the same on every rank
        node.Free()
        return None
    # /dev/shm backs the window: a segment past its free space would fault (SIGBUS) when
    # touched, so take at most half of what is free now, split over the ranks
    data_bytes = node.bcast(min(data_bytes, _shm_room() // (2 * size)) // LINE * LINE)
    win = None
    try:
        if data_bytes > 0:
            win = MPI.Win.Allocate_shared(CONTROL_BYTES + data_bytes, 1, comm=node)
    except MPI.Exception:
        win = None
    if not node.allreduce(win is not None, op=MPI.LAND):
        if win is not None:
            win.Free()
        node.Free()
        return None
    mine, _ = win.Shared_query(node.Get_rank())
    memory = np.frombuffer(mine, np.uint8, count=CONTROL_BYTES + data_bytes)
    memory[:CONTROL_BYTES] = 0
    _table[0], _table[1], _table[2] = rank, size, data_bytes
    for q in range(size):
        segment, _ = win.Shared_query(q)
        _table[3 + q] = segment.address
    node.Barrier()  # every control area is zero before any rank's step reads it
    return OpenWindow(NodeWindow(ctypes.addressof(_table), data_bytes), win, node, memory)


def _shm_room() -> int:
    """Free bytes of /dev/shm (MPICH's shared segments live there), or 0 without one."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize


__all__ = ["CONTROL_BYTES", "DEFAULT_DATA_BYTES", "NodeNativeMpi", "NodeWindow", "OpenWindow",
           "open_window"]
