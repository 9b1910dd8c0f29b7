"""A CpuExecutable's steady call, written out for that executable: one Python function.

The steady call is a loop's call (graphc.backends.cpu.executable, "The steady call"): the
last call's input arrays again, unchanged, and every large output a kept array the caller
has dropped, so the pointer tables already hold every address but the new small outputs'
(and, in a training step, whose `.grad` outputs the user holds until the next step replaces
them, those of the outputs that go back to the array of two calls ago: a ping-pong).
`CpuExecutable.run` checks that with generic loops (maps over the inputs, a loop over the
outputs). `compile_steady_call(executable, ...)` writes the same checks out for one
executable, as `graphc.jit.guards.compile_checks` does for a guard: its inputs unpacked by
name, each check one comparison against a constant of the function, every output on its own
line, the result list spelled out. After a short native run (SGEMM 256: 0.2 ms) every
bytecode, object and C function a call touches is a cache miss, and this is ~3 us less of
them than the loops (docs/performance.md, "SGEMM 256, eighth session").

The function, `steady(executable, arrays)`, does exactly what `run` does: under the
executable's lock, the same checks in the same order (identity with the last inputs first,
then shapes, dtypes and the written inputs' writeable flags; each kept output's last array
unreferenced and of its slot's type, else the one before it, as `_outputs` picks), the same
outputs made, the same native run on the
chooser's thread count, and the same way out to `_call` for anything else. It takes the
executable as an argument and reads from it, per call, what a caller may replace (`_run`,
`thread_chooser`, `_native`, `_call`, `_failed`) and the lists it updates in place
(`_last_inputs`, `_recent`); its constants are what never changes after the executable is
made (types, the pointer tables, the driver's tail, the lock). It holds no reference to the
executable, so storing it on the executable makes no cycle. Its text is its `__doc__`.

A runtime-sized executable (graphc.backends.cpu.runtime_sizes) has one per call size,
written for that size's types and driver tail (`sized`): the same checks against that size's
constants, after one more, that the arena the tail points into is still the executable's.

Not made (None) for an executable whose calls agree on collectives or return window views,
or where reference counts cannot tell a dropped array (graphc.refcounts): `run` keeps
those.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from graphc.refcounts import COUNTS_ARE_EXACT

__all__ = ["compile_steady_call"]


def compile_steady_call(executable, address: Callable, new_address: Callable,
                        sized=None) -> Callable | None:
    """`steady(executable, arrays)` for this executable (see the module docstring), or None.
    `address` and `new_address` give an array's data address (graphc.backends.cpu.executable's
    helpers). A call with another number of inputs goes to `run_general` (which says so).

    `sized`: a runtime-sized executable's one call size (graphc.backends.cpu.runtime_sizes'
    `_Sizes`: its concrete input and output types, and the driver's tail, which holds that
    size's sizes table and the arena it was made for). The function then checks, first under
    the lock, that the executable's arena is still that one (a larger size grows it), else
    takes `_sized_call` for the size; it sets the size's input types for `_call`'s checks;
    and a call it does not take goes to `_call` with that size's output types and tail, or
    to `_sized_call` for another number of inputs."""
    if executable._collectives or executable._window_views or not COUNTS_ARE_EXACT:
        return None
    if sized is None:
        types, out_types, tail = executable._in_types, executable._out_types, executable._tail
    else:
        types, out_types, tail = sized.in_types, sized.out_types, sized.tail
    names: dict[str, Any] = {"getrefcount": sys.getrefcount, "empty": np.empty,
                             "address": address, "new_address": new_address,
                             "LOCK": executable._lock,
                             "IN": executable._in_ptrs, "OUT": executable._out_ptrs,
                             "TAIL": tail, "OUT_TYPES": out_types, "IN_TYPES": types,
                             "SIZED": sized, "ARENA": None if sized is None else sized.arena}

    def name(prefix: str, value) -> str:
        key = f"{prefix}{len(names)}"
        names[key] = value
        return key

    inputs = [f"a{i}" for i in range(types.count)]
    lines = [f"if len(arrays) != {types.count}:",
             "    return ex.run_general(arrays)" if sized is None else
             "    return ex.run_sized(SIZED, arrays, general=True)"]
    if inputs:
        lines.append(f"{', '.join(inputs)}, = arrays")
    lines.append("with LOCK:  # the pointer tables and the arena are shared by every call")
    body = []
    if sized is not None:  # TAIL points into this arena; `_call` checks against IN_TYPES
        body += ["if ex._raw is not ARENA:  # grown for a larger size since",
                 "    return ex._sized_call(SIZED, arrays)",
                 "ex._in_types = IN_TYPES"]
    checks = ["last = ex._last_inputs"] if inputs else []
    same = [f"{a} is last[{i}]" for i, a in enumerate(inputs)]
    same += [f"{a}.shape == {name('shape', shape)}"
             for a, shape in zip(inputs, types.shapes)]
    same += [f"{a}.dtype is {name('dtype', dtype)}" for a, dtype in zip(inputs, types.dtypes)]
    same += [f"a{i}.flags.writeable" for i in sorted(executable._written)]
    if same:
        checks += ["if not (" + "\n                and ".join(same) + "):",
                   "    return ex._call(arrays, OUT_TYPES, TAIL)"]
    body += checks
    if any(large for _, _, large in out_types):
        body.append("recent = ex._recent")
    held: list[str] = []
    for k, (shape, dtype, large) in enumerate(out_types):
        out = f"o{k}"
        if large:  # the last call's array, unreferenced: its pair, `out`, getrefcount's
            held.append(out)
            unused = (f"{out} is None or getrefcount({out}) != 3 "
                      f"or {out}.shape != {name('shape', shape)} "
                      f"or {out}.dtype is not {name('dtype', dtype)}")
            body += [f"kept = recent[{k}]",
                     f"{out} = kept[0][0]",
                     f"if {unused}:",
                     # a training step: the last call's array is the `.grad` the user
                     # holds; the array of two calls ago goes back, as `_outputs` picks it
                     "    older = kept[1]",
                     f"    {out} = older[0]",
                     f"    if {unused}:",
                     # `_outputs` counts references: drop ours first
                     f"        {' = '.join(held)} = None",
                     "        return ex._call(arrays, OUT_TYPES, TAIL, arrays)",
                     f"    recent[{k}] = [older, kept[0]]",
                     f"    OUT[{k}] = older[1]"]
    for k, (shape, dtype, large) in enumerate(out_types):
        if not large:  # new, as in `_outputs`
            size = int(np.prod(shape, dtype=np.int64))
            body += [f"o{k} = empty({name('shape', shape)}, {name('dtype', dtype)})",
                     f"OUT[{k}] = {'new_address' if size else 'address'}(o{k})"]
    body += ["status = ex._run(IN, OUT, *TAIL) if ex.thread_chooser.most == 1 "
             "else ex._native(TAIL)",
             "if status:",
             "    ex._failed(status)"]
    results = [f"o{k}" if kind == "out" else f"a{k}" for kind, k in executable._results]
    body.append(f"return [{', '.join(results)}]")
    lines += [f"    {line}" for line in body]
    source = "def steady(ex, arrays):\n" + "".join(f"    {line}\n" for line in lines)
    at = "" if sized is None else " at " + ", ".join(
        f"{n}={v}" for n, v in sized.values.items())
    code = compile(source, f"<graphc steady call @{executable.graph.name}{at}>", "exec")
    exec(code, names)  # noqa: S102
    steady = names["steady"]
    steady.__doc__ = source
    return steady
