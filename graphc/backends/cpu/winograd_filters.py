"""winograd_filters: the Winograd kernels' transforms of whole filters (graphc.backends.cpu.
conv_winograd), U = G f G^T before the GEMMs and, for the weight gradient, gw = G^T dU G
after them (conv_winograd.weight_out).

- `filter_transform`: U = G f G^T of every filter (the input gradient's flipped one, and
  U stored transposed where conv_winograd asks);
- `filters_by_vectors`: the walk over a range of filters (o, c) both use: float32 filters
  FILTER_LANES a vector, each filter's 9 taps one load (`filter_taps`) or store
  (`store_filter_taps`), transposed in registers (values.square_transposed), the rest one
  by one; `in_squares` the transposing walk one by one;
- `filter_at`: a filter's element in a transform-domain matrix, as laid out or transposed.

A vector of filters runs the same operations in the same order per filter as one filter
(winograd_transforms.sandwich on vectors): the same bits either way.

A U of STREAMED_U_BYTES or more (ResNet-18's 512 x 512 channels: 16.8 MB written from 9.4 MB
of filters, memory-bound) is stored non-temporally: no read for ownership of its lines, and
the lines not kept in a cache they would not fit (`streamed`); the transposing walk then
takes a block of FILTER_LANES output channels over all input channels (its 16 filters' taps
16 sequential streams, U's rows written a whole line a store) rather than all output
channels for each input channel (16 filters 9 x C floats apart: 18 KB at 512 channels,
two of L1's 64 sets).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu.image_kernels import iadd, imul
from graphc.backends.cpu.kernels import streaming_stores
from graphc.backends.cpu.values import (
    F32,
    I32,
    as_i64,
    i64,
    lane_mask,
    loop,
    square_transposed,
)
from graphc.backends.cpu.winograd_transforms import ALPHA, G, sandwich
from graphc.types import float64

__all__ = ["FILTER_LANES", "FILTER_VECTOR", "FILTER_VECTORS", "OUT_SQUARE", "STREAMED_U",
           "STREAMED_U_BYTES", "filter_at", "filter_taps", "filter_transform",
           "filters_by_vectors", "in_squares", "store_filter_taps", "streamed"]

# float32 filters transformed FILTER_LANES a vector (filters_by_vectors); False: one by one
# (for A/B runs)
FILTER_VECTORS = True
FILTER_LANES = 16
TAPS = ir.VectorType(F32, 9)  # a 3x3 filter's taps, one load or store
FILTER_VECTOR = ir.VectorType(F32, FILTER_LANES)  # one float32 filter a lane
OUT_SQUARE = 16  # transposing walks in squares of channels (in_squares)
# A float32 U of STREAMED_U_BYTES or more stored non-temporally, its transposing walk a block
# of output channels at a time (see the module docstring; `streamed`). ResNet-18's 512 x 512
# channels (U 16.8 MB), batch 32, 1 thread, 15 alternated rounds (benchmarks/
# resnet18_kernels.py --only switch --switch winograd_filters.STREAMED_U --channels 512):
# forward 7.19 -> 6.52 ms; with the block walk the input gradient 7.29 -> 6.80 ms (the block
# walk alone 7.08 -> 6.83). 256 channels (U 4.2 MB, in cache for the GEMMs) streamed
# measured slower (input gradient 5.35 -> 5.87 ms), hence the size. False: U stored as any
# other array, the walk input channel by input channel (for A/B runs).
STREAMED_U = True
STREAMED_U_BYTES = 8 << 20


def in_squares(b, o_range, ci: int, one) -> None:
    """one(b, o, c) for o in `o_range`, c < ci, in squares of OUT_SQUARE x OUT_SQUARE
    channels (c outer, o inner in each): for the transposes between [o][c] and [c][o]
    layouts, so that neither side strides over the whole matrix."""
    lo, hi = (as_i64(v) for v in o_range)
    side = OUT_SQUARE
    squares = b.udiv(b.add(b.sub(hi, lo), i64(side - 1)), i64(side))
    with loop(b, 0, squares, "ob") as ob, loop(b, 0, -(-ci // side), "cb") as cb:
        o_lo = b.add(lo, b.mul(ob, i64(side)))
        c_lo = b.mul(cb, i64(side))
        o_hi, c_hi = _at_most(b, b.add(o_lo, i64(side)), hi), \
            _at_most(b, b.add(c_lo, i64(side)), i64(ci))
        with loop(b, c_lo, c_hi, "c") as c, loop(b, o_lo, o_hi, "o") as o:
            one(b, o, c)


def _at_most(b, v, hi):
    return b.select(b.icmp_signed(">", v, hi), hi, v)


def filter_transform(b, kb, dt, wi, ui, step, g, flip, transposed=False,
                     o_range=None) -> None:
    """U[xi * step + o * C + c] = (G f G^T)[xi] for f = w[o, c], or for the input
    gradient's f = w[o, c, ::-1, ::-1] when `flip`; `transposed`: stored at U[xi * step +
    c * O + o], so that the input gradient's GEMMs read U as laid out (the generated block
    GEMM broadcasts a's elements along a row, not O apart), in squares of channels
    (in_squares). `o_range`: only w's output channels [lo, hi) (a forked kernel's share).
    From WIDE_CHANNELS on only where the generated GEMM serves: at 512 x 512
    channels the transposing walk took ~2-2.5 ms more than the row walk (reads 18 KB
    apart), which the generated GEMM repays (4 x 4 planes, batch 32: 12.8 -> 11.0 ms
    against U^T through BLAS's transpose flag) and the BLAS's NN form does not.
    float32 filters go FILTER_LANES a vector along U's rows where they can
    (`filters_by_vectors`); the rest one by one. A large U is stored non-temporally
    (`streamed`), and drained before the kernel goes on."""
    o_range = o_range or (i64(0), i64(g.o))
    stream = STREAMED_U and streamed(dt, g.o, g.c)
    # the vectors' alignment in U (64-byte aligned, its matrices whole lines apart): along
    # c from a multiple of FILTER_LANES; along o from the range's start (a share's: unknown)
    aligned = g.c % FILTER_LANES == 0 if not transposed else \
        g.o % FILTER_LANES == 0 and isinstance(o_range[0], ir.Constant) and \
        o_range[0].constant % FILTER_LANES == 0

    def one(b, o, c):
        base = imul(b, iadd(b, imul(b, o, g.c), c), 9)
        f = [[kb.load(b, wi, iadd(b, base, _tap(r, s, flip))) for s in range(3)]
             for r in range(3)]
        _store_filter(b, kb, dt, ui, step, f, filter_at(b, g.o, g.c, o, c, transposed))

    def vector(b, o, c):  # FILTER_LANES filters, one a lane (see filters_by_vectors)
        tap = filter_taps(b, kb, wi, g.c, o, c, transposed)
        f = [[tap[_tap(r, s, flip)] for s in range(3)] for r in range(3)]
        _store_filter(b, kb, dt, ui, step, f, filter_at(b, g.o, g.c, o, c, transposed),
                      (64 if aligned else 4) if stream else None)

    filters_by_vectors(b, dt, o_range, g.c, transposed, one, vector, blocks_outer=stream)
    if stream:
        kb.drain(b)


def streamed(dt, co: int, ci: int) -> bool:
    """Whether the filters of a U of co x ci filters (16 positions) are large enough to be
    stored non-temporally, theirs or the gradient's (STREAMED_U, conv_winograd.STREAMED_GW):
    float32 vectors, a U of STREAMED_U_BYTES or more, a host with such stores (x86-64)."""
    return (FILTER_VECTORS and dt.name == "float32"
            and ALPHA * ALPHA * co * ci * dt.itemsize >= STREAMED_U_BYTES and streaming_stores())


def filters_by_vectors(b, dt, o_range, ci: int, along_o: bool, one, vector,
                       blocks_outer: bool = False) -> None:
    """one(b, o, c) for every filter (o, c), o in `o_range` (a forked kernel's share), c <
    ci; float32 filters FILTER_LANES at a time where they can, `vector(b, o, c)` for filters
    (o, c + j), or (o + j, c) `along_o`, j < FILTER_LANES: along c where ci is a whole
    number of vectors, along o in blocks of the range with its rest one by one (in_squares,
    the transposing walk, as `along_o` one by one). The vectors' loads and stores of the
    filters' 9 taps go through registers transposed (`filter_taps`, `store_filter_taps`):
    LLVM vectorised the loops with a gather or scatter per tap and 16 filters (the forward
    filter transform at 512 x 512 channels took ~3.3 ms, ~8 GB/s). `blocks_outer`: along o,
    each block of FILTER_LANES output channels over all input channels in turn (else each
    input channel over all blocks)."""
    lanes = FILTER_LANES
    lo, hi = o_range
    vectors = FILTER_VECTORS and dt is not float64
    if along_o:
        rest = lo
        if vectors:
            blocks = b.udiv(b.sub(as_i64(hi), as_i64(lo)), i64(lanes))
            walk = (("fob", blocks), ("fc", ci)) if blocks_outer else \
                (("fc", ci), ("fob", blocks))
            with loop(b, 0, walk[0][1], walk[0][0]) as i, loop(b, 0, walk[1][1], walk[1][0]) as k:
                ob, c = (i, k) if blocks_outer else (k, i)
                vector(b, b.add(as_i64(lo), b.mul(ob, i64(lanes))), c)
            rest = b.add(as_i64(lo), b.mul(blocks, i64(lanes)))
        in_squares(b, (rest, hi), ci, one)
    elif vectors and ci % lanes == 0:
        with loop(b, lo, hi, "fo") as o, loop(b, 0, ci // lanes, "fcv") as cv:
            vector(b, o, b.mul(cv, i64(lanes)))
    else:
        with loop(b, lo, hi, "fo") as o, loop(b, 0, ci, "fc") as c:
            one(b, o, c)


def _tap(r: int, s: int, flip: bool) -> int:
    """Where tap (r, s) of the transformed filter lies in w's 3x3 (flipped: (2-r, 2-s))."""
    return (2 - r if flip else r) * 3 + (2 - s if flip else s)


def filter_at(b, co: int, ci: int, o, c, transposed: bool):
    """A transform-domain matrix's element of filter (o, c): o * ci + c, or c * co + o
    transposed."""
    return iadd(b, imul(b, c, co), o) if transposed else iadd(b, imul(b, o, ci), c)


def _store_filter(b, kb, dt, ui, step, f, at, streaming: int | None = None) -> None:
    """U[xi * step + at] = (G f G^T)[xi] for the 16 xi: f's 3x3 taps scalars, or vectors
    (one filter a lane, stored along U's row from `at`). `streaming`: the vectors stored
    non-temporally, that many bytes aligned (64: one movntps a vector; 4: LLVM lowers the
    store to 8-byte movntsd or movnti, which x86 allows at any address)."""
    u = sandwich(b, dt, G, f)
    for xi in range(ALPHA * ALPHA):
        value, at_xi = u[xi // ALPHA][xi % ALPHA], iadd(b, at, xi * step)
        if isinstance(value.type, ir.VectorType):
            store = b.store(value, kb.pointer(b, ui, at_xi), align=4)
            if streaming is not None:
                store.align = streaming
                store.set_metadata("nontemporal", b.module.add_metadata([ir.Constant(I32, 1)]))
        else:
            kb.store(b, ui, at_xi, value)


def _filter_rows(b, ci: int, o, c, along_o: bool):
    """(where filter (o, c)'s 9 taps start in a [O][ci][3][3] array, how far apart the
    FILTER_LANES filters of a vector's taps start)."""
    return imul(b, iadd(b, imul(b, o, ci), c), 9), 9 * (ci if along_o else 1)


def filter_taps(b, kb, wi, ci: int, o, c, along_o: bool) -> list:
    """The 9 taps (row-major 3x3) of FILTER_LANES float32 filters of w ([O][ci][3][3]), one
    vector each, filter j in lane j: (o, c + j), or (o + j, c) `along_o`. Each filter's taps
    one load, the loads transposed in registers (values.square_transposed)."""
    lanes = FILTER_LANES
    first, apart = _filter_rows(b, ci, o, c, along_o)
    widen = lane_mask(list(range(9)) + [0] * (lanes - 9))  # lanes past the 9 taps unused
    rows = []
    for j in range(lanes):
        taps = b.load(kb.pointer(b, wi, iadd(b, first, j * apart)), typ=TAPS, align=4)
        rows.append(b.shuffle_vector(taps, taps, widen))
    return square_transposed(b, rows)[:9]


def store_filter_taps(b, kb, oi, ci: int, o, c, along_o: bool, taps: list,
                      streaming: bool = False) -> None:
    """The inverse of `filter_taps`: the 9 vectors of taps stored as FILTER_LANES filters
    of gw ([O][ci][3][3]), each filter's 9 taps one store (`streaming`: non-temporal, 36
    bytes at any 4-byte boundary: 8-byte movnti / movntsd and a 4-byte one; the caller
    drains)."""
    lanes = FILTER_LANES
    first, apart = _filter_rows(b, ci, o, c, along_o)
    zero = ir.Constant(taps[0].type, [0.0] * lanes)  # rows past the taps, never stored
    rows = square_transposed(b, list(taps) + [zero] * (lanes - 9))
    nine = lane_mask(list(range(9)))
    for j, row in enumerate(rows):
        store = b.store(b.shuffle_vector(row, row, nine),
                        kb.pointer(b, oi, iadd(b, first, j * apart)), align=4)
        if streaming:
            store.set_metadata("nontemporal", b.module.add_metadata([ir.Constant(I32, 1)]))
