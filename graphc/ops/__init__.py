"""graphc.ops: the op registry and the modules that register every primitive op.

Importing this package registers all ops. `REGISTRY` maps op names to `OpDef`s;
`python -m graphc.ops` lists them with the file and line where each rule lives.
"""

from graphc.ops import (
    attention,
    batch_norm_relu,
    collective,
    conv,
    elementwise,
    fused,
    gather,
    indexing,
    linalg,
    mathops,
    movement,
    nn_ops,
    pool,
    random,
    reduce,
    registry,
    sources,
)
from graphc.ops.registry import REGISTRY, OpDef, call, get, register

OP_MODULES = (sources, elementwise, mathops, reduce, movement, gather, indexing, linalg, conv,
              pool, nn_ops, batch_norm_relu, attention, random, collective, fused)

__all__ = ["REGISTRY", "OpDef", "OP_MODULES", "call", "get", "register", "registry"]
