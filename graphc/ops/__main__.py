"""`python -m graphc.ops [--markdown]`: list every registered op, where its rules live, and
how each backend handles it (a column per backend: "lowered", "scalar <name>" for an
elementwise op rendered through the backend's scalar table, "refused: <reason>", "missing").

The listing is a tool over the whole package: it loads the backends' tables by name
(graphc.backends.coverage), so the ops package itself never imports a backend.
"""

from __future__ import annotations

import importlib
import sys

import graphc  # noqa: F401  (registers every op)
from graphc.ops.registry import REGISTRY

BACKENDS = ("cpu", "cuda")


def _backend_columns() -> dict[str, dict[str, str]]:
    """backend -> op -> how it is handled; a backend whose tables cannot load says why."""
    coverage = importlib.import_module("graphc.backends.coverage").coverage
    columns = {}
    for backend in BACKENDS:
        try:
            columns[backend] = coverage(backend)
        except ImportError as error:  # e.g. llvmlite missing
            columns[backend] = {name: f"unavailable ({error.name})" for name in REGISTRY}
    return columns


def _row(op, columns) -> tuple[str, ...]:
    grad = "yes" if op.differentiable else "-"
    scalar = op.scalar or "-"
    inputs = ", ".join(op.inputs) or "-"
    attrs = ", ".join(op.attrs) or "-"
    backends = tuple(columns[b].get(op.name, "missing") for b in BACKENDS)
    return (op.name, op.kind, inputs, attrs, grad, scalar, *backends, op.source)


def print_ops(markdown: bool = False) -> None:
    header = ("op", "kind", "inputs", "attributes", "vjp", "scalar", *BACKENDS, "defined at")
    columns = _backend_columns()
    rows = [_row(op, columns)
            for op in sorted(REGISTRY.values(), key=lambda o: (o.kind, o.name))]
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for r in rows:
            print("| " + " | ".join(f"`{c}`" if i == 0 else c for i, c in enumerate(r)) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"\n{len(rows)} ops")


if __name__ == "__main__":
    print_ops(markdown="--markdown" in sys.argv[1:])
