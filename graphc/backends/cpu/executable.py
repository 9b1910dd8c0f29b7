"""CpuExecutable: a planned graph compiled into one native call over one arena.

`CpuExecutable(graph)` plans the graph if it has no `memory_plan` yet (plan_buffers), lowers
it with graphc.backends.cpu.codegen into one LLVM module, compiles it with
graphc.backends.cpu.llvm (on-disk object cache included) and allocates the arena once (numpy,
64-byte aligned). `run(*arrays)` is one native call of the module's driver
`run(void** inputs, void** outputs, char* arena)`; it returns fresh arrays for the outputs,
then one value per update (see graphc.backends): an update the plan computes straight into
its input (`plan.in_input`) is written into that input array, which is returned as the value.

Invariants:
- The Library (its engine and code), the ctypes function and the arena live as long as the
  executable; calls on one executable are serialised by a lock (they share the arena).
- Inputs must match the graph's types; a non-contiguous (or read-only updated) input is
  copied first, never read through wrong strides.
- Per call, Python does little: the ctypes pointer arrays are made once and refilled in place;
  every input's shape and dtype (and a written input's writeable flag) are checked at once,
  in a few C loops, and an input array that was at the same position last call (parameters,
  optimizer state) keeps its pointer, so the executable holds a reference to the last call's
  input arrays; a kept output array keeps its address too. Outputs are fresh arrays
  every call (they become user tensors: none may alias another call's), so every output is
  an array of its own and every update value is its target input's array or a fresh array
  (`fresh_results`: graphc.jit.compiler needs no overlap checks for them). A large output
  array the caller has dropped since (nothing references it) counts as fresh: it is reused
  instead of asking the kernel for new pages (`_outputs`). The one exception is DDP's
  `gradient_as_bucket_view=True`: those `.grad` outputs are views of the node's
  shared-memory window, the same arrays every call, as PyTorch's bucket views are
  (`_window_views`; a step that reads its `.grad`s is not given views: docs/distributed.md).
- The steady call (the last call's input arrays again, its large outputs dropped, as in a
  loop; or, in a training step, each large output's array of two calls ago dropped while the
  last call's is held as a `.grad`: the two alternate) is checked and run in one frame that
  rewrites no pointer but the new small outputs' and the alternated ones':
  written out for each executable (graphc.backends.cpu.steady_call: no loop, each check one
  comparison with a constant), `run_general`'s loops where there is none. After a short native
  run little of the Python is left in the caches, and every frame and C function it touches
  is a miss.
- BLAS: resolved once per process by graphc.backends.cpu.blas for graphs that call it; a
  graph with a matmul and no BLAS is refused with a GraphcError.

The backend is `graphc.backends.compile(graph, "cpu")` (graphc/backends/__init__.py imports
this module on first use, so importing graphc never loads llvmlite).

>>> import graphc, numpy as np
>>> from graphc.ir import parse
>>> g = parse('''graph @f(%x: f32[4], %b: f32[4]) -> (f32[4]) {
...   %0: f32[4] = add(%x, %b)
...   %1: f32[4] = relu(%0)
...   return (%1)
... }''')
>>> CpuExecutable(g).run(np.array([1, -2, 3, -4], np.float32), np.ones(4, np.float32))
[array([2., 0., 4., 0.], dtype=float32)]
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import itertools
import json
import operator
import sys
import threading
import time
import zlib

import llvmlite
import numpy as np
from llvmlite import binding as llvm_binding

from graphc import config
from graphc.backends.common import planned
from graphc.backends.cpu import llvm, threads, window_layout, workers
from graphc.backends.cpu.blas import resolve_blas
from graphc.backends.cpu.poison import poisoned
from graphc.backends.cpu.steady_call import compile_steady_call
from graphc.errors import ArgumentError, GraphcError, IndexOutOfRangeError
from graphc.ir.graph import Graph
from graphc.ir.parser import parse
from graphc.ir.printer import format_graph
from graphc.ir.verifier import verify
from graphc.ops.collective import COLLECTIVE_OPS, communicator
from graphc.ops.fused import FusedBody
from graphc.ops.registry import CONTRACTION, REGISTRY
from graphc.refcounts import COUNTS_ARE_EXACT

# A graph of this many scheduled nodes or more makes a module large enough to compile in
# parts (graphc.backends.cpu.workers.PARALLEL_MIN_CHARS): its workers are started before
# lowering. (LeNet-5's training step has 35 nodes, the GPT benchmark's 566.)
PARALLEL_MIN_NODES = 150


# An output array of this many bytes or more is reused once its caller has dropped it
# (CpuExecutable._outputs); smaller ones come back from malloc's own free lists anyway.
RECYCLE_MIN_BYTES = 1 << 16


# ---- the executable ------------------------------------------------------------------------
class CpuExecutable:
    """Executable of the "cpu" backend (see graphc.backends for the contract)."""

    backend = "cpu"
    fresh_results = True  # see the module docstring
    _steady = None  # `run`'s steady call, made by `_finish` (none for a subclass without it)
    _window_views: dict = {}  # _finish's (a subclass without it returns no window views)

    def __init__(self, graph: Graph, options: dict | None = None) -> None:
        self.graph = verify(graph)
        self._memory_plan = plan = planned(graph)
        raw = _allocate_arena(graph, plan.arena_bytes)  # before compiling: fail fast
        blas = resolve_blas() if any(_uses_gemm(n) for n in graph.nodes) else None
        # options["profile"]: the driver stamps the clock around every kernel (last_stamps)
        self.profiled = bool((options or {}).get("profile"))
        if len(plan.schedule) >= PARALLEL_MIN_NODES:
            workers.start()  # boots while the module is generated (graphc.backends.cpu.workers)
        self.lowered, _ = lower(graph, blas, profile=self.profiled)
        if self.lowered.arena_bytes > plan.arena_bytes:  # backend scratch past the plan's
            raw = _allocate_arena(graph, self.lowered.arena_bytes)
        touching = _touch_pages(raw)  # the arena's page faults overlap LLVM's work
        self.library = llvm.compile_module(self.lowered.ir_text, f"graphc_{graph.name}")
        if touching is not None:
            touching.join()
        self._finish(raw, plan.in_input, tuple(
            (n.op, n.attrs["op"], n.outputs[0].type.numel, n.outputs[0].type.dtype.name)
            for n in plan.schedule if n.op in COLLECTIVE_OPS))

    def _finish(self, raw: np.ndarray, in_input: dict[str, str], collectives: tuple) -> None:
        """Bind the compiled driver, the arena and the per-call tables (both constructors).
        `in_input`: the plan's update values computed straight into their input;
        `collectives`: what every rank checks it runs the same of, before each run."""
        graph = self.graph
        self._run = self.library.ctypes_function(
            "run", ctypes.c_int32, [ctypes.c_void_p] * (4 if self.profiled else 3))
        self.last_stamps = np.zeros(len(self.lowered.kernels) + 1, np.int64)
        skip = -raw.ctypes.data % 64
        self._arena = raw[skip:skip + self.lowered.arena_bytes]
        self._arena_ptr = ctypes.c_void_p(self._arena.ctypes.data)
        # the driver's arguments after the pointer tables, resolved once
        self._tail = (self._arena_ptr,) + (
            (ctypes.c_void_p(self.last_stamps.ctypes.data),) if self.profiled else ())
        self._raw = raw
        self._in_types = InputTypes([(v.type.shape, np.dtype(v.type.dtype.np))
                                     for v in graph.inputs])
        self._call_tables(in_input)
        self._out_types = output_types([(t.shape, np.dtype(t.dtype.np)) for t in self._copied])
        self._collectives = collectives
        # outputs returned as views of the node's shared-memory window (DDP's
        # gradient_as_bucket_view: window_layout.window_arrays), in place of fresh arrays;
        # each with its address, which never moves
        self._window_views = {k: (view, _address(view)) for k, view in window_layout.window_arrays(
            getattr(self.lowered, "window_outputs", {})).items()}
        for k in self._window_views:
            self._out_types[k] = ((0,), self._out_types[k][1], False)
        # (slot, shape, dtype) of the outputs kept for reuse, for `run`'s steady call (which
        # an executable with window views never takes)
        self._kept_slots = [(k, shape, dtype) for k, (shape, dtype, large)
                            in enumerate(self._out_types) if large]
        # the steady call written out for this executable (graphc.backends.cpu.steady_call)
        self._steady = self.write_steady_call()
        if config.poison():  # every run's outputs and arena poisoned first (cpu.poison)
            self._run = poisoned(self._run, self)

    def written_layout(self, tail: tuple) -> tuple[list, dict, int]:
        """For the driver's arguments after the pointer tables: the output types, the
        outputs that are window views and the arena's bytes (graphc.backends.cpu.poison)."""
        return self._out_types, self._window_views, self.lowered.arena_bytes

    def write_steady_call(self, sized=None):
        """This executable's steady call written out (graphc.backends.cpu.steady_call), or
        None; `sized`: a runtime-sized executable's one call size (runtime_sizes)."""
        return compile_steady_call(self, _address, _new_address, sized)

    def _call_tables(self, in_input: dict[str, str]) -> None:
        """What every call reads: which results are output arrays (`_copied`: their types)
        and which are inputs written in place (`_written`), in result order (`_results`);
        the pointer tables run() fills in place (an input array seen at the same position
        last call keeps its pointer: parameters, optimizer state), the outputs kept for
        reuse (`_outputs`), the lock calls take and the thread chooser."""
        graph = self.graph
        index = {v.name: i for i, v in enumerate(graph.inputs)}
        self._copied = [v.type for v in graph.outputs]
        self._results: list[tuple[str, int]] = [("out", k) for k in range(len(graph.outputs))]
        self._written = set()
        for _, v in graph.updates:
            if v.name in in_input:
                i = index[in_input[v.name]]
                self._results.append(("in", i))
                self._written.add(i)
            else:
                self._results.append(("out", len(self._copied)))
                self._copied.append(v.type)
        # per update: whether the run returns its target's own array (computed in place,
        # unless the input was copied), or a fresh one to write back (graphc.jit.call_plan)
        self.updates_in_place = tuple(kind == "in" for kind, _ in
                                      self._results[len(graph.outputs):])
        self._in_ptrs = (ctypes.c_void_p * max(len(graph.inputs), 1))()
        self._out_ptrs = (ctypes.c_void_p * max(len(self._copied), 1))()
        self._outputs_only = all(kind == "out" for kind, _ in self._results)
        self._pick_written = picker(sorted(self._written))
        # per output: its last two kept arrays with their addresses, newest first, as
        # (array, address) pairs replaced by one assignment (a Ctrl-C cannot part them)
        self._recent = [[(None, None), (None, None)] for _ in self._copied]
        self._last_inputs: list = [None] * len(graph.inputs)
        self._lock = threading.Lock()
        # whether the module forks OpenMP regions (or reads the count) itself: where it does
        # not, a call sets only the BLAS's count (`threads.use(n, openmp=False)`); and where
        # it calls no BLAS either, no count changes what it does: its calls run on one thread
        # with no chooser's bookkeeping (a short call's Python is most of it)
        self._reads_openmp = threads.reads_openmp_count(self.lowered.ir_text)
        parallel = self._reads_openmp or any(_uses_gemm(n) for n in graph.nodes)
        self.thread_chooser = threads.ThreadChooser(threads.most_threads() if parallel else 1)

    @property
    def memory_plan(self):
        """The graph's memory plan (planned again on first use by an executable that came
        from the pipeline cache: the plan's facts the run needs are in the entry)."""
        if self._memory_plan is None:
            self._memory_plan = planned(self.graph)
        return self._memory_plan

    # ---- the pipeline cache (graphc.backends.cache.PIPELINES) ---------------------------
    @staticmethod
    def toolchain(graph: Graph) -> str | None:
        """What the compiled code depends on besides graphc's source and the traced graph
        (the pipeline key's `toolchain`): the host target, llvmlite and LLVM, the most threads
        the kernels are built for (a kernel's split over the cores is decided when it is
        lowered: an executable compiled under `--threads 1` must not serve a two-thread
        process; `image_threads` follows from it and the BLAS, and is not read here because
        it changes once the BLAS is loaded), and the BLAS when the graph calls one; None for
        a graph this cache does not serve (collectives: their symbols are registered by the
        lowering, which a cached executable skips)."""
        if any(n.op in COLLECTIVE_OPS for n in graph.nodes):
            return None
        host = llvm.host_target()
        parts = [host.triple, host.cpu, host.features, llvmlite.__version__,
                 ".".join(map(str, llvm_binding.llvm_version_info)),
                 f"threads {threads.most_threads()}"]
        if any(_uses_gemm(n) for n in graph.nodes):
            blas = resolve_blas()
            parts.append(f"blas {blas.path} ilp64={blas.ilp64} gemv={bool(blas.sgemv)} "
                         f"core={blas.core}")  # the core: small_gemm.large_products
        return "\n".join(parts)

    def sections(self) -> dict[str, bytes] | None:
        """What a later process needs to make this executable without the passes and the
        lowering: the graph's text, the lowering's facts, the LLVM texts (compressed) and the
        key of the object code in llvm's own cache; None when there is nothing to reuse."""
        if self._collectives:
            return None
        plan, lowered, library = self.memory_plan, self.lowered, self.library
        position = {id(n): i for i, n in enumerate(self.graph.nodes)}
        facts = {"name": library.name, "in_input": plan.in_input,
                 "arena_bytes": lowered.arena_bytes, "kernels": lowered.kernels,
                 "errors": lowered.errors, "profiled": self.profiled,
                 "kernel_nodes": [None if n is None else position.get(id(n))
                                  for n in lowered.kernel_nodes],
                 "object_key": library.key, "level": library.level,
                 "aliases": library.aliases, "root_strides": plan.strides}
        same = library._ir_text == library.source_text
        return {"facts": json.dumps(facts).encode(),
                "graph": format_graph(self.graph).encode(),
                "llvm": zlib.compress(library.source_text.encode(), 1),
                "deduplicated": b"" if same else zlib.compress(library._ir_text.encode(), 1)}

    @classmethod
    def from_sections(cls, sections: dict[str, bytes]) -> CpuExecutable:
        """The executable `sections()` described, its object code from llvm's cache (or
        compiled again from the stored LLVM text when that entry is gone). Raises
        ValueError or GraphcError for an entry that does not hold together. The arena is
        allocated first and a large one's pages are touched on a second thread while the
        graph is parsed and verified (`_touch_pages`), so the first run does not pay them."""
        self = object.__new__(cls)
        try:
            facts = json.loads(sections["facts"])
            arena_bytes = facts["arena_bytes"]
        except (KeyError, TypeError, UnicodeDecodeError) as err:
            raise ValueError(f"a pipeline cache entry that does not hold together: "
                             f"{err}") from None
        if type(arena_bytes) is not int or arena_bytes < 0:
            raise ValueError(f"a pipeline cache entry that does not hold together: arena of "
                             f"{arena_bytes!r} bytes")
        raw = _early_arena(arena_bytes)
        touching = None if raw is None else _touch_pages(raw)
        try:
            try:
                graph = parse(sections["graph"].decode())
                source = zlib.decompress(sections["llvm"]).decode()
                text = zlib.decompress(sections["deduplicated"]).decode() \
                    if sections["deduplicated"] else source
            except (KeyError, UnicodeDecodeError, zlib.error) as err:
                raise ValueError(f"a pipeline cache entry that does not hold together: "
                                 f"{err}") from None
            self.graph = verify(graph)
            # the layouts the passes chose (graphc.passes.gemm_output_layout), for a plan made
            # again on demand (memory_plan) to match the stored code
            graph.meta["root_strides"] = {name: tuple(strides) for name, strides in
                                          facts.get("root_strides", {}).items()}
            self._memory_plan = None
            self.profiled = bool(facts["profiled"])
            if any(_uses_gemm(n) for n in graph.nodes):
                resolve_blas()  # registers the BLAS symbols the objects call
            if raw is None:  # could not be allocated: the error names the largest buffer
                raw = _allocate_arena(graph, arena_bytes)
            self.lowered = _StoredLowering(source, facts, graph)
            self.library = _stored_library(facts, text, source)
        finally:
            if touching is not None:
                touching.join()  # before any run writes the arena
        self._finish(raw, facts["in_input"], ())
        return self

    @property
    def asm(self) -> str:
        return self.library.asm

    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        steady = self._steady
        if steady is not None:  # the same call, written out for this executable
            return steady(self, arrays)
        return self.run_general(arrays)

    def run_general(self, arrays: tuple) -> list[np.ndarray]:
        """`run` by the generic loops (what `_steady`, when there is one, does unrolled)."""
        types = self._in_types
        if len(arrays) != types.count:
            raise ArgumentError(f"graph @{self.graph.name} takes {types.count} inputs, "
                                f"got {len(arrays)}")
        if self._collectives:
            communicator().agree(f"graph @{self.graph.name}", self._collectives)
        with self._lock:  # the pointer arrays and the arena are shared by every call
            # The steady call in one frame: the same input arrays as last call, unchanged,
            # every large output a kept array the caller has dropped. What `_bind` and
            # `_outputs` would find then, checked in a few C loops; the pointer tables
            # already hold every address but the new small outputs'. Written for few cache
            # misses as much as for few instructions: after a native run of a fraction of a
            # millisecond (SGEMM 256) little of this Python is left in the caches, and each
            # frame, C function and object the call touches costs a trip to memory
            # (docs/performance.md, "SGEMM 256"). An output whose last array is still held
            # (a `.grad` until the next step replaces it) takes the array of two calls ago,
            # as `_outputs` would; anything else takes `_call` (the inputs found bound when
            # both of an output's arrays are held).
            if COUNTS_ARE_EXACT and all(map(operator.is_, arrays, self._last_inputs)) \
                    and tuple(map(_SHAPE, arrays)) == types.shapes \
                    and all(map(operator.is_, map(_DTYPE, arrays), types.dtypes)) \
                    and (not self._written or all(map(_WRITEABLE, self._pick_written(arrays)))) \
                    and not self._window_views:
                recent, ptrs = self._recent, self._out_ptrs
                for k, shape, dtype in self._kept_slots:
                    kept = recent[k]
                    out = kept[0][0]  # the last call's (`_out_ptrs[k]` its address)
                    # nothing else holds it: its pair in `recent[k]`, `out`, getrefcount's argument
                    if out is None or sys.getrefcount(out) != 3 or out.shape != shape \
                            or out.dtype is not dtype:
                        # a training step holds the last call's (a `.grad`): the array of
                        # two calls ago goes back, as `_outputs` picks it
                        older = kept[1]
                        out = older[0]
                        if out is None or sys.getrefcount(out) != 3 or out.shape != shape \
                                or out.dtype is not dtype:
                            out = None  # `_outputs` counts references: one more
                            return self._call(arrays, self._out_types, self._tail, arrays)
                        recent[k] = [older, kept[0]]
                        ptrs[k] = older[1]
                outs = []
                for k, (shape, dtype, large) in enumerate(self._out_types):
                    if large:
                        outs.append(recent[k][0][0])
                    else:  # new, as in `_outputs`
                        out = np.empty(shape, dtype)
                        ptrs[k] = _new_address(out) if out.size else _address(out)
                        outs.append(out)
                status = self._run(self._in_ptrs, ptrs, *self._tail) \
                    if self.thread_chooser.most == 1 else self._native(self._tail)
                if status:
                    self._failed(status)
                if self._outputs_only:
                    return outs
                return [outs[k] if kind == "out" else arrays[k] for kind, k in self._results]
            return self._call(arrays, self._out_types, self._tail)

    def _call(self, arrays: tuple, out_types: list, tail: tuple,
              bound: tuple | None = None) -> list[np.ndarray]:
        """One call under the lock: the inputs bound (unless `run` found them bound: `bound`),
        the outputs made (`_outputs`), the native driver run on the thread count the chooser
        picks; the results."""
        if bound is None:
            bound = self._bind(arrays)
        outs = self._outputs(out_types)
        for k, (view, address) in self._window_views.items():
            outs[k] = view
            self._out_ptrs[k] = address
        status = self._native(tail)
        if status:
            self._failed(status)
        if self._outputs_only:
            return outs
        return [outs[k] if kind == "out" else bound[k] for kind, k in self._results]

    def _native(self, tail: tuple) -> int:
        """Run the native driver on the thread count the chooser picks; its status."""
        chooser = self.thread_chooser
        if chooser.explores:  # its bookkeeping only where it chooses
            n = chooser.pick()
            changed = threads.use(n, self._reads_openmp)
            try:  # the user's thread counts come back whatever happens
                start = time.perf_counter()
                status = self._run(self._in_ptrs, self._out_ptrs, *tail)
                chooser.record(n, time.perf_counter() - start)
            finally:
                if changed is not None:
                    threads.restore(changed)
        elif chooser.most > 1:  # a fixed count, still applied to this thread
            changed = threads.use(chooser.current, self._reads_openmp)
            try:
                status = self._run(self._in_ptrs, self._out_ptrs, *tail)
            finally:
                if changed is not None:
                    threads.restore(changed)
        else:
            status = self._run(self._in_ptrs, self._out_ptrs, *tail)
        return status

    def _failed(self, status: int) -> None:
        """Raise the error the driver's nonzero `status` stands for."""
        errors = self.lowered.errors
        what = errors[status - 1] if 0 < status <= len(errors) else f"status {status}"
        raise IndexOutOfRangeError(f"cpu backend: graph @{self.graph.name} failed: {what}")

    def _outputs(self, out_types: list) -> list[np.ndarray]:
        """This call's output arrays, their addresses written into `_out_ptrs`: per slot, an
        array this executable returned in one of its last two calls that nothing references
        any more (the user dropped it, e.g. the .grad it became was replaced), else a new one.
        Only arrays of RECYCLE_MIN_BYTES or more are kept (`out_types`' third field): a new
        large array is fresh pages from the kernel, and their page faults cost more than the
        work of an elementwise pass over them (docs/performance.md). A kept array's address is
        kept with it (an array's data never moves)."""
        outs = []
        ptrs, recent = self._out_ptrs, self._recent
        for k, (shape, dtype, large) in enumerate(out_types):
            if not large:
                out = np.empty(shape, dtype)
                ptrs[k] = _new_address(out) if out.size else _address(out)
                outs.append(out)
                continue
            kept = recent[k]
            j = _unreferenced(kept, shape, dtype)
            if j is None:  # the oldest goes
                out = np.empty(shape, dtype)
                address = _address(out)
                recent[k] = [(out, address), kept[0]]
            else:
                out, address = kept[j]
                recent[k] = [kept[j], kept[1 - j]]
            ptrs[k] = address
            outs.append(out)
        return outs

    def _bind(self, arrays: tuple) -> list[np.ndarray] | tuple:
        """Check the inputs and point `_in_ptrs` at them; returns the arrays the call reads
        (an input copied when it is non-contiguous, or read-only and written). Called under
        the lock. Every input's shape and dtype, and every written input's writeable flag,
        are checked each call, at once; an array that was at its position last call keeps its
        pointer (an array's data never moves), any other is checked for contiguity and
        pointed at (`_bind_each` does it all one input at a time, and says what is wrong)."""
        types = self._in_types
        try:
            same = tuple(map(_SHAPE, arrays)) == types.shapes and all(
                map(operator.is_, map(_DTYPE, arrays), types.dtypes)) and all(
                map(_WRITEABLE, self._pick_written(arrays)))
        except AttributeError:  # not arrays: np.asarray below
            same = False
        if not same:
            return self._bind_each(arrays)
        last, ptrs = self._last_inputs, self._in_ptrs
        for i in itertools.compress(range(len(arrays)), map(operator.is_not, arrays, last)):
            a = arrays[i]
            if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
                return self._bind_each(arrays)
            last[i] = a
            ptrs[i] = _address(a)
        return arrays

    def _bind_each(self, arrays: tuple) -> list[np.ndarray]:
        """`_bind` one input at a time: converts, copies and explains."""
        bound = list(arrays)
        last, written = self._last_inputs, self._written
        for i, (a, (shape, dtype)) in enumerate(zip(arrays, self._in_types.pairs)):
            if a is last[i] and a.shape == shape and a.dtype is dtype and (
                    i not in written or a.flags.writeable):
                continue
            a = np.asarray(a)
            if a.shape != shape or a.dtype != dtype:
                v = self.graph.inputs[i]
                raise ArgumentError(f"graph @{self.graph.name}: input %{v.name} expects "
                                    f"{v.type}, got {a.dtype}{list(a.shape)}")
            if not a.flags.c_contiguous or (i in written and not a.flags.writeable):
                a = np.ascontiguousarray(a).copy()
                last[i] = None  # a copy: the next call copies again
            else:
                last[i] = a
            bound[i] = a
            self._in_ptrs[i] = _address(a)
        return bound


class InputTypes:
    """The input types a call checks, as `_bind` reads them: every shape in one tuple, every
    dtype in another, and the (shape, dtype) pairs."""

    __slots__ = ("pairs", "shapes", "dtypes", "count")

    def __init__(self, pairs: list[tuple[tuple, np.dtype]]) -> None:
        self.pairs = pairs
        self.shapes = tuple(shape for shape, _ in pairs)
        self.dtypes = tuple(dtype for _, dtype in pairs)
        self.count = len(pairs)


def output_types(types: list[tuple[tuple, np.dtype]]) -> list[tuple[tuple, np.dtype, bool]]:
    """(shape, dtype, whether an array of it is kept for reuse) per output (`_outputs`)."""
    return [(shape, dtype, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
             >= RECYCLE_MIN_BYTES) for shape, dtype in types]


def _unreferenced(kept: list, shape: tuple, dtype: np.dtype) -> int | None:
    """The position in `kept` ((array, address) pairs) of an array of this type nothing else
    references, or None (always where reference counts cannot tell: graphc.refcounts)."""
    if not COUNTS_ARE_EXACT:
        return None
    for j, (array, _) in enumerate(kept):
        # references to an unused one: its pair, `array` and getrefcount's argument
        if array is not None and sys.getrefcount(array) == 3 and \
                array.shape == shape and array.dtype is dtype:
            return j
    return None


def picker(indices: list[int]):
    """A function from a sequence to the tuple of its items at `indices` (itemgetter, which
    returns a bare item for one index, made to return a tuple always)."""
    if len(indices) == 1:
        return functools.partial(_one_item, indices[0])
    if not indices:
        return _no_items
    return operator.itemgetter(*indices)


def _one_item(i: int, items) -> tuple:
    return (items[i],)


def _no_items(items) -> tuple:
    return ()


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_WRITEABLE = operator.attrgetter("flags.writeable")


def lower(graph: Graph, blas=None, profile: bool = False):
    """graphc.backends.cpu.codegen.lower, imported on first use: an executable from the
    pipeline cache never lowers, so its process does not load the code generator."""
    from graphc.backends.cpu.codegen import lower as lower_graph

    return lower_graph(graph, blas, profile=profile)


class ArenaAllocationError(GraphcError, MemoryError):
    """The arena of a compiled graph does not fit in memory."""


class _StoredLowering:
    """What `lower` made, as a pipeline cache entry keeps it (codegen.Lowered's fields; the
    module text and the kernels' nodes are recovered on first use)."""

    def __init__(self, source: str, facts: dict, graph: Graph) -> None:
        self.ir_text = source
        self.arena_bytes = int(facts["arena_bytes"])
        self.kernels = list(facts["kernels"])
        self.errors = list(facts["errors"])
        self._kernel_nodes = facts["kernel_nodes"]
        self._graph = graph

    @property
    def kernel_nodes(self) -> list:
        nodes = self._graph.nodes
        return [None if i is None else nodes[i] for i in self._kernel_nodes]


def _stored_library(facts: dict, text: str, source: str) -> llvm.Library:
    """The Library of a pipeline cache entry: its objects from llvm's object cache under the
    stored key, or, when that entry is gone or bad, compiled again from the stored text."""
    payload = llvm.OBJECT_CACHE.read(facts["object_key"])
    if payload is None:
        return llvm.compile_module(source, facts["name"])
    llvm.OBJECT_CACHE.count("hits")
    return llvm.Library(facts["name"], text, llvm.unpack_objects(payload),
                        key=facts["object_key"], from_cache=True, aliases=facts["aliases"],
                        source_text=source, level=facts["level"])


# An arena this large is touched page by page on a second thread while LLVM compiles: its
# first use otherwise pays every page fault inside the first call (numpy asks for huge pages
# for large arrays, and a huge-page fault may compact memory first: ResNet-18's 198 MB arena
# took 0.3-0.45 s more in its first run than in later ones on a 2-core VM).
TOUCH_MIN_BYTES = 16 << 20


def _touch_pages(raw: np.ndarray) -> threading.Thread | None:
    """Start writing one byte per 4 KiB page of `raw` on a daemon thread (numpy drops the
    GIL for the strided assignment), or None for an arena too small to matter."""
    if raw.nbytes < TOUCH_MIN_BYTES:
        return None
    thread = threading.Thread(target=raw[::4096].fill, args=(0,), name="graphc-arena-touch",
                              daemon=True)
    thread.start()
    return thread


def _early_arena(nbytes: int) -> np.ndarray | None:
    """The arena's bytes (+64 for alignment) before the graph is read, or None when they
    cannot be allocated (`_allocate_arena` then says why, with the graph)."""
    try:
        return np.empty(nbytes + 64, np.uint8)
    except (MemoryError, ValueError):
        return None


def _allocate_arena(graph: Graph, nbytes: int) -> np.ndarray:
    """The arena's bytes (+64 for alignment), or an ArenaAllocationError naming the bytes
    requested and the largest buffer's node and source line."""
    try:
        return np.empty(nbytes + 64, np.uint8)
    except (MemoryError, ValueError):
        pass
    plan = planned(graph)
    biggest = max(plan.buffers.values(), key=lambda b: b.size, default=None)
    node = next((n for n in graph.nodes if biggest is not None
                 and any(v.name == biggest.name for v in n.outputs)), None)
    what = ""
    if node is not None:
        where = f" at {node.loc}" if node.loc else ""
        what = (f"; the largest buffer is %{biggest.name} ({biggest.size:,} bytes), made by "
                f"{node.op}{where}")
    raise ArenaAllocationError(
        f"cpu backend: graph @{graph.name} needs an arena of {nbytes:,} bytes, which cannot "
        f"be allocated{what}; use smaller tensors (e.g. a smaller batch) or free memory")


def _address(a: np.ndarray) -> int:
    """The data address of a contiguous array (`ctypes.c_char.from_buffer` takes a quarter of
    the time of `a.ctypes.data`, but wants a writeable buffer)."""
    if a.flags.writeable and a.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    return a.ctypes.data


def _new_address(a: np.ndarray) -> int:
    """`_address` of an array np.empty just made, with at least one element: writeable, so
    the buffer protocol gives its address without asking its flags."""
    return ctypes.addressof(ctypes.c_char.from_buffer(a))


def _uses_gemm(node) -> bool:
    """Whether the node's lowering may call BLAS (so BLAS is resolved once for the module):
    a CONTRACTION op (matmul, conv2d and its gradients), alone or anchoring a fused body."""
    if node.op == "fused":
        anchor = FusedBody.of_node(node).anchor
        return anchor is not None and REGISTRY[anchor.op].kind == CONTRACTION
    return node.op in REGISTRY and REGISTRY[node.op].kind == CONTRACTION
