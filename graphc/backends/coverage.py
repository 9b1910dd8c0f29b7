"""coverage: how each backend handles every registry op, from its lowering tables.

`coverage(backend)` maps every registry op to "lowered" (an entry of the backend's
`LOWERINGS`), "scalar <name>" (an elementwise op rendered through the backend's
`SCALAR_LOWERINGS`), "refused: <reason>" (declared in its `REFUSALS`) or "missing".
tests/test_lowering_tables.py fails on "missing"; `python -m graphc.ops` shows one column
per backend. Importing a backend's tables loads that backend (llvmlite for cpu), which is why
this module is imported only by those two.
"""

from __future__ import annotations

import importlib

from graphc.backends.common import coverage as table_coverage

# backend name -> (module with LOWERINGS and REFUSALS, module with SCALAR_LOWERINGS)
TABLES = {
    "cpu": ("graphc.backends.cpu.codegen", "graphc.backends.cpu.scalars"),
    "cuda": ("graphc.backends.cuda.ops", "graphc.backends.cuda.cudagen"),
}


def coverage(backend: str) -> dict[str, str]:
    """How `backend` ("cpu" or "cuda") handles each registry op (see the module docstring)."""
    ops_module, scalar_module = (importlib.import_module(name) for name in TABLES[backend])
    return table_coverage(ops_module.LOWERINGS, scalar_module.SCALAR_LOWERINGS,
                          ops_module.REFUSALS)


__all__ = ["TABLES", "coverage"]
