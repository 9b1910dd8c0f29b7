"""The picture of a MemoryPlan (its text is graphc.passes.memory_report).

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

from graphc.passes.plan import MemoryPlan

# (fill, border) per buffer role
COLORS = {"temp": ("#9ecae1", "#3182bd"), "kept": ("#fdae6b", "#e6550d")}
LIVE = "#31a354"
LABEL_MIN = 0.06  # label buffers taller than this fraction of the arena


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


__all__ = ["render_memory"]
