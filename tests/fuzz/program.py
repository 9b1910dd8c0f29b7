"""A fuzz program: a few graphc calls written as Python source, the unit the fuzzer checks.

A `Program` is plain data (inputs, steps, outputs) that hypothesis draws and shrinks. Its
`source()` is the Python text of a function over graphc tensors, and `function()` is that
very text executed, so the program a failure message prints is exactly the code that was
traced (paste it into a file to replay it eagerly).

Invariants:
- Values are numbered: inputs first (`x0`, `x1`, ...), then one value per step (`v<k>`,
  k counting on from the inputs). A step reads only values defined before it.
- A step's `template` is a Python expression with `{0}`, `{1}`, ... standing for its
  operands; it may use `graphc`, `F` (graphc.nn.functional) and `FLOAT`, the program's
  floating dtype (float32 for the checked run, float64 for the reference), never a dtype
  literal, so the reference run computes everything in float64.
- Input values come from `input_arrays(seed)`: numpy, deterministic in the seed, by kind:
  "float" ~ U(-2, 2), "positive" ~ U(0.5, 2), "int" in [-6, 6], "nonzero" int in
  {-4..-1, 1..4}, "bool", "labels" in [0, high).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import graphc
import graphc.nn.functional as F

FLOAT_KINDS = ("float", "positive")


@dataclass(frozen=True)
class Input:
    """One program argument: its shape, what kind of values it holds, and for "labels" the
    number of classes."""

    shape: tuple[int, ...]
    kind: str
    high: int = 0

    @property
    def floating(self) -> bool:
        return self.kind in FLOAT_KINDS


@dataclass(frozen=True)
class Step:
    """One value computed from earlier ones: `template.format(*names of args)`."""

    template: str
    args: tuple[int, ...]


@dataclass(frozen=True)
class Program:
    """A whole fuzz case: what runs, on which inputs, in which precision, with or without
    gradients (see the module docstring)."""

    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    float_dtype: str = "float32"
    grads: bool = False
    seed: int = 0

    def name(self, index: int) -> str:
        return f"x{index}" if index < len(self.inputs) else f"v{index}"

    def source(self) -> str:
        params = ", ".join(self.name(i) for i in range(len(self.inputs)))
        lines = [f"def program({params}):"]
        for k, step in enumerate(self.steps, start=len(self.inputs)):
            expr = step.template.format(*(self.name(a) for a in step.args))
            lines.append(f"    {self.name(k)} = {expr}")
        outs = "".join(self.name(o) + ", " for o in self.outputs)
        lines.append(f"    return ({outs.rstrip()})")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        """The source plus everything else needed to replay the case."""
        inputs = ", ".join(f"x{i}: {inp.kind}{list(inp.shape)}" for i, inp in
                           enumerate(self.inputs))
        return (f"# {self.float_dtype}, grads={self.grads}, seed={self.seed}; {inputs}\n"
                + self.source())

    def function(self, float_dtype: str | None = None):
        """The program as a callable over graphc tensors, computing in `float_dtype`."""
        dtype = getattr(graphc, float_dtype or self.float_dtype)
        namespace = {"graphc": graphc, "F": F, "FLOAT": dtype}
        exec(compile(self.source(), "<fuzz program>", "exec"), namespace)  # noqa: S102
        return namespace["program"]

    def input_arrays(self, seed: int | None = None, float_dtype: str | None = None):
        """One numpy array per input (see the module docstring for the value kinds)."""
        rng = np.random.default_rng(self.seed if seed is None else seed)
        dtype = np.dtype(float_dtype or self.float_dtype)
        return [_values(rng, inp, dtype) for inp in self.inputs]


def _values(rng: np.random.Generator, inp: Input, float_dtype: np.dtype) -> np.ndarray:
    shape = inp.shape
    if inp.kind == "float":
        return rng.uniform(-2.0, 2.0, shape).astype(float_dtype)
    if inp.kind == "positive":
        return rng.uniform(0.5, 2.0, shape).astype(float_dtype)
    if inp.kind == "int":
        return rng.integers(-6, 7, shape, dtype=np.int64)
    if inp.kind == "nonzero":
        magnitude = rng.integers(1, 5, shape, dtype=np.int64)
        return np.where(rng.random(shape) < 0.5, -magnitude, magnitude)
    if inp.kind == "bool":
        return rng.random(shape) < 0.5
    if inp.kind == "labels":
        return rng.integers(0, inp.high, shape, dtype=np.int64)
    raise ValueError(f"fuzz Input: unknown kind {inp.kind!r}; expected float, positive, int, "
                     "nonzero, bool or labels")


def probe_type(template: str, operands: list[tuple[tuple[int, ...], str]],
               float_dtype: str = "float32") -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of `template` applied eagerly to ones of the operands' types
    (shape, dtype name); a template the op rejects raises the op's error."""
    namespace = {"graphc": graphc, "F": F, "FLOAT": getattr(graphc, float_dtype)}
    names = []
    for k, (shape, dtype) in enumerate(operands):
        namespace[f"a{k}"] = graphc.from_numpy(np.ones(shape, dtype=dtype))
        names.append(f"a{k}")
    with graphc.no_grad():
        out = eval(template.format(*names), namespace)  # noqa: S307
    return tuple(out.shape), out.dtype.name
