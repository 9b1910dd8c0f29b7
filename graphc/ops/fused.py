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

`FusedBody` is the one decoder of a body: it checks the refs, infers each instruction's type
once with its registry shape rule, and is what the shape rule, the reference kernel (each
instruction's numpy kernel, so the interpreter and the verifier need nothing special), the
passes and the backends read; a backend renders the body as one loop nest. A fused node has no
VJP: fusion runs after the backward graph is derived.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from graphc.errors import GraphcError
from graphc.ops.registry import FUSED, REGISTRY, OpDef, register
from graphc.types import TensorType, dtype_of_numpy


class FusedBodyError(GraphcError, ValueError):
    """A fused body that refers to a missing value or an unknown op."""


class Instruction(NamedTuple):
    """One instruction of a fused body: registry op name, argument refs, attributes."""

    op: str
    args: tuple[int, ...]
    attrs: dict


class FusedBody:
    """A fused body decoded and typed once: the one reader of `body`/`outputs` attributes.

    `instructions[k]` is an `Instruction` (attrs as a dict); `types[ref]` is the TensorType of
    every ref (inputs first, then one per instruction, from each op's registry shape rule);
    `outputs` are the refs the node returns. Passes and backends read bodies through this
    class; none re-decodes the tuples or re-runs shape rules per ref.

    >>> from graphc.types import TensorType, float32
    >>> t = TensorType((4,), float32)
    >>> fb = FusedBody((t, t), (("add", (0, 1), ()), ("relu", (2,), ())), (3,))
    >>> [i.op for i in fb.instructions], str(fb.types[3])
    (['add', 'relu'], 'f32[4]')
    """

    def __init__(self, input_types, body: tuple, outputs: tuple) -> None:
        self.n_inputs = len(input_types)
        types = list(input_types)
        instructions = []
        for i, raw in enumerate(body):
            op, args, attrs = _instruction(i, raw)
            for ref in args:
                _check_ref(i, ref, len(types))
            result = REGISTRY[op].infer(*(types[r] for r in args), **attrs)
            if not isinstance(result, TensorType):
                raise FusedBodyError(f"fused: instruction {i} ({op}) has several outputs; a "
                                     "fused body holds single-output ops only")
            types.append(result)
            instructions.append(Instruction(op, args, attrs))
        for ref in outputs:
            _check_ref(len(body), ref, len(types))
        self.instructions: tuple[Instruction, ...] = tuple(instructions)
        self.types: tuple[TensorType, ...] = tuple(types)
        self.outputs: tuple[int, ...] = tuple(outputs)

    @classmethod
    def decoded(cls, input_types, body: tuple, outputs: tuple) -> "FusedBody":
        """`FusedBody(input_types, body, outputs)`, shared by every reader of the same static
        body (`_DECODED`): the verifier after each pass, the passes and the backend decode one
        body many times, and each decoding re-runs every instruction's shape rule. A body
        with symbolic sizes is decoded afresh each time: its shape rules record guards in the
        current ShapeEnv."""
        types = tuple(input_types)
        if any(t.is_symbolic for t in types):
            return cls(types, body, outputs)
        try:
            key = (types, body, outputs)
            found = _DECODED.get(key)
        except TypeError:  # an unhashable literal: the decoder reports what is wrong
            return cls(types, body, outputs)
        if found is None:
            found = cls(types, body, outputs)
            if len(_DECODED) >= _DECODED_MOST:
                _DECODED.clear()
            _DECODED[key] = found
        return found

    @classmethod
    def of_node(cls, node) -> "FusedBody":
        """The body of a `fused` node, or a one-instruction body computing any other node
        (so a backend renders a lone elementwise op as it renders a fused group)."""
        types = [v.type for v in node.inputs]
        if node.op == "fused":
            return cls.decoded(types, node.attrs["body"], node.attrs["outputs"])
        body = ((node.op, tuple(range(len(types))), tuple(node.attrs.items())),)
        return cls.decoded(types, body, (len(types),))

    def ref(self, k: int) -> int:
        """The ref of instruction k's result."""
        return self.n_inputs + k

    def instruction(self, ref: int) -> Instruction:
        """The instruction that computes `ref` (a ref past the inputs)."""
        return self.instructions[ref - self.n_inputs]

    @property
    def anchor(self) -> Instruction | None:
        """Instruction 0 when it is an epilogue anchor (matmul, conv2d): a GEMM or convolution
        whose result the rest of the body reads as its epilogue."""
        first = self.instructions[0] if self.instructions else None
        return first if first is not None and REGISTRY[first.op].epilogue_anchor else None

    @property
    def ending(self) -> Instruction | None:
        """The last instruction when the body ends with a reduction or a row-wise op."""
        last = self.instructions[-1] if self.instructions else None
        return last if last is not None and REGISTRY[last.op].ends_fused_group else None

    def __len__(self) -> int:
        return len(self.instructions)


_DECODED: dict[tuple, FusedBody] = {}  # FusedBody.decoded's: (input types, body, outputs)
_DECODED_MOST = 8192


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
    fb = FusedBody.decoded(types, body, outputs)
    out = tuple(fb.types[r] for r in fb.outputs)
    return out[0] if len(out) == 1 else out


def _fused_kernel(*arrays, body: tuple, outputs: tuple):
    env = [np.asarray(a) for a in arrays]
    fb = FusedBody([TensorType(a.shape, dtype_of_numpy(a.dtype)) for a in env], body, outputs)
    for k, (op, args, attrs) in enumerate(fb.instructions):
        result = REGISTRY[op].kernel(*(env[r] for r in args), **attrs)
        env.append(np.asarray(result).astype(fb.types[fb.ref(k)].dtype.np, copy=False))
    out = tuple(env[r] for r in fb.outputs)
    return out[0] if len(out) == 1 else out


register(OpDef("fused", FUSED, ("*inputs",), _fused_infer, _fused_kernel, None,
               attrs={"body": tuple, "outputs": tuple}))


def effectful(node) -> bool:
    """Whether `node` must keep its place among the effectful nodes (random draws,
    collectives): its OpDef is `effectful`, or it is a fused node whose body holds an
    effectful op (a bucket's all_reduce_wait with the update it feeds)."""
    if node.op == "fused":
        return any(REGISTRY[instruction[0]].effectful for instruction in node.attrs["body"])
    opdef = REGISTRY.get(node.op)
    return opdef is not None and opdef.effectful


def body_ops(body: tuple) -> tuple[str, ...]:
    """The op names of a fused body, in order (for reports and pictures)."""
    return tuple(instruction[0] for instruction in body)




TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
