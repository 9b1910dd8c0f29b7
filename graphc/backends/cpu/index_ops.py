"""index_ops: gathers, scatters, embedding, pad, flip, argmax/argmin, randint and randperm as
CPU kernels.

Part of the top layer of the CPU code generator (codegen's `Lowerer` calls `lower_index` for
every op named in INDEX_OPS). Each op is one to three kernels appended to `lw.calls`:

- take, embedding, gather: one loop over the output; the index is read, checked, and picks
  the input element along the axis.
- index_add, index_put, scatter_add, embedding_backward: the output is first a copy of `x`
  (zeros for embedding_backward), then one loop over `src` (or the gradient) adds (stores)
  each element at the indexed position. Addition order: the loop runs over the source
  row-major, so every output element receives its contributions one at a time in increasing
  source position, the order numpy's `np.add.at` (the eager kernels) uses: float32 sums are
  bit for bit the interpreter's. index_put with a repeated index keeps the last value, as
  numpy's assignment does. scatter_add into a 0-d `x` adds the sum of `src` taken left to
  right (numpy's pairwise sum agrees for fewer than 8 elements and to rounding beyond).
- slice_scatter (copy, then the source into the slice), pad (fill, then the cropped input
  into the interior), flip (a copy through negative strides): copies between Locs.
- argmax / argmin: per output element a loop over the reduced elements in row-major order
  keeping the first extreme; a NaN wins over any number (the first NaN), as numpy's.
- randint: element i of the eager Philox stream (graphc.ops.random's specification, rendered
  by graphc.backends.cpu.philox): bit for bit the interpreter's.
- randperm: the keys of the eager stream sorted by a stable bottom-up merge sort over
  (key, index) pairs in backend scratch: exactly the interpreter's stable argsort.

Invariants: every index is checked before it is used: a value outside the range the eager
kernel accepts ([-n, n) for take/index_add/index_put, [0, n) for gather, scatter_add and
embedding) makes the kernel return its status (the driver stops and the executable raises
IndexOutOfRangeError with `lw.errors[status - 1]`, naming the op, the node and the valid
range): no element is read or written out of bounds, and the next call runs normally. The
plan never places these outputs over an input (only elementwise nodes reuse an input's
buffer), so copying `x` into the output first is safe.
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import philox
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.scalars import const
from graphc.backends.cpu.values import (
    I32,
    I64,
    REG,
    Loc,
    collapse,
    contiguous_strides,
    for_range,
    i64,
    loop,
    unsupported,
)
from graphc.backends.cpu.values import size as size_value  # `size` names extents here
from graphc.ir.graph import Node
from graphc.ir.printer import format_node
from graphc.types import TensorType, bool_, int64

__all__ = ["INDEX_LOWERINGS", "INDEX_OPS", "lower_index"]

INDEX_OPS: tuple[str, ...] = (
    "take", "gather", "index_add", "index_put", "scatter_add", "slice_scatter", "embedding",
    "embedding_backward", "pad", "flip", "argmax", "argmin", "randint", "randperm",
)


def lower_index(lw, node: Node) -> None:
    """Append to `lw.calls` the kernels computing `node` (one of INDEX_OPS)."""
    INDEX_LOWERINGS[node.op](lw, node)


# ---- helpers --------------------------------------------------------------------------------
def _elems(loc: Loc) -> tuple[int, ...]:
    """Element strides of a Loc."""
    item = loc.type.dtype.itemsize
    return tuple(s // item for s in loc.strides)


def _status(lw, node: Node, what: str) -> int:
    """Register the error message of `node`'s bad indices; its driver status code."""
    lw.errors.append(f"{node.op}: {what} in node {format_node(node)}"
                     f"{' at ' + node.loc if node.loc else ''}")
    return len(lw.errors)


def _range_text(size: int, axis: int, allow_negative: bool) -> str:
    valid = f"{-size}..{size - 1}" if allow_negative else f"0..{size - 1}"
    return (f"an index is out of bounds for dimension {axis} with size {size} "
            f"(valid indices: {valid})")


def _checked(b, idx, extent, allow_negative: bool, status: int):
    """`idx` made non-negative; the kernel returns `status` when it is out of range of
    `extent` (an int, or a size known per call)."""
    n = size_value(b, extent)
    low = b.neg(n) if allow_negative else i64(0)
    bad = b.or_(b.icmp_signed("<", idx, low), b.icmp_signed(">=", idx, n))
    with b.if_then(bad, likely=False):
        b.ret(ir.Constant(I32, status))
    if allow_negative:
        idx = b.select(b.icmp_signed("<", idx, i64(0)), b.add(idx, n), idx)
    return idx


def _add(b, dtype, acc, v):
    if dtype.is_floating:
        return b.fadd(acc, v)
    return b.or_(acc, v) if dtype is bool_ else b.add(acc, v)


def _indexed_loop(lw, node: Node, domain, index: Loc, index_strides, moved: Loc,
                  moved_strides, axis_stride: int, size: int, allow_negative: bool,
                  others: list[tuple[Loc, tuple | None]], element, what: str) -> None:
    """One status kernel over `domain`: per element, the index (read through `index_strides`)
    is checked against `size` and moves operand `moved` by index * `axis_stride` elements;
    `element(b, kb, moved_id, moved_offset, other_ids, offsets)` does the work."""
    kb = KernelBuilder(lw, lw.name(node.op), domain)
    kb.kernel.status = True
    status = _status(lw, node, what)
    ix = kb.operand(index, tuple(index_strides))
    mv = kb.operand(moved, tuple(moved_strides))
    ids = [kb.operand(loc, strides) for loc, strides in others]
    b = kb.begin()

    def leaf(b, offs):
        k = _checked(b, kb.load(b, ix, offs[ix]), size, allow_negative, status)
        element(b, kb, mv, b.add(offs[mv], b.mul(k, size_value(b, axis_stride))), ids, offs)

    kb.nest(b, *collapse(domain, [o.strides for o in kb.operands]), leaf)
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


def _load_into(out_pos: int):
    """element(): the moved operand's value stored into others[out_pos]."""
    def element(b, kb, mv, at, ids, offs):
        o = ids[out_pos]
        kb.store(b, o, offs[o], kb.load(b, mv, at))
    return element


def _store_from(src_pos: int, accumulate: bool, dtype):
    """element(): others[src_pos] stored (or added) at the moved operand's position."""
    def element(b, kb, mv, at, ids, offs):
        s = ids[src_pos]
        v = kb.load(b, s, offs[s])
        kb.store(b, mv, at, _add(b, dtype, kb.load(b, mv, at), v) if accumulate else v)
    return element


def _along(strides, axis: int, n_index_dims: int) -> tuple[int, ...]:
    """Strides over (pre, index dims, post) of an operand whose `axis` the index replaces."""
    return tuple(strides[:axis]) + (0,) * n_index_dims + tuple(strides[axis + 1:])


# ---- take, embedding, gather: reads through an index --------------------------------------
def _take(lw, node: Node, axis: int, allow_negative: bool, what: str, x, index) -> None:
    out = node.outputs[0]
    lx, li = lw.locs[x], lw.locs[index]
    size, xs = x.type.shape[axis], _elems(lx)
    post = x.type.ndim - axis - 1
    index_strides = (0,) * axis + _elems(li) + (0,) * post
    _indexed_loop(lw, node, out.type.shape, li, index_strides, lx,
                  _along(xs, axis, index.type.ndim), xs[axis], size, allow_negative,
                  [(lw.locs[out], None)], _load_into(0), what)


def _lower_take(lw, node: Node) -> None:
    x, index = node.inputs
    axis = node.attrs["axis"]
    _take(lw, node, axis, True, _range_text(x.type.shape[axis], axis, True), x, index)


def _lower_embedding(lw, node: Node) -> None:
    weight, indices = node.inputs
    n = weight.type.shape[0]
    _take(lw, node, 0, False, f"index out of range in self (indices must lie in 0..{n - 1})",
          weight, indices)


def _gather_strides(loc: Loc, axis: int) -> tuple[int, ...]:
    return tuple(0 if d == axis else s for d, s in enumerate(_elems(loc)))


def _check_gather_ranks(node: Node, x, index) -> None:
    if index.type.ndim != x.type.ndim:
        raise unsupported(node, f"{node.op} of a {x.type.ndim}-d input with a "
                                f"{index.type.ndim}-d index (eager mode refuses it too)")


def _lower_gather(lw, node: Node) -> None:
    x, index = node.inputs
    out = node.outputs[0]
    axis = node.attrs["axis"]
    if x.type.ndim == 0:  # eager: x reshaped to the index's shape, indices unread
        return lw.copy(lw.locs[x], lw.locs[out], "gather")
    _check_gather_ranks(node, x, index)
    lx = lw.locs[x]
    size = x.type.shape[axis]
    _indexed_loop(lw, node, index.type.shape, lw.locs[index], _elems(lw.locs[index]), lx,
                  _gather_strides(lx, axis), _elems(lx)[axis], size, False,
                  [(lw.locs[out], None)], _load_into(0), _range_text(size, axis, False))


# ---- scatters: a copy of x (or zeros), then the source added or stored ----------------------
def _lower_index_add_put(lw, node: Node) -> None:
    x, index, src = node.inputs
    out = node.outputs[0]
    axis = node.attrs["axis"]
    lo = lw.locs[out]
    lw.copy(lw.locs[x], lo, node.op)
    if src.type.numel == 0:
        return
    size, os_ = x.type.shape[axis], _elems(lo)
    post = x.type.ndim - axis - 1
    li = lw.locs[index]
    _indexed_loop(lw, node, src.type.shape, li, (0,) * axis + _elems(li) + (0,) * post, lo,
                  _along(os_, axis, index.type.ndim), os_[axis], size, True,
                  [(lw.locs[src], None)],
                  _store_from(0, node.op == "index_add", out.type.dtype),
                  _range_text(size, axis, True))


def _lower_scatter_add(lw, node: Node) -> None:
    x, index, src = node.inputs
    out = node.outputs[0]
    axis = node.attrs["axis"]
    lo = lw.locs[out]
    lw.copy(lw.locs[x], lo, "scatter_add")
    if index.type.numel == 0:
        return
    if x.type.ndim == 0:
        return _add_sum(lw, node, lo, lw.locs[src])
    _check_gather_ranks(node, x, index)
    size = x.type.shape[axis]
    li = lw.locs[index]
    _indexed_loop(lw, node, index.type.shape, li, _elems(li), lo, _gather_strides(lo, axis),
                  _elems(lo)[axis], size, False, [(lw.locs[src], None)],
                  _store_from(0, True, out.type.dtype), _range_text(size, axis, False))


def _add_sum(lw, node: Node, out: Loc, src: Loc) -> None:
    """out (0-d) += the left-to-right sum of src (scatter_add into a 0-d x)."""
    domain = src.type.shape
    kb = KernelBuilder(lw, lw.name("scatter_add"), domain)
    s = kb.operand(src)
    o = kb.operand(out, (0,) * len(domain))
    dt = out.type.dtype
    b = kb.begin()
    with b.goto_entry_block():
        acc = b.alloca(REG[dt.name] if dt is not bool_ else ir.IntType(1), name="acc")
    b.store(const(dt, 0), acc)
    kb.nest(b, *collapse(domain, [x.strides for x in kb.operands]),
            lambda b, offs: b.store(_add(b, dt, b.load(acc), kb.load(b, s, offs[s])), acc))
    kb.store(b, o, i64(0), _add(b, dt, kb.load(b, o, i64(0)), b.load(acc)))
    lw.calls.append(kb.finish(b))


def _lower_embedding_backward(lw, node: Node) -> None:
    g, indices = node.inputs
    out = node.outputs[0]
    n, pad = node.attrs["num_weights"], node.attrs["padding_idx"]
    lo = lw.locs[out]
    lw.fill(lo, 0.0, "embedding_backward")
    if g.type.numel:
        os_, li = _elems(lo), lw.locs[indices]
        _indexed_loop(lw, node, g.type.shape, li, _elems(li) + (0,), lo,
                      (0,) * indices.type.ndim + (os_[1],), os_[0], n, False,
                      [(lw.locs[g], None)], _store_from(0, True, out.type.dtype),
                      f"index out of range in self (indices must lie in 0..{n - 1})")
    if pad is not None:
        row = pad + n if pad < 0 else pad
        lw.fill(Loc(lo.base, lo.index, lo.offset + row * lo.strides[0], lo.strides[1:],
                    TensorType(out.type.shape[1:], out.type.dtype)), 0.0, "padding_row")


# ---- copies between Locs: slice_scatter, pad, flip ------------------------------------------
def _part(loc: Loc, starts, shape, steps=None) -> Loc:
    """The box of `loc` starting at `starts` with `shape` (and element `steps`)."""
    steps = steps or (1,) * len(shape)
    offset = loc.offset + sum(a * s for a, s in zip(starts, loc.strides))
    return Loc(loc.base, loc.index, offset, tuple(s * k for s, k in zip(loc.strides, steps)),
               TensorType(tuple(shape), loc.type.dtype))


def _lower_slice_scatter(lw, node: Node) -> None:
    x, src = node.inputs
    lo = lw.locs[node.outputs[0]]
    lw.copy(lw.locs[x], lo, "slice_scatter")
    if src.type.numel:
        a = node.attrs
        lw.copy(lw.locs[src], _part(lo, a["starts"], src.type.shape, a["steps"]),
                "slice_scatter")


def _lower_pad(lw, node: Node) -> None:
    x = node.inputs[0]
    out = node.outputs[0]
    pads = node.attrs["pads"]
    dt = out.type.dtype
    value = node.attrs["value"]
    value = value if dt.is_floating else bool(value) if dt is bool_ else int(value)
    lo, lx = lw.locs[out], lw.locs[x]
    lw.fill(lo, value, "pad")
    before, after = pads[0::2], pads[1::2]
    crop_start = [max(-p, 0) for p in before]
    shape = [n - s - max(-a, 0) for n, s, a in zip(x.type.shape, crop_start, after)]
    if all(n > 0 for n in shape):
        lw.copy(_part(lx, crop_start, shape), _part(lo, [max(p, 0) for p in before], shape),
                "pad")


def _lower_flip(lw, node: Node) -> None:
    x = node.inputs[0]
    lx = lw.locs[x]
    axes = node.attrs["axes"]
    offset = lx.offset + sum((x.type.shape[d] - 1) * lx.strides[d] for d in axes)
    strides = tuple(-s if d in axes else s for d, s in enumerate(lx.strides))
    lw.copy(Loc(lx.base, lx.index, offset, strides, x.type), lw.locs[node.outputs[0]], "flip")


# ---- argmax / argmin ------------------------------------------------------------------------
def _lower_arg(lw, node: Node) -> None:
    x = node.inputs[0]
    out = node.outputs[0]
    axis, keepdim = node.attrs["axis"], node.attrs["keepdim"]
    lx, lo = lw.locs[x], lw.locs[out]
    if x.type.ndim == 0:
        return lw.fill(lo, 0, node.op)
    reduced = list(range(x.type.ndim)) if axis is None else [axis]
    kept = [d for d in range(x.type.ndim) if d not in reduced]
    xs = _elems(lx)
    os_ = _elems(lo)
    if keepdim:
        os_ = tuple(s for d, s in enumerate(os_) if d in kept)
    domain = tuple(x.type.shape[d] for d in kept)
    kb = KernelBuilder(lw, lw.name(node.op), domain)
    xi = kb.operand(lx, tuple(xs[d] for d in kept))
    oi = kb.operand(lo, os_)
    dt = x.type.dtype
    is_max = node.op == "argmax"
    b = kb.begin()
    with b.goto_entry_block():
        best = b.alloca(REG[dt.name], name="best")
        best_at = b.alloca(I64, name="best_at")
        count = b.alloca(I64, name="count")

    def better(b, v, old):
        if not dt.is_floating:
            return b.icmp_signed(">" if is_max else "<", v, old)
        beats = b.fcmp_ordered(">" if is_max else "<", v, old)
        nan_first = b.and_(b.fcmp_unordered("uno", v, v), b.fcmp_ordered("ord", old, old))
        return b.or_(beats, nan_first)

    def scan(b, offset, depth):
        if depth == len(reduced):
            v, k = kb.load(b, xi, offset), b.load(count)
            take = better(b, v, b.load(best))
            b.store(b.select(take, v, b.load(best)), best)
            b.store(b.select(take, k, b.load(best_at)), best_at)
            b.store(b.add(k, i64(1)), count)
            return
        d = reduced[depth]
        with for_range(b, x.type.shape[d], f"r{depth}") as j:
            scan(b, b.add(offset, b.mul(j, i64(xs[d]))), depth + 1)

    def leaf(b, offs):
        b.store(kb.load(b, xi, offs[xi]), best)
        b.store(i64(0), best_at)
        b.store(i64(0), count)
        scan(b, offs[xi], 0)
        kb.store(b, oi, offs[oi], b.load(best_at))

    kb.nest(b, *collapse(domain, [o.strides for o in kb.operands]), leaf)
    lw.calls.append(kb.finish(b))


# ---- randint and randperm: the eager Philox stream -------------------------------------------
def _signed(n: int) -> int:
    """A 64-bit pattern as the signed value LLVM's i64 constants take."""
    n %= 1 << 64
    return n - (1 << 64) if n >= 1 << 63 else n


def _key(b, seed, offset, i):
    """The 64-bit key (word(2i) << 32 | word(2i+1)) of element i."""
    hi, lo = philox.word_pair(b, seed, offset, b.shl(i, i64(1)))
    return b.or_(b.shl(b.zext(hi, I64), i64(32)), b.zext(lo, I64))


def _seed_words(kb, b, lw, seed_v, s):
    seed_loc = lw.locs[seed_v]
    second = _elems(seed_loc)[0] if seed_loc.strides else 1
    return kb.load(b, s, i64(0)), kb.load(b, s, i64(second))


def _lower_randint(lw, node: Node) -> None:
    out = node.outputs[0]
    shape = out.type.shape
    low, high = node.attrs["low"], node.attrs["high"]
    span = high - low
    kb = KernelBuilder(lw, lw.name("randint"), shape)
    s = kb.operand(lw.locs[node.inputs[0]], (0,) * len(shape))
    lin = kb.virtual(int64, 0, 1, contiguous_strides(shape, 1))
    o = kb.operand(lw.locs[out])
    b = kb.begin()
    seed, offset = _seed_words(kb, b, lw, node.inputs[0], s)

    def leaf(b, offs):
        i = kb.load(b, lin, offs[lin])
        if span <= 1 << 32:
            w = b.zext(philox.word(b, seed, offset, i), I64)
        else:
            w = _key(b, seed, offset, i)
        kb.store(b, o, offs[o], b.add(b.urem(w, i64(_signed(span))), i64(_signed(low))))

    kb.nest(b, *collapse(shape, [k.strides for k in kb.operands]), leaf)
    lw.calls.append(kb.finish(b))


def _lower_randperm(lw, node: Node) -> None:
    """Keys of the stream, then a stable bottom-up merge sort of (key, index) pairs between
    two scratch halves; the indices of the sorted pairs are the permutation."""
    n = node.attrs["n"]
    out = node.outputs[0]
    scratch = lw.scratch_loc(TensorType((4 * n,), int64))  # keys A, idx A, keys B, idx B
    kb = KernelBuilder(lw, lw.name("randperm"), (1,))
    s = kb.operand(lw.locs[node.inputs[0]], (0,))
    w = kb.operand(scratch, (0,))
    o = kb.operand(lw.locs[out], (0,))
    b = kb.begin()
    seed, offset = _seed_words(kb, b, lw, node.inputs[0], s)
    with b.goto_entry_block():
        src = b.alloca(I64, name="src")  # element offset of the current (keys, idx) half
        width = b.alloca(I64, name="width")
        cur = [b.alloca(I64, name=nm) for nm in ("i", "j", "k")]

    with for_range(b, n, "key") as i:
        kb.store(b, w, i, _key(b, seed, offset, i))
        kb.store(b, w, b.add(i, i64(n)), i)
    b.store(i64(0), src)
    b.store(i64(1), width)
    head = b.append_basic_block("pass.head")
    body = b.append_basic_block("pass.body")
    done = b.append_basic_block("pass.end")
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(width), i64(n)), body, done)
    b.position_at_end(body)
    src_v = b.load(src)
    dst_v = b.sub(i64(2 * n), src_v)  # the other half
    wd = b.load(width)
    runs = b.sdiv(b.add(i64(n - 1), b.mul(wd, i64(2))), b.mul(wd, i64(2)))
    with loop(b, 0, runs, "run") as r:
        lo = b.mul(r, b.mul(wd, i64(2)))
        mid = _min(b, b.add(lo, wd), i64(n))
        hi = _min(b, b.add(mid, wd), i64(n))
        b.store(lo, cur[0])
        b.store(mid, cur[1])
        with loop(b, lo, hi, "merge") as k:
            i_, j_ = b.load(cur[0]), b.load(cur[1])
            i_ok = b.icmp_signed("<", i_, mid)
            j_ok = b.icmp_signed("<", j_, hi)
            ki = kb.load(b, w, b.add(src_v, _min(b, i_, i64(n - 1))))
            kj = kb.load(b, w, b.add(src_v, _min(b, j_, i64(n - 1))))
            # take the left run's pair unless the right run's key is strictly smaller
            left = b.and_(i_ok, b.or_(b.not_(j_ok), b.icmp_unsigned("<=", ki, kj)))
            pick = b.select(left, i_, j_)
            kb.store(b, w, b.add(dst_v, k), b.select(left, ki, kj))
            kb.store(b, w, b.add(dst_v, b.add(k, i64(n))),
                     kb.load(b, w, b.add(src_v, b.add(pick, i64(n)))))
            b.store(b.select(left, b.add(i_, i64(1)), i_), cur[0])
            b.store(b.select(left, j_, b.add(j_, i64(1))), cur[1])
    b.store(dst_v, src)
    b.store(b.mul(wd, i64(2)), width)
    b.branch(head)
    b.position_at_end(done)
    final = b.load(src)
    with for_range(b, n, "out") as i:
        kb.store(b, o, i, kb.load(b, w, b.add(final, b.add(i, i64(n)))))
    lw.calls.append(kb.finish(b))


def _min(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


INDEX_LOWERINGS = {
    "take": _lower_take, "embedding": _lower_embedding, "gather": _lower_gather,
    "index_add": _lower_index_add_put, "index_put": _lower_index_add_put,
    "scatter_add": _lower_scatter_add, "embedding_backward": _lower_embedding_backward,
    "slice_scatter": _lower_slice_scatter, "pad": _lower_pad, "flip": _lower_flip,
    "argmax": _lower_arg, "argmin": _lower_arg, "randint": _lower_randint,
    "randperm": _lower_randperm,
}
assert set(INDEX_LOWERINGS) == set(INDEX_OPS)
