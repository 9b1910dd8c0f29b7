"""`graphc.onnx.export`: trace a model for inference and write the IR as an ONNX model.

The model is traced with graphc's tracer under `no_grad` with the modules in eval mode (the
caller's training flags are restored afterwards), optionally simplified (graphc.passes'
`simplify`: constants folded, identities and dead code gone), and each IR node is written
with the one table of graphc.onnx.export_ops. Arguments become the ONNX graph's inputs;
parameters, buffers and constants the trace captured become initializers under their module
names (`0.weight`), so Netron shows the same names as `state_dict`. The model is built only
with `onnx.helper` and `onnx.numpy_helper` and is checked with `onnx.checker.check_model(...,
full_check=True)` before it is written.

Invariants: the exported graph computes what the traced IR computes (the registry's kernels
are the semantics, not the ONNX op of the same name; see export_ops); an IR op with no mapping
is an OnnxExportError naming the op, the node and the reason, never a silently wrong model.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphc.errors import GraphcError
from graphc.onnx.export_ops import EXPORTERS, REFUSED, onnx_dtype

DEFAULT_OPSET = 17
MIN_OPSET = 13


class OnnxExportError(GraphcError, RuntimeError):
    """An IR graph that cannot be written as ONNX (an op with no mapping, a training graph)."""


class Emitter:
    """Collects the ONNX nodes and initializers of one export; export_ops call into it."""

    def __init__(self, opset: int, dynamic_dims: dict[int, tuple[str, int]]) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        # traced size of a dynamic axis -> (graph input, axis) whose runtime size it is
        self.dynamic_dims = dynamic_dims
        self.dynamic = bool(dynamic_dims)
        self._count = 0
        self._node = None  # the IR node being written, for names and errors

    def fresh(self, hint: str = "v") -> str:
        """A new ONNX value name."""
        self._count += 1
        return f"{hint}_{self._count}"

    def node(self, op_type: str, inputs: list[str], outputs: int = 1, **attrs) -> Any:
        """Append one ONNX node; return its output name (or names, for `outputs` > 1)."""
        names = [self.fresh() for _ in range(outputs)]
        doc = self._node.loc if self._node is not None and self._node.loc else None
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.fresh(op_type),
                                           doc_string=doc, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, array: np.ndarray) -> str:
        """A constant the export made (a shape, a scalar): a `Constant` node, so that
        graphc.onnx.load reads it as a static value and not as a trainable initializer."""
        return self.node("Constant", [], value=numpy_helper.from_array(np.asarray(array)))

    def is_dynamic(self, shape) -> bool:
        """Whether a shape holds a dimension equal to a dynamic axis' traced size."""
        return any(d in self.dynamic_dims for d in shape)

    def shape_of(self, shape) -> str:
        """A 1-D int64 value holding `shape`, where each dimension equal to a dynamic axis'
        traced size is read at run time from that graph input (Shape, Gather): the IR is
        traced at one shape, so dynamic axes are followed by their size. A constant when
        no dimension is dynamic."""
        if not self.is_dynamic(shape):
            return self.const(np.array(shape, np.int64))
        parts = []
        for d in shape:
            if d in self.dynamic_dims:
                name, axis = self.dynamic_dims[d]
                parts.append(self.node("Gather", [self.node("Shape", [name]),
                                                  self.const(np.array([axis], np.int64))]))
            else:
                parts.append(self.const(np.array([d], np.int64)))
        return self.node("Concat", parts, axis=0)

    def refuse(self, node, reason: str) -> OnnxExportError:
        """The error for an IR node that cannot be exported (raise it)."""
        where = f" at {node.loc}" if node.loc else ""
        outs = ", ".join(f"%{v.name}" for v in node.outputs)
        return OnnxExportError(f"onnx export: {outs} = {node.op}(...){where}: {reason}")


def _trace_for_inference(model_or_fn, args: tuple):
    from graphc.autograd.grad_mode import no_grad
    from graphc.jit import trace_call
    from graphc.nn.module import Module

    modules = list(model_or_fn.modules()) if isinstance(model_or_fn, Module) else []
    flags = [m.training for m in modules]
    try:
        for m in modules:
            m.training = False
        with no_grad():
            traced = trace_call(model_or_fn, args)
            traced.restore()
    finally:
        for m, flag in zip(modules, flags):
            m.training = flag
    return traced


_RANDOM_STATE = object()  # a generator's state input: only random ops read it, and they refuse


def _input_value(binding, name: str, value) -> np.ndarray | None:
    from graphc.jit import ArgBinding, ConstantBinding, RngBinding, TensorBinding

    if isinstance(binding, ArgBinding):
        return None
    if isinstance(binding, RngBinding):
        return _RANDOM_STATE
    if isinstance(binding, TensorBinding):
        return np.asarray(binding.tensor.detach().numpy())
    if isinstance(binding, ConstantBinding):
        return np.asarray(binding.array)
    raise OnnxExportError(f"onnx export: graph input %{name} is fed by {type(binding).__name__}: "
                          "only arguments, parameters, buffers and constants can be exported "
                          "(trace an inference call: no .grad, no random ops)")


def _value_info(name: str, ty, dims: dict[int, str]) -> onnx.ValueInfoProto:
    shape = [dims.get(i, d) for i, d in enumerate(ty.shape)]
    return helper.make_tensor_value_info(name, onnx_dtype(ty), shape)


def _axes_spec(spec) -> dict[int, str]:
    if isinstance(spec, dict):
        return {int(k): str(v) for k, v in spec.items()}
    return {int(a): f"dim_{a}" for a in spec}


def to_model(model_or_fn, args, input_names=None, output_names=None,
             opset_version: int = DEFAULT_OPSET, dynamic_axes=None,
             simplify: bool = True) -> onnx.ModelProto:
    """Trace `model_or_fn(*args)` for inference and return the checked ONNX ModelProto
    (`export` without the file). Arguments as for `export`.

    >>> import graphc, graphc.onnx
    >>> m = graphc.onnx.to_model(graphc.nn.Linear(3, 2), (graphc.ones(4, 3),))
    >>> [n.op_type for n in m.graph.node]
    ['Transpose', 'MatMul', 'Add', 'Identity']
    """
    if not MIN_OPSET <= opset_version <= onnx.defs.onnx_opset_version():
        raise OnnxExportError(f"onnx export: opset_version {opset_version} is outside the "
                              f"supported {MIN_OPSET}..{onnx.defs.onnx_opset_version()}")
    if not isinstance(args, tuple):
        args = (args,)
    traced = _trace_for_inference(model_or_fn, args)
    graph = traced.graph
    binding_of = {v.name: b for v, b in zip(graph.inputs, traced.bindings)}
    if simplify:
        from graphc.passes.simplify import simplify as simplify_pass

        graph = simplify_pass(graph)

    arg_inputs = [v for v in graph.inputs if _input_value(binding_of[v.name], v.name, v) is None]
    input_names = list(input_names or [v.name for v in arg_inputs])
    if len(input_names) != len(arg_inputs):
        raise OnnxExportError(f"onnx export: {len(input_names)} input_names for "
                              f"{len(arg_inputs)} tensor inputs")
    output_names = list(output_names or (["output"] if len(graph.outputs) == 1 else
                                         [f"output_{i}" for i in range(len(graph.outputs))]))
    if len(output_names) != len(graph.outputs):
        raise OnnxExportError(f"onnx export: {len(output_names)} output_names for "
                              f"{len(graph.outputs)} outputs")
    dynamic_axes = {k: _axes_spec(v) for k, v in (dynamic_axes or {}).items()}
    dynamic_dims: dict[int, tuple[str, int]] = {}
    dim_names: dict[int, str] = {}
    for name, axes in dynamic_axes.items():
        if name in input_names:
            for axis, label in axes.items():
                size = arg_inputs[input_names.index(name)].type.shape[axis]
                dynamic_dims.setdefault(size, (name, axis))
                dim_names.setdefault(size, label)

    em = Emitter(opset_version, dynamic_dims)
    names: dict[Any, str] = {}
    inputs = []
    for v in graph.inputs:
        array = _input_value(binding_of[v.name], v.name, v)
        if array is _RANDOM_STATE:
            continue
        if array is None:
            name = input_names[arg_inputs.index(v)]
            inputs.append(_value_info(name, v.type, dynamic_axes.get(name, {})))
        else:
            name = v.name
            em.initializers.append(numpy_helper.from_array(
                array.astype(v.type.dtype.np, copy=False).reshape(v.type.shape), name))
        names[v] = name
    for node in graph.nodes:
        if node.op not in EXPORTERS:
            raise em.refuse(node, REFUSED.get(node.op, "no ONNX mapping for this op"))
        em._node = node
        outs = EXPORTERS[node.op](em, node, [names[v] for v in node.inputs])
        for v, name in zip(node.outputs, outs):
            if name is not None:
                names[v] = name
    outputs = []
    for v, name in zip(graph.outputs, output_names):
        if v not in names:
            raise OnnxExportError(f"onnx export: output %{v.name} has no ONNX value (an output "
                                  "the export table could not give)")
        em._node = None
        em.nodes.append(helper.make_node("Identity", [names[v]], [name],
                                         name=em.fresh("output")))
        dims = dynamic_axes.get(name) or {i: dim_names[d] for i, d in enumerate(v.type.shape)
                                          if d in dim_names}
        outputs.append(_value_info(name, v.type, dims))
    onnx_graph = helper.make_graph(em.nodes, graph.name, inputs, outputs, em.initializers)
    opsets = [helper.make_opsetid("", opset_version)]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="graphc",
                              ir_version=helper.find_min_ir_version_for(opsets))
    from graphc.version import __version__

    model.producer_version = __version__
    onnx.checker.check_model(model, full_check=True)
    return model


def export(model_or_fn, args, path, input_names=None, output_names=None,
           opset_version: int = DEFAULT_OPSET, dynamic_axes=None, simplify: bool = True):
    """Export `model_or_fn(*args)` as an ONNX model at `path` (a path or a writable binary
    file), as torch.onnx.export: traced for inference (no_grad, modules in eval mode),
    parameters as initializers, checked with onnx.checker (full_check). Returns the
    ModelProto.

    `input_names` / `output_names` name the graph's inputs and outputs (default: the traced
    argument names, and `output` or `output_0, ...`); `dynamic_axes` maps a name to the
    axes (a list, or {axis: name}) that stay symbolic: every shape the graph builds
    (Reshape, Expand, ConstantOfShape) reads a dimension equal to a dynamic axis' traced size
    from that input at run time, so trace with a size no static dimension shares (3, not 1).

    >>> import graphc, graphc.onnx, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "lin.onnx")
    >>> _ = graphc.onnx.export(graphc.nn.Linear(3, 2), (graphc.ones(4, 3),), path)
    >>> os.path.getsize(path) > 0
    True
    """
    model = to_model(model_or_fn, args, input_names, output_names, opset_version,
                     dynamic_axes, simplify)
    if isinstance(path, (str, os.PathLike)):
        onnx.save(model, os.fspath(path))
    else:
        path.write(model.SerializeToString())
    return model
