"""recompute_row_values: readers of a row program's normalised values recompute them.

A LayerNorm forward row program (graphc.passes.fuse_rows) writes, besides its output, the
values its backward reads: the centred input `x - mean` and the normalised
`(x - mean) * rstd`, two tensors of the input's size written by the forward and read again,
from memory, by the backward. Each is a cheap elementwise function of the input `x` and of
per-row values (mean, rstd: one float per row). This pass rewrites every reader of such a
value to recompute it from those, and drops it from the row program's outputs: the forward
writes two tensors fewer and the backward reads `x` once instead of both.

A D-shaped output v of a row program F (D its domain) is recomputed when:
- v is not a graph output or an update, and every reader of v is a fused node or a lone
  elementwise op or reduction (turned into a fused body) that reads v outside a GEMM anchor;
- v is computed in F from F's inputs, F's other outputs and F's row-invariant values
  (reduction results and what follows from them, exported as new [..., 1] outputs when F
  did not return them) by add, sub, mul, div, neg, broadcast_to and full only;
- for all such values of F together, the bytes the readers read anew (sources they did not
  read before, less the values they no longer read) stay below the bytes F no longer writes.
The recomputation runs the same scalar operations on the same inputs; the one difference
in rounding is that LLVM may contract a recomputed product into the multiply-add of the sum
or difference that reads it (one rounding fewer, as anywhere in a fused body).

Besides row programs, the producer may be a fused elementwise node, a GEMM epilogue (a
LayerNorm backward whose first products landed in the epilogue of the GEMM before it) or a
fused body ending in a reduction (a batch-norm backward's sum(g) that writes g = where(relu
mask, dy, 0) on the way, its sum(g * xhat) that writes xhat): there only its inputs and kept
outputs are sources (no per-row value is exported), and its domain is the reduction's input.

Needs: a graph after fuse_rows (cpu pipeline; fuse_rows runs again after it, so the column
sums that now read what a row program reads join it). Guarantees: the same values (up to
that contraction); the result verifies; nodes keep their order (every new input of a reader
is F's input or output); a producer whose every output its readers recompute is removed.
"""

from __future__ import annotations

import math

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.verifier import verify
from graphc.ops.fused import FusedBody
from graphc.ops.registry import ELEMENTWISE, REGISTRY
from graphc.passes.fuse_rows import body_cache, is_row_program, row_domain

__all__ = ["recompute_row_values"]

RECOMPUTED_OPS = ("add", "sub", "mul", "div", "neg", "where", "broadcast_to", "full")
REDUCTION_PRODUCERS = True  # fused bodies ending in a reduction are producers (False: A/Bs)


class _Names:
    """Fresh value names: the next integers after the largest integer name in use."""

    def __init__(self, graph: Graph) -> None:
        self.taken = {v.name for v in graph.inputs} | {v.name for n in graph for v in n.outputs}
        self.next = 1 + max((int(n) for n in self.taken if n.isdigit()), default=-1)

    def value(self, type_) -> Value:
        while str(self.next) in self.taken:
            self.next += 1
        self.taken.add(str(self.next))
        return Value(str(self.next), type_)


def _nbytes(v: Value) -> int:
    return math.prod(v.type.shape) * v.type.dtype.itemsize


def _rewritable(node: Node) -> bool:
    """A node this pass may give a recomputation: fused, or one elementwise op / reduction."""
    if node.op == "fused":
        return not any(REGISTRY[op].effectful for op, _, _ in node.attrs["body"])
    opdef = REGISTRY.get(node.op)
    return (opdef is not None and not opdef.effectful
            and ((opdef.kind == ELEMENTWISE and opdef.scalar is not None)
                 or opdef.reduction is not None) and len(node.outputs) == 1)


def _anchor_reads(node: Node, values: set[Value], bodies) -> bool:
    if node.op != "fused":
        return False
    fb = bodies(node)
    return fb.anchor is not None and any(node.inputs[a] in values for a in fb.anchor.args
                                         if a < fb.n_inputs)


class _Plan:
    """How F's recomputable values are recomputed: the refs of F to replay and where each
    source ref comes from."""

    def __init__(self, node: Node, domain: tuple, kept: set[Value], bodies) -> None:
        self.node = node
        self.fb = bodies(node)
        self.width = domain[-1]
        self.rows = is_row_program(self.fb)  # only a row program may return per-row values
        self.value_of = dict(zip(self.fb.outputs, node.outputs))
        self.kept = kept  # outputs F keeps (sources where a recipe reaches them)
        self.exports: dict[int, Value] = {}  # row-invariant refs F must now return

    def varies(self, ref: int) -> bool:
        shape = self.fb.types[ref].shape
        return (len(shape) >= 1 and shape[-1] == self.width
                and not (ref >= self.fb.n_inputs
                         and REGISTRY[self.fb.instruction(ref).op].reduction is not None))

    def source(self, ref: int) -> Value | None:
        """The outside value that stands for `ref`, or None where it must be replayed."""
        fb = self.fb
        if ref < fb.n_inputs:
            return self.node.inputs[ref]
        if ref in self.value_of and self.value_of[ref] in self.kept:
            return self.value_of[ref]
        if not self.varies(ref) and self.rows:
            return self.value_of.get(ref) or self.exports.get(ref) or ref  # type: ignore
        return None

    def recipe(self, ref: int, steps: list[int], sources: dict[int, object]) -> bool:
        """Collect in `steps` (F's order) the refs to replay for `ref`; False if one is not
        allowed."""
        if ref in sources or ref in steps:
            return True
        found = self.source(ref)
        if found is not None:
            sources[ref] = found
            return True
        ins = self.fb.instruction(ref)
        if ins.op not in RECOMPUTED_OPS:
            return False
        if not all(self.recipe(a, steps, sources) for a in ins.args):
            return False
        steps.append(ref)
        return True


def _reader_index(nodes: list[Node]) -> dict[Value, list[int]]:
    """The positions of each value's readers, ascending. A rewrite at position k only takes
    reads of k's outputs away and adds reads of values made at or before k, so the index
    stays true for the values of every later position."""
    readers: dict[Value, list[int]] = {}
    for j, node in enumerate(nodes):
        for v in dict.fromkeys(node.inputs):
            readers.setdefault(v, []).append(j)
    return readers


def _domain(node: Node, bodies) -> tuple | None:
    """The domain of a producer this pass handles: a row program's, the one output shape of
    a fused elementwise node or GEMM epilogue, or the input shape of a fused body's final
    reduction (static sizes); None for others."""
    if node.op != "fused" or not _rewritable(node):
        return None
    fb = bodies(node)
    if is_row_program(fb):
        return row_domain(fb)
    shapes = {tuple(v.type.shape) for v in node.outputs}
    if fb.ending is not None and REGISTRY[fb.ending.op].reduction is not None \
            and REDUCTION_PRODUCERS:
        # a batch-norm backward's sum(g * xhat) that stores xhat on the way
        shapes = {tuple(fb.types[fb.ending.args[0]].shape)}
    elif fb.ending is not None:
        return None
    if len(shapes) != 1:
        return None
    (shape,) = shapes
    return shape if shape and all(type(n) is int for n in shape) else None


def _candidates(nodes, k, escaping, bodies,
                readers_of) -> tuple[_Plan, dict[Value, list[int]]] | None:
    node = nodes[k]
    fb = bodies(node)
    domain = _domain(node, bodies)
    wanted: dict[Value, list[int]] = {}
    for ref, v in zip(fb.outputs, node.outputs):
        if (tuple(v.type.shape) != domain or v in escaping
                or fb.instruction(ref).op not in RECOMPUTED_OPS):
            continue
        readers = readers_of.get(v, [])
        if readers and all(_rewritable(nodes[j]) and not _anchor_reads(nodes[j], {v}, bodies)
                           for j in readers):
            wanted[v] = readers
    for v in list(wanted):  # one that cannot be recomputed even from all the others stays
        alone = _Plan(node, domain, set(node.outputs) - {v}, bodies)
        if _reader_recipe(alone, [v]) is None:
            del wanted[v]
    while wanted:  # then, one that needs a value no longer returned stays as well
        plan = _Plan(node, domain, set(node.outputs) - set(wanted), bodies)
        failing = [v for v in wanted if _reader_recipe(plan, [v]) is None]
        if not failing:
            return plan, wanted
        for v in failing:
            del wanted[v]
    return None


def _reader_recipe(plan: _Plan, values: list[Value]):
    """(steps, sources) recomputing `values` of F, or None."""
    steps: list[int] = []
    sources: dict[int, object] = {}
    ref_of = {v: r for r, v in plan.value_of.items()}
    for v in values:
        if not plan.recipe(ref_of[v], steps, sources):
            return None
    return sorted(steps), sources


def _rewrite(reader: Node, plan: _Plan, values: list[Value], steps, sources) -> Node:
    """`reader` recomputing `values` (outputs of F) from `sources` by F's `steps`."""
    fb = FusedBody.of_node(reader)
    gone = set(values)
    outside = {ref: plan.exports[ref] if isinstance(src, int) else src
               for ref, src in sources.items()}
    inputs = [v for v in reader.inputs if v not in gone]
    inputs += [v for v in dict.fromkeys(outside.values()) if v not in inputs]
    head = 1 if fb.anchor is not None else 0
    n_old, n_new, extra = fb.n_inputs, len(inputs), len(steps)
    step_ref = {ref: n_new + head + k for k, ref in enumerate(steps)}
    ref_of = {v: r for r, v in plan.value_of.items()}

    def old(ref: int) -> int:
        if ref < n_old:
            v = reader.inputs[ref]
            return step_ref[ref_of[v]] if v in gone else inputs.index(v)
        k = ref - n_old
        return n_new + (k if k < head else k + extra)

    def replayed(ref: int) -> int:
        return inputs.index(outside[ref]) if ref in outside else step_ref[ref]

    body = [(i.op, tuple(old(a) for a in i.args), tuple(i.attrs.items()))
            for i in fb.instructions[:head]]
    for ref in steps:
        ins = plan.fb.instruction(ref)
        body.append((ins.op, tuple(replayed(a) for a in ins.args), tuple(ins.attrs.items())))
    body += [(i.op, tuple(old(a) for a in i.args), tuple(i.attrs.items()))
             for i in fb.instructions[head:]]
    return Node("fused", inputs, {"body": tuple(body),
                                  "outputs": tuple(old(r) for r in fb.outputs)},
                list(reader.outputs), reader.loc)


def recompute_row_values(graph: Graph) -> Graph:
    """Readers recompute the normalised values of row programs (see the module docstring).
    The input graph is left unchanged."""
    nodes = list(graph.nodes)
    escaping = set(graph.outputs) | {v for _, v in graph.updates}
    names = None
    changed = False
    bodies = body_cache()
    readers_of = _reader_index(nodes)
    for k in range(len(nodes)):
        node = nodes[k]
        if _domain(node, bodies) is None:
            continue
        found = _candidates(nodes, k, escaping, bodies, readers_of)
        if found is None:
            continue
        plan, wanted = found
        by_reader: dict[int, list[Value]] = {}
        for v, readers in wanted.items():
            for j in readers:
                by_reader.setdefault(j, []).append(v)
        recipes = {j: _reader_recipe(plan, vs) for j, vs in by_reader.items()}
        if any(r is None for r in recipes.values()):
            continue
        if names is None:
            names = _Names(graph)
        for _, sources in recipes.values():
            for ref, src in sources.items():
                if isinstance(src, int) and ref not in plan.exports:
                    plan.exports[ref] = names.value(plan.fb.types[ref])
        saved = sum(_nbytes(v) for v in wanted)
        cost = 0
        for j, (_, sources) in recipes.items():
            read = set(nodes[j].inputs)
            new = {plan.exports[r] if isinstance(s, int) else s for r, s in sources.items()}
            cost += sum(_nbytes(v) for v in new - read) - sum(_nbytes(v) for v in by_reader[j])
        if cost >= saved:
            for ref in list(plan.exports):  # names taken stay unused: harmless
                del plan.exports[ref]
            continue
        for j, (steps, sources) in recipes.items():
            nodes[j] = _rewrite(nodes[j], plan, by_reader[j], steps, sources)
        fb = plan.fb
        outs = [(r, v) for r, v in zip(fb.outputs, node.outputs) if v not in wanted]
        outs += list(plan.exports.items())
        # a producer whose every output its readers now recompute (a scaled bias read by
        # one GEMM epilogue) is gone; later positions never read it again (their readers
        # come after them)
        nodes[k] = Node("fused", list(node.inputs),
                        {"body": node.attrs["body"], "outputs": tuple(r for r, _ in outs)},
                        [v for _, v in outs], node.loc) if outs else None
        changed = True
    if not changed:
        return graph
    nodes = [n for n in nodes if n is not None]
    out = Graph(graph.name, list(graph.inputs), nodes, list(graph.outputs), list(graph.updates))
    out.meta = dict(graph.meta)
    verify(out)
    return out
