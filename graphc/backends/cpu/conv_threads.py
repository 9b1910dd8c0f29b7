"""conv_threads: a convolution kernel's images split over the cores.

A convolution kernel walks its images (or blocks of images, or channels) one after another,
and one image's GEMM is too small for OpenBLAS to split ([64 x 27] @ [27 x 1024] for the
conv2d case; LeNet's and ResNet's are alike), so on two cores the second one idled
(docs/performance.md, "Convolution (CPU)", "Threads over images"). This module splits that
outer loop over libgomp's team, the same pool every other parallel kernel uses
(graphc.backends.cpu.kernels, graphc.backends.cpu.threads). Users: conv.py (im2col + GEMM:
blocks of images), conv_winograd.py (blocks of images), conv_direct.py (images; output
channels for the weight gradient), pool.py (images of max and average pooling's forward and
of max_pool2d_grad, channels of batch_norm):

- A lowering that takes `Split` builds its kernel as a *range kernel*: the same code as the
  serial kernel, but its outer loop runs over the units [lo, hi) read from a small control
  block (int64: lo, hi, rows_lo, rows_hi, shares) instead of over all of them.
- `Split.call` makes the kernel the driver calls, `<range kernel>.split(ptrs...)`: it asks
  libgomp how many threads this call has (`omp_get_max_threads`, which the executable's
  `ThreadChooser` set through `threads.use`), and with one it runs the range kernel over
  every unit on the calling thread (share 0's workspace: the serial kernel's work, no fork).
  With more, each share s of the units gets a contiguous range of them in its control block
  and its own copy of the kernel's temporaries (im2col columns, blocks, padded planes): the
  workspace holds `shares` copies, `copy_bytes` apart, and share s's temporaries are share
  0's pointers moved by s copies. OpenBLAS is held to one thread for the region
  (`graphc_split_enter` / `graphc_split_exit`, threads.py: process-wide, under a lock, so
  that concurrent calls on other Python threads cannot lift it mid-region): a GEMM inside a
  parallel region must not fork again (libgomp gives a nested region one thread, and
  OpenBLAS's jobs, which wait on each other, would then wait forever).
- Reductions over the units (the weight gradient sums over images): each share writes its
  own partial sum (share 0 into the real target, share s into a temporary, `swap`), and a
  second range kernel (`reduce`) adds them in share order after a barrier, itself split
  over the threads by rows; so for a given thread count the result is the same every call,
  and it differs from one thread's only by the order of the sum over images (judged by the
  float64-distance rule, docs/performance.md, "Rounding").
- A range kernel may return a status (`Kernel.status`: 0, or an error's 1-based index, e.g.
  max_pool2d_grad's index out of the plane): each share's goes into its control block and
  the wrapper returns the first share's that is not 0, so an error in any share fails the
  call as it does on one thread.

Shares are built for `threads.image_threads()` (the most threads graphc's calls use) when the
kernel's work is large enough (MIN_SPLIT_MACS) and it has two units or more; a batch known
per call (graphc.backends.cpu.runtime_sizes: images one to a unit) is split where the
traced batch would be (graphc.backends.cpu.traced_sizes), its units counted per call. A
call gets min(its thread count, shares, units) shares; the team libgomp actually gives may
be smaller (nested, or a limit): each thread then runs shares t, t + n, ..., so every share
still runs exactly once.

A kernel with nothing to split over its images (its batch one block: ResNet-18's 512-channel
Winograd layers) forks its steps over channels instead: `channel_kernel` builds one step (an
input or output transform) as a kernel of its own on the same locs, its outermost loop over
the channels forked (kernels.KernelBuilder's parallel kernels: one contiguous share of the
channels a thread, each channel computed by the serial code: the same bits on any count).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.cpu import threads
from graphc.backends.cpu.conv_workspace import reserve_workspace, workspace
from graphc.backends.cpu.image_kernels import image_kernel
from graphc.backends.cpu.kernels import Kernel
from graphc.backends.cpu.traced_sizes import traced
from graphc.backends.cpu.values import (
    I8,
    I32,
    I64,
    PTR,
    CpuLoweringError,
    Loc,
    contiguous,
    i64,
    loop,
    size,
)
from graphc.types import TensorType, int64

__all__ = ["MIN_SPLIT_MACS", "Split", "channel_kernel", "over_units", "plan_split",
           "temporaries", "unit_range", "units_loop"]

# Below this many multiply-adds a kernel stays serial: a fork and join (a few microseconds,
# more when the team sleeps) and holding the BLAS to one thread cost more than a core gains.
MIN_SPLIT_MACS = 1 << 21

CONTROL_WORDS = 8  # int64 slots of a share's control block: lo, hi, rows_lo, rows_hi, shares,
# and the status a `status` range kernel returned for the share
LO, HI, ROWS_LO, ROWS_HI, SHARES, STATUS = range(6)

_WRAPPERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lowerer -> {key: name}


def shares_for(lw, units, macs, least: int | None = None) -> int:
    """How many shares a kernel with `units` independent units of work and `macs`
    multiply-adds (or other steps: `least` of them or more split) is built for: 1 (the
    serial kernel) or the most threads calls use."""
    least = MIN_SPLIT_MACS if least is None else least
    # a batch known per call: decided at the trace's sizes (no guard), units clamped per call
    units_now, macs = traced(units), traced(macs)
    if not getattr(lw, "openmp", False) or units_now is None or units_now < 2 or \
            macs is None or macs < least:
        return 1
    most = threads.image_threads()
    return 1 if most < 2 else most if type(units) is not int else min(most, units)


@dataclass
class Split:
    """How one kernel's units go over the threads: `shares` (>= 2) copies of its
    temporaries `locs` (share 0's; share s at + s * copy_bytes), its control block (share
    0's), `units` units for the range kernel, `rows` for a reduce kernel."""

    shares: int
    units: int
    copy_bytes: int
    locs: list[Loc]
    control: Loc
    shared: list[Loc]
    rows: int = 0

    def call(self, lw, kernel: Kernel, swap: tuple[Loc, Loc] | None = None,
             reduce: Kernel | None = None, prelude: Kernel | None = None) -> Kernel:
        """The kernel the driver calls for the range kernel `kernel` (and `reduce` and
        `prelude`, built on the same locs in the same order): see the module docstring.
        `swap` = (target, partial): share s >= 1 writes `target` into `partial`'s share-s
        copy instead. `prelude` runs once before the shares (e.g. a filter transform into a
        `shared` temporary that every share reads)."""
        status = kernel.status
        if status and (reduce is not None or prelude is not None):
            raise CpuLoweringError(f"conv_threads: {kernel.name} returns a status, which a "
                                   "split kernel with a reduce or prelude kernel cannot pass "
                                   "on: build that kernel serial (no Split)")
        regions = kernel.regions
        per_share = tuple(sorted(regions.index(loc.region) for loc in self.locs + [self.control]
                                 if swap is None or loc is not swap[1]))
        control = regions.index(self.control.region)
        swapped = None if swap is None else (regions.index(swap[0].region),
                                             regions.index(swap[1].region))
        names = tuple(None if k is None else k.name for k in (kernel, reduce, prelude))
        key = (names, len(regions), per_share, control, swapped, self.shares, self.units,
               self.rows, self.copy_bytes, status)
        built = _WRAPPERS.setdefault(lw, {})
        if key not in built:
            built[key] = _wrapper(lw, names, len(regions), per_share, control, swapped, self,
                                  status)
        return Kernel(built[key], list(regions), list(kernel.args), status)


def plan_split(lw, dt, shapes, units, macs, shared=(), rows: int = 0,
               least: int | None = None) -> Split | None:
    """A Split of a kernel whose temporaries have `shapes` (one copy per share) and
    `shared` (one copy, read by every share), or None: then the caller builds the serial
    kernel with `conv_workspace.workspace(lw, dt, *shapes)` as before."""
    shares = shares_for(lw, units, macs, least)
    if shares < 2:
        return None
    control_bytes = CONTROL_WORDS * 8
    sizes = [_rounded(s, dt) for s in shapes]
    shared_sizes = [_rounded(s, dt) for s in shared]
    copy_bytes = control_bytes + sum(sizes)
    at = lw.arena_end + reserve_workspace(lw, sum(shared_sizes) + shares * copy_bytes)
    shared_locs = []
    for shape, n in zip(shared, shared_sizes):
        shared_locs.append(contiguous("arena", 0, at, TensorType(tuple(shape), dt)))
        at += n
    control = contiguous("arena", 0, at, TensorType((CONTROL_WORDS,), int64))
    at += control_bytes
    locs = []
    for shape, n in zip(shapes, sizes):
        locs.append(contiguous("arena", 0, at, TensorType(tuple(shape), dt)))
        at += n
    return Split(shares, units, copy_bytes, locs, control, shared_locs, rows)


def _rounded(shape, dt) -> int:
    n = dt.itemsize
    for d in shape:
        n *= d
    return -(-n // 64) * 64


def unit_range(b, kb, control: int, first: int = LO) -> tuple[ir.Value, ir.Value]:
    """(lo, hi) of a range kernel's units (or, with first=ROWS_LO, of a reduce kernel's
    rows), read from its control block (operand `control`)."""
    return kb.load(b, control, i64(first)), kb.load(b, control, i64(first + 1))


def over_units(b, n: int, nb: int, lo, hi, body) -> None:
    """body(b, first image, images) for the blocks of `nb` images numbered [lo, hi) of a
    batch of `n` (a constant): the whole blocks, then the partial last one (numbered n // nb,
    its size a constant too, so every GEMM keeps constant sizes)."""
    full, tail = (n // nb, n % nb) if type(n) is not int else divmod(n, nb)  # per call: nb 1
    end = b.select(b.icmp_signed("<", hi, size(b, full)), hi, size(b, full))
    with loop(b, lo, end, "block") as k:
        body(b, b.mul(k, i64(nb)), nb)
    if tail:
        with b.if_then(b.icmp_signed(">", hi, i64(full))):
            body(b, full * nb, tail)


@contextmanager
def units_loop(b, kb, split: Split | None, control: int, total, name: str):
    """`for i in range(total)` over a kernel's units; in a range kernel (`split`), over its
    share's [lo, hi) (operand `control`)."""
    lo, hi = (0, total) if split is None else unit_range(b, kb, control)
    with loop(b, lo, hi, name) as i:
        yield i


def temporaries(lw, dt, shapes, units, macs) -> tuple[Split | None, list[Loc]]:
    """(the Split or None, the kernel's temporaries): `shapes` in the module's workspace for
    a serial kernel; for a split one share 0's copies and, last, its control block."""
    split = plan_split(lw, dt, shapes, units, macs)
    if split is None:
        return None, workspace(lw, dt, *shapes)
    return split, split.locs + [split.control]


def channel_kernel(lw, name: str, locs: list[Loc], recipe, channels: int, work: int,
                   body) -> Kernel:
    """A kernel of its own on `locs` (the driver calls it between the kernel's other
    steps), forked over `channels` where `work` (elements written) reaches kernels'
    threshold: `body(b, kb, ids, (lo, hi))` emits the work of channels [lo, hi), the
    calling thread's contiguous share (all of them on one thread), the share a split kernel
    over the same channels gets next (pool.py's batch norm after a convolution)."""
    kb, ids = image_kernel(lw, name, locs, recipe)
    b = kb.begin(parallel=True, work=work)
    if b is None:  # built before for a node of the same geometry
        return kb.kernel
    body(b, kb, ids, kb.outer_range(b, channels))
    return kb.finish(b)


def _strided(b, start, stop, step, name: str):
    """`for i in range(start, stop, step)` over i64 values (step > 0)."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    end = b.append_basic_block(f"{name}.end")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", i, stop), body, end)
    b.position_at_end(body)
    return i, head, end


def _wrapper(lw, names, n_args: int, per_share, control, swapped, split: Split,
             status: bool = False) -> str:
    """Emit `<range kernel>.split` and its worker (see the module docstring); its name.
    `names`: the range kernel's, the reduce kernel's and the prelude's (or None). `status`:
    the range kernel returns an i32 status (0, or an error's 1-based index); each share's is
    kept in its control block, and the wrapper returns the first share's that is not 0."""
    module = lw.module
    name = names[0] + ".split"
    ptrs = [PTR] * n_args
    range_fn, reduce_fn, prelude_fn = (None if n is None else module.get_global(n)
                                       for n in names)
    declare = lw.declare
    thread_num = declare("omp_get_thread_num", ir.FunctionType(I32, []))
    num_threads = declare("omp_get_num_threads", ir.FunctionType(I32, []))
    max_threads = declare("omp_get_max_threads", ir.FunctionType(I32, []))
    barrier = declare("GOMP_barrier", ir.FunctionType(ir.VoidType(), []))
    gomp = declare("GOMP_parallel", ir.FunctionType(ir.VoidType(), [PTR, PTR, I32, I32]))
    enter = declare(threads.SPLIT_ENTER, ir.FunctionType(ir.VoidType(), []))
    leave = declare(threads.SPLIT_EXIT, ir.FunctionType(ir.VoidType(), []))

    def moved(b, p, s):
        return b.gep(p, [b.mul(s, i64(split.copy_bytes))], source_etype=I8)

    def word(b, ctrl, k):
        return b.gep(ctrl, [i64(k)], source_etype=I64)

    # ---- the worker: thread t of n runs shares t, t + n, ... -----------------------------
    worker = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name + ".omp")
    worker.attributes.add("nounwind")
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    args = [b.load(b.gep(worker.args[0], [i64(k)], source_etype=PTR), typ=PTR)
            for k in range(n_args)]
    t = b.sext(b.call(thread_num, []), I64)
    n = b.sext(b.call(num_threads, []), I64)
    shares = b.load(word(b, args[control], SHARES), typ=I64)

    def each_share(b, call):
        s, head, end = _strided(b, t, shares, n, "share")
        call(b, s)
        s.add_incoming(b.add(s, n), b.block)
        b.branch(head)
        b.position_at_end(end)

    def run_share(b, s):
        here = [moved(b, p, s) if k in per_share else p for k, p in enumerate(args)]
        if swapped is not None:
            target, partial = swapped
            here[target] = b.select(b.icmp_signed("==", s, i64(0)), args[target],
                                    moved(b, args[partial], s))
        done = b.call(range_fn, here)
        if status:
            b.store(b.sext(done, I64), word(b, here[control], STATUS))

    each_share(b, run_share)
    if reduce_fn is not None:
        b.call(barrier, [])

        def reduce_share(b, s):
            here = list(args)
            here[control] = moved(b, args[control], s)
            b.call(reduce_fn, here)

        each_share(b, reduce_share)
    b.ret_void()

    # ---- the kernel the driver calls -----------------------------------------------------
    fn = ir.Function(module, ir.FunctionType(I32 if status else ir.VoidType(), ptrs), name)
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args = list(fn.args)
    if prelude_fn is not None:
        b.call(prelude_fn, args)
    most = b.sext(b.call(max_threads, []), I64)
    count = b.select(b.icmp_signed("<", most, i64(split.shares)), most, i64(split.shares))
    units = size(b, split.units)  # known per call where the batch is
    count = b.select(b.icmp_signed("<", units, count), units, count)
    with b.if_then(b.icmp_signed("<=", count, i64(1))):
        ctrl = args[control]
        for k, v in ((LO, 0), (HI, units), (ROWS_LO, 0), (ROWS_HI, split.rows),
                     (SHARES, 1)):
            b.store(size(b, v), word(b, ctrl, k))
        done = b.call(range_fn, args)
        if reduce_fn is not None:
            b.call(reduce_fn, args)
        if status:
            b.ret(done)
        else:
            b.ret_void()
    with loop(b, 0, count, "plan") as s:
        ctrl = moved(b, args[control], s)
        for k, total in ((LO, units), (ROWS_LO, split.rows)):
            lo = b.udiv(b.mul(s, size(b, total)), count)
            hi = b.udiv(b.mul(b.add(s, i64(1)), size(b, total)), count)
            b.store(lo, word(b, ctrl, k))
            b.store(hi, word(b, ctrl, k + 1))
        b.store(count, word(b, ctrl, SHARES))
    b.call(enter, [])  # the BLAS on one thread until the last split region leaves
    table = b.alloca(PTR, size=n_args)
    for k, a in enumerate(args):
        b.store(a, b.gep(table, [i64(k)], source_etype=PTR))
    b.call(gomp, [worker, table, b.trunc(count, I32), ir.Constant(I32, 0)])
    b.call(leave, [])
    if not status:
        b.ret_void()
        return name
    with b.goto_entry_block():
        first = b.alloca(I32)  # the first share's status that is not 0 (shares in order)
    b.store(ir.Constant(I32, 0), first)
    with loop(b, 0, count, "status") as s:
        got = b.trunc(b.load(word(b, moved(b, args[control], s), STATUS), typ=I64), I32)
        seen = b.load(first, typ=I32)
        b.store(b.select(b.icmp_signed("!=", seen, ir.Constant(I32, 0)), seen, got), first)
    b.ret(b.load(first, typ=I32))
    return name
