"""The parser's quick reads (graphc.ir.parser `_Parser.node`: a node's head, attribute lists
and inputs as the printer writes them, read by offsets; tuple literals read in one loop;
repeated attribute and tuple texts looked up) give the same graphs and the same errors as
reading every token one at a time (`parse(text, quick=False)`).

Seeds are the `.gir` fixtures (fused bodies included) and a planned training graph; each
case mutates node lines where the quick reads work (tokens that read as another kind there,
such as `s0`, `inf.x`, `1e`, `f32`, a comment or a newline inside a literal, values defined
twice or used before their definition, one node's attribute list pasted into another), with
a numpy Generator seeded from the test id and the case number.
"""

from __future__ import annotations

import pathlib
import zlib

import numpy as np
import pytest

import graphc
from graphc.ir import ParseError, format_graph, parse
from graphc.ir.parser import MAX_DEPTH

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
CASES = 1500

TRICKY = ["s0", "s1*2", "inf", "-inf", "inf.x", "nan", "1e", "1.", "01", "1e999", "-0", "-",
          "f32", "bool[]", "i64[3]", "#", "# x.py:1", "\n", "\r", "\t", '"', '"]"', '"\\q"',
          '"\t"', '"a\\"b"', "\\", ",", ",,", "(", ")", "((", "()", "(1,)", "[", "]", "][",
          " ", "%0", "%x", "@g", "=", ":", "->", "<-", "true", "none", "x.y", "9" * 70,
          "é", "\u2028", "opaque", "function", "return"]


def _planned_seed() -> str:
    """The planned graph of a small training step (fused bodies, in-place updates)."""
    model = graphc.nn.Sequential(graphc.nn.Linear(4, 8), graphc.nn.ReLU(),
                                 graphc.nn.Linear(8, 3))
    opt = graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad()
        loss = graphc.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = graphc.compile(step, backend="interp")
    x, y = graphc.ones(5, 4), graphc.tensor(np.array([0, 1, 2, 0, 1]))
    compiled(x, y)
    compiled(x, y)
    return format_graph(compiled.graphs[-1])


def _seeds() -> list[str]:
    return [p.read_text() for p in sorted(FIXTURES.rglob("*.gir"))] + [_planned_seed()]


def _outcome(text: str, quick: bool) -> tuple:
    """('graph', its printed text, its structure) or ('error', the ParseError's message)."""
    try:
        graph = parse(text, quick=quick)
    except ParseError as err:
        return "error", str(err)
    return "graph", format_graph(graph), graph


def _node_lines(lines: list[str]) -> list[int]:
    return [k for k, line in enumerate(lines) if line.startswith("  %") and " = " in line]


def _attributes_at(line: str) -> int:
    """Where the node line's attribute list starts (its '['), or -1."""
    at = line.find(" = ")
    return -1 if at < 0 else line.find("[", at)


def _mutate(rng, text: str) -> str:
    lines = text.split("\n")
    nodes = _node_lines(lines)
    if not nodes:
        return text
    k = nodes[int(rng.integers(len(nodes)))]
    line = lines[k]
    how = int(rng.integers(5))
    if how == 0:  # a tricky token inserted, or replacing a few characters
        at, cut = int(rng.integers(len(line) + 1)), int(rng.integers(3))
        lines[k] = line[:at] + str(rng.choice(TRICKY)) + line[at + cut:]
    elif how == 1:  # one character of the line changed
        at = int(rng.integers(len(line)))
        lines[k] = line[:at] + str(rng.choice(list("()[],=:%\"#s0.e- \\"))) + line[at + 1:]
    elif how == 2:  # defined twice, or used before its definition
        j = nodes[int(rng.integers(len(nodes)))]
        if rng.random() < 0.5:
            lines.insert(j, line)
        else:
            lines[k], lines[j] = lines[j], lines[k]
    elif how == 3:  # another node's attribute list, or its tuple, in this node
        other = lines[nodes[int(rng.integers(len(nodes)))]]
        a, at = _attributes_at(other), _attributes_at(line)
        b = other.find("](", a)
        if 0 <= a < b and at >= 0:
            end = line.find("](", at)
            lines[k] = line[:at] + other[a:b + 1] + line[end + 1 if end > 0 else at:]
    else:  # a tuple literal nested around the limit
        depth = int(rng.choice([MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1]))
        at = _attributes_at(line)
        if at >= 0:
            lines[k] = line[:at + 1] + "a=" + "(" * depth + "1" + ")" * depth + ", " + \
                line[at + 1:]
    return "\n".join(lines)


def test_seeds_read_the_same_quick_and_token_by_token():
    for text in _seeds():
        quick, slow = _outcome(text, True), _outcome(text, False)
        assert quick[0] == "graph" and quick[1] == slow[1]
        assert quick[2] == slow[2]


def test_mutated_node_lines_give_the_same_graph_or_the_same_error(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    seeds = _seeds()
    kinds = {"graph": 0, "error": 0}
    for i in range(CASES):
        rng = np.random.default_rng([seed, i])
        text = seeds[i % len(seeds)]
        for _ in range(int(rng.integers(1, 3))):
            text = _mutate(rng, text)
        quick, slow = _outcome(text, True), _outcome(text, False)
        assert quick[:2] == slow[:2], f"case {i} (seed {seed}): {text!r}"
        if quick[0] == "graph":
            assert quick[2] == slow[2], f"case {i} (seed {seed}): {text!r}"
        kinds[quick[0]] += 1
    assert kinds["graph"] > CASES // 10 and kinds["error"] > CASES // 4, kinds


@pytest.mark.parametrize("line, expected", [
    ("%1: f32[3] = f32[](%x)", "expected a name, got 'f32[]'"),
    ("%1: f32[3] = s0(%x)", "expected a name, got 's0'"),
    ("%1: f32[3] = relu[a=(s0, 1)](%x)", None),
    ("%1: f32[3] = relu[a=(inf.x,)](%x)", "unexpected character '.'"),
    ("%1: f32[3] = relu[a=(1e,)](%x)", "expected ')', got 'e'"),
    ("%1: f32[3] = relu[a=(1, 2), a=(1, 2)](%x)", "attribute 'a' given twice"),
    ("%1: f32[3] = relu[a=(\"]\", 1)](%x)", None),
    ("%1: f32[3] = relu[a=(1,  # c\n 2)](%x)", None),
    ("%x: f32[3] = relu(%x)", "%x is defined twice"),
    ("%1: f32[3] = relu(%2)", "%2 is used before it is defined"),
    ("%1: f32[99999999999999999999] = relu(%x)", "a dimension of 20 digits"),
    ("%1: f32[3], %2: f32[2,9999999999999999999] = split(%x)", "column 25: a dimension of 19"),
])
def test_quick_reads_stop_where_the_tokens_differ(line, expected):
    text = ("graph @f(%x: f32[3]) -> (f32[3]) {\n  %0: f32[3] = relu[a=(1, 2)](%x)\n  "
            + line + "\n  return (%0)\n}")
    quick, slow = _outcome(text, True), _outcome(text, False)
    assert quick[:2] == slow[:2]
    if expected is None:
        assert quick[0] == "graph"
    else:
        assert quick[0] == "error" and expected in quick[1], quick[1]
