"""The SVG's labels stay inside their boxes: long fused op lists wrap and are cut, every line is
at most LINE_CHARS, and the DOT text carries the whole IR line as a tooltip."""

from __future__ import annotations

from graphc.ir import Node, Value
from graphc.ir.export import LINE_CHARS, MAX_HEAD_LINES, node_label, to_dot
from graphc.types import TensorType, float32
from tests.viewer_support import fused_graph

T = TensorType((4, 4), float32)


def _fused(ops):
    body = tuple((op, (0,) if i == 0 else (i,), ()) for i, op in enumerate(ops))
    return Node("fused", [Value("x", T)], {"body": body, "outputs": (len(ops),)},
                [Value("y", T)])


def test_a_short_fused_label_is_one_line():
    assert node_label(_fused(["exp", "neg"])) == ["fused(exp, neg)", "f32[4,4]"]


def test_a_long_fused_label_wraps_and_counts_what_it_cuts():
    ops = ["sub", "mul", "add", "mul", "mul", "mul", "add", "cast", "pow", "sub", "pow"] * 3
    lines = node_label(_fused(ops))
    head = lines[:MAX_HEAD_LINES]
    assert lines[MAX_HEAD_LINES:] == ["f32[4,4]"]
    assert head[0].startswith("fused(sub, mul,") and all(len(s) <= LINE_CHARS for s in lines)
    shown = sum(len(line.split(" ")) for line in head[:-1])
    assert head[-1] == f"\u2026 +{len(ops) - shown} ops)"


def test_constants_are_left_out_and_a_long_name_is_cut():
    assert node_label(_fused(["full", "add"]))[0] == "fused(add)"
    long = Node("a_very_long_operation_name_past_the_width", [], {}, [Value("y", T)])
    line = node_label(long)[0]
    assert len(line) == LINE_CHARS and line.endswith("\u2026")


def test_dot_nodes_carry_the_ir_line_as_tooltip():
    dot = to_dot(fused_graph())
    assert 'tooltip="%1: f32[3] = exp[group=1](%0)' in dot
    assert "# m.py:2" in dot
