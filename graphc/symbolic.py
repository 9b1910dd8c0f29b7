"""Symbolic sizes: `Sym` expressions of size symbols (`s0`, `s0*784`, `s0-1`) and `ShapeEnv`.

A dimension of a `TensorType` is an int or a `Sym`: an integer polynomial of symbols, kept
in a canonical form (so equal expressions are equal objects structurally and hash alike).
Arithmetic on a Sym gives a Sym, or a plain int when the result is constant, so shape rules
written with `+ - * //` keep working on symbolic dims by operator overloading. graphc uses
this small class rather than sympy (which PyTorch uses): shape rules need polynomials only,
and importing graphc stays fast.

Comparisons are PyTorch's *guarded* comparisons. Every symbol stands for a size >= 2 (sizes
0 and 1 are specialised, as PyTorch does), so `s0 == 1` and `s0*784 > 784` are decided
without assumptions. Any other relation (`s0 == 784`, `s0 == s1`) is decided by the active
`ShapeEnv` from the *hints* (the sizes seen at the trace) and recorded there as a guard: a
relation the graph assumed, which graphc.jit.guards checks at every call. `int(s)` (a rule
that needs a concrete size, `range(s)`) specialises: it records `s == hint` and returns the
hint. Outside a ShapeEnv (the verifier on parsed IR text) an undecidable relation raises
`SymbolicShapeError`.

>>> s0 = Sym.symbol("s0")
>>> print(s0 * 784, s0 - 1, (s0 * 784) // 784)
s0*784 s0-1 s0
>>> with ShapeEnv(hints={"s0": 32}).active() as env:
...     print(s0 == 32, env.guards)
True ['s0-32 == 0']
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Iterator

from graphc.errors import GraphcError, user_source_location

MIN_SIZE = 2  # every symbol stands for a size >= 2: sizes 0 and 1 are specialised


class SymbolicShapeError(GraphcError, ValueError):
    """A relation between symbolic sizes that cannot be decided here."""


_local = threading.local()


def current_env() -> ShapeEnv | None:
    """The ShapeEnv of this thread's symbolic trace or compile, or None."""
    return getattr(_local, "env", None)


def _const(x):
    return x if type(x) is int else int(x)


class Sym:
    """An integer polynomial of size symbols (see the module docstring). Immutable."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: tuple) -> None:
        # terms: ((monomial, coefficient), ...) sorted, no zero coefficient; a monomial is a
        # sorted tuple of symbol names (with repeats for powers), () for the constant term
        self.terms = terms
        self._hash = hash(terms)

    # ---- construction --------------------------------------------------------------------
    @staticmethod
    def symbol(name: str) -> Sym:
        return Sym((((name,), 1),))

    @staticmethod
    def _make(coeffs: dict):
        terms = tuple(sorted(((m, c) for m, c in coeffs.items() if c), key=_term_order))
        if not terms:
            return 0
        if len(terms) == 1 and terms[0][0] == ():
            return terms[0][1]
        return Sym(terms)

    @property
    def free_symbols(self) -> set[str]:
        return {name for m, _ in self.terms for name in m}

    def is_symbol(self) -> bool:
        """A plain symbol (`s0`), not an expression."""
        return len(self.terms) == 1 and self.terms[0][1] == 1 and len(self.terms[0][0]) == 1

    @property
    def name(self) -> str:
        return self.terms[0][0][0]

    # ---- arithmetic ----------------------------------------------------------------------
    def _coeffs(self) -> dict:
        return dict(self.terms)

    def __add__(self, other):
        if isinstance(other, Sym):
            out = self._coeffs()
            for m, c in other.terms:
                out[m] = out.get(m, 0) + c
            return Sym._make(out)
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        out = self._coeffs()
        out[()] = out.get((), 0) + other
        return Sym._make(out)

    __radd__ = __add__

    def __neg__(self):
        return Sym._make({m: -c for m, c in self.terms})

    def __pos__(self):
        return self

    def __sub__(self, other):
        if not isinstance(other, (int, Sym)) or isinstance(other, bool):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other):
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        return (-self) + other

    def __mul__(self, other):
        if isinstance(other, Sym):
            out: dict = {}
            for m1, c1 in self.terms:
                for m2, c2 in other.terms:
                    m = tuple(sorted(m1 + m2))
                    out[m] = out.get(m, 0) + c1 * c2
            return Sym._make(out)
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        return Sym._make({m: c * other for m, c in self.terms})

    __rmul__ = __mul__

    def exact_div(self, other):
        """`self // other` where it divides exactly as polynomials (by an int or a monomial),
        else None."""
        if isinstance(other, bool):
            return None
        if isinstance(other, int):
            if other and all(c % other == 0 for _, c in self.terms):
                return Sym._make({m: c // other for m, c in self.terms})
            return None
        if not isinstance(other, Sym) or len(other.terms) != 1:
            return None
        (dm, dc), = other.terms
        out = {}
        for m, c in self.terms:
            rest = list(m)
            for name in dm:
                if name not in rest:
                    return None
                rest.remove(name)
            if c % dc:
                return None
            out[tuple(rest)] = c // dc
        return Sym._make(out)

    def __floordiv__(self, other):
        """Exact division by an int or a monomial stays symbolic; anything else specialises
        (it is rare in shape rules: a stride or a kernel window over a dynamic size)."""
        if not isinstance(other, (int, Sym)):
            return NotImplemented
        q = self.exact_div(other)
        if q is not None:
            return q
        return int(self) // (int(other) if isinstance(other, Sym) else other)

    def __rfloordiv__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return other // int(self)

    def __mod__(self, other):
        if not isinstance(other, (int, Sym)):
            return NotImplemented
        if self.exact_div(other) is not None:
            return 0
        return int(self) % (int(other) if isinstance(other, Sym) else other)

    def __rmod__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return other % int(self)

    def __truediv__(self, other):
        return int(self) / other

    def __rtruediv__(self, other):
        return other / int(self)

    def __pow__(self, k):
        if isinstance(k, int) and k >= 0:
            out = 1
            for _ in range(k):
                out = self * out
            return out
        return int(self) ** k

    def __abs__(self):
        return self if self.bounds()[0] >= 0 else int(abs(int(self)))

    # ---- comparisons (guarded) -----------------------------------------------------------
    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) value over every symbol >= MIN_SIZE, where the signs allow."""
        const = 0
        low_part = 0
        signs = set()
        for m, c in self.terms:
            if m == ():
                const = c
            else:
                signs.add(c > 0)
                low_part += c * MIN_SIZE ** len(m)
        if signs == {True}:
            return const + low_part, float("inf")
        if signs == {False}:
            return float("-inf"), const + low_part
        return float("-inf"), float("inf")

    def _relation(self, op: str, other) -> bool:
        if isinstance(other, float):  # a float bound: compare the concrete size
            return _compare(int(self) - other, op)
        if isinstance(other, Sym) and other.terms == self.terms:
            return op in ("==", "<=", ">=")
        d = self - other
        if isinstance(d, int):
            return _compare(d, op)
        low, high = d.bounds()
        decided = _decide(low, high, op)
        if decided is not None:
            return decided
        env = current_env()
        if env is None:
            raise SymbolicShapeError(
                f"cannot decide {self} {op} {other} without the sizes of a call; a symbolic "
                "relation is decided while tracing (and guarded), so this IR needs that guard, "
                "or static sizes there")
        if env.frozen and op in ("==", "!="):
            equal = env.known_equality(d)
            if equal is None and d.evaluate(env.hints) != 0:
                equal = False  # unequal at the trace's sizes: say so, guard nothing
            if equal is not None:
                return equal if op == "==" else not equal
        result = _compare(d.evaluate(env.hints), op)
        env.add_guard(d, op if result else _NEGATE[op])
        return result

    def __eq__(self, other):
        if not isinstance(other, (int, Sym)) or isinstance(other, bool):
            return NotImplemented
        return self._relation("==", other)

    def __ne__(self, other):
        if not isinstance(other, (int, Sym)) or isinstance(other, bool):
            return NotImplemented
        return not self._relation("==", other)

    def __lt__(self, other):
        return self._relation("<", other)

    def __le__(self, other):
        return self._relation("<=", other)

    def __gt__(self, other):
        return self._relation(">", other)

    def __ge__(self, other):
        return self._relation(">=", other)

    def __bool__(self) -> bool:
        return self._relation("!=", 0)

    def __hash__(self) -> int:
        return self._hash

    def same(self, other) -> bool:
        """Structural equality (no guard): the same expression."""
        return isinstance(other, Sym) and other.terms == self.terms

    def __index__(self) -> int:
        """A concrete size: specialises (records `self == hint`) inside a ShapeEnv."""
        env = current_env()
        if env is None:
            raise SymbolicShapeError(
                f"the symbolic size {self} has no concrete value here; it is known per call")
        value = self.evaluate(env.hints)
        env.add_guard(self - value, "==")
        return value

    __int__ = __index__

    def __float__(self) -> float:
        return float(int(self))

    def evaluate(self, values: dict[str, int]) -> int:
        total = 0
        for m, c in self.terms:
            for name in m:
                c *= values[name]
            total += c
        return total

    # ---- text ----------------------------------------------------------------------------
    def __str__(self) -> str:
        out = []
        for m, c in self.terms:
            body = "*".join(m + ((str(abs(c)),) if abs(c) != 1 or not m else ()))
            sign = "-" if c < 0 else ("+" if out else "")
            out.append(sign + body)
        return "".join(out)

    def __repr__(self) -> str:
        return f"Sym({self})"

    def __reduce__(self):
        return (parse_sym, (str(self),))


def _proportional(a: tuple, b: tuple) -> bool:
    """Whether two polynomials' terms are a constant multiple of each other."""
    if len(a) != len(b):
        return False
    da, db = dict(a), dict(b)
    if da.keys() != db.keys():
        return False
    (m0, c0), = [next(iter(da.items()))]
    return all(c * db[m0] == db[m] * c0 for m, c in da.items())


def _term_order(term) -> tuple:
    m = term[0]
    return (m == (), -len(m), m)


_NEGATE = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}


def _compare(d: int, op: str) -> bool:
    return {"==": d == 0, "!=": d != 0, "<": d < 0, "<=": d <= 0, ">": d > 0,
            ">=": d >= 0}[op]


def _decide(low: float, high: float, op: str) -> bool | None:
    """`d op 0` for every d in [low, high], or None where it depends on d."""
    if low > 0 or high < 0:
        if op in ("==", "!="):
            return op == "!="
    if op in ("<", ">="):
        if high < 0:
            return op == "<"
        if low >= 0:
            return op == ">="
    if op in (">", "<="):
        if low > 0:
            return op == ">"
        if high <= 0:
            return op == "<="
    return None


_SYM_TEXT = re.compile(r"-?[A-Za-z0-9_*]+(?:[+-][A-Za-z0-9_*]+)*")


def parse_sym(text: str):
    """A dimension's text (`s0`, `s0*784`, `s0-1`, `12`) back to a Sym or an int."""
    if not _SYM_TEXT.fullmatch(text):
        raise SymbolicShapeError(f"not a symbolic size: {text!r}")
    total = 0
    for sign, term in re.findall(r"([+-]?)([^+-]+)", text):
        value = -1 if sign == "-" else 1
        for factor in term.split("*"):
            if factor.isdigit():
                value = value * int(factor)
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", factor):
                value = Sym.symbol(factor) * value
            else:
                raise SymbolicShapeError(f"not a symbolic size: {text!r}")
        total = total + value
    return total


def same_shape(a: tuple, b: tuple) -> bool:
    """The same shape, symbolic sizes compared as expressions: a structural test (an
    optimisation asking "is this the identity?") that never records a guard."""
    return len(a) == len(b) and all(
        x.same(y) if type(x) is Sym else (type(y) is not Sym and x == y) for x, y in zip(a, b))


def is_symbolic(x) -> bool:
    return isinstance(x, Sym)


def has_symbols(shape) -> bool:
    return any(type(d) is Sym for d in shape)


def free_symbols(items) -> set[str]:
    """The symbols in a shape, an attribute value or nested tuples of them."""
    out: set[str] = set()
    if isinstance(items, Sym):
        return items.free_symbols
    if isinstance(items, (tuple, list)):
        for x in items:
            out |= free_symbols(x)
    return out


def evaluate(x, values: dict[str, int]):
    """`x` (an int, a Sym, or nested tuples of them) with every symbol given its value."""
    if type(x) is Sym:
        return x.evaluate(values)
    if isinstance(x, tuple):
        return tuple(evaluate(v, values) for v in x)
    if isinstance(x, list):
        return [evaluate(v, values) for v in x]
    return x


def bind(declared: list[tuple], actual: list[tuple], names: list[str] | None = None
         ) -> dict[str, int]:
    """The value of every symbol in the `declared` shapes from the `actual` ones: plain
    symbols bind first, then every dimension is checked (a symbol twice, an expression, a
    static size). Raises SymbolicShapeError naming the input and dimension that does not fit.
    """
    values: dict[str, int] = {}
    for shape, got in zip(declared, actual):
        for d, n in zip(shape, got):
            if type(d) is Sym and d.is_symbol() and d.name not in values:
                values[d.name] = int(n)
    for k, (shape, got) in enumerate(zip(declared, actual)):
        where = f"input {names[k] if names else k}"
        if len(shape) != len(got):
            raise SymbolicShapeError(f"{where}: expected {len(shape)} dimensions, got "
                                     f"{list(got)}")
        for d, (want, n) in enumerate(zip(shape, got)):
            if type(want) is Sym:
                missing = want.free_symbols - values.keys()
                if missing:
                    raise SymbolicShapeError(f"{where}: dimension {d} is {want}, and "
                                             f"{sorted(missing)} is bound by no input")
                value = want.evaluate(values)
                if value != n or n < MIN_SIZE:
                    why = f" (a symbolic size is at least {MIN_SIZE})" if n < MIN_SIZE else ""
                    raise SymbolicShapeError(
                        f"{where}: dimension {d} is {want} = {value}, got size {n}{why} in "
                        f"{list(got)}")
            elif want != n:
                raise SymbolicShapeError(f"{where}: dimension {d} is {want}, got size {n} in "
                                         f"{list(got)}")
    return values


class ShapeEnv:
    """The symbols of one symbolic trace: their hints (sizes at the trace), where each came
    from, and the guards (relations `expr op 0` the trace assumed), in order."""

    def __init__(self, hints: dict[str, int] | None = None) -> None:
        self.hints: dict[str, int] = dict(hints or {})
        self.sources: dict[str, str] = {}
        self._guards: dict[tuple, None] = {}
        self.frozen = False  # see `structural`

    def new_symbol(self, hint: int, source: str = "") -> Sym:
        name = f"s{len(self.hints)}"
        self.hints[name] = int(hint)
        self.sources[name] = source
        return Sym.symbol(name)

    def add_guard(self, expr: Sym, op: str) -> None:
        key = (expr.terms, op)
        if key not in self._guards:
            self._guards[key] = user_source_location()

    def guard_location(self, name: str) -> str | None:
        """The user source line of the first guard that mentions symbol `name`."""
        for (terms, _), loc in self._guards.items():
            if any(name in m for m, _ in terms) and loc:
                return loc
        return None

    @property
    def relations(self) -> list[tuple[Sym, str]]:
        """The guards as (expr, op): each says `expr op 0` held at the trace."""
        return [(Sym(terms), op) for terms, op in self._guards]

    @property
    def guards(self) -> list[str]:
        return [f"{e} {op} 0" for e, op in self.relations]

    def specialised(self) -> dict[str, int]:
        """Symbols a guard pinned to one value (`s0-32 == 0`, `-s0*2+64 == 0`): symbol ->
        value."""
        out = {}
        for e, op in self.relations:
            if op != "==":
                continue
            linear = [(m, c) for m, c in e.terms if m]
            const = sum(c for m, c in e.terms if not m)
            if len(linear) == 1 and len(linear[0][0]) == 1 and const % linear[0][1] == 0:
                out[linear[0][0][0]] = -const // linear[0][1]
        return out

    def known_equality(self, d: Sym) -> bool | None:
        """Whether a guard says `d == 0` (True) or `d != 0` (False), that guard being on d
        or on a multiple of it; None if none does."""
        for (terms, op), _ in self._guards.items():
            if op in ("==", "!=") and _proportional(terms, d.terms):
                return op == "=="
        return None

    @contextlib.contextmanager
    def structural(self) -> Iterator[ShapeEnv]:
        """Inside: an equality between sizes that a guard (on it or a multiple of it) decides
        is answered from that guard; one that does not hold at the trace's sizes is answered
        "unequal" and guards nothing. For passes and backends over a traced graph: they
        compare shapes to choose an optimisation, and a guard from such a choice would
        restrict the graph for nothing (`s0 != 4` because a fused group's domain was
        compared with a bias of 4). An equality that holds at the trace's sizes, and every
        inequality, still guards."""
        previous, self.frozen = self.frozen, True
        try:
            yield self
        finally:
            self.frozen = previous

    @contextlib.contextmanager
    def active(self) -> Iterator[ShapeEnv]:
        previous = current_env()
        _local.env = self
        try:
            yield self
        finally:
            _local.env = previous


def relation_holds(e: Sym, op: str, values: dict[str, int]) -> bool:
    """Whether the guard `e op 0` holds for the symbols' `values`."""
    return _compare(e.evaluate(values), op)


def check_relations(relations, values: dict[str, int]) -> list[str]:
    """The relations (expr, op) that do not hold for `values`, as text."""
    failed = []
    for e, op in relations:
        v = e.evaluate(values)
        if not _compare(v, op):
            failed.append(f"{e} {op} 0 (it is {v})")
    return failed


__all__ = ["MIN_SIZE", "ShapeEnv", "Sym", "SymbolicShapeError", "bind", "check_relations",
           "current_env", "evaluate", "free_symbols", "has_symbols", "is_symbolic",
           "parse_sym", "relation_holds", "same_shape"]
