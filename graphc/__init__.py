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
from graphc.jit import RecompileLimitError, compile, trace  # noqa: E402
from graphc.jit.dump import dump  # noqa: E402


def profile(fn, *args, **kwargs):
    """Time every kernel of `fn(*args)` compiled on the cpu backend; see graphc.tools.profile.

    `print(graphc.profile(step, x, y))` shows the kernels slowest first; `trace="t.json"`
    also writes a Chrome / Perfetto trace; `repeat=N` sets the runs (default 20)."""
    from graphc.tools.profile import profile as run

    return run(fn, *args, **kwargs)
from graphc.utils.composites import cumsum, einsum, masked_fill, multinomial, topk, tril, triu  # noqa: E402
