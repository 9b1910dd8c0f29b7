"""Differential check of one fuzz program: eager, interpreter, passes and backends against a
float64 reference (`check_program`), with a `.gir` + `.npz` repro on any mismatch.

For a program (tests/fuzz/program.py) the harness:
1. draws input values (up to `ATTEMPTS` seeds) until the float64 reference is
   well-conditioned (tests/fuzz/margins.py); otherwise the case is rejected (`reject()`);
2. traces the program (with `grads`, a wrapper that also returns `graphc.autograd.grad` of
   the floating outputs summed against fixed projections, numpy seed 0, as graphc.testing
   does) in the program's precision: the tracing run is the eager result;
3. runs the traced graph on the interpreter, then the default pipeline
   (simplify, fuse, plan_buffers, verified after each pass) and the optimised graph on the
   interpreter and on each backend;
4. compares every output with graphc.testing's `compare` and `tolerance` (float32 rtol 1e-4,
   atol 1e-5 x max(1, max|ref|); float64 1e-10; integers and bools exactly) against the
   float64 reference: the same program traced on float64 copies of the inputs and run on the
   interpreter.

On a mismatch or an unexpected exception it writes the graph that failed (the traced graph
for eager/interpreter, the optimised one for passes and backends), its inputs and the
reference outputs (`<stem>.gir`, `<stem>.npz`, `<stem>.expected.npz`) under one temporary
directory per process, bisects a backend mismatch to its first divergent node
(graphc.testing.repro), and raises `FuzzMismatch` with the program's source, the numbers and the
`graphc run` command. A backend that does not lower an op the graph uses (CpuLoweringError
for an op of `unlowered_ops()`; CudaLoweringError, as the CUDA backend is being written) is
skipped for that case and counted in `STATS`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections import Counter

import numpy as np
from hypothesis import reject

import graphc
from graphc.backends import compile as compile_graph
from graphc.ir.interpreter import Interpreter
from graphc.jit.bindings import ArgBinding, ConstantBinding
from graphc.jit.tracer import trace_call
from graphc.passes import default_passes, run_pipeline
from graphc.testing import compare, tolerance
from graphc.testing.repro import first_divergent_node, record_values, save_repro, write_node_repro
from tests.fuzz.margins import ill_conditioned
from tests.fuzz.program import Program

ATTEMPTS = 3
STATS: Counter = Counter()  # graphs, runs per backend, skips, rejections (this process)
# CpuLoweringError messages of forms the CPU backend refuses on purpose (a clear error, not a
# wrong number): the case is skipped on that backend and counted (none today: nll_loss over
# (N, C, d1, ...) is lowered now)
KNOWN_REFUSALS: tuple[str, ...] = ()
_INDEX_OPS = ("pad", "flip", "argmax", "argmin", "gather", "take", "index_add", "index_put",
              "scatter_add", "embedding", "embedding_backward", "slice_scatter")


class FuzzMismatch(AssertionError):
    """A run of a fuzz program differs from the float64 reference (or crashed)."""


def unlowered_ops(backend: str) -> set[str]:
    """Ops the backend's docstring says it does not lower yet (the CPU backend's index ops
    until graphc.backends.cpu.index_ops lists them)."""
    if backend != "cpu":
        return set()
    from graphc.backends.cpu.index_ops import INDEX_OPS

    return set(_INDEX_OPS) - set(INDEX_OPS)


@functools.lru_cache(maxsize=1)
def repro_root() -> str:
    return tempfile.mkdtemp(prefix="graphc-fuzz-")


def with_grads(fn):
    """`fn` followed by the gradients of its floating outputs, projected, w.r.t. its floating
    inputs (the ones that require grad)."""

    def program_grads(*inputs):
        outs = fn(*inputs)
        floating = [o for o in outs if o.is_floating_point() and o.requires_grad]
        wrt = [x for x in inputs if x.requires_grad]
        if not floating or not wrt:
            return outs
        rng = np.random.default_rng(0)
        terms = [(o * graphc.from_numpy(rng.standard_normal(o.shape).astype(o.dtype.np))).sum()
                 for o in floating]
        loss = functools.reduce(lambda a, b: a + b, terms)
        grads = graphc.autograd.grad(loss, wrt, allow_unused=True)
        return tuple(outs) + tuple(g for g in grads if g is not None)

    return program_grads


def _trace(program: Program, arrays: list[np.ndarray], float_dtype: str):
    fn = program.function(float_dtype)
    tensors = [graphc.tensor(a) for a in arrays]
    if program.grads:
        fn = with_grads(fn)
        for t in tensors:
            if t.is_floating_point():
                t.requires_grad_(True)
    traced = trace_call(fn, tuple(tensors), name="program", abstract=False)  # eager values
    inputs = [np.array(arrays[b.path[1]]) if isinstance(b, ArgBinding) else
              np.array(b.array) if isinstance(b, ConstantBinding) else None
              for b in traced.bindings]
    if any(a is None for a in inputs):
        raise FuzzMismatch(f"fuzz: the trace of\n{program.describe()}binds an input that is "
                           f"neither an argument nor a constant: {traced.bindings}")
    return traced, inputs


def _reference(program: Program):
    """(arrays in the program's precision, float64 graph outputs) for the first seed whose
    reference is well-conditioned; rejects the case when none is."""
    reason = None
    for attempt in range(ATTEMPTS):
        arrays = program.input_arrays(program.seed + attempt)
        wide = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays]
        traced, inputs = _trace(program, wide, "float64")
        values = record_values(traced.graph, inputs)
        reason = ill_conditioned(traced.graph, values)
        if reason is None:
            return arrays, [values[v.name] for v in traced.graph.outputs]
    STATS["rejected"] += 1
    reject()  # every seed puts a decision on a tie or a value out of range: `reason`
    raise AssertionError(reason)  # not reached: reject() raises


def check_program(program: Program, backends=("cpu",)) -> list[str]:
    """Check one program (see the module docstring); returns the runs compared."""
    arrays, ref = _reference(program)
    traced, inputs = _trace(program, arrays, program.float_dtype)
    graph = traced.graph
    if len(graph.outputs) != len(ref):
        raise FuzzMismatch(f"fuzz: the {program.float_dtype} trace has {len(graph.outputs)} "
                           f"outputs, the float64 one {len(ref)}:\n{program.describe()}")
    eager = [np.array(t._data) for t in _flat(traced.result)]
    _compare(program, "eager", eager, ref, graph, inputs)
    _compare(program, "interp", Interpreter(graph).run(*inputs), ref, graph, inputs)
    runs = ["eager", "interp"]
    optimised = _guarded(program, "passes", graph, inputs, ref,
                         lambda: run_pipeline(graph, default_passes())[0])
    _compare(program, "interp after passes", Interpreter(optimised).run(*inputs), ref,
             optimised, inputs)
    for backend in backends:
        skip = unlowered_ops(backend) & {n.op for n in optimised.nodes}
        try:
            executable = compile_graph(optimised, backend)
        except Exception as err:  # noqa: BLE001 - any compile failure is reported
            if type(err).__name__ == "CpuLoweringError":
                known = [k for k in KNOWN_REFUSALS if k in str(err)]
                if skip or known:
                    STATS[f"{backend} skipped: {'/'.join(sorted(skip) + known)}"] += 1
                    continue
            if type(err).__name__ == "CudaLoweringError":  # a backend still being written
                STATS[f"{backend} refused: {str(err).split(' (node')[0]}"] += 1
                continue
            _fail(program, backend, optimised, inputs, ref, f"compile raised {err!r}")
        got = _guarded(program, backend, optimised, inputs, ref,
                       lambda: executable.run(*(a.copy() for a in inputs)))
        _compare(program, backend, got, ref, optimised, inputs)
        runs.append(backend)
        STATS[backend] += 1
    STATS["graphs"] += 1
    return runs


def _flat(result) -> list:
    """The tensors of a program's result as the trace numbers its outputs: each tensor once
    (a gradient shared by two inputs is one output)."""
    if not isinstance(result, (tuple, list)):
        return [result]
    return list({id(t): t for r in result for t in _flat(r)}.values())


def _guarded(program, run, graph, inputs, ref, action):
    try:
        return action()
    except FuzzMismatch:
        raise
    except Exception as err:  # noqa: BLE001 - any exception on a valid program is a bug
        _fail(program, run, graph, inputs, ref, f"raised {err!r}")


def _compare(program: Program, run: str, got, ref, graph, inputs) -> None:
    for k, (g, r, v) in enumerate(zip(got, ref, graph.outputs)):
        rtol, atol = tolerance(v.type.dtype.name)
        err = compare(np.asarray(g), r.astype(v.type.dtype.np) if r.dtype.kind != "f" else r,
                      rtol, atol)
        if err is not None:
            _fail(program, run, graph, inputs, ref,
                  f"output {k} (%{v.name}: {v.type}) differs from the float64 reference: max "
                  f"abs error {err[0]:.3g}, max rel error {err[1]:.3g}, {err[2]} elements off "
                  f"(rtol={rtol:g}, atol={atol:g} x max(1, max|ref|))\n  got:      "
                  f"{_short(g)}\n  expected: {_short(r)}")


def _short(a) -> str:
    return np.array2string(np.asarray(a).ravel()[:8], precision=6, separator=", ")


def _fail(program: Program, run: str, graph, inputs, ref, what: str):
    digest = hashlib.sha1(program.describe().encode()).hexdigest()[:10]
    stem = os.path.join(repro_root(), f"{run.replace(' ', '_')}_{digest}")
    gir, npz = save_repro(graph, inputs, stem)
    np.savez(stem + ".expected.npz", *ref)
    backend = run if run not in ("eager", "interp", "interp after passes", "passes") else "interp"
    message = (f"fuzz: {run} on @{graph.name}: {what}\nProgram ({program.float_dtype}, "
               f"grads={program.grads}):\n{program.describe()}Repro (graph, inputs, float64 "
               f"reference outputs in {stem}.expected.npz):\n  graphc run {gir} --inputs {npz}"
               f" --backend {backend}\n")
    if backend != "interp":
        message += _bisect(graph, inputs, backend, stem)
    raise FuzzMismatch(message)


def _bisect(graph, inputs, backend: str, stem: str) -> str:
    def differs(value, got, expected):
        return compare(got, expected, *tolerance(value.type.dtype.name))

    try:
        values = record_values(graph, inputs)
        found = first_divergent_node(graph, backend, values, differs)
        if found is None:
            return "No single node diverges from the interpreter: only the whole graph does.\n"
        gir, npz, _ = write_node_repro(graph, found[0], backend, values, differs, stem)
    except Exception as err:  # noqa: BLE001 - the bisection is a courtesy; say why it stopped
        return f"(bisection stopped: {err!r})\n"
    return (f"First divergent node under {backend}: {graph.nodes[found[0]].op} (node "
            f"{found[0]}); its repro:\n  graphc run {gir} --inputs {npz} --backend {backend}\n")
