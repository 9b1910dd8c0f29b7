"""The Model Explorer extension: `model-explorer FILE.gir --extensions=graphc.tools.model_explorer`.

Model Explorer imports `<extension>.main` and registers the `model_explorer.Adapter`
subclasses it defines; `GraphcAdapter.convert` reads a `.gir` IR text file (what `graphc
dump`, GRAPHC_DUMP and `graphc demo` write) and returns the graphs that
graphc.tools.model_explorer.explorer_graphs builds, as Model Explorer's data classes. Importing
this module needs the `ai-edge-model-explorer` package (`pip install "graphc[explorer]"`).
"""

from __future__ import annotations

from typing import Any

from graphc.tools.model_explorer import explorer_graphs, read_graph

try:
    from model_explorer import Adapter, AdapterMetadata, ModelExplorerGraphs, graph_builder
except ImportError as err:  # importable without the extra (doctests, docs); no adapter then
    MISSING: ImportError | None = err
    Adapter = object  # type: ignore[assignment,misc]
else:
    MISSING = None

__all__ = ["GraphcAdapter", "to_dataclasses"]


def _key_values(items: list[dict[str, str]]) -> list[graph_builder.KeyValue]:
    return [graph_builder.KeyValue(key=kv["key"], value=kv["value"]) for kv in items]


def _metadata(items: list[dict[str, Any]]) -> list[graph_builder.MetadataItem]:
    return [graph_builder.MetadataItem(id=m["id"], attrs=_key_values(m["attrs"])) for m in items]


def to_dataclasses(graphs: dict[str, Any]) -> ModelExplorerGraphs:
    """explorer_graphs' JSON as Model Explorer's `graph_builder` data classes."""
    if MISSING is not None:
        raise ImportError("graphc's Model Explorer adapter needs the ai-edge-model-explorer "
                          f"package: pip install 'graphc[explorer]' ({MISSING})")
    result = []
    for g in graphs["graphs"]:
        nodes = [graph_builder.GraphNode(
            id=n["id"], label=n["label"], namespace=n["namespace"],
            attrs=_key_values(n["attrs"]),
            incomingEdges=[graph_builder.IncomingEdge(**e) for e in n["incomingEdges"]],
            outputsMetadata=_metadata(n["outputsMetadata"]),
            inputsMetadata=_metadata(n["inputsMetadata"])) for n in g["nodes"]]
        result.append(graph_builder.Graph(id=g["id"], nodes=nodes,
                                          groupNodeAttributes=g["groupNodeAttributes"]))
    return {"graphs": result}


class GraphcAdapter(Adapter):
    """graphc IR text (`.gir`) for Model Explorer: regions and fused nodes as layers."""

    metadata = None if MISSING is not None else AdapterMetadata(
        id="graphc_gir",
        name="graphc IR adapter",
        description="graphc IR text (.gir): forward/backward/optimizer regions and fused "
                    "groups as layers, each node's IR line, types and source line.",
        source_repo="graphc",
        fileExts=["gir"],
    )

    def __init__(self):
        super().__init__()

    def convert(self, model_path: str, settings: dict) -> ModelExplorerGraphs:
        return to_dataclasses(explorer_graphs(read_graph(model_path)))
