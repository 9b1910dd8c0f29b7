"""IR text in, IR text out: printing, parsing, verifying and interpreting graphs."""

from __future__ import annotations

import numpy as np
import pytest

import graphc  # noqa: F401  (registers the ops)
from graphc.ir import ParseError, VerifyError, format_graph, parse, run, verify

TEXT = """graph @mlp(%x: f32[2,3], %b: f32[3]) -> (f32[2,3], bool[2,3]) {
  %0: f32[2,3] = add(%x, %b)                          # model.py:14
  %1: f32[2,3] = leaky_relu[negative_slope=0.2](%0)   # model.py:15
  %2: bool[2,3] = gt(%1, %x)
  %3: f32[] = full[shape=(), value=0.5, dtype="float32"]()
  %4: f32[2,3] = mul(%1, %3)
  return (%4, %2)
}"""


def test_parse_print_round_trip():
    g = parse(TEXT)
    assert parse(format_graph(g)) == g
    assert format_graph(parse(format_graph(g))) == format_graph(g)
    assert [n.op for n in g.nodes] == ["add", "leaky_relu", "gt", "full", "mul"]
    assert g.nodes[0].loc == "model.py:14"
    assert g.nodes[1].attrs == {"negative_slope": 0.2}
    assert g.nodes[3].attrs == {"shape": (), "value": 0.5, "dtype": "float32"}


def test_literals_round_trip():
    text = TEXT.replace("negative_slope=0.2", "negative_slope=-1e-05")
    g = parse(text)
    assert g.nodes[1].attrs["negative_slope"] == -1e-05
    assert parse(format_graph(g)) == g


def test_graphs_with_different_attrs_differ():
    assert parse(TEXT) != parse(TEXT.replace("0.2", "0.3"))


@pytest.mark.parametrize("bad,message", [
    (TEXT.replace("%0: f32[2,3] = add(%x, %b)", "%0: f32[2,3] = add(%x, %q)"),
     r"line 2, column \d+: %q is used before it is defined"),
    (TEXT.replace("f32[2,3] = mul", "f32[2,3) = mul"), r"line 6, column \d+: expected"),
    (TEXT.replace("%2: bool", "%1: bool"), r"%1 is defined twice"),
    (TEXT.replace("return (%4, %2)", "return (%4)"), r"return types"),
    (TEXT.replace("dtype=\"float32\"", "dtype=\"float32"), r"unterminated string"),
])
def test_parse_errors_name_line_and_column(bad, message):
    with pytest.raises(ParseError, match=message):
        parse(bad)


def test_verifier_accepts_and_rejects():
    g = verify(parse(TEXT))
    bad = parse(TEXT.replace("%4: f32[2,3] = mul", "%4: f32[3,2] = mul").replace(
        "-> (f32[2,3], bool", "-> (f32[3,2], bool"))
    with pytest.raises(VerifyError, match=r"mul at unknown location: output types"):
        verify(bad)
    broadcast = parse(TEXT.replace("%b: f32[3]", "%b: f32[4]"))
    with pytest.raises(VerifyError, match=r"add at model.py:14: .*must match"):
        verify(broadcast)
    unknown = parse(TEXT.replace("= gt(", "= greater("))
    with pytest.raises(VerifyError, match=r"unknown op 'greater'"):
        verify(unknown)
    bad_attr = parse(TEXT.replace("negative_slope=0.2", "slope=0.2"))
    with pytest.raises(VerifyError, match=r"unknown attribute 'slope'"):
        verify(bad_attr)
    assert g.nodes


def test_interpreter_matches_eager():
    g = parse(TEXT)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    out, mask = run(g, x, b)
    y = np.where(x + b > 0, x + b, 0.2 * (x + b))
    np.testing.assert_allclose(out, y * 0.5, rtol=1e-6)
    np.testing.assert_array_equal(mask, y > x)
    eager = graphc.leaky_relu(graphc.tensor(x) + graphc.tensor(b), 0.2) * 0.5
    np.testing.assert_allclose(out, eager.numpy(), rtol=1e-6)


def test_interpreter_checks_input_types():
    from graphc.ir import InterpreterError

    with pytest.raises(InterpreterError, match=r"input %x expects f32\[2,3\], got float64"):
        run(parse(TEXT), np.zeros((2, 3)), np.zeros(3, np.float32))


UPDATES = """graph @bn(%x: f32[4], %mean: f32[4]) -> (f32[4]) {
  %0: f32[] = full[shape=(), value=0.9, dtype="float32"]()
  %1: f32[4] = mul(%mean, %0)
  %2: f32[4] = add(%1, %x)
  %mean <- %2
  return (%2)
}"""


def test_updates_round_trip_verify_and_run():
    g = verify(parse(UPDATES))
    assert [(a.name, b.name) for a, b in g.updates] == [("mean", "2")]
    assert parse(format_graph(g)) == g
    out, new_mean = run(g, np.ones(4, np.float32), np.full(4, 2.0, np.float32))
    np.testing.assert_allclose(new_mean, np.full(4, 2.8), rtol=1e-6)
    with pytest.raises(VerifyError, match=r"only graph inputs can be updated"):
        verify(parse(UPDATES.replace("%mean <- %2", "%1 <- %2")))
    with pytest.raises(VerifyError, match=r"the new value is f32\[\], the input f32\[4\]"):
        verify(parse(UPDATES.replace("%mean <- %2", "%mean <- %0")))
