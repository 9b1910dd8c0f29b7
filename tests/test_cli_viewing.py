"""`graphc viz --html / --explorer` and `graphc profile FILE.py:builder`, through
graphc.tools.cli.main: the files they write, what they print, and their error paths."""

from __future__ import annotations

import json
import textwrap

import pytest

from graphc.ir.printer import format_graph
from graphc.tools.cli import main
from tests.viewer_support import fused_graph

BUILDERS = textwrap.dedent('''
    import graphc
    import graphc.nn as nn


    def train():
        graphc.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        opt = graphc.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step, (graphc.randn(5, 8), graphc.tensor([0, 1, 2, 3, 0]))


    def infer():
        graphc.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU()), (graphc.randn(2, 8),)


    def broken():
        return 3
''')


@pytest.fixture
def builders(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(BUILDERS)
    return path


@pytest.fixture
def gir(tmp_path):
    path = tmp_path / "fused.gir"
    path.write_text(format_graph(fused_graph()) + "\n")
    return path


def test_viz_html(tmp_path, gir, capsys):
    assert main(["viz", str(gir), "--html"]) == 0
    page = (tmp_path / "fused.html").read_text()
    assert '"name":"fused"' in page and "graphcViewer" in page
    assert main(["viz", str(gir), "-o", str(tmp_path / "other.html")]) == 0  # by extension
    assert (tmp_path / "other.html").read_text() == page
    assert "wrote" in capsys.readouterr().out


def test_viz_explorer(tmp_path, gir, capsys):
    assert main(["viz", str(gir), "--explorer"]) == 0
    graphs = json.loads((tmp_path / "fused.mx.json").read_text())
    assert graphs["label"] == "fused" and graphs["graphs"][0]["id"] == "fused"
    assert "fused" in json.loads((tmp_path / "fused.bytes.json").read_text())
    assert "model-explorer" in capsys.readouterr().out


def test_profile_a_training_step(tmp_path, builders, capsys, monkeypatch):
    pytest.importorskip("llvmlite", reason="graphc profile compiles on the cpu backend")
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "t.json"
    assert main(["profile", f"{builders}:train", "--repeat", "2", "--trace", str(trace),
                 "--explorer", str(tmp_path / "step.mx.json")]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "matmul" in out and "models.py" in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert events and all(e["ph"] == "X" and e["args"]["values"] for e in events)
    timed = json.loads((tmp_path / "step.time.json").read_text())
    assert next(iter(timed.values()))["results"]


def test_profile_a_module_and_a_bad_builder(tmp_path, builders, capsys, monkeypatch):
    pytest.importorskip("llvmlite", reason="graphc profile compiles on the cpu backend")
    monkeypatch.chdir(tmp_path)
    assert main(["profile", f"{builders}:infer", "--repeat", "1", "--limit", "1"]) == 0
    assert len(list(tmp_path.glob("*.trace.json"))) == 1
    assert main(["profile", f"{builders}:broken"]) == 2
    assert "must return (model_or_fn, example_inputs)" in capsys.readouterr().err


def test_viz_explorer_serve_starts_model_explorer(tmp_path, gir, monkeypatch):
    model_explorer = pytest.importorskip(
        "model_explorer", reason="ai-edge-model-explorer is not installed (the explorer extra)")
    started = {}

    def visualize_from_config(config, **options):  # the real one serves until Ctrl+C
        started.update(options, sources=config.model_sources,
                       node_data=config.node_data_sources)

    monkeypatch.setattr(model_explorer, "visualize_from_config", visualize_from_config)
    assert main(["viz", str(gir), "--explorer", "--serve"]) == 0
    assert started["extensions"] == ["graphc.tools.model_explorer"]
    assert started["sources"] == [{"url": str(tmp_path / "fused.mx.json")}]
    assert started["node_data"] == [str(tmp_path / "fused.bytes.json")]
