"""The text of a MemoryPlan's report: its paragraph and its lifetime table.

`format_report` and `format_table` are `MemoryPlan.report` and `MemoryPlan.table`; the picture
of the same plan is `graphc.tools.memory_viz.render_memory`.
"""

from __future__ import annotations

from graphc.passes.plan import ALIGN, MemoryPlan


def format_report(plan: MemoryPlan) -> str:
    """One paragraph: the schedule, the buffers, arena bytes against the bounds."""
    live, arena, naive = plan.max_live_bytes, plan.arena_bytes, plan.naive_bytes
    peak = plan.live_bytes.index(live) if plan.live_bytes else 0
    at = ""
    if plan.schedule:
        node = plan.schedule[peak]
        at = f" (peak at step {peak}: %{node.outputs[0].name} = {node.op})"
    return (
        f"plan_buffers @{plan.graph_name}: {len(plan.schedule)} nodes in a {plan.scheduler} "
        f"schedule; {len(plan.buffer_of)} intermediates in {len(plan.buffers)} buffers "
        f"({len(plan.views)} views alias their input, {len(plan.inplace)} outputs written in "
        f"place, {len(plan.in_input)} updates computed into their inputs). Arena "
        f"{_kib(arena)} = {_ratio(arena, live)} x the max-live lower bound {_kib(live)}{at} "
        f"and {_ratio(arena, naive)} x the naive sum of all intermediates {_kib(naive)}; "
        f"offsets are {ALIGN}-byte aligned.")


def format_table(plan: MemoryPlan) -> str:
    """One line per buffer: offset, bytes, live steps and the values it holds."""
    rows = [f"{'buffer':<10} {'offset':>10} {'bytes':>10} {'steps':>11}  values", "-" * 64]
    for b in sorted(plan.buffers.values(), key=lambda b: (b.offset, b.start)):
        names = []
        for v in b.values:
            mark = "(view)" if v in plan.views else "(in place)" if v in plan.inplace else ""
            names.append(f"%{v}{mark}")
        steps = f"{b.start}-{b.end}" + ("*" if b.kept else "")
        rows.append(f"%{b.name:<9} {b.offset:>10} {b.size:>10} {steps:>11}  " + " ".join(names))
    rows.append("(* holds a graph output or update: live to the last step)")
    if plan.in_input:
        rows.append("updates computed into their inputs: " + ", ".join(
            f"%{v} -> %{w}" for v, w in plan.in_input.items()))
    return "\n".join(rows)


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB"


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.3f}" if b else "-"

__all__ = ["format_report", "format_table"]
