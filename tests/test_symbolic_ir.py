"""Symbolic sizes in types and IR: expressions, guarded comparisons, text round trips, the
verifier and the interpreter on symbolic graphs (graphc.symbolic)."""

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.ir.interpreter import InterpreterError, run
from graphc.ir.parser import ParseError, parse
from graphc.ir.printer import format_graph
from graphc.ir.verifier import VerifyError, verify
from graphc.jit.tracer import trace_call
from graphc.symbolic import ShapeEnv, Sym, SymbolicShapeError, bind, parse_sym
from graphc.types import TensorType, float32

s0, s1 = Sym.symbol("s0"), Sym.symbol("s1")


def test_expressions_are_canonical_and_print():
    assert str(s0 * 784) == "s0*784"
    assert str(s0 - 1) == "s0-1"
    assert str(2 * s0 * s1 + 3) == "s0*s1*2+3"
    assert (s0 * 784) // 784 is not None and str((s0 * 784) // 784) == "s0"
    assert s0 + 1 - 1 is not s0 and (s0 + 1 - 1).same(s0)
    assert s0 - s0 == 0 and type(s0 - s0) is int
    assert (s0 * s1) // s1 == s0
    assert (s0 * 6) % 3 == 0


@pytest.mark.parametrize("text", ["s0", "s0*784", "s0-1", "-s0+3", "s0*s1*2-s0", "s0*s0+s1"])
def test_parse_sym_round_trips(text):
    assert str(parse_sym(text)) == text


def test_comparisons_decided_by_range_need_no_guard():
    # every symbol is >= 2 (0 and 1 are specialised)
    assert (s0 == 1) is False and (s0 != 0) is True and (s0 * 784 > 784) is True
    assert (s0 >= 2) is True and (s0 - 2 >= 0) is True


def test_undecidable_comparison_guards_in_env_and_refuses_outside():
    with pytest.raises(SymbolicShapeError, match="cannot decide"):
        _ = s0 == s1
    with ShapeEnv({"s0": 32, "s1": 32}).active() as env:
        assert s0 == s1
        assert not (s0 == 784)
        assert int(s0 + 1) == 33
    assert env.guards == ["s0-s1 == 0", "s0-784 != 0", "s0-32 == 0"]
    assert env.specialised() == {"s0": 32}


def test_tensor_type_hashable_and_printed():
    t = TensorType((s0, 784), float32)
    assert str(t) == "f32[s0,784]" and t.is_symbolic
    assert t == TensorType((Sym.symbol("s0"), 784), float32)
    assert hash(t) == hash(TensorType((Sym.symbol("s0"), 784), float32))
    assert {t: 1}[TensorType((Sym.symbol("s0"), 784), float32)] == 1
    assert str(t.numel) == "s0*784"


GRAPH = """graph @g(%x: f32[s0,784], %w: f32[784,10]) -> (f32[s0,10]) {
  %0: f32[s0,10] = matmul(%x, %w)
  %1: f32[s0*10] = reshape[shape=(s0*10,)](%0)
  %2: f32[s0,10] = reshape[shape=(s0, 10)](%1)
  return (%2)
}"""


def test_symbolic_ir_parses_prints_and_verifies():
    g = parse(GRAPH)
    assert g.inputs[0].type.shape[0].same(s0)
    assert parse(format_graph(g)) == g
    verify(g)


def test_verifier_rejects_wrong_symbolic_type():
    bad = GRAPH.replace("%0: f32[s0,10]", "%0: f32[s1,10]")
    with pytest.raises(VerifyError, match="differ from the op's rule"):
        verify(parse(bad))


def test_parse_error_on_malformed_symbolic_dim():
    with pytest.raises(ParseError):
        parse(GRAPH.replace("f32[s0,784]", "f32[s0**2,784]"))


def test_interpreter_runs_symbolic_graph_for_every_size():
    g = parse(GRAPH)
    w = np.random.default_rng(0).standard_normal((784, 10)).astype(np.float32)
    for b in (2, 5, 33):
        x = np.random.default_rng(b).standard_normal((b, 784)).astype(np.float32)
        out, = run(g, x, w)
        np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(InterpreterError, match="dimension 1"):
        run(g, np.zeros((4, 783), np.float32), w)


def test_bind_checks_every_dimension():
    assert bind([(s0, 3), (s0 * 2,)], [(4, 3), (8,)]) == {"s0": 4}
    with pytest.raises(SymbolicShapeError, match="s0\\*2"):
        bind([(s0, 3), (s0 * 2,)], [(4, 3), (9,)])
    with pytest.raises(SymbolicShapeError, match="at least 2"):
        bind([(s0,)], [(1,)])


def test_trace_with_symbolic_batch_round_trips_and_runs():
    graphc.manual_seed(0)
    m = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    x = graphc.randn(6, 12)
    traced = trace_call(m, (x,), {}, dynamic={(0, 0): {0}})
    g = traced.graph
    assert str(g.inputs[0].type) == "f32[s0,12]" and str(g.outputs[0].type) == "f32[s0,3]"
    assert parse(format_graph(g)) == g
    assert x.shape == (6, 12) and not x.is_abstract  # the argument is given back
    params = [p.detach().numpy() for p in m.parameters()]
    for b in (2, 9):
        xs = graphc.randn(b, 12)
        out, = run(g, xs.numpy(), *params)
        np.testing.assert_allclose(out, m(xs).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_size_one_is_specialised():
    m = nn.Linear(4, 2)
    traced = trace_call(m, (graphc.randn(1, 4),), {}, dynamic={(0, 0): {0}})
    assert str(traced.graph.inputs[0].type) == "f32[1,4]" and traced.symbols == []
