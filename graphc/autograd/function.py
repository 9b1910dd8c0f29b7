"""User-defined differentiable functions: `graphc.autograd.Function`.

As in PyTorch: subclass `Function`, write static `forward(ctx, *args)` and
`backward(ctx, *grad_outputs)`, call `MyFn.apply(*args)`. `forward` runs with grad mode off;
its tensor outputs get a `MyFnBackward` node whose `backward` returns one gradient per forward
argument (`None` for non-tensor arguments and for inputs that need none). Saved tensors are
version-checked when the backward reads them. Inside a trace, `apply` also tells the tracer
what the application was (`Tracer.record_function`), so that `derive_backward` can call this
`backward` on the traced graph.

>>> import graphc
>>> class MulConstant(graphc.autograd.Function):
...     @staticmethod
...     def forward(ctx, x, c):
...         ctx.c = c
...         return x * c
...     @staticmethod
...     def backward(ctx, g):
...         return g * ctx.c, None
>>> x = graphc.ones(3, requires_grad=True)
>>> MulConstant.apply(x, 2.0).sum().backward()
>>> x.grad
tensor([2., 2., 2.])
"""

from __future__ import annotations

from graphc.autograd.grad_mode import is_grad_enabled, no_grad
from graphc.autograd.graph import Node, SavedTensor, gradient_edge
from graphc.errors import AutogradError


class FunctionCtx:
    """The `ctx` of a Function: what forward leaves for backward."""

    def __init__(self) -> None:
        self._saved: tuple = ()
        self._dirty: set[int] = set()
        self._non_differentiable: set[int] = set()
        self.needs_input_grad: tuple[bool, ...] = ()
        self.materialize_grads = True
        self._node_name = "Function"

    def save_for_backward(self, *tensors) -> None:
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple:
        return tuple(
            s.unpack(self._node_name) if isinstance(s, SavedTensor) else s for s in self._saved
        )

    def mark_dirty(self, *tensors) -> None:
        """Declare inputs that forward changed in place (they are returned as outputs)."""
        self._dirty = {id(t) for t in tensors}

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable = {id(t) for t in tensors}

    def set_materialize_grads(self, value: bool) -> None:
        """With True (the default), None output gradients reach backward as zeros."""
        self.materialize_grads = value


class FunctionBackward(Node):
    """The node a Function call leaves in the graph; it calls the Function's backward.

    Each Function class gets its own subclass named `<Function>Backward` (as PyTorch's
    `type(y.grad_fn).__name__`), and, as in PyTorch where the node *is* the ctx, attributes the
    forward stored on `ctx` can be read from the node (`y.grad_fn.needs_input_grad`).
    """

    def __init__(self, fn_cls, ctx: FunctionCtx, next_functions, input_meta) -> None:
        super().__init__(next_functions, input_meta)
        self.fn_cls = fn_cls
        self.ctx = ctx
        self.output_types: tuple = ()

    def __getattr__(self, name: str):
        ctx = self.__dict__.get("ctx")
        if ctx is None or name.startswith("__"):
            raise AttributeError(name)
        try:
            return getattr(ctx, name)
        except AttributeError:
            raise AttributeError(
                f"'{type(self).__name__}' object has no attribute '{name}'"
            ) from None

    def name(self) -> str:
        return f"{self.fn_cls.__name__}Backward"

    def backward(self, grads: tuple) -> tuple:
        from graphc.ops.grad_utils import full_like

        if self.ctx.materialize_grads:
            grads = tuple(
                full_like(_Like(ty), 0.0) if g is None and ty is not None else g
                for g, ty in zip(grads, self.output_types)
            )
        result = self.fn_cls.backward(self.ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        n = len(self.next_functions)
        if len(result) > n and all(r is None for r in result[n:]):
            result = result[:n]
        if len(result) != n:
            raise AutogradError(
                f"function {self.name()} returned an incorrect number of gradients "
                f"(expected {n}, got {len(result)})"
            )
        return result

    def release(self) -> None:
        for saved in self.ctx._saved:
            if isinstance(saved, SavedTensor):
                saved.free()

    @property
    def num_outputs(self) -> int:
        return len(self.output_types)


class _Like:
    """A stand-in with `.shape`/`.dtype` so full_like can build zeros of an output's type."""

    def __init__(self, ty) -> None:
        self.shape, self.dtype = ty.shape, ty.dtype


def _backward_class(fn_cls) -> type:
    """The node class of `fn_cls` (`<Function>Backward`), made once per Function class."""
    cls = fn_cls.__dict__.get("_backward_cls")
    if cls is None:
        cls = type(f"{fn_cls.__name__}Backward", (FunctionBackward,),
                   {"__module__": fn_cls.__module__})
        fn_cls._backward_cls = cls
    return cls


def once_differentiable(backward):
    """Decorator for a `backward` that cannot itself be differentiated (runs without history)."""
    import functools

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with no_grad():
            return backward(ctx, *grads)

    return wrapper


class Function:
    """Base class of user-defined differentiable functions (see the module docstring).

    Both PyTorch styles work: `forward(ctx, *args)`, or `forward(*args)` together with a
    static `setup_context(ctx, inputs, output)`.
    """

    def __init_subclass__(cls, **kwargs) -> None:
        # Defining a subclass registers it, so that IR text can name it in a `function` line
        # (graphc.ir.printer): parsing IR text looks classes up and never imports modules.
        super().__init_subclass__(**kwargs)
        from graphc.ir.printer import register_function_class

        register_function_class(cls)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a Function subclass must define backward(ctx, ...)")

    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError(
            f"{type(self).__name__}: call the Function with {type(self).__name__}.apply(...), "
            "not by constructing it (forward and backward are static methods)"
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not defined for this Function")

    @classmethod
    def apply(cls, *args):
        from graphc.dispatch import current_tracer
        from graphc.tensor import Tensor

        tracer = current_tracer()
        if tracer is not None and not hasattr(tracer, "record_function"):
            tracer = None
        start = len(tracer.graph.nodes) if tracer is not None else 0
        ctx = FunctionCtx()
        ctx._node_name = f"{cls.__name__}Backward"
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        record = is_grad_enabled() and any(ctx.needs_input_grad)
        with no_grad():
            if _has_setup_context(cls):
                outputs = cls.forward(*args)
                cls.setup_context(ctx, args, outputs)
            else:
                outputs = cls.forward(ctx, *args)
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if tracer is not None:  # the forward's ops are recorded inline; remember the region
            tracer.record_function(cls, ctx, args, outs, start)
        if not record:
            return outputs
        wrapped = connect(cls, ctx, args, outs)
        return wrapped[0] if single else wrapped


def connect(cls, ctx: FunctionCtx, args: tuple, outs: tuple) -> tuple:
    """Give the outputs of `cls.forward(ctx, *args)` (already run) a `<cls>Backward` node with
    edges to the tensor arguments; return the outputs as the caller sees them. Used by
    `Function.apply` and by `derive_backward`, which replays a traced Function this way."""
    from graphc.tensor import Tensor

    edges, meta = [], []
    for a in args:
        if isinstance(a, Tensor):
            edges.append(gradient_edge(a))
            meta.append((a.shape, a.dtype))
        else:
            edges.append((None, 0))
            meta.append(None)
    node = _backward_class(cls)(cls, ctx, tuple(edges), tuple(meta))
    wrapped = tuple(_wrap_output(ctx, node, nr, o, args) for nr, o in enumerate(outs))
    node.output_types = tuple(o.type if isinstance(o, Tensor) else None for o in wrapped)
    ctx._saved = tuple(SavedTensor(t) if isinstance(t, Tensor) else t for t in ctx._saved)
    return wrapped


def _has_setup_context(cls) -> bool:
    setup = getattr(cls, "setup_context", None)
    return setup is not None and getattr(setup, "__func__", setup) is not _no_setup_context



def _wrap_output(ctx: FunctionCtx, node: FunctionBackward, nr: int, out, args):
    from graphc.tensor import Tensor

    if not isinstance(out, Tensor):
        return out
    if id(out) in ctx._non_differentiable or not out.dtype.is_floating:
        return out
    if id(out) in ctx._dirty:
        if out.is_leaf and out.requires_grad:
            raise AutogradError(
                f"{node.name()}: a leaf Variable that requires grad has been used in an "
                "in-place operation. (The Function changed it in place and marked it dirty.)"
            )
        out._version_counter.bump()  # as PyTorch: a dirty output counts one more change
        out._set_history(node, nr)
        return out
    if any(out is a for a in args):  # an input returned unchanged: a new alias of it
        alias = out.detach()
        alias._set_history(node, nr)
        return alias
    if out.grad_fn is not None or out.requires_grad:
        out = out.detach()
    out._set_history(node, nr)
    return out


_no_setup_context = Function.__dict__["setup_context"].__func__
