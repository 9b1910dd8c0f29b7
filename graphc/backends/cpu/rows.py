"""rows: softmax and log_softmax rows as explicit vector code (one kernel, passes over a row).

A row (the elements along `dim`) is short and stays in L1 between passes, so the kernel reads
its input once and writes its output once; each pass runs on `<V x float>` registers
(V = `LANES`: one 64-byte line of float32 or float64) with a scalar loop for the last
`row % V` elements:

1. (only for a fused body, or an input whose row is not contiguous) the body evaluated per
   element, its other outputs stored, the value stored into the output row;
2. the row's maximum, NaN-propagating, in V lanes, then folded to one value;
3. e = exp(x - max) (graphc.backends.cpu.mathlib on vectors), stored for softmax, summed in V
   lanes, then folded;
4. softmax: y = e * (1 / sum) (one division per row: sum >= 1, since the maximum's own
   term is 1, so 1 / sum is a normal float; 12% faster on 64-wide rows than a division
   per element, within the rounding rule below); log_softmax: y = (x - max) - log(sum).

Rounding: the sum is accumulated in V lanes and folded by halves, not left to right; the
result differs from a sequential float sum by reassociation only (and softmax by the
reciprocal's one extra rounding). graphc judges such changes
by distance from a float64 reference (compiled error at most 2x eager graphc's error,
`graphc.testing.assert_rounding_within`), not bit for bit. Everything else is the scalar
path's arithmetic: all -inf, +inf or NaN rows give NaN rows, as PyTorch and numpy do.

Used by graphc.backends.cpu.codegen for rows whose output is contiguous along `dim` (the
common case: softmax over the last dim); other rows take its scalar loops. A row length
known per call (graphc.backends.cpu.runtime_sizes) splits into chunks and tail at run time.

Row programs (`lower_row_program`): a fused body made by graphc.passes.fuse_rows (a
LayerNorm forward or backward, a softmax backward) over a domain (..., R). Per row: values
that do not vary along the row (inputs of shape (..., 1), the row reductions' results and
what is computed from them) in straight-line code; then one loop over the row per level of
row reductions (pass p sums the reductions whose argument needs p levels before it), then a
last loop that stores the row's outputs and adds its elements into the column sums. Each loop
recomputes the per-element values it needs from the inputs (the row is in L1 after the first
pass) and is left to LLVM's loop vectoriser (the sums reassociate, as the reductions' do).
A row program without column sums is split over the threads by rows; one with them over
parts of its rows, each adding into its own partial column sums, added in part order by a
merge kernel after it (graphc.backends.cpu.column_parts: the same bits on every thread count,
the serial order's within rounding), or runs serially where its rows do not cut so. Every
pass reads a row before the last one writes it, and the last computes all of an element's
outputs before storing any, so the plan may put an output in place of an input of its
shape (graphc.passes.plan). Each row first asks for the lines of the row
PREFETCH_AHEAD_ROWS on of every input and output that moves from row to row, not the
partial column sums (graphc.backends.cpu.prefetch's row_prefetcher): in a training step a
LayerNorm's rows come from memory, which the hardware's prefetchers fetched late. The hints
change no arithmetic (the same bits: tests/test_cpu_rows.py).
"""

from __future__ import annotations

import math

from llvmlite import ir

from graphc.backends.cpu import column_parts
from graphc.backends.cpu.kernels import KernelBuilder, filled
from graphc.backends.cpu.prefetch import row_prefetcher
from graphc.backends.cpu.scalars import const, convert, reduction_combiner
from graphc.backends.cpu.values import REG, collapse, for_range, i64, loop, size, unsupported
from graphc.ops.registry import REGISTRY
from graphc.passes.fuse_rows import column_sum, row_domain, row_reduction

__all__ = ["LANES", "lower_row_program", "lower_rows"]

LANES = {"float32": 16, "float64": 8}
PREFETCH = True  # False: a row program's rows are left to the hardware prefetchers (A/B)
# a row program's rows ask for the rows this many on: the GPT step's LayerNorm row programs
# (rows of 512 bytes, their inputs and outputs out of cache) 1.43 -> 1.19 / 1.09 / 0.91 ms at
# 2 / 4 / 8 rows (16: 1.14, 32: 1.25; docs/performance.md "GPT's non-GEMM kernels, tenth
# session")
PREFETCH_AHEAD_ROWS = 8


def lower_rows(lw, node, kb, body, src, leaves, stores, out_v, attrs) -> bool:
    """Lower softmax/log_softmax rows with vector passes; False (nothing emitted) when the
    output row is not contiguous or not floating point, for the scalar path to take."""
    op = body.instrs[-1][0]
    t = out_v.type.dtype
    out_loc = lw.locs[out_v]
    domain = kb.shape
    if not t.is_floating or out_v.type.ndim == 0 or t.name not in LANES:
        return False
    dim = attrs["dim"] % len(domain)
    if out_loc.strides[dim] != t.itemsize:
        return False
    y = kb.operand(out_loc)
    row = domain[dim]
    lanes = LANES[t.name]
    direct = (src in leaves and not stores and body.types[src].dtype is t
              and kb.operands[leaves[src]].strides[dim] == 1)
    x = leaves[src] if direct else y  # the operand the passes read the row from
    order = [d for d in range(len(domain)) if d != dim]
    outer_sizes, outer_strides = collapse(tuple(domain[d] for d in order),
                                          [tuple(o.strides[d] for d in order)
                                           for o in kb.operands])
    row_strides = [o.strides[dim] for o in kb.operands]
    b = kb.begin(parallel=bool(outer_sizes))
    if b is None:  # built before (graphc.backends.cpu.kernels): called with these pointers
        lw.calls.append(kb.kernel)
        return True
    vec = ir.VectorType(REG[t.name], lanes)
    with b.goto_entry_block():
        vacc = b.alloca(vec, name="vacc")
        acc = b.alloca(REG[t.name], name="acc")
    maximum = _nan_max(lw.scalars, t)

    def at(b, offsets, j):
        return [o if s == 0 else b.add(o, j if s == 1 else b.mul(j, size(b, s)))
                for o, s in zip(offsets, row_strides)]

    def vload(b, k, offset):
        return b.load(kb.pointer(b, k, offset), typ=vec, align=t.itemsize)

    def vstore(b, k, offset, value):
        b.store(value, kb.pointer(b, k, offset), align=t.itemsize)

    def over_row(b, offsets, vector_step, scalar_step, name):
        """vector_step(b, offs) per V-element chunk, scalar_step(b, offs) per tail element
        (offs: operand offsets of the chunk's first element)."""
        if type(row) is not int:  # a row length known per call
            n = size(b, row)
            chunks = b.udiv(n, i64(lanes))
            with loop(b, 0, chunks, f"{name}v") as c:
                vector_step(b, at(b, offsets, b.mul(c, i64(lanes))))
            with loop(b, b.mul(chunks, i64(lanes)), n, f"{name}s") as j:
                scalar_step(b, at(b, offsets, j))
            return
        chunks = row // lanes
        if chunks:
            with for_range(b, chunks, f"{name}v") as c:
                vector_step(b, at(b, offsets, b.mul(c, i64(lanes))))
        if row % lanes:
            with loop(b, chunks * lanes, row, f"{name}s") as j:
                scalar_step(b, at(b, offsets, j))

    def leaf(b, offsets):
        if not direct:  # pass 1: the body, element by element, into the output row
            def evaluate(b, offs):
                env = body.evaluate(lw, kb, b, offs, leaves, len(body.instrs) - 1,
                                    [src] + [r for r, _, _ in stores])
                for ref, k, v in stores:
                    kb.store(b, k, offs[k], convert(b, env[ref], body.types[ref].dtype,
                                                    v.type.dtype))
                kb.store(b, y, offs[y], convert(b, env[src], body.types[src].dtype, t))

            with for_range(b, row, "r0") as j:
                evaluate(b, at(b, offsets, j))
        # pass 2: the maximum
        b.store(_splat(vec, -math.inf), vacc)
        b.store(const(t, -math.inf), acc)
        over_row(b, offsets,
                 lambda b, o: b.store(maximum(b, b.load(vacc), vload(b, x, o[x])), vacc),
                 lambda b, o: b.store(maximum(b, b.load(acc), kb.load(b, x, o[x])), acc),
                 "r1")
        m = maximum(b, _fold(b, b.load(vacc), lanes, maximum), b.load(acc))
        # pass 3: exp(x - max), summed
        vm = _broadcast(b, m, vec)
        b.store(_splat(vec, 0.0), vacc)
        b.store(const(t, 0.0), acc)

        def exp_step(b, o, load, store, m, acc_slot):
            e = lw.scalars.mathlib(b, "exp", b.fsub(load(b, x, o[x]), m))
            if op == "softmax":
                store(b, y, o[y], e)
            b.store(b.fadd(b.load(acc_slot), e), acc_slot)

        over_row(b, offsets, lambda b, o: exp_step(b, o, vload, vstore, vm, vacc),
                 lambda b, o: exp_step(b, o, kb.load, kb.store, m, acc), "r2")
        s = b.fadd(_fold(b, b.load(vacc), lanes, _add), b.load(acc))
        # pass 4: the result
        if op == "softmax":  # e * (1 / sum): one division per row, not one per element
            r = b.fdiv(const(t, 1.0), s)
            vr = _broadcast(b, r, vec)
            over_row(b, offsets,
                     lambda b, o: vstore(b, y, o[y], b.fmul(vload(b, y, o[y]), vr)),
                     lambda b, o: kb.store(b, y, o[y], b.fmul(kb.load(b, y, o[y]), r)),
                     "r3")
        else:
            log_s = lw.scalars.mathlib(b, "log", s)
            vlog = _broadcast(b, log_s, vec)
            over_row(b, offsets,
                     lambda b, o: vstore(b, y, o[y], b.fsub(b.fsub(vload(b, x, o[x]), vm),
                                                            vlog)),
                     lambda b, o: kb.store(b, y, o[y], b.fsub(b.fsub(kb.load(b, x, o[x]), m),
                                                              log_s)),
                     "r3")

    kb.nest(b, outer_sizes, outer_strides, leaf)
    lw.calls.append(kb.finish(b))
    return True


def _nan_max(scalars, t):
    """max(a, b) of two values (scalars or vectors), NaN if either is: numpy's maximum."""

    def maximum(b, a, v):
        return scalars.max_min(b, a, v, t, True)

    return maximum


def _add(b: ir.IRBuilder, p, q):
    return b.fadd(p, q)


def _splat(vec: ir.VectorType, value: float) -> ir.Constant:
    return ir.Constant(vec, [ir.Constant(vec.element, value)] * vec.count)


def _broadcast(b: ir.IRBuilder, scalar, vec: ir.VectorType):
    """`scalar` in every lane of a `vec`."""
    one = b.insert_element(ir.Constant(vec, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                            ir.Constant(ir.VectorType(ir.IntType(32), vec.count), [0] * vec.count))


def _fold(b: ir.IRBuilder, v, lanes: int, combine):
    """combine(...) of all lanes of `v`, by halves: lanes [0, w/2) with [w/2, w), until one."""
    width = lanes
    while width > 1:
        half = width // 2
        low = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), half),
                                                 list(range(half))))
        high = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), half),
                                                  list(range(half, width))))
        v = combine(b, low, high)
        width = half
    return b.extract_element(v, ir.Constant(ir.IntType(32), 0))


# ---- row programs (graphc.passes.fuse_rows) -------------------------------------------------
def lower_row_program(lw, node, body) -> None:
    """Lower a row program (see the module docstring): one kernel over its domain's rows."""
    fb = body.fused
    domain = row_domain(fb)
    if domain is None:
        raise unsupported(node, "a row program without a row reduction of static size")
    width = domain[-1]
    reductions, columns = {}, {}
    for k, ins in enumerate(fb.instructions):
        arg = tuple(fb.types[ins.args[0]].shape) if ins.args else ()
        if row_reduction(ins.op, ins.attrs, arg) and arg == domain:
            reductions[fb.ref(k)] = ins
        elif column_sum(ins.op, ins.attrs, arg) and arg == domain:
            columns[fb.ref(k)] = ins
        elif REGISTRY[ins.op].reduction is not None:
            raise unsupported(node, f"{ins.op} over axes {ins.attrs.get('axes')} in a row "
                              f"program over {list(domain)}")

    def varies(ref: int) -> bool:  # along the row
        shape = fb.types[ref].shape
        return ref not in reductions and len(shape) >= 1 and shape[-1] == width

    level: dict[int, int] = {}  # loops over the row needed before a ref is known
    for ref in range(fb.n_inputs + len(fb.instructions)):
        if ref < fb.n_inputs:
            level[ref] = 0
            continue
        args = fb.instruction(ref).args
        deepest = max((level[a] for a in args), default=0)
        level[ref] = deepest + 1 if ref in reductions else deepest
    passes = max(level[fb.instruction(r).args[0]] for r in reductions) + 1

    kb = KernelBuilder(lw, lw.name("rows"), domain, body.recipe("row program", 0, None))
    used = {a for ins in fb.instructions for a in ins.args} | set(fb.outputs)
    leaves = {r: kb.operand(lw.locs[node.inputs[r]]) for r in sorted(used) if r < fb.n_inputs}
    stored = {}  # ref -> its operand: the row outputs first, then the column sums
    for ref, v in zip(fb.outputs, node.outputs):
        if ref in leaves:
            raise unsupported(node, "a row program returning one of its inputs")
        if ref not in columns:
            stored[ref] = kb.operand(lw.locs[v])
    column_strides = (0,) * (len(domain) - 1) + (1,)
    column_outputs = [(ref, v) for ref, v in zip(fb.outputs, node.outputs) if ref in columns]
    # many rows: cut into parts, each adding into partial column sums (column_parts)
    parts = column_parts.plan(lw, domain, [o.strides for o in kb.operands] +
                              [column_strides] * len(column_outputs),
                              [fb.types[ref].dtype for ref, _ in column_outputs]) \
        if column_outputs else None
    for k, (ref, v) in enumerate(column_outputs):
        stored[ref] = kb.operand(lw.locs[v] if parts is None else parts.locs[k],
                                 column_strides)
    stores = [(ref, stored[ref], v) for ref, v in zip(fb.outputs, node.outputs)]
    outer_sizes, outer_strides = collapse(domain[:-1], [o.strides[:-1] for o in kb.operands])
    row_strides = [o.strides[-1] for o in kb.operands]
    if parts is not None:  # [parts, rows / parts], the parts forked
        outer_sizes, outer_strides, _ = parts.loops(
            outer_sizes, outer_strides, [k for ref, k, _ in stores if ref in columns])
    b = kb.begin(parallel=bool(outer_sizes) and (not columns or parts is not None))
    merge = None if parts is None else [(lw.locs[v], "reduce_sum", 0) for _, v in column_outputs]
    if b is None:  # built before: called with these pointers
        lw.calls.append(kb.kernel)
        if merge:
            lw.calls.append(parts.merge(lw, merge))
        return
    slots = {}
    with b.goto_entry_block():
        for ref in list(reductions) + list(columns):
            slots[ref] = b.alloca(REG[fb.types[ref].dtype.name], name=f"acc{ref}")
    add = {ref: reduction_combiner(lw.scalars, "reduce_sum", fb.types[ref].dtype)
           for ref in list(reductions) + list(columns)}
    for ref, k, v in stores:  # column sums start at zero (in parts: this share's partials)
        if ref in columns:
            first, end = (i64(0), i64(width)) if parts is None else \
                (b.mul(x, i64(parts.padded)) for x in kb.outer_range(b, parts.parts))
            with loop(b, first, end, "zero") as j:
                kb.store(b, k, j, convert(b, const(fb.types[ref].dtype, 0.0),
                                          fb.types[ref].dtype, v.type.dtype))

    def at(b, offsets, j):
        return [o if s == 0 else b.add(o, j if s == 1 else b.mul(j, size(b, s)))
                for o, s in zip(offsets, row_strides)]

    def render(b, ref, env, offsets):
        """The value of `ref` at `offsets`: row-invariant refs come from `env` (computed by
        `invariants` before the loop), the rest is computed here into `env`."""
        if ref in env:
            return env[ref]
        if ref < fb.n_inputs:
            k = leaves[ref]
            env[ref] = kb.load(b, k, offsets[k])
            return env[ref]
        op, args, attrs = fb.instruction(ref)
        t = fb.types[ref]
        if ref in reductions or ref in columns:
            raise unsupported(node, f"internal: row program ref {ref} ({op}) read too early")
        if op == "broadcast_to":
            env[ref] = render(b, args[0], env, offsets)
        elif op == "full":
            env[ref] = filled(b, t.dtype, attrs["value"])
        else:
            vals = [render(b, a, env, offsets) for a in args]
            env[ref] = lw.scalars.emit(b, REGISTRY[op].scalar, attrs, vals,
                                       [fb.types[a].dtype for a in args], t)
        return env[ref]

    def invariants(b, env, offsets, depth):
        """Row-invariant refs known after `depth` loops, in straight-line code."""
        for ref in range(fb.n_inputs + len(fb.instructions)):
            if (ref not in env and ref in used and not varies(ref) and level[ref] <= depth
                    and ref not in reductions and (ref >= fb.n_inputs or ref in leaves)):
                render(b, ref, env, offsets)

    def row(b, offsets):
        env: dict = {}
        for p in range(passes):
            invariants(b, env, offsets, p)
            summed = [r for r, ins in reductions.items() if level[ins.args[0]] == p]
            for r in summed:
                b.store(const(fb.types[r].dtype, 0.0), slots[r])
            with for_range(b, width, f"pass{p}") as j:
                local = {r: env[r] for r in env if not varies(r)}
                offs = at(b, offsets, j)
                for r in summed:
                    arg = fb.instruction(r).args[0]
                    v = convert(b, render(b, arg, local, offs), fb.types[arg].dtype,
                                fb.types[r].dtype)
                    b.store(add[r](b, b.load(slots[r]), v, True), slots[r])
            for r in summed:
                total = b.load(slots[r])
                if fb.instruction(r).op == "reduce_mean":
                    total = b.fdiv(total, const(fb.types[r].dtype, width))
                env[r] = total
        invariants(b, env, offsets, passes)
        for ref, k, v in stores:
            if ref not in columns and not varies(ref):
                kb.store(b, k, offsets[k], convert(b, env[ref], fb.types[ref].dtype,
                                                   v.type.dtype))
        with for_range(b, width, "store") as j:
            local = {r: env[r] for r in env if not varies(r)}
            offs = at(b, offsets, j)
            results = []  # every element read before any is written: an output may be
            for ref, k, v in stores:  # planned in place of an input (graphc.passes.plan)
                if ref in columns:
                    arg = fb.instruction(ref).args[0]
                    x = convert(b, render(b, arg, local, offs), fb.types[arg].dtype,
                                v.type.dtype)
                    results.append((k, add[ref](b, kb.load(b, k, offs[k]), x, False)))
                elif varies(ref):
                    results.append((k, convert(b, render(b, ref, local, offs),
                                               fb.types[ref].dtype, v.type.dtype)))
            for k, value in results:
                kb.store(b, k, offs[k], value)

    fetch = _row_fetcher(kb, outer_sizes, outer_strides, row_strides, width,
                         [k for ref, k, _ in stores if ref not in columns],
                         {k for ref, k, _ in stores if ref in columns})

    def fetched_row(b, offsets):
        fetch(b, offsets)
        row(b, offsets)

    kb.nest(b, outer_sizes, outer_strides, row if fetch is None else fetched_row)
    lw.calls.append(kb.finish(b))
    if merge:  # the partial column sums added in part order
        lw.calls.append(parts.merge(lw, merge))


def _row_fetcher(kb, outer_sizes, outer_strides, row_strides, width: int, outputs: list,
                 columns: set):
    """graphc.backends.cpu.prefetch's `row_prefetcher` for a row program's rows (`PREFETCH`):
    each row asks for the lines of the row PREFETCH_AHEAD_ROWS on, of every operand that
    moves from row to row (not a column sum, `columns`, which moves only from part to part,
    not a per-row scalar); None where none does or the domain is small."""
    if not PREFETCH or not outer_sizes:
        return None
    strides = [tuple(o) + (r if any(o) and k not in columns else 0,)
               for k, (o, r) in enumerate(zip(outer_strides, row_strides))]
    return row_prefetcher(kb, tuple(outer_sizes) + (width,), strides, outputs,
                          PREFETCH_AHEAD_ROWS)

