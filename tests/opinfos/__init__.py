"""OpInfo entries, one module per op group (see tests/opinfo.py)."""

from tests.opinfos import (
    conv,
    elementwise,
    linalg,
    movement,
    nn_ops,
    pool,
    random,
    reduce,
    sources,
)

ALL_GROUPS = (sources, elementwise, reduce, movement, linalg, conv, pool, nn_ops, random)
