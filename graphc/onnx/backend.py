"""`graphc.onnx.backend`: ONNX's Backend interface over graphc.onnx.load.

`prepare(model)` imports the model (graphc.onnx.load) and returns a `GraphcRep` whose
`run(inputs)` calls the module under no_grad, eagerly by default or compiled
(`prepare(model, backend="cpu")`, any graphc.compile backend). Inputs are numpy arrays (a list
in graph-input order, or a dict by name); outputs are numpy arrays cast to the element types
the graph declares, so an int32 or float16 model answers in int32 or float16 although graphc
computes in int64 or float32. ONNX's backend test runner drives it:

>>> import onnx, numpy as np
>>> from onnx import helper, TensorProto
>>> import graphc.onnx.backend as backend
>>> node = helper.make_node("Relu", ["x"], ["y"])
>>> backend.run_node(node, [np.array([-1.0, 2.0], np.float32)])[0]
array([0., 2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from graphc.onnx.importer import OnnxModule, load


class GraphcRep(BackendRep):
    """A prepared model: `run(inputs)` -> a tuple of numpy arrays, one per graph output."""

    def __init__(self, module: OnnxModule, backend: str | None = None) -> None:
        self.module = module
        self.fn = module
        if backend is not None:
            from graphc.jit import compile as graphc_compile

            self.fn = graphc_compile(module, backend=backend)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the model on numpy inputs (a list in order, a dict by name, or one array)."""
        from graphc.autograd.grad_mode import no_grad
        from graphc.onnx.importer import to_tensor

        if isinstance(inputs, dict):
            args = [inputs[name] for name in self.module.input_names]
        elif isinstance(inputs, np.ndarray):
            args = [inputs]
        else:
            args = list(inputs)
        with no_grad():
            out = self.fn(*(to_tensor(np.asarray(a)) for a in args))
        outs = out if isinstance(out, tuple) else (out,)
        results = []
        for value, elem_type in zip(outs, self.module.output_types):
            array = value.numpy()
            if elem_type:
                array = array.astype(helper.tensor_dtype_to_np_dtype(elem_type), copy=False)
            results.append(array)
        return tuple(results)


class GraphcBackend(Backend):
    """onnx.backend.base.Backend for graphc (CPU)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> GraphcRep:
        """Check and import `model`; `backend=` ("cpu", "interp", ...) compiles the module."""
        super().prepare(model, device, **kwargs)
        return GraphcRep(load(model), kwargs.get("backend"))

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info=None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node on numpy inputs (a model of that one node, prepared and run)."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        arrays = [np.asarray(a) for a in inputs]
        graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            a.dtype), a.shape) for name, a in zip(node.input, arrays) if name]
        if outputs_info:
            graph_outputs = [helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                for name, (dt, shape) in zip(node.output, outputs_info)]
        else:
            graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        if not outputs_info:  # the output types ONNX's shape inference gives, to cast back to
            inferred = onnx.shape_inference.infer_shapes(model)
            types = {v.name: v.type for v in [*inferred.graph.value_info,
                                              *inferred.graph.output]}
            for out in model.graph.output:
                if out.name in types:
                    out.type.CopyFrom(types[out.name])
        rep = GraphcRep(load(model))
        return rep.run([a for name, a in zip(node.input, arrays) if name])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """graphc's ONNX backend runs on the CPU."""
        return device.upper().startswith("CPU")


prepare = GraphcBackend.prepare
run_model = GraphcBackend.run_model
run_node = GraphcBackend.run_node
supports_device = GraphcBackend.supports_device
