"""kernels: LLVM functions that apply per-element code over a domain of tensor elements.

The third layer of the CPU code generator (values <- scalars <- kernels <- codegen).

- `Codegen`: one LLVM module under construction (its `Scalars`, the BLAS, external
  declarations, backend scratch bytes past the plan's arena, unique kernel names).
- `KernelBuilder`: one kernel over a domain `shape`. Each `operand` is a Loc read or written
  with element strides over the domain (broadcast by strides: 0 along broadcast dims), or a
  `virtual` arange computed from the offset. `begin` makes the function, `nest` the loops
  (over `values.collapse`d dims, innermost last, constant trip counts), `load` / `store`
  one element, `finish` returns the `Kernel`.
- `Kernel`: its name and its pointer arguments, one per distinct Loc region, in the order
  the driver passes them; `status` kernels return i32 (0, or an error's 1-based index).
- `Body`: a fused node's (or one elementwise node's) `graphc.ops.fused.FusedBody`;
  `evaluate` renders the ones an element needs through `Scalars`.

Shared kernels: a lowering that passes `KernelBuilder(..., recipe=...)` (everything its code
depends on besides the operands: op, body, attributes, constants) lets `begin` find a kernel
built before with the same recipe, domain, parallel request and operands (per operand: its
dtype, element strides, arange, and which pointer argument it reads, so aliasing and
in-place writes are part of the key; a region's offset is not, the driver passes it).
`begin` then returns None and `kernel` is that function called with this node's pointers:
the unrolled LSTM training step's 1,221 calls go to 65 functions. Status kernels (their error
indices name a node) and kernels built without a recipe are never shared; a recipe holding
a value `_frozen` cannot key exactly (floats by their bits, so -0.0 is not 0.0) is not either.

Invariants: a kernel takes one pointer per distinct memory region, all `noalias` (an in-place
output and the input it overwrites are the same region, so the same argument); its loops run
over the domain's dimensions after merging the ones contiguous for every operand, innermost
last, with constant trip counts and strides, so contiguous loops vectorise. In a symbolic
graph (graphc.backends.cpu.runtime_sizes) a size, stride or offset may be a `Sym`: the
kernel then reads it from the call's sizes table (`Codegen.emit_size`). Kernels are
`nounwind noinline`: each stays one function the driver calls.

Parallel kernels: elementwise, copy and fill kernels over PARALLEL_MIN_ELEMENTS or more
(when libgomp is loaded), reductions as large whose outermost kept dim can lead
(`reduction_loops`), and loops of generated GEMMs over as much work (`gemm_work`), split
their outermost loop into one contiguous share per thread:
`<name>` calls libgomp's `GOMP_parallel` on `<name>.omp`, which calls `<name>.range(ptrs...,
lo, hi)`. Each element is computed by exactly the code of the serial loop, so results are bit
for bit the same. With sizes known per call, `<name>` weighs the same work per call
(`WorkPerCall`: elements, or a loop of GEMMs' multiply-adds) and runs the loop itself below
the threshold, so a symbolic graph forks at the sizes where the static graph does. libgomp
threads spin briefly (GOMP_SPINCOUNT, set by graphc.config when graphc is imported, unless
the user did) and then sleep, leaving the cores to the BLAS threads of a following GEMM.
`forked_range` forks a loop that is not a kernel of its own (a Winograd block's 16 GEMMs).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from graphc.backends.cpu.scalars import Scalars, const, convert
from graphc.backends.cpu.values import (
    F64,
    I1,
    I8,
    I32,
    I64,
    MEM,
    PTR,
    Loc,
    broadcast_strides,
    i64,
    loop,
    size,
    size_key,
    unsupported,
)
from graphc.ir.graph import Node
from graphc.ops.fused import FusedBody
from graphc.ops.registry import ELEMENTWISE, REGISTRY
from graphc.symbolic import Sym
from graphc.types import DType, TensorType, bool_, float64, int64

# A kernel over this many elements or more forks over the cores (when it may); below it,
# the fork and join (a few microseconds) cost more than the second core saves.
PARALLEL_MIN_ELEMENTS = 1 << 16
# A loop of generated GEMMs (graphc.backends.cpu.small_gemm: attention's heads, a medium
# product's row chunks, a weight gradient's column chunks) weighs this many multiply-adds
# as one element against PARALLEL_MIN_ELEMENTS (`gemm_work`): an elementwise element moves
# 8-12 bytes (~0.4-0.6 ns at 20 GB/s), a multiply-add in a register tile ~1/80 ns (~160
# GFLOP/s), so 16 of them are less work than one element, and a loop forks from ~1M
# multiply-adds (~13 us on one core). With small_gemm.MIN_K = 16, every loop that forked
# when only its outputs were counted still does. The MLP b64 step's W1 @ x^T and W2 @ h^T (two row
# chunks of 128 x 64, k 784 and 256) fork now: 16,384 outputs alone stayed serial
# (docs/performance.md, "The MLP b64 step on two threads").
GEMM_MACS_PER_ELEMENT = 16


@dataclass(frozen=True)
class WorkPerCall:
    """A parallel loop's work known only per call (sizes read from the call's table):
    `units`, `per_element` of which weigh one element against PARALLEL_MIN_ELEMENTS. The
    check `units >= least_units` per call decides as `units // per_element >=
    PARALLEL_MIN_ELEMENTS` does for a count known when compiling (for whole numbers,
    floor(u / p) >= N exactly when u >= N * p), so a symbolic graph forks at the sizes where
    the static graph of the same sizes does."""

    units: Sym
    per_element: int = 1

    @property
    def least_units(self) -> int:
        return PARALLEL_MIN_ELEMENTS * self.per_element


def gemm_work(products, m, n, k):
    """The elements a loop of `products` generated m x n x k GEMMs weighs against
    PARALLEL_MIN_ELEMENTS (KernelBuilder.begin's `work`): its multiply-adds over
    GEMM_MACS_PER_ELEMENT; a symbolic count (a batch of products known per call) as a
    WorkPerCall of the same weight."""
    macs = products * m * n * k
    if type(macs) is Sym:
        return WorkPerCall(macs, GEMM_MACS_PER_ELEMENT)
    return macs // GEMM_MACS_PER_ELEMENT


def forks(openmp: bool, work: int) -> bool:
    """Whether a loop of `work` elements (`gemm_work` for a loop of GEMMs), known when
    compiling, forks over the cores: libgomp loaded and PARALLEL_MIN_ELEMENTS or more, as
    KernelBuilder.begin decides for its kernels."""
    return bool(openmp) and work >= PARALLEL_MIN_ELEMENTS


def reduction_loops(cg: "Codegen", domain, sizes: list, strides: list,
                    out: int) -> tuple[list, list, bool]:
    """(sizes, strides, parallel) of a reduction kernel's collapsed loops over `domain`
    (`strides`: one tuple per operand; operand `out` the result, stride 0 along the reduced
    dims). Where the kernel forks (`forks` on the domain's elements) and a kept dim can go
    outermost (`kept_outermost`), the loops with it outermost and parallel True: each share
    of the outermost loop then writes its own contiguous range of the result
    (`result_share`); else the loops as they are, serial."""
    work = math.prod(domain)
    if type(work) is not int or not forks(cg.openmp, work):
        return sizes, strides, False
    moved = kept_outermost(sizes, strides, out, cg.most_threads)
    return (sizes, strides, False) if moved is None else (*moved, True)


def kept_outermost(sizes, strides, out: int, parts) -> tuple[list, list] | None:
    """A reduction's collapsed loops with a kept dim outermost, or None where none can be.
    The outermost kept dim (the result's slowest): as it is if outermost already; in the
    middle (a batch norm's channels between the images and the planes) cut into `parts()`
    parts (one a thread; its size a multiple of them), the parts outermost and each part's
    channels where they were, so a thread still walks each image's channels of its part as
    one contiguous run. The reduced loops keep their order, so every element of the result
    adds the same values in the same order as before (the same bits). Not where the only
    kept dim is the innermost (a column sum, GPT's bias gradients: graphc.backends.cpu.
    column_parts cuts its rows into parts with partial sums instead; cut into one part of
    its columns a thread, each walking half of every row, GPT's [1024 x 512] sums took 185-225 ->
    268-345 us on one thread and gained little on two; its [1024 x 128] ones took 5-17 us,
    less than a fork). Moving the channels outermost whole instead walked a plane at a time
    C planes apart: ResNet-18's batch-norm sums 12.6 -> 18.3 ms on one thread."""
    if not sizes or any(type(n) is not int for n in sizes):
        return None
    kept = [d for d, s in enumerate(strides[out]) if s != 0]
    if not kept or kept[0] == len(sizes) - 1:
        return None
    d = kept[0]
    if d == 0:
        return list(sizes), list(strides)
    count = parts()
    if count < 2 or sizes[d] % count:
        return None
    chunk = sizes[d] // count
    return [count] + [chunk if e == d else n for e, n in enumerate(sizes)], \
        [(s[d] * chunk,) + tuple(s) for s in strides]


def result_share(kb: "KernelBuilder", b, sizes, strides, out: int, count: int) -> tuple:
    """(lo, hi): the result elements a reduction kernel from `reduction_loops` writes: in a
    parallel kernel its share of the outermost (kept) loop's, else all `count`."""
    if not kb.parallel:
        return i64(0), size(b, count)
    lo, hi = kb.outer_range(b, sizes[0])
    step = i64(strides[out][0])
    return b.mul(lo, step), b.mul(hi, step)


def forked_range(module: ir.Module, range_fn: ir.Function, name: str, total: int) -> ir.Function:
    """`name(args...)`, which runs `range_fn(args..., i64 lo, i64 hi)` over [0, total) split
    over libgomp's team: thread t of n gets the contiguous share [t * total / n, (t + 1) *
    total / n), so every index runs once, on the same code as on one thread (the same bits).
    On one thread, or inside another parallel region (libgomp gives a nested region a team
    of one), it runs every index on the calling thread. For a function whose loop is not a
    kernel of its own (KernelBuilder forks those): a Winograd block's 16 GEMMs
    (graphc.backends.cpu.winograd_gemm)."""
    params = list(range_fn.function_type.args[:-2])
    context = ir.LiteralStructType(params)
    worker = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), name + ".omp")
    worker.linkage = "internal"
    worker.attributes.add("nounwind")
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    args = [b.load(b.gep(worker.args[0], [ir.Constant(I32, 0), ir.Constant(I32, k)],
                         source_etype=context), typ=t) for k, t in enumerate(params)]
    thread = b.sext(b.call(_declared(module, "omp_get_thread_num", ir.FunctionType(I32, [])),
                           []), I64)
    team = b.sext(b.call(_declared(module, "omp_get_num_threads", ir.FunctionType(I32, [])),
                         []), I64)
    lo = b.sdiv(b.mul(thread, i64(total)), team)
    hi = b.sdiv(b.mul(b.add(thread, i64(1)), i64(total)), team)
    with b.if_then(b.icmp_signed("<", lo, hi)):
        b.call(range_fn, args + [lo, hi])
    b.ret_void()

    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.attributes.add("nounwind")
    fn.attributes.add("noinline")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    table = b.alloca(context)  # a typed pointer (llvmlite): its gep takes no source_etype
    for k, arg in enumerate(fn.args):
        b.store(arg, b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
    table = b.bitcast(table, PTR)
    gomp = _declared(module, "GOMP_parallel", ir.FunctionType(ir.VoidType(),
                                                             [PTR, PTR, I32, I32]))
    b.call(gomp, [worker, table, ir.Constant(I32, 0), ir.Constant(I32, 0)])
    b.ret_void()
    return fn


def _declared(module: ir.Module, name: str, ftype: ir.FunctionType) -> ir.Function:
    """The module's declaration of `name`, made on first use."""
    known = module.globals.get(name)
    return known if known is not None else ir.Function(module, ftype, name)


@dataclass
class Operand:
    """A tensor a kernel reads or writes: its Loc and element strides over the domain.
    A virtual operand (`loc` None) is an arange: its value is start + step * offset."""

    loc: Loc | None
    dtype: object
    strides: tuple[int, ...]
    arange: tuple[float, float] | None = None  # (start, step)


@dataclass
class Kernel:
    """One kernel function: name, the Loc regions its pointer arguments are, IR function."""

    name: str
    regions: list[tuple] = field(default_factory=list)
    args: list[Loc] = field(default_factory=list)
    status: bool = False  # returns i32: 0, or the 1-based index of an error message


class KernelBuilder:
    """Builds one `void name(ptr noalias...)` function over a domain of `shape`. `recipe`:
    what the function's code depends on besides its operands, for `begin` to reuse a
    kernel built before (see the module docstring); None: always built."""

    def __init__(self, cg: "Codegen", name: str, shape: tuple[int, ...],
                 recipe: object = None) -> None:
        self.cg = cg
        self.shape = tuple(shape)
        self.kernel = Kernel(name)
        self.operands: list[Operand] = []
        self.parallel = False
        self.outer_size = 1  # a parallel kernel's outermost trip count (set by nest)
        self.recipe = recipe
        self.key: tuple | None = None  # set by begin when this kernel may be shared
        self.work: int | WorkPerCall = 0  # what a parallel kernel's fork weighs (begin)

    def operand(self, loc: Loc, strides: tuple[int, ...] | None = None) -> int:
        """Read or write `loc` broadcast over the domain (or with explicit element strides)."""
        if strides is None:
            item = loc.type.dtype.itemsize
            strides = broadcast_strides(loc.type.shape, tuple(s // item for s in loc.strides),
                                        self.shape)
        if loc.region not in self.kernel.regions:
            self.kernel.regions.append(loc.region)
            self.kernel.args.append(loc)
        self.operands.append(Operand(loc, loc.type.dtype, tuple(strides)))
        return len(self.operands) - 1

    def virtual(self, dtype, start: float, step: float, strides) -> int:
        self.operands.append(Operand(None, dtype, tuple(strides), (start, step)))
        return len(self.operands) - 1

    def begin(self, parallel: bool = False,
              work: int | Sym | WorkPerCall | None = None) -> ir.IRBuilder | None:
        """Start the kernel function. `parallel` (a void kernel whose outermost loop's
        iterations are independent, over PARALLEL_MIN_ELEMENTS or more, with libgomp loaded):
        the loops go into `<name>.range(ptrs..., i64 lo, i64 hi)`, which runs the outermost
        loop from lo to hi, and `finish` makes `<name>` fork it over the cores. `work`: the
        elements that threshold weighs where the domain's own count understates them (a
        loop of generated GEMMs: each iteration writes a whole product, `gemm_work`). Work
        known only per call (a Sym, or a WorkPerCall) makes the kernel parallel, and `<name>`
        weighs that same work at each call before it forks (`_fork`).

        None (only with a recipe): the same function was built before; `kernel` is now it,
        called with this builder's pointers, and the caller emits nothing."""
        self.key = self._key(parallel)
        built = self.cg.built.get(self.key) if self.key is not None else None
        if built is not None:
            self.kernel.name = built.name
            return None
        work = math.prod(self.shape) if work is None else work
        if type(work) is Sym:
            work = WorkPerCall(work)
        self.work = work
        self.parallel = (parallel and not self.kernel.status and self.cg.openmp
                         and (type(work) is WorkPerCall or work >= PARALLEL_MIN_ELEMENTS))
        ret = I32 if self.kernel.status else ir.VoidType()
        params = [PTR] * len(self.kernel.regions) + ([I64, I64] if self.parallel else [])
        name = self.kernel.name + (".range" if self.parallel else "")
        fn = ir.Function(self.cg.module, ir.FunctionType(ret, params), name)
        for a in fn.args[:len(self.kernel.regions)]:
            a.add_attribute("noalias")
        fn.attributes.add("nounwind")
        fn.attributes.add("noinline")
        self.fn = fn
        return ir.IRBuilder(fn.append_basic_block("entry"))

    def _key(self, parallel: bool) -> tuple | None:
        """What the function's text depends on, or None when it may not be shared."""
        if self.recipe is None or self.kernel.status or self.cg.built is None:
            return None
        try:
            recipe = _frozen(self.recipe)
        except _Unkeyable:
            return None
        regions = self.kernel.regions
        operands = tuple((None if o.loc is None else regions.index(o.loc.region),
                          o.dtype.name, tuple(size_key(s) for s in o.strides),
                          _frozen(o.arange))
                         for o in self.operands)
        return (recipe, tuple(size_key(n) for n in self.shape), bool(parallel), len(regions),
                operands)

    def pointer(self, b, k: int, offset) -> ir.Value:
        op = self.operands[k]
        base = self.fn.args[self.kernel.regions.index(op.loc.region)]
        return b.gep(base, [offset], inbounds=True, source_etype=MEM[op.dtype.name])

    def load(self, b, k: int, offset):
        op = self.operands[k]
        if op.arange is not None:
            start, step = op.arange
            dt = op.dtype
            if dt.is_floating:
                f = b.sitofp(offset, F64)
                v = b.fadd(ir.Constant(F64, start), b.fmul(ir.Constant(F64, step), f))
                return convert(b, v, float64, dt)
            v = b.add(i64(int(start)), b.mul(i64(int(step)), offset))
            return convert(b, v, int64, dt)
        v = b.load(self.pointer(b, k, offset), typ=MEM[op.dtype.name])
        return b.trunc(v, I1) if op.dtype is bool_ else v

    def store(self, b, k: int, offset, value, streaming: bool = False) -> None:
        """`streaming`: a non-temporal store (no read for ownership, the line not kept in
        cache) for an output nothing reads soon, where the host has them (x86-64: call
        `drain` before the kernel returns)."""
        op = self.operands[k]
        if op.dtype is bool_:
            value = b.zext(value, I8)
        store = b.store(value, self.pointer(b, k, offset))
        if streaming and streaming_stores():
            # The vectorizer widens a non-temporal store only where the target has an aligned
            # one of two elements (x86: align >= 8); the widened store, under-aligned for
            # movntps, is lowered to 8-byte movnti, which x86 allows at any address, as it
            # does the scalar remainder's stores: the alignment only lets it vectorise.
            store.align = max(2 * op.dtype.itemsize, 8)
            store.set_metadata("nontemporal", self.cg.module.add_metadata([ir.Constant(I32, 1)]))

    def drain(self, b) -> None:
        """Make this kernel's non-temporal stores visible before it returns (sfence)."""
        if streaming_stores():
            sfence = ir.FunctionType(ir.VoidType(), [])
            b.call(self.cg.declare("llvm.x86.sse.sfence", sfence), [])

    def outer_range(self, b, total) -> tuple:
        """(lo, hi) of the outermost loop for a kernel that writes its loops by hand (not
        with `nest`): in a parallel kernel this thread's share of range(total) (the
        `.range` function's last two arguments; `finish` forks over `total`), else (0,
        total)."""
        if not self.parallel:
            return i64(0), size(b, total)
        self.outer_size = total
        return self.fn.args[-2], self.fn.args[-1]

    def nest(self, b, sizes, strides, leaf, inner=None, depth=0, offsets=None):
        """Loops over collapsed `sizes`; `leaf(b, offsets)` per element.

        `inner`, when given, is (before, after) called around the innermost loop."""
        if offsets is None:
            offsets = [i64(0)] * len(self.operands)
        if depth == len(sizes):
            leaf(b, offsets)
            return
        last = depth == len(sizes) - 1
        state = inner[0](b, offsets) if inner and last else None
        bounds = (self.fn.args[-2], self.fn.args[-1]) if self.parallel and depth == 0 \
            else (0, size(b, sizes[depth]))
        if self.parallel and depth == 0:
            self.outer_size = sizes[0]
        with loop(b, *bounds, f"d{depth}") as i:
            new = []
            for o, s in zip(offsets, strides):
                if s[depth] == 0:
                    new.append(o)
                else:
                    step = i if s[depth] == 1 else b.mul(i, size(b, s[depth]))
                    new.append(step if isinstance(o, ir.Constant) and o.constant == 0
                               else b.add(o, step))
            self.nest(b, sizes, strides, leaf, inner, depth + 1, new)
        if inner and last:
            inner[1](b, offsets, state)

    def finish(self, b) -> Kernel:
        b.ret_void()
        if self.parallel:
            self._fork(self.outer_size, self.work)
        if self.key is not None:
            self.cg.built[self.key] = self.kernel
        return self.kernel

    def _fork(self, outer, work) -> None:
        """`<name>(ptrs...)`: GOMP_parallel over `<name>.omp(ptr args)`, whose thread t of n
        calls `<name>.range(ptrs..., lo, hi)` on its contiguous share of [0, outer). With
        sizes known per call (`work` a WorkPerCall: begin's work, the domain's elements or
        a loop of GEMMs' multiply-adds), `<name>` first weighs it and runs the whole range
        itself below PARALLEL_MIN_ELEMENTS' worth, as begin decides for sizes known now."""
        cg, n = self.cg, len(self.kernel.regions)
        worker = ir.Function(cg.module, ir.FunctionType(ir.VoidType(), [PTR]),
                             self.kernel.name + ".omp")
        worker.attributes.add("nounwind")
        b = ir.IRBuilder(worker.append_basic_block("entry"))
        table = worker.args[0]
        ptrs = [b.load(b.gep(table, [i64(k)], source_etype=PTR), typ=PTR) for k in range(n)]
        thread = b.sext(b.call(cg.declare("omp_get_thread_num", ir.FunctionType(I32, [])), []),
                        I64)
        threads = b.sext(b.call(cg.declare("omp_get_num_threads", ir.FunctionType(I32, [])),
                                []), I64)
        outer_v = size(b, outer)
        share = b.sdiv(b.add(outer_v, b.sub(threads, i64(1))), threads)
        lo = b.mul(thread, share)
        hi = b.add(lo, share)
        hi = b.select(b.icmp_signed("<", hi, outer_v), hi, outer_v)
        with b.if_then(b.icmp_signed("<", lo, hi)):
            b.call(self.fn, ptrs + [lo, hi])
        b.ret_void()

        kernel = ir.Function(cg.module, ir.FunctionType(ir.VoidType(), [PTR] * n),
                             self.kernel.name)
        kernel.attributes.add("nounwind")
        kernel.attributes.add("noinline")
        b = ir.IRBuilder(kernel.append_basic_block("entry"))
        if type(work) is WorkPerCall:  # small at this call: one thread, no fork
            with b.if_then(b.icmp_signed("<", size(b, work.units), i64(work.least_units)),
                           likely=False):
                b.call(self.fn, list(kernel.args) + [i64(0), size(b, outer)])
                b.ret_void()
        table = b.alloca(PTR, size=max(n, 1))
        for k, arg in enumerate(kernel.args):
            b.store(arg, b.gep(table, [i64(k)], source_etype=PTR))
        gomp = cg.declare("GOMP_parallel", ir.FunctionType(
            ir.VoidType(), [PTR, PTR, I32, I32]))
        b.call(gomp, [worker, table, ir.Constant(I32, 0), ir.Constant(I32, 0)])
        b.ret_void()


class _Unkeyable(Exception):
    """A recipe value `_frozen` has no exact key for."""


def _frozen(x) -> tuple:
    """An exact, hashable key of a recipe value, tagged by type: 1, 1.0 and True differ,
    floats are keyed by their bits (-0.0 is not 0.0, a NaN matches its own bits)."""
    kind = type(x)  # the common exact types first: recipes hold many
    if kind is int or kind is str:
        return (kind.__name__, x)
    if kind is tuple:
        return ("tuple", tuple(_frozen(v) for v in x))
    if x is None or isinstance(x, str):
        return ("str" if x is not None else "none", x)
    if isinstance(x, (bool, np.bool_)):
        return ("bool", bool(x))
    if isinstance(x, (int, np.integer)):
        return ("int", int(x))
    if isinstance(x, (float, np.floating)):
        return (type(x).__name__, struct.pack("<d", float(x)))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_frozen(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((_frozen(k), _frozen(v)) for k, v in x.items()))
    if isinstance(x, DType):
        return ("dtype", x.name)
    if isinstance(x, TensorType):
        return ("type", tuple(size_key(n) for n in x.shape), x.dtype.name)
    if kind is Sym:
        return size_key(x)
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.shape, x.tobytes())
    raise _Unkeyable(type(x).__name__)


def filled(b, dtype, value) -> ir.Value:
    """The constant `value` as `dtype`; a symbolic size (a count known per call, e.g. the
    N*H*W a batch norm's gradient divides by) converted from its i64."""
    if type(value) is Sym:
        return convert(b, size(b, value), int64, dtype)
    return const(dtype, value)


# Build each distinct kernel once (KernelBuilder recipes); False builds one per call.
SHARE_KERNELS = True


class Codegen:
    """One LLVM module under construction: kernels, BLAS declarations, the driver.
    `openmp`: whether libgomp is loaded, so kernels may fork over the cores;
    `most_threads()`: how many threads a forked kernel's parts may be cut for (the backend's
    graphc.backends.cpu.threads.most_threads; kernels stay below the thread runtime). `built`:
    the shared kernels by key (None when SHARE_KERNELS is off)."""

    def __init__(self, name: str, blas, openmp: bool = False, most_threads=lambda: 1) -> None:
        import llvmlite.binding as llvm

        self.openmp = openmp
        self.most_threads = most_threads
        self.module = ir.Module(name=name)
        self.module.triple = llvm.get_process_triple()
        self.scalars = Scalars(self.module)
        self.blas = blas
        self.scratch = 0  # bytes of backend scratch past the plan's arena (a Sym: per call)
        self.dim_slots: dict[str, int] = {}  # symbol -> its slot in the sizes table
        self._dims = None  # the module's `graphc.dims` global, made on first use
        self.driver_fn = self.dims_arg = None  # the driver and its sizes-table argument
        self._count = 0
        self._decls: dict[str, ir.Function] = {}
        self.built: dict[tuple, Kernel] | None = {} if SHARE_KERNELS else None

    def name(self, op: str) -> str:
        self._count += 1
        return f"k{self._count}_{op}"

    def add_scratch(self, nbytes) -> int:
        """The offset (past the plan's arena) of `nbytes` more bytes of backend scratch,
        64-byte aligned; a symbolic size is rounded up term by term (every coefficient to a
        multiple of 64: as large for every size, and aligned)."""
        at = self.scratch
        if type(nbytes) is Sym:
            self.scratch += Sym._make({m: -(-c // 64) * 64 for m, c in nbytes.terms})
        else:
            self.scratch += -(-nbytes // 64) * 64
        return at

    # ---- sizes known per call (graphc.backends.cpu.runtime_sizes) ------------------------
    def emit_size(self, b: ir.IRBuilder, x: Sym) -> ir.Value:
        """`x` as an i64 computed from the call's sizes table: the driver stores its `dims`
        argument in the module's `graphc.dims` (and reads it from the argument itself);
        symbol `name` is slot `dim_slots[name]`."""
        if self._dims is None:
            self._dims = ir.GlobalVariable(self.module, PTR, "graphc.dims")
            self._dims.linkage = "internal"
            self._dims.initializer = ir.Constant(PTR, None)
            self._invariant = self.module.add_metadata([])
        table = self.dims_arg if b.function is self.driver_fn else b.load(self._dims, typ=PTR)
        total = None
        for monomial, coeff in x.terms:
            term = None
            for name in monomial:
                slot = self.dim_slots.setdefault(name, len(self.dim_slots))
                v = b.load(b.gep(table, [i64(slot)], source_etype=I64), typ=I64)
                v.set_metadata("invariant.load", self._invariant)
                term = v if term is None else b.mul(term, v)
            if term is None:
                term = i64(coeff)
            elif coeff != 1:
                term = b.mul(term, i64(coeff))
            total = term if total is None else b.add(total, term)
        return total

    def declare(self, name: str, ftype: ir.FunctionType) -> ir.Function:
        if name not in self._decls:
            # an emitter that declared it on the module itself (an intrinsic such as
            # llvm.prefetch.p0) must not make a second declaration fail
            known = self.module.globals.get(name)
            self._decls[name] = known if known is not None else ir.Function(self.module,
                                                                            ftype, name)
        return self._decls[name]


def streaming_stores() -> bool:
    """Whether KernelBuilder.store(streaming=True) emits non-temporal stores: x86-64 hosts."""
    import llvmlite.binding as llvm

    return llvm.get_process_triple().startswith("x86_64")


# ---- bodies: the instructions of a fused node (or of one elementwise node) ------------------
_BODY_OPS = ("broadcast_to", "full", "arange")


@dataclass(frozen=True)
class Combined:
    """A body ref read as several Locs' elements at the same offset, combined by generated
    code (a bucket's sum over the ranks' shared-memory windows, graphc.backends.cpu.
    collective_shm): `combine(b, values)` renders it; `key` names that code (kernel sharing)."""

    locs: tuple[Loc, ...]
    combine: object
    key: tuple


class Body:
    """A node's `FusedBody` (graphc.ops.fused, the one decoder of bodies) and how to render
    it; refs < n are the node's inputs."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.fused = FusedBody.of_node(node)
        self.n = self.fused.n_inputs
        self.instrs = self.fused.instructions
        self.outputs = self.fused.outputs
        self.types = self.fused.types

    def recipe(self, kind: str, start: int, extra: dict | None) -> tuple:
        """A KernelBuilder recipe of a `kind` kernel rendering this body from instruction
        `start`, the refs in `extra` read from other Locs: what its code depends on besides
        the operands (the body, its types, the node's output types)."""
        return (kind, self.n, self.instrs, self.outputs, self.types, start, sorted(extra or ()),
                [v.type for v in self.node.outputs])

    def evaluate(self, cg: Codegen, kb: KernelBuilder, b, offsets, leaves: dict[int, int],
                 stop: int, wanted, combined: dict | None = None) -> dict[int, ir.Value]:
        """Register values of the refs in `wanted` (and what they need), instructions < stop.
        `combined`: ref -> (operand indices, combine(b, values)) for refs rendered from
        several operands' elements (a `Combined` leaf)."""
        env: dict[int, ir.Value] = {}

        def value(ref: int):
            if ref in env:
                return env[ref]
            if ref in leaves:
                env[ref] = kb.load(b, leaves[ref], offsets[leaves[ref]])
                return env[ref]
            if combined and ref in combined:
                operands, combine = combined[ref]
                env[ref] = combine(b, [kb.load(b, k, offsets[k]) for k in operands])
                return env[ref]
            op, args, attrs = self.instrs[ref - self.n]
            t = self.types[ref]
            if op == "broadcast_to":
                env[ref] = value(args[0])
            elif op == "full":
                env[ref] = filled(b, t.dtype, attrs["value"])
            else:
                vals = [value(a) for a in args]
                try:
                    env[ref] = cg.scalars.emit(b, REGISTRY[op].scalar, attrs, vals,
                                               [self.types[a].dtype for a in args], t)
                except KeyError:
                    raise unsupported(self.node, f"the scalar op {op!r}") from None
            return env[ref]

        for ref in wanted:
            value(ref)
        return env

    def check(self, start: int, stop: int) -> None:
        for op, _, _ in self.instrs[start:stop]:
            d = REGISTRY[op]
            if op not in _BODY_OPS and (d.kind != ELEMENTWISE or d.scalar is None):
                raise unsupported(self.node, f"{op!r} inside a fused body")
