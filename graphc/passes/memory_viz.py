"""The memory report of a MemoryPlan: its paragraph, its lifetime table and its picture.

`format_report` and `format_table` are the text (`MemoryPlan.report` / `.table`).
`render_memory` draws every buffer of the arena over the schedule: x is the schedule step,
y the arena offset; each buffer is one rectangle spanning its lifetime (steps start..end,
inclusive) and its bytes. Buffers that hold a graph output or an update have their own
colour, buffers reused in place are hatched, and the bytes live at each step are a step
curve, with the arena size and the max-live lower bound as horizontal lines. Drawn by
matplotlib's Agg/SVG canvases (never a GUI); importing this module does not import
matplotlib.
"""

from __future__ import annotations

import io
import os

from graphc.passes.plan import ALIGN, MemoryPlan

# (fill, border) per buffer role
COLORS = {"temp": ("#9ecae1", "#3182bd"), "kept": ("#fdae6b", "#e6550d")}
LIVE = "#31a354"
LABEL_MIN = 0.06  # label buffers taller than this fraction of the arena


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


def render_memory(plan: MemoryPlan, path: str | os.PathLike | None = None, *,
                  fmt: str | None = None, dpi: int = 110) -> bytes:
    """Draw `plan`'s buffers over its schedule; write PNG or SVG (by `path`'s extension).

    Returns the file's bytes (also when `path` is None; then `fmt` says "png" or "svg").

    >>> from graphc.ir import parse
    >>> from graphc.passes.plan import plan_buffers
    >>> g = plan_buffers(parse('''graph @f(%x: f32[16]) -> (f32[16]) {
    ...   %0: f32[16] = exp(%x)
    ...   return (%0)
    ... }'''))
    >>> render_memory(g.meta["memory_plan"], fmt="svg")[:5]
    b'<?xml'
    """
    if fmt is None:
        if path is None:
            raise ValueError("render_memory needs a path ending in .png or .svg, or fmt=")
        fmt = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if fmt not in ("png", "svg"):
        raise ValueError(f"render_memory writes .png or .svg, got {fmt!r} (from {path!r})")
    data = _draw(plan, fmt, dpi)
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data


def _draw(plan: MemoryPlan, fmt: str, dpi: int) -> bytes:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    steps = max(len(plan.schedule), 1)
    kib = 1024.0
    top = max(plan.arena_bytes, plan.max_live_bytes, 1) / kib
    reused = {plan.buffer_of[out] for out in plan.inplace}
    rc = {"svg.fonttype": "none", "svg.hashsalt": "graphc", "font.size": 8}
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=(min(6 + steps * 0.08, 26), 6))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for b in sorted(plan.buffers.values(), key=lambda b: (b.offset, b.start)):
            if not b.size:
                continue
            fill, edge = COLORS["kept" if b.kept else "temp"]
            y, h = b.offset / kib, b.size / kib
            ax.add_patch(Rectangle((b.start, y), b.end - b.start + 1, h, facecolor=fill,
                                   edgecolor=edge, linewidth=0.6, alpha=0.85,
                                   hatch="//" if b.name in reused else None))
            if h >= LABEL_MIN * top:
                ax.text(b.start + 0.2, y + h / 2, f"%{b.name}", va="center", ha="left",
                        fontsize=7, clip_on=True)
        xs = [s + k for s in range(len(plan.live_bytes)) for k in (0, 1)]  # flat per step
        ys = [v / kib for v in plan.live_bytes for _ in (0, 1)]
        ax.plot(xs, ys, color=LIVE, linewidth=1.4, label="live bytes")
        ax.axhline(plan.arena_bytes / kib, color="#636363", linestyle="--", linewidth=0.9)
        ax.axhline(plan.max_live_bytes / kib, color=LIVE, linestyle=":", linewidth=0.9)
        ax.set_xlim(0, steps)
        ax.set_ylim(0, top * 1.08)
        ax.set_xlabel("schedule step")
        ax.set_ylabel("arena offset (KiB)")
        ax.set_title(f"memory plan @{plan.graph_name}: arena {plan.arena_bytes / kib:.1f} KiB, "
                     f"max live {plan.max_live_bytes / kib:.1f} KiB, naive "
                     f"{plan.naive_bytes / kib:.1f} KiB")
        ax.legend(handles=[
            Patch(facecolor=COLORS["temp"][0], edgecolor=COLORS["temp"][1], label="buffer"),
            Patch(facecolor=COLORS["kept"][0], edgecolor=COLORS["kept"][1],
                  label="output / update (live to the end)"),
            Patch(facecolor="white", edgecolor="#555555", hatch="//", label="reused in place"),
            Line2D([], [], color=LIVE, label="live bytes (max: dotted)"),
            Line2D([], [], color="#636363", linestyle="--", label="arena"),
        ], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, framealpha=0.9)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format=fmt, dpi=dpi)
    return out.getvalue()


__all__ = ["format_report", "format_table", "render_memory"]
