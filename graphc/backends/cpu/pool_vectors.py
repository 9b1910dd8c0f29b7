"""pool_vectors: max pooling's vector paths (called by graphc.backends.cpu.pool).

Each builds one plane's code, whole rows of outputs as vectors of up to 64 bytes of values
(`lanes`): a row of `width` outputs is covered by vectors starting at 0, lanes, 2*lanes, ...
and, where `width` is not a multiple of lanes, one more ending at the row's end (it
overlaps the one before: those outputs are computed twice, the same way, so no store is
masked and none runs past the row). LeNet-5's pools, [64, 6, 28, 28] and [64, 16, 10, 10]
by 2x2 windows, ran 2.5-3x slower as one scalar select chain per output (the forward) and a
zeroing pass plus a scatter per gradient element (the gradient).

- `max_pool_rows` (the forward; `forward_fits` says where): windows all inside the plane,
  dilation 1, at most `stride` taps along a row, rows read contiguously and wo*sw <= w. Per
  kernel row one contiguous load of lanes*sw inputs; each tap's lanes are a shuffle of it
  (the even and odd columns at stride 2). The taps are compared in the scalar path's order
  (row-major; the first maximum wins, a NaN wins: the last NaN), so values and indices are
  the same bits.
- `max_pool_grad_rows` (the gradient; `grad_fits`): where H and W are multiples of the
  pooled sizes, the plane is cut into blocks (H/Ho) x (W/Wo), one per output; a window
  whose index lies in its own block (every max_pool2d with stride == kernel) gives its
  gradient to that one position and 0 to the rest of the block: each input position is a
  gather, the select of its block's gradient where the index matches, written once (no
  zeroing pass, no read-modify-write). The plane's matches are counted; fewer than Ho*Wo
  means some index lies outside its block, and the caller redoes that plane by the scatter.
  The gradient is written as 0.0 + g, the scatter-add's rounding (a -0.0 becomes +0.0).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu.conv_few_channels import splat
from graphc.backends.cpu.image_kernels import iadd, imul
from graphc.backends.cpu.values import I32, I64, MEM, i64, loop

__all__ = ["ENABLED", "forward_fits", "grad_fits", "lanes", "max_pool_grad_rows", "max_pool_rows",
           "starts"]

VECTOR_BYTES = 64  # one AVX-512 register of values
ENABLED = True  # off: the scalar paths (benchmarks.pool_kernels' "before")


def lanes(dt, width: int) -> int:
    """Outputs a vector holds: the largest power of two at most `width` and 64 bytes."""
    most = min(width, VECTOR_BYTES // dt.itemsize)
    n = 1
    while n * 2 <= most:
        n *= 2
    return n


def starts(width: int, n: int) -> list[int]:
    """The first output of each vector of `n` covering a row of `width` (see the docstring)."""
    out = list(range(0, width - n + 1, n))
    return out + [width - n] if width % n else out


def forward_fits(full: bool, in_hw, out_hw, attrs: dict, column_strides) -> bool:
    """Whether `max_pool_rows` serves a max_pool2d (`full`: every tap of every window is
    inside the plane; `column_strides`: of the input, the values and the indices)."""
    (kw, sw), dw = (attrs["kernel_size"][1], attrs["stride"][1]), attrs["dilation"]
    return full and dw == (1, 1) and kw <= sw and out_hw[1] * sw <= in_hw[1] and \
        all(s == 1 for s in column_strides)


def grad_fits(dt, in_hw, out_hw, column_strides) -> bool:
    """Whether `max_pool_grad_rows` serves a max_pool2d_grad (`column_strides`: of the
    gradient and the indices)."""
    return dt.is_floating and min(out_hw) >= 1 and in_hw[0] % out_hw[0] == 0 and \
        in_hw[1] % out_hw[1] == 0 and all(s == 1 for s in column_strides)


def _vector(dt, count: int) -> ir.VectorType:
    return ir.VectorType(MEM[dt.name], count)


def _positions(count: int, step: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I64, count), [k * step for k in range(count)])


def _shuffle(b, v, picks: list[int]):
    mask = ir.Constant(ir.VectorType(I32, len(picks)), picks)
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _load(b, kb, k: int, offset, vec, align: int):
    return b.load(kb.pointer(b, k, offset), typ=vec, align=align)


def max_pool_rows(b, kb, dt, operands, offsets, row_strides, in_w: int, out_hw, attrs,
                  better) -> None:
    """Values and indices of one plane's outputs (see the docstring). operands, offsets,
    row_strides: (input, values, indices) ids, plane offsets and row strides in elements;
    better(b, v, m): the lanes where tap v replaces the maximum m so far."""
    xi, vi, ii = operands
    xo, vo, io = offsets
    xsh, vsh, ish = row_strides
    (kh, kw), (sh, sw) = attrs["kernel_size"], attrs["stride"]
    n = lanes(dt, out_hw[1])
    steps = _positions(n, sw)
    with loop(b, 0, out_hw[0], "oh") as oh:
        for start in starts(out_hw[1], n):
            m = at = None
            for i in range(kh):
                ih = iadd(b, imul(b, oh, sh), i)
                span = _load(b, kb, xi, iadd(b, xo, imul(b, ih, xsh), start * sw),
                             _vector(dt, n * sw), dt.itemsize)
                for j in range(kw):
                    v = span if sw == 1 else _shuffle(b, span, [k * sw + j for k in range(n)])
                    flat = b.add(splat(b, iadd(b, imul(b, ih, in_w), start * sw + j),
                                       steps.type), steps)
                    if m is None:
                        m, at = v, flat
                    else:
                        up = better(b, v, m)
                        m, at = b.select(up, v, m), b.select(up, flat, at)
            b.store(m, kb.pointer(b, vi, iadd(b, vo, imul(b, oh, vsh), start)),
                    align=dt.itemsize)
            b.store(at, kb.pointer(b, ii, iadd(b, io, imul(b, oh, ish), start)), align=8)


def max_pool_grad_rows(b, kb, dt, operands, offsets, row_strides, in_hw, out_hw):
    """One plane of the input gradient by gathers (see the docstring); returns the count of
    matched windows (an i64). operands, offsets: the gradient's, the indices' and the
    output's ids and plane offsets; row_strides: the gradient's and the indices' (the
    output is a contiguous plane)."""
    gi, ii, oi = operands
    go, io, oo = offsets
    gsh, ish = row_strides
    (h, w), (ho, wo) = in_hw, out_hw
    bh, bw = h // ho, w // wo
    n = lanes(dt, wo)
    wide = n * bw  # input columns of a vector of n outputs
    spread = [k // bw for k in range(wide)]
    columns = _positions(wide, 1)
    zeros = ir.Constant(_vector(dt, wide), [0.0] * wide)
    with b.goto_entry_block():
        matched = b.alloca(I64, name="matched")
    b.store(i64(0), matched)
    row_starts = starts(wo, n)
    with loop(b, 0, ho, "oh") as oh:
        covered = 0  # outputs of the row counted by the vectors before
        for start in row_starts:
            gv = _load(b, kb, gi, iadd(b, go, imul(b, oh, gsh), start), _vector(dt, n),
                       dt.itemsize)
            kv = _load(b, kb, ii, iadd(b, io, imul(b, oh, ish), start),
                       ir.VectorType(I64, n), 8)
            grad = b.fadd(zeros, _shuffle(b, gv, spread))
            where = _shuffle(b, kv, spread)
            new = ir.Constant(ir.VectorType(ir.IntType(1), wide),
                              [start + k // bw >= covered for k in range(wide)])
            covered = start + n
            for r in range(bh):
                ih = iadd(b, imul(b, oh, bh), r)
                first = iadd(b, imul(b, ih, w), start * bw)
                hit = b.icmp_signed("==", where, b.add(splat(b, first, columns.type), columns))
                b.store(b.select(hit, grad, zeros), kb.pointer(b, oi, iadd(b, oo, first)),
                        align=dt.itemsize)
                bits = b.bitcast(b.and_(hit, new), ir.IntType(wide))
                count = b.zext(b.ctpop(bits), I64)
                b.store(b.add(b.load(matched), count), matched)
    return b.load(matched)
