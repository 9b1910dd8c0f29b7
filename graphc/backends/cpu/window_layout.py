"""window_layout: which bytes of the node's shared-memory window one executable uses, decided
from its whole schedule before the first node is lowered (the backward's kernels write the
gradients there long before the buckets' starts); graphc.backends.cpu.collective_shm renders
the kernels.

- Buckets that go through the window: float sum/avg buckets, in start order, slots 0, 1, ...
  up to the window's slots; ordinary buckets take data offsets from 0 (every executable
  shares that low part: a fence orders the steps), while the buckets of
  gradient_as_bucket_view (whose wait can average in place: `_view_capable`) get a region
  of their own (NodeWindow.reserve), which no other step writes.
- The gradients the backward computes straight into the window (`members`): values with an
  arena buffer of their own (not a view, not written over an input, not a graph output).
- The step's signature (what the ranks must run the same of) and its digest (with the view
  region's offset), published with every bucket's counter.
- View buckets' reduced gradients that the graph returns once are returned as views of
  this rank's window bytes (`window_outputs` for the lowering, `window_arrays` for the
  executable).

The window's table (graphc.distributed.node_window): rank, world size, data bytes per
segment (BASES words), then each rank's segment address.
"""

from __future__ import annotations

import ctypes
import hashlib
import weakref
from dataclasses import dataclass, field

import numpy as np

from graphc.backends.common import contiguous_strides
from graphc.backends.cpu.values import Loc
from graphc.ir.graph import Node, Value
from graphc.ops import collective
from graphc.ops.collective import COLLECTIVE_OPS
from graphc.ops.fused import FusedBody
from graphc.passes.fuse_waits import wait_bucket

BASES = 3  # the table: rank, world size, data bytes per segment, then each segment's address
_ALIGN = 64  # every bucket starts on a cache line
_MAX_RANKS = 256  # the table's room (graphc.distributed.node_window.MAX_RANKS)
# Up to this many ranks, every rank sums the whole bucket from all windows (one meeting per
# bucket; for 2 ranks the same memory traffic as splitting the sum); beyond, each rank sums
# 1/world of it and copies the rest from the others (two meetings, traffic independent of
# the world size).
WHOLE_REDUCE_MAX_WORLD = 4


@dataclass
class Layout:
    """One executable's use of the window, decided from the whole schedule before its first
    node is lowered (the backward's kernels write gradients there, long before the starts)."""

    buckets: dict[str, tuple[int, int]] = field(default_factory=dict)  # value -> slot, offset
    members: dict[Value, Loc] = field(default_factory=dict)  # gradient -> its window place
    used_bytes: int = 0
    control_bytes: int = 0  # the window's control area: its data starts past it
    start: Node | None = None  # the first window bucket's start (named in errors)
    signature: tuple = ()  # the collectives CpuExecutable agrees on before each run
    digest: int = 0  # of the signature (and the view region): stored with every counter
    first: Node | None = None  # the node before whose kernels the window check and fence go
    fenced: bool = False
    # gradient_as_bucket_view: the buckets averaged in place in this rank's window (their
    # start values' names), the reduced gradients returned as views of it (value -> data
    # offset), and those outputs for the executable (slot -> (table, byte offset from the
    # segment's start, shape, dtype name)); `segment`: this rank's segment address when
    # compiled (a view must not outlive its window: the fence checks it is still there)
    views: set = field(default_factory=set)
    view_values: dict[Value, int] = field(default_factory=dict)
    window_outputs: dict[int, tuple] = field(default_factory=dict)
    view_end: int = 0
    segment: int = 0


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # lowerer -> Layout


def window_of(node: Node):
    native = collective.communicator(node.op).native()
    window = getattr(native, "node_window", None) if native is not None else None
    return (native, window) if window is not None and native.world_size > 1 else (None, None)


def _fits(node: Node) -> bool:
    out = node.outputs[0]
    return node.attrs["op"] in ("sum", "avg") and out.type.dtype.name in ("float32", "float64")


def _padded(node: Node) -> int:
    return -(-node.outputs[0].type.nbytes // _ALIGN) * _ALIGN


def layout_of(lw) -> Layout:
    """The window buckets of lw's graph (slots and offsets in start order) and the gradients
    the backward writes straight into them; computed once per lowerer. Buckets with
    `bucket_view` (whose wait can average in place: _view_capable) get a region of their
    own (NodeWindow.reserve), the others the shared low part."""
    found = _LAYOUTS.get(lw)
    if found is not None:
        return found
    layout = _LAYOUTS[lw] = Layout()
    starts = [n for n in lw.plan.schedule if n.op == "all_reduce_start"]
    if not starts:
        return layout
    native, window = window_of(starts[0])
    if window is None:
        return layout
    movable = _movable_gradients(lw)
    layout.control_bytes = window.control_bytes
    waits = {wait_bucket(n): n for n in lw.plan.schedule if wait_bucket(n) is not None}
    viewed = [n for n in starts if n.attrs.get("bucket_view") and _fits(n)
              and _view_capable(lw, waits.get(n.outputs[0]), native.world_size)]
    viewed = viewed[:window.slots]
    region = window.reserve(sum(_padded(n) for n in viewed)) if viewed else None
    if region is None:
        viewed = []
    view_at = region
    for node in starts:
        out = node.outputs[0]
        if not _fits(node) or len(layout.buckets) >= window.slots:
            continue
        nbytes = _padded(node)
        if node in viewed:
            offset, view_at = view_at, view_at + nbytes
            layout.views.add(out.name)
            layout.view_end = view_at
        elif layout.used_bytes + nbytes > window.shared_limit:
            continue
        else:
            offset = layout.used_bytes
            layout.used_bytes += nbytes
        layout.start = layout.start or node
        layout.buckets[out.name] = (len(layout.buckets), offset)
        at = offset
        for x in node.inputs:
            if x in movable and x not in layout.members:
                layout.members[x] = Loc("window", 0, at, contiguous_strides(
                    x.type.shape, x.type.dtype.itemsize), x.type)
            at += x.type.nbytes
    window.use_shared(layout.used_bytes)
    if layout.views:
        _view_outputs(lw, layout, waits, window)
    layout.signature = signature(lw.plan.schedule)
    digest = hashlib.sha256(repr((layout.signature, region)).encode()).digest()
    layout.digest = int.from_bytes(digest[:8], "little", signed=True)
    if all(n.op == "all_reduce_start" and n.outputs[0].name in layout.buckets
           for n in lw.plan.schedule if n.op in COLLECTIVE_OPS):
        window.checked.add(layout.signature)  # graphc.distributed skips its agreement
    first_write = {v: i for i, n in enumerate(lw.plan.schedule) for v in n.outputs
                   if v in layout.members or v.name in layout.buckets}
    if first_write:
        layout.first = lw.plan.schedule[min(first_write.values())]
    return layout


def _view_capable(lw, wait: Node | None, world: int) -> bool:
    """Whether a bucket_view bucket's wait can average in place: a plain wait, or a wait
    fused with an update (graphc.passes.fuse_waits) whose operands are the gradient's shape
    contiguous or one broadcast scalar each, for a world whose second phase is a loop per
    rank (WHOLE_REDUCE_MAX_WORLD)."""
    if wait is None:
        return False
    if wait.op == "all_reduce_wait":
        return True
    if world > WHOLE_REDUCE_MAX_WORLD:
        return False
    return flat_operands(lw, wait) is not None


def flat_operands(lw, node: Node):
    """For a fused wait: per input (after the bucket) and output, its element stride over
    the flattened gradient (1, or 0 for a broadcast scalar), or None when some operand is
    neither (contiguous plans only: the lowering checks the Locs again)."""
    body = FusedBody.of_node(node)
    t = body.types[body.n_inputs]
    shape = tuple(t.shape)
    strides = []
    for v in list(node.inputs[1:]) + list(node.outputs):
        if v.type.numel != 1 and v.name in lw.plan.views:
            return None
        if tuple(v.type.shape) == shape:
            strides.append(1)
        elif v.type.numel == 1:
            strides.append(0)
        else:
            return None
    return strides


def _view_outputs(lw, layout: Layout, waits: dict, window) -> None:
    """The reduced gradients of the view buckets that the graph returns once (direct
    outputs): returned as views of this rank's window bytes, where the wait leaves them."""
    direct = lw.locs.direct_outputs
    table = (ctypes.c_int64 * (BASES + 1 + _MAX_RANKS)).from_address(window.table)
    layout.segment = table[BASES + table[0]]
    for name in layout.views:
        wait = next(w for b, w in waits.items() if b.name == name)
        _, offset = layout.buckets[name]
        at = offset
        for v in _wait_gradients(wait):
            if v is not None and v.name in direct:
                layout.view_values[v] = at
                layout.window_outputs[direct[v.name]] = (
                    window.table, layout.control_bytes + at, tuple(v.type.shape),
                    v.type.dtype.name)
            at += (v.type.nbytes if v is not None else 0)


def _wait_gradients(wait: Node) -> list:
    """The reduced gradients a wait returns, in bucket order (a fused wait: its one
    gradient, or None when the node does not return it)."""
    if wait.op == "all_reduce_wait":
        return list(wait.outputs)
    body = FusedBody.of_node(wait)
    for ref, v in zip(body.outputs, wait.outputs):
        if ref == body.n_inputs:
            return [v]
    return [None]


def window_outputs(lw) -> dict[int, tuple]:
    """For the executable: output slot -> (table address, byte offset from this rank's
    segment start, shape, dtype name) of the reduced gradients returned as views of the
    window (gradient_as_bucket_view); see window_arrays."""
    return dict(layout_of(lw).window_outputs)


def window_arrays(outputs: dict[int, tuple]) -> dict[int, np.ndarray]:
    """The arrays window_outputs describes: views of this rank's segment, made once per
    executable (they stay valid while the process group's window does)."""
    arrays = {}
    for k, (table_address, offset, shape, dtype) in outputs.items():
        table = (ctypes.c_int64 * (BASES + 1 + _MAX_RANKS)).from_address(table_address)
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        memory = (ctypes.c_char * nbytes).from_address(table[BASES + table[0]] + offset)
        arrays[k] = np.frombuffer(memory, dt).reshape(shape)
    return arrays


def signature(schedule: list[Node]) -> tuple:
    """What every rank must run the same of: each collective's op, reduction, size and dtype
    in schedule order (the tuple CpuExecutable asks graphc.distributed to agree on)."""
    return tuple((n.op, n.attrs["op"], n.outputs[0].type.numel, n.outputs[0].type.dtype.name)
                 for n in schedule if n.op in COLLECTIVE_OPS)


def _movable_gradients(lw) -> set[Value]:
    """Values the backward can compute straight into the window: made by a node into an
    arena buffer of their own (not a view, not written over an input's buffer or into a
    graph input, not a graph output or update value), static and non-empty."""
    plan, graph = lw.plan, lw.graph
    kept = {v.name for v in graph.outputs} | {v.name for pair in graph.updates for v in pair}
    return {v for n in plan.schedule if n.op != "all_reduce_start" for v in n.outputs
            if v.name in plan.buffer_of and v.name not in plan.views
            and v.name not in plan.inplace and v.name not in plan.in_input
            and v.name not in kept and not v.type.is_symbolic and v.type.numel > 0}


__all__ = ["BASES", "WHOLE_REDUCE_MAX_WORLD", "Layout", "flat_operands", "layout_of",
           "signature", "window_arrays", "window_of", "window_outputs"]
