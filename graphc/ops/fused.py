"""The `fused` op: a group of registry ops run as one node, its body a small program.

The fuse pass turns a chain of elementwise ops (and a reduction that consumes them) into one
node `fused[body=..., outputs=...](inputs...)`. The body is a tuple of instructions, each
`(op, args, attrs)`:
- `op` names a registry op;
- `args` are ints: `0..n_inputs-1` are the node's inputs, `n_inputs + k` is the result of
  instruction k;
- `attrs` is a tuple of `(name, literal)` pairs, the op's attributes.
`outputs` lists which refs the node returns. Everything is a literal, so the IR text form
round-trips, for example:

    %4: f32[8,16] = fused[body=(("add", (0, 1), ()), ("relu", (3,), ())), outputs=(4,)](%x, %b, %s)

Types are inferred by running each instruction's registry shape rule, the reference kernel by
running each instruction's numpy kernel (so the interpreter and the verifier need nothing
special), and a backend renders the body as one loop nest. A fused node has no VJP: fusion
runs after the backward graph is derived.
"""

from __future__ import annotations

import numpy as np

from graphc.errors import GraphcError
from graphc.ops.registry import FUSED, REGISTRY, OpDef, register
from graphc.types import TensorType, dtype_of_numpy


class FusedBodyError(GraphcError, ValueError):
    """A fused body that refers to a missing value or an unknown op."""


def _check_ref(i: int, ref: int, available: int) -> None:
    if not isinstance(ref, int) or not 0 <= ref < available:
        raise FusedBodyError(
            f"fused: instruction {i} refers to %{ref}, but only refs 0..{available - 1} exist "
            "(inputs first, then earlier instructions)"
        )


def _instruction(i: int, instruction) -> tuple[str, tuple, dict]:
    try:
        op, args, attrs = instruction
    except (TypeError, ValueError):
        raise FusedBodyError(
            f"fused: instruction {i} must be (op, args, attrs), got {instruction!r}"
        ) from None
    if op not in REGISTRY or op == "fused":
        raise FusedBodyError(f"fused: instruction {i} names unknown op {op!r}")
    return op, tuple(args), dict(attrs)


def _fused_infer(*types: TensorType, body: tuple, outputs: tuple):
    env = list(types)
    for i, instruction in enumerate(body):
        op, args, attrs = _instruction(i, instruction)
        for ref in args:
            _check_ref(i, ref, len(env))
        result = REGISTRY[op].infer(*(env[r] for r in args), **attrs)
        if not isinstance(result, TensorType):
            raise FusedBodyError(f"fused: instruction {i} ({op}) has several outputs; a fused "
                                 "body holds single-output ops only")
        env.append(result)
    for ref in outputs:
        _check_ref(len(body), ref, len(env))
    out = tuple(env[r] for r in outputs)
    return out[0] if len(out) == 1 else out


def _fused_kernel(*arrays, body: tuple, outputs: tuple):
    env = [np.asarray(a) for a in arrays]
    for i, instruction in enumerate(body):
        op, args, attrs = _instruction(i, instruction)
        opdef = REGISTRY[op]
        operands = [env[r] for r in args]
        ty = opdef.infer(*(TensorType(a.shape, dtype_of_numpy(a.dtype)) for a in operands),
                         **attrs)
        env.append(np.asarray(opdef.kernel(*operands, **attrs)).astype(ty.dtype.np,
                                                                         copy=False))
    out = tuple(env[r] for r in outputs)
    return out[0] if len(out) == 1 else out


register(OpDef("fused", FUSED, ("*inputs",), _fused_infer, _fused_kernel, None,
               attrs={"body": tuple, "outputs": tuple}))


def body_ops(body: tuple) -> tuple[str, ...]:
    """The op names of a fused body, in order (for reports and pictures)."""
    return tuple(instruction[0] for instruction in body)


TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
