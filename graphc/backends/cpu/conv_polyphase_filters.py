"""conv_polyphase_filters: the sub-filters of graphc.backends.cpu.conv_polyphase's stride-2
Winograd, their transform U = G f G^T and the GEMM calls that read U.

Along an even axis the phase is F(2, 1): G = [[1], [1]], both points read the same tap, so
positions that differ only along even axes read the same U: the even-even phase's 4
positions one matrix (w[1, 1] itself), the even-odd and odd-even phases' 6 each three, the
odd-odd phase's 9 nine: 16 distinct matrices for the 25 positions (`u_slots`). The filter
transform writes each once (36% fewer bytes of U: 8.4 against 13.1 MB at 256 -> 512
channels), and the GEMMs that share a matrix run one after the other in one call with a's
step 0 (`gemm_calls`: 8 calls, 4 generated functions), so the second reads it from L2 where
the 256 -> 512 layer's U (0.5 MB a matrix, 8 MB in all) otherwise came from memory for every
position. Each product is computed as before (the same a, b and c, the same order): the same
bits. `SHARED_U = False`: one matrix a position, one call of 25 products (A/B runs).

The transform itself walks the filters FILTER_LANES a vector along U's rows
(winograd_filters.filters_by_vectors: each filter's 9 taps one load, transposed in
registers; the same operations per filter as one by one).
"""

from __future__ import annotations

from graphc.backends.cpu.image_kernels import iadd, image_kernel, imul
from graphc.backends.cpu.winograd_filters import filter_at, filter_taps, filters_by_vectors
from graphc.backends.cpu.winograd_transforms import combine

__all__ = ["SHARED_U", "filter_kernel", "filter_transform", "gemm_calls", "two_sided",
           "u_slots"]

# Positions that read the same U share one matrix and one GEMM call (see the module
# docstring); False: one matrix a position, the 25 products one call (A/B runs)
SHARED_U = True


def two_sided(b, dt, left, d, right):
    """left @ d @ right^T for `d` given as rows of IR values (combine's order)."""
    rows = [[combine(b, dt, r, [d[k][col] for k in range(len(d))]) for col in range(len(d[0]))]
            for r in left]
    return [[combine(b, dt, r, row) for r in right] for row in rows]


def u_slots(phases) -> tuple:
    """(the U matrix each position reads, in the phases' order; how many matrices): positions
    of a phase whose G rows are equal along both axes read one (SHARED_U), else one each."""
    slots, index = [], {}
    for ph, (rows, cols) in enumerate(phases):
        for i in range(len(rows[1])):
            for j in range(len(cols[1])):
                key = (ph, rows[2][i], cols[2][j]) if SHARED_U else len(slots)
                slots.append(index.setdefault(key, len(index)))
    return tuple(slots), len(index)


def gemm_calls(slots: tuple) -> list[tuple]:
    """[(first position, first U matrix, products, step between positions, step between
    matrices)]: the positions that share a matrix one call each (matrix step 0), then the
    runs of positions with a matrix of their own, consecutive in both, one call each."""
    readers: dict[int, list[int]] = {}
    for xi, slot in enumerate(slots):
        readers.setdefault(slot, []).append(xi)
    calls, own = [], []
    for slot, positions in readers.items():
        if len(positions) == 1:
            own.append((positions[0], slot))
            continue
        steps = {b - a for a, b in zip(positions, positions[1:])}
        assert len(steps) == 1, f"gemm_calls: positions {positions} not equally spaced"
        calls.append((positions[0], slot, len(positions), steps.pop(), 0))
    for xi, slot in own:
        last = calls[-1] if calls else None
        if last and last[4] == 1 and (last[0] + last[2], last[1] + last[2]) == (xi, slot):
            calls[-1] = last[:2] + (last[2] + 1,) + last[3:]
        else:
            calls.append((xi, slot, 1, 1, 1))
    return calls


def filter_transform(b, kb, dt, wi, ui, u_step, g, o_range, phases, transposed) -> None:
    """U[slot][o][c] of the four phases' sub-filters (G f G^T each, each distinct matrix
    once: `u_slots`) for o in `o_range`; `transposed` (the input gradient's) U[slot][c][o],
    so that its GEMMs read U's rows as they lie (through a's column stride, the 256 -> 512
    layer's input gradient took 12.5 ms against im2col's 9.3), walked c outer so the stores
    run along U's rows (o outer: 10.5 ms for that layer's transform, its stores 2 KB apart).
    float32 filters FILTER_LANES a vector (filters_by_vectors): LLVM's own vectorisation of
    the one-by-one loop gathered every tap, and the 256 -> 512 forward's transform (13 MB
    of U) took ~1.8 ms of its ~6.4 (fourteenth session)."""
    slots, _ = u_slots(phases)

    def store(b, f, o, c):
        at = filter_at(b, g.o, g.c, o, c, transposed)
        xi, written = 0, set()
        for rows, cols in phases:
            sub = [[f[r][s] for s in cols[3]] for r in rows[3]]
            for row in two_sided(b, dt, rows[2], sub, cols[2]):
                for value in row:
                    if slots[xi] not in written:
                        written.add(slots[xi])
                        pointer = kb.pointer(b, ui, iadd(b, at, slots[xi] * u_step))
                        b.store(value, pointer, align=4)
                    xi += 1

    def one(b, o, c):
        base = imul(b, iadd(b, imul(b, o, g.c), c), 9)
        store(b, [[kb.load(b, wi, iadd(b, base, r * 3 + s)) for s in range(3)]
                  for r in range(3)], o, c)

    def vector(b, o, c):  # FILTER_LANES filters, one a lane
        taps = filter_taps(b, kb, wi, g.c, o, c, transposed)
        store(b, [[taps[r * 3 + s] for s in range(3)] for r in range(3)], o, c)

    filters_by_vectors(b, dt, o_range, g.c, transposed, one, vector)


def filter_kernel(lw, locs, recipe, g, u_step, phases, transposed):
    """The filter transform as a kernel of its own, run once before a split kernel's shares
    (or before a kernel not split); forked over w's output channels where large enough.
    `locs`: w second, U fourth (conv_polyphase's kernel arguments)."""
    kb, ids = image_kernel(lw, "conv2d_polyphase_filter", locs, recipe)
    b = kb.begin(parallel=True, work=u_slots(phases)[1] * g.o * g.c)
    if b is None:
        return kb.kernel
    filter_transform(b, kb, locs[0].type.dtype, ids[1], ids[3], u_step, g,
                     kb.outer_range(b, g.o), phases, transposed)
    return kb.finish(b)
