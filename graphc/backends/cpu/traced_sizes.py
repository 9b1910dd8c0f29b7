"""traced_sizes: a size known only per call, read at the trace's value to choose code.

A symbolic graph (graphc.backends.cpu.runtime_sizes) is lowered once for every size, but
some choices depend on a size: which generated GEMM tile a product takes (graphc.backends.
cpu.small_gemm), whether a convolution's images are split over the cores (graphc.backends.
cpu.conv_threads). Comparing the symbolic size itself would record a guard, and the
executable would then serve only the sizes on one side of it. `traced` reads the size at
the trace's values (the ShapeEnv's hints) without a guard, so the choice is the static
graph's at the traced shape; the code chosen must then be correct for every size.

`chunks` names a count no polynomial of the symbols expresses (the row chunks of an m
known per call), which the sizes table then carries per call (runtime_sizes).
"""

from __future__ import annotations

from graphc.symbolic import Sym, current_env

__all__ = ["DERIVED", "chunks", "derived_values", "traced"]


def traced(size) -> int | None:
    """`size` at the trace's values (an int as it is), recording no guard; None for a
    symbolic size outside a lowering with hints (no ShapeEnv, or a symbol it lacks)."""
    if type(size) is int:
        return size
    env = current_env()
    if type(size) is not Sym or env is None:
        return None
    try:
        return size.evaluate(env.hints)
    except KeyError:
        return None


# sizes derived from a symbolic graph's symbols per call, for counts no polynomial of them
# expresses: name -> (expression, divisor) of a ceiling division (`chunks`)
DERIVED: dict[str, tuple[Sym, int]] = {}
_NAMES: dict[tuple, str] = {}


def chunks(size: Sym, chunk: int) -> Sym:
    """The count of `chunk`-sized pieces that cover `size` (a symbolic size: ceil(size /
    chunk), 0 for 0), as a symbol of its own (`_c<k>`) whose value runtime_sizes' tables
    compute per call (`derived_values`); its trace's value joins the active ShapeEnv's
    hints, so choices read it as `traced` reads any size. Guard nothing on it: it can be 0
    or 1, where the graph's symbols are at least 2."""
    key = (size.terms, chunk)
    name = _NAMES.get(key)
    if name is None:
        name = _NAMES[key] = f"_c{len(_NAMES)}"
        DERIVED[name] = (size, chunk)
    env = current_env()
    if env is not None and name not in env.hints:
        value = traced(size)
        if value is not None:
            env.hints[name] = -(-value // chunk)
    return Sym.symbol(name)


def derived_values(values: dict[str, int]) -> dict[str, int]:
    """Every derived size (`chunks`) whose symbols `values` binds, at those values."""
    out = {}
    for name, (size, chunk) in DERIVED.items():
        if size.free_symbols <= values.keys():
            out[name] = -(-size.evaluate(values) // chunk)
    return out
