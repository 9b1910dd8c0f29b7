"""attention_small: `attention` and `attention_backward` where one block holds a whole head.

graphc.backends.cpu.attention's kernels walk blocks of 128 query rows and 128 keys with an
online softmax, their products in the BLAS. Where every query row and key of a (batch,
head) fit one block of at most SMALL_MAX x SMALL_MAX (GPT's context 64: 64 x 64 scores, 16
KB) that machinery is overhead: OpenBLAS packs each 64 x 64 x 32 operand on every call (its
"NT" path ~3.5 us a head where the generated kernel takes ~1.8) and the row loops run one
element at a time. Here, per (batch, head), everything in L1:

- forward: S = Q K^T (small_gemm's kernel, K read transposed and copied panel by panel onto
  its stack); then, a group of `lanes` rows at a time, three passes over its rows in vectors
  of the host's lanes: s * scale + mask (-inf past the diagonal for a causal kernel) and
  its maximum m; p = exp(s - m) and l = sum p; P = p * (1 / l) back into the block; lse = m +
  log l; then O = P V (generated, O's rows in place). A group's row maxima and sums are
  reduced together (`_Rows.reduce_group`: the same sums as one row's halves folded, in one
  vector for lanes rows: the rows' shuffles interleave instead of one row's chain waiting);
- backward: S = Q K^T; dP = dO V^T; P recomputed from S and lse in the pass that sums
  D_i = rowsum(P_i * dP_i) (the softmax backward's sum, as the unfused chain: the blocked
  kernel's equal rowsum(dO_i * O_i) sums in another order, and where a row sees one key, a
  causal head's first, its dQ row was rounding noise instead of 0; reduced a group at a
  time); dS = scale * P * (dP - D_i); dV = P^T dO; dQ = dS K; dK = dS^T Q: five generated
  products, each written straight into its output (one block: nothing to accumulate,
  nothing to zero).

A causal head skips what lies past the diagonal: rows in [q * lanes, (q + 1) * lanes) work
on their first q + 1 vectors of keys (zeros stored for the rest, no exp of hidden scores),
and the products whose a is P or dS (or a transpose) sum in each row block only the k its
rows see (small_gemm's `triangle`, TRIANGLES): the terms skipped are exact zeros times b.
Their tiles are CAUSAL_TILE_ROWS rows, so that tiles straddle the diagonal less.

The loop over (batch, head) is a KernelBuilder nest the cores share (each head's scratch
blocks on its thread's stack); a head's code is the same on any number of threads.

`fits(...)` says where it applies: float32, a host with generated kernels (small_gemm.lanes),
T and S from `lanes` to SMALL_MAX and the key count and both head sizes whole vectors,
every output's rows contiguous, a mask read along keys contiguously or broadcast.

Rounding: every product sums its k in order in registers (small_gemm: one block of k);
the exps are mathlib's `exp_flushed` (exp's bits, +0 for scores more than 87 below the
row's maximum or logsumexp, where exp's results are under 2^-125.5);
P is normalised before P V (the unfused chain's order), where the blocked kernel divides
O by l after; scale multiplies dS before dQ and dK, where the blocked kernel passes it to
the BLAS as alpha. Judged by distance from a float64 run (tests/test_attention_small.py).
"""

from __future__ import annotations

import math

from llvmlite import ir

from graphc.backends.cpu import mathlib, small_gemm
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.small_gemm import SmallGemm
from graphc.backends.cpu.values import (
    F32,
    I32,
    I64,
    PTR,
    broadcast_strides,
    collapse,
    i64,
    loop,
)
from graphc.types import TensorType, float32

__all__ = ["SMALL_MAX", "backward", "fits", "forward", "scratch_floats"]

SMALL_MAX = 64  # query rows and keys of one head at most (scores of 16 KB)
TRIANGLES = True  # a causal head's products skip the zeros past the diagonal
# a causal head's products in tiles of this many rows, which split each block of 16 rows
# the diagonal steps by evenly, so fewer rows straddle it (0: small_gemm.tile_rows' choice,
# 11 rows for 64)
CAUSAL_TILE_ROWS = 8


def fits(length, source, e: int, ev: int, mask_strides: tuple, out_strides: list) -> bool:
    """Whether one block holds the head and the generated kernels take its products."""
    width = small_gemm.lanes()
    sizes = (length, source, e, ev)
    return bool(width) and all(type(d) is int for d in sizes) \
        and width <= length <= SMALL_MAX and width <= source <= SMALL_MAX \
        and source % width == 0 and e % width == 0 and ev % width == 0 \
        and mask_strides[-1] in (0, 1) and all(s[-1] == 1 for s in out_strides)


def scratch_floats(length: int, source: int) -> int:
    """Scratch of a kernel: the backward's two blocks (P and dS), or the forward's one and
    each row's maximum and sum (within the same floats); then a group's vectors to reduce
    and its results (`_group_scratch`)."""
    lanes = small_gemm.lanes() or 16
    return 2 * length * source + lanes * lanes + lanes


def forward(lw, node, locs: dict, batch: tuple, shape: tuple, mask_si_sj: tuple,
            no_mask: bool) -> None:
    """Appends the `attention` kernel to the Lowerer `lw`'s calls: `locs` its operands (q,
    k, v, mask, o, lse; q, k, v rows contiguous), `batch` the leading dims, `shape` (T, S,
    E, Ev), the mask's (row, key) strides and whether it is all broadcast (`no_mask`)."""
    _build(lw, node, "attention", locs, batch, shape, mask_si_sj, no_mask, _forward_head)


def backward(lw, node, locs: dict, batch: tuple, shape: tuple, mask_si_sj: tuple,
             no_mask: bool) -> None:
    """Appends the `attention_backward` kernel (`locs` also o, lse, g and dq, dk, dv)."""
    _build(lw, node, "attention_backward", locs, batch, shape, mask_si_sj, no_mask,
           _backward_head)


def _build(lw, node, name: str, locs: dict, batch: tuple, shape: tuple, mask_si_sj: tuple,
           no_mask: bool, head_code) -> None:
    """One kernel whose loop over (batch, head) the cores share (KernelBuilder's parallel
    nest), each iteration one head with its scratch blocks on the stack."""
    length, source, e, ev = shape
    domain = batch or (1,)
    kb = KernelBuilder(lw, lw.name(name), domain)
    scores = domain + (length, source) if batch else (length, source)
    ids, strides = {}, {}
    for key, loc in locs.items():
        strides[key] = tuple(st // loc.type.dtype.itemsize for st in loc.strides)
        lead = broadcast_strides(loc.type.shape, strides[key], scores)[:len(batch)] \
            if key == "mask" else strides[key][:len(batch)]
        ids[key] = kb.operand(loc, lead if batch else (0,))
    bld = kb.begin(parallel=True, work=math.prod(domain) * length * source * (e + ev))
    floats = scratch_floats(length, source)

    def leaf(bb, offsets) -> None:
        with bb.goto_entry_block():
            stack = bb.alloca(F32, size=i64(floats), name="blocks")
            stack.align = 64
        base = {key: kb.pointer(bb, i, offsets[i]) for key, i in ids.items()}
        # llvmlite's alloca gives a typed float*: as an opaque pointer, as small_gemm does
        base["scratch"] = bb.inttoptr(bb.ptrtoint(stack, I64), PTR)
        head_code(_Head(lw, bb, base, strides), node, shape, mask_si_sj, no_mask)

    kb.nest(bld, *collapse(domain, [x.strides for x in kb.operands]), leaf)
    lw.calls.append(kb.finish(bld))


class _Head:
    """One (batch, head) in the kernel's loop: its operands' pointers (`base`, and its
    scratch), their element strides, the builder."""

    def __init__(self, lw, b: ir.IRBuilder, base: dict, strides: dict) -> None:
        self.lw, self.b, self.base, self.strides = lw, b, base, strides

    def row_stride(self, key: str) -> int:
        return self.strides[key][-2]

    def at(self, key: str, offset) -> ir.Value:
        return self.b.gep(self.base[key], [offset], inbounds=True, source_etype=F32)

    def load(self, ptr, offset) -> ir.Value:
        return self.b.load(self.b.gep(ptr, [offset], inbounds=True, source_etype=F32), typ=F32)

    def store(self, ptr, offset, value) -> None:
        self.b.store(value, self.b.gep(ptr, [offset], inbounds=True, source_etype=F32))

    def emit(self, op: str, x: ir.Value) -> ir.Value:
        return self.lw.scalars.emit(self.b, op, {}, [x], [float32], TensorType((), float32))


def _product(lw, m: int, n: int, depth: int, sa_row: int, sa_col: int, ldb: int = 0,
             ldb_t: int = 0, ldc: int = 0, triangle: str = "", lower_c: bool = False):
    """The generated kernel void(a, b, c) for c[m, n] (rows ldc apart) = a[m, depth] @
    b[depth, n], a's element strides (sa_row, sa_col), b's rows ldb apart or b read
    transposed (`ldb_t`); `triangle`: a causal head's P or dS ("lower") or its transpose
    ("upper"), whose zeros past the diagonal each row block skips; `lower_c`: a causal
    head's scores or dP, of which the row passes read no vector past a row's diagonal one."""
    width = small_gemm.lanes()
    vectors = 2 if (n // width) % 2 == 0 else 1
    rows = small_gemm.tile_rows(m, vectors, width)
    if CAUSAL_TILE_ROWS and TRIANGLES and (triangle or lower_c):
        rows = min(rows, CAUSAL_TILE_ROWS)
    g = SmallGemm(m, n, depth, sa_row, sa_col, ldb, rows, vectors, width, ldb_t=ldb_t,
                  ldc=0 if ldc == n else ldc, triangle=triangle if TRIANGLES else "",
                  lower_c=lower_c and TRIANGLES)
    return small_gemm.function(lw, g)


class _Rows:
    """The row passes' vectors: the host's lanes, the key index of each lane."""

    def __init__(self, k, source: int) -> None:
        self.k, self.b = k, k.b
        self.lanes = small_gemm.lanes()
        self.vec = ir.VectorType(F32, self.lanes)
        self.count = source // self.lanes
        self.lane_index = ir.Constant(ir.VectorType(ir.IntType(64), self.lanes),
                                      list(range(self.lanes)))

    def splat(self, x):
        b = self.b
        v = b.insert_element(ir.Constant(self.vec, ir.Undefined), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, ir.Constant(self.vec, ir.Undefined),
                                ir.Constant(ir.VectorType(I32, self.lanes), [0] * self.lanes))

    def load(self, ptr, at):
        return self.b.load(self.b.gep(ptr, [at], inbounds=True, source_etype=F32),
                           typ=self.vec, align=4)

    def store(self, ptr, at, value) -> None:
        self.b.store(value, self.b.gep(ptr, [at], inbounds=True, source_etype=F32), align=4)

    def fold(self, values: list, combine):
        """A row's vectors combined into one, vector by vector in order."""
        acc = values[0]
        for v in values[1:]:
            acc = combine(acc, v)
        return acc

    def reduce_group(self, vectors, count: int, combine):
        """One vector whose lane j is row j's reduction, from the group's `count` rows'
        folded vectors (at `vectors`, `lanes` floats apart): each row's vector's halves
        folded onto each other (lane i with lane i + half, half = lanes / 2 down to 1: the
        sums that folding one row's vector alone makes, in the same order), two rows at a
        time in one vector. One row at a time took log2(lanes) dependent shuffles and
        combines (16 rows: 64 of each); a group takes 2 (lanes - 1) shuffles and lanes - 1
        combines, which interleave."""
        b, lanes = self.b, self.lanes
        loaded = [self.load(vectors, i64(j * lanes)) for j in range(count)]
        # rows past `count` repeat the first: their lanes of the result are not read
        parts = [(v, [j]) for j, v in enumerate(loaded + loaded[:1] * (lanes - count))]
        half = lanes // 2
        while len(parts) > 1:
            joined = []
            for (x, x_rows), (y, y_rows) in zip(parts[0::2], parts[1::2]):
                low, high, rows = [], [], []
                for seg in range(len(x_rows)):  # each row's segment of 2 * half lanes
                    for first, row in ((seg * 2 * half, x_rows[seg]),
                                       (lanes + seg * 2 * half, y_rows[seg])):
                        low += range(first, first + half)
                        high += range(first + half, first + 2 * half)
                        rows.append(row)
                pick = ir.VectorType(I32, lanes)
                joined.append((combine(b.shuffle_vector(x, y, ir.Constant(pick, low)),
                                       b.shuffle_vector(x, y, ir.Constant(pick, high))), rows))
            parts, half = joined, half // 2
        reduced, rows = parts[0]
        order = [rows.index(j) for j in range(lanes)]
        return b.shuffle_vector(reduced, reduced, ir.Constant(ir.VectorType(I32, lanes), order))

    def groups(self, length: int, causal: bool, group_code) -> None:
        """group_code(r0, count, live) for each group of `count` (at most lanes) rows from
        row r0 (an i64), whose first `live` vectors of keys hold all they see: a causal
        group is a block of lanes rows, [q * lanes, (q + 1) * lanes), seeing q + 1 vectors."""
        if not causal:
            whole = length // self.lanes
            if whole:
                with loop(self.b, 0, whole, "group") as g:
                    group_code(self.b.mul(g, i64(self.lanes)), self.lanes, self.count)
            if length % self.lanes:
                group_code(i64(whole * self.lanes), length % self.lanes, self.count)
            return
        for q in range(-(-length // self.lanes)):
            group_code(i64(q * self.lanes), min(self.lanes, length - q * self.lanes),
                       min(self.count, q + 1))

    def each_row(self, r0, count: int, row_code) -> None:
        """row_code(r, j) for the group's rows r = r0 + j, j < count."""
        with loop(self.b, 0, count, "row") as j:
            row_code(self.b.add(r0, j), j)

    def put(self, ptr, r0, count: int, value) -> None:
        """The group's `count` lanes of `value` stored at ptr[r0:r0 + count]."""
        if count == self.lanes:
            self.store(ptr, r0, value)
            return
        for j in range(count):
            self.b.store(self.b.extract_element(value, ir.Constant(I32, j)),
                         self.b.gep(ptr, [self.b.add(r0, i64(j))], inbounds=True,
                                    source_etype=F32))

    def zeros(self, block, r, live: int) -> None:
        """The hidden vectors of row r (from `live` on) set to 0."""
        row = self.b.mul(r, i64(self.count * self.lanes))
        zero = ir.Constant(self.vec, [0.0] * self.lanes)
        for c in range(live, self.count):
            self.store(block, self.b.add(row, i64(c * self.lanes)), zero)

    def scores(self, block, r, mask_row, mask_sj: int, no_mask: bool, causal: bool,
               scale: float, live: int) -> list:
        """Row r of the block (its keys contiguous) as s * scale + mask, -inf where hidden:
        its first `live` vectors."""
        b, k = self.b, self.k
        row = b.mul(r, i64(self.count * self.lanes))
        scale_v = ir.Constant(self.vec, [scale] * self.lanes)
        ninf = ir.Constant(self.vec, [-math.inf] * self.lanes)
        out = []
        for c in range(live):
            s = b.fmul(self.load(block, b.add(row, i64(c * self.lanes))), scale_v)
            if not no_mask:
                if mask_sj:
                    m = self.load(k.base["mask"], b.add(mask_row, i64(c * self.lanes)))
                else:
                    m = self.splat(k.load(k.base["mask"], mask_row))
                s = b.fadd(s, m)
            if causal and c == live - 1:  # the vectors before it lie left of the diagonal
                keys = b.add(self.lane_index, ir.Constant(self.lane_index.type,
                                                          [c * self.lanes] * self.lanes))
                hidden = b.icmp_signed(">", keys, _splat_i64(b, r, self.lanes))
                s = b.select(hidden, ninf, s)
            out.append(s)
        return out


def _splat_i64(b, x, lanes: int):
    vec = ir.VectorType(ir.IntType(64), lanes)
    v = b.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vec, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def _group_scratch(k, length: int, source: int) -> tuple:
    """(a group's vectors to reduce: lanes x lanes floats, its results: lanes floats) in the
    head's scratch after the two blocks."""
    b, lanes = k.b, small_gemm.lanes()
    vectors = b.gep(k.base["scratch"], [i64(2 * length * source)], inbounds=True,
                    source_etype=F32)
    return vectors, b.gep(vectors, [i64(lanes * lanes)], inbounds=True, source_etype=F32)


def _larger(b):
    def larger(x, y):
        return b.select(b.fcmp_ordered(">", x, y), x, y)
    return larger


def _forward_head(k, node, shape: tuple, mask_si_sj: tuple, no_mask: bool) -> None:
    """The forward of one (batch, head) (`k`: its _Head)."""
    b, lw = k.b, k.lw
    length, source, e, ev = shape
    causal = bool(node.attrs["causal"])
    scale = float(node.attrs["scale"])
    rows = _Rows(k, source)
    block = k.base["scratch"]
    maxima = b.gep(block, [i64(length * source)], inbounds=True, source_etype=F32)
    sums = b.gep(maxima, [i64(length)], inbounds=True, source_etype=F32)
    si, sj = mask_si_sj
    ors, lrs = k.row_stride("o"), k.strides["lse"][-1]
    scores = _product(lw, length, source, e, k.row_stride("q"), 1, ldb_t=k.row_stride("k"),
                      lower_c=causal)
    lower = "lower" if causal else ""
    values = _product(lw, length, ev, source, source, 1, ldb=k.row_stride("v"), ldc=ors,
                      triangle=lower)
    larger = _larger(b)
    qb = kb_ = vb = ob = lb = mb = i64(0)  # the head's own pointers (k.base)
    b.call(scores, [k.at("q", qb), k.at("k", kb_), block])
    vectors, results = _group_scratch(k, length, source)
    ninf_v = ir.Constant(rows.vec, [-math.inf] * rows.lanes)
    zero_v = ir.Constant(rows.vec, [0.0] * rows.lanes)
    one_v = ir.Constant(rows.vec, [1.0] * rows.lanes)

    def softmax_group(r0, count: int, live: int) -> None:
        # s * scale + mask back into the block, each row's maxima vector to reduce
        def scores_row(r, j) -> None:
            s = rows.scores(block, r, b.add(mb, b.mul(r, i64(si))), sj, no_mask, causal,
                            scale, live)
            row = b.mul(r, i64(source))
            for c, x in enumerate(s):
                rows.store(block, b.add(row, i64(c * rows.lanes)), x)
            rows.store(vectors, b.mul(j, i64(rows.lanes)), rows.fold(s, larger))

        rows.each_row(r0, count, scores_row)
        m = rows.reduce_group(vectors, count, larger)
        rows.put(maxima, r0, count, m)
        # a row hidden throughout keeps m = -inf: subtract 0 so exp gives 0, not NaN
        rows.store(results, i64(0), b.select(b.fcmp_ordered("==", m, ninf_v), zero_v, m))

        def exp_row(r, j) -> None:  # p = exp(s - m), each row's sum vector to reduce
            safe = rows.splat(k.load(results, j))
            row = b.mul(r, i64(source))
            p = []
            for c in range(live):
                at = b.add(row, i64(c * rows.lanes))
                p.append(mathlib.exp_flushed(b, b.fsub(rows.load(block, at), safe)))
                rows.store(block, at, p[-1])
            rows.store(vectors, b.mul(j, i64(rows.lanes)), rows.fold(p, b.fadd))

        rows.each_row(r0, count, exp_row)
        total = rows.reduce_group(vectors, count, b.fadd)
        rows.put(sums, r0, count, total)
        rows.store(results, i64(0), b.fdiv(one_v, total))

        def normalise_row(r, j) -> None:  # P = p * (1 / l)
            inv = rows.splat(k.load(results, j))
            row = b.mul(r, i64(source))
            for c in range(live):
                at = b.add(row, i64(c * rows.lanes))
                rows.store(block, at, b.fmul(rows.load(block, at), inv))
            rows.zeros(block, r, live)

        rows.each_row(r0, count, normalise_row)

    rows.groups(length, causal, softmax_group)
    # lse = m + log l, a vector of rows at a time (a scalar log a row cost ~1 us a head)
    for r0 in range(0, length, rows.lanes):
        if r0 + rows.lanes <= length:
            lse = b.fadd(rows.load(maxima, i64(r0)),
                         mathlib.emit(b, "log", [rows.load(sums, i64(r0))]))
            values_of = [b.extract_element(lse, ir.Constant(I32, j))
                         for j in range(rows.lanes)]
        else:  # the last rows, one by one
            values_of = [b.fadd(k.load(maxima, i64(r)), k.emit("log", k.load(sums, i64(r))))
                         for r in range(r0, length)]
        for j, value in enumerate(values_of):
            k.store(k.base["lse"], b.add(lb, i64((r0 + j) * lrs)), value)
    b.call(values, [block, k.at("v", vb), k.at("o", ob)])


def _backward_head(k, node, shape: tuple, mask_si_sj: tuple, no_mask: bool) -> None:
    """The backward of one (batch, head) (`k`: its _Head)."""
    b, lw = k.b, k.lw
    length, source, e, ev = shape
    causal = bool(node.attrs["causal"])
    scale = float(node.attrs["scale"])
    rows = _Rows(k, source)
    p_block = k.base["scratch"]
    ds_block = b.gep(p_block, [i64(length * source)], inbounds=True, source_etype=F32)
    si, sj = mask_si_sj
    rs = {x: k.row_stride(x) for x in ("q", "k", "v", "o", "g", "dq", "dk", "dv")}
    lrs = k.strides["lse"][-1]
    scores = _product(lw, length, source, e, rs["q"], 1, ldb_t=rs["k"], lower_c=causal)
    lower, upper = ("lower", "upper") if causal else ("", "")
    grad_v = _product(lw, source, ev, length, 1, source, ldb=rs["g"], ldc=rs["dv"],
                      triangle=upper)
    grad_p = _product(lw, length, source, ev, rs["g"], 1, ldb_t=rs["v"], lower_c=causal)
    grad_q = _product(lw, length, e, source, source, 1, ldb=rs["k"], ldc=rs["dq"],
                      triangle=lower)
    grad_k = _product(lw, source, e, length, 1, source, ldb=rs["q"], ldc=rs["dk"],
                      triangle=upper)
    base = {x: i64(0) for x in rs}  # the head's own pointers (k.base)
    lb = mb = i64(0)
    b.call(scores, [k.at("q", base["q"]), k.at("k", base["k"]), p_block])
    b.call(grad_p, [k.at("g", base["g"]), k.at("v", base["v"]), ds_block])
    scale_v = ir.Constant(rows.vec, [scale] * rows.lanes)
    vectors, results = _group_scratch(k, length, source)

    def gradient_group(r0, count: int, live: int) -> None:
        def ats(r) -> list:
            row = b.mul(r, i64(source))
            return [b.add(row, i64(c * rows.lanes)) for c in range(live)]

        # P = exp(s - lse_i) into its block, and D_i = rowsum(P_i * dP_i), the softmax
        # backward's own sum (the unfused chain's): where P_i is one key's 1 (a causal
        # head's first row), dP - D_i is exactly 0; the equal rowsum(dO_i * O_i) sums in
        # another order and leaves rounding there
        def products_row(r, j) -> None:
            s = rows.scores(p_block, r, b.add(mb, b.mul(r, i64(si))), sj, no_mask, causal,
                            scale, live)
            lse = rows.splat(k.load(k.base["lse"], b.add(lb, b.mul(r, i64(lrs)))))
            terms = []
            for at, x in zip(ats(r), s):
                p = mathlib.exp_flushed(b, b.fsub(x, lse))
                rows.store(p_block, at, p)
                terms.append(b.fmul(p, rows.load(ds_block, at)))
            rows.zeros(p_block, r, live)
            rows.store(vectors, b.mul(j, i64(rows.lanes)), rows.fold(terms, b.fadd))

        rows.each_row(r0, count, products_row)
        rows.store(results, i64(0), rows.reduce_group(vectors, count, b.fadd))

        def gradient_row(r, j) -> None:
            d_i = rows.splat(k.load(results, j))
            for at in ats(r):
                p, dp = rows.load(p_block, at), rows.load(ds_block, at)
                rows.store(ds_block, at, b.fmul(b.fmul(p, b.fsub(dp, d_i)), scale_v))
            rows.zeros(ds_block, r, live)  # P is 0 there

        rows.each_row(r0, count, gradient_row)  # dS = scale * P * (dP - D_i)

    rows.groups(length, causal, gradient_group)
    b.call(grad_v, [p_block, k.at("g", base["g"]), k.at("dv", base["dv"])])
    b.call(grad_q, [ds_block, k.at("k", base["k"]), k.at("dq", base["dq"])])
    b.call(grad_k, [ds_block, k.at("q", base["q"]), k.at("dk", base["dk"])])
