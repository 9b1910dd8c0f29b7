"""Hypothesis strategies for random well-typed graphc programs (`programs(family)`).

The fuzzer builds programs as Python source over graphc tensors (tests/fuzz/program.py) and
traces them, so tracing, eager autograd inside a trace and the passes are fuzzed too. A
program is drawn step by step by a `Builder`: each step is one op generator of the chosen
family (see FAMILIES); it picks operands among the values computed so far, or makes a fresh
input of a compatible shape (broadcast partners, concat partners, matmul right-hand sides,
conv weights, labels), and draws the op's attributes. The step's result type comes from
running the step eagerly on ones (`probe_type`), so the builder never guesses a shape rule;
a draw the op rejects (a pooling window larger than its padded input) is filtered out with
`assume`, which stays rare because the generators draw valid attributes on purpose.

Domains: ops defined only on part of the line read a transformed operand, written into the
step's source: log/sqrt/rsqrt/pow bases get `x * x + 0.25` (positive), denominators
`y * y + 0.5`, integer divisors come from "nonzero" inputs. Ties and kinks (relu at 0, max
with two equal candidates, a value on a rounding boundary of a cast) are not avoided here
but by the harness, which measures every decision's margin on the float64 reference
(tests/fuzz/margins.py).

Shapes stay small (dims 1 to 5, at most 4 dims, a few hundred elements) so a compile stays
cheap and shrinking is quick.
"""

from __future__ import annotations

import math

from hypothesis import assume
from hypothesis import strategies as st

from graphc.errors import GraphcError
from tests.fuzz.program import Input, Program, Step, probe_type

UNARY = (
    "graphc.neg({0})", "graphc.exp({0})", "graphc.tanh({0})", "graphc.sigmoid({0})",
    "graphc.sin({0})", "graphc.cos({0})", "graphc.erf({0})", "graphc.gelu({0})",
    "graphc.gelu({0}, approximate='tanh')", "graphc.relu({0})", "graphc.abs({0})",
    "graphc.sign({0})", "graphc.leaky_relu({0}, 0.1)", "graphc.clamp({0}, -0.5, 1.0)",
    "graphc.clamp({0}, min=0.25)", "graphc.clamp({0}, max=-0.25)",
    "graphc.log({0} * {0} + 0.25)", "graphc.sqrt({0} * {0} + 0.25)",
    "graphc.rsqrt({0} * {0} + 0.25)", "graphc.log1p({0} * {0})",
    "graphc.pow({0} * {0} + 0.25, 1.5)", "{0} ** 2", "{0} * 2.5", "1.5 - {0}", "{0} / 3.0",
)
BINARY = (
    "{0} + {1}", "{0} - {1}", "{0} * {1}", "{0} / ({1} * {1} + 0.5)",
    "graphc.maximum({0}, {1})", "graphc.minimum({0}, {1})",
    "graphc.pow({0} * {0} + 0.25, {1})", "graphc.remainder({0}, {1} * {1} + 0.5)",
    "graphc.floor_divide({0}, {1} * {1} + 0.5)",
)
COMPARE = ("{0} < {1}", "{0} <= {1}", "{0} > {1}", "{0} >= {1}", "{0} == {1}", "{0} != {1}",
           "{0} > 0.5")
LOGICAL = ("graphc.logical_and({0}, {1})", "graphc.logical_or({0}, {1})",
           "graphc.logical_xor({0}, {1})")
INT_BINARY = ("{0} + {1}", "{0} - {1}", "{0} * {1}", "graphc.maximum({0}, {1})",
              "graphc.floor_divide({0}, {1})", "graphc.remainder({0}, {1})")
REDUCE_AXES = ("graphc.sum({0}, dim={a}, keepdim={k})", "graphc.mean({0}, dim={a}, keepdim={k})",
               "graphc.amax({0}, {a}, keepdim={k})", "graphc.amin({0}, {a}, keepdim={k})",
               "graphc.logsumexp({0}, {a}, keepdim={k})", "graphc.norm({0}, dim={a}, keepdim={k})")
REDUCE_DIM = ("graphc.prod({0}, {d}, keepdim={k})", "graphc.max({0}, {d}, keepdim={k})[0]",
              "graphc.min({0}, {d}, keepdim={k})[0]", "graphc.argmax({0}, {d}, keepdim={k})",
              "graphc.argmin({0}, {d}, keepdim={k})")


class Builder:
    """Draws one program: values are ("in", i) or ("step", j) refs until `program()`
    numbers them (inputs first)."""

    def __init__(self, draw, float_dtype: str) -> None:
        self.draw = draw
        self.float_dtype = float_dtype
        self.inputs: list[Input] = []
        self.steps: list[tuple[str, tuple]] = []
        self.types: dict[tuple, tuple[tuple[int, ...], str]] = {}

    # ---- values ----------------------------------------------------------------------------
    def new_input(self, shape, kind: str = "float", high: int = 0) -> tuple:
        ref = ("in", len(self.inputs))
        self.inputs.append(Input(tuple(shape), kind, high))
        dtype = {"bool": "bool", "int": "int64", "nonzero": "int64", "labels": "int64"}
        self.types[ref] = (tuple(shape), dtype.get(kind, self.float_dtype))
        return ref

    def shape(self, ref) -> tuple[int, ...]:
        return self.types[ref][0]

    def pick(self, dtype_kind: str, min_ndim: int = 0, max_ndim: int = 4, make=None):
        """A value whose dtype is floating ("f"), int64 ("i") or bool ("b") and whose rank is
        in range, most often the latest such (so steps chain); a fresh input of `make` shape
        (or a drawn one) when none is picked."""
        fits = [r for r, (s, d) in self.types.items() if _kind(d) == dtype_kind
                and min_ndim <= len(s) <= max_ndim]
        if fits and self.draw(st.integers(0, 3)) > 0:
            return fits[-1 - self.draw(st.integers(0, len(fits) - 1))]
        shape = make if make is not None else self.draw(shapes(max(min_ndim, 1),
                                                               min(max_ndim, 3)))
        kind = {"f": "float", "i": "int", "b": "bool"}[dtype_kind]
        return self.new_input(shape, kind)

    def step(self, template: str, *args) -> tuple:
        """Append `template` over `args`; its type is probed eagerly (see module docstring)."""
        try:
            out = probe_type(template, [self.types[a] for a in args], self.float_dtype)
        except (GraphcError, TypeError, ValueError):
            assume(False)  # attributes the op rejects for these shapes: draw again
        assume(math.prod(out[0]) <= 1024)
        ref = ("step", len(self.steps))
        self.steps.append((template, args))
        self.types[ref] = out
        return ref

    def program(self, grads: bool, seed: int) -> Program:
        count = len(self.inputs)

        def number(ref) -> int:
            return ref[1] if ref[0] == "in" else count + ref[1]

        steps = tuple(Step(t, tuple(number(a) for a in args)) for t, args in self.steps)
        read = {a for step in steps for a in step.args}
        sinks = [count + j for j in range(len(steps)) if count + j not in read]
        return Program(tuple(self.inputs), steps, tuple(sinks[-3:]), self.float_dtype, grads,
                       seed)


def _kind(dtype: str) -> str:
    return "b" if dtype == "bool" else "i" if dtype == "int64" else "f"


def shapes(min_ndim: int = 0, max_ndim: int = 3, max_side: int = 5):
    return st.lists(st.integers(1, max_side), min_size=min_ndim, max_size=max_ndim).map(tuple)


def broadcast_partner(b: Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape`: a suffix of it, with some dims set to 1 or, where
    `shape` has a 1, widened, and maybe a new leading dim."""
    keep = b.draw(st.integers(0, len(shape)))
    out = []
    for side in shape[len(shape) - keep:]:
        choice = b.draw(st.integers(0, 3))
        out.append(1 if choice == 0 else b.draw(st.integers(2, 3)) if side == 1 and
                   choice == 1 else side)
    if keep == len(shape) and b.draw(st.integers(0, 4)) == 0:
        out.insert(0, b.draw(st.integers(1, 3)))
    return tuple(out)


def partner(b: Builder, ref, dtype_kind: str = "f") -> tuple:
    """A value broadcast-compatible with `ref`: an existing one or a fresh input."""
    shape = b.shape(ref)
    fits = [r for r, (s, d) in b.types.items() if _kind(d) == dtype_kind and _broadcasts(s, shape)]
    if fits and b.draw(st.booleans()):
        return b.draw(st.sampled_from(fits))
    return b.new_input(broadcast_partner(b, shape), {"f": "float", "i": "int", "b": "bool"}
                       [dtype_kind])


def _broadcasts(s: tuple, t: tuple) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(s[::-1], t[::-1]))


def axes(b: Builder, ndim: int):
    """A reduction's `dim`: one axis, a tuple of distinct axes (maybe negative), or None."""
    if ndim == 0 or b.draw(st.integers(0, 5)) == 0:
        return None
    chosen = b.draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    chosen = [a - ndim if b.draw(st.booleans()) else a for a in chosen]
    return chosen[0] if len(chosen) == 1 and b.draw(st.booleans()) else tuple(chosen)


# ---- op generators: each draws and appends one step --------------------------------------------
def unary(b: Builder) -> None:
    b.step(b.draw(st.sampled_from(UNARY)), b.pick("f"))


def binary(b: Builder) -> None:
    x = b.pick("f")
    b.step(b.draw(st.sampled_from(BINARY)), *b.draw(st.permutations([x, partner(b, x)])))


def compare_where(b: Builder) -> None:
    x = b.pick("f")
    template = b.draw(st.sampled_from(COMPARE))
    cond = b.step(template, x, partner(b, x)) if "{1}" in template else b.step(template, x)
    if b.draw(st.booleans()):
        cond = b.step(b.draw(st.sampled_from(LOGICAL)), cond, partner(b, cond, "b"))
    if b.draw(st.integers(0, 3)) > 0:
        b.step("graphc.where({0}, {1}, {2})", cond, partner(b, cond), partner(b, cond))
    else:
        b.step("graphc.logical_not({0})", cond)


def cast(b: Builder) -> None:
    which = b.draw(st.integers(0, 3))
    if which == 0:
        b.step("graphc.cast({0} * 3.0, graphc.int64)", b.pick("f"))
    elif which == 1:
        b.step("graphc.cast({0}, graphc.bool)", b.pick("f"))
    else:
        b.step("graphc.cast({0}, FLOAT) * {1}", b.pick("i" if which == 2 else "b"),
               b.pick("f"))


def integer(b: Builder) -> None:
    x = b.pick("i")
    template = b.draw(st.sampled_from(INT_BINARY + ("graphc.abs({0})", "-{0}", "{0} * 3 - 2")))
    if "floor_divide" in template or "remainder" in template:
        b.step(template, x, b.new_input(broadcast_partner(b, b.shape(x)), "nonzero"))
    elif "{1}" in template:
        b.step(template, x, partner(b, x, "i"))
    else:
        b.step(template, x)


def reduce(b: Builder) -> None:
    x = b.pick("f", min_ndim=1)
    ndim, keep = len(b.shape(x)), b.draw(st.booleans())
    if b.draw(st.booleans()):
        dim = axes(b, ndim)
        template = b.draw(st.sampled_from(REDUCE_AXES))
        if dim is None:  # these take no dim=None; reduce over every axis
            dim = tuple(range(ndim))
        b.step(template.replace("{a}", repr(dim)).replace("{k}", repr(keep)), x)
    elif b.draw(st.booleans()):
        dim = b.draw(st.integers(-ndim, ndim - 1))
        template = b.draw(st.sampled_from(REDUCE_DIM))
        b.step(template.replace("{d}", str(dim)).replace("{k}", repr(keep)), x)
    else:
        spread = [a for a in range(ndim) if b.shape(x)[a] > 1]
        assume(spread)
        dim = b.draw(st.sampled_from(spread))
        fn = b.draw(st.sampled_from(("var", "std")))
        b.step(f"graphc.{fn}({{0}}, {dim}, keepdim={keep!r})", x)


def full_reduce(b: Builder) -> None:
    fn = b.draw(st.sampled_from(("sum", "mean", "amax", "prod")))
    b.step(f"graphc.{fn}({{0}})" if fn != "amax" else "graphc.amax({0}, ())", b.pick("f"))


def shared_reduction(b: Builder) -> None:
    """A reduction's result read by elementwise ops over differently shaped operands, which
    need not broadcast together (issue 12: fuse crashed on `c = s.sum() * 2; a * c, b * c`
    with a (8, 4) and b (3, 8); every gradient clipping by a global norm makes it)."""
    x = b.pick("f")
    shape = b.shape(x)
    if shape and b.draw(st.booleans()):  # per-row statistics: keepdim over the last axis
        s = b.step("graphc.sum({0} * {0}, dim=-1, keepdim=True) * 0.5", x)
        readers = [b.new_input(shape[:-1] + (n,)) for n in
                   (b.draw(st.integers(1, 5)), b.draw(st.integers(1, 5)))]
    else:
        s = b.step("graphc.sqrt(graphc.sum({0} * {0}) + 1.0) * 2.0", x)
        readers = [b.new_input(b.draw(shapes(1, 3))) for _ in range(2)]
    b.step("{0} * {1}", readers[0], s)
    b.step("{0} * {1} + {0}", readers[1], s)


def movement(b: Builder) -> None:
    x = b.pick("f", min_ndim=1)
    shape = b.shape(x)
    ndim = len(shape)
    which = b.draw(st.sampled_from(("reshape", "permute", "slice", "broadcast", "concat", "pad",
                                    "flip", "unsqueeze", "transpose")))
    if which == "reshape":
        b.step(f"{{0}}.reshape{_factorization(b, math.prod(shape))}", x)
    elif which == "permute":
        b.step(f"{{0}}.permute{tuple(b.draw(st.permutations(range(ndim))))}", x)
    elif which == "transpose":
        b.step(f"{{0}}.transpose({b.draw(st.integers(-ndim, ndim - 1))}, "
               f"{b.draw(st.integers(0, ndim - 1))})", x)
    elif which == "slice":
        b.step("{0}[" + ", ".join(_slice(b, side) for side in shape) + "]", x)
    elif which == "broadcast":
        target = tuple(b.draw(st.integers(2, 3)) if s == 1 and b.draw(st.booleans()) else s
                       for s in shape)
        if b.draw(st.booleans()):
            target = (b.draw(st.integers(1, 3)),) + target
        b.step(f"graphc.broadcast_to({{0}}, {target})", x)
    elif which == "concat":
        axis = b.draw(st.integers(-ndim, ndim - 1))
        other = list(shape)
        other[axis] = b.draw(st.integers(1, 3))
        b.step(f"graphc.cat([{{0}}, {{1}}, {{0}}], {axis})", x, b.new_input(other))
    elif which == "pad":
        pads = tuple(b.draw(st.lists(st.integers(0, 2), min_size=2, max_size=2 * min(ndim, 2))
                            .filter(lambda p: len(p) % 2 == 0)))
        value = b.draw(st.sampled_from((0.0, 0.5, -1.25)))
        b.step(f"F.pad({{0}}, {pads}, value={value})", x)
    elif which == "flip":
        dims = tuple(b.draw(st.lists(st.integers(0, ndim - 1), min_size=1, unique=True)))
        b.step(f"graphc.flip({{0}}, {dims})", x)
    else:
        b.step(f"{{0}}.unsqueeze({b.draw(st.integers(-ndim - 1, ndim))})", x)


def _factorization(b: Builder, n: int) -> tuple[int, ...]:
    dims = [1] * b.draw(st.integers(1, 4))
    for p in _primes(n):
        dims[b.draw(st.integers(0, len(dims) - 1))] *= p
    dims = list(b.draw(st.permutations(dims)))
    if len(dims) > 1 and b.draw(st.booleans()):
        dims[b.draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _slice(b: Builder, side: int) -> str:
    start = b.draw(st.integers(0, side - 1))
    stop = b.draw(st.integers(start + 1, side))
    step = b.draw(st.integers(1, 2))
    return f"{start}:{stop}" + (f":{step}" if step > 1 else "")


def matmul(b: Builder) -> None:
    x = b.pick("f", min_ndim=1, max_ndim=3)
    shape = b.shape(x)
    k, n = shape[-1], b.draw(st.integers(1, 5))
    rhs = b.draw(st.sampled_from(("vector", "matrix", "batched", "transposed", "linear")))
    if rhs == "vector" or (rhs == "batched" and len(shape) > 3):
        b.step("{0} @ {1}", x, b.new_input((k,)))
    elif rhs == "batched":
        b.step("graphc.matmul({0}, {1})", x, b.new_input((b.draw(st.integers(1, 3)), k, n)))
    elif rhs == "transposed":
        b.step("{0} @ {1}.transpose(-1, -2)", x, b.new_input((n, k)))
    elif rhs == "linear":
        bias = b.new_input((n,)) if b.draw(st.booleans()) else None
        args = (x, b.new_input((n, k))) + ((bias,) if bias else ())
        b.step("F.linear({0}, {1}" + (", {2})" if bias else ")"), *args)
    else:
        b.step("graphc.matmul({0}, {1})", x, b.new_input((k, n)))


def conv(b: Builder) -> None:
    x = b.pick("f", 4, 4, make=(b.draw(st.integers(1, 2)), b.draw(st.integers(1, 4)),
                                b.draw(st.integers(3, 7)), b.draw(st.integers(3, 7))))
    channels = b.shape(x)[1]
    groups = b.draw(st.sampled_from([g for g in (1, 2) if channels % g == 0]))
    out_ch = groups * b.draw(st.integers(1, 3))
    kh, kw = b.draw(st.integers(1, 3)), b.draw(st.integers(1, 3))
    weight = b.new_input((out_ch, channels // groups, kh, kw))
    stride, dilation = b.draw(st.integers(1, 2)), b.draw(st.integers(1, 2))
    padding = b.draw(st.integers(0, max(kh, kw) // 2))
    bias = b.new_input((out_ch,)) if b.draw(st.booleans()) else None
    args = (x, weight) + ((bias,) if bias else ())
    b.step(f"F.conv2d({{0}}, {{1}}, {'{2}' if bias else 'None'}, stride={stride}, "
           f"padding={padding}, dilation={dilation}, groups={groups})", *args)


def pool(b: Builder) -> None:
    x = b.pick("f", 4, 4, make=(b.draw(st.integers(1, 2)), b.draw(st.integers(1, 3)),
                                b.draw(st.integers(3, 7)), b.draw(st.integers(3, 7))))
    k = b.draw(st.integers(1, 3))
    stride = b.draw(st.integers(1, k))
    padding = b.draw(st.integers(0, k // 2))
    ceil = b.draw(st.booleans())
    if b.draw(st.booleans()):
        dilation = b.draw(st.integers(1, 2))
        b.step(f"F.max_pool2d({{0}}, {k}, {stride}, {padding}, {dilation}, ceil_mode={ceil})",
               x)
    else:
        include = b.draw(st.booleans())
        divisor = b.draw(st.sampled_from((None, None, 3)))
        b.step(f"F.avg_pool2d({{0}}, {k}, {stride}, {padding}, ceil_mode={ceil}, "
               f"count_include_pad={include}, divisor_override={divisor})", x)


def batch_norm(b: Builder) -> None:
    x = b.pick("f", 2, 4, make=(b.draw(st.integers(2, 3)), b.draw(st.integers(1, 3)),
                                b.draw(st.integers(2, 4)), b.draw(st.integers(2, 4))))
    c = b.shape(x)[1]
    weight, bias = b.new_input((c,)), b.new_input((c,))
    if b.draw(st.booleans()):
        b.step("F.batch_norm({0}, None, None, {1}, {2}, training=True)", x, weight, bias)
    else:
        mean, var = b.new_input((c,)), b.new_input((c,), "positive")
        b.step("F.batch_norm({0}, {3}, {4}, {1}, {2}, training=False)", x, weight, bias, mean,
               var)


def softmax(b: Builder) -> None:
    x = b.pick("f", min_ndim=1)
    fn = b.draw(st.sampled_from(("F.softmax", "F.log_softmax")))
    b.step(f"{fn}({{0}}, {b.draw(st.integers(-len(b.shape(x)), len(b.shape(x)) - 1))})", x)


def loss(b: Builder) -> None:
    x = b.pick("f", 2, 3, make=(b.draw(st.integers(1, 4)), b.draw(st.integers(2, 5))))
    shape = b.shape(x)
    assume(shape[1] >= 2)
    which = b.draw(st.sampled_from(("cross_entropy", "nll", "mse", "bce")))
    reduction = b.draw(st.sampled_from(("mean", "sum", "none")))
    if which in ("mse", "bce"):
        target = b.new_input(shape)
        expr = "{1}" if which == "mse" else "graphc.sigmoid({1})"
        fn = "F.mse_loss" if which == "mse" else "F.binary_cross_entropy_with_logits"
        b.step(f"{fn}({{0}}, {expr}, reduction={reduction!r})", x, target)
        return
    target = b.new_input(shape[:1] + shape[2:], "labels", high=shape[1])
    weight = b.new_input((shape[1],), "positive") if b.draw(st.booleans()) else None
    extra = ", weight={2}" if weight else ""
    if b.draw(st.booleans()):  # class 0 ignored; keep a mean defined by other classes
        extra += ", ignore_index=0"
    if which == "cross_entropy":
        smoothing = b.draw(st.sampled_from((0.0, 0.0, 0.2)))
        template = (f"F.cross_entropy({{0}}, {{1}}{extra}, reduction={reduction!r}, "
                    f"label_smoothing={smoothing})")
    else:
        template = f"F.nll_loss(F.log_softmax({{0}}, 1), {{1}}{extra}, reduction={reduction!r})"
    b.step(template, x, target, *((weight,) if weight else ()))


FAMILIES = {
    "elementwise": (unary, unary, binary, binary, compare_where, cast, integer),
    "reduce": (unary, binary, reduce, reduce, reduce, full_reduce, shared_reduction),
    "movement": (unary, binary, movement, movement, movement),
    "matmul": (unary, binary, matmul, matmul, reduce, movement),
    "conv_pool": (unary, conv, conv, pool, pool, batch_norm),
    "softmax_loss": (unary, binary, softmax, loss, loss),
    "mixed": (unary, binary, compare_where, cast, reduce, movement, matmul, conv, pool,
              softmax, loss, shared_reduction),
}


@st.composite
def programs(draw, family: str, max_steps: int = 4, grads=None) -> Program:
    """A random program of `family` (a key of FAMILIES) with 1 to `max_steps` steps; `grads`
    None draws it."""
    float_dtype = draw(st.sampled_from(("float32", "float32", "float32", "float64")))
    b = Builder(draw, float_dtype)
    generators = FAMILIES[family]
    for _ in range(draw(st.integers(1, max_steps))):
        draw(st.sampled_from(generators))(b)
    with_grads = draw(st.booleans()) if grads is None else grads
    assume(any(_kind(d) == "f" for _, d in b.types.values()) or not with_grads)
    return b.program(with_grads, draw(st.integers(0, 2**32 - 1)))


__all__ = ["FAMILIES", "Builder", "programs"]
