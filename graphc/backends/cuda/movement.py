"""movement: generated kernels for data movement, indexing, arg-reductions and random ops.

`MOVEMENT_LOWERINGS` maps op names to `lower(lowerer, node)` (graphc.backends.cuda.ops
dispatches to it). Every kernel runs one thread per output element, scatters included: an
output element gathers its contributions in index order (scatter_add walks its line of the
index; index_add/index_put/embedding_backward first sort the index stably, then each element
binary-searches its segment), so repeated indices accumulate as numpy's `add.at`, bit for
bit and the same on every run, and no float atomics are used (docs/backends.md). Index
checks follow the eager kernels' ranges (negative indices wrap where eager allows them); a
bad index sets an error word (the executable raises IndexOutOfRangeError after the call)
and is never dereferenced.
Random ops follow graphc/ops/random.py's Philox stream exactly (same words, same
conversions), reading `[seed, offset]` from their int64 seed input on the device; randperm
ranks every key against all others (O(n^2) work, one thread per element), so it is exact
(the stable argsort) but meant for modest n.
"""

from __future__ import annotations

from graphc.backends.cuda import cudagen
from graphc.backends.cuda.lowering import Layout, Lowerer, unsupported
from graphc.ir.graph import Node


def _coords(n: int, prefix: str = "c") -> list[str]:
    return [f"{prefix}{d}" for d in range(n)]


def _start(lw: Lowerer, node: Node, threads: int | None = None):
    out = lw.layouts[node.outputs[0]]
    k = lw.new_kernel(node, out.type.numel if threads is None else threads)
    return k, out


def lower_copy_like(lw: Lowerer, node: Node) -> None:
    """copy, and reshape/permute/slice/broadcast_to where the plan gave them a buffer."""
    src, out = lw.layouts[node.inputs[0]], lw.layouts[node.outputs[0]]
    view = None if node.op == "copy" else lw.view_layout(node, node.outputs[0], src)
    if node.op == "copy":
        view = Layout(src.offset, src.strides, src.type)
    if view is not None:
        return lw.copy_to(view, out, node)
    # a reshape numpy copies: element i of the output is element i of the input, row-major
    k, _ = _start(lw, node)
    k.lines += cudagen.decompose(src.type.shape, "gi")
    k.lines.append(f"{_flat(k, out)} = "
                   f"{k.at(src, _coords(src.type.ndim))};")
    lw.emit(k)


def _flat(k, out: Layout) -> str:
    return cudagen.load(k.ptr(out.offset), out.type.dtype, "gi")


def lower_flip(lw: Lowerer, node: Node) -> None:
    src = lw.layouts[node.inputs[0]]
    k, out = _start(lw, node)
    shape = out.type.shape
    axes = {a % len(shape) for a in node.attrs["axes"]}
    k.lines += cudagen.decompose(shape, "gi")
    coords = [f"({shape[d] - 1}LL - c{d})" if d in axes else f"c{d}" for d in range(len(shape))]
    k.lines.append(f"{_flat(k, out)} = {k.at(src, coords)};")
    lw.emit(k)


def lower_pad(lw: Lowerer, node: Node) -> None:
    src = lw.layouts[node.inputs[0]]
    k, out = _start(lw, node)
    shape, pads = out.type.shape, node.attrs["pads"]
    k.lines += cudagen.decompose(shape, "gi")
    coords = [f"(c{d} - {pads[2 * d]}LL)" for d in range(len(shape))]
    inside = " && ".join(f"{c} >= 0 && {c} < {n}LL" for c, n in zip(coords, src.type.shape))
    value = cudagen.literal(node.attrs["value"], out.type.dtype)
    k.lines.append(f"{_flat(k, out)} = ({inside or 'true'}) ? "
                   f"{k.at(src, coords) if src.type.numel else value} : {value};")
    lw.emit(k)


def lower_concat(lw: Lowerer, node: Node) -> None:
    k, out = _start(lw, node)
    shape, axis = out.type.shape, node.attrs["axis"] % len(out.type.shape)
    k.lines += cudagen.decompose(shape, "gi")
    start, first = 0, True
    for v in node.inputs:
        layout = lw.layouts[v]
        size = v.type.shape[axis]
        if size == 0:
            continue
        coords = [f"(c{d} - {start}LL)" if d == axis else f"c{d}" for d in range(len(shape))]
        value = cudagen.scalar("cast", {}, [k.at(layout, coords)], [v.type.dtype],
                               out.type.dtype)
        cond = f"c{axis} < {start + size}LL"
        k.lines.append(f"{'' if first else 'else '}if ({cond}) {_flat(k, out)} = {value};")
        start, first = start + size, False
    lw.emit(k)


def _checked_index(lw: Lowerer, k, node: Node, expr: str, size: int, negative: bool,
                   what: str) -> None:
    """Declare `ix` = the index `expr` wrapped and checked against [0, size)."""
    word = lw.error_word(f"{node.op}: an index is out of bounds for dimension of size {size} "
                         f"({what})")
    k.lines.append(f"long long ix = {expr};")
    if negative:
        k.lines.append(f"if (ix < 0 && ix >= -{size}LL) ix += {size}LL;")
    k.lines.append(f"if (ix < 0 || ix >= {size}LL) {{ {_raise(k, word)} return; }}")


def _raise(k, word: int) -> str:
    """Set an error word from any number of threads: an atomic store (plain stores of the
    same value from several threads are still a data race, which racecheck reports)."""
    return f"atomicExch((unsigned long long *){k.ptr(word)}, 1ULL);"


def lower_gather(lw: Lowerer, node: Node) -> None:
    x, index = (lw.layouts[v] for v in node.inputs)
    k, out = _start(lw, node)
    shape, axis = out.type.shape, node.attrs["axis"]
    if x.type.ndim == 0:
        raise unsupported(node, "gather from a 0-d tensor")
    axis %= x.type.ndim
    coords = _coords(len(shape))
    k.lines += cudagen.decompose(shape, "gi")
    _checked_index(lw, k, node, k.at(index, coords), x.type.shape[axis], False, "gather")
    src = ["ix" if d == axis else c for d, c in enumerate(coords)]
    k.lines.append(f"{_flat(k, out)} = {k.at(x, src)};")
    lw.emit(k)


def _take_coords(x: Layout, index: Layout, axis: int, coords: list[str]):
    """(x coords with `ix` at axis, index coords) for an element of take's output."""
    ni = index.type.ndim
    icoords = coords[axis:axis + ni]
    xcoords = coords[:axis] + ["ix"] + coords[axis + ni:]
    return xcoords, icoords


def lower_take(lw: Lowerer, node: Node) -> None:
    x, index = (lw.layouts[v] for v in node.inputs)
    k, out = _start(lw, node)
    axis = node.attrs["axis"] % x.type.ndim
    coords = _coords(out.type.ndim)
    k.lines += cudagen.decompose(out.type.shape, "gi")
    xc, ic = _take_coords(x, index, axis, coords)
    _checked_index(lw, k, node, k.at(index, ic), x.type.shape[axis], True, "take")
    k.lines.append(f"{_flat(k, out)} = {k.at(x, xc)};")
    lw.emit(k)


def lower_embedding(lw: Lowerer, node: Node) -> None:
    weight, indices = (lw.layouts[v] for v in node.inputs)
    k, out = _start(lw, node)
    coords = _coords(out.type.ndim)
    k.lines += cudagen.decompose(out.type.shape, "gi")
    _checked_index(lw, k, node, k.at(indices, coords[:-1]), weight.type.shape[0], False,
                   "embedding")
    k.lines.append(f"{_flat(k, out)} = {k.at(weight, ['ix', coords[-1]])};")
    lw.emit(k)


def lower_scatter(lw: Lowerer, node: Node) -> None:
    """scatter_add, index_add, index_put, slice_scatter. slice_scatter copies the base, then
    writes the (distinct) targets. The others are deterministic owner-computes kernels: each
    output element gathers its contributions in index order (numpy's `add.at` order, so the
    float sums are numpy's bit for bit; a repeated index_put target keeps its last value)."""
    out = lw.layouts[node.outputs[0]]
    x = lw.layouts[node.inputs[0]]
    if x.type.ndim == 0:
        raise unsupported(node, f"{node.op} on a 0-d tensor")
    if node.op == "scatter_add":
        return _scatter_add_owned(lw, node, x, out)
    if node.op in ("index_add", "index_put"):
        return _index_scatter_owned(lw, node, x, out)
    lw.copy_to(x, out, node)
    src = lw.layouts[node.inputs[-1]]
    k = lw.new_kernel(node, src.type.numel)
    coords = _coords(src.type.ndim)
    k.lines += cudagen.decompose(src.type.shape, "gi")
    starts, steps = node.attrs["starts"], node.attrs["steps"]
    target = [f"({s}LL + c{d} * {st}LL)" for d, (s, st) in enumerate(zip(starts, steps))]
    k.lines.append(f"{k.at(out, target)} = {k.at(src, coords)};")
    lw.emit(k)


def _scatter_add_owned(lw: Lowerer, node: Node, x: Layout, out: Layout) -> None:
    """out[.., i, ..] = x[.., i, ..] + the src[.., t, ..] with index[.., t, ..] == i, t rising:
    one thread per output element walks its line of the index along the axis (O(out * the
    index's extent along the axis)); a check kernel first flags out-of-range indices."""
    index, src = lw.layouts[node.inputs[1]], lw.layouts[node.inputs[2]]
    axis = node.attrs["axis"] % x.type.ndim
    size = x.type.shape[axis]
    check = lw.new_kernel(node, index.type.numel)
    check.lines += cudagen.decompose(index.type.shape, "gi")
    _checked_index(lw, check, node, check.at(index, _coords(index.type.ndim)), size, False,
                   "scatter_add")
    lw.emit(check)
    shape, ishape = out.type.shape, index.type.shape
    ct = cudagen.ctype(out.type.dtype)
    k, _ = _start(lw, node)
    coords = _coords(len(shape))
    k.lines += cudagen.decompose(shape, "gi")
    k.lines.append(f"{ct} acc = {k.at(x, coords)};")
    inside = " && ".join(f"c{d} < {ishape[d]}LL" for d in range(len(shape)) if d != axis)
    line = ["t" if d == axis else c for d, c in enumerate(coords)]
    add = cudagen.scalar("add", {}, ["acc", k.at(src, line)], [out.type.dtype, src.type.dtype],
                         out.type.dtype)
    k.lines.append(f"if ({inside or 'true'}) {{")
    k.lines.append(f"  for (long long t = 0; t < {ishape[axis]}LL; ++t) {{")
    k.lines.append(f"    if ({k.at(index, line)} == c{axis}) acc = {add};")
    k.lines += ["  }", "}", f"{k.at(out, coords)} = acc;"]
    lw.emit(k)


def _sorted_index(lw: Lowerer, node: Node, index: Layout, size: int, negative: bool,
                  what: str, skip: int | None = None) -> tuple[int, int]:
    """Sort the (wrapped, checked) index stably: returns scratch offsets (perm, keys) with
    keys[p] = index[perm[p]] ascending, equal keys in position order. One thread per entry
    ranks it against all others (O(n^2) work, exact; meant for the n of a batch of
    indices). Out-of-range entries set the error word and sort first as -1."""
    n = index.type.numel
    perm, keys = lw.scratch(8 * n), lw.scratch(8 * n)
    k = lw.new_kernel(node, n)
    flat = Layout(index.offset, index.strides, index.type)

    def key(var: str, name: str) -> list[str]:
        lines = cudagen.decompose(index.type.shape, var, f"{name}c")
        at = k.at(flat, [f"{name}c{d}" for d in range(index.type.ndim)])
        lines.append(f"long long {name} = {at};")
        if negative:
            lines.append(f"if ({name} < 0 && {name} >= -{size}LL) {name} += {size}LL;")
        lines.append(f"if ({name} < 0 || {name} >= {size}LL) {name} = -1;")
        return lines

    word = lw.error_word(f"{node.op}: an index is out of bounds for dimension of size {size} "
                         f"({what})")
    k.lines += key("gi", "mine")
    k.lines.append(f"if (mine < 0) {_raise(k, word)}")
    k.lines.append("long long rank = 0;")
    k.lines.append(f"for (long long j = 0; j < {n}LL; ++j) {{")
    k.lines += ["  " + line for line in key("j", "other")]
    k.lines.append("  rank += other < mine || (other == mine && j < gi);")
    k.lines.append("}")
    k.lines.append(f"((long long *){k.ptr(perm)})[rank] = gi;")
    k.lines.append(f"((long long *){k.ptr(keys)})[rank] = mine;")
    lw.emit(k)
    return perm, keys


def _segment_of(k, keys: int, n: int, row: str) -> list[str]:
    """Declare [lo, hi): the positions of sorted keys equal to `row` (two binary searches)."""
    kp = f"((long long *){k.ptr(keys)})"
    return [f"long long lo = 0, hi = {n}LL;",
            f"while (lo < hi) {{ long long mid = (lo + hi) >> 1; "
            f"if ({kp}[mid] < {row}) lo = mid + 1; else hi = mid; }}",
            f"long long end = lo; hi = {n}LL;",
            f"while (end < hi) {{ long long mid = (end + hi) >> 1; "
            f"if ({kp}[mid] <= {row}) end = mid + 1; else hi = mid; }}"]


def _index_scatter_owned(lw: Lowerer, node: Node, x: Layout, out: Layout) -> None:
    """index_add / index_put along `axis` with an index tensor: sort the index, then each
    output element sums (index_add, in index order) or takes the last (index_put) of the
    source entries whose index equals its coordinate."""
    index, src = lw.layouts[node.inputs[1]], lw.layouts[node.inputs[2]]
    axis = node.attrs["axis"] % x.type.ndim
    n = index.type.numel
    perm, keys = _sorted_index(lw, node, index, x.type.shape[axis], True, node.op)
    shape = out.type.shape
    k, _ = _start(lw, node)
    coords = _coords(len(shape))
    k.lines += cudagen.decompose(shape, "gi")
    ct = cudagen.ctype(out.type.dtype)
    k.lines.append(f"{ct} acc = {k.at(x, coords)};")
    k.lines += _segment_of(k, keys, n, f"c{axis}")
    ni = index.type.ndim
    k.lines.append("for (long long p = lo; p < end; ++p) {")
    if node.op == "index_put":
        k.lines[-1] = "if (end > lo) { long long p = end - 1;"
    k.lines.append(f"  long long j = ((long long *){k.ptr(perm)})[p];")
    k.lines += ["  " + line for line in cudagen.decompose(index.type.shape, "j", "s")]
    src_coords = coords[:axis] + [f"s{d}" for d in range(ni)] + coords[axis + 1:]
    value = k.at(src, src_coords)
    if node.op == "index_put":
        k.lines.append(f"  acc = ({ct})({value});")
    else:
        add = cudagen.scalar("add", {}, ["acc", value], [out.type.dtype, src.type.dtype],
                             out.type.dtype)
        k.lines.append(f"  acc = {add};")
    k.lines += ["}", f"{k.at(out, coords)} = acc;"]
    lw.emit(k)


def lower_embedding_backward(lw: Lowerer, node: Node) -> None:
    """Deterministic: the indices sorted, then each weight-gradient element sums its rows'
    gradients in index order (numpy's add.at order); the padding row stays 0."""
    g, indices = (lw.layouts[v] for v in node.inputs)
    out = lw.layouts[node.outputs[0]]
    rows, n = out.type.shape[0], indices.type.numel
    perm, keys = _sorted_index(lw, node, indices, rows, False, "embedding_backward")
    k, _ = _start(lw, node)
    k.lines += cudagen.decompose(out.type.shape, "gi")
    ct = cudagen.ctype(out.type.dtype)
    k.lines.append(f"{ct} acc = 0;")
    k.lines += _segment_of(k, keys, n, "c0")
    pad = node.attrs.get("padding_idx")
    if pad is not None:
        k.lines.append(f"if (c0 == {pad % rows}LL) end = lo;")
    k.lines.append("for (long long p = lo; p < end; ++p) {")
    k.lines.append(f"  long long j = ((long long *){k.ptr(perm)})[p];")
    k.lines += ["  " + line for line in cudagen.decompose(indices.type.shape, "j", "s")]
    g_coords = [f"s{d}" for d in range(indices.type.ndim)] + ["c1"]
    k.lines.append(f"  acc = acc + {k.at(g, g_coords)};")
    k.lines += ["}", f"{k.at(out, ['c0', 'c1'])} = acc;"]
    lw.emit(k)


def _addr(layout: Layout):
    from graphc.backends.cuda.lowering import Addr

    return Addr(layout.offset)


def lower_arg(lw: Lowerer, node: Node) -> None:
    """argmax/argmin over one axis, or over the flattened tensor (axis=None, row-major index);
    the first extreme wins, and a NaN beats every number (numpy's rule). A segment of threads
    per output (graphc.backends.cuda.reductions), split into chunks when the outputs are few."""
    from graphc.backends.cuda import reductions

    x = lw.layouts[node.inputs[0]]
    out = lw.layouts[node.outputs[0]]
    shape, is_min = x.type.shape, node.op == "argmin"
    if not shape:
        k, _ = _start(lw, node)
        k.lines.append(f"{_flat(k, out)} = 0;")
        return lw.emit(k)
    axis = node.attrs["axis"]
    red = list(range(len(shape))) if axis is None else [axis % len(shape)]
    kept = [d for d in range(len(shape)) if d not in red]
    ct = reductions.shuffle_type(cudagen.ctype(x.type.dtype))
    coords = _coords(len(shape))

    def value(k):
        return [], k.at(x, coords)

    def finish(k):
        return [f"{cudagen.load(k.ptr(out.offset), out.type.dtype, 'gc_o')} = at;"]

    reducer = reductions.arg_reducer(ct, is_min, value, finish)
    reductions.reduce_kernels(lw, node, out.type.numel,
                              (tuple(shape[d] for d in kept), kept),
                              reductions.prod(shape[d] for d in red),
                              (tuple(shape[d] for d in red), red), reducer)


def lower_random(lw: Lowerer, node: Node) -> None:
    seed = lw.layouts[node.inputs[-1]]
    k, out = _start(lw, node)
    dt = out.type.dtype
    ct = cudagen.ctype(dt)
    k.lines.append(f"unsigned long long s = (unsigned long long){k.at(seed, ['0'])}; "
                   f"unsigned long long o = (unsigned long long){k.at(seed, ['1'])};")
    word = "gc_philox_word(s, o, (unsigned long long)gi)"
    if node.op == "uniform":
        value = f"gc_uniform_{'f32' if dt.name == 'float32' else 'f64'}(s, o, gi)"
    elif node.op == "normal":
        u = f"gc_uniform_{'f32' if dt.name == 'float32' else 'f64'}"
        k.lines.append(f"double u1 = (double){u}(s, o, gi & ~1LL); "
                       f"double u2 = (double){u}(s, o, gi | 1LL);")
        k.lines.append("double r = sqrt(-2.0 * log(1.0 - u1)); "
                       "double t = 6.283185307179586 * u2;")
        value = f"({ct})((gi & 1) ? r * sin(t) : r * cos(t))"
    elif node.op == "dropout":
        x = lw.layouts[node.inputs[0]]
        p = float(node.attrs["p"])
        scale = cudagen.literal(0.0 if p == 1 else 1.0, dt)
        scale = f"({scale} / ({ct})({cudagen.literal(1.0 - p, 'float64')}))" if p != 1 else \
            scale
        keep = f"gc_uniform24({word}) < {cudagen.literal(1.0 - p, 'float64')}"
        coords = _coords(out.type.ndim)
        k.lines += cudagen.decompose(out.type.shape, "gi")
        value = f"{k.at(x, coords)} * (({keep}) ? {scale} : ({ct})0)"
    elif node.op == "bernoulli":
        p = lw.layouts[node.inputs[0]]
        coords = _coords(out.type.ndim)
        k.lines += cudagen.decompose(out.type.shape, "gi")
        value = f"(gc_uniform24({word}) < (double){k.at(p, coords)} ? ({ct})1 : ({ct})0)"
    else:
        raise unsupported(node, node.op)
    k.lines.append(f"{_flat(k, out)} = {value};")
    lw.emit(k)


def _seed_words(k, seed: Layout) -> None:
    k.lines.append(f"unsigned long long s = (unsigned long long){k.at(seed, ['0'])}; "
                   f"unsigned long long o = (unsigned long long){k.at(seed, ['1'])};")


def _key64(index: str) -> str:
    """The 64-bit word pair (2*index, 2*index + 1) of the stream, high word first."""
    return (f"(((unsigned long long)gc_philox_word(s, o, 2ULL * (unsigned long long)({index}))"
            f" << 32) | (unsigned long long)gc_philox_word(s, o, 2ULL * (unsigned long long)"
            f"({index}) + 1ULL))")


def lower_randint(lw: Lowerer, node: Node) -> None:
    """low + word(i) % r (r = high - low <= 2^32), else low + key64(i) % r, mod 2^64."""
    k, out = _start(lw, node)
    _seed_words(k, lw.layouts[node.inputs[-1]])
    low, span = node.attrs["low"], node.attrs["high"] - node.attrs["low"]
    word = "(unsigned long long)gc_philox_word(s, o, (unsigned long long)gi)" \
        if span <= 1 << 32 else _key64("gi")
    k.lines.append(f"{_flat(k, out)} = (long long)((unsigned long long){low}LL + "
                   f"{word} % {span}ULL);")
    lw.emit(k)


def lower_randperm(lw: Lowerer, node: Node) -> None:
    """The stable argsort of the 64-bit keys: element i goes to its rank (keys below it, and
    equal keys at lower indices). O(n^2) work: one thread per element scans all keys."""
    k, out = _start(lw, node)
    n = out.type.numel
    _seed_words(k, lw.layouts[node.inputs[-1]])
    k.lines.append(f"unsigned long long mine = {_key64('gi')}; long long rank = 0;")
    k.lines.append(f"for (long long j = 0; j < {n}LL; ++j) {{")
    k.lines.append(f"  unsigned long long other = {_key64('j')};")
    k.lines.append("  rank += other < mine || (other == mine && j < gi);")
    k.lines.append("}")
    k.lines.append(f"{cudagen.load(k.ptr(out.offset), out.type.dtype, 'rank')} = gi;")
    lw.emit(k)


MOVEMENT_LOWERINGS = {
    "copy": lower_copy_like, "reshape": lower_copy_like, "permute": lower_copy_like,
    "slice": lower_copy_like, "broadcast_to": lower_copy_like, "flip": lower_flip,
    "pad": lower_pad, "concat": lower_concat, "gather": lower_gather, "take": lower_take,
    "embedding": lower_embedding, "scatter_add": lower_scatter, "index_add": lower_scatter,
    "index_put": lower_scatter, "slice_scatter": lower_scatter,
    "embedding_backward": lower_embedding_backward, "argmax": lower_arg, "argmin": lower_arg,
    "uniform": lower_random, "normal": lower_random, "dropout": lower_random,
    "bernoulli": lower_random, "randint": lower_randint, "randperm": lower_randperm,
}

__all__ = ["MOVEMENT_LOWERINGS"]
