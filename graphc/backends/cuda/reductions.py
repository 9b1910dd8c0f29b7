"""reductions: cooperative generated kernels, many threads per output.

Every reduction-shaped kernel of the cuda backend (reduce_* and fused groups ending in one,
softmax/log_softmax, argmax/argmin, the NLL loss) is written here from a `Reducer`: the state
one thread keeps (C variables with their identities), how an element folds into it, how two
states merge, and what the segment stores at the end. `reduce_kernels` lays the work out:

- a *segment* of `lanes` neighbouring threads (32, 64, 128 or 256: the reduced extent rounded
  up to a power of two, at least a warp, at most a block) owns one output; lane l folds the
  elements l, l + lanes, ... of the extent (neighbouring lanes read neighbouring elements of
  a row), then the lanes merge with a `__shfl_xor_sync` butterfly and, across the warps of a
  segment, through `__shared__` memory. Short rows pack several segments into one block.
- when the outputs are too few to fill an H100 (`TARGET_THREADS` resident threads) and the
  extent is long, the extent is split into `split` chunks: pass 1 writes one partial state
  per (output, chunk) into scratch, pass 2 merges the chunks of an output in chunk order.
- when the source's last dimension is kept (a sum over the batch of (B, F): neighbouring
  outputs are neighbours in memory), a *column* block holds 32 neighbouring outputs times 8
  slices of the extent, so each warp load is coalesced; the extent is split into chunks
  until each output has min(256, extent) threads (then pass 2 as above).

The order of every combination is fixed by the shapes (lane stride, butterfly, warp order,
chunk order), so a kernel gives the same bits on every run; it differs from numpy's
summation order, so float sums match the interpreter within rounding (float32 sums and
products accumulate in double, as before).
Invariants: cooperative kernels have `guard=False` and `threads` a multiple of BLOCK, and no
thread returns before the last barrier; `Launch.lanes` records lanes x split, the threads
that work on one output.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from graphc.backends.cuda import cudagen
from graphc.backends.cuda.cudagen import BLOCK
from graphc.backends.cuda.lowering import KernelText, Lowerer
from graphc.ir.graph import Node

WARP = 32
TARGET_THREADS = 132 * 2048  # an H100: SMs x resident threads per SM
MIN_PER_THREAD = 8  # elements per thread (pass 1) before the extent is split further
MAX_SPLIT = 1024


@dataclass
class Reducer:
    """What a segment computes. `states`: (name, C type, identity) of each state variable
    (C types a warp shuffle takes: no bool); `update(k)`: statements folding the element at
    flat reduced index `r` (the reduced coordinates `c<d>` are declared) into the states;
    `merge()`: statements folding `o_<name>` (another lane's states) into the states, the
    same answer in either order; `finish(k)`: what lane 0 stores (kept coordinates `c<d>`
    declared); `after(k)`: statements every lane of the segment runs with the final states
    (softmax writes its row there), or None."""

    states: list[tuple[str, str, str]]
    update: Callable[[KernelText], list[str]]
    merge: Callable[[], list[str]]
    finish: Callable[[KernelText], list[str]]
    after: Callable[[KernelText], list[str]] | None = None


def lanes_for(extent: int) -> int:
    """The segment width for a reduced extent: a power of two in [WARP, BLOCK]."""
    lanes = WARP
    while lanes < min(extent, BLOCK):
        lanes *= 2
    return lanes


def split_for(outputs: int, extent: int, lanes: int) -> int:
    """How many chunks each output's extent is cut into (1: a single pass)."""
    if outputs * lanes >= TARGET_THREADS:
        return 1
    by_fill = TARGET_THREADS // max(outputs * lanes, 1)
    by_work = -(-extent // (lanes * MIN_PER_THREAD))
    return max(1, min(by_fill, by_work, MAX_SPLIT))


def _coord_lines(shape: tuple[int, ...], dims: list[int], index: str, prefix: str) -> list[str]:
    lines = cudagen.decompose(shape, index, prefix) if shape else []
    return lines + [f"long long c{d} = {prefix}{i};" for i, d in enumerate(dims)]


def segment_kernel(lw: Lowerer, node: Node, outputs: int, kept: tuple[tuple[int, ...], list[int]],
                   extent: int, red: tuple[tuple[int, ...], list[int]] | None,
                   reducer: Reducer, lanes: int, split: int = 1) -> KernelText:
    """One cooperative kernel: `outputs` segments of `lanes` threads (times `split` chunks
    of the extent); `kept`/`red`: (shape, source dims) of the output index and of the
    reduced index (red None: no coordinates, the update reads by `r`)."""
    segments = outputs * split
    threads = -(-segments * lanes // BLOCK) * BLOCK
    k = lw.new_kernel(node, threads)
    k.guard, k.lanes = False, lanes * split
    chunk = -(-extent // split)
    L = k.lines
    L.append(f"long long gc_seg = gi / {lanes}; int gc_lane = (int)(gi % {lanes});")
    if split > 1:
        L.append(f"long long gc_o = gc_seg / {split}; long long gc_part = gc_seg % {split};")
        lo, hi = f"gc_part * {chunk}LL", f"gc_min(gc_part * {chunk}LL + {chunk}LL, {extent}LL)"
    else:
        L.append("long long gc_o = gc_seg;")
        lo, hi = "0LL", f"{extent}LL"
    L += _coord_lines(kept[0], kept[1], "gc_o", "k")
    L += [f"{t} {name} = {ident};" for name, t, ident in reducer.states]
    L.append(f"if (gc_o < {outputs}LL) {{")
    L.append(f"  for (long long r = {lo} + gc_lane; r < {hi}; r += {lanes}) {{")
    inner = _coord_lines(red[0], red[1], "r", "q") if red else []
    inner += reducer.update(k)
    L += ["    " + line for line in inner]
    L += ["  }", "}"]
    _merge_lanes(k, reducer, lanes)
    L.append(f"if (gc_o < {outputs}LL) {{")
    if split > 1:
        L += ["  " + line for line in _store_partials(lw, k, reducer, segments)]
    else:
        L.append("  if (gc_lane == 0) {")
        L += ["    " + line for line in reducer.finish(k)]
        L.append("  }")
        if reducer.after is not None:
            L += ["  " + line for line in reducer.after(k)]
    L.append("}")
    return k


COLUMN_ROWS = BLOCK // WARP  # extent slices of a column block (one per warp)


def column_kernel(lw: Lowerer, node: Node, outputs: int,
                  kept: tuple[tuple[int, ...], list[int]], extent: int,
                  red: tuple[tuple[int, ...], list[int]], reducer: Reducer,
                  split: int) -> KernelText:
    """The column layout, for outputs that are neighbours in memory (the source's last dim
    is kept): a block holds 32 neighbouring outputs (lane x = threadIdx.x % 32, so a warp
    reads 32 neighbouring elements: coalesced) times COLUMN_ROWS slices of the extent (one per
    warp), merged in slice order through `__shared__` memory by slice 0; `split` chunks of
    the extent per output as in segment_kernel (its partials layout too)."""
    groups = -(-outputs // WARP)
    k = lw.new_kernel(node, groups * split * BLOCK)
    k.guard, k.lanes = False, COLUMN_ROWS * split
    chunk = -(-extent // split)
    L = k.lines
    L.append(f"long long gc_b = (long long)blockIdx.x / {split}; "
             f"long long gc_part = (long long)blockIdx.x % {split};")
    L.append(f"int gc_x = (int)(threadIdx.x % {WARP}); int gc_lane = (int)(threadIdx.x / {WARP});")
    L.append(f"long long gc_o = gc_b * {WARP} + gc_x; long long gc_seg = gc_o * {split} + gc_part;")
    L += _coord_lines(kept[0], kept[1], "gc_o", "k")
    L += [f"{t} {name} = {ident};" for name, t, ident in reducer.states]
    lo, hi = f"gc_part * {chunk}LL", f"gc_min(gc_part * {chunk}LL + {chunk}LL, {extent}LL)"
    L.append(f"if (gc_o < {outputs}LL) {{")
    L.append(f"  for (long long r = {lo} + gc_lane; r < {hi}; r += {COLUMN_ROWS}) {{")
    inner = _coord_lines(red[0], red[1], "r", "q") + reducer.update(k)
    L += ["    " + line for line in inner]
    L += ["  }", "}"]
    L += [f"__shared__ {t} gc_c_{name}[{COLUMN_ROWS}][{WARP}];" for name, t, _ in reducer.states]
    L += [f"gc_c_{name}[gc_lane][gc_x] = {name};" for name, _, _ in reducer.states]
    L.append("__syncthreads();")
    L.append(f"if (gc_lane == 0 && gc_o < {outputs}LL) {{")
    L.append(f"  for (int gc_w = 1; gc_w < {COLUMN_ROWS}; ++gc_w) {{")
    L += [f"    {t} o_{name} = gc_c_{name}[gc_w][gc_x];" for name, t, _ in reducer.states]
    L += ["    " + line for line in reducer.merge()]
    L.append("  }")
    if split > 1:
        for name, t, _ in reducer.states:
            at = lw.scratch(outputs * split * _size(t))
            k.partials[name] = at
            L.append(f"  (({t} *){k.ptr(at)})[gc_seg] = {name};")
    else:
        L += ["  " + line for line in reducer.finish(k)]
    L.append("}")
    return k


def _merge_lanes(k: KernelText, reducer: Reducer, lanes: int) -> None:
    """Every lane of a segment ends with the segment's merged states."""
    L = k.lines
    L.append(f"for (int gc_off = {WARP // 2}; gc_off > 0; gc_off >>= 1) {{")
    L += [f"  {t} o_{name} = __shfl_xor_sync(0xffffffffu, {name}, gc_off);"
          for name, t, _ in reducer.states]
    L += ["  " + line for line in reducer.merge()]
    L.append("}")
    warps = lanes // WARP
    if warps == 1:
        return
    L += [f"__shared__ {t} gc_w_{name}[{BLOCK // WARP}];" for name, t, _ in reducer.states]
    L.append("if ((threadIdx.x & 31) == 0) {")
    L += [f"  gc_w_{name}[threadIdx.x >> 5] = {name};" for name, _, _ in reducer.states]
    L.append("}")
    L.append("__syncthreads();")
    L.append(f"int gc_w0 = (int)(threadIdx.x / {lanes}) * {warps};")
    L += [f"{name} = gc_w_{name}[gc_w0];" for name, _, _ in reducer.states]
    L.append(f"for (int gc_w = 1; gc_w < {warps}; ++gc_w) {{")
    L += [f"  {t} o_{name} = gc_w_{name}[gc_w0 + gc_w];" for name, t, _ in reducer.states]
    L += ["  " + line for line in reducer.merge()]
    L.append("}")


def _store_partials(lw: Lowerer, k: KernelText, reducer: Reducer, segments: int) -> list[str]:
    lines = ["if (gc_lane == 0) {"]
    for name, t, _ in reducer.states:
        at = lw.scratch(segments * _size(t))
        k.partials[name] = at
        lines.append(f"  (({t} *){k.ptr(at)})[gc_seg] = {name};")
    return lines + ["}"]


def _size(ctype: str) -> int:
    return {"float": 4, "int": 4, "double": 8, "long long": 8}[ctype]


def reduce_kernels(lw: Lowerer, node: Node, outputs: int,
                   kept: tuple[tuple[int, ...], list[int]], extent: int,
                   red: tuple[tuple[int, ...], list[int]], reducer: Reducer,
                   split: int | None = None) -> int:
    """Emit the kernels of one reduction (one pass, or two when the extent is split); returns
    the split used. A reducer with `after` is never split here (the caller splits it)."""
    lanes = lanes_for(extent)
    columns = columnar(kept, red) and reducer.after is None and split is None
    if columns:  # >= min(256, extent) threads per output, and enough blocks to fill
        split = max(-(-min(BLOCK, extent) // COLUMN_ROWS),
                    split_for(outputs, extent, COLUMN_ROWS))
        split = max(1, min(split, MAX_SPLIT, -(-extent // COLUMN_ROWS)))
        k = column_kernel(lw, node, outputs, kept, extent, red, reducer, split)
    else:
        if split is None:
            split = 1 if reducer.after is not None else split_for(outputs, extent, lanes)
        k = segment_kernel(lw, node, outputs, kept, extent, red, reducer, lanes, split)
    lw.emit(k)
    if split == 1:
        return 1
    partials = k.partials

    def update(k2: KernelText) -> list[str]:
        return [f"{t} o_{name} = (({t} *){k2.ptr(partials[name])})[gc_o * {split}LL + r];"
                for name, t, _ in reducer.states] + reducer.merge()

    second = Reducer(reducer.states, update, reducer.merge, reducer.finish, reducer.after)
    lw.emit(segment_kernel(lw, node, outputs, kept, split, None, second, lanes_for(split)))
    return split


def columnar(kept: tuple[tuple[int, ...], list[int]],
             red: tuple[tuple[int, ...], list[int]] | None) -> bool:
    """Whether neighbouring outputs read neighbouring source elements: the source's last
    dimension is kept (and at least a warp wide), so the column layout coalesces."""
    if red is None or not kept[1] or not red[1]:
        return False
    return kept[1][-1] > red[1][-1] and kept[0][-1] >= WARP


# ---- the reducers -----------------------------------------------------------------------------
def fold(states: list[tuple[str, str, str]], update: Callable[[KernelText], list[str]],
         combine: Callable[[str, str], str], finish: Callable[[KernelText], list[str]]) -> Reducer:
    """A reducer with one state `acc` and an associative `combine(a, b)` (C text)."""
    (name, _, _), = states

    def merge() -> list[str]:
        return [f"{name} = {combine(name, 'o_' + name)};"]

    return Reducer(states, update, merge, finish)


def arg_reducer(ct: str, is_min: bool, value: Callable[[KernelText], tuple[list[str], str]],
                finish: Callable[[KernelText], list[str]]) -> Reducer:
    """argmax/argmin: states (best, at); the first extreme wins, NaN beats every number."""
    flag = "true" if is_min else "false"

    def update(k: KernelText) -> list[str]:
        lines, v = value(k)
        return lines + [f"{ct} gc_v = ({ct})({v});",
                        f"if (gc_arg_wins(gc_v, r, best, at, {flag})) {{ best = gc_v; at = r; }}"]

    def merge() -> list[str]:
        return [f"if (gc_arg_wins(o_best, o_at, best, at, {flag})) "
                "{ best = o_best; at = o_at; }"]

    return Reducer([("best", ct, f"({ct})0"), ("at", "long long", "-1LL")], update, merge,
                   finish)


def shuffle_type(ct: str) -> str:
    """The C type a state of C type `ct` is kept in (warp shuffles take no bool)."""
    return "int" if ct == "bool" else ct


def prod(shape) -> int:
    return math.prod(shape)


__all__ = ["COLUMN_ROWS", "MAX_SPLIT", "Reducer", "TARGET_THREADS", "WARP", "arg_reducer",
           "column_kernel", "columnar", "fold", "lanes_for", "reduce_kernels", "segment_kernel",
           "shuffle_type", "split_for"]
