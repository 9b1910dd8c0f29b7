"""Views of an IR graph for tools and people: networkx, Graphviz DOT, SVG and PNG pictures.

- `to_networkx(graph)` is the analysis view: a `networkx.MultiDiGraph` with one node per IR
  node ("n<i>"), per graph input ("in<i>"), per graph output ("out<i>") and per in-place
  update ("upd<i>": the value written back into an input), and one edge per value use, keyed
  by the input position. Graph order is a topological order of it; it is acyclic iff the IR is.
- `to_dot(graph)` is Graphviz text: ops with short attributes and output types, inputs as
  ellipses, outputs as double ellipses, value names on edges, fused groups boxed (a node
  whose op is "fused", or the nodes sharing an attribute `group`, sit in a cluster).
- `render_svg` / `render_png` draw the graph with Graphviz's `dot` when it is on PATH, and
  otherwise with pip packages alone: a layered layout from networkx (topological
  generations, each node pulled down next to its first user, barycenter ordering within a
  layer) drawn by matplotlib's Agg/SVG backends (never a GUI). Both pictures show the same
  boxes, types and groups; `engine=` picks one explicitly.

Nothing here changes the graph, and importing this module does not import matplotlib.

>>> from graphc.ir import parse
>>> g = parse('graph @f(%x: f32[3]) -> (f32[3]) {\\n  %0: f32[3] = exp(%x)\\n  return (%0)\\n}')
>>> sorted(to_networkx(g).edges(keys=True))
[('in0', 'n0', 0), ('n0', 'out0', 0)]
>>> 'n0 [label="exp\\\\nf32[3]"' in to_dot(g)
True
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import networkx as nx

from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import format_literal, format_node
from graphc.ir.verifier import VerifyError

Engine = Literal["auto", "graphviz", "matplotlib"]

MAX_ATTRS = 3  # attributes shown per node; the rest become "+k more"
MAX_ATTR_CHARS = 22  # one attribute's "key=value" is cut to this length
LINE_CHARS = 30  # label lines wrap at this width; a longer word is cut with an ellipsis
MAX_HEAD_LINES = 3  # a fused node's op list takes at most this many lines
# Attribute values that restate the common default; hiding them keeps labels short.
_QUIET_ATTRS = {"dilation": (1, 1), "groups": 1, "ceil_mode": False}

# (fill, border) per kind of box, shared by the DOT text and the matplotlib drawing.
COLORS = {
    "input": ("#e8f5e9", "#2e7d32"),
    "output": ("#fff3e0", "#e65100"),
    "update": ("#fce4ec", "#ad1457"),
    "node": ("#eef3fb", "#4a6fa5"),
    "const": ("#f2f2f2", "#8a8a8a"),
    "fused": ("#f3e5f5", "#6a1b9a"),
}


# ---- the networkx view ----------------------------------------------------------------------
def to_networkx(graph: Graph) -> nx.MultiDiGraph:
    """The graph as a `networkx.MultiDiGraph` (see the module docstring for the node ids).

    Node attributes: `kind` ("input", "node", "output", "update"), `index`, `label` (text
    lines), and for IR nodes `op`, `attrs`, `loc`, `types` (output TensorTypes), `outputs`
    (their names), `node` (the Node); for the others `name`, `type`, `value` (the Value).
    Edge attributes: `value` (the name), `type`, `position` (the input index at the user).

    >>> from graphc.ir import parse
    >>> g = parse('graph @f(%x: f32[2]) -> (f32[2]) {\\n  %0: f32[2] = mul(%x, %x)\\n'
    ...           '  return (%0)\\n}')
    >>> G = to_networkx(g)
    >>> G.number_of_edges("in0", "n0"), nx.is_directed_acyclic_graph(G)
    (2, True)
    """
    G = nx.MultiDiGraph(name=graph.name)
    source: dict[Value, str] = {}
    for i, v in enumerate(graph.inputs):
        G.add_node(f"in{i}", kind="input", index=i, name=v.name, type=v.type, value=v,
                   label=[f"%{v.name}", str(v.type)])
        source[v] = f"in{i}"

    def use(v: Value, target: str, position: int, where: str) -> None:
        if v not in source:
            raise VerifyError(f"{where}: %{v.name} is used before it is defined")
        G.add_edge(source[v], target, key=position, value=v.name, type=v.type, position=position)

    for i, node in enumerate(graph.nodes):
        G.add_node(f"n{i}", kind="node", index=i, op=node.op, attrs=dict(node.attrs),
                   loc=node.loc, types=[v.type for v in node.outputs],
                   outputs=[v.name for v in node.outputs], node=node, label=node_label(node))
        for position, v in enumerate(node.inputs):
            use(v, f"n{i}", position, f"{node.op} at {node.loc or 'unknown location'}")
        for v in node.outputs:
            source[v] = f"n{i}"
    for i, v in enumerate(graph.outputs):
        G.add_node(f"out{i}", kind="output", index=i, name=v.name, type=v.type, value=v,
                   label=[f"output {i}", str(v.type)])
        use(v, f"out{i}", 0, f"output {i}")
    for i, (target, v) in enumerate(graph.updates):
        G.add_node(f"upd{i}", kind="update", index=i, name=target.name, type=v.type, value=v,
                   label=[f"%{target.name} \u2190", str(v.type)])
        use(v, f"upd{i}", 0, f"update of %{target.name}")
    return G


def node_label(node: Node) -> list[str]:
    """Label lines of an IR node: op (a fused node lists its ops, wrapped, at most
    MAX_HEAD_LINES lines), short attributes, types; no line is longer than LINE_CHARS (a
    longer item is cut with an ellipsis), so a label always fits the box drawn for it."""
    ops = fused_ops(node)
    head = _wrap([node.op], "") if ops is None else _fused_head(ops)
    shown = [f"{key}={short_literal(value)}" for key, value in node.attrs.items()
             if not _redundant(node, key, value)]
    shown = [_cut(s, MAX_ATTR_CHARS) for s in shown]
    if len(shown) > MAX_ATTRS:
        shown = shown[:MAX_ATTRS] + [f"+{len(shown) - MAX_ATTRS} more"]
    types = [str(v.type) for v in node.outputs]
    return head + _wrap(shown, " ") + _wrap(types, ", ")


def fused_ops(node: Node) -> list[str] | None:
    """The ops of a fused node's body in order, constants (`full`) left out; None for a node
    that is not fused (or has neither a `body` nor an `ops` attribute)."""
    if node.op != "fused":
        return None
    if isinstance(node.attrs.get("body"), (tuple, list)):
        return [str(i[0]) for i in node.attrs["body"] if str(i[0]) != "full"]
    if isinstance(node.attrs.get("ops"), (tuple, list)):
        return [str(op) for op in node.attrs["ops"]]
    return None


def _fused_head(ops: list[str]) -> list[str]:
    """`fused(add, relu)` wrapped at LINE_CHARS; past MAX_HEAD_LINES lines, `... +k ops)`."""
    if not ops:
        return ["fused()"]
    words = [op + ("," if i < len(ops) - 1 else ")") for i, op in enumerate(ops)]
    words[0] = "fused(" + words[0]
    lines = _wrap(words, " ")
    if len(lines) > MAX_HEAD_LINES:
        kept = lines[:MAX_HEAD_LINES - 1]
        rest = len(ops) - sum(len(line.split(" ")) for line in kept)
        lines = kept + [f"\u2026 +{rest} ops)"]
    return lines


def short_literal(value: Any) -> str:
    """An attribute as IR text, floats to 4 significant digits (0.8999999761 reads 0.9)."""
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        text = f"{value:.4g}"
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, (tuple, list)):
        inner = ",".join(short_literal(v) for v in value)
        return "(" + inner + ("," if len(value) == 1 else "") + ")"
    return format_literal(value)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _redundant(node: Node, key: str, value: Any) -> bool:
    """Attributes the picture shows elsewhere (group, fused ops, the output type) or defaults."""
    fused_detail = node.op == "fused" and key in ("ops", "body", "outputs")
    if key == "group" or fused_detail or _QUIET_ATTRS.get(key, object()) == value:
        return True
    if len(node.outputs) == 1:
        out = node.outputs[0].type
        return (key == "shape" and tuple(value or ()) == tuple(out.shape)) or \
            (key == "dtype" and value == out.dtype.name)
    return False


def _wrap(items: list[str], sep: str) -> list[str]:
    """Items joined by `sep` into lines of at most LINE_CHARS (a longer item is cut)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= LINE_CHARS:
            lines[-1] += sep + item
        else:
            lines.append(_cut(item, LINE_CHARS))
    return lines


def _box_kind(data: dict[str, Any]) -> str:
    if data["kind"] != "node":
        return data["kind"]
    if data["op"] == "fused":
        return "fused"
    return "const" if not data["node"].inputs else "node"


def _clusters(G: nx.MultiDiGraph) -> list[tuple[str, list[str]]]:
    """(title, member ids) per box: the nodes sharing a `group` attribute, each fused node."""
    groups: dict[Any, list[str]] = {}
    boxes: list[tuple[str, list[str]]] = []
    for n, data in G.nodes(data=True):
        if data["kind"] != "node":
            continue
        group = data["attrs"].get("group")
        if group is not None:
            if group not in groups:
                groups[group] = []
                boxes.append((f"group {format_literal(group)}", groups[group]))
            groups[group].append(n)
        elif data["op"] == "fused":
            boxes.append(("fused", [n]))
    return boxes


# ---- DOT text ---------------------------------------------------------------------------------
def dot_quote(text: str) -> str:
    """A DOT double-quoted string; newlines become DOT's centred line breaks (\\n)."""
    lines = text.split("\n")
    return '"' + "\\n".join(s.replace("\\", "\\\\").replace('"', '\\"') for s in lines) + '"'


_DOT_SHAPES = {"input": "shape=ellipse", "output": "shape=ellipse, peripheries=2",
               "update": 'shape=ellipse, style="filled,dashed"'}


def to_dot(graph: Graph) -> str:
    """Graphviz DOT text of the graph, top to bottom (see the module docstring).

    >>> from graphc.ir import parse
    >>> print(to_dot(parse('graph @f(%x: f32[3]) -> (f32[3]) {\\n  %0: f32[3] = exp(%x)\\n'
    ...                    '  return (%0)\\n}')).splitlines()[0])
    digraph "f" {
    """
    G = to_networkx(graph)
    out = [f"digraph {dot_quote(graph.name)} {{",
           '  graph [rankdir=TB, nodesep=0.25, ranksep=0.3, fontname="Helvetica", '
           f"label={dot_quote('graph @' + graph.name)}, labelloc=t];",
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
           '  edge [fontname="Helvetica", fontsize=8, color="#555555", fontcolor="#666666", '
           "arrowsize=0.6];"]

    def node_line(n: str, indent: str) -> str:
        data = G.nodes[n]
        kind = _box_kind(data)
        fill, border = COLORS[kind]
        extra = f", {_DOT_SHAPES[kind]}" if kind in _DOT_SHAPES else ""
        label = dot_quote("\n".join(data["label"]))
        if data["kind"] == "node":  # the whole IR line as a hover text (labels are cut)
            extra += f", tooltip={dot_quote(format_node(data['node']))}"
        return f'{indent}{n} [label={label}, fillcolor="{fill}", color="{border}"{extra}];'

    clustered: set[str] = set()
    for i, (title, members) in enumerate(_clusters(G)):
        out.append(f"  subgraph cluster_{i} {{")
        out.append(f'    label={dot_quote(title)}; style="dashed,rounded"; '
                   f'color="{COLORS["fused"][1]}"; fontsize=9;')
        out += [node_line(n, "    ") for n in members]
        out.append("  }")
        clustered.update(members)
    out += [node_line(n, "  ") for n in G.nodes if n not in clustered]
    for u, v, data in G.edges(data=True):
        out.append(f"  {u} -> {v} [label={dot_quote('%' + data['value'])}];")
    out.append("}")
    return "\n".join(out) + "\n"


# ---- rendering --------------------------------------------------------------------------------
def render_svg(graph: Graph, path: str | os.PathLike | None = None, *,
               engine: Engine = "auto") -> str:
    """SVG text of a picture of the graph; also written to `path` when given.

    `engine="auto"` uses Graphviz's `dot` when it is on PATH and matplotlib otherwise;
    "graphviz" or "matplotlib" force one.

    >>> from graphc.ir import parse
    >>> g = parse('graph @f(%x: f32[3]) -> (f32[3]) {\\n  %0: f32[3] = exp(%x)\\n'
    ...           '  return (%0)\\n}')
    >>> "exp" in render_svg(g, engine="matplotlib")
    True
    """
    data = _render(graph, "svg", engine)
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data.decode("utf-8")


def render_png(graph: Graph, path: str | os.PathLike, *, engine: Engine = "auto",
               dpi: int = 110) -> str:
    """Write a PNG picture of the graph to `path` (engines as in `render_svg`); return path."""
    data = _render(graph, "png", engine, dpi)
    with open(path, "wb") as f:
        f.write(data)
    return os.fspath(path)


def _render(graph: Graph, fmt: str, engine: Engine, dpi: int = 110) -> bytes:
    if engine not in ("auto", "graphviz", "matplotlib"):
        raise ValueError(f"engine must be 'auto', 'graphviz' or 'matplotlib', got {engine!r}")
    dot_exe = shutil.which("dot") if engine != "matplotlib" else None
    if engine == "graphviz" and dot_exe is None:
        raise RuntimeError("engine='graphviz' needs Graphviz's `dot` on PATH "
                           "(apt-get install graphviz); engine='matplotlib' needs no program")
    if dot_exe is not None:
        args = [dot_exe, f"-T{fmt}"] + ([f"-Gdpi={dpi}"] if fmt == "png" else [])
        try:
            proc = subprocess.run(args, input=to_dot(graph).encode("utf-8"),
                                  capture_output=True, timeout=120)
            if proc.returncode == 0:
                return proc.stdout
            problem = proc.stderr.decode("utf-8", "replace").strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            problem = str(err)
        if engine == "graphviz":
            raise RuntimeError(f"Graphviz `{dot_exe} -T{fmt}` failed: {problem}")
        warnings.warn(f"Graphviz `dot` failed ({problem}); drawing with matplotlib instead",
                      RuntimeWarning, stacklevel=3)
    return _draw_matplotlib(to_networkx(graph), fmt, dpi)


# ---- the pure-pip layered layout ------------------------------------------------------------
FONT_PT = 8.0
CHAR_IN = 0.602 * FONT_PT / 72  # DejaVu Sans Mono advances 0.602 em per character
LINE_IN = 1.3 * FONT_PT / 72
PAD_X, PAD_Y = 0.09, 0.05  # inside a box, inches
GAP_X, GAP_Y = 0.22, 0.34  # between boxes side by side / between layers, inches
MARGIN = 0.3
MAX_PNG_PIXELS = 16000  # per side; larger drawings get a lower dpi


@dataclass
class _Box:
    lines: list[str]
    kind: str
    w: float
    h: float
    x: float = 0.0  # centre
    y: float = 0.0  # top edge, growing downwards


def layered_layout(G: nx.DiGraph | nx.MultiDiGraph) -> list[list[Any]]:
    """Nodes of an acyclic graph in layers (top to bottom), each layer ordered left to right.

    Layers are the topological generations, then every node but a sink moves down to just
    above its nearest user (weights and constants sit next to the op that reads them).
    Within layers, alternating down and up barycenter sweeps reduce edge crossings.
    """
    layer = {n: i for i, gen in enumerate(nx.topological_generations(G)) for n in gen}
    for n in reversed(list(nx.topological_sort(G))):
        if G.out_degree(n):
            layer[n] = min(layer[s] for s in G.successors(n)) - 1
    layers: list[list[Any]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in G.nodes:  # insertion order (graph order) is the starting order
        layers[layer[n]].append(n)
    for sweep in range(8):
        down = sweep % 2 == 0
        pos = {n: float(i) for row in layers for i, n in enumerate(row)}
        for row in layers[1:] if down else reversed(layers[:-1]):
            for n in row:
                near = list(G.predecessors(n) if down else G.successors(n))
                if near:
                    pos[n] = sum(pos[m] for m in near) / len(near)
            row.sort(key=pos.__getitem__)  # stable: ties keep their order
            pos.update((n, float(i)) for i, n in enumerate(row))
    return layers


def _pack(row: list[_Box], desired: list[float], weight: list[float]) -> None:
    """Centres in order, boxes apart, minimising the weighted squared distance to `desired`.

    With x_i = y_i + c_i (c_i: the least offset that keeps boxes apart) this is isotonic
    regression of desired_i - c_i over nondecreasing y_i: pool adjacent violators solves it.
    """
    offsets = [0.0]
    for left, right in zip(row, row[1:]):
        offsets.append(offsets[-1] + (left.w + right.w) / 2 + GAP_X)
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, count)
    for d, c, w in zip(desired, offsets, weight):
        blocks.append((d - c, w, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, w2, n2), (m1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append(((m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2))
    i = 0
    for mean, _, count in blocks:
        for _ in range(count):
            row[i].x = mean + offsets[i]
            i += 1


def _place(G: nx.MultiDiGraph, layers: list[list[str]]) -> dict[str, _Box]:
    boxes: dict[str, _Box] = {}
    for n, data in G.nodes(data=True):
        lines = data["label"]
        w = max(len(s) for s in lines) * CHAR_IN + 2 * PAD_X
        boxes[n] = _Box(lines, _box_kind(data), w, len(lines) * LINE_IN + 2 * PAD_Y)
    y = 0.0
    for row in layers:
        height = max(boxes[n].h for n in row)
        for n in row:
            boxes[n].y = y + (height - boxes[n].h) / 2
        y += height + GAP_Y
    for row in layers:  # start: each layer packed around 0
        _pack([boxes[n] for n in row], [0.0] * len(row), [1.0] * len(row))
    for sweep in range(8):  # then align with the layer above (down) or below (up), in turns
        down = sweep % 2 == 0
        for row in layers if down else reversed(layers):
            desired, weight = [], []
            for n in row:
                near = list(G.predecessors(n) if down else G.successors(n))
                near = near or list(G.successors(n) if down else G.predecessors(n))
                desired.append(sum(boxes[m].x for m in near) / len(near) if near else boxes[n].x)
                weight.append(1.0 + len(near))
            _pack([boxes[n] for n in row], desired, weight)
    return boxes


def _draw_matplotlib(G: nx.MultiDiGraph, fmt: str, dpi: int) -> bytes:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

    boxes = _place(G, layered_layout(G))
    clusters = _clusters(G)
    title = f"graph @{G.graph.get('name', '')}"
    left = min((b.x - b.w / 2 for b in boxes.values()), default=0.0) - MARGIN
    right = max((b.x + b.w / 2 for b in boxes.values()), default=1.0) + MARGIN
    right = max(right, left + len(title) * CHAR_IN * 1.3 + 2 * MARGIN)
    top = -(LINE_IN * 2 + (0.15 if clusters else 0.0))  # room for the title and group labels
    bottom = max((b.y + b.h for b in boxes.values()), default=0.0) + MARGIN
    rc = {"svg.fonttype": "none", "svg.hashsalt": "graphc", "font.family": "monospace",
          "font.monospace": ["DejaVu Sans Mono"], "font.size": FONT_PT}
    with matplotlib.rc_context(rc):
        fig = Figure(figsize=(right - left, bottom - top))
        FigureCanvasAgg(fig)
        ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        ax.set_xlim(left, right)
        ax.set_ylim(bottom, top)  # y grows downwards, like the layers
        ax.set_axis_off()
        ax.text(left + MARGIN, top + LINE_IN * 0.8, title, fontsize=FONT_PT * 1.3,
                va="center", ha="left", weight="bold")
        for name, members in clusters:
            x0 = min(boxes[n].x - boxes[n].w / 2 for n in members) - 0.07
            x1 = max(boxes[n].x + boxes[n].w / 2 for n in members) + 0.07
            y0 = min(boxes[n].y for n in members) - 0.13
            y1 = max(boxes[n].y + boxes[n].h for n in members) + 0.07
            ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linestyle="--",
                                   edgecolor=COLORS["fused"][1], linewidth=0.9, zorder=1))
            ax.text(x0 + 0.05, y0 + 0.015, name, fontsize=FONT_PT * 0.75, va="top",
                    color=COLORS["fused"][1], zorder=1)
        for u, v, data in G.edges(data=True):
            a, b = boxes[u], boxes[v]
            start, end = (a.x, a.y + a.h), (b.x, b.y)
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=7,
                                         color="#555555", linewidth=0.7, shrinkA=0,
                                         shrinkB=0.5, zorder=2))
            ax.text(0.6 * start[0] + 0.4 * end[0], 0.6 * start[1] + 0.4 * end[1],
                    "%" + data["value"],
                    fontsize=FONT_PT * 0.75, color="#666666", ha="center", va="center",
                    zorder=3, bbox={"boxstyle": "square,pad=0.05", "fc": "white",
                                    "ec": "none", "alpha": 0.8})
        for box in boxes.values():
            fill, border = COLORS[box.kind]
            rounding = 0.12 if box.kind in ("input", "output", "update") else 0.04
            ax.add_patch(FancyBboxPatch((box.x - box.w / 2, box.y), box.w, box.h,
                                        boxstyle=f"round,pad=0,rounding_size={rounding}",
                                        facecolor=fill, edgecolor=border,
                                        linewidth=1.6 if box.kind == "output" else 0.9,
                                        linestyle="--" if box.kind == "update" else "-",
                                        zorder=4))
            for i, line in enumerate(box.lines):
                ax.text(box.x, box.y + PAD_Y + (i + 0.5) * LINE_IN, line, ha="center",
                        va="center", zorder=5, weight="bold" if i == 0 else "normal",
                        color="#222222" if i == 0 else "#444444")
        if fmt == "png":
            dpi = min(dpi, int(MAX_PNG_PIXELS / max(right - left, bottom - top)))
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=dpi, metadata={"Date": None} if fmt == "svg" else {})
    return buf.getvalue()
