"""`python -m graphc.ops [--markdown]`: list every registered op and where its rules live."""

from __future__ import annotations

import sys

import graphc  # noqa: F401  (registers every op)
from graphc.ops.registry import REGISTRY


def _row(op) -> tuple[str, ...]:
    grad = "yes" if op.differentiable else "-"
    scalar = op.scalar or "-"
    inputs = ", ".join(op.inputs) or "-"
    attrs = ", ".join(op.attrs) or "-"
    return (op.name, op.kind, inputs, attrs, grad, scalar, op.source)


def print_ops(markdown: bool = False) -> None:
    header = ("op", "kind", "inputs", "attributes", "vjp", "scalar", "defined at")
    rows = [_row(op) for op in sorted(REGISTRY.values(), key=lambda o: (o.kind, o.name))]
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
