"""OpInfo entries, one module per op group (see tests/opinfo.py)."""

from tests.opinfos import (
    conv,
    elementwise,
    linalg,
    mathops,
    movement,
    nn_composites,
    nn_ops,
    nn_vision,
    pool,
    random,
    reduce,
    sources,
    surface,
)

ALL_GROUPS = (sources, elementwise, mathops, reduce, movement, linalg, conv, pool, nn_ops, random,
              surface, nn_composites, nn_vision)
