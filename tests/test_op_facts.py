"""The facts on each OpDef that passes and backends read instead of lists of op names.

- every view op's pure `view_strides` rule agrees with its numpy kernel run on a stand-in
  array (offset and strides, or "copies"), over random shapes, strides and attributes;
- reductions name a known combiner and identity, and their identity is the combiner's;
- `FusedBody` decodes and types a body once, and the shape rule and kernel of `fused` agree.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import graphc  # noqa: F401  (registers every op)
from graphc.ops.fused import FusedBody
from graphc.ops.registry import REGISTRY
from graphc.types import TensorType, bool_, float32, float64, int64

VIEW_OPS = sorted(name for name, op in REGISTRY.items() if op.view)


def _stand_in(shape, strides):
    """A float32 array of `shape` with element `strides` over a scratch buffer, and the
    element index of its first element in that buffer."""
    empty = 0 in shape
    span = 1 if empty else sum((n - 1) * abs(s) for n, s in zip(shape, strides)) + 1
    buf = np.empty(span + 64, np.float32)
    first = 0 if empty else sum((n - 1) * -s for n, s in zip(shape, strides) if s < 0)
    x = np.ndarray(shape, np.float32, buffer=buf, offset=first * 4,
                   strides=[s * 4 for s in strides])
    return buf, x, first


def _numpy_view(op, shape, strides, attrs):
    buf, x, first = _stand_in(shape, strides)
    result = REGISTRY[op].kernel(x, **attrs)
    if not isinstance(result, np.ndarray) or (result.size and
                                              not np.may_share_memory(result, buf)):
        return None
    start = result.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
    return start // 4 - first, tuple(s // 4 for s in result.strides)


def _random_layout(rng):
    nd = rng.randint(0, 4)
    shape = tuple(rng.choice([0, 1, 2, 3]) if rng.random() < 0.1 else rng.choice([1, 1, 2, 3, 4])
                  for _ in range(nd))
    base, step = [1] * nd, 1
    for d in reversed(range(nd)):
        base[d] = step
        step *= max(shape[d], 1) * rng.choice([1, 1, 2])
    strides = [rng.choice([b, 0, 2 * b]) if rng.random() < 0.3 else b for b in base]
    if nd > 1 and rng.random() < 0.3:
        order = list(range(nd))
        rng.shuffle(order)
        strides = [strides[k] for k in order]
    if rng.random() < 0.1:
        strides = [-s for s in strides]
    return shape, tuple(strides)


def _random_attrs(rng, op, shape):
    if op == "permute":
        dims = list(range(len(shape)))
        rng.shuffle(dims)
        return {"dims": tuple(dims)}
    if op == "broadcast_to":
        lead = tuple(rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 2)))
        return {"shape": lead + tuple(rng.choice([1, 2, 5]) if n == 1 else n for n in shape)}
    if op == "slice":
        starts, stops, steps = [], [], []
        for n in shape:
            a = rng.randint(0, n)
            starts.append(a)
            stops.append(rng.randint(a, n))
            steps.append(rng.choice([1, 1, 2, 3]))
        return {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)}
    size = math.prod(shape)
    if size == 0 or rng.random() < 0.1:
        return {"shape": tuple(shape) if rng.random() < 0.5 or size else (0, 2)}
    new, rest = [], size
    for p in (2, 3, 2, 2, 3):
        while rest % p == 0 and rng.random() < 0.6:
            new.append(p)
            rest //= p
    new.append(rest)
    for _ in range(rng.randint(0, 2)):
        new.insert(rng.randint(0, len(new)), 1)
    if rng.random() < 0.2:
        rng.shuffle(new)
    return {"shape": tuple(new)}


@pytest.mark.parametrize("op", VIEW_OPS)
def test_view_strides_agree_with_numpy(op):
    rng = random.Random(f"view_strides-{op}")
    for _ in range(3000):
        shape, strides = _random_layout(rng)
        attrs = _random_attrs(rng, op, shape)
        want = _numpy_view(op, shape, strides, attrs)
        got = REGISTRY[op].view_strides(shape, strides, **attrs)
        assert got == want, (op, shape, strides, attrs)


def test_only_view_ops_have_view_strides():
    for name, op in REGISTRY.items():
        assert op.view == (op.view_strides is not None), name


@pytest.mark.parametrize("name", sorted(n for n, op in REGISTRY.items() if op.reduction))
def test_reduction_identity_is_neutral(name):
    red = REGISTRY[name].reduction
    x = np.array([-2.5, 0.0, 3.0, np.nan], np.float64)
    combine = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    for value in x:
        ident = red.identity_value(float64)
        assert np.array_equal(combine[red.combiner](ident, value), value, equal_nan=True)
    for dtype, values in ((int64, (-(2**63), 0, 7, 2**63 - 1)), (bool_, (False, True))):
        ident = red.identity_value(dtype)
        for value in values:
            if dtype is bool_ and red.combiner == "add":
                assert (ident or value) == value
            elif dtype is bool_ and red.combiner == "mul":
                assert (ident and value) == value
            else:
                assert combine[red.combiner](np.int64(ident) if dtype is int64 else ident,
                                             value) == value


def test_fused_body_types_each_ref_once():
    t = TensorType((3, 4), float32)
    b = TensorType((4,), float32)
    body = (("add", (0, 1), ()), ("relu", (2,), ()), ("reduce_sum", (3,), (("axes", (1,)),
                                                                           ("keepdim", False))))
    fb = FusedBody((t, b), body, (3, 4))
    assert [str(ty) for ty in fb.types] == ["f32[3,4]", "f32[4]", "f32[3,4]", "f32[3,4]",
                                           "f32[3]"]
    assert fb.ending is fb.instructions[-1] and fb.anchor is None
    assert fb.instruction(4).op == "reduce_sum" and fb.ref(1) == 3
    assert REGISTRY["fused"].infer(t, b, body=body, outputs=(3, 4)) == (fb.types[3], fb.types[4])
