"""runtime_sizes: a symbolic graph compiled once on cpu, its sizes read per call.

A graph with symbolic sizes (`f32[s0,784]`) is lowered once: every size, stride and offset
that depends on a symbol is computed in the generated code from a *sizes table* the call
passes (`run(inputs, outputs, arena, dims)`), so one executable serves every batch size or
sequence length. The table holds
- the graph's symbols (`s0`, `s1`: bound from the inputs' shapes each call),
- each arena buffer's offset (`_b<k>`: the symbolic memory plan packs the same buffers for
  the call's sizes, `MemoryPlan.layout`, cached per size), and
- the end of the plan's arena (`_arena`), where the backend's own scratch begins, and
- counts derived from the symbols that no polynomial of them expresses (`_c<k>`: a symbolic
  m's row chunks, graphc.backends.cpu.traced_sizes.chunks).
Kernels read the table through the module's `graphc.dims` (Codegen.emit_size); loops whose
trip counts are symbolic stay loops over an i64 bound, and an elementwise kernel that may
fork over the cores decides per call from its element count.

Per call size (`at(values)`, kept for KEPT_SIZES sizes): the table, the concrete input and
output types, the driver's tail for the current arena, and from its second call on that
arena the size's steady call (graphc.backends.cpu.steady_call), so a loop at one size costs
the Python a static executable's loop does; an arena grown for a larger size drops every
size's tail and steady call.

Which lowerings take sizes per call is codegen's `RUNTIME_SIZE_LOWERINGS`; a graph with any
other op (randint, randperm, the collectives) raises `RuntimeSizesUnsupported` and is
compiled per size by graphc.backends.specializing instead. The lowering runs under a
ShapeEnv at the trace's sizes in its structural mode: a choice that compares sizes (merging
dims whose strides line up, a GEMM layout) is decided without guarding where it can be, and
otherwise records a guard. Those guards are the executable's `relations`: a call whose sizes
break one is served by a per-size executable (graphc.backends.specializing), and a lowering
that pinned a symbol to one value is refused outright (it could serve one size only).
"""

from __future__ import annotations

import ctypes
import functools
import re
import sys

import numpy as np

from graphc import config
from graphc.backends.common import planned
from graphc.backends.cpu import llvm
from graphc.backends.cpu.blas import resolve_blas
from graphc.backends.cpu.executable import (
    CpuExecutable,
    InputTypes,
    _allocate_arena,
    _uses_gemm,
    output_types,
)
from graphc.backends.cpu.poison import poisoned
from graphc.backends.cpu.traced_sizes import derived_values
from graphc.backends.cpu.values import CpuLoweringError
from graphc.errors import ArgumentError, IndexOutOfRangeError
from graphc.ir.graph import Graph
from graphc.ir.printer import format_node
from graphc.ir.verifier import verify
from graphc.passes.plan import align
from graphc.symbolic import ShapeEnv, Sym, check_relations, evaluate, free_symbols

DEFAULT_HINT = 64  # the size a symbol is lowered at where no trace gave one
KEPT_SIZES = 256  # per-size tables (sizes table, arena bytes, types) kept at once
# a size's steady call is written out at its second general call on one arena: a loop's
# sizes get one after a call, a sweep over sizes seen once compiles none
STEADY_FROM_CALL = 2
# a Sym that reached an ir.Constant prints as its expression: `i64 s0*4`, `i32 _b3`
_PRINTED_SYMBOL = re.compile(r"\bi(?:32|64) (-?[0-9]*\*?(?:s[0-9]+|_b[0-9]+|_c[0-9]+|_arena)\b)")


class RuntimeSizesUnsupported(CpuLoweringError):
    """A symbolic graph the cpu backend cannot lower once for every size."""


class Layout:
    """The symbols of the sizes table besides the graph's own: each arena buffer's offset
    (`_b<k>`) and the plan's arena end (`_arena`), and their values for a call's sizes."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.symbols = {name: f"_b{k}" for k, name in enumerate(plan.buffers)}
        self.arena_end = Sym.symbol("_arena")

    def offset(self, value_name: str) -> Sym:
        """The arena offset of the buffer `value_name` lives in, as its table symbol."""
        return Sym.symbol(self.symbols[self.plan.buffer_of[value_name]])

    def values(self, sizes: dict[str, int]) -> dict[str, int]:
        """Every table symbol's value for the graph's symbols `sizes`."""
        offsets, arena = self.plan.layout(sizes)
        out = dict(sizes)
        out.update(derived_values(sizes))  # counts such as a symbolic m's row chunks
        for name, symbol in self.symbols.items():
            out[symbol] = offsets[name]
        out["_arena"] = align(arena)
        return out

    @staticmethod
    def refuse(node) -> None:
        where = f" at {node.loc}" if node.loc else ""
        raise RuntimeSizesUnsupported(
            f"cpu backend: {node.op} takes no sizes per call (node {format_node(node)}{where})")


class RuntimeSizedExecutable(CpuExecutable):
    """A symbolic graph's one cpu executable (see the module docstring). `at(values)` is
    the executable bound to one call's sizes; `accepts(values)` whether it serves them."""

    def __init__(self, graph: Graph, options: dict | None = None,
                 hints: dict[str, int] | None = None) -> None:
        self.graph = verify(graph)
        self._memory_plan = plan = planned(graph)
        names = free_symbols(tuple(v.type.shape for v in graph.inputs))
        hints = {n: (hints or {}).get(n, DEFAULT_HINT) for n in sorted(names)}
        self.symbols = sorted(names)
        self.layout = Layout(plan)
        blas = resolve_blas() if any(_uses_gemm(n) for n in graph.nodes) else None
        self.profiled = bool((options or {}).get("profile"))
        from graphc.backends.cpu.codegen import lower

        env = ShapeEnv(hints=self.layout.values(hints))
        with env.active(), env.structural():
            self.lowered, lw = lower(graph, blas, profile=self.profiled,
                                     runtime_sizes=self.layout)
        self.relations = env.relations
        pinned = sorted(set(env.specialised()) & names)
        if pinned:
            raise RuntimeSizesUnsupported(
                f"cpu backend: graph @{graph.name}: the lowering needs {', '.join(pinned)} "
                f"at one value (guards {env.guards}), so it is compiled per size")
        stray = _PRINTED_SYMBOL.search(self.lowered.ir_text)
        if stray is not None:  # a lowering wrote a symbolic size as an LLVM constant
            raise RuntimeSizesUnsupported(
                f"cpu backend: graph @{graph.name}: a kernel uses the symbolic size "
                f"{stray.group(1)} as a constant, so it is compiled per size")
        self.slots = sorted(lw.dim_slots, key=lw.dim_slots.get)
        self.library = llvm.compile_module(self.lowered.ir_text, f"graphc_{graph.name}")
        self._run = self.library.ctypes_function(
            "run", ctypes.c_int32, [ctypes.c_void_p] * (5 if self.profiled else 4))
        self.last_stamps = np.zeros(len(self.lowered.kernels) + 1, np.int64)
        self._sized: dict[tuple, _Sizes] = {}
        self._raw = None
        self._arena_capacity = -1
        self._call_tables(plan.in_input)  # output types stay symbolic: `at` sizes them
        self._collectives = ()
        if config.poison():  # every run's outputs and arena poisoned first (cpu.poison)
            self._run = poisoned(self._run, self)

    def written_layout(self, tail: tuple) -> tuple[list, dict, int]:
        """CpuExecutable.written_layout for the call size whose driver tail this is."""
        sized = next(s for s in self._sized.values() if s.tail and s.tail[1] is tail[1])
        return sized.out_types, {}, sized.arena_bytes

    # ---- per call --------------------------------------------------------------------------
    def accepts(self, values: dict[str, int]) -> bool:
        """Whether the guards the lowering assumed hold for these sizes."""
        return not self.relations or not check_relations(self.relations,
                                                         self.layout.values(values))

    def at(self, values: dict[str, int]) -> _Bound:
        key = tuple(values[n] for n in self.symbols)
        sized = self._sized.get(key)
        if sized is None:
            if len(self._sized) >= KEPT_SIZES:  # a long sweep of sizes: the oldest goes
                self._sized.pop(next(iter(self._sized)))
            table = self.layout.values(values)
            sized = self._sized[key] = _Sizes(
                dict(values), np.array([table[n] for n in self.slots], np.int64),
                int(evaluate(self.lowered.arena_bytes, table)),
                InputTypes([(evaluate(v.type.shape, values), np.dtype(v.type.dtype.np))
                            for v in self.graph.inputs]),
                output_types([(evaluate(t.shape, values), np.dtype(t.dtype.np))
                              for t in self._copied]))
        return _Bound(self, sized)

    def run_sized(self, sized: _Sizes, arrays: tuple,
                  general: bool = False) -> list[np.ndarray]:
        """One call at the size `sized`: its steady call where it has one (the last call's
        input arrays again, as in a loop: graphc.backends.cpu.steady_call, written out for
        this size), else (or with `general`) the checks one input at a time (`_call`)."""
        try:
            steady = sized.steady
            if steady is not None and not general:
                return steady(self, arrays)
            if len(arrays) != sized.in_types.count:
                raise ArgumentError(f"graph @{self.graph.name} takes {sized.in_types.count} "
                                    f"inputs, got {len(arrays)}")
            with self._lock:  # the pointer arrays and the arena are shared by every call
                return self._sized_call(sized, arrays)
        except IndexOutOfRangeError as err:  # its text names sizes by their symbols
            at = ", ".join(f"{n} = {v}" for n, v in sized.values.items())
            raise IndexOutOfRangeError(f"{err} (at this call {at})") from None

    def _sized_call(self, sized: _Sizes, arrays: tuple) -> list[np.ndarray]:
        """`run_sized`'s call under the lock by the general checks (`_call`): the arena grown
        to the size's bytes, the size's tail made for it; the size's steady call written out
        at its second call on one arena (a sweep over sizes seen once writes none)."""
        if sized.arena_bytes > self._arena_capacity:
            self._raw = _allocate_arena(self.graph, sized.arena_bytes)
            self._arena_capacity = sized.arena_bytes
            for other in self._sized.values():  # nothing keeps the old arena alive
                other.arena, other.tail, other.steady = None, (), None
        if sized.arena is not self._raw:  # the driver's arguments after the tables
            skip = -self._raw.ctypes.data % 64
            sized.arena, sized.tail = self._raw, (
                ctypes.c_void_p(self._raw.ctypes.data + skip),
                ctypes.c_void_p(sized.dims.ctypes.data)) + (
                (ctypes.c_void_p(self.last_stamps.ctypes.data),) if self.profiled else ())
            sized.steady, sized.calls = None, 0
        self._in_types = sized.in_types
        results = self._call(arrays, sized.out_types, sized.tail)
        sized.calls += 1
        if sized.calls == STEADY_FROM_CALL:
            sized.steady = self.write_steady_call(sized)
        return results

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        raise ArgumentError(f"graph @{self.graph.name} has symbolic sizes: call it through "
                            "graphc.backends.compile, which binds them per call")

    def sections(self) -> None:  # symbolic graphs are not in the pipeline cache
        return None


class _Sizes:
    """One call size's symbols, table, arena bytes and concrete input/output types; the
    driver's trailing arguments, made once per arena the executable has (`tail`, `arena`);
    the size's steady call on that arena (`steady`, once `calls` general calls reach
    STEADY_FROM_CALL)."""

    __slots__ = ("values", "dims", "arena_bytes", "in_types", "out_types", "arena", "tail",
                 "steady", "calls")

    def __init__(self, values, dims, arena_bytes, in_types, out_types) -> None:
        self.values, self.dims, self.arena_bytes = values, dims, arena_bytes
        self.in_types, self.out_types = in_types, out_types
        self.arena, self.tail = None, ()
        self.steady, self.calls = None, 0


class _Bound:
    """The runtime-sized executable at one call size: an executable like any other."""

    fresh_results = True
    generic = True  # serves every size (SpecializingExecutable.compiled_sizes skips it)

    def __init__(self, executable: RuntimeSizedExecutable, sized: _Sizes) -> None:
        self.executable, self.sized = executable, sized
        # `run` with the arrays as one tuple, one frame less (SpecializingExecutable.run)
        self.run_arrays = functools.partial(executable.run_sized, sized)

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        return self.executable.run_sized(self.sized, arrays)


def generic(graph: Graph, options: dict, hints: dict[str, int] | None):
    """The runtime-sized executable of a symbolic graph, or None (with the reason logged
    under GRAPHC_LOG=recompiles) when it must be compiled per size."""
    try:
        return RuntimeSizedExecutable(graph, options, hints)
    except CpuLoweringError as err:  # RuntimeSizesUnsupported, or an op cpu cannot lower
        if "recompiles" in config.log_topics():
            print(f"graphc: {err}; compiling per size", file=sys.stderr)
        return None


__all__ = ["Layout", "RuntimeSizedExecutable", "RuntimeSizesUnsupported", "generic"]
