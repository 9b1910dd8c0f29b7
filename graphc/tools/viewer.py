"""An interactive view of an IR graph: one self-contained HTML file (no network, inline JS).

    >>> from graphc.ir import parse
    >>> g = parse('graph @f(%x: f32[3]) -> (f32[3]) {\\n  %0: f32[3] = exp(%x)\\n  return (%0)\\n}')
    >>> model = view_model(g)
    >>> [n["id"] for n in model["nodes"]], model["edges"][0]
    (['in0', 'n0', 'out0'], {'src': 'in0', 'dst': 'n0', 'value': 'x'})
    >>> page = render_html(g)  # graph, styles and scripts inline, nothing fetched
    >>> "graphc-data" in page and "<script src" not in page and "<link" not in page
    True

`render_html(graph, path)` (and `graphc viz --html`) writes the page. It holds the graph as a
*view model* (`view_model`, JSON) and a script that lays it out in the browser with the same
layered layout as the SVG export (graphc.ir.export.layered_layout: topological layers, each
node pulled down next to its first user, barycenter ordering, boxes packed by isotonic
regression), and lays it out again whenever a group is collapsed or expanded.

The view model is a tree over the graph:
- leaves: the graph's inputs (`in<i>`), outputs (`out<i>`), in-place updates (`upd<i>`), the
  IR nodes (`n<i>`) and, inside a fused node with a body, its instructions (`n<i>.<k>`);
- groups: a fused node with a body (id `n<i>`, collapsed at first: its box shows the fused
  label; expanded, its instructions), the nodes sharing a `group` attribute (`group:<g>`),
  regions (`region:<name>`, see `node_regions`): forward / backward / optimizer where the
  graph says so, else the user's source lines; and, past GROUP_IO_OVER, the graph's inputs
  (`io:inputs`) and its outputs with its updates (`io:outputs`), inside them one collapsed
  group per module (`io:inputs/model.0`: a module's parameters, buffers and optimizer
  state, by their dotted names, see `module_path`).
- edges: one per value use between leaves (a collapsed group stands for its leaves).

Every label line is at most graphc.ir.export.LINE_CHARS characters (longer text is wrapped,
then cut with an ellipsis) and boxes are sized from the browser's own measure of the
monospace font, so labels fit their boxes; the full IR line is the box's tooltip.

The page: wheel to zoom, drag to pan, a search box (op, value name such as `%12`, or source
line; Enter steps through the matches, each expanded and centred), click a group to collapse
or expand it, buttons to fit, expand all and collapse all, a side panel with the selected
node's IR line and the group tree. `window.graphcViewer` exposes the same actions to scripts
(tests drive the page through it and through the DOM).
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from graphc.ir.export import (
    COLORS,
    LINE_CHARS,
    node_label,
    short_literal,
)
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import format_literal, format_node
from graphc.tools.viewer_assets import CORE_JS, PAGE_CSS, UI_JS

__all__ = ["module_path", "node_regions", "render_html", "view_model"]

BACKWARD_SUFFIX = " (backward)"  # graphc.passes.autodiff marks the backward's source lines
REGION_COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037",
                 "#ad1457"]
COLLAPSE_REGIONS_OVER = 400  # IR nodes; a larger graph opens with its regions collapsed
GROUP_IO_OVER = 12  # more inputs (or outputs and updates) than this: grouped by module
# the state names graphc's optimizers give a parameter's state inputs (`<param>.<state>`)
OPTIMIZER_STATE = frozenset({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                             "square_avg", "grad_avg", "sum", "acc_delta", "ax", "eta", "mu",
                             "prev", "step_size"})


def module_path(name: str) -> str:
    """The module a graph input belongs to, by its dotted name: a parameter `model.0.weight`
    and its optimizer state `model.0.weight.exp_avg` belong to `model.0`; `x` to none ("").

    >>> module_path("model.0.weight.exp_avg"), module_path("blocks.1.ln.bias"), module_path("x")
    ('model.0', 'blocks.1.ln', '')
    """
    parts = name.split(".")
    if len(parts) > 2 and parts[-1] in OPTIMIZER_STATE:
        parts.pop()
    return ".".join(parts[:-1])


def node_regions(graph: Graph) -> list[str | None]:
    """The region of each node of `graph` (None: in none), from what the graph records:

    - `graph.meta["regions"]`: a list with a name (or None) per node, used as given;
    - otherwise, where the backward's nodes carry a `... (backward)` source line (graphc's
      derive_backward marks them so): "backward" for those, "optimizer" for later nodes that
      read a value the backward or the optimizer computed, "forward" for the rest;
    - otherwise the user's source line of each node (`model.py:14`), when the graph's nodes
      come from more than one line (a traced training step: the forward call, the
      `loss.backward()` line and the `opt.step()` line).

    >>> from graphc.ir import parse
    >>> g = parse('graph @f(%x: f32[3]) -> (f32[3]) {\\n  %0: f32[3] = exp(%x)  # a.py:1\\n'
    ...           '  %1: f32[3] = neg(%0)  # a.py:1 (backward)\\n  return (%1)\\n}')
    >>> node_regions(g)
    ['forward', 'backward']
    """
    explicit = graph.meta.get("regions")
    if isinstance(explicit, (list, tuple)) and len(explicit) == len(graph.nodes):
        return [None if r is None else str(r) for r in explicit]
    if any(node.loc and node.loc.endswith(BACKWARD_SUFFIX) for node in graph.nodes):
        regions: list[str | None] = []
        made_by: dict[Value, str] = {}
        for node in graph.nodes:
            if node.loc and node.loc.endswith(BACKWARD_SUFFIX):
                region = "backward"
            elif any(made_by.get(v) in ("backward", "optimizer") for v in node.inputs):
                region = "optimizer"
            else:
                region = "forward"
            regions.append(region)
            made_by.update((v, region) for v in node.outputs)
        return regions
    lines = [node.loc for node in graph.nodes]
    if len({loc for loc in lines if loc}) > 1:
        return lines
    return [None] * len(graph.nodes)


def _value_leaf(graph: Graph) -> dict[Value, str]:
    """Which leaf defines each value (a fused node's outputs: the body instruction)."""
    leaf = {v: f"in{i}" for i, v in enumerate(graph.inputs)}
    for i, node in enumerate(graph.nodes):
        body = _body(node)
        for k, v in enumerate(node.outputs):
            if body is None:
                leaf[v] = f"n{i}"
                continue
            ref = node.attrs["outputs"][k]
            n_in = len(node.inputs)
            leaf[v] = f"n{i}.{ref - n_in}" if ref >= n_in else leaf[node.inputs[ref]]
    return leaf


def _body(node: Node) -> list | None:
    """A fused node's body instructions `(op, args, attrs)`, or None."""
    body, outputs = node.attrs.get("body"), node.attrs.get("outputs")
    if node.op != "fused" or not isinstance(body, (tuple, list)) or not body:
        return None
    if not isinstance(outputs, (tuple, list)) or len(outputs) != len(node.outputs):
        return None
    return list(body)


def _instruction_lines(op: str, attrs, type_text: str | None) -> list[str]:
    shown = [f"{key}={short_literal(value)}" for key, value in attrs
             if not (op == "full" and key in ("shape", "dtype"))]
    lines = [op] + [_cut(s) for s in shown[:2]] + (["+more"] if len(shown) > 2 else [])
    return lines + ([_cut(type_text)] if type_text else [])


def _cut(text: str) -> str:
    return text if len(text) <= LINE_CHARS else text[:LINE_CHARS - 1] + "\u2026"


def _body_types(node: Node) -> list[str] | None:
    """Each body instruction's output type as text, when the body decodes."""
    try:
        from graphc.ops.fused import FusedBody

        body = FusedBody.of_node(node)
        n_in = len(node.inputs)
        return [str(body.types[n_in + k]) for k in range(len(body.instructions))]
    except Exception:  # an unregistered op or a bad body: the view still shows the ops
        return None


def view_model(graph: Graph) -> dict[str, Any]:
    """The graph as the page's JSON: name, nodes (leaves), groups and edges (module doc)."""
    regions = node_regions(graph)
    nodes: list[dict[str, Any]] = []
    groups: dict[str, dict[str, Any]] = {}
    edges: list[dict[str, str]] = []
    leaf_of = _value_leaf(graph)

    def add_group(gid: str, kind: str, lines: list[str], text: str, parent: str | None,
                  collapsed: bool) -> str:
        if gid not in groups:
            find = " ".join([gid, *lines]).lower() if kind in ("fused", "group") else ""
            groups[gid] = {"id": gid, "kind": kind, "lines": lines, "text": text,
                           "parent": parent, "collapsed": collapsed, "size": 0, "find": find}
        return gid

    def region_group(region: str | None) -> str | None:
        if region is None:
            return None
        return add_group(f"region:{region}", "region", [_cut(region)], f"region {region}",
                         None, False)

    def leaf(lid: str, kind: str, lines: list[str], text: str, parent: str | None,
             defines: list[str], loc: str | None = None) -> None:
        find = " ".join([lid, *lines, *("%" + d for d in defines), loc or ""]).lower()
        nodes.append({"id": lid, "kind": kind, "lines": lines, "text": text, "parent": parent,
                      "defines": defines, "loc": loc, "find": find})
        while parent is not None:
            groups[parent]["size"] += 1
            parent = groups[parent]["parent"]

    def edge(src: str, dst: str, value: str) -> None:
        edges.append({"src": src, "dst": dst, "value": value})

    def io_group(gid: str, title: str, names: list[str]) -> str | None:
        if len(names) <= GROUP_IO_OVER:
            return None
        return add_group(gid, "io", [title, f"{len(names)} values"], f"the graph's {title}",
                         None, not any(module_path(name) for name in names))

    def module_group(io: str | None, name: str, mark: str) -> str | None:
        """Past GROUP_IO_OVER, the inputs (updates) of one module: one collapsed group."""
        module = module_path(name)
        if io is None or not module:
            return io
        return add_group(f"{io}/{module}", "module", [_cut(module + mark)],
                         f"{module}: its parameters, buffers and optimizer state", io, True)

    inputs = io_group("io:inputs", "inputs", [v.name for v in graph.inputs])
    for i, v in enumerate(graph.inputs):
        leaf(f"in{i}", "input", [_cut(f"%{v.name}"), str(v.type)], f"input %{v.name}: {v.type}",
             module_group(inputs, v.name, ""), [v.name])
    for i, node in enumerate(graph.nodes):
        nid, text = f"n{i}", format_node(node)
        loc = node.loc
        parent = region_group(regions[i])
        if "group" in node.attrs and node.op != "fused":
            group = format_literal(node.attrs["group"])
            parent = add_group(f"group:{group}", "group", [f"group {group}"],
                               f"nodes with group={group}", parent, False)
        body = _body(node)
        if body is None:
            kind = "const" if not node.inputs else ("fused" if node.op == "fused" else "node")
            leaf(nid, kind, node_label(node), text, parent, [v.name for v in node.outputs], loc)
            for v in node.inputs:
                edge(leaf_of[v], nid, v.name)
            continue
        add_group(nid, "fused", node_label(node), text, parent, True)
        types = _body_types(node)
        n_in = len(node.inputs)
        for k, (op, args, attrs) in enumerate(body):
            defines = [node.outputs[j].name for j, ref in enumerate(node.attrs["outputs"])
                       if ref == n_in + k]
            lines = _instruction_lines(str(op), attrs, types[k] if types else None)
            leaf(f"{nid}.{k}", "const" if op == "full" else "node", lines,
                 f"{op}{short_literal(tuple(attrs)) if attrs else ''} in {text}", nid,
                 defines, loc)
            for ref in args:
                if ref < n_in:
                    v = node.inputs[ref]
                    edge(leaf_of[v], f"{nid}.{k}", v.name)
                else:
                    edge(f"{nid}.{ref - n_in}", f"{nid}.{k}", f"{nid}.{ref - n_in}")
    results = io_group("io:outputs", "outputs and updates",
                       [v.name for v in graph.outputs] + [t.name for t, _ in graph.updates])
    for i, v in enumerate(graph.outputs):
        leaf(f"out{i}", "output", [f"output {i}", str(v.type)], f"output {i}: %{v.name}",
             results, [])
        edge(leaf_of[v], f"out{i}", v.name)
    for i, (target, v) in enumerate(graph.updates):
        leaf(f"upd{i}", "update", [_cut(f"%{target.name} \u2190"), str(v.type)],
             f"update %{target.name} <- %{v.name}",
             module_group(results, target.name, " \u2190"), [])
        edge(leaf_of[v], f"upd{i}", v.name)
    if len(graph.nodes) > COLLAPSE_REGIONS_OVER:
        for group in groups.values():
            if group["kind"] == "region":
                group["collapsed"] = True
    for group in groups.values():
        if group["kind"] in ("region", "module"):
            size, what = group["size"], "node" if group["kind"] == "region" else "value"
            group["lines"] = group["lines"] + [f"{size} {what}" + ("s" if size != 1 else "")]
    return {"name": graph.name, "nodes": nodes, "groups": list(groups.values()),
            "edges": edges}


def _css() -> str:
    kinds = "\n".join(f".node.kind-{kind} rect.box {{ fill: {fill}; stroke: {border}; }}"
                      for kind, (fill, border) in COLORS.items())
    return PAGE_CSS + kinds + "\n.node.kind-region rect.box { fill: #fffde7; stroke: #8d6e00; }\n" \
        ".node.kind-group rect.box { fill: #f3e5f5; stroke: #6a1b9a; }\n" \
        ".node.kind-io rect.box, .node.kind-module rect.box { fill: #e8f5e9; stroke: #2e7d32; }\n"


def render_html(graph: Graph, path: str | os.PathLike | None = None) -> str:
    """The interactive page of `graph` (module docstring) as text; also written to `path`
    when given. The page needs no network: styles, script and graph are inline."""
    model = view_model(graph)
    model["regionColors"] = REGION_COLORS
    # no "<" inside the script element: "</script>" or "<!--" in a name cannot end it early
    data = json.dumps(model, separators=(",", ":")).replace("<", "\\u003c")
    title = html.escape(f"graph @{graph.name}")
    page = PAGE_TEMPLATE.format(title=title, css=_css(), data=data, core=CORE_JS, ui=UI_JS)
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    return page


PAGE_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<header id="toolbar">
  <strong id="title">{title}</strong>
  <input id="search" type="search" placeholder="search op, %value or file:line" size="28">
  <button id="prev" title="previous match">&#8593;</button>
  <button id="next" title="next match">&#8595;</button>
  <span id="count"></span>
  <button id="fit">fit</button>
  <button id="expand-all">expand all</button>
  <button id="collapse-all">collapse all</button>
  <span class="hint">wheel: zoom &middot; drag: pan &middot; click a group: collapse/expand
    &middot; /: search &middot; Esc: clear</span>
</header>
<main>
  <svg id="canvas" xmlns="http://www.w3.org/2000/svg">
    <defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"
      markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z"
      fill="#555"/></marker></defs>
    <g id="viewport"><g id="clusters"></g><g id="edges"></g><g id="nodes"></g></g>
  </svg>
  <aside id="panel">
    <section><h3>selected</h3><pre id="details">click a box</pre></section>
    <section><h3>groups</h3><ul id="groups"></ul></section>
  </aside>
</main>
<script type="application/json" id="graphc-data">{data}</script>
<script>
{core}
</script>
<script>
{ui}
</script>
</body>
</html>
"""
