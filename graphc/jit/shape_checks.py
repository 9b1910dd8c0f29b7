"""A symbolic entry's fast-path checks written out: its guard's, then its ShapeGuard's.

A compiled callable's first try (graphc.jit.compiler, `Compiled._fast_path`) runs the newest
entry's guard checks and its plan in one frame each. A symbolic entry (dynamic shapes) also
has a ShapeGuard (graphc.jit.signature): each symbol one size >= 2 read from the argument
dims it was traced from, and the relations its shape rules needed. `ShapeGuard.holds` reads
them through a dict and evaluates each relation's polynomial term by term; `fast_checks`
writes the same checks out for one entry, as graphc.jit.guards.compile_checks writes a
guard: each dim read into a local by its position, each relation one comparison of a
polynomial over those locals. The same answer as `guard.holds(...) and shapes.holds(...)`
for every call (it may only fail where they hold if an array is gone, which `holds` reads
through the fetching `_data`; the general path then decides).
"""

from __future__ import annotations

from typing import Callable

from graphc.symbolic import MIN_SIZE, Sym

__all__ = ["fast_checks"]


def fast_checks(guard_checks: Callable, shapes) -> Callable:
    """`checks(args, kwargs) -> bool`: `guard_checks` (a Guard's compiled checks), then the
    ShapeGuard `shapes`' (see the module docstring). Where a symbol is read from a tensor
    that is not a positional argument (or a relation names a symbol no dim gives), its
    `holds` itself runs after the guard's checks."""
    read = {name for _, _, name in shapes.sources}
    if any(len(path) != 2 or path[0] != 0 for path, _, _ in shapes.sources) or any(
            type(e) is Sym and not e.free_symbols <= read for e, _ in shapes.relations):
        holds = shapes.holds

        def checks_and_shapes(args: tuple, kwargs: dict) -> bool:
            return guard_checks(args, kwargs) and holds(args, kwargs)

        return checks_and_shapes
    local = {}  # symbol -> the local its first source was read into
    lines = ["if not GUARD(args, kwargs):", "    return False", "try:"]
    same = []
    for path, dim, name in shapes.sources:
        read = f"args[{path[1]}]._array.shape[{dim}]"
        if name in local:  # the symbol again: the same size
            same.append(f"{read} == {local[name]}")
        else:
            local[name] = f"v{len(local)}"
            lines.append(f"    {local[name]} = {read}")
    lines += ["except IndexError:  # a rank smaller than the trace's", "    return False"]
    holds = [f"{v} >= {MIN_SIZE}" for v in local.values()] + same
    holds += [f"{_polynomial(e, local)} {op} 0" for e, op in shapes.relations]
    lines.append("return (" + "\n        and ".join(holds or ["True"]) + ")")
    source = "def checks(args, kwargs):\n" + "".join(f"    {line}\n" for line in lines)
    names = {"GUARD": guard_checks}
    exec(compile(source, "<graphc shape guard>", "exec"), names)  # noqa: S102 (our own text)
    checks = names["checks"]
    checks.__doc__ = source
    return checks


def _polynomial(e, local: dict[str, str]) -> str:
    """`e` (a Sym, or an int) as a Python expression over the locals its symbols were read
    into (`Sym.evaluate`'s sum of terms)."""
    if type(e) is not Sym:
        return f"({int(e)})"
    terms = ["*".join([f"({c})"] + [local[name] for name in monomial])
             for monomial, c in e.terms]
    return "(" + " + ".join(terms) + ")"
