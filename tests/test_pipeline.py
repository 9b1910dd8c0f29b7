"""The pass pipeline: order, verification after every pass, records and dumps."""

from __future__ import annotations

import pytest

import graphc  # noqa: F401  (registers the ops)
from graphc.ir import Graph, VerifyError, format_graph, parse
from graphc.passes import run_pipeline

TEXT = """graph @f(%x: f32[4]) -> (f32[4]) {
  %0: f32[4] = relu(%x)
  %1: f32[4] = exp(%x)
  return (%0)
}"""


def drop_unused_exp(g: Graph) -> Graph:
    """Removes exp nodes whose result no one reads (a toy pass for the pipeline test)."""
    used = {v for n in g.nodes for v in n.inputs} | set(g.outputs)
    g.nodes = [n for n in g.nodes if n.op != "exp" or any(v in used for v in n.outputs)]
    return g


def breaks_types(g: Graph) -> Graph:
    """Changes an output type: the verifier must reject the result."""
    g.nodes[0].outputs[0].type = graphc.TensorType((5,), graphc.float32)
    return g


def test_pipeline_runs_passes_in_order_and_records_them(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_DUMP", str(tmp_path))
    g, report = run_pipeline(parse(TEXT), [drop_unused_exp])
    assert [n.op for n in g.nodes] == ["relu"]
    (record,) = report.records
    assert (record.name, record.nodes_before, record.nodes_after) == ("drop_unused_exp", 2, 1)
    dumped = (tmp_path / "f.1.drop_unused_exp.gir").read_text()
    assert dumped.startswith("# after drop_unused_exp (")
    assert parse(dumped) == g and format_graph(parse(dumped)) == format_graph(g)


def test_pipeline_rejects_a_pass_that_breaks_the_graph():
    with pytest.raises(VerifyError, match=r"relu at unknown location: output types"):
        run_pipeline(parse(TEXT), [breaks_types])


def test_pipeline_rejects_bad_input_before_any_pass():
    bad = TEXT.replace("%0: f32[4] = relu(%x)", "%0: f32[4] = relu(%y)")
    with pytest.raises(Exception, match=r"%y is used before it is defined"):
        run_pipeline(parse(bad), [drop_unused_exp])
