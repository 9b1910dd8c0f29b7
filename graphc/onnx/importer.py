"""`graphc.onnx.load`: an ONNX model as a graphc nn.Module whose forward runs graphc ops.

`OnnxModule.forward` walks the ONNX graph in order and applies, for each node, the function
the import tables (graphc.onnx.import_ops, import_nn, import_shape) give for its op type; they
call registry ops (`graphc.ops.registry.call`), so the module runs eagerly with autograd,
traces, and compiles like any other. Float initializers are `Parameter`s, registered under
their ONNX names split at dots (`0.weight` is the parameter `weight` of the submodule `0`), so
`state_dict()` keys are the initializer names and an imported model can be fine-tuned.

Values known without the inputs are *static*: integer initializers, `Constant` nodes, `Shape`
of a tensor (its shape is known even in a trace), and every node whose inputs are all static.
Such nodes run eagerly with graphc's kernels even inside a trace, and their results are numpy
arrays, so shape computations (Shape -> Gather -> Concat -> Reshape) never reach the IR, and
attributes-as-inputs (Reshape's shape, Slice's starts) are literals by the time an op needs
them. A node that needs a static input it cannot have in a trace raises TraceError.

Element types: graphc computes in float32, float64, int64 and bool; float16 and narrow
integers widen on the way in (graphc.tensor's rule). An op type with no entry in the tables,
an attribute value the entry does not handle, or a subgraph is refused with
`UnsupportedOnnxOp`, naming the op, the opset and the node: never a silently wrong result.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphc.errors import GraphcError, TraceError
from graphc.nn.module import Module
from graphc.nn.parameter import Parameter

_T = onnx.TensorProto
# element types graphc reads: its own four, and the narrower ones it widens on the way in
SUPPORTED_ELEM_TYPES = {_T.FLOAT, _T.DOUBLE, _T.INT64, _T.BOOL, _T.FLOAT16, _T.INT8, _T.INT16,
                        _T.INT32, _T.UINT8, _T.UINT16, _T.UINT32}


class UnsupportedOnnxOp(GraphcError, NotImplementedError):
    """An ONNX node graphc does not map: names the op, its opset and the node."""

    def __init__(self, op_type: str, opset: int, node: str, reason: str = "") -> None:
        self.op_type, self.opset, self.node = op_type, opset, node
        why = f": {reason}" if reason else ""
        super().__init__(f"ONNX op {op_type} (opset {opset}) in node {node!r} is not supported "
                         f"by graphc{why}")


def _attribute(attr: onnx.AttributeProto) -> Any:
    if attr.type == onnx.AttributeProto.GRAPH or attr.type == onnx.AttributeProto.GRAPHS:
        return attr  # a subgraph: only refused, never run
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


class NodeContext:
    """What an import function sees of its node: attributes, opset, conversions, refusal."""

    def __init__(self, node: onnx.NodeProto, opset: int, label: str,
                 elem_types: dict[str, int] | None = None) -> None:
        self.node = node
        self.opset = opset
        self.label = label
        self.attrs = {a.name: _attribute(a) for a in node.attribute}
        self.num_outputs = len(node.output)
        self.cache: dict = {}  # what an import function derives from shapes only, per node
        self._elem_types = elem_types or {}

    def elem_type(self, name: str) -> int:
        """The ONNX element type the graph declares for value `name` (0 where unknown):
        graphc widens narrow integers, so ops that saturate to a type ask for it here."""
        return self._elem_types.get(name, 0)

    def with_attrs(self, **attrs) -> NodeContext:
        """A copy of this context with some attributes replaced (a staged computation)."""
        other = NodeContext(self.node, self.opset, self.label, self._elem_types)
        other.attrs = {**self.attrs, **attrs}
        return other

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute `name`, or `default` when the node does not set it."""
        return self.attrs.get(name, default)

    def wants(self, index: int) -> bool:
        """Whether output `index` is read (present and not the empty name)."""
        return index < len(self.node.output) and self.node.output[index] != ""

    def refuse(self, reason: str = "") -> UnsupportedOnnxOp:
        """The error for a node this import cannot run (raise it)."""
        return UnsupportedOnnxOp(self.node.op_type, self.opset, self.label, reason)

    def static(self, x, what: str) -> np.ndarray:
        """The value of `x` as a numpy array: static values as they are, tensors by reading
        them (eager only; in a trace a value that decides a shape must be static)."""
        if x is None or isinstance(x, np.ndarray):
            return x
        try:
            return x.detach().numpy()
        except TraceError as err:
            raise TraceError(f"ONNX node {self.label!r} ({self.node.op_type}): its {what} is a "
                             "tensor computed from the inputs, and a trace cannot read values; "
                             "make it an initializer or a Constant") from err

    @staticmethod
    def tensor(x):
        """`x` as a graphc tensor (a static array becomes a constant tensor)."""
        return to_tensor(x)


def to_tensor(x):
    """`x` as a graphc tensor: a tensor as it is, a numpy array (static value) copied in, with
    graphc.tensor's widening of float16 and narrow integers."""
    from graphc.creation import tensor
    from graphc.tensor import Tensor

    if x is None or isinstance(x, Tensor):
        return x
    return tensor(x if x.flags.c_contiguous else x.copy(order="C"))


def _is_static(x) -> bool:
    return x is None or isinstance(x, np.ndarray)


def _run_static(fn, ctx, inputs):
    """Run an import function on static inputs eagerly, even inside a trace; numpy out."""
    from graphc.autograd.grad_mode import no_grad
    from graphc.dispatch import abstract_eval, set_tracer
    from graphc.tensor import Tensor

    previous = set_tracer(None)
    try:
        with abstract_eval(False), no_grad():
            out = fn(ctx, *inputs)
            outs = out if isinstance(out, tuple) else (out,)
            return tuple(o.numpy() if isinstance(o, Tensor) else o for o in outs)
    finally:
        set_tracer(previous)


class _Holder(Module):
    """A submodule that only holds parameters (the dotted parts of initializer names)."""

    def forward(self, *args):  # pragma: no cover - never called
        raise GraphcError("a parameter holder of an imported ONNX model has no forward")


class OnnxModule(Module):
    """A graphc Module running one ONNX graph; `load` builds it. Call it with the graph's
    inputs (positional, in order, or by name); it returns one tensor or a tuple."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__()
        from graphc.onnx.import_table import IMPORTERS

        graph = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          onnx.defs.onnx_opset_version())
        self.graph_name = graph.name
        self._constants: dict[str, np.ndarray] = {}
        self._params: dict[str, tuple[Module, str]] = {}
        for init in graph.initializer:
            array = numpy_helper.to_array(init)
            if array.dtype.kind == "f":
                self._add_parameter(init.name, array)
            else:
                self._constants[init.name] = array
        self._check_types(graph)
        initialized = {i.name for i in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in initialized]
        self.output_names = [o.name for o in graph.output]
        self.output_types = [o.type.tensor_type.elem_type for o in graph.output]
        elem_types = {v.name: v.type.tensor_type.elem_type
                      for v in [*graph.input, *graph.output, *graph.value_info]}
        elem_types |= {i.name: i.data_type for i in graph.initializer}
        self._nodes = []
        for i, node in enumerate(graph.node):
            label = node.name or f"{node.op_type}_{i}"
            ctx = NodeContext(node, self.opset, label, elem_types)
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedOnnxOp(node.op_type, self.opset, label,
                                        f"domain {node.domain!r} is not the ONNX default domain")
            if any(not isinstance(a, (int, float, str, list, np.ndarray, type(None)))
                   for a in ctx.attrs.values()):
                raise ctx.refuse("subgraph and sparse attributes are not supported")
            if node.op_type not in IMPORTERS:
                raise ctx.refuse("no graphc mapping for this op")
            self._nodes.append((ctx, IMPORTERS[node.op_type]))

    def _check_types(self, graph: onnx.GraphProto) -> None:
        """Refuse graph inputs and outputs graphc has no tensor for (uint64, bfloat16, strings,
        sequences, optionals), naming the first node that reads or writes them."""
        for value in [*graph.input, *graph.output]:
            kind = value.type.WhichOneof("value")
            elem = value.type.tensor_type.elem_type if kind == "tensor_type" else None
            if kind is None or kind == "tensor_type" and elem in (*SUPPORTED_ELEM_TYPES, 0):
                continue  # no type given (0: undefined), or one graphc reads
            what = (helper.tensor_dtype_to_string(elem) if elem else kind) or "unknown"
            node = next((n for n in graph.node
                         if value.name in n.input or value.name in n.output), None)
            op, label = (node.op_type, node.name or node.op_type) if node else ("?", "graph")
            raise UnsupportedOnnxOp(op, self.opset, label,
                                    f"value {value.name!r} of type {what}: graphc computes in "
                                    "float32/float64/int64/bool (narrower types widen)")

    def _add_parameter(self, name: str, array: np.ndarray) -> None:
        from graphc.creation import tensor

        param = Parameter(tensor(array.copy(order="C")))
        *path, leaf = name.split(".")
        owner: Module = self
        try:
            for part in path:
                child = owner._modules.get(part)
                if child is None:
                    child = _Holder()
                    owner.add_module(part, child)
                owner = child
            if not leaf or leaf in owner.__dict__ or leaf in owner._modules:
                raise KeyError(leaf)
            owner.register_parameter(leaf, param)
        except (KeyError, AttributeError, TypeError, GraphcError):
            owner, leaf = self, "p_" + "".join(c if c.isalnum() else "_" for c in name)
            owner.register_parameter(leaf, param)
        self._params[name] = (owner, leaf)

    def forward(self, *args, **kwargs):
        """Run the ONNX graph on the inputs; one tensor, or a tuple for several outputs."""
        if len(args) > len(self.input_names):
            raise GraphcError(f"ONNX graph {self.graph_name!r} takes {len(self.input_names)} "
                              f"inputs {self.input_names}, got {len(args)}")
        env: dict[str, Any] = dict(self._constants)
        for name, (owner, leaf) in self._params.items():
            env[name] = getattr(owner, leaf)
        given = dict(zip(self.input_names, args)) | kwargs
        for name in self.input_names:
            if name not in given:
                raise GraphcError(f"ONNX graph {self.graph_name!r}: input {name!r} not given")
            x = given[name]
            env[name] = x if not isinstance(x, np.ndarray) else to_tensor(x)
        for ctx, fn in self._nodes:
            inputs = [env[n] if n else None for n in ctx.node.input]
            try:
                if all(_is_static(x) for x in inputs):
                    outs = _run_static(fn, ctx, inputs)
                else:
                    out = fn(ctx, *inputs)
                    outs = out if isinstance(out, tuple) else (out,)
            except UnsupportedOnnxOp:
                raise
            except GraphcError as err:
                try:  # the same kind of error, saying which ONNX node it came from
                    named = type(err)(f"while running ONNX node {ctx.label!r} "
                                      f"({ctx.node.op_type}): {err}")
                except TypeError:  # a kind whose constructor takes more than a message
                    raise err from None
                raise named from err
            for name, value in zip(ctx.node.output, outs):
                if name:
                    env[name] = value
        results = tuple(to_tensor(env[n]) for n in self.output_names)
        return results[0] if len(results) == 1 else results


def load(path_or_model) -> OnnxModule:
    """Import an ONNX model (a path, bytes, a binary file or a ModelProto) as a graphc Module.

    >>> import graphc, graphc.onnx
    >>> m = graphc.onnx.load(graphc.onnx.to_model(graphc.nn.Linear(3, 2), (graphc.ones(4, 3),)))
    >>> m(graphc.ones(4, 3)).shape
    graphc.Size([4, 2])
    """
    if isinstance(path_or_model, onnx.ModelProto):
        model = path_or_model
    elif isinstance(path_or_model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(path_or_model))
    elif isinstance(path_or_model, (str, os.PathLike)):
        model = onnx.load(os.fspath(path_or_model))
    else:
        model = onnx.load(path_or_model)
    return OnnxModule(model)
