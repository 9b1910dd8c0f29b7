"""Training steps that reach their model and optimizer in every way Python offers: default
arguments (`def step(x, y, model=model, opt=opt)`, keyword-only ones too), a
`functools.partial`'s bound arguments, a bound method's `self`, a callable object, a module
holding its optimizer, a closure over dicts of models, a compiled helper. Each compiled step
must equal the same step run eagerly, call after call (the first step makes optimizer state
lazily, the later ones read it), and must never leave an abstract tensor (the trace's, with no
data) in a module or in optimizer state. An optimizer held where the walk does not look is
refused, not silently left unguarded.

The bug these guard against: graphc.jit.reach did not walk default arguments, so a step with
`model=model, opt=opt` defaults reached no optimizer: its lazily made momentum buffers stayed
abstract in `opt.state`, no guard saw them, and the first-step graph was replayed for ever.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc import optim
from graphc.tensor import Tensor

CALLS = 4
RTOL = 1e-5  # float32 rounding: the compiled graph may order a sum differently

OPTIMIZERS = {
    "sgd_momentum": lambda params: optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: optim.Adam(params, lr=1e-2),
}


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train(model, opt, x, y):
    """The step every way below wraps."""
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


# ---- the ways a step reaches its state: each returns (step, how to call it) -------------------
def with_defaults(model, opt):
    def step(x, y, model=model, opt=opt):
        return train(model, opt, x, y)

    return step


def with_keyword_only_defaults(model, opt):
    def step(x, y, *, model=model, opt=opt):
        return train(model, opt, x, y)

    return step


def with_positional_partial(model, opt):
    return functools.partial(train, model, opt)


def with_keyword_partial(model, opt):
    def step(x, y, model, opt):
        return train(model, opt, x, y)

    return functools.partial(step, model=model, opt=opt)


class Trainer:
    """A model and its optimizer held by an object: its method, or the object itself."""

    def __init__(self, model, opt):
        self.model = model
        self.opt = opt

    def step(self, x, y):
        return train(self.model, self.opt, x, y)

    def __call__(self, x, y):
        return train(self.model, self.opt, x, y)


def with_bound_method(model, opt):
    return Trainer(model, opt).step


def with_callable_object(model, opt):
    return Trainer(model, opt)


class TrainingModule(nn.Module):
    """A module holding its own optimizer (`self.opt`), its method the step."""

    def __init__(self, body, opt):
        super().__init__()
        self.body = body
        self.opt = opt

    def forward(self, x):
        return self.body(x)

    def training_step(self, x, y):
        return train(self, self.opt, x, y)


def with_optimizer_held_by_the_module(model, opt):
    return TrainingModule(model, opt).training_step


def with_closure_over_dicts(model, opt):
    models, opts = {"net": model}, {"net": opt}

    def step(x, y):
        return train(models["net"], opts["net"], x, y)

    return step


REACHES = {f.__name__.removeprefix("with_"): f for f in (
    with_defaults, with_keyword_only_defaults, with_positional_partial, with_keyword_partial,
    with_bound_method, with_callable_object, with_optimizer_held_by_the_module,
    with_closure_over_dicts)}


# ---- checks ----------------------------------------------------------------------------------
def abstract_tensors_left(model, opt) -> list[str]:
    """Where an abstract tensor (no data) sits in the state a step leaves: module attributes,
    parameters, buffers, `.grad`s, optimizer state and hyperparameters."""
    found = []

    def check(where: str, value) -> None:
        if isinstance(value, Tensor):
            if value.is_abstract:
                found.append(where)
            if value._grad is not None and value._grad.is_abstract:
                found.append(f"{where}.grad")

    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            check(f"{name or 'model'}.{attr}", value)
        for pname, t in list(module.named_parameters(recurse=False)) + list(
                module.named_buffers(recurse=False)):
            check(f"{name or 'model'}.{pname}", t)
    names = {id(p): n for n, p in model.named_parameters()}
    for p, state in opt.state.items():
        for key, value in state.items():
            check(f"opt.state[{names.get(id(p), '?')}][{key!r}]", value)
    for g, group in enumerate(opt.param_groups):
        for key, value in group.items():
            if key != "params":
                check(f"opt.param_groups[{g}][{key!r}]", value)
    return found


def state_of(model, opt) -> dict[str, np.ndarray | None]:
    """Every parameter, `.grad` and optimizer state value, by name."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, np.ndarray | None] = {}
    for name, p in model.named_parameters():
        out[name] = p.detach().numpy()
        out[f"{name}.grad"] = None if p.grad is None else p.grad.numpy()
    for p, state in opt.state.items():
        for key, value in state.items():
            array = value.detach().numpy() if isinstance(value, Tensor) else value
            out[f"{names[id(p)]}.{key}"] = np.asarray(array)
    return out


def assert_same_state(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if value is None or got[key] is None:
            assert value is None and got[key] is None, f"{key}: one side has no .grad"
            continue
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=1e-7, err_msg=key)


def run_both(reach: str, opt_name: str, backend: str, rng):
    """CALLS eager calls and CALLS compiled calls of the same step from the same start; checks
    every loss, the state after every call, and that no abstract tensor is left. Returns the
    compiled step and the stderr of its calls."""
    graphc.manual_seed(0)
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt = OPTIMIZERS[opt_name](eager_model.parameters())
    opt = OPTIMIZERS[opt_name](model.parameters())
    eager = REACHES[reach](eager_model, eager_opt)
    compiled = graphc.compile(REACHES[reach](model, opt), backend=backend)
    log = io.StringIO()
    for call in range(CALLS):
        x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 4, 6))
        want = eager(x, y)
        with contextlib.redirect_stderr(log):
            got = compiled(x, y)
        assert abstract_tensors_left(model, opt) == [], f"after compiled call {call + 1}"
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL,
                                   err_msg=f"loss of call {call + 1}")
        assert_same_state(state_of(model, opt), state_of(eager_model, eager_opt))
    return compiled, log.getvalue()


# ---- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["interp", "cpu"])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_a_step_with_model_and_optimizer_as_default_arguments_matches_eager(
        opt_name, backend, rng, monkeypatch):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    compiled, log = run_both("defaults", opt_name, backend, rng)
    # the optimizer state is guarded: the interpreter traces the first step and the steady
    # one; a compiling backend makes the state ahead and traces once
    assert len(compiled.graphs) == (2 if backend == "interp" else 1)
    # every retrace is logged, with its reasons
    assert log.count("graphc: recompiling step:") == len(compiled.recompile_reasons) \
        == len(compiled.graphs) - 1
    # the parameters and optimizer state are captured inputs named after the defaults
    names = {v.name for v in compiled.graph.inputs}
    assert "model.0.weight" in names
    key = "momentum_buffer" if opt_name == "sgd_momentum" else "exp_avg"
    assert f"model.0.weight.{key}" in names


@pytest.mark.parametrize("reach", sorted(REACHES))
@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_every_way_of_reaching_the_state_matches_eager(reach, backend, rng):
    run_both(reach, "sgd_momentum", backend, rng)


def test_replacing_a_default_argument_retraces(rng):
    """The defaults are guarded: a step whose default optimizer is swapped for another one
    traces again and updates with the new one."""
    graphc.manual_seed(0)
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = with_defaults(model, opt)
    compiled = graphc.compile(step, backend="interp")
    x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 4, 6))
    compiled(x, y)
    compiled(x, y)
    traced = len(compiled.graphs)
    other = optim.SGD(model.parameters(), lr=0.0)  # no update at all
    step.__defaults__ = (model, other)
    before = model[0].weight.detach().numpy().copy()
    compiled(x, y)
    assert len(compiled.graphs) == traced + 1
    assert "captured opt.param_groups[0]['lr']: 0.05 -> 0.0" in compiled.recompile_reasons[-1]
    np.testing.assert_array_equal(model[0].weight.detach().numpy(), before)


def test_a_keyword_only_default_changed_in_place_retraces(rng):
    """`__kwdefaults__` is a dict: changing an entry in place is a new signature too."""
    graphc.manual_seed(0)
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = with_keyword_only_defaults(model, opt)
    compiled = graphc.compile(step, backend="interp")
    x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 4, 6))
    compiled(x, y)
    compiled(x, y)
    step.__kwdefaults__["opt"] = optim.SGD(model.parameters(), lr=0.0)
    before = model[0].weight.detach().numpy().copy()
    compiled(x, y)
    np.testing.assert_array_equal(model[0].weight.detach().numpy(), before)


def test_a_compiled_helper_called_by_a_compiled_step_reaches_its_state(rng):
    """A compiled callable runs its function inline inside another trace, so the outer step
    reaches what the helper's function reaches (here: its default arguments)."""
    graphc.manual_seed(0)
    eager_model = mlp()
    model = copy.deepcopy(eager_model)
    eager_opt = OPTIMIZERS["sgd_momentum"](eager_model.parameters())
    opt = OPTIMIZERS["sgd_momentum"](model.parameters())
    eager = with_defaults(eager_model, eager_opt)
    helper = graphc.compile(with_defaults(model, opt), backend="interp")

    def outer(x, y):
        return helper(x, y) * 2

    compiled = graphc.compile(outer, backend="interp")
    for call in range(CALLS):
        x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 4, 6))
        want = eager(x, y) * 2
        got = compiled(x, y)
        assert abstract_tensors_left(model, opt) == [], f"after compiled call {call + 1}"
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL,
                                   err_msg=f"loss of call {call + 1}")
        assert_same_state(state_of(model, opt), state_of(eager_model, eager_opt))
    assert "helper.model.0.weight.momentum_buffer" in {v.name for v in compiled.graph.inputs}


def test_every_trace_of_an_accumulating_step_is_logged(rng, monkeypatch, capsys):
    """A step that never zeroes its `.grad`s reads the ones from before the call: the first
    trace (with stand-in `.grad`s) is redone without them, and the log says so, as it says
    why the first call then warms up on the interpreter."""
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    graphc.manual_seed(0)
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x, y, model=model, opt=opt):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = graphc.compile(step, backend="cpu")
    x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 4, 6))
    for _ in range(3):
        compiled(x, y)
    err = capsys.readouterr().err
    assert "step: traced again without stand-in .grads" in err, err
    assert "step: the first call runs on the interpreter" in err, err
    assert err.count("graphc: recompiling step:") == len(compiled.recompile_reasons)
    assert abstract_tensors_left(model, opt) == []


def test_an_optimizer_the_call_cannot_reach_is_refused_and_left_as_it_was(rng):
    """An optimizer held where the walk does not look (a class attribute, a Python module, an
    object three levels down) would go unguarded, and the state its first step makes would
    stay abstract: the trace is refused, saying where to hold it, and the optimizer keeps no
    state from the trace."""
    graphc.manual_seed(0)
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    class Holder:
        pass

    Holder.model, Holder.opt = model, opt

    def step(x, y):
        return train(Holder.model, Holder.opt, x, y)

    x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
    y = graphc.tensor(rng.integers(0, 4, 6))
    before = model[0].weight.detach().numpy().copy()
    for backend in ("interp", "cpu"):
        with pytest.raises(graphc.errors.TraceError, match=r"`step` steps an optimizer \(SGD\) "
                           r"that graphc cannot reach.*def step\(x, y, opt=opt\)"):
            graphc.compile(step, backend=backend)(x, y)
        assert len(opt.state) == 0
        assert all(p.grad is None for p in model.parameters())
        np.testing.assert_array_equal(model[0].weight.detach().numpy(), before)
    with pytest.raises(graphc.errors.TraceError, match="cannot reach"):
        graphc.trace(step, x, y)


def test_an_optimizer_made_inside_the_step_is_not_refused(rng):
    """An optimizer the step makes afresh at every call is its own business: no state of it
    outlives the call, so nothing needs guarding."""
    graphc.manual_seed(0)
    eager_model = mlp()
    model = copy.deepcopy(eager_model)

    def make(model):
        def step(x, y):
            return train(model, optim.SGD(model.parameters(), lr=0.05, momentum=0.9), x, y)

        return step

    eager, compiled = make(eager_model), graphc.compile(make(model), backend="interp")
    for call in range(CALLS):
        x = graphc.tensor(rng.standard_normal((6, 8)).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 4, 6))
        np.testing.assert_allclose(compiled(x, y).numpy(), eager(x, y).numpy(), rtol=RTOL,
                                   err_msg=f"loss of call {call + 1}")
        np.testing.assert_allclose(model[0].weight.detach().numpy(),
                                   eager_model[0].weight.detach().numpy(), rtol=RTOL, atol=1e-7)
