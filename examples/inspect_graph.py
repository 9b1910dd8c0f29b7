"""Inspect what graphc made of a model: the traced IR, the IR after each pass, the report,
a picture with fused groups boxed, and the memory plan.

    python examples/inspect_graph.py [--out graphc-out/inspect]
"""

from __future__ import annotations

import argparse
import os

import graphc
import graphc.nn as nn
from graphc.ir.export import render_svg
from graphc.passes.memory_report import format_report


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("graphc-out", "inspect"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8), nn.Softmax(dim=1))
    fast = graphc.compile(model, backend="cpu")
    x = graphc.randn(4, 8)
    with graphc.no_grad():
        fast(x)

    print("---- traced ----")
    print(fast.graph)
    print("---- after simplify, fuse and plan_buffers ----")
    print(fast.optimized_graph)
    print("---- pipeline report ----")
    print(fast.report)
    plan = fast.optimized_graph.meta["memory_plan"]
    print("---- memory plan ----")
    print(format_report(plan))
    path = os.path.join(args.out, "model.svg")
    render_svg(fast.optimized_graph, path)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
