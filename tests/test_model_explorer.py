"""The Model Explorer adapter: graphc IR as Model Explorer's JSON graphs, node-data overlays,
and (where `ai-edge-model-explorer` is installed) the adapter through the package's own data
classes and extension loader."""

from __future__ import annotations

import dataclasses
import json

import pytest

from graphc.ir.printer import format_graph
from graphc.tools.model_explorer import (
    bytes_node_data,
    explorer_graphs,
    time_node_data,
    write_explorer_files,
)
from tests.viewer_support import fused_graph, training_step


@pytest.fixture(scope="module")
def step_graph():
    return training_step()


@pytest.fixture
def step_gir(tmp_path, step_graph):
    path = tmp_path / "step.gir"
    path.write_text(format_graph(step_graph) + "\n")
    return path


def _nodes(graph):
    return {n["id"]: n for n in explorer_graphs(graph)["graphs"][0]["nodes"]}


def _attrs(node):
    return {kv["key"]: kv["value"] for kv in node["attrs"]}


def test_nodes_edges_and_layers():
    nodes = _nodes(fused_graph())
    assert list(nodes) == ["in0", "in1", "n0.0", "n0.1", "n1", "n2", "n3", "out0", "out1"]
    # a fused node is a layer of its body inside its region; the body's edges are wired
    assert nodes["n0.0"]["namespace"] == "forward/fused %0"
    assert [e["sourceNodeId"] for e in nodes["n0.0"]["incomingEdges"]] == ["in0", "in1"]
    assert nodes["n0.1"]["incomingEdges"] == [
        {"sourceNodeId": "n0.0", "sourceNodeOutputId": "0", "targetNodeInputId": "0"}]
    assert [e["sourceNodeId"] for e in nodes["n1"]["incomingEdges"]] == ["n0.1"]
    assert nodes["n3"]["namespace"] == "backward" and nodes["in0"]["namespace"] == "inputs"
    attrs = _attrs(nodes["n1"])
    assert attrs["ir"].startswith("%1: f32[3] = exp[group=1](%0)")
    assert attrs["source"] == "m.py:2" and attrs["group"] == "1"
    out = {kv["key"]: kv["value"] for kv in nodes["n0.1"]["outputsMetadata"][0]["attrs"]}
    assert out == {"tensor_name": "%0", "type": "f32[3]", "shape": "[3]", "dtype": "float32",
                   "bytes": "12"}


def test_training_step_is_valid_for_the_explorer(step_graph):
    nodes = _nodes(step_graph)
    for node in nodes.values():
        for edge in node["incomingEdges"]:  # every edge starts at a node of the graph
            assert edge["sourceNodeId"] in nodes
        assert "/" not in node["label"]
    namespaces = {n["namespace"].split("/")[0] for n in nodes.values()}
    assert len(namespaces - {"inputs", "outputs"}) == 3  # forward, backward, optimizer lines
    assert any(n["namespace"].count("/") == 1 and "fused" in n["namespace"]
               for n in nodes.values())
    json.dumps(explorer_graphs(step_graph))  # plain JSON
    # parameters and their optimizer state nest by module path, so do their updates
    by_label = {n["label"]: n["namespace"] for n in nodes.values()}
    assert by_label["%model.0.weight"] == by_label["%model.0.weight.exp_avg"] == "inputs/model/0"
    assert by_label["%x"] == "inputs" and by_label["%model.2.bias \u2190"] == "outputs/model/2"


def test_overlays(tmp_path, step_graph):
    data = bytes_node_data(step_graph)[step_graph.name]
    nodes = _nodes(step_graph)
    assert data["results"] and set(data["results"]) <= set(nodes)
    assert all(r["value"] > 0 for r in data["results"].values())

    class Row:  # what graphc.profile's KernelTime carries
        def __init__(self, values, seconds):
            self.values, self.seconds = values, seconds

    class Profile:
        rows = [Row(("27",), 2e-6), Row(("9",), 1e-6)]

    time = time_node_data(step_graph, Profile())[step_graph.name]["results"]
    assert time == {"n1.4": {"value": 2.0}, "n6": {"value": 1.0}}
    written = write_explorer_files(step_graph, str(tmp_path / "step.mx.json"), Profile())
    assert [p.rsplit("/", 1)[1] for p in written] == ["step.mx.json", "step.bytes.json",
                                                      "step.time.json"]
    collection = json.load(open(written[0]))  # the file form Model Explorer's JSON adapter reads
    assert collection == {"label": "step", "graphs": explorer_graphs(step_graph)["graphs"]}


# ---- with the ai-edge-model-explorer package -------------------------------------------------
def _package():
    return pytest.importorskip(
        "model_explorer", reason="ai-edge-model-explorer is not installed (pip install "
                                 "'graphc[explorer]'): the adapter's data classes are not tested")


def test_adapter_returns_the_packages_data_classes(step_gir, step_graph):
    model_explorer = _package()
    from graphc.tools.model_explorer.main import GraphcAdapter

    assert issubclass(GraphcAdapter, model_explorer.Adapter)
    assert GraphcAdapter.metadata.fileExts == ["gir"]
    result = GraphcAdapter().convert(str(step_gir), {})
    graph = result["graphs"][0]
    assert isinstance(graph, model_explorer.graph_builder.Graph)
    assert isinstance(graph.nodes[0], model_explorer.graph_builder.GraphNode)
    assert {"graphs": [dataclasses.asdict(graph)]} == explorer_graphs(step_graph)


def test_model_explorer_loads_the_extension(step_gir, step_graph):
    _package()
    from model_explorer.extension_manager import ExtensionManager

    manager = ExtensionManager.__new__(ExtensionManager)  # not the process-wide singleton
    ExtensionManager.__init__(manager, ["graphc.tools.model_explorer"])
    manager.load_extensions()
    found = [e for e in manager.get_extensions_metadata() if e["id"] == "graphc_gir"]
    assert found and found[0]["fileExts"] == ["gir"] and found[0]["type"] == "adapter"
    response = manager.run_cmd({"extensionId": "graphc_gir", "cmdId": "convert",
                                "modelPath": str(step_gir), "settings": {},
                                "deleteAfterConversion": False})
    assert response == explorer_graphs(step_graph)
