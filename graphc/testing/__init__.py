"""graphc.testing: check compiled results against eager graphc and the interpreter.

- `comparison`: `assert_compiled_matches(fn, *inputs, backends=..., grads=True)` traces a
  function once and compares eager, the interpreter and every named backend with a float64
  reference (`compare`, `tolerance`); a backend's mismatch is bisected to its first divergent
  node and written as a repro.
- `rounding`: `assert_rounding_within(got, eager, reference)`, the criterion for rewrites
  that reassociate float arithmetic: compiled no further than 2x eager's distance from a
  float64 run.
- `repro`: standalone repros (`.gir` text plus an `.npz` of inputs), `save_repro`,
  `load_repro`, `run_repro`, and the bisection (`first_divergent_node`).

This package sits above the backends (it runs them); nothing in ops, ir, passes or backends
imports it.

>>> import graphc
>>> from graphc.testing import assert_compiled_matches
>>> assert_compiled_matches(lambda x: (x * 2).relu(), graphc.tensor([-1.0, 3.0]))
"""

from graphc.testing.comparison import (
    DEFAULT_TOLERANCES,
    CompiledMismatch,
    assert_compiled_matches,
    compare,
    tolerance,
)
from graphc.testing.repro import (
    first_divergent_node,
    load_repro,
    record_values,
    run_repro,
    save_repro,
    write_node_repro,
)
from graphc.testing.rounding import assert_rounding_within, rounding_distance

__all__ = [
    "DEFAULT_TOLERANCES", "CompiledMismatch", "assert_compiled_matches",
    "assert_rounding_within", "compare", "first_divergent_node", "load_repro", "record_values",
    "rounding_distance", "run_repro", "save_repro", "tolerance", "write_node_repro",
]
