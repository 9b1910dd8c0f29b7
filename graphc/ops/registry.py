"""The op registry: one `OpDef` per primitive, everything about the op in one place.

An OpDef holds the op's name and kind, its shape/dtype rule (a pure function over
`TensorType`s, never "run numpy and look"), its numpy kernel (eager mode and the reference
interpreter), its gradient rule (a VJP written with graph-building calls, so a backward can be
traced and compiled like any forward), for elementwise ops the scalar operation a backend
renders, and the facts passes and backends need instead of keeping their own lists of op
names: a reduction's identity and combiner (`Reduction`), whether a row-wise op (softmax) may
end a fused group, whether a contraction anchors a GEMM/conv epilogue, and the pure strides
rule of a view op (`view_strides`). `register` records the file and line of the registration
so `python -m graphc.ops` can say where each rule lives.

Contracts:
- `infer(*input_types, **attrs)` returns one TensorType or a tuple of them (multi-output ops);
  it raises ShapeError/DTypeError/ArgumentError with the op name for bad inputs.
- `kernel(*arrays, **attrs)` returns one ndarray or a tuple, exactly the inferred types
  (the dispatch point checks this in debug mode and the op tests check it always).
- `vjp(ctx, *grad_outputs)` returns one gradient (a tensor, or None) per input. It computes
  with tensor methods and `call(...)`, never with numpy, so the same rule runs eagerly, records
  autograd history under create_graph, and records IR nodes inside a trace. `ctx` exposes the
  saved inputs and outputs the op asked for (`saved_inputs` / `saved_outputs` indices; the
  others are None), the input and output types, the attributes and `needs_input_grad`.
  A grad_output may be None when that output got no gradient (multi-output ops only).
- Attributes are literals only (int, float, bool, str, None, and tuples of those), so the IR
  text form can round-trip.
- `view_strides(shape, strides, /, **attrs)` (view ops only) is pure: from the source's shape and
  element strides it returns `(offset, strides)` of the view in elements, or None where the
  kernel would copy; it agrees with what the numpy kernel gives (a test checks it).
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from graphc.errors import GraphcError
from graphc.types import TensorType

ELEMENTWISE = "elementwise"
REDUCE = "reduce"
MOVEMENT = "movement"
CONTRACTION = "contraction"
POOL = "pool"
NORM = "norm"
LOSS = "loss"
SOURCE = "source"
RANDOM = "random"
FUSED = "fused"  # a group of ops made into one node by the fuse pass (graphc.ops.fused)
COLLECTIVE = "collective"  # communication between the ranks of a job (graphc.ops.collective)
KINDS = (ELEMENTWISE, REDUCE, MOVEMENT, CONTRACTION, POOL, NORM, LOSS, SOURCE, RANDOM, FUSED,
         COLLECTIVE)

VARIADIC = "*"  # an `inputs` entry starting with this takes any number of tensors (concat)

# The combiners a Reduction may name, and the identities it may start from.
COMBINERS = ("add", "mul", "max", "min")
IDENTITIES = ("zero", "one", "lowest", "highest")


@dataclass(frozen=True)
class Reduction:
    """What a reduction op computes: `acc = combiner(acc, x)` over the reduced elements,
    starting from `identity`; `mean` divides the result by the number of elements reduced.

    `combiner` is one of COMBINERS: add and mul on bool are `or` and `and` (numpy's sum and
    prod of bools, cast back), max and min propagate NaN as numpy does. `identity` is one of
    IDENTITIES, the combiner's identity element: `identity_value(dtype)` gives it as a Python
    literal (lowest/highest are -inf/inf for floats, the int64 limits, False/True for bool).
    """

    combiner: str
    identity: str
    mean: bool = False

    def identity_value(self, dtype) -> bool | int | float:
        """The start value of the accumulator in `dtype` (a graphc DType)."""
        if self.identity in ("zero", "one"):
            return int(self.identity == "one")
        highest = self.identity == "highest"
        if dtype.is_floating:
            return math.inf if highest else -math.inf
        if dtype.name == "bool":
            return highest
        return 2**63 - 1 if highest else -(2**63)


@dataclass(frozen=True)
class OpDef:
    """Everything about one primitive op. See the module docstring for the contracts."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    infer: Callable[..., TensorType | tuple[TensorType, ...]]
    kernel: Callable[..., Any]
    vjp: Callable[..., tuple] | None = None
    scalar: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    saved_inputs: tuple[int, ...] = ()
    saved_outputs: tuple[int, ...] = ()
    view: bool = False
    effectful: bool = False
    doc: str = ""
    source: str = ""
    # facts passes and backends ask for instead of listing op names (see the module docstring)
    reduction: Reduction | None = None
    row_wise: bool = False  # reduces along one dim and maps back (softmax): may end a fused group
    # its result is read by a fused elementwise epilogue, instruction 0 of a fused body (a
    # contraction: matmul, conv2d; a bucket's all_reduce_wait: graphc.passes.fuse_waits)
    epilogue_anchor: bool = False
    view_strides: Callable[..., tuple[int, tuple[int, ...]] | None] | None = None

    @property
    def differentiable(self) -> bool:
        return self.vjp is not None

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].startswith(VARIADIC)

    @property
    def ends_fused_group(self) -> bool:
        """Whether a fused group may end with this op: a reduction or a row-wise op."""
        return self.reduction is not None or self.row_wise

    def __repr__(self) -> str:
        return f"OpDef({self.name!r}, kind={self.kind!r}, at {self.source})"


REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add an op to the registry, recording where the registration stands in the source."""
    if opdef.kind not in KINDS:
        raise GraphcError(f"op {opdef.name!r}: unknown kind {opdef.kind!r}, expected {KINDS}")
    if opdef.reduction is not None and (opdef.reduction.combiner not in COMBINERS
                                        or opdef.reduction.identity not in IDENTITIES):
        raise GraphcError(f"op {opdef.name!r}: bad reduction {opdef.reduction}, expected a "
                          f"combiner in {COMBINERS} and an identity in {IDENTITIES}")
    if opdef.view != (opdef.view_strides is not None):
        raise GraphcError(f"op {opdef.name!r}: a view op needs a view_strides rule, and only "
                          "a view op has one")
    if opdef.name in REGISTRY:
        raise GraphcError(f"op {opdef.name!r} registered twice: {REGISTRY[opdef.name].source}")
    frame = inspect.currentframe().f_back
    while frame.f_back is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back  # the module-level statement that registered the op
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.relpath(os.path.abspath(frame.f_code.co_filename), os.path.dirname(here))
    object.__setattr__(opdef, "source", f"{path}:{frame.f_lineno}")
    REGISTRY[opdef.name] = opdef
    return opdef


def get(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise GraphcError(f"no op named {name!r} in the registry") from None


# The dispatch point lives in the front end (graphc.dispatch) and installs itself here, so the
# ops package never imports the Tensor class and VJP rules can still build graph calls.
_dispatcher: Callable[..., Any] | None = None
_inplace_dispatcher: Callable[..., Any] | None = None


def set_dispatcher(apply: Callable[..., Any], apply_inplace: Callable[..., Any]) -> None:
    global _dispatcher, _inplace_dispatcher
    _dispatcher, _inplace_dispatcher = apply, apply_inplace


def call(name: str, *inputs, **attrs):
    """Apply the registered op `name` through the dispatch point (eager, autograd or trace)."""
    if _dispatcher is None:
        raise GraphcError("graphc.dispatch is not loaded: import graphc first")
    opdef = REGISTRY.get(name)  # `get` only for its error: eager mode calls this once per op
    return _dispatcher(opdef if opdef is not None else get(name), *inputs, **attrs)


def inplace_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The in-place Tensor method `name` (`x.add_(y)`) of the out-of-place `fn` (`add`): it
    changes self to `fn(self, *args, **kwargs)` through `inplace`."""
    def method(self, *args, **kwargs):
        return inplace(self, name, lambda old: fn(old, *args, **kwargs),
                       operands=(*args, *kwargs.values()))

    method.__name__ = name
    method.__doc__ = f"In-place {fn.__name__}: changes self and bumps its version counter."
    return method


def inplace(target, op_name: str, compute: Callable[[Any], Any], operands: tuple | None = None,
            op: str | None = None):
    """Change `target` in place to `compute(old)` (see graphc.autograd.inplace.apply_inplace);
    `operands`, when known, are all the other values `compute` reads, and `op` the one op it
    applies to `(old, *operands)`, when it is one (`compute` may then be None)."""
    if _inplace_dispatcher is None:
        raise GraphcError("graphc.dispatch is not loaded: import graphc first")
    return _inplace_dispatcher(target, op_name, compute, operands, op)
