"""graphc.jit: trace a call into the IR, and compile it into a callable that runs it again.

The modules, from the bottom up (each imports only those before it):
- `pytree`: the tensors in nested tuples, lists and dicts (paths, flatten, unflatten);
- `reach`: the one walker of what a call can reach (captured roots, modules, optimizers,
  `.grad` holders), used by tracing and by the guards alike;
- `bindings`: what feeds each graph input (`ArgBinding`, `TensorBinding`, ...) and
  `TraceResult`;
- `tracer`: the `Tracer` that dispatch reports every op to, `trace_call` and `graphc.trace`;
- `autodiff`: the engine of `graphc.passes.autodiff.derive_backward` (eager autograd traced
  abstractly), installed into that pass when this package is imported;
- `signature`: the signature of a call (what executables are keyed by) and its diff;
- `dict_versions`: CPython 3.11's dict version tags, read many at once;
- `guards`: the fast path's cheap checks that imply a call's signature is unchanged;
- `compiled_autograd`: the forward/backward split of a graph whose outputs need a grad_fn;
- `nan_check`: `GRAPHC_CHECK_NANS`, the first node that made a NaN or an Inf;
- `compiler`: `graphc.compile`, the compiled callable (`Compiled`);
- `dump`: `graphc.dump`, the IR text of a graph, a compiled callable or a traced function.

`graphc.compile`, `graphc.trace` and `graphc.dump` are the public entry points; this package
sits above the front end, ops, IR, passes and backends, and nothing below it imports it.

>>> import graphc
>>> f = graphc.compile(lambda x: (x * 2).relu(), backend="interp")
>>> f(graphc.tensor([-1.0, 3.0]))
tensor([0., 6.])
"""

from graphc.jit import autodiff as _autodiff  # noqa: F401  (installs derive_backward's engine)
from graphc.jit.bindings import (
    ArgBinding,
    ConstantBinding,
    GradBinding,
    GradOutput,
    RngBinding,
    TensorBinding,
    TraceResult,
)
from graphc.jit.compiler import (
    Compiled,
    ConstraintViolationError,
    RecompileLimitError,
    compile,
    mark_dynamic,
)
from graphc.jit.tracer import Tracer, trace, trace_call

__all__ = [
    "ArgBinding", "Compiled", "ConstantBinding", "ConstraintViolationError", "GradBinding",
    "GradOutput", "RecompileLimitError", "RngBinding", "TensorBinding", "TraceResult", "Tracer",
    "compile", "mark_dynamic", "trace", "trace_call",
]
