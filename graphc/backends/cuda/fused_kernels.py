"""fused_kernels: the cuda backend's generated kernels for fused bodies (graphc.ops.fused):
elementwise maps, GEMM/conv epilogues and bodies ending in a reduction or a row-wise softmax,
and plain reductions (graphc.backends.cuda.ops dispatches here).

- `map_body`: one kernel over the outputs' shape computing the body, one thread (ITEMS
  threads when large) per element; `map_with`: the same after a contraction (an epilogue).
- `reduction`/`reduce_group`: cooperative kernels (graphc.backends.cuda.reductions) built
  from each OpDef's `Reduction` (identity, combiner). A group's intermediates of the reduced
  shape are stored by the first pass; reductions scheduled right after it over the same
  source shape and kept dimensions (`_siblings`: a batch norm backward's sum(g) and
  sum(g * x-hat), a block's two batch norms reading the same g, sibling bias gradients) share
  its kernel, each with its own state, reading the values it computes per element from
  registers (`_FoldPart.exposed`) when their bytes meet no other member's writes.
- softmax/log_softmax: an online softmax over a segment per row, split when the rows are
  few and long.
Invariants: each output element is written by one thread; the order of every combination
is fixed by the shapes (deterministic bits); float32 sums and products accumulate in double.
"""

from __future__ import annotations

import math

from graphc.backends.cuda import cudagen, reductions
from graphc.backends.cuda.lowering import Layout, Lowerer, span_of, unsupported
from graphc.ir.graph import Node
from graphc.ops.fused import FusedBody
from graphc.ops.registry import ELEMENTWISE, REGISTRY, Reduction
from graphc.types import TensorType


def _coords(n: int, prefix: str = "c") -> list[str]:
    return [f"{prefix}{d}" for d in range(n)]


# ---- fused bodies -------------------------------------------------------------------------------
def body_lines(lw: Lowerer, k, node: Node, domain, coords, fb: FusedBody, stop: int,
                env: dict, prefix: str = "") -> list[str]:
    """Statements computing instructions [0, stop) of `fb` at `coords`; env: ref -> (expr,
    dtype) for refs known; variables are named <prefix>a<ref> (inputs), <prefix>v<ref>."""
    lines, n_in = [], fb.n_inputs
    known = dict(env)

    def value(ref: int):
        if ref not in known:
            v = node.inputs[ref]
            read = lw.inline[v](k, coords) if v in lw.inline else \
                k.read(lw.layouts[v], coords, domain)
            lines.append(f"{cudagen.ctype(v.type.dtype)} {prefix}a{ref} = {read};")
            known[ref] = (f"{prefix}a{ref}", v.type.dtype)
        return known[ref]

    for i, (op, args, attrs) in enumerate(fb.instructions[:stop]):
        ref = n_in + i
        if ref in known:
            continue
        operands = [value(a) for a in args]
        t = fb.types[ref]
        out = t.dtype
        if op == "broadcast_to":
            expr = cudagen.scalar("cast", {}, [operands[0][0]], [operands[0][1]], out)
        elif op == "full":
            expr = cudagen.literal(attrs["value"], out)
        elif op == "arange":
            n = t.shape[0]
            c = coords[-1] if n > 1 and coords else "0"
            expr = f"(({cudagen.ctype(out)})({attrs['start']!r} + (double){c} * " \
                   f"{attrs['step']!r}))"
        elif REGISTRY[op].kind == ELEMENTWISE:
            try:
                expr = cudagen.scalar(REGISTRY[op].scalar, attrs, [o[0] for o in operands],
                                      [o[1] for o in operands], out)
            except KeyError:
                raise unsupported(node, f"{op} on {out.name}") from None
        else:
            raise unsupported(node, f"{op} inside a fused body")
        lines.append(f"{cudagen.ctype(out)} {prefix}v{ref} = {expr};")
        known[ref] = (f"{prefix}v{ref}", out)
    return lines


def map_body(lw: Lowerer, node: Node, fb: FusedBody, env=None) -> None:
    """One kernel over the outputs' (common) shape computing `fb` and storing its outputs."""
    first = lw.layouts[node.outputs[0]]
    shape = first.type.shape
    for v in node.outputs:
        if v.type.shape != shape:
            raise unsupported(node, "a fused group whose outputs differ in shape")
    k = lw.new_kernel(node, first.type.numel)
    coords = _coords(len(shape))
    k.lines += cudagen.decompose(shape, "gi")
    k.lines += body_lines(lw, k, node, shape, coords, fb, len(fb), env or {})
    for v, ref in zip(node.outputs, fb.outputs):
        k.lines.append(f"{k.at(lw.layouts[v], coords)} = v{ref};")
    lw.emit(k)


def lower_map(lw: Lowerer, node: Node) -> None:
    """A lone elementwise op or constant source (full, arange): one generated kernel."""
    map_body(lw, node, FusedBody.of_node(node))


def map_with(lw: Lowerer, node: Node, fb: FusedBody, contraction: Layout) -> None:
    """An epilogue: instruction 0's result lives in `contraction` (scratch)."""
    first = lw.layouts[node.outputs[0]]
    shape = first.type.shape
    k = lw.new_kernel(node, first.type.numel)
    coords = _coords(len(shape))
    k.lines += cudagen.decompose(shape, "gi")
    n_in = len(node.inputs)
    k.lines.append(f"{cudagen.ctype(contraction.type.dtype)} v{n_in} = "
                   f"{k.read(contraction, coords, shape)};")
    env = {n_in: (f"v{n_in}", contraction.type.dtype)}
    k.lines += body_lines(lw, k, node, shape, coords, fb, len(fb), env)
    for v, ref in zip(node.outputs, fb.outputs):
        k.lines.append(f"{k.at(lw.layouts[v], coords)} = v{ref};")
    lw.emit(k)


def reduce_group(lw: Lowerer, node: Node, fb: FusedBody) -> None:
    """A fused body ending in a reduction. An intermediate it also returns (of the reduced
    operand's shape: the relu mask applied to a gradient, a batch norm's x-hat) is stored by
    the reduction's first pass, which visits every element once, rather than by a kernel of
    its own that would read the inputs again; row-wise endings (softmax) and returned inputs
    keep that kernel."""
    n_in = fb.n_inputs
    last_ref = n_in + len(fb) - 1
    op, args, attrs = fb.instructions[-1]
    src_type = fb.types[args[0]]
    fold_in = not REGISTRY[op].row_wise
    stores = []
    for v, ref in zip(node.outputs, fb.outputs):
        if ref == last_ref:
            continue
        if v.type.shape != src_type.shape:
            raise unsupported(node, "a reduce group returning an intermediate of another shape")
        if fold_in and ref >= n_in:
            stores.append((lw.layouts[v], ref))
        else:
            _map_one(lw, node, fb, ref - n_in + 1, ref, lw.layouts[v])
    for v, ref in zip(node.outputs, fb.outputs):
        if ref == last_ref:
            reduction(lw, node, fb, len(fb) - 1, args[0], src_type, op, attrs,
                       lw.layouts[v], stores)


def _map_one(lw: Lowerer, node: Node, fb: FusedBody, stop: int, ref: int, out: Layout) -> None:
    shape = out.type.shape
    k = lw.new_kernel(node, out.type.numel)
    coords = _coords(len(shape))
    k.lines += cudagen.decompose(shape, "gi")
    k.lines += body_lines(lw, k, node, shape, coords, fb, stop, {})
    k.lines.append(f"{k.at(out, coords)} = {_ref_expr(node, ref)};")
    lw.emit(k)


def _ref_expr(node: Node, ref: int) -> str:
    return f"a{ref}" if ref < len(node.inputs) else f"v{ref}"


# ---- reductions: the identity and combiner of each OpDef's Reduction ------------------------
def _identity(red: Reduction, dt) -> str:
    value = red.identity_value(dt)
    if dt.name == "int64" and red.identity in ("lowest", "highest"):
        return f"({'9223372036854775807LL' if value > 0 else '(-9223372036854775807LL - 1)'})"
    return cudagen.literal(value, dt)


def _combine_add(acc: str, v: str, dt) -> str:
    return f"{acc} || {v}" if dt.name == "bool" else f"{acc} + {v}"


def _combine_mul(acc: str, v: str, dt) -> str:
    return f"{acc} && {v}" if dt.name == "bool" else f"{acc} * {v}"


def _combine_max(acc: str, v: str, dt) -> str:
    return f"gc_max({acc}, {v})"


def _combine_min(acc: str, v: str, dt) -> str:
    return f"gc_min({acc}, {v})"


COMBINER_LOWERINGS = {"add": _combine_add, "mul": _combine_mul, "max": _combine_max,
                      "min": _combine_min}


def _element(lw: Lowerer, node: Node, fb: FusedBody, stop: int, src_ref: int, shape,
             env=None, prefix: str = ""):
    """value(k) -> (statements, expression): the reduced operand at coordinates c<d>."""
    coords, env = _coords(len(shape)), env or {}

    def value(k) -> tuple[list[str], str]:
        lines = body_lines(lw, k, node, shape, coords, fb, stop, env, prefix)
        if src_ref in env:
            return lines, env[src_ref][0]
        if src_ref < len(node.inputs):
            return lines, k.read(lw.layouts[node.inputs[src_ref]], coords, shape)
        return lines, f"{prefix}v{src_ref}"

    return value


def reduction(lw: Lowerer, node: Node, fb: FusedBody, stop: int, src_ref: int,
               src: TensorType, op: str, attrs: dict, out: Layout, stores=()) -> None:
    """out = op over `src_ref` (an input or a value of fb's instructions [0, stop)) computed
    at every source index: a segment of threads per output (graphc.backends.cuda.reductions);
    `stores`: (layout of the source's shape, ref) of intermediates the first pass writes."""
    shape = src.shape
    if REGISTRY[op].row_wise:
        assert not stores, "row-wise endings write no intermediates here"
        return _softmax_kernel(lw, node, fb, stop, src_ref, src, op == "log_softmax",
                               attrs["dim"] % max(len(shape), 1), out)
    part = _FoldPart(lw, node, fb, stop, src_ref, src, op, attrs, out, stores)
    parts, kept, red = [part], part.kept, part.red
    for j, (partner, spec) in enumerate(_siblings(lw, node, shape, kept, parts), 1):
        parts.append(_FoldPart(lw, partner, *spec, tag=f"_{j}", env=_sibling_env(partner, parts)))
        lw.ahead.add(id(partner))
    reducer = reductions.Reducer(
        [st for p in parts for st in p.states],
        lambda k: [line for p in parts for line in p.update(k)],
        lambda: [line for p in parts for line in p.merge()],
        lambda k: [line for p in parts for line in p.finish(k)])
    lw.co_nodes = [p.node for p in parts[1:]]
    try:
        reductions.reduce_kernels(lw, node, out.type.numel,
                                  (tuple(shape[d] for d in kept), kept), part.count,
                                  (tuple(shape[d] for d in red), red), reducer)
    finally:
        lw.co_nodes = []


class _FoldPart:
    """One reduction of a (possibly shared) cooperative kernel: its state `acc<tag>`, the
    statements folding an element into it, merging and storing it, and the values of the
    source's shape it computes per element (`exposed`: Value -> (C variable, dtype)), which
    a sibling reduction reads instead of loading them."""

    def __init__(self, lw: Lowerer, node: Node, fb: FusedBody, stop: int, src_ref: int,
                 src: TensorType, op: str, attrs: dict, out: Layout, stores=(), tag: str = "",
                 env=None) -> None:
        self.node, shape = node, src.shape
        reduction = REGISTRY[op].reduction
        axes = tuple(a % max(len(shape), 1) for a in attrs["axes"])
        self.kept = [d for d in range(len(shape)) if d not in axes]
        self.red = [d for d in range(len(shape)) if d in axes]
        dt = out.type.dtype
        acc_t = "double" if dt.name == "float32" and reduction.combiner in ("add", "mul") \
            else reductions.shuffle_type(cudagen.ctype(dt))
        self.count = count = math.prod(shape[d] for d in self.red)
        prefix, acc = f"g{tag}_" if tag else "", f"acc{tag}"
        value = _element(lw, node, fb, stop, src_ref, shape, env, prefix)
        combine = COMBINER_LOWERINGS[reduction.combiner]
        self.exposed = {v: (f"{prefix}v{ref}", v.type.dtype) for v, ref in
                        zip(node.outputs, fb.outputs) if any(ref == r for _, r in stores)}

        def update(k) -> list[str]:
            lines, v = value(k)
            x = cudagen.scalar("cast", {}, [v], [src.dtype], dt)
            lines += [f"{k.at(layout, _coords(len(shape)))} = {prefix}v{ref};"
                      for layout, ref in stores]
            return lines + [f"{acc_t} x{tag} = ({acc_t})({x});",
                            f"{acc} = {combine(acc, 'x' + tag, dt)};"]

        def finish(k) -> list[str]:
            result = f"{acc} / {count}.0" if reduction.mean else acc
            return [f"{k.at(out, _kept_coords(out, self.kept, attrs))} = "
                    f"({cudagen.ctype(dt)})({result});"]

        self.states = [(acc, acc_t, f"({acc_t}){_identity(reduction, dt)}")]
        self.update, self.finish = update, finish
        self.merge = lambda: [f"{acc} = {combine(acc, 'o_' + acc, dt)};"]


def _sibling_env(partner: Node, parts: list) -> dict:
    """ref -> (variable, dtype) for the partner's inputs that `parts` compute per element."""
    exposed = {v: e for p in parts for v, e in p.exposed.items()}
    return {i: exposed[v] for i, v in enumerate(partner.inputs) if v in exposed}


def _reduction_spec(lw: Lowerer, node: Node):
    """(fb, stop, src_ref, src, op, attrs, out, stores) of a node whose lowering is one
    generated non-row-wise reduction (a plain reduce_* or a fused group ending in one and
    returning only intermediates of the source's shape), else None."""
    if node.op == "fused":
        fb = FusedBody.of_node(node)
        if fb.anchor is not None or fb.ending is None or REGISTRY[fb.ending.op].row_wise:
            return None
        n_in, last = fb.n_inputs, fb.n_inputs + len(fb) - 1
        op, args, attrs = fb.instructions[-1]
        src = fb.types[args[0]]
        stores, out = [], None
        for v, ref in zip(node.outputs, fb.outputs):
            if ref == last:
                out = lw.layouts[v]
            elif ref < n_in or v.type.shape != src.shape:
                return None
            else:
                stores.append((lw.layouts[v], ref))
        return fb, len(fb) - 1, args[0], src, op, attrs, out, stores
    if node.op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod") \
            and not bias_sum_by_library(lw, node):
        return (FusedBody.of_node(node), 0, 0, node.inputs[0].type, node.op, dict(node.attrs),
                lw.layouts[node.outputs[0]], [])
    return None


def _siblings(lw: Lowerer, node: Node, shape, kept: list[int], parts: list):
    """The nodes scheduled right after `node` whose reductions can share its kernel, with
    their specs: the same source shape and kept dimensions, reading no value of the members
    but their per-element intermediates (computed in registers), and no member reading or
    writing bytes another writes. Each is placed (its outputs' layouts) as it is found."""
    schedule = lw.plan.schedule
    at = lw.step_of(node) + 1
    members = [node]
    while at < len(schedule) and len(members) < MAX_SIBLINGS:
        partner = schedule[at]
        lw.place(partner)
        spec = _reduction_spec(lw, partner)
        if spec is None or spec[3].shape != shape:
            return
        axes = tuple(a % max(len(shape), 1) for a in spec[5]["axes"])
        if [d for d in range(len(shape)) if d not in axes] != kept:
            return
        made = {v for m in members for v in m.outputs}
        exposed = {v for p in parts for v in p.exposed}
        loads = [v for v in partner.inputs if v not in exposed]
        # the partner's stores come after every earlier member's loads of an element, so
        # it may write where a member read at the same element (the plan reusing a buffer
        # that died at the first member), nowhere else a member reads; and it loads
        # nothing a member writes
        if any(v in made for v in loads) or _overlap(lw, partner.outputs,
                                                     [v for m in members for v in m.inputs],
                                                     same_element_ok=True) \
                or _overlap(lw, loads, made):
            return
        yield partner, spec
        members.append(partner)
        at += 1


MAX_SIBLINGS = 4  # reductions sharing one cooperative kernel


def _overlap(lw: Lowerer, values, others, same_element_ok: bool = False) -> bool:
    """Whether any of `values` shares a byte with any of `others` (as laid out); with
    `same_element_ok`, two layouts that put every element at the same bytes do not count."""
    def meet(a: Layout, b: Layout) -> bool:
        if same_element_ok and (a.offset, a.strides, a.type.shape, a.type.dtype.itemsize) == \
                (b.offset, b.strides, b.type.shape, b.type.dtype.itemsize):
            return False
        (a0, a1), (b0, b1) = span_of(a), span_of(b)
        return a0 < b1 and b0 < a1

    known = [lw.layouts[v] for v in others if v in lw.layouts]
    return any(meet(lw.layouts[v], o) for v in values if v in lw.layouts for o in known)


def _kept_coords(out: Layout, kept: list[int], attrs: dict) -> list[str]:
    """Output coordinates: the kept source dims (and 0 for reduced ones with keepdim)."""
    if out.type.ndim == len(kept):
        return [f"c{d}" for d in kept]
    return [f"c{d}" if d in kept else "0" for d in range(out.type.ndim)]


def _softmax_kernel(lw: Lowerer, node: Node, fb: FusedBody, stop: int, src_ref: int,
                    src: TensorType, log: bool, dim: int, out: Layout) -> None:
    """Online softmax: a segment per row keeps (max m, sum s of exp(x - m)), merged across
    lanes, then writes the row: two reads of each element (O(n)). Few long rows split the
    row: partial (m, s) per chunk, merged per row into scratch, then one elementwise pass."""
    shape = src.shape
    dt = out.type.dtype
    ct = cudagen.ctype(dt)
    n = shape[dim] if shape else 1
    kept = [d for d in range(len(shape)) if d != dim]
    kept_shape = tuple(shape[d] for d in kept)
    rows = math.prod(kept_shape)
    value = _element(lw, node, fb, stop, src_ref, shape)
    coords = _coords(len(shape))
    lanes = reductions.lanes_for(n)

    def result(x: str, m: str, s: str) -> str:
        return f"({x} - {m}) - ({ct})log({s})" if log else f"gc_exp({x} - {m}) / ({ct}){s}"

    def update(k) -> list[str]:
        lines, v = value(k)
        return lines + [f"gc_online_merge(m, s, ({ct})({v}), 1.0);"]

    def merge() -> list[str]:
        return ["gc_online_merge(m, s, o_m, o_s);"]

    def write_row(k) -> list[str]:
        lines, v = value(k)
        body = [f"long long c{dim} = t;", *lines, f"{ct} x = ({ct})({v});",
                f"{k.at(out, coords)} = {result('x', 'm', 's')};"]
        return [f"for (long long t = gc_lane; t < {n}LL; t += {lanes}) {{",
                *("  " + line for line in body), "}"]

    def no_finish(k) -> list[str]:
        return []

    states = [("m", ct, cudagen.literal(-math.inf, dt)), ("s", "double", "0.0")]
    red = ((n,), [dim]) if shape else ((), [])
    split = reductions.split_for(rows, n, lanes)
    if split == 1:
        reducer = reductions.Reducer(states, update, merge, no_finish, write_row)
        reductions.reduce_kernels(lw, node, rows, (kept_shape, kept), n, red, reducer, 1)
        return
    stats_m, stats_s = lw.scratch(rows * dt.itemsize), lw.scratch(rows * 8)

    def store_stats(k) -> list[str]:
        return [f"(({ct} *){k.ptr(stats_m)})[gc_o] = m;",
                f"((double *){k.ptr(stats_s)})[gc_o] = s;"]

    reducer = reductions.Reducer(states, update, merge, store_stats)
    reductions.reduce_kernels(lw, node, rows, (kept_shape, kept), n, red, reducer, split)
    k = lw.new_kernel(node, out.type.numel)  # the third pass: one thread per element
    k.lines += cudagen.decompose(shape, "gi")
    row = cudagen.offset([f"c{d}" for d in kept], _row_strides(kept_shape)) if kept else "0"
    lines, v = value(k)
    k.lines += lines
    k.lines.append(f"{ct} x = ({ct})({v}); long long row = {row};")
    m, s = f"(({ct} *){k.ptr(stats_m)})[row]", f"((double *){k.ptr(stats_s)})[row]"
    k.lines.append(f"{k.at(out, coords)} = {result('x', m, s)};")
    lw.emit(k)


def _row_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def bias_sum_by_library(lw: Lowerer, node: Node) -> bool:
    """A float32 sum over (N, H, W) of a contiguous NCHW tensor (a conv bias gradient) whose
    block per channel fills the device: gc_conv2d_bwd_bias_f32."""
    x, y = lw.layouts[node.inputs[0]], lw.layouts[node.outputs[0]]
    shape = x.type.shape
    axes = sorted(a % max(x.type.ndim, 1) for a in node.attrs["axes"])
    f32 = x.type.dtype.name == "float32" and y.type.dtype.name == "float32"
    return node.op == "reduce_sum" and len(shape) == 4 and axes == [0, 2, 3] and f32 and \
        x.contiguous and bool(x.type.numel) and \
        reductions.split_for(shape[1], x.type.numel // shape[1], 256) == 1


__all__ = ["bias_sum_by_library", "body_lines", "lower_map", "map_body", "map_with",
           "reduce_group", "reduction"]
