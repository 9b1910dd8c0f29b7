"""graphc: a deep-learning graph compiler with a static execution engine.

Write models as in PyTorch (`graphc.Tensor`, `graphc.autograd.Function`, `graphc.nn.Module`,
`graphc.optim`); eager mode runs numpy kernels with autograd. Importing graphc never loads
llvmlite or CUDA.

>>> import graphc
>>> x = graphc.tensor([1.0, 2.0], requires_grad=True)
>>> y = (x * 3).sum()
>>> y.backward()
>>> x.grad
tensor([3., 3.])
"""

import importlib

from graphc import config as _config
from graphc import dispatch as _dispatch  # noqa: F401  (installs the dispatch point)
from graphc import ops as _ops
from graphc.autograd.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)
from graphc.creation import as_tensor, from_dlpack, from_numpy, tensor
from graphc.errors import (
    ArgumentError,
    AutogradError,
    DTypeError,
    GraphcError,
    ShapeError,
    TraceError,
)
from graphc.serialization import load, save
from graphc.tensor import Size, Tensor
from graphc.types import DType, TensorType, bool_, float32, float64, int64
from graphc.version import __version__

_config.set_openmp_waiting()  # GOMP_SPINCOUNT before any library loads libgomp (graphc.config)


def is_tensor(obj) -> bool:
    """True for graphc tensors (and Parameters), as torch.is_tensor."""
    return isinstance(obj, Tensor)



bool = bool_  # noqa: A001  (graphc.bool as torch.bool)
float = float32  # noqa: A001
double = float64
long = int64

for _module in _ops.OP_MODULES:
    for _name in _module.PUBLIC:
        globals()[_name] = getattr(_module, _name)
del _module, _name

from graphc import autograd, nn, optim  # noqa: E402  (graphc.nn / graphc.optim, as torch.*)
from graphc.jit import RecompileLimitError, compile, mark_dynamic, trace  # noqa: E402
from graphc.jit.dump import dump  # noqa: E402


def __getattr__(name: str):
    """`graphc.profile` is graphc.tools.profile.profile, imported on first use: the tools
    sit above every other layer, so nothing below may import them."""
    if name == "profile":
        return importlib.import_module("graphc.tools.profile").profile
    if name in _MISSING_DTYPES:
        raise AttributeError(f"module 'graphc' has no attribute {name!r}: graphc has no "
                             f"{_MISSING_DTYPES[name]} dtype (it keeps float32, float64, int64 "
                             "and bool); use graphc.float32 or graphc.int64 instead")
    raise AttributeError(f"module 'graphc' has no attribute {name!r}")


_MISSING_DTYPES = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16",
                   "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
                   "int8": "int8", "uint8": "uint8", "complex64": "complex64",
                   "cfloat": "complex64", "complex128": "complex128"}


# PyTorch's wider surface: creation (eye, linspace...), dtype limits, and the composites
from graphc import creation as _creation  # noqa: E402
from graphc.utils import dtype_info as _dtype_info  # noqa: E402
from graphc.utils import math_composites as _math_composites  # noqa: E402
from graphc.utils import selection as _selection  # noqa: E402
from graphc.utils import shape_composites as _shape_composites  # noqa: E402
from graphc.utils.composites import cumsum, einsum, masked_fill, multinomial, topk, tril, triu  # noqa: E402

for _module in (_creation, _dtype_info, _math_composites, _shape_composites, _selection):
    for _name in _module.PUBLIC:
        globals()[_name] = getattr(_module, _name)
del _module, _name
