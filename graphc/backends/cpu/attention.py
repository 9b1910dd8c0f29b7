"""attention: the blocked cpu kernels of `attention` and `attention_backward` (codegen's table).

Part of the top layer of the CPU code generator (codegen's `Lowerer` calls them). The ops
(graphc/ops/attention.py) come from the `fuse_attention` pass when the score matrix of one
(batch, head) is too big for the cache; these kernels never hold more than one block of it.

Forward, per batch entry (every leading dim: batch and head), per block of BLOCK_ROWS query
rows: an online softmax over blocks of BLOCK_KEYS keys (FlashAttention's). For each key block,
one BLAS GEMM writes the block's scores S = scale Q_i K_j^T into scratch; a row loop adds
the mask (or hides the keys past the diagonal: a causal kernel skips the key blocks wholly
past it), keeps each row's running maximum m and sum l, turns S into exp(S - m), and scales
the row of the output accumulator by exp(m_old - m); a second GEMM adds P V_j into the output
block. At the end each row is divided by l and lse = m + log(l) is written for the backward.

Backward, per batch entry (dK and dV zeroed), per query block i (dQ_i zeroed), over a panel
of the block's rows against every key (P and dP, BLOCK_ROWS x S each; a causal kernel stops
at the diagonal): per key block j, S = scale Q_i K_j^T (GEMM), P = exp(S + mask - lse_i) (0
where hidden), dV_j += P^T dO_i, dP = dO_i V_j^T; then per row D_i = rowsum(P_i * dP_i), the
softmax backward's own sum (FlashAttention-2's equal rowsum(dO_i * O_i) sums in another order:
a causal head's first dQ row, exactly 0 unfused, was rounding noise growing with the head
size), and dS = P * (dP - D_i) in place of dP; per key block j, dQ_i += scale dS K_j and
dK_j += scale dS^T Q_i: five GEMMs on blocks and two row loops.

The block products go to the process's BLAS (cblas_sgemm, as codegen's matmul), so the
kernels loop over batch entries and blocks on one thread: generated code never calls BLAS
inside its own parallel region (graphc.backends.cpu.threads), and products of a block's size
are too small for the BLAS to split. Operands whose rows are not contiguous (last stride not
1, or a row stride BLAS cannot take) are copied into scratch first. The exp and log are
mathlib's (graphc.backends.cpu.mathlib, via the scalar table), so the row loops vectorise.
Sizes must be known at compile time (a symbolic graph is compiled per size). Where one
block holds a whole head (T and S at most 64: GPT's context 64) both kernels hand their body
to graphc.backends.cpu.attention_small, whose products are small_gemm's generated kernels.
"""

from __future__ import annotations

import math

from llvmlite import ir

from graphc.backends.cpu import attention_small, mathlib, small_gemm
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import (
    F32,
    I32,
    I64,
    Loc,
    broadcast_strides,
    contiguous,
    for_range,
    i64,
    loop,
    unsupported,
)
from graphc.ir.graph import Node
from graphc.types import TensorType, float32

__all__ = ["BLOCK_KEYS", "BLOCK_ROWS", "attention", "attention_backward"]

BLOCK_ROWS = 128  # query rows per block
BLOCK_KEYS = 128  # keys per block: a 128 x 128 float32 score block is 64 KiB, in L2
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _elements(loc: Loc) -> tuple[int, ...]:
    return tuple(s // loc.type.dtype.itemsize for s in loc.strides)


def _blas_rows(lw, node: Node, loc: Loc) -> Loc:
    """`loc`, or a contiguous copy in scratch when BLAS cannot read its rows in place."""
    strides = _elements(loc)
    cols = loc.type.shape[-1]
    if strides[-1] == 1 and strides[-2] >= max(1, cols):
        return loc
    copy = lw.scratch_loc(TensorType(loc.type.shape, loc.type.dtype))
    lw.copy(loc, copy, f"{node.op}_pack")
    return copy


class _Kernel:
    """One attention kernel: its operands (base pointers), the BLAS sgemm, and the helpers
    that address rows of (batch entry, row) of each operand."""

    def __init__(self, lw, node: Node, name: str, locs: dict[str, Loc], batch: tuple,
                 scratch_floats: int) -> None:
        if lw.blas is None:
            raise unsupported(node, "attention without a BLAS (its block products are GEMMs)")
        self.lw, self.node, self.batch = lw, node, batch
        scratch = contiguous("arena", 0, lw.arena_end + lw.add_scratch(4 * scratch_floats),
                             TensorType((scratch_floats,), float32))
        self.kb = KernelBuilder(lw, lw.name(name), (1,))
        self.ids = {key: self.kb.operand(loc, (0,)) for key, loc in locs.items()}
        self.ids["scratch"] = self.kb.operand(scratch, (0,))
        self.strides = {key: _elements(loc) for key, loc in locs.items()}
        # the lead (batch) strides of each operand; the mask's broadcast over the scores
        self.lead = {key: strides[:len(batch)] for key, strides in self.strides.items()}
        scores = batch + (locs["q"].type.shape[-2], locs["k"].type.shape[-2])
        self.lead["mask"] = broadcast_strides(locs["mask"].type.shape, self.strides["mask"],
                                              scores)[:len(batch)]
        self.b = self.kb.begin()
        self.base = {key: self.kb.pointer(self.b, k, i64(0)) for key, k in self.ids.items()}
        int_t = I64 if lw.blas.ilp64 else I32
        self.int_t = int_t
        self.sgemm = lw.declare(lw.blas.symbol("float32", "gemm"), ir.FunctionType(
            ir.VoidType(), [I32, I32, I32, int_t, int_t, int_t, F32, ir.PointerType(),
                            int_t, ir.PointerType(), int_t, F32, ir.PointerType(), int_t]))

    def batch_offset(self, key: str, n) -> ir.Value:
        """The element offset of batch entry `n` (flat over `batch`) in operand `key`."""
        b, lead = self.b, self.lead[key]
        total, rest = i64(0), n
        for d in range(len(self.batch) - 1, -1, -1):
            if self.batch[d] == 1:
                continue
            coord = b.urem(rest, i64(self.batch[d])) if d else rest
            if lead[d]:
                total = b.add(total, b.mul(coord, i64(lead[d])))
            if d:
                rest = b.udiv(rest, i64(self.batch[d]))
        return total

    def row_stride(self, key: str) -> int:
        return self.strides[key][-2]

    def at(self, key: str, offset) -> ir.Value:
        """A float pointer `offset` elements past operand `key`'s base."""
        return self.b.gep(self.base[key], [offset], inbounds=True, source_etype=F32)

    def gemm(self, trans_a: int, trans_b: int, m, n, k, alpha: float, a, lda: int, b_, ldb,
             beta: float, c, ldc) -> None:
        def arg(x):
            x = i64(x) if isinstance(x, int) else x
            return x if self.int_t is I64 else self.b.trunc(x, I32)

        self.b.call(self.sgemm, [ir.Constant(I32, _ROW_MAJOR), ir.Constant(I32, trans_a),
                                 ir.Constant(I32, trans_b), arg(m), arg(n), arg(k),
                                 ir.Constant(F32, alpha), a, arg(lda), b_, arg(ldb),
                                 ir.Constant(F32, beta), c, arg(ldc)])

    def emit(self, op: str, x: ir.Value) -> ir.Value:
        return self.lw.scalars.emit(self.b, op, {}, [x], [float32], TensorType((), float32))

    def load(self, ptr, offset) -> ir.Value:
        return self.b.load(self.b.gep(ptr, [offset], inbounds=True, source_etype=F32), typ=F32)

    def store(self, ptr, offset, value) -> None:
        self.b.store(value, self.b.gep(ptr, [offset], inbounds=True, source_etype=F32))

    def finish(self) -> None:
        self.lw.calls.append(self.kb.finish(self.b))


def _vector_type() -> ir.VectorType:
    """The row loops' explicit vectors: one register of the host's float32 lanes (16 with
    AVX-512, 8 with AVX2; 4 where small_gemm finds neither)."""
    return ir.VectorType(F32, small_gemm.lanes() or 4)


def _vector_row(k: _Kernel, ptr, row, cols, start: ir.Constant, step, combine):
    """Fold `step(value, offset) -> value` over elements [row, row + cols) of `ptr` into an
    accumulator that starts at `start`, a vector of elements at a time in a vector (so a sum or max
    runs in vector registers: LLVM keeps float reductions in order, scalar, otherwise), then
    the tail one by one; `combine(x, y)` joins the lanes. Returns the scalar result."""
    b, vec = k.b, _vector_type()
    lanes = vec.count
    with b.goto_entry_block():
        vacc = b.alloca(vec, name="vacc")
        sacc = b.alloca(F32, name="sacc")
    b.store(ir.Constant(vec, [start.constant] * lanes), vacc)
    whole = b.udiv(cols, i64(lanes))
    with loop(b, 0, whole, "vec") as vi:
        at = b.add(row, b.mul(vi, i64(lanes)))
        b.store(step(b.load(vacc), at, True), vacc)
    acc = b.load(vacc)
    total = b.extract_element(acc, ir.Constant(I32, 0))
    for lane in range(1, lanes):
        total = combine(total, b.extract_element(acc, ir.Constant(I32, lane)))
    b.store(total, sacc)
    with loop(b, b.mul(whole, i64(lanes)), cols, "tail") as c:
        b.store(step(b.load(sacc), b.add(row, c), False), sacc)
    return b.load(sacc)


def _load_vec(b, ptr, at, vector: bool):
    v = b.load(b.gep(ptr, [at], inbounds=True, source_etype=F32),
               typ=_vector_type() if vector else F32)
    v.align = 4
    return v


def _store_vec(b, ptr, at, value) -> None:
    st = b.store(value, b.gep(ptr, [at], inbounds=True, source_etype=F32))
    st.align = 4


def _splat(b, x, vector: bool):
    if not vector:
        return x
    vec = _vector_type()
    v = b.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vec, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, vec.count), [0] * vec.count))


def _smin(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _mask_reader(k: _Kernel, mask_loc: Loc, scores: tuple):
    """value(b, mask base at batch entry, row i, column j) of the broadcast mask."""
    ms = broadcast_strides(mask_loc.type.shape, _elements(mask_loc), scores)
    si, sj = ms[-2], ms[-1]

    def read(b, base, i, j):
        offset = b.add(base, b.add(b.mul(i, i64(si)), b.mul(j, i64(sj))))
        return k.load(k.base["mask"], offset)

    return read, all(s == 0 for s in ms)


def _small_head(locs: dict, scores: tuple, e, ev, outputs: tuple) -> tuple | None:
    """((mask's row and key strides), whether it is all broadcast) where attention_small's
    one-block kernels take the head, else None."""
    mask = locs["mask"]
    ms = broadcast_strides(mask.type.shape, _elements(mask), scores)
    if locs["q"].type.dtype is not float32 or not attention_small.fits(
            scores[-2], scores[-1], e, ev, ms, [_elements(locs[x]) for x in outputs]):
        return None
    return (ms[-2], ms[-1]), all(s == 0 for s in ms)


def _zero_rows(k: _Kernel, key: str, base, first, count, width: int) -> None:
    """Rows [first, first + count) of operand `key` (at batch offset `base`) set to 0."""
    b, rs = k.b, k.row_stride(key)
    with loop(b, first, b.add(first, count), "zr") as r:
        row = b.add(base, b.mul(r, i64(rs)))
        with for_range(b, width, "zc") as c:
            k.store(k.base[key], b.add(row, c), ir.Constant(F32, 0.0))


def _scores(k: _Kernel, node: Node, block, rows, cols, i0, j0, qb, kb_, mask_base, read_mask,
            no_mask: bool, causal: bool, per_element, row_start=None,
            ld: int = BLOCK_KEYS) -> None:
    """S = scale Q_i K_j^T into `block` [rows x cols, rows `ld` floats apart], then per
    element per_element(b, row_value, offset in block, s) with s masked (-inf where hidden),
    row_value = row_start(b, row) (None without one)."""
    b = k.b
    e = k.node.inputs[0].type.shape[-1]
    scale = float(node.attrs["scale"])
    k.gemm(_NO_TRANS, _TRANS, rows, cols, e, scale,
           k.at("q", b.add(qb, b.mul(i0, i64(k.row_stride("q"))))), k.row_stride("q"),
           k.at("k", b.add(kb_, b.mul(j0, i64(k.row_stride("k"))))), k.row_stride("k"),
           0.0, block, ld)
    if per_element is None:  # the GEMM's scores as they are (no mask)
        return
    ninf = ir.Constant(F32, -math.inf)
    with loop(b, 0, rows, "sr") as r:
        i = b.add(i0, r)
        row_value = row_start(b, r) if row_start else None  # read once per row
        with loop(b, 0, cols, "sc") as c:
            j = b.add(j0, c)
            at = b.add(b.mul(r, i64(ld)), c)
            s = k.load(block, at)
            if not no_mask:
                s = b.fadd(s, read_mask(b, mask_base, i, j))
            if causal:
                s = b.select(b.icmp_signed(">", j, i), ninf, s)
            per_element(b, row_value, at, s)


def attention(lw, node: Node) -> None:
    q, key, v, mask = node.inputs
    out_v, lse_v = node.outputs
    locs = {"q": _blas_rows(lw, node, lw.locs[q]), "k": _blas_rows(lw, node, lw.locs[key]),
            "v": _blas_rows(lw, node, lw.locs[v]), "mask": lw.locs[mask],
            "o": lw.locs[out_v], "lse": lw.locs[lse_v]}
    batch = tuple(q.type.shape[:-2])
    length, e = q.type.shape[-2:]
    source, ev = v.type.shape[-2:]
    causal = bool(node.attrs["causal"])
    small = _small_head(locs, batch + (length, source), e, ev, ("o",))
    if small:  # one block holds the head: attention_small
        return attention_small.forward(lw, node, locs, batch, (length, source, e, ev), *small)
    k = _Kernel(lw, node, "attention", locs, batch, BLOCK_ROWS * BLOCK_KEYS + BLOCK_ROWS)
    b = k.b
    block = k.base["scratch"]
    sums = b.gep(block, [i64(BLOCK_ROWS * BLOCK_KEYS)], inbounds=True, source_etype=F32)
    read_mask, no_mask = _mask_reader(k, locs["mask"], batch + (length, source))
    zero, ninf = ir.Constant(F32, 0.0), ir.Constant(F32, -math.inf)
    ors, lrs = k.row_stride("o"), k.strides["lse"][-1]
    with for_range(b, max(1, math.prod(batch)), "n") as n:
        qb, kb_, vb = (k.batch_offset(x, n) for x in ("q", "k", "v"))
        ob, lb, mb = k.batch_offset("o", n), k.batch_offset("lse", n), k.batch_offset("mask", n)
        with loop(b, 0, -(-length // BLOCK_ROWS), "qi") as qi:
            i0 = b.mul(qi, i64(BLOCK_ROWS))
            rows = _smin(b, i64(BLOCK_ROWS), b.sub(i64(length), i0))
            kend = _smin(b, b.add(i0, rows), i64(source)) if causal else i64(source)
            _zero_rows(k, "o", ob, i0, rows, ev)
            with loop(b, 0, rows, "init") as r:
                k.store(k.base["lse"], b.add(lb, b.mul(b.add(i0, r), i64(lrs))), ninf)
                k.store(sums, r, zero)
            blocks = b.udiv(b.add(kend, i64(BLOCK_KEYS - 1)), i64(BLOCK_KEYS))
            with loop(b, 0, blocks, "kj") as kj:
                j0 = b.mul(kj, i64(BLOCK_KEYS))
                cols = _smin(b, i64(BLOCK_KEYS), b.sub(kend, j0))

                def keep(bb, row_value, at, s):  # masked scores back into the block
                    k.store(block, at, s)

                _scores(k, node, block, rows, cols, i0, j0, qb, kb_, mb, read_mask, no_mask,
                        causal, None if no_mask and not causal else keep)
                with loop(b, 0, rows, "row") as r:
                    lse_at = b.add(lb, b.mul(b.add(i0, r), i64(lrs)))
                    old = k.load(k.base["lse"], lse_at)
                    row = b.mul(r, i64(BLOCK_KEYS))

                    def bigger(acc, at, vector):
                        x = _load_vec(b, block, at, vector)
                        return b.select(b.fcmp_ordered(">", x, acc), x, acc)

                    def larger(x, y):
                        return b.select(b.fcmp_ordered(">", x, y), x, y)

                    new = _vector_row(k, block, row, cols, ninf, bigger, larger)
                    new = larger(new, old)
                    # a row hidden so far keeps m = -inf: subtract 0 so exp gives 0, not NaN
                    safe = b.select(b.fcmp_ordered("==", new, ninf), zero, new)

                    def exp_sum(acc, at, vector):
                        p = mathlib.emit(b, "exp", [b.fsub(_load_vec(b, block, at, vector),
                                                           _splat(b, safe, vector))])
                        _store_vec(b, block, at, p)
                        return b.fadd(acc, p)

                    total_new = _vector_row(k, block, row, cols, zero, exp_sum, b.fadd)
                    corr = k.emit("exp", b.fsub(old, safe))
                    k.store(sums, r, b.fadd(b.fmul(k.load(sums, r), corr), total_new))
                    k.store(k.base["lse"], lse_at, new)
                    orow = b.add(ob, b.mul(b.add(i0, r), i64(ors)))
                    with b.if_then(b.fcmp_ordered("!=", corr, ir.Constant(F32, 1.0))):
                        with for_range(b, ev, "rescale") as d:
                            at = b.add(orow, d)
                            k.store(k.base["o"], at, b.fmul(k.load(k.base["o"], at), corr))
                k.gemm(_NO_TRANS, _NO_TRANS, rows, ev, cols, 1.0, block, BLOCK_KEYS,
                       k.at("v", b.add(vb, b.mul(j0, i64(k.row_stride("v"))))),
                       k.row_stride("v"), 1.0, k.at("o", b.add(ob, b.mul(i0, i64(ors)))), ors)
            with loop(b, 0, rows, "end") as r:
                lse_at = b.add(lb, b.mul(b.add(i0, r), i64(lrs)))
                total_r = k.load(sums, r)
                inv = b.fdiv(ir.Constant(F32, 1.0), total_r)
                orow = b.add(ob, b.mul(b.add(i0, r), i64(ors)))
                with for_range(b, ev, "norm") as d:
                    at = b.add(orow, d)
                    k.store(k.base["o"], at, b.fmul(k.load(k.base["o"], at), inv))
                k.store(k.base["lse"], lse_at,
                        b.fadd(k.load(k.base["lse"], lse_at), k.emit("log", total_r)))
    k.finish()


def attention_backward(lw, node: Node) -> None:
    q, key, v, mask, out_v, lse_v, g_v = node.inputs
    dq_v, dk_v, dv_v = node.outputs
    locs = {"q": _blas_rows(lw, node, lw.locs[q]), "k": _blas_rows(lw, node, lw.locs[key]),
            "v": _blas_rows(lw, node, lw.locs[v]), "mask": lw.locs[mask],
            "o": _blas_rows(lw, node, lw.locs[out_v]), "lse": lw.locs[lse_v],
            "g": _blas_rows(lw, node, lw.locs[g_v]), "dq": lw.locs[dq_v],
            "dk": lw.locs[dk_v], "dv": lw.locs[dv_v]}
    batch = tuple(q.type.shape[:-2])
    length, e = q.type.shape[-2:]
    source, ev = v.type.shape[-2:]
    causal = bool(node.attrs["causal"])
    scale = float(node.attrs["scale"])
    small = _small_head(locs, batch + (length, source), e, ev, ("dq", "dk", "dv"))
    if small:  # one block holds the head: attention_small
        return attention_small.backward(lw, node, locs, batch, (length, source, e, ev), *small)
    # a panel of query rows against every key: P and dP (then dS), BLOCK_ROWS x source each
    k = _Kernel(lw, node, "attention_backward", locs, batch, 2 * BLOCK_ROWS * source)
    b = k.b
    p_panel = k.base["scratch"]
    ds_panel = b.gep(p_panel, [i64(BLOCK_ROWS * source)], inbounds=True, source_etype=F32)
    read_mask, no_mask = _mask_reader(k, locs["mask"], batch + (length, source))
    zero = ir.Constant(F32, 0.0)
    rs = {x: k.row_stride(x) for x in ("q", "k", "v", "o", "g", "dq", "dk", "dv")}
    lrs = k.strides["lse"][-1]
    with for_range(b, max(1, math.prod(batch)), "n") as n:
        base = {x: k.batch_offset(x, n) for x in rs}
        lb, mb = k.batch_offset("lse", n), k.batch_offset("mask", n)
        _zero_rows(k, "dk", base["dk"], i64(0), i64(source), e)
        _zero_rows(k, "dv", base["dv"], i64(0), i64(source), ev)
        with loop(b, 0, -(-length // BLOCK_ROWS), "qi") as qi:
            i0 = b.mul(qi, i64(BLOCK_ROWS))
            rows = _smin(b, i64(BLOCK_ROWS), b.sub(i64(length), i0))
            kend = _smin(b, b.add(i0, rows), i64(source)) if causal else i64(source)
            blocks = b.udiv(b.add(kend, i64(BLOCK_KEYS - 1)), i64(BLOCK_KEYS))
            g_i = k.at("g", b.add(base["g"], b.mul(i0, i64(rs["g"]))))
            _zero_rows(k, "dq", base["dq"], i0, rows, e)

            def row_lse(bb, r):
                return k.load(k.base["lse"], bb.add(lb, bb.mul(bb.add(i0, r), i64(lrs))))

            with loop(b, 0, blocks, "kj") as kj:  # P, dP = dO_i V_j^T and dV_j += P^T dO_i
                j0 = b.mul(kj, i64(BLOCK_KEYS))
                cols = _smin(b, i64(BLOCK_KEYS), b.sub(kend, j0))
                p_j = b.gep(p_panel, [j0], inbounds=True, source_etype=F32)

                def probability(bb, lse, at, s, p_j=p_j):  # P = exp(s - lse_i)
                    k.store(p_j, at, k.emit("exp", bb.fsub(s, lse)))

                _scores(k, node, p_j, rows, cols, i0, j0, base["q"], base["k"], mb,
                        read_mask, no_mask, causal, probability, row_lse, ld=source)
                k.gemm(_TRANS, _NO_TRANS, cols, ev, rows, 1.0, p_j, source, g_i, rs["g"],
                       1.0, k.at("dv", b.add(base["dv"], b.mul(j0, i64(rs["dv"])))),
                       rs["dv"])
                k.gemm(_NO_TRANS, _TRANS, rows, cols, ev, 1.0, g_i, rs["g"],
                       k.at("v", b.add(base["v"], b.mul(j0, i64(rs["v"])))), rs["v"], 0.0,
                       b.gep(ds_panel, [j0], inbounds=True, source_etype=F32), source)
            with loop(b, 0, rows, "dsr") as r:
                # D_i = rowsum(P_i * dP_i), the softmax backward's own sum (the unfused
                # chain's), not FlashAttention-2's equal rowsum(dO_i * O_i): that one sums in
                # another order, and where P_i is one key's 1 (a causal head's first row) it
                # left rounding noise in dQ's row instead of 0
                row = b.mul(r, i64(source))

                def p_dp(acc, at, vector):
                    return b.fadd(acc, b.fmul(_load_vec(b, p_panel, at, vector),
                                              _load_vec(b, ds_panel, at, vector)))

                d_i = _vector_row(k, p_panel, row, kend, zero, p_dp, b.fadd)
                with loop(b, 0, kend, "dsc") as c:  # dS = P * (dP - D_i) in place of dP
                    at = b.add(row, c)
                    ds = b.fmul(k.load(p_panel, at), b.fsub(k.load(ds_panel, at), d_i))
                    k.store(ds_panel, at, ds)
            with loop(b, 0, blocks, "kg") as kj:  # dQ_i += scale dS K_j, dK_j += scale dS^T Q_i
                j0 = b.mul(kj, i64(BLOCK_KEYS))
                cols = _smin(b, i64(BLOCK_KEYS), b.sub(kend, j0))
                ds_j = b.gep(ds_panel, [j0], inbounds=True, source_etype=F32)
                k.gemm(_NO_TRANS, _NO_TRANS, rows, e, cols, scale, ds_j, source,
                       k.at("k", b.add(base["k"], b.mul(j0, i64(rs["k"])))), rs["k"], 1.0,
                       k.at("dq", b.add(base["dq"], b.mul(i0, i64(rs["dq"])))), rs["dq"])
                k.gemm(_TRANS, _NO_TRANS, cols, e, rows, scale, ds_j, source,
                       k.at("q", b.add(base["q"], b.mul(i0, i64(rs["q"])))), rs["q"], 1.0,
                       k.at("dk", b.add(base["dk"], b.mul(j0, i64(rs["dk"])))), rs["dk"])
    k.finish()
