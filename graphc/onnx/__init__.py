"""graphc.onnx: ONNX in and out, and an ONNX backend (needs the `onnx` extra).

- `export(model, args, path, ...)`: trace for inference and write an ONNX model (as
  torch.onnx.export); `to_model` returns the ModelProto without writing it.
- `load(path_or_model)`: an nn.Module whose forward runs the ONNX graph with graphc ops, its
  float initializers as Parameters; an op graphc does not map is `UnsupportedOnnxOp`.
- `graphc.onnx.backend`: onnx.backend.base.Backend over `load`, for ONNX's node tests.

Importing `graphc` does not import this package (it loads the `onnx` package): import it
explicitly, `import graphc.onnx`. See docs/onnx.md.
"""

from graphc.onnx.exporter import OnnxExportError, export, to_model
from graphc.onnx.importer import OnnxModule, UnsupportedOnnxOp, load

__all__ = ["OnnxExportError", "OnnxModule", "UnsupportedOnnxOp", "export", "load", "to_model"]
