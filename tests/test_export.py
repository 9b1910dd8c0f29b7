"""Graph views: networkx structure, DOT text, SVG/PNG pictures from Graphviz and from matplotlib."""

from __future__ import annotations

import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET

import networkx as nx
import pytest

import graphc
import graphc.nn as nn
from graphc.ir import Graph, Node, Value, VerifyError, export, parse
from graphc.ir.export import (
    dot_quote,
    layered_layout,
    node_label,
    render_png,
    render_svg,
    to_dot,
    to_networkx,
)
from graphc.types import TensorType, float32

TEXT = """graph @step(%x: f32[2,3], %b: f32[3], %w: f32[3]) -> (f32[2,3], f32[]) {
  %0: f32[2,3] = add(%x, %b)                          # model.py:14
  %1: f32[2,3] = mul(%0, %0)                          # model.py:15
  %2: f32[] = full[shape=(), value=0.8999999761581421, dtype="float32"]()
  %3: f32[3] = mul(%w, %2)
  %4: f32[] = reduce_sum[axes=(0, 1), keepdim=false](%1)
  %w <- %3
  return (%1, %4)
}"""

FUSED = """graph @fused(%x: f32[3], %b: f32[3]) -> (f32[3], f32[3]) {
  %0: f32[3] = fused[ops=("add", "relu")](%x, %b)
  %1: f32[3] = exp[group=1](%0)
  %2: f32[3] = mul[group=1](%1, %1)
  %3: f32[3] = neg(%2)
  return (%3, %0)
}"""

SVG_NS = "{http://www.w3.org/2000/svg}"
MATPLOTLIB = "<dc:title>Matplotlib v"  # the creator in the SVG metadata


def lenet5() -> Graph:
    """The LeNet-5 forward graph of the model tests (33 nodes with inputs and output)."""
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )
    with graphc.no_grad():
        return graphc.trace(model, graphc.randn(2, 1, 28, 28))


def graph_rank(G: nx.MultiDiGraph, n: str) -> int:
    """Position in graph order: inputs first, then the nodes, then outputs and updates."""
    data = G.nodes[n]
    return {"input": -1, "node": data["index"]}.get(data["kind"], 1 << 30)


def svg_texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == SVG_NS + "svg"
    return ["".join(t.itertext()) for t in root.iter(SVG_NS + "text")]


# ---- to_networkx ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: parse(TEXT), lambda: parse(FUSED), lenet5],
                         ids=["text", "fused", "lenet5"])
def test_networkx_counts_order_and_acyclic(make):
    g = make()
    G = to_networkx(g)
    assert G.number_of_nodes() == len(g.inputs) + len(g.nodes) + len(g.outputs) + len(g.updates)
    uses = sum(len(n.inputs) for n in g.nodes) + len(g.outputs) + len(g.updates)
    assert G.number_of_edges() == uses
    assert nx.is_directed_acyclic_graph(G)
    assert all(graph_rank(G, u) < graph_rank(G, v) for u, v in G.edges())
    order = nx.lexicographical_topological_sort(G, key=lambda n: f"{graph_rank(G, n):012d}")
    ir_order = [G.nodes[n]["node"] for n in order if G.nodes[n]["kind"] == "node"]
    assert ir_order == g.nodes


def test_networkx_attributes():
    g = parse(TEXT)
    G = to_networkx(g)
    add = G.nodes["n0"]
    assert (add["op"], add["loc"], add["node"]) == ("add", "model.py:14", g.nodes[0])
    assert add["types"] == [TensorType((2, 3), float32)] and add["outputs"] == ["0"]
    assert G.nodes["n4"]["attrs"] == {"axes": (0, 1), "keepdim": False}
    assert G.nodes["in1"] == {**G.nodes["in1"], "kind": "input", "name": "b", "index": 1}
    assert G.nodes["in1"]["value"] is g.inputs[1]
    # mul(%0, %0): two edges between the same nodes, keyed by input position
    assert sorted(G.get_edge_data("n0", "n1")) == [0, 1]
    edge = G.get_edge_data("n3", "upd0")[0]
    assert edge == {"value": "3", "type": TensorType((3,), float32), "position": 0}
    assert G.nodes["upd0"]["kind"] == "update" and G.nodes["upd0"]["name"] == "w"
    assert [G.nodes[v]["kind"] for _, v in G.out_edges("n1")] == ["node", "output"]
    assert G.in_degree("n2") == 0 and G.out_degree("in2") == 1


def test_use_before_definition_is_named():
    t = TensorType((3,), float32)
    x, late = Value("x", t), Value("late", t)
    g = Graph("bad", [x], [Node("add", [x, late], {}, [Value("0", t)], "m.py:3")], [x])
    with pytest.raises(VerifyError, match=r"add at m\.py:3: %late is used before"):
        to_networkx(g)


# ---- labels and DOT text ----------------------------------------------------------------------
def test_labels_are_short():
    g = parse(TEXT)
    assert node_label(g.nodes[2]) == ["full", "value=0.9", "f32[]"]  # shape, dtype: the type
    t = TensorType((1, 6, 4, 4), float32)
    conv = Node("conv2d", [], {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1),
                               "groups": 1}, [Value("0", t)])
    assert node_label(conv) == ["conv2d", "stride=(1,1) padding=(0,0)", "f32[1,6,4,4]"]
    many = Node("op", [], {k: "x" * 40 for k in "abcde"}, [Value("0", t)])
    lines = node_label(many)
    assert lines[-2].endswith("+2 more") and all(len(s) <= export.LINE_CHARS for s in lines)


def test_dot_quote_escapes():
    assert dot_quote('say "hi"\\n') == r'"say \"hi\"\\n"'
    assert dot_quote("two\nlines") == r'"two\nlines"'


DOT_NODE = re.compile(r'^\s*(\w+) \[label="((?:[^"\\]|\\.)*)"[^\n]*\];$', re.M)
DOT_EDGE = re.compile(r'^\s*(\w+) -> (\w+) \[label="((?:[^"\\]|\\.)*)"\];$', re.M)


@pytest.mark.parametrize("text", [TEXT, FUSED], ids=["text", "fused"])
def test_dot_structure(text):
    g = parse(text)
    G = to_networkx(g)
    dot = to_dot(g)
    assert dot.startswith(f'digraph "{g.name}" {{\n') and dot.endswith("}\n")
    assert dot.count("{") == dot.count("}")
    nodes = dict(DOT_NODE.findall(dot))
    assert set(nodes) == set(G.nodes)
    assert nodes["n0"].split("\\n")[0] == G.nodes["n0"]["label"][0]
    edges = DOT_EDGE.findall(dot)
    assert sorted((u, v) for u, v, _ in edges) == sorted(G.edges())
    values = {(u, v, "%" + data["value"]) for u, v, data in G.edges(data=True)}
    assert set(edges) == values
    assert re.search(r"^\s*in0 \[.*shape=ellipse\];$", dot, re.M)
    assert re.search(r"^\s*out0 \[.*peripheries=2\];$", dot, re.M)


def test_dot_boxes_fused_groups():
    dot = to_dot(parse(FUSED))
    clusters = re.findall(r"subgraph (cluster_\d+) \{\n\s*label=\"([^\"]*)\";[^\n]*\n((?:\s+n\d+ "
                          r"\[[^\n]*\n)+)\s*\}", dot)
    members = {label: re.findall(r"^\s+(n\d+) \[", body, re.M) for _, label, body in clusters}
    assert members == {"fused": ["n0"], "group 1": ["n1", "n2"]}
    assert 'label="fused(add, relu)\\nf32[3]"' in dot


def test_dot_escapes_names_and_strings():
    t = TensorType((3,), float32)
    x = Value('x"y', t)
    node = Node("tag", [x], {"note": 'a"b\\c'}, [Value("0", t)])
    g = Graph('g"\\', [x], [node], node.outputs)
    dot = to_dot(g)
    assert dot.startswith('digraph "g\\"\\\\" {')
    assert 'label="tag\\nnote=\\"a\\\\\\"b\\\\\\\\c\\"\\nf32[3]"' in dot
    assert '[label="%x\\"y"]' in dot
    if shutil.which("dot"):  # Graphviz accepts it: the strongest check of the escaping
        assert "tag" in render_svg(g, engine="graphviz")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pyparsing, inside pydot
def test_dot_parses_with_pydot(tmp_path):
    pytest.importorskip("pydot", reason="pydot is optional; the regex tests check the DOT text")
    g = parse(FUSED)
    path = tmp_path / "g.dot"
    path.write_text(to_dot(g))
    parsed = nx.nx_pydot.read_dot(path)
    G = to_networkx(g)
    assert set(parsed.nodes) - {"\\n"} == set(G.nodes)  # pydot may add a "\n" pseudo-node
    assert parsed.number_of_edges() == G.number_of_edges()
    assert parsed.nodes["n3"]["label"] == '"neg\\nf32[3]"'  # (cluster members lose attrs)


# ---- pictures ---------------------------------------------------------------------------------
def test_layered_layout_puts_sources_next_to_users():
    G = to_networkx(parse(TEXT))
    layers = layered_layout(G)
    layer = {n: i for i, row in enumerate(layers) for n in row}
    assert sorted(layer) == sorted(G.nodes)
    assert all(layer[u] < layer[v] for u, v in G.edges())
    assert layer["in2"] == layer["n3"] - 1 and layer["n2"] == layer["n3"] - 1  # %w, the constant


def test_svg_fallback_is_wellformed_and_names_ops(tmp_path):
    g = parse(FUSED)
    path = tmp_path / "g.svg"
    svg = render_svg(g, path, engine="matplotlib")
    assert path.read_text() == svg
    texts = svg_texts(svg)
    for expected in ("fused(add, relu)", "exp", "mul", "neg", "%x", "output 0", "f32[3]",
                     "group 1", "fused", "graph @fused"):
        assert expected in texts
    assert MATPLOTLIB in svg
    assert render_svg(g, engine="matplotlib") == svg  # deterministic


def test_auto_falls_back_without_graphviz(monkeypatch):
    monkeypatch.setattr(export.shutil, "which", lambda name: None)
    svg = render_svg(parse(TEXT), engine="auto")
    assert MATPLOTLIB in svg and "reduce_sum" in svg_texts(svg)
    with pytest.raises(RuntimeError, match="needs Graphviz's `dot` on PATH"):
        render_svg(parse(TEXT), engine="graphviz")
    with pytest.raises(ValueError, match="engine must be"):
        render_svg(parse(TEXT), engine="gnuplot")


def fake_dot(tmp_path, monkeypatch, script: str) -> None:
    exe = tmp_path / "bin" / "dot"
    exe.parent.mkdir()
    exe.write_text(f"#!{sys.executable}\n{script}")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(os.name != "posix", reason="the fake `dot` is a #! script")
def test_auto_uses_dot_from_path(tmp_path, monkeypatch):
    fake_dot(tmp_path, monkeypatch, "import sys\n"
             "text = sys.stdin.read()\n"
             "open(sys.argv[0] + '.args', 'w').write(' '.join(sys.argv[1:]) + '\\n' + text)\n"
             "sys.stdout.write('<svg xmlns=\"http://www.w3.org/2000/svg\"><text>fake</text>"
             "</svg>')\n")
    g = parse(TEXT)
    assert svg_texts(render_svg(g)) == ["fake"]
    args, dot_text = (tmp_path / "bin" / "dot.args").read_text().split("\n", 1)
    assert args == "-Tsvg" and dot_text == to_dot(g)
    render_png(g, tmp_path / "g.png")
    assert (tmp_path / "bin" / "dot.args").read_text().startswith("-Tpng -Gdpi=110\n")


@pytest.mark.skipif(os.name != "posix", reason="the fake `dot` is a #! script")
def test_failing_dot_warns_and_falls_back(tmp_path, monkeypatch):
    fake_dot(tmp_path, monkeypatch, "import sys\nsys.stderr.write('syntax error')\nsys.exit(1)\n")
    with pytest.warns(RuntimeWarning, match="syntax error"):
        svg = render_svg(parse(TEXT))
    assert MATPLOTLIB in svg
    with pytest.raises(RuntimeError, match="failed: syntax error"):
        render_svg(parse(TEXT), engine="graphviz")


@pytest.mark.skipif(shutil.which("dot") is None,
                    reason="Graphviz's `dot` is not installed (apt-get install graphviz)")
def test_graphviz_renders(tmp_path):
    g = parse(FUSED)
    svg = render_svg(g, tmp_path / "g.svg")
    assert "Generated by graphviz" in svg
    texts = svg_texts(svg)
    assert {"fused(add, relu)", "exp", "neg", "group 1"} <= set(texts)
    render_png(g, tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_fallback(tmp_path):
    path = render_png(parse(FUSED), tmp_path / "g.png", engine="matplotlib")
    assert path == str(tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lenet5_fallback_picture_is_readable():
    g = lenet5()
    svg = render_svg(g, engine="matplotlib")
    texts = svg_texts(svg)
    assert {"conv2d", "max_pool2d", "matmul", "relu", "output 0", "f32[2,10]"} <= set(texts)
    assert texts.count("conv2d") == 2 and texts.count("matmul") == 3
    root = ET.fromstring(svg)
    width, height = (float(root.get(k).removesuffix("pt")) for k in ("width", "height"))
    # 8 pt text at 100%: a picture of about one screen width, a few screens tall
    assert 200 < width < 1200 and 400 < height < 3000
    sizes = {float(s) for s in re.findall(r"font-size: ([\d.]+)px", svg)}
    assert min(sizes) >= 6


def test_graph_without_nodes():
    t = TensorType((3,), float32)
    x = Value("x", t)
    g = Graph("identity", [x], [], [x])
    assert to_networkx(g).number_of_edges() == 1
    assert "%x" in svg_texts(render_svg(g, engine="matplotlib"))
