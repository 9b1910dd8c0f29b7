"""traced_sizes: a size known only per call, read at the trace's value to choose code.

A symbolic graph (graphc.backends.cpu.runtime_sizes) is lowered once for every size, but
some choices depend on a size: which generated GEMM tile a product takes (graphc.backends.
cpu.small_gemm), whether a convolution's images are split over the cores (graphc.backends.
cpu.conv_threads). Comparing the symbolic size itself would record a guard, and the
executable would then serve only the sizes on one side of it. `traced` reads the size at
the trace's values (the ShapeEnv's hints) without a guard, so the choice is the static
graph's at the traced shape; the code chosen must then be correct for every size.
"""

from __future__ import annotations

from graphc.symbolic import Sym, current_env

__all__ = ["traced"]


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
