"""collective_shm: a bucket's allreduce through the node's MPI shared-memory window, for
ranks that all run on one machine.

MPI_Iallreduce moves a bucket through MPICH's shared-memory queues (or a kernel copy between
processes) and reduces it in MPICH's own loop: for the MLP's 1.07 MB of gradients on two
ranks that was ~180 us idle, all of it on the cores that also compute the step, and MPICH
moves it only inside MPI calls. Here, when graphc.distributed found every rank on one node,
it allocated a window with MPI_Win_allocate_shared, and a bucket is reduced by the generated
code itself, reading the other ranks' memory directly (as DeepSpeed's and oneCCL's
shared-memory allreduce on CPUs):

- The backward writes a bucket's gradients straight into this rank's window: `place`
  (called by the lowerer for every node) gives each gradient that has an arena buffer of
  its own (not a view, not written over an input, not a graph output) its place in the
  bucket's window bytes, so the GEMM or reduction that makes it writes there. Before the
  step's first write into the window one kernel checks that the window still fits the step
  and waits until no rank still reads this rank's window (the fence below).
- `all_reduce_start`: pack what the plan could not place there (a view, a graph input, a
  value the step also returns: one copy each, transposed ones in tiles), store the step's
  digest, then publish the bucket's counter.
- `all_reduce_wait`: wait until every rank has published the bucket; check that every rank
  published this step's digest (a digest of the step's collectives: ranks about to run
  different steps fail here, before any sum, and graphc.distributed skips its per-step
  MPI agreement for steps whose every collective is a window bucket); sum the bucket over
  all windows in rank order, scaled for "avg", into the result; count the wait done. Every
  rank adds in the same order, so all get the same bits (for two ranks, MPI's sum's bits).
  That is one meeting per bucket: the rank that comes late finds the others' data there
  and reduces alone, where MPI's reduce-scatter and allgather need both ranks inside MPI
  calls at several moments (a rank the scheduler took off its core stalls the other).
- gradient_as_bucket_view buckets are averaged in place, in two phases: each rank sums its
  chunk and stores it into every rank's window, meets the others again, and then its own
  window holds the whole average, which the step returns as the `.grad`s (lower_wait; a
  wait fused with its update runs the update inside both phases: _lower_fused_view).
- With more than WHOLE_REDUCE_MAX_WORLD ranks each rank sums only its chunk (1/world of the
  elements), writing it into the result and back into its window, publishes again, waits
  until every rank has, and copies the other ranks' chunks: two meetings, but the traffic
  no longer grows with the world size.

Per rank and MB of gradients (two ranks): the sum (2 MB read, one of them the other rank's,
1 MB written), against MPICH's copies through its queues or a kernel copy, its reduction
loop, and the separate averaging pass; no pack for gradients written in place, no MPI call.

The window (graphc.distributed's `NodeWindow`, reached as `native.node_window`): each rank's
segment holds a control area then the data. Control: int64 words 64 bytes apart (one cache
line each): word 0 counts the waits this rank finished, word 1 + k is bucket slot k's
counter (+1 at its start, +1 when its wait has reduced), with the step's digest in the
next word. The generated code finds the segments through a table of int64 whose address is
a registered symbol (`graphc_node_table`: rank, world size, data bytes, then each rank's
segment address in this process), so the module text, and the on-disk object cache, do
not depend on where the window landed (the driver's base "window" is this rank's data, read
from the table). Before its first write the step checks that the table still describes a
window it fits (destroy_process_group zeroes it; a later init_process_group may open
another size): a stale step fails with an error naming the node instead of writing out of
bounds; a step that returns views of the window (gradient_as_bucket_view) also checks that
this rank's segment is still where its views point.

Counters only grow and every rank runs the same collectives in the same order (the
digests check it), so "every rank's counter >= mine" is the whole
protocol. An executable's buckets get slots 0, 1, ... and data offsets from 0 in start
order (graphc.backends.cpu.window_layout decides which bytes, and which gradients the
backward writes there); other executables, and the next step, reuse them (except the
regions of gradient_as_bucket_view buckets, each executable's own), which the fence makes
safe: before
a step's first write into the window it waits until every rank has finished as many waits
as this one, i.e. no rank still reads this window (one fence per step suffices: within a
step every bucket has bytes of its own).
Every spin yields the core after a while and fails the step past the group's timeout,
naming the node, as the MPI wait does. Buckets that do not fit (too many, or too large for
the window), other ops than sum/avg and other dtypes than float32/float64 take the MPI path.
"""

from __future__ import annotations

import ctypes

from llvmlite import ir

from graphc.backends.common import contiguous_strides
from graphc.backends.cpu import llvm
from graphc.backends.cpu.bucket_pack import pack
from graphc.backends.cpu.kernels import Combined, KernelBuilder
from graphc.backends.cpu.scalars import convert
from graphc.backends.cpu.values import F64, I32, I64, MEM, PTR, Loc, i64, loop, unsupported
from graphc.backends.cpu.window_layout import (
    BASES,
    WHOLE_REDUCE_MAX_WORLD,
    Layout,
    flat_operands,
    layout_of,
    window_of,
)
from graphc.ir.graph import Node
from graphc.ir.printer import format_node
from graphc.ops import collective

TABLE_SYMBOL = "graphc_node_table"
LINE = 64  # bytes between control words: one cache line each
_SPINS = 200  # spins before a wait starts yielding the core and checking the clock
_CLOCK_MONOTONIC = 1


def usable(lw, node: Node) -> bool:
    """Whether this bucket (a start, or the wait of one) goes through the window."""
    value = node.outputs[0] if node.op == "all_reduce_start" else node.inputs[0]
    return value.name in layout_of(lw).buckets


def place(lw, node: Node) -> None:
    """After lw placed node's outputs: a gradient the window holds is placed there instead,
    and before the first node that writes into the window, the check that the window still
    fits this step and the fence (no rank still reads this rank's window) run."""
    layout = layout_of(lw)
    if layout.first is None:
        return
    if node is layout.first and not layout.fenced:
        _lower_fence(lw, node, layout)
        layout.fenced = True
    for v in node.outputs:
        if v in layout.members:
            lw.locs.locs[v] = layout.members[v]


def window_data(lw, b: ir.IRBuilder, index: int = 0) -> ir.Value:
    """For the driver: the address of a window's data (Loc base "window"): index 0, this
    rank's; index 1 + q, rank q's (read by a fused wait's sum)."""
    table = lw.declare(TABLE_SYMBOL, ir.FunctionType(ir.VoidType(), []))
    rank = b.load(table, typ=I64) if index == 0 else i64(index - 1)
    segment = b.load(b.gep(table, [b.add(rank, i64(BASES))], source_etype=I64), typ=I64)
    return b.gep(b.inttoptr(segment, PTR), [i64(layout_of(lw).control_bytes)],
                 source_etype=ir.IntType(8))


class _Emitter:
    """The shared pieces of the start's and the wait's kernels: the table, counters, spins."""

    def __init__(self, lw, node: Node, kb: KernelBuilder, b: ir.IRBuilder) -> None:
        native, window = window_of(node)
        self.lw, self.node, self.b, self.window = lw, node, b, window
        self.world, self.timeout = native.world_size, native.timeout
        for name, address in ((TABLE_SYMBOL, window.table),
                              ("sched_yield", _libc("sched_yield")),
                              ("clock_gettime", _libc("clock_gettime"))):
            llvm.register_symbol(name, address)
        self.table = lw.declare(TABLE_SYMBOL, ir.FunctionType(ir.VoidType(), []))
        self.yield_ = lw.declare("sched_yield", ir.FunctionType(I32, []))
        self.clock = lw.declare("clock_gettime", ir.FunctionType(I32, [I32, PTR]))
        self.timespec = b.alloca(ir.ArrayType(I64, 2), name="ts")
        self.deadline = b.alloca(I64, name="deadline")
        self.late = None
        self.rank = self.word(i64(0))

    def word(self, index) -> ir.Value:
        return self.b.load(self.b.gep(self.table, [index], source_etype=I64), typ=I64)

    def segment(self, rank) -> ir.Value:
        """The base address (a pointer) of `rank`'s segment of the window."""
        return self.b.inttoptr(self.word(self.b.add(rank, i64(BASES))), PTR)

    def control(self, rank, slot: int | None) -> ir.Value:
        """Pointer to rank's wait counter (slot None) or its counter of bucket `slot`."""
        at = 0 if slot is None else LINE * (1 + slot)
        return self.b.gep(self.segment(rank), [i64(at)], source_etype=ir.IntType(8))

    def digest(self, rank, slot: int) -> ir.Value:
        """Pointer to the step digest rank stored with its counter of bucket `slot`."""
        return self.b.gep(self.control(rank, slot), [i64(8)], source_etype=ir.IntType(8))

    def data(self, rank, offset: int) -> ir.Value:
        return self.b.gep(self.segment(rank), [i64(self.window.control_bytes + offset)],
                          source_etype=ir.IntType(8))

    def publish(self, slot: int | None, value) -> None:
        """A release store (llvmlite's store_atomic wants typed pointers: built directly)."""
        b = self.b
        b._insert(ir.instructions.StoreAtomicInstr(b.block, value, self.control(self.rank, slot),
                                                   "release", 8))

    def mine(self, slot: int | None) -> ir.Value:
        return self.b.load(self.control(self.rank, slot), typ=I64)

    def wait_all(self, slot: int | None, target, what: str) -> None:
        """Spin until every rank's counter (of `slot`, or of waits) is >= target: briefly,
        then yielding the core between looks, failing the step past the timeout."""
        b = self.b
        if self.late is None:
            self.lw.errors.append(f"{self.node.op}: waited {self.timeout:g} s for the other "
                                  f"ranks (a rank has died or is stuck) in node "
                                  f"{format_node(self.node)}")
            self.late = len(self.lw.errors)
        b.store(i64(0), self.deadline)
        entry = b.block
        head, check, slow, following, done = (b.append_basic_block(f"{what}.{n}") for n in
                                               ("look", "check", "slow", "next", "done"))
        b.branch(head)
        b.position_at_end(head)
        spins = b.phi(I64, name=f"{what}.spins")
        spins.add_incoming(i64(0), entry)
        ready = ir.Constant(ir.IntType(1), 1)
        for q in range(self.world):
            seen = b.load_atomic(self.control(i64(q), slot), "acquire", 8, typ=I64)
            ready = b.and_(ready, b.icmp_signed(">=", seen, target))
        b.cbranch(ready, done, check)
        b.position_at_end(check)
        b.cbranch(b.icmp_signed("<", spins, i64(_SPINS)), following, slow)
        b.position_at_end(slow)
        b.call(self.yield_, [])
        t = self._now_ns()
        with b.if_then(b.icmp_signed("==", b.load(self.deadline, typ=I64), i64(0))):
            b.store(b.add(t, i64(int(self.timeout * 1e9))), self.deadline)
        with b.if_then(b.icmp_signed(">", t, b.load(self.deadline, typ=I64)), likely=False):
            b.ret(ir.Constant(I32, self.late))
        b.branch(following)
        b.position_at_end(following)
        spins.add_incoming(b.add(spins, i64(1)), following)
        b.branch(head)
        b.position_at_end(done)

    def _now_ns(self) -> ir.Value:
        b, ts = self.b, self.timespec
        b.call(self.clock, [ir.Constant(I32, _CLOCK_MONOTONIC), ts])
        sec, nsec = (b.load(b.gep(ts, [i64(0), i64(k)], source_etype=ir.ArrayType(I64, 2)),
                            typ=I64) for k in (0, 1))
        return b.add(b.mul(sec, i64(10**9)), nsec)


def _lower_fence(lw, before: Node, layout: Layout) -> None:
    """One status kernel before the step's first write into the window (before `before`'s
    kernels): the table must still describe a window of this world size with room for the
    step's buckets (else the step was compiled for another process group), and every rank
    must have finished as many bucket waits as this one (no rank still reads this rank's
    window: an earlier step's buckets, or another executable's, occupy the same bytes)."""
    start = layout.start
    kb = KernelBuilder(lw, lw.name("window_fence"), (1,))
    kb.kernel.status = True
    b = kb.begin()
    e = _Emitter(lw, start, kb, b)
    lw.errors.append(f"{start.op}: this step was compiled for a shared-memory window of "
                     f"{e.world} ranks with at least {layout.used_bytes} bytes, and the "
                     f"process group now has another one, or none (destroy_process_group); "
                     f"compile the step again (graphc.compile) after init_process_group, in "
                     f"node {format_node(start)}")
    stale = len(lw.errors)
    fits = b.and_(b.icmp_signed("==", e.word(i64(1)), i64(e.world)),
                  b.icmp_signed(">=", e.word(i64(2)), i64(max(layout.used_bytes,
                                                               layout.view_end))))
    if layout.views:  # the .grad views made for this window must still point into it
        segment = e.word(b.add(e.rank, i64(BASES)))
        fits = b.and_(fits, b.icmp_signed("==", segment, i64(layout.segment)))
    with b.if_then(b.not_(fits), likely=False):
        b.ret(ir.Constant(I32, stale))
    e.wait_all(None, e.mine(None), "fence")
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


def lower_start(lw, node: Node) -> None:
    """Pack the gradients the backward did not write into the window already, publish (see
    the module docstring)."""
    out = node.outputs[0]
    layout = layout_of(lw)
    slot, offset = layout.buckets[out.name]
    at = offset
    for x in node.inputs:
        place = Loc("window", 0, at, contiguous_strides(x.type.shape, x.type.dtype.itemsize),
                    x.type)
        if x.type.numel and lw.locs[x] != place:
            pack(lw, lw.locs[x], place)
        at += x.type.nbytes
    kb = KernelBuilder(lw, lw.name("all_reduce_start_window"), (1,))
    b = kb.begin()
    e = _Emitter(lw, node, kb, b)
    b.store(i64(layout.digest), e.digest(e.rank, slot))  # published with the counter
    e.publish(slot, b.add(e.mine(slot), i64(1)))
    lw.calls.append(kb.finish(b))


def lower_wait(lw, node: Node) -> None:
    """Meet the other ranks, sum the bucket (or this rank's chunk, then gather the rest)
    straight into the wait's outputs (the packed tensors' places: the arena, or an output
    array). A view bucket (gradient_as_bucket_view) is always reduced by chunks and in place:
    each rank averages its chunk and stores it into every rank's window (only it reads or
    writes that chunk in this phase), then meets the others again, after which its own
    window holds the whole average; its outputs returned as views are that window, the
    others are written from it as usual."""
    bucket = node.inputs[0]
    layout = layout_of(lw)
    slot, offset = layout.buckets[bucket.name]
    in_place = bucket.name in layout.views
    dt, count = bucket.type.dtype, bucket.type.numel
    element = MEM[dt.name]
    for out in node.outputs:
        if lw.locs[out].strides != contiguous_strides(out.type.shape, dt.itemsize):
            raise unsupported(node, "all_reduce_wait into a strided output")
    _meet(lw, node, slot)  # two kernels, so that graphc.profile tells waiting from summing
    kb = KernelBuilder(lw, lw.name("all_reduce_wait_sum"), (1,))
    kb.kernel.status = True
    outs = []  # (operand, first element in the bucket, elements)
    at = 0
    for out in node.outputs:
        if out not in layout.view_values:  # a view is the window itself: written there
            outs.append((kb.operand(lw.locs[out], (0,)), at, out.type.numel))
        at += out.type.numel
    b = kb.begin()
    e = _Emitter(lw, node, kb, b)
    world = e.world
    pieces = [(kb.pointer(b, o, i64(0)), first, n) for o, first, n in outs]
    packed = e.mine(slot)
    windows = [e.data(i64(q), offset) for q in range(world)]
    own = e.data(e.rank, offset)
    scale = _scale(b, node, dt, world)

    def summed(i):  # element i of the bucket summed over the windows in rank order, scaled
        total = None
        for w in windows:
            v = b.load(b.gep(w, [i], source_etype=element), typ=element)
            total = v if total is None else b.fadd(total, v)
        return total if scale is None else b.fmul(total, scale)

    if in_place:  # this rank's chunk into every window, then the others' from this one
        bounds = _chunks(b, count, world)

        def summed_everywhere(i):
            total = summed(i)
            for w in windows:
                b.store(total, b.gep(w, [i], source_etype=element))
            return total

        lo, hi = bounds(e.rank)
        if pieces:
            _over_pieces(b, pieces, lo, hi, element, summed_everywhere)
        else:
            with loop(b, lo, hi, "i") as i:
                summed_everywhere(i)
        e.publish(slot, b.add(packed, i64(1)))
        e.wait_all(slot, b.add(packed, i64(1)), "reduced")
        for q in range(world):  # outputs that are not views: the others' chunks
            if pieces:
                with b.if_then(b.icmp_signed("!=", e.rank, i64(q))):
                    _over_pieces(b, pieces, *bounds(i64(q)), element,
                                 lambda i: b.load(b.gep(own, [i], source_etype=element),
                                                  typ=element))
        packed = b.add(packed, i64(1))
    elif world <= WHOLE_REDUCE_MAX_WORLD:  # every rank sums every element: one meeting
        _over_pieces(b, pieces, i64(0), i64(count), element, summed)
    else:  # each rank its chunk, written back for the others, then the others' chunks
        bounds = _chunks(b, count, world)

        def summed_back(i):
            total = summed(i)
            b.store(total, b.gep(own, [i], source_etype=element))
            return total

        _over_pieces(b, pieces, *bounds(e.rank), element, summed_back)
        e.publish(slot, b.add(packed, i64(1)))
        e.wait_all(slot, b.add(packed, i64(1)), "reduced")
        for q in range(world):
            with b.if_then(b.icmp_signed("!=", e.rank, i64(q))):
                _over_pieces(b, pieces, *bounds(i64(q)), element,
                             lambda i, q=q: b.load(b.gep(windows[q], [i], source_etype=element),
                                                   typ=element))
        packed = b.add(packed, i64(1))
    e.publish(slot, b.add(packed, i64(1)))  # counters advance by 2 per bucket, 3 by chunks
    e.publish(None, b.add(e.mine(None), i64(1)))
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


def _chunks(b, count: int, world: int):
    """bounds(rank) -> [lo, hi) of rank's chunk of a bucket of count elements (whole cache
    lines per rank, the last ones possibly short or empty)."""
    chunk = -(-count // world)
    chunk = -(-chunk // 16) * 16

    def bounds(rank):
        lo = b.mul(rank, i64(chunk))
        lo = b.select(b.icmp_signed("<", lo, i64(count)), lo, i64(count))
        hi = b.add(lo, i64(chunk))
        return lo, b.select(b.icmp_signed("<", hi, i64(count)), hi, i64(count))

    return bounds


def fusable(lw, wait: Node) -> bool:
    """Whether a window bucket's wait (of one gradient) can sum inside the update that reads
    it: every rank sums every element (one meeting), the bucket is float32/float64."""
    native, _ = window_of(wait)
    return native.world_size <= WHOLE_REDUCE_MAX_WORLD and len(wait.outputs) == 1


def lower_fused_wait(lw, node: Node, body, wait: Node) -> None:
    """A fused node whose body starts with a window bucket's wait (graphc.passes.fuse_waits):
    meet the other ranks, then one loop that sums each element over the ranks' windows in
    rank order (scaled for "avg": the bits of lower_wait's sum) and runs the rest of the
    body on it, writing the reduced gradient where the node returns it and the update's
    results; then count the wait done. One pass over memory: the update no longer reads
    back a reduced gradient that the sum wrote."""
    bucket = wait.inputs[0]
    slot, offset = layout_of(lw).buckets[bucket.name]
    _meet(lw, wait, slot)
    if bucket.name in layout_of(lw).views:
        return _lower_fused_view(lw, node, body, wait, slot, offset)
    native, _ = window_of(wait)
    world, t = native.world_size, body.types[body.n]
    strides = contiguous_strides(t.shape, t.dtype.itemsize)
    windows = tuple(Loc("window", 1 + q, offset, strides, t) for q in range(world))

    def combine(b, values):  # in rank order, then scaled: the same bits as lower_wait's sum
        total = values[0]
        for v in values[1:]:
            total = b.fadd(total, v)
        scale = _scale(b, wait, t.dtype, world)
        return total if scale is None else b.fmul(total, scale)

    key = ("window_sum", world, wait.attrs["op"])
    # the reduced gradient (the .grad the step returns) is stored non-temporally: nothing in
    # the step reads it back, and the store then needs no read for ownership of lines long
    # out of cache (an output array the caller dropped a call or two ago)
    streamed = frozenset(ref for ref in body.outputs if ref == body.n)
    lw.elementwise(node, body, 1, {}, {body.n: Combined(windows, combine, key)}, streamed)
    kb = KernelBuilder(lw, lw.name("all_reduce_wait_done"), (1,))
    b = kb.begin()
    e = _Emitter(lw, wait, kb, b)
    e.publish(slot, b.add(e.mine(slot), i64(1)))  # as lower_wait: 2 per bucket
    e.publish(None, b.add(e.mine(None), i64(1)))
    lw.calls.append(kb.finish(b))


def _lower_fused_view(lw, node: Node, body, wait: Node, slot: int, offset: int) -> None:
    """A fused wait of a view bucket (gradient_as_bucket_view), after the meeting: the
    update runs in the two phases of the in-place average (lower_wait). Phase 1, over this
    rank's chunk: each element summed over the windows in rank order (scaled for "avg"),
    stored into every rank's window (this one's is the `.grad` view) and fed to the rest of
    the body; then every rank publishes and meets again; phase 2, over each other rank's
    chunk: its average, which that rank stored into this window, fed to the body. No
    `.grad` of its own, and no second pass of stores: per gradient byte, 1.5 window bytes
    read (instead of 2) and one written, half of it pushed to the other rank's window,
    where the stores do not stall the loop as the reads of phase 2 would (measured: this
    rank copying the others' averages into its window in phase 2 made the MLP's largest
    bucket ~20 us slower)."""
    layout = layout_of(lw)
    t = body.types[body.n]
    dt, count = t.dtype, t.numel
    flat = flat_operands(lw, node)
    kb = KernelBuilder(lw, lw.name("all_reduce_wait_view"), (count,))
    kb.kernel.status = True
    leaves: dict[int, int] = {}
    ins = list(node.inputs)
    for r in range(1, body.n):
        loc = lw.locs[ins[r]]
        stride = flat[r - 1]
        if stride and loc.strides != contiguous_strides(loc.type.shape,
                                                        loc.type.dtype.itemsize):
            raise unsupported(node, "a view bucket's update reading a strided operand")
        leaves[r] = kb.operand(loc, (stride,))
    outs = []
    for ref, v in zip(body.outputs, node.outputs):
        if v in layout.view_values:
            continue  # the window itself, written by the phases
        loc = lw.locs[v]
        if loc.strides != contiguous_strides(v.type.shape, v.type.dtype.itemsize):
            raise unsupported(node, "a view bucket's update into a strided output")
        outs.append((ref, kb.operand(loc, (1,)), v))
    native, _ = window_of(wait)
    world = native.world_size
    # the ranks' windows as arguments (noalias, as the parameters): the loops of rank r
    # store through window r's own argument, so each loop's accesses are provably apart
    windows = [kb.operand(Loc("window", 1 + q, offset, contiguous_strides((count,), dt.itemsize),
                              t), (1,)) for q in range(world)]
    strides = [op.strides[0] for op in kb.operands]
    b = kb.begin()
    e = _Emitter(lw, wait, kb, b)
    scale = _scale(b, wait, dt, world)
    bounds = _chunks(b, count, world)
    packed = e.mine(slot)

    def update(i, gradient) -> None:  # the rest of the body at element i
        offsets = [i if stride else i64(0) for stride in strides]
        env = body.evaluate(lw, kb, b, offsets, leaves, len(body.instrs),
                            [ref for ref, _, _ in outs],
                            {body.n: ((), lambda b, values: gradient)})
        for ref, k, v in outs:
            kb.store(b, k, offsets[k], convert(b, env[ref], body.types[ref].dtype,
                                               v.type.dtype))

    def per_rank(emit) -> None:  # emit(r) on rank r: one loop nest per rank, pointers fixed
        for r in range(world):
            with b.if_then(b.icmp_signed("==", e.rank, i64(r))):
                emit(r)

    def mine(r: int) -> None:  # this rank's chunk: summed, stored into every window
        lo, hi = bounds(i64(r))
        with loop(b, lo, hi, "mine") as i:
            total = None
            for w in windows:
                x = kb.load(b, w, i)
                total = x if total is None else b.fadd(total, x)
            total = total if scale is None else b.fmul(total, scale)
            for w in windows:
                kb.store(b, w, i, total)
            update(i, total)

    def theirs(r: int) -> None:  # the others' chunks: their averages, now in this window
        for q in range(world):
            if q != r:
                lo, hi = bounds(i64(q))
                with loop(b, lo, hi, f"theirs{q}") as i:
                    update(i, kb.load(b, windows[r], i))

    per_rank(mine)
    e.publish(slot, b.add(packed, i64(1)))
    e.wait_all(slot, b.add(packed, i64(1)), "averaged")
    per_rank(theirs)
    e.publish(slot, b.add(packed, i64(2)))
    e.publish(None, b.add(e.mine(None), i64(1)))
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


def _scale(b, node: Node, dt, world: int):
    """1 / world in the bucket's type for "avg", else None."""
    if node.attrs["op"] != "avg":
        return None
    scale = ir.Constant(F64, 1.0 / world)
    return scale if dt.name == "float64" else b.fptrunc(scale, MEM[dt.name])


def _meet(lw, node: Node, slot: int) -> None:
    """The status kernel before a bucket's sum: wait until every rank has published the
    bucket, then check that every rank stored this step's digest with it."""
    kb = KernelBuilder(lw, lw.name("all_reduce_wait"), (1,))
    kb.kernel.status = True
    b = kb.begin()
    e = _Emitter(lw, node, kb, b)
    e.wait_all(slot, e.mine(slot), "packed")
    layout = layout_of(lw)
    rank = collective.communicator(node.op).rank
    lw.errors.append(f"{node.op}: the ranks are about to run different collectives (this "
                     f"rank, {rank}: {layout.signature!r:.200}); every rank must run the same "
                     f"compiled step on same-shaped batches (one rank retraced for another "
                     f"shape?), in node {format_node(node)}")
    differ = len(lw.errors)
    for q in range(e.world):  # the digests the ranks published with this bucket
        theirs = b.load(e.digest(i64(q), slot), typ=I64)
        with b.if_then(b.icmp_signed("!=", theirs, i64(layout.digest)), likely=False):
            b.ret(ir.Constant(I32, differ))
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


def _over_pieces(b, pieces, lo, hi, element, value) -> None:
    """For the bucket's elements i in [lo, hi): its output piece's element i - first =
    value(i), piece by piece (each piece one contiguous loop)."""
    for pointer, first, n in pieces:
        start = _clamp(b, b.sub(lo, i64(first)), n)
        stop = _clamp(b, b.sub(hi, i64(first)), n)
        with loop(b, start, stop, "i") as i:
            b.store(value(b.add(i, i64(first))), b.gep(pointer, [i], source_etype=element))


def _clamp(b, value, n: int):
    """value clamped to [0, n]."""
    value = b.select(b.icmp_signed("<", value, i64(0)), i64(0), value)
    return b.select(b.icmp_signed(">", value, i64(n)), i64(n), value)


def _libc(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


__all__ = ["LINE", "TABLE_SYMBOL", "fusable", "lower_fused_wait", "lower_start", "lower_wait",
           "usable"]
