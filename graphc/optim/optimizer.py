"""`Optimizer`: the base of graphc's optimizers, with PyTorch's semantics.

An optimizer holds `param_groups` (a list of dicts: `params` plus per-group options, filled
from `defaults`) and `state` (a dict keyed by parameter tensor). `step()` updates the
parameters in place from their `.grad`.

Invariants every subclass keeps:
- Updates are written with graphc tensor ops (in-place methods such as `add_`, `mul_`,
  `copy_`) under `no_grad`, so a trace of a training step records the update as graph ops.
  State tensors are graphc tensors created with ops too. In eager mode SGD and Adam/AdamW
  run the same lines as numpy calls instead (graphc.optim.foreach: PyTorch's `foreach`
  default), bit for bit equal to the ops, bumping the same version counters.
- `step()` validates everything first (hyperparameters of every group, every gradient's type,
  shape and dtype, the shapes of the state tensors) and only then writes: an exception never
  leaves the parameters half-updated.
- State is made lazily by the update, from `initial_state(group, p)` where a subclass gives
  it: the state the next update creates, when that first update is the steady update
  applied to it (zero moments, a zero momentum buffer), which graphc.compile makes ahead of
  a trace with `make_first_step_state()` (graphc.jit.first_step); None where it is not.
- `state_dict()` refers to parameters by their index in group order, as PyTorch does, and
  copies the state tensors; `load_state_dict()` copies them back, casting floating-point state
  (except `step`) to the parameter's dtype.

>>> import graphc
>>> from graphc.optim import SGD
>>> w = graphc.tensor([1.0, 2.0], requires_grad=True)
>>> opt = SGD([w], lr=0.5)
>>> (w * w).sum().backward()
>>> opt.step()
>>> w
tensor([0., 0.], requires_grad=True)
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from copy import deepcopy
from itertools import chain
from typing import Any, Callable

from graphc.autograd.grad_mode import enable_grad, no_grad
from graphc.dispatch import current_tracer
from graphc.errors import ArgumentError, DTypeError, ShapeError
from graphc.tensor import Tensor


class _RequiredParameter:
    """Marks a default that every parameter group must give (PyTorch's `optim.required`)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _typename(obj) -> str:
    """PyTorch's `torch.typename`: "graphc.FloatTensor" for tensors, the class otherwise."""
    if isinstance(obj, Tensor):
        return obj.type_name()
    module = type(obj).__module__
    name = type(obj).__qualname__
    return name if module in ("builtins", None) else f"{module}.{name}"


def clone(t: Tensor) -> Tensor:
    """A new tensor equal to `t`, without history, made with graph ops (`full` + `copy_`)."""
    from graphc.ops.grad_utils import zeros_like

    with no_grad():
        return zeros_like(t).copy_(t)


def zeros_state(p: Tensor) -> Tensor:
    """A zero state tensor shaped and typed like parameter `p` (the `full` source op)."""
    from graphc.ops.grad_utils import zeros_like

    with no_grad():
        return zeros_like(p)


class Optimizer:
    """Base class: parameter groups, per-parameter state, zero_grad, state_dict.

    Subclasses give `defaults`, implement `_check_group(group)` (raise ValueError for a bad
    hyperparameter), list their per-parameter state tensors in `_STATE_KEYS`, and implement
    `_update_group(group, params, grads)`, which runs after every check has passed.
    """

    _STATE_KEYS: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {_typename(params)}"
            )
        try:
            param_groups = list(params)
        except TypeError:
            raise TypeError(
                "params argument given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {_typename(params)}"
            ) from None
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)
        _tell_tracer(self, made=True)

    # ---- parameter groups -----------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (the others come from defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead."
            )
        else:
            params = list(params)

        tensors, names = [], []
        for p in params:
            if isinstance(p, tuple):  # (name, tensor) pairs, as from named_parameters()
                names.append(p[0])
                tensors.append(p[1])
            else:
                tensors.append(p)
        param_group["params"] = tensors
        if names:
            if len(names) != len(tensors):
                raise ValueError(
                    "all optimizer params should be with/without names. Some param names are "
                    "missing"
                )
            param_group["param_names"] = names

        for p in tensors:
            if not isinstance(p, Tensor):
                raise TypeError(
                    "optimizer can only optimize Tensors, but one of the params is "
                    f"{_typename(p)}"
                )
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")

        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(
                    "parameter group didn't specify a value of required optimization parameter "
                    f"{name}"
                )
            param_group.setdefault(name, default)
        self._validate(param_group)

        if len(tensors) != len({id(p) for p in tensors}):
            warnings.warn(
                "optimizer contains a parameter group with duplicate parameters; in future, "
                "this will cause an error; see github.com/pytorch/pytorch/issues/40967 for more "
                "information",
                stacklevel=3,
            )
        seen: set[int] = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                which = "with names" if "param_names" in param_group else "without names"
                raise ValueError(
                    "all optimizer param groups should be with/without names. "
                    f"cannot add param group {which} to the optimizer"
                )
        if any(id(p) in seen for p in tensors):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise ValueError (PyTorch's wording) for an invalid hyperparameter of `group`."""

    def _validate(self, group: dict[str, Any]) -> None:
        """`_check_group`, its ValueError raised as an ArgumentError naming the optimizer."""
        try:
            self._check_group(group)
        except ArgumentError:
            raise
        except ValueError as err:
            raise ArgumentError(f"{type(self).__name__}: {err}") from None

    # ---- gradients ------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients: drop them (default) or fill them with zeros in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                with no_grad():
                    p.grad.zero_()

    # ---- the step -------------------------------------------------------------------------
    def step(self, closure: Callable[[], Any] | None = None):
        """One update of every parameter that has a gradient; returns closure()'s loss."""
        _tell_tracer(self, made=False)
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:  # check everything before the first write
            self._validate(group)
            params, grads = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._check_grad(p)
                self._check_state(p)
                params.append(p)
                grads.append(p.grad)
            work.append((group, params, grads))
        with no_grad():
            for group, params, grads in work:
                if params:
                    self._update_group(group, params, grads)
        return loss

    def _check_grad(self, p: Tensor) -> None:
        name = type(self).__name__
        g = p.grad
        if not isinstance(g, Tensor):
            raise TypeError(
                f"{name}: the gradient of a parameter must be a graphc Tensor, got "
                f"{_typename(g)}"
            )
        if getattr(g, "is_sparse", False):
            raise RuntimeError(
                f"{name} does not support sparse gradients, please consider SparseAdam instead"
                if name.startswith("Adam") else f"{name}: graphc has no sparse gradients"
            )
        if not p.dtype.is_floating:
            raise DTypeError(
                f"{name}: can only optimize floating point parameters, got a parameter of "
                f"dtype {p.dtype.name}"
            )
        if g.dtype is not p.dtype:
            raise DTypeError(
                f"{name}: assigned grad has data of a different type: the parameter is "
                f"{p.dtype.name}, its gradient {g.dtype.name}"
            )
        if tuple(g.shape) != tuple(p.shape):
            raise ShapeError(
                f"{name}: assigned grad has data of a different size: the parameter has shape "
                f"{list(p.shape)}, its gradient {list(g.shape)}"
            )

    def _check_state(self, p: Tensor) -> None:
        """The state tensors of `p` (if any) must match its shape, so no write can fail."""
        state = self.state.get(p)
        if not state:
            return
        name = type(self).__name__
        for key in self._STATE_KEYS:
            value = state.get(key)
            if value is None:
                continue
            if not isinstance(value, Tensor) or tuple(value.shape) != tuple(p.shape):
                shape = list(value.shape) if isinstance(value, Tensor) else _typename(value)
                raise ShapeError(
                    f"{name}: state {key!r} of a parameter of shape {list(p.shape)} has shape "
                    f"{shape}; was a state_dict loaded into a different model?"
                )
            if value.dtype is not p.dtype:
                raise DTypeError(
                    f"{name}: state {key!r} is {value.dtype.name}, its parameter "
                    f"{p.dtype.name}"
                )

    def _update_group(self, group: dict[str, Any], params: list, grads: list) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement its update")

    # ---- the first step's state, made ahead (graphc.compile) ------------------------------
    def initial_state(self, group: dict[str, Any], p: Tensor) -> dict[str, Any] | None:
        """The state entries the next update of `p` would create (those its state lacks),
        when its first update equals the steady update applied to that state: {} when the
        update creates none; None when the first update is different (SGD's momentum buffer
        with dampening starts as a clone of the gradient) or the optimizer does not say (the
        default: a custom optimizer). A subclass that gives it uses it for its own lazy
        initialisation too, so the state made ahead and the state made lazily are one code."""
        return None

    def make_first_step_state(self) -> list[tuple[Tensor, str]] | None:
        """Make now the state the next `step()` would make lazily for every parameter that
        requires grad, where that is exact (`initial_state`), so that a trace of a training
        step already sees the state of every later step and one graph serves them all
        (graphc.compile). Returns the (parameter, key) pairs made; None, making nothing, when
        some parameter's first update is not exact, or a subclass replaced `step` or the
        update without saying what its first update creates. A parameter that then gets no
        gradient in the step must have its new state removed again (PyTorch makes state only
        for parameters with a gradient): graphc.jit.first_step does."""
        if not _first_step_is_exact(type(self)):
            return None
        planned = []
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                new = self.initial_state(group, p)
                if new is None:
                    return None
                if new:
                    planned.append((p, new))
        made = []
        for p, new in planned:
            self.state[p].update(new)
            made += [(p, key) for key in new]
        return made

    # ---- saving and loading ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}; copies."""
        mapping: dict[int, int] = {}
        start = 0
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                mapping.setdefault(id(p), i)
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {
            (mapping[id(k)] if isinstance(k, Tensor) else k): _copy_value(v)
            for k, v in self.state.items()
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state_dict() into this optimizer (same group structure); copies tensors."""
        saved_groups = deepcopy(state_dict["param_groups"])
        groups = self.param_groups
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size of "
                "optimizer's group"
            )
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = {key: _cast_state(param, key, val) for key, val in v.items()}
            else:
                state[k] = _copy_value(v)
        new_groups = []
        for group, saved in zip(groups, saved_groups):
            saved["params"] = group["params"]
            if "param_names" in group and "param_names" not in saved:
                saved["param_names"] = group["param_names"]
            new_groups.append(saved)
        for group in new_groups:  # a loaded group must be as valid as a constructed one
            self._validate(group)
        self.state = state
        self.param_groups = new_groups

    def __repr__(self) -> str:
        text = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            text += f"\nParameter Group {i}\n"
            for key in sorted(group):
                if key != "params":
                    text += f"    {key}: {group[key]}\n"
        return text + ")"


def _owner(cls: type, name: str) -> type:
    """The class of `cls`'s MRO that defines attribute `name`."""
    return next(k for k in cls.__mro__ if name in vars(k))


def _first_step_is_exact(cls: type) -> bool:
    """Whether `initial_state` of `cls` speaks for its update: `step` is the base's, and the
    class that says what the first update creates also defines that update (or derives from
    the class that does): a subclass that replaced the update alone would be misdescribed."""
    says = _owner(cls, "initial_state")
    return cls.step is Optimizer.step and says is not Optimizer \
        and issubclass(says, _owner(cls, "_update_group"))


def _copy_value(value):
    """A deep copy in which every tensor is a new tensor (no shared memory)."""
    if isinstance(value, Tensor):
        return clone(value)
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_value(v) for v in value)
    return deepcopy(value)


def _cast_state(param: Tensor, key, value):
    """PyTorch's load policy: floating state takes the parameter's dtype, except `step`."""
    if isinstance(value, Tensor):
        value = clone(value)
        if key != "step" and param.dtype.is_floating and value.dtype.is_floating:
            with no_grad():
                value = value.to(param.dtype)
        return value
    return _copy_value(value)


def check_lr(lr) -> None:
    """Shared hyperparameter checks with PyTorch's messages. A tensor lr (a runtime input of a
    compiled step, as the lr schedulers keep it) is checked by value only outside a trace."""
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    lr = checkable(lr)
    if lr is not None and not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr} (lr must be >= 0)")


def _tell_tracer(opt: Optimizer, made: bool) -> None:
    """Inside a graphc.compile trace: the tracer checks that the call reaches every optimizer
    it steps (graphc.jit.tracer.Tracer.note_optimizer)."""
    note = getattr(current_tracer(), "note_optimizer", None)
    if note is not None:
        note(opt, made)


def checkable(value):
    """A hyperparameter's value for a range check: a Python number as is, a tensor's value
    outside a trace, None inside one (a runtime input, such as a scheduled lr, has no value
    there; it was checked when it was set)."""
    if isinstance(value, Tensor):
        if current_tracer() is not None or value.is_abstract:
            return None
        return value.item()
    return value


def add_scaled_(p: Tensor, update: Tensor, scale) -> Tensor:
    """p += scale * update, in place, where `scale` is a Python number (PyTorch's `alpha`) or a
    0-d tensor (a learning rate that is a runtime input), cast to p's dtype as PyTorch casts a
    scalar at the op."""
    if isinstance(scale, Tensor):
        return p.add_(update * scale.to(p.dtype))
    return p.add_(update, alpha=scale)


def check_weight_decay(weight_decay) -> None:
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay} (weight_decay must be >= 0)")
