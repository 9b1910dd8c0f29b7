"""pipeline: from a traced graph to an executable, as graphc.compile's first call runs it.

- `compiled(graph, passes, backend)`: (executable, pipeline report), from the pipeline cache
  (graphc.jit.pipeline_cache: no passes, no lowering) or made by the passes and the backend
  and kept there for the next process;
- `optimize` (the passes) and `backend_compile` (the backend) run in the trace ShapeEnv's
  structural mode where the trace is symbolic (`structural`, `symbolic`);
- `collector_paused`: Python's cyclic garbage collector off while a call traces and compiles.
"""

from __future__ import annotations

import contextlib
import gc

from graphc.backends import compile as compile_graph
from graphc.jit import pipeline_cache
from graphc.jit.bindings import TraceResult
from graphc.passes import run_pipeline
from graphc.symbolic import current_env

__all__ = ["backend_compile", "collector_paused", "compiled", "optimize", "structural",
           "symbolic"]


def optimize(graph, passes, **options):
    """run_pipeline, where a symbolic trace's passes answer an equality between sizes that
    the trace never asked structurally (the same expression or not) instead of guarding it:
    a pass asks such things to decide an optimisation (fuse these? is this the identity?),
    not because the graph needs them (graphc.symbolic.ShapeEnv.structural)."""
    with structural():
        return run_pipeline(graph, passes, **options)


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a call traces and compiles: tracing makes
    many objects at once, which set off full collections over the whole heap (15-65 ms in a
    warm first call, a fifth of it); nothing is lost, cycles made meanwhile wait for the next
    collection. A nested first call (a compiled function called while another traces)
    leaves it to the outer one."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def backend_compile(graph, backend: str):
    with structural():
        return compile_graph(graph, backend)


def compiled(graph, passes, backend: str, dump_prefix: str | None = None):
    """(executable, pipeline report) of a traced graph: what an earlier process made of it,
    from the pipeline cache (graphc.jit.pipeline_cache: no passes, no lowering), else the
    passes and the backend, kept in that cache for the next process."""
    key = pipeline_cache.key_of(graph, passes, backend)
    if key is None:
        optimized, report = optimize(graph, passes, verify=True, dump_prefix=dump_prefix)
        return backend_compile(optimized, backend), report
    with pipeline_cache.lock(key):  # one compile of a key at a time in this process
        found = pipeline_cache.lookup(key, backend)
        if found is not None:
            return found
        optimized, report = optimize(graph, passes, verify=True, dump_prefix=dump_prefix)
        executable = backend_compile(optimized, backend)
        pipeline_cache.store(key, executable, report)
    return executable, report


def structural():
    env = current_env()
    return env.structural() if env is not None else contextlib.nullcontext()


def symbolic(traced: TraceResult):
    """The trace's ShapeEnv, active (for the passes and the backend over its graph), or a
    no-op for a static trace."""
    return traced.shape_env.active() if traced.shape_env is not None \
        else contextlib.nullcontext()
