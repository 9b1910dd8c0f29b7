"""index_ops: gathers, scatters, embedding, pad, flip and argmax/argmin as CPU kernels.

Part of the top layer of the CPU code generator (codegen's `Lowerer` calls `lower_index` for
every op named in INDEX_OPS).
"""

from __future__ import annotations

from graphc.ir.graph import Node

__all__ = ["INDEX_OPS", "lower_index"]

INDEX_OPS: tuple[str, ...] = ()


def lower_index(lw, node: Node) -> None:
    """Append to `lw.calls` the kernels computing `node` (one of INDEX_OPS)."""
    raise NotImplementedError(node.op)
