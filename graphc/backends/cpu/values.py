"""values: where the tensors of a planned graph live, and the loops that walk them.

The bottom layer of the CPU code generator (values <- scalars <- kernels <- codegen): it
imports nothing else from the backend.

- LLVM types: `REG` maps a dtype name to its type in a register (bool is i1), `MEM` to its
  type in memory (bool is i8, as numpy stores it).
- `Loc`: a tensor in memory: base ("input" i = `inputs[i]`, "arena", "output" k =
  `outputs[k]`), byte offset from that base, byte strides, type. Values with the same
  `region` (base, index, offset) start at the same address, so a kernel passes them as one
  pointer argument. Offsets and strides are ints, or `Sym`s where sizes are known per call
  (graphc.backends.cpu.runtime_sizes: `size(b, x)` renders one as an i64).
- `Locations`: the Loc of every value of a planned graph. Graph inputs at `inputs[i]`
  (C-contiguous); intermediates at their buffer's arena offset (C-contiguous, or at the
  element strides the plan gives a GEMM result: `MemoryPlan.strides`); views (the
  plan's `views`) as a byte offset and byte strides into their root's memory, from the view
  op's `view_strides` rule (graphc.backends.common.view_of), the rule the plan uses too;
  update values the plan computes straight into an input (`in_input`) at that input. Nodes are
  placed in schedule order (`define`), so a view's source is always placed before the view.
- Loops: `loop` (bounds constant or run time), `for_range` (a constant trip count),
  `collapse` (drop size-1 dims and merge the ones contiguous for every operand, so inner
  loops are long and vectorise), `transpose_tiles` (a transposing 2-D walk in square tiles, so
  the strided side stays in L1), `broadcast_strides` (element strides of an operand read
  over a larger domain, graphc.backends.common's).
- Registers: `square_transposed` (a square of vectors transposed by shuffles, the kernels'
  in-register transposes), `lane_mask` (a shuffle's lane numbers).
- `CpuLoweringError` / `unsupported`: what every layer raises for a graph it cannot lower
  (graphc.backends.common.LoweringError's wording).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from graphc.backends.common import (
    LoweringError,
    broadcast_strides,  # noqa: F401  (re-exported: the other layers import it from here)
    byte_strides,
    contiguous_strides,
    element_strides,
    view_of,
)
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import format_node
from graphc.symbolic import Sym
from graphc.types import TensorType

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
REG = {"float32": F32, "float64": F64, "int64": I64, "bool": I1}  # in a register
MEM = {"float32": F32, "float64": F64, "int64": I64, "bool": I8}  # in memory


class CpuLoweringError(LoweringError):
    """An op (or a form of it) the CPU backend has no lowering for."""

    backend = "cpu"
    instead = ("interp",)


def unsupported(node: Node, what: str) -> CpuLoweringError:
    return CpuLoweringError.at(node, what)


# ---- where values live ---------------------------------------------------------------------
@dataclass(frozen=True)
class Loc:
    """A tensor in memory: base ("input" i, "arena", "output" k), byte offset, byte strides."""

    base: str
    index: int
    offset: int
    strides: tuple[int, ...]
    type: TensorType

    @property
    def region(self) -> tuple:
        return (self.base, self.index, size_key(self.offset))


def size_key(n) -> object:
    """A size, stride or offset as a key: an int as it is, a symbolic size by its canonical
    terms (comparing Syms themselves would guard: graphc.symbolic)."""
    return n if type(n) is not Sym else ("sym", n.terms)


def contiguous(base: str, index: int, offset: int, t: TensorType) -> Loc:
    return Loc(base, index, offset, contiguous_strides(t.shape, t.dtype.itemsize), t)


class Locations:
    """The Loc of every value of a planned graph (see the module docstring)."""

    def __init__(self, graph: Graph, plan, direct_outputs: dict[str, int] | None = None,
                 offset=None) -> None:
        self.plan = plan
        # value name -> its buffer's arena offset (an int, or a Sym read per call)
        self.offset = plan.offset if offset is None else offset
        self.direct_outputs = direct_outputs or {}  # value name -> its output slot
        self.locs: dict[Value, Loc] = {}
        index = {v.name: i for i, v in enumerate(graph.inputs)}
        for i, v in enumerate(graph.inputs):
            self.locs[v] = contiguous("input", i, 0, v.type)
        self._index = index

    def define(self, node: Node) -> None:
        """Place the outputs of `node` (called in schedule order)."""
        plan = self.plan
        for v in node.outputs:
            if v.name in plan.views:
                self.locs[v] = self.view(node, v)
            elif v.name in plan.in_input:
                self.locs[v] = contiguous("input", self._index[plan.in_input[v.name]], 0,
                                          v.type)
            elif v.name in self.direct_outputs:
                self.locs[v] = contiguous("output", self.direct_outputs[v.name], 0, v.type)
            elif v.name in plan.strides:  # laid out for the GEMM that writes it
                self.locs[v] = Loc("arena", 0, self.offset(v.name),
                                   byte_strides(plan.strides[v.name], v.type.dtype.itemsize),
                                   v.type)
            else:
                self.locs[v] = contiguous("arena", 0, self.offset(v.name), v.type)

    def view(self, node: Node, v: Value) -> Loc:
        """Where output `v` of the view op `node` lies in its source's memory."""
        src = self.locs[node.inputs[0]]
        item = src.type.dtype.itemsize
        found = view_of(node, src.type.shape, element_strides(src.strides, item))
        if found is None:
            raise CpuLoweringError(f"cpu backend: the plan treats {format_node(node)} as a "
                                   "view, but its kernel copies")
        offset, strides = found
        return Loc(src.base, src.index, src.offset + offset * item, byte_strides(strides, item),
                   v.type)

    def __getitem__(self, v: Value) -> Loc:
        return self.locs[v]


# ---- sizes known per call (graphc.backends.cpu.runtime_sizes) -----------------------------
_emitter = threading.local()


@contextmanager
def runtime_sizes(emit):
    """Inside: `size(b, x)` renders a symbolic size `x` (a `Sym`) as `emit(b, x)`, an i64
    computed from the call's sizes table, instead of specialising it."""
    previous = getattr(_emitter, "emit", None)
    _emitter.emit = emit
    try:
        yield
    finally:
        _emitter.emit = previous


def size(b: ir.IRBuilder, x) -> ir.Value:
    """A size, stride or offset as an i64: an int as a constant, an IR value as it is, a
    symbolic size from the call's sizes (inside `runtime_sizes`; elsewhere it specialises to
    the trace's size, guarded: graphc.symbolic)."""
    if isinstance(x, ir.Value):
        return x
    if type(x) is Sym:
        emit = getattr(_emitter, "emit", None)
        if emit is not None:
            return emit(b, x)
    return ir.Constant(I64, int(x))


# ---- loops ---------------------------------------------------------------------------------
def i64(n: int) -> ir.Constant:
    """An i64 constant; a symbolic size specialises (graphc.symbolic: guarded): code that
    can take it per call uses `size(b, n)`."""
    return ir.Constant(I64, n if type(n) is int else int(n))


@contextmanager
def loop(b: ir.IRBuilder, start, stop, name: str = "i"):
    """`for i in range(start, stop)`, bounds ints, symbolic sizes (`size`) or i64 values;
    the builder ends after it."""
    pre = b.block
    head = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    end = b.append_basic_block(f"{name}.end")
    first, stop = size(b, start), size(b, stop)  # in `pre`: sizes are computed once
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, name=name)
    i.add_incoming(first, pre)
    b.cbranch(b.icmp_signed("<", i, stop), body, end)
    b.position_at_end(body)
    yield i
    nxt = b.add(i, i64(1), name=f"{name}.next")
    nxt.flags.append("nsw")
    i.add_incoming(nxt, b.block)
    b.branch(head)
    b.position_at_end(end)


def for_range(b: ir.IRBuilder, count: int, name: str = "i"):
    """`for i in range(count)` (count a constant); the builder ends after the loop."""
    return loop(b, 0, count, name)


def as_i64(x) -> ir.Value:
    """An int as an i64 constant; an IR value as it is."""
    return i64(x) if isinstance(x, int) else x


def collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]):
    """Drop size-1 dims and merge neighbours contiguous for every operand.

    Returns (sizes, per-operand strides) over the remaining dims, outermost first."""
    dims = [(n, [s[d] for s in strides]) for d, n in enumerate(shape) if n != 1]
    out: list[tuple[int, list[int]]] = []
    for n, ss in dims:
        if out:
            pn, ps = out[-1]
            if all(p == s * n for p, s in zip(ps, ss)):
                out[-1] = (pn * n, ss)
                continue
        out.append((n, ss))
    return [n for n, _ in out], [tuple(ss[k] for _, ss in out) for k in range(len(strides))]


TRANSPOSE_TILE = 32  # elements per side of a transposing copy's tile (measured best of 8, 16, 32)


def transpose_tiles(sizes: list[int], strides: list[tuple[int, ...]]):
    """Collapsed (sizes, strides) of a 2-D walk that is contiguous for one operand along the
    inner dim and for another along the outer one (a transpose) as 4 loops over square tiles
    (rows of tiles, tiles, rows, columns): walked row by row, each column step of the strided
    operand touches a new cache line, a whole L1 of them for a long row; within a tile it
    touches TRANSPOSE_TILE lines, reused. Other walks, or sizes the tile does not divide, are
    returned as they are."""
    t = TRANSPOSE_TILE
    if len(sizes) != 2 or any(type(n) is not int or n % t or n < 2 * t for n in sizes):
        return sizes, strides
    if not (any(s[1] == 1 for s in strides) and any(s[0] == 1 for s in strides)):
        return sizes, strides
    m, n = sizes
    return ([m // t, n // t, t, t],
            [(s[0] * t, s[1] * t, s[0], s[1]) for s in strides])


def lane_mask(lanes: list[int]) -> ir.Constant:
    """A shufflevector mask: the i32 lane numbers `lanes`."""
    return ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes)


def square_transposed(b: ir.IRBuilder, rows: list) -> list:
    """The transpose of n vectors of n lanes (n a power of two): lane l of result i is lane i
    of rows[l]. For h = n/2, ..., 1, rows i and i + h (bit h of i clear) swap their
    off-diagonal h x h blocks, one two-source shuffle each: log2(n) rounds of n shuffles."""
    n = len(rows)
    rows = list(rows)
    h = n // 2
    while h:
        low = lane_mask([k if not k & h else n + k - h for k in range(n)])
        high = lane_mask([k + h if not k & h else n + k for k in range(n)])
        for i in range(n):
            if not i & h:
                x, y = rows[i], rows[i + h]
                rows[i], rows[i + h] = b.shuffle_vector(x, y, low), b.shuffle_vector(x, y, high)
        h //= 2
    return rows
