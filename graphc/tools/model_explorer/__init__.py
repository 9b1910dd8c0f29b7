"""graphc IR in Google's Model Explorer (`pip install "graphc[explorer]"`, which installs
`ai-edge-model-explorer`).

    model-explorer step.gir --extensions=graphc.tools.model_explorer
    graphc viz step.gir --explorer          # writes step.mx.json and step.bytes.json
    model-explorer step.mx.json --node_data_paths=step.bytes.json
    graphc viz step.gir --explorer --serve  # writes them and starts Model Explorer on them

This module is the conversion, with no dependency on the package: `explorer_graphs(graph)`
is the adapter's result in Model Explorer's JSON graph format (what its `convert` returns,
after `dataclasses.asdict`; a file for its built-in JSON adapter holds one graph collection,
`{"label": ..., "graphs": [...]}`, see `write_explorer_files`):

    {"graphs": [{"id": ..., "nodes": [{"id", "label", "namespace", "attrs": [{key, value}],
      "incomingEdges": [{sourceNodeId, sourceNodeOutputId, targetNodeInputId}],
      "outputsMetadata": [{"id", "attrs"}], "inputsMetadata": [...]}, ...]}]}

Node ids are the viewer's (graphc.tools.viewer): `in<i>`, `n<i>`, `n<i>.<k>` (an instruction
of a fused node's body), `out<i>`, `upd<i>`. Namespaces make Model Explorer's collapsible
layers: the region of each node (forward / backward / optimizer, or the source line: see
graphc.tools.viewer.node_regions), inside it one layer per fused node holding its body's
instructions, and the layers `inputs` and `outputs` for the graph's inputs, outputs and
in-place updates, nested by the module path of their dotted names (a parameter
`model.0.weight` and its optimizer state `model.0.weight.exp_avg` sit in `inputs/model/0`).
Each node's attributes hold its IR line, its source line, its op's literal attributes; each
output's metadata its value name, type, shape, dtype and bytes.

`node_data(graph, values, name)` is an overlay (Model Explorer's node data JSON) colouring
nodes by a number: `bytes_node_data` by the bytes each node writes, `time_node_data` by
the time graphc.profile measured for each kernel. `graphc.tools.model_explorer.main` holds
the `model_explorer.Adapter` subclass that Model Explorer loads as an extension.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from graphc.ir.export import fused_ops, short_literal
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import format_node
from graphc.tools.viewer import module_path, node_regions

__all__ = ["bytes_node_data", "explorer_graphs", "node_data", "read_graph", "serve",
           "time_node_data", "write_explorer_files"]

INPUTS, OUTPUTS = "inputs", "outputs"


def read_graph(path: str | os.PathLike) -> Graph:
    """A graph from a `.gir` IR text file (a custom Function's class is not imported)."""
    from graphc.ir import parse

    with open(path, "rb") as f:
        return parse(f.read(), require_registered=False)


def _layer(name: str) -> str:
    """A namespace component: Model Explorer splits namespaces at '/'."""
    return name.replace("/", "\u2215").strip() or "_"


def _owner(layer: str, name: str) -> str:
    """The layer of a graph input (or of its update) by its dotted name: the module path of a
    parameter, buffer or optimizer state (`model.0.weight.exp_avg` in `inputs/model/0`)."""
    module = module_path(name)
    return "/".join([layer] + [_layer(p) for p in module.split(".") if module])


def _nbytes(value: Value) -> int | None:
    shape = value.type.shape
    if not all(isinstance(d, int) for d in shape):
        return None  # a symbolic dimension
    return math.prod(shape) * value.type.dtype.itemsize


def _kv(key: str, value: Any) -> dict[str, str]:
    return {"key": key, "value": str(value)}


def _output_meta(k: int, value: Value) -> dict[str, Any]:
    attrs = [_kv("tensor_name", f"%{value.name}"), _kv("type", value.type),
             _kv("shape", "[" + ", ".join(str(d) for d in value.type.shape) + "]"),
             _kv("dtype", value.type.dtype.name)]
    size = _nbytes(value)
    if size is not None:
        attrs.append(_kv("bytes", size))
    return {"id": str(k), "attrs": attrs}


def _body(node: Node) -> list | None:
    body, outputs = node.attrs.get("body"), node.attrs.get("outputs")
    if node.op == "fused" and isinstance(body, (tuple, list)) and body and \
            isinstance(outputs, (tuple, list)) and len(outputs) == len(node.outputs):
        return list(body)
    return None


def explorer_graphs(graph: Graph) -> dict[str, Any]:
    """`graph` as Model Explorer's JSON graphs (module docstring).

    >>> from graphc.ir import parse
    >>> g = parse('graph @f(%x: f32[3]) -> (f32[3]) {\\n  %0: f32[3] = exp(%x)\\n'
    ...           '  return (%0)\\n}')
    >>> [(n["id"], n["label"], n["namespace"]) for n in explorer_graphs(g)["graphs"][0]["nodes"]]
    [('in0', '%x', 'inputs'), ('n0', 'exp', ''), ('out0', 'output 0', 'outputs')]
    """
    regions = node_regions(graph)
    source: dict[Value, tuple[str, int]] = {}  # value -> (node id, output index)
    nodes: list[dict[str, Any]] = []

    def node(nid: str, label: str, namespace: str, attrs: list, inputs: list[Value],
             outputs_meta: list) -> dict[str, Any]:
        entry = {"id": nid, "label": label, "namespace": namespace, "subgraphIds": [],
                 "attrs": attrs, "incomingEdges": [], "outputsMetadata": outputs_meta,
                 "inputsMetadata": [], "style": None, "config": None}
        for position, v in enumerate(inputs):
            src, out = source[v]
            entry["incomingEdges"].append({"sourceNodeId": src, "sourceNodeOutputId": str(out),
                                           "targetNodeInputId": str(position)})
        nodes.append(entry)
        return entry

    for i, v in enumerate(graph.inputs):
        node(f"in{i}", f"%{v.name}", _owner(INPUTS, v.name), [_kv("ir", f"%{v.name}: {v.type}")],
             [], [_output_meta(0, v)])
        source[v] = (f"in{i}", 0)
    for i, n in enumerate(graph.nodes):
        nid = f"n{i}"
        namespace = _layer(regions[i]) if regions[i] else ""
        attrs = [_kv("ir", format_node(n))] + ([_kv("source", n.loc)] if n.loc else []) + \
            ([_kv("region", regions[i])] if regions[i] else [])
        body = _body(n)
        if body is None:
            attrs += [_kv(key, short_literal(value)) for key, value in n.attrs.items()]
            node(nid, n.op, namespace, attrs, n.inputs,
                 [_output_meta(k, v) for k, v in enumerate(n.outputs)])
            source.update((v, (nid, k)) for k, v in enumerate(n.outputs))
            continue
        outs = ",".join("%" + v.name for v in n.outputs)
        layer = "/".join(filter(None, [namespace, _layer(f"fused {outs}")]))
        n_in = len(n.inputs)
        inner: dict[int, tuple[str, int]] = {r: source[v] for r, v in enumerate(n.inputs)}
        for k, (op, args, op_attrs) in enumerate(body):
            defined = [j for j, ref in enumerate(n.attrs["outputs"]) if ref == n_in + k]
            meta = [_output_meta(0, n.outputs[j]) for j in defined[:1]]
            entry = node(f"{nid}.{k}", str(op), layer,
                         [_kv("fused node", format_node(n))] + attrs[1:]
                         + [_kv(key, short_literal(value)) for key, value in op_attrs], [], meta)
            for position, ref in enumerate(args):
                src, out = inner[ref]
                entry["incomingEdges"].append({"sourceNodeId": src,
                                               "sourceNodeOutputId": str(out),
                                               "targetNodeInputId": str(position)})
            inner[n_in + k] = (f"{nid}.{k}", 0)
        for j, ref in enumerate(n.attrs["outputs"]):
            source[n.outputs[j]] = inner[ref]
    for i, v in enumerate(graph.outputs):
        node(f"out{i}", f"output {i}", OUTPUTS, [_kv("ir", f"return %{v.name}")], [v], [])
    for i, (target, v) in enumerate(graph.updates):
        node(f"upd{i}", f"%{target.name} \u2190", _owner(OUTPUTS, target.name),
             [_kv("ir", f"%{target.name} <- %{v.name}")], [v], [])
    fused = sum(fused_ops(n) is not None for n in graph.nodes)
    summary = {"graph": f"@{graph.name}", "nodes": str(len(graph.nodes)),
               "fused nodes": str(fused)}
    return {"graphs": [{"id": graph.name, "nodes": nodes, "groupNodeAttributes": {"": summary},
                        "groupNodeConfigs": None, "nodeLabelsToHide": None,
                        "tasksData": None, "layoutConfigs": None}]}


def _defining_nodes(graph: Graph) -> dict[str, str]:
    """Value name -> the explorer node id that defines it (a body instruction for fused)."""
    ids: dict[str, str] = {}
    for entry in explorer_graphs(graph)["graphs"][0]["nodes"]:
        for meta in entry["outputsMetadata"]:
            for kv in meta["attrs"]:
                if kv["key"] == "tensor_name":
                    ids[kv["value"][1:]] = entry["id"]
    return ids


def node_data(graph: Graph, values: dict[str, float], name: str) -> dict[str, Any]:
    """Model Explorer node data (its `ModelNodeData` JSON) giving explorer node ids a number,
    coloured on a white-to-red gradient."""
    return {graph.name: {"name": name, "results": {k: {"value": v} for k, v in values.items()},
                         "gradient": [{"stop": 0, "bgColor": "#ffffff"},
                                      {"stop": 1, "bgColor": "#e53935"}]}}


def bytes_node_data(graph: Graph) -> dict[str, Any]:
    """An overlay of the bytes each node's outputs take (a fused node: on the instructions
    that define its outputs); from the memory plan's buffer sizes where the graph has one."""
    plan = graph.meta.get("memory_plan")
    planned = getattr(plan, "sizes", None) if plan is not None else None
    where = _defining_nodes(graph)
    values: dict[str, float] = {}
    for v in [v for n in graph.nodes for v in n.outputs]:
        size = planned.get(v.name) if isinstance(planned, dict) else _nbytes(v)
        if size is not None and v.name in where:
            values[where[v.name]] = values.get(where[v.name], 0) + float(size)
    return node_data(graph, values, "bytes")


def time_node_data(graph: Graph, profile) -> dict[str, Any]:
    """An overlay of graphc.profile's kernel times (microseconds) on `graph`, the profiled
    executable's graph (`compiled.optimized_graph`): each kernel's time goes on the node
    that defines its first output."""
    where = _defining_nodes(graph)
    values: dict[str, float] = {}
    for row in profile.rows:
        for name in getattr(row, "values", ())[:1]:
            if name in where:
                values[where[name]] = values.get(where[name], 0) + row.seconds * 1e6
    return node_data(graph, values, "time (us)")


def write_explorer_files(graph: Graph, path: str, profile=None) -> list[str]:
    """Write `path`, the graph as a Model Explorer graph collection (`{"label", "graphs"}`:
    the JSON file form its built-in JSON adapter opens), and beside it `<stem>.bytes.json`
    (and `<stem>.time.json` given a profile); return the paths written."""
    stem = path[:-len(".mx.json")] if path.endswith(".mx.json") else os.path.splitext(path)[0]
    written = [path, stem + ".bytes.json"]
    with open(path, "w") as f:
        json.dump({"label": graph.name, "graphs": explorer_graphs(graph)["graphs"]}, f)
    with open(written[1], "w") as f:
        json.dump(bytes_node_data(graph), f)
    if profile is not None:
        written.append(stem + ".time.json")
        with open(written[2], "w") as f:
            json.dump(time_node_data(graph, profile), f)
    return written


def serve(paths: list[str], *, port: int | None = None, open_browser: bool = True) -> None:
    """Start Model Explorer on files `write_explorer_files` wrote (the graph, then overlays),
    with graphc's adapter loaded, so `.gir` files open from its page too. Blocks until the
    server stops (Ctrl+C). Needs `pip install "graphc[explorer]"`."""
    try:
        import model_explorer
    except ImportError as err:
        raise ImportError("Model Explorer is not installed: pip install 'graphc[explorer]' "
                          f"(ai-edge-model-explorer) ({err})") from err
    config = model_explorer.config().add_model_from_path(paths[0])
    for path in paths[1:]:
        config.add_node_data_from_path(path)
    options = {} if port is None else {"port": port}
    model_explorer.visualize_from_config(config, extensions=["graphc.tools.model_explorer"],
                                         no_open_in_browser=not open_browser, **options)
