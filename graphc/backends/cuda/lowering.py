"""lowering: a planned graph -> CUDA C kernels and a launch list over one device allocation.

`lower(graph)` reads `graph.meta["memory_plan"]` and returns a `Lowered`: the generated
source (graphc.backends.cuda.cudagen), the device bytes needed, where each graph input is
copied in and each result copied out, and `steps`, the whole program of a call: kernel
launches and runtime library calls in schedule order, every argument already known.
Consecutive small elementwise kernels that touch no byte another of them writes share one
launch (`merge_kernels`; `Lowered.step_nodes` names the nodes each step serves).

Device memory is one allocation laid out as [plan arena | graph inputs | scratch]; every
address below is an offset from its start (`Addr`), made absolute once by the executable, so a
call does no planning. Scratch holds the error words (int64, one per check that can fail at
run time: index ranges, NLL targets), library workspaces, contiguous copies of operands a
library call cannot read through their strides, and GEMM results an epilogue reads.

Where values live (`Layout`: offset, element strides, type): graph inputs contiguous in
their slot; intermediates contiguous at their buffer's arena offset; views (the plan's
`views`) as offset and strides into their source, from the view op's `view_strides` rule
(graphc.backends.common.view_of); update values the plan computes into an input, in that input.

Lowered: elementwise ops and fused groups (graphc.ops.fused: elementwise bodies, bodies
ending in a reduction or softmax/log_softmax, GEMM/conv epilogues) as generated kernels;
matmul (float32: gc_gemm_f32 / gc_gemm_strided_batched_f32, split along k when skinny,
gc_gemm_tf32_f32 only with GRAPHC_CUDA_ALLOW_TF32; transposed views read as transposed
operands; other dtypes or layouts: a generated kernel), conv2d (implicit GEMM) and its two
gradients, max/avg pooling and their gradients, batch_norm, nll_loss_backward and
softmax/log_softmax over rows that fill the device through the library (float32); every
other reduction (reduce_*, softmax, argmax/argmin, the NLL loss) as cooperative generated
kernels (graphc.backends.cuda.reductions: many threads per output); movement (copies of
views, concat, pad, flip), gather/take/embedding and their deterministic scatters,
full/arange and uniform/normal/dropout/bernoulli/randint/randperm (Philox, the eager
stream) as generated kernels (ops.py, movement.py). The library ops (conv, pooling, NLL,
batch norm) are float32 only: other dtypes are refused. `ops.LOWERINGS` is the backend's one
table from op name to lowering and `cudagen.SCALAR_LOWERINGS` its table of scalar ops
(graphc.backends.common states the contract). Anything else raises `CudaLoweringError`
naming the op and node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from graphc.backends.common import LoweringError, broadcast_strides, contiguous_strides, view_of
from graphc.backends.cuda import cudagen
from graphc.backends.cuda.cudagen import BLOCK, Kernel
from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node, Value
from graphc.types import TensorType

ALIGN = 256
ERROR_SLOTS = 64


class CudaLoweringError(LoweringError):
    """An op (or a form of it) the cuda backend has no lowering for."""

    backend = "cuda"
    instead = ("cpu", "interp")


def unsupported(node: Node, what: str) -> CudaLoweringError:
    return CudaLoweringError.at(node, what)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Addr:
    """A device address: `offset` bytes from the start of the executable's allocation."""

    offset: int


@dataclass(frozen=True)
class Layout:
    """A tensor on the device: byte offset of element 0, element strides, type."""

    offset: int
    strides: tuple[int, ...]
    type: TensorType

    @property
    def contiguous(self) -> bool:
        return all(s == c for n, s, c in zip(self.type.shape, self.strides,
                                             contiguous_strides(self.type.shape)) if n != 1)

    def broadcast(self, domain: tuple[int, ...]) -> tuple[int, ...]:
        """Element strides of this tensor read at each index of `domain` (right-aligned)."""
        return broadcast_strides(self.type.shape, self.strides, domain)


@dataclass
class Launch:
    """A generated kernel over `threads` work items (BLOCK threads a block, `items` items a
    thread: a grid of ceil(threads / (BLOCK * items)) blocks); `lanes`: how many of them
    cooperate on each output (1 for elementwise kernels; a reduction's segment width times
    its split), recorded so tests can count the parallelism of every output."""

    function: str
    threads: int
    args: list[Addr]
    lanes: int = 1
    items: int = 1


@dataclass
class Call:
    """A runtime library call: `function` of rt with `args` (Addr resolved at bind time);
    `keep` holds ctypes objects (descriptors) the arguments point into."""

    function: str
    args: tuple
    keep: tuple = ()


@dataclass
class Lowered:
    source: str
    device_bytes: int
    input_offsets: list[int]
    result_layouts: list[Layout]  # graph outputs, then update values (contiguous)
    steps: list = field(default_factory=list)
    errors_offset: int = 0
    errors: list[str] = field(default_factory=list)  # error word k -> message
    kernels: list[str] = field(default_factory=list)
    # the graph nodes each step computes (a merged launch serves several; none: the copies
    # of results after the schedule)
    step_nodes: list[tuple[Node, ...]] = field(default_factory=list)


class KernelText:
    """A kernel being written: its pointer parameters (deduplicated) and its lines, and what
    it touches: each parameter's byte span when every access went through `read` or `at`
    (`spans`), the parameters it may write (`written`, `at` counting as a write), and those
    reached through `ptr` directly (`unknown`: any bytes, maybe written)."""

    def __init__(self, name: str, threads: int, node: Node | None = None) -> None:
        self.name, self.threads = name, threads
        self.guard, self.lanes = True, 1  # cooperative kernels: False, the segment width
        self.partials: dict[str, int] = {}  # a split reduction's pass 1: state -> scratch
        self.params: list[int] = []
        self.lines: list[str] = []
        self.spans: dict[int, tuple[int, int]] = {}
        self.written: set[int] = set()
        self.unknown: set[int] = set()
        self.nodes: list[Node] = [node] if node is not None else []

    def ptr(self, offset: int, span: tuple[int, int] | None = None,
            written: bool = True) -> str:
        if offset not in self.params:
            self.params.append(offset)
        if span is None:
            self.unknown.add(offset)
        else:
            lo, hi = self.spans.get(offset, span)
            self.spans[offset] = (min(lo, span[0]), max(hi, span[1]))
        if written:
            self.written.add(offset)
        return f"p{self.params.index(offset)}"

    def read(self, layout: Layout, coords: list[str], domain: tuple[int, ...]) -> str:
        """The element of `layout` at `coords` over `domain` (broadcasting)."""
        index = cudagen.offset(coords, layout.broadcast(domain))
        return cudagen.load(self.ptr(layout.offset, span_of(layout), written=False),
                            layout.type.dtype, index)

    def at(self, layout: Layout, coords: list[str]) -> str:
        """The element of `layout` at its own coordinates (an lvalue)."""
        index = cudagen.offset(coords, layout.strides)
        return cudagen.load(self.ptr(layout.offset, span_of(layout)), layout.type.dtype, index)

    def touches(self, other: "KernelText") -> bool:
        """Whether a byte one of the two kernels writes is one the other reads or writes (so
        they cannot run as one launch); True when either reaches memory through `ptr` alone."""
        if self.unknown or other.unknown:
            return True
        return any((o1 in self.written or o2 in other.written) and a[0] < b[1] and b[0] < a[1]
                   for o1, a in self.spans.items() for o2, b in other.spans.items())

    def disjoint(self) -> bool:
        """Whether no byte a parameter may write is reached through another parameter (so
        the parameters can be declared `__restrict__`)."""
        if self.unknown:
            return False
        spans = [(self.spans[o], o in self.written) for o in self.params]
        return not any((w1 or w2) and a[0] < b[1] and b[0] < a[1]
                       for i, (a, w1) in enumerate(spans) for b, w2 in spans[i + 1:])


def span_of(layout: Layout) -> tuple[int, int]:
    """The bytes `layout`'s elements lie in: [first, past the last)."""
    size = layout.type.dtype.itemsize
    if not layout.type.numel:
        return layout.offset, layout.offset
    low = sum(min(0, (n - 1) * st) for n, st in zip(layout.type.shape, layout.strides))
    high = sum(max(0, (n - 1) * st) for n, st in zip(layout.type.shape, layout.strides))
    return layout.offset + low * size, layout.offset + (high + 1) * size


class Lowerer:
    """Lowers the scheduled nodes in order (ops.py holds the per-op methods)."""

    def __init__(self, graph: Graph, plan) -> None:
        self.graph, self.plan = graph, plan
        top = _align(plan.arena_bytes)
        self.input_offsets = []
        self.layouts: dict[Value, Layout] = {}
        for v in graph.inputs:
            self.input_offsets.append(top)
            self.layouts[v] = Layout(top, contiguous_strides(v.type.shape), v.type)
            top += _align(v.type.nbytes)
        self.errors_offset = top
        self.top = top + _align(8 * ERROR_SLOTS)
        self.errors: list[str] = []
        self.kernels: list[Kernel] = []
        self.steps: list = []
        self.step_nodes: list[tuple[Node, ...]] = []  # the nodes each step computes
        self._pending: list[KernelText] = []  # small kernels waiting to share one launch
        self.current: Node | None = None  # the node being lowered
        self._serial = 0  # kernels named so far (names stay unique when kernels merge)
        # values no kernel stores: their one elementwise reader computes them where it reads
        # them, inline(k, coords) -> a C expression (a batch norm's output, ops.py)
        self.inline: dict[Value, object] = {}
        self._readers: dict[Value, list[Node]] | None = None
        self._steps_of: dict[int, int] | None = None
        # nodes an earlier node's kernel already computes (sibling reductions, ops.py), and
        # while such a kernel is written, the nodes it serves besides the one being lowered
        self.ahead: set[int] = set()
        self.co_nodes: list[Node] = []
        self._index = {v.name: i for i, v in enumerate(graph.inputs)}

    def readers(self, v: Value) -> list[Node]:
        """The scheduled nodes that read `v`, in schedule order."""
        if self._readers is None:
            self._readers = {}
            for node in self.plan.schedule:
                for u in dict.fromkeys(node.inputs):
                    self._readers.setdefault(u, []).append(node)
        return self._readers.get(v, [])

    def live_until(self, v: Value, node: Node) -> bool:
        """Whether `v`'s bytes hold `v` up to and including `node`'s step: an intermediate
        whose buffer lives that long, or a graph input no update overwrites."""
        plan = self.plan
        if v in self.graph.inputs:
            return all(target is not v for target, _ in self.graph.updates)
        if v.name not in plan.buffer_of:
            return False
        return plan.buffers[plan.buffer_of[v.name]].end >= self.step_of(node)

    def step_of(self, node: Node) -> int:
        """`node`'s index in the schedule."""
        if self._steps_of is None:
            self._steps_of = {id(n): i for i, n in enumerate(self.plan.schedule)}
        return self._steps_of[id(node)]

    # ---- memory ------------------------------------------------------------------------
    def scratch(self, nbytes: int) -> int:
        at, self.top = self.top, self.top + _align(max(nbytes, 1))
        return at

    def scratch_layout(self, t: TensorType) -> Layout:
        return Layout(self.scratch(t.nbytes), contiguous_strides(t.shape), t)

    def error_word(self, message: str) -> int:
        if len(self.errors) >= ERROR_SLOTS:
            raise GraphcError(f"cuda backend: more than {ERROR_SLOTS} run-time checks in one "
                              "graph")
        self.errors.append(message)
        return self.errors_offset + 8 * (len(self.errors) - 1)

    def place(self, node: Node) -> None:
        plan = self.plan
        for v in node.outputs:
            if v.name in plan.views:
                self.layouts[v] = self.view_layout(node, v)
            elif v.name in plan.in_input:
                self.layouts[v] = self.layouts[self.graph.inputs[
                    self._index[plan.in_input[v.name]]]]
            else:
                self.layouts[v] = Layout(plan.offset(v.name), contiguous_strides(v.type.shape),
                                         v.type)

    def view_layout(self, node: Node, v: Value, src: Layout | None = None) -> Layout | None:
        """Where `v` (a view op's output) lies in its source's memory; None if the op copies."""
        src = src or self.layouts[node.inputs[0]]
        found = view_of(node, src.type.shape, src.strides)
        if found is None:
            if v.name in self.plan.views:
                raise unsupported(node, "a view the plan expects but numpy copies")
            return None
        offset, strides = found
        return Layout(src.offset + offset * src.type.dtype.itemsize, strides, v.type)

    # ---- emitting ------------------------------------------------------------------------
    def new_kernel(self, node: Node, threads: int) -> KernelText:
        self._serial += 1
        k = KernelText(f"k{self._serial - 1}_{node.op}", threads, node)
        k.nodes += self.co_nodes
        return k

    def emit(self, k: KernelText) -> None:
        """Append kernel `k`'s launch; a small elementwise one waits (`_pending`) to share one
        launch with the next ones it is independent of (see `merge_kernels`)."""
        if k.threads <= 0:
            return
        if not mergeable(k):
            self.flush()
            return self._launch(k)
        if self._pending and (len(self._pending) >= MERGE_MAX
                              or any(k.touches(p) for p in self._pending)):
            self.flush()
        self._pending.append(k)

    def flush(self) -> None:
        """Launch the kernels waiting in `_pending`: one alone, several as one kernel."""
        pending, self._pending = self._pending, []
        if len(pending) == 1:
            self._launch(pending[0])
        elif pending:
            self._serial += 1
            self._launch(merge_kernels(f"k{self._serial - 1}_merged", pending))

    def _launch(self, k: KernelText) -> None:
        items = cudagen.ITEMS if (k.guard and k.lanes == 1 and k.threads >= cudagen.ITEMS_FROM
                                  and not any("return" in line for line in k.lines)
                                  and k.disjoint()) else 1
        self.kernels.append(Kernel(k.name, k.threads, len(k.params), k.lines, k.guard, items))
        self.steps.append(Launch(k.name, k.threads, [Addr(o) for o in k.params], k.lanes,
                                 items))
        nodes = k.nodes or [self.current]
        self.step_nodes.append(tuple(n for i, n in enumerate(nodes)
                                     if all(n is not m for m in nodes[:i])))

    def call(self, function: str, *args, keep: tuple = ()) -> None:
        self.flush()
        self.steps.append(Call(function, args, keep))
        self.step_nodes.append((self.current,))

    def copy_to(self, src: Layout, dst: Layout, node: Node) -> None:
        """dst (contiguous) = src, elementwise with broadcasting and casting."""
        shape = dst.type.shape
        k = self.new_kernel(node, dst.type.numel)
        k.lines += cudagen.decompose(shape, "gi")
        coords = [f"c{d}" for d in range(len(shape))]
        value = cudagen.scalar("cast", {}, [k.read(src, coords, shape)], [src.type.dtype],
                               dst.type.dtype)
        k.lines.append(f"{k.at(dst, coords)} = {value};")
        self.emit(k)

    def contiguous(self, layout: Layout, node: Node) -> Layout:
        """`layout` itself when contiguous, else a contiguous copy in scratch."""
        if layout.contiguous:
            return layout
        copy = self.scratch_layout(layout.type)
        self.copy_to(layout, copy, node)
        return copy


# Launch merging: consecutive small elementwise kernels (each one item per thread, every
# pointer's bytes known) that touch no byte another writes run as one launch, each its own
# range of the index space; on a GPU each launch costs microseconds however small its work
# (ResNet-18's step has ~160 kernels of a few hundred threads: optimizer updates, running
# statistics, gradient copies).
MERGE_MAX = 64  # kernels in one merged launch (each thread walks a chain of range tests)


def mergeable(k: KernelText) -> bool:
    """Whether `k` may share a launch: an elementwise kernel (guard, one lane) of one item per
    thread (below ITEMS_FROM) whose every pointer's bytes are known."""
    return (k.guard and k.lanes == 1 and not k.partials and k.threads < cudagen.ITEMS_FROM
            and k.disjoint())


_PARAM = re.compile(r"\bp(\d+)\b")


def merge_kernels(name: str, parts: list[KernelText]) -> KernelText:
    """One kernel running `parts` (pairwise independent, see KernelText.touches) side by side:
    part j takes the index range [start_j, start_j + threads_j) and sees its own `gi` from 0;
    pointer parameters are shared by offset (each body's p<k> renamed)."""
    merged = KernelText(name, sum(p.threads for p in parts))
    merged.nodes = [n for p in parts for n in p.nodes]
    start = 0
    for j, part in enumerate(parts):
        rename = {}
        for index, offset in enumerate(part.params):
            if offset in part.unknown or offset not in part.spans:
                raise ValueError(f"merge_kernels: {part.name} has a pointer of unknown span")
            rename[str(index)] = merged.ptr(offset, part.spans[offset],
                                            written=offset in part.written)
        body = [_PARAM.sub(lambda m, r=rename: r[m.group(1)], line) for line in part.lines]
        test = f"if (gi < {start + part.threads}LL) {{" if j == 0 else \
            f"}} else if (gi < {start + part.threads}LL) {{"
        merged.lines.append(test)
        if any(re.search(r"\bgi\b", line) for line in body):  # its own index from 0
            merged.lines += [f"  long long gc_part_gi = gi - {start}LL;",
                             "  { long long gi = gc_part_gi;"]
            merged.lines += ["    " + line for line in body] + ["  }"]
        else:
            merged.lines += ["  " + line for line in body]
        start += part.threads
    merged.lines.append("}")
    return merged


def lower(graph: Graph) -> Lowered:
    """Lower a planned graph (see the module docstring)."""
    from graphc.backends.cuda.ops import lower_node

    plan = graph.meta["memory_plan"]
    lowerer = Lowerer(graph, plan)
    for node in plan.schedule:
        lowerer.current = node
        lowerer.place(node)
        lower_node(lowerer, node)
    results, copies = [], []
    for v in list(graph.outputs) + [v for _, v in graph.updates]:
        layout = lowerer.layouts[v]
        if not layout.contiguous or v in graph.inputs:
            copy = lowerer.scratch_layout(v.type)
            copies.append(Node("copy", [v], {}, [v]))
            lowerer.copy_to(layout, copy, copies[-1])
            layout = copy
        results.append(layout)
    lowerer.flush()
    step_nodes = [tuple(n for n in nodes if all(n is not c for c in copies))
                  for nodes in lowerer.step_nodes]
    return Lowered(cudagen.render(lowerer.kernels), lowerer.top, lowerer.input_offsets, results,
                   lowerer.steps, lowerer.errors_offset, lowerer.errors,
                   [k.name for k in lowerer.kernels], step_nodes)


__all__ = ["Addr", "BLOCK", "Call", "CudaLoweringError", "Launch", "Layout", "Lowered",
           "Lowerer", "lower", "span_of", "unsupported"]
