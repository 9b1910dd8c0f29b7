"""The first call of a compiled training step runs compiled, from one trace (issue 13).

Where an optimizer's first step is its steady update applied to zero-initialised state
(graphc.optim's `initial_state`), graphc.compile makes that state before the trace
(graphc.jit.first_step): the first call traces once, compiles once, never runs the
interpreter, and leaves the same parameters, state and state_dict as eager graphc and as
PyTorch. Everything else (SGD with dampening, a custom optimizer, gradients accumulated
across calls) keeps the interpreter warm-up, with the same results.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.optim as optim
from graphc.backends.interp import InterpExecutable
from graphc.jit import retrace
from tests.conftest import torch_or_skip

STEPS = 3
# name -> (graphc/torch class name, keyword arguments): every optimizer whose first step is
# exact, in the configurations that change what state it makes
EXACT = {
    "sgd_momentum": ("SGD", dict(lr=0.1, momentum=0.9)),
    "sgd_nesterov_decay": ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)),
    "adam": ("Adam", dict(lr=0.05)),
    "adam_amsgrad": ("Adam", dict(lr=0.05, amsgrad=True, weight_decay=0.1)),
    "adamw": ("AdamW", dict(lr=0.05, weight_decay=0.2)),
    "rmsprop": ("RMSprop", dict(lr=0.01)),
    "rmsprop_centered_momentum": ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5)),
    "adagrad": ("Adagrad", dict(lr=0.1, initial_accumulator_value=0.3, lr_decay=0.01)),
}
RTOL, ATOL = 2e-5, 1e-6


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32),
            "unused": rng.standard_normal(2).astype(np.float32),
            "x": rng.standard_normal((5, 4)).astype(np.float32),
            "t": rng.standard_normal((5, 3)).astype(np.float32)}


def _graphc_setup(opt_name: str, kwargs: dict, zero_grad: str = "start", make_opt=None):
    """Parameters w, b (used), `unused` (requires grad, no gradient: PyTorch makes no state
    for it), its optimizer and the step; `zero_grad`: "start", "end" or "never"."""
    a = _arrays()
    params = [graphc.tensor(a[k], requires_grad=True) for k in ("w", "b", "unused")]
    opt = make_opt(params) if make_opt else getattr(optim, opt_name)(params, **kwargs)
    w, b = params[0], params[1]

    def step(x, t):
        if zero_grad == "start":
            opt.zero_grad()
        loss = ((x @ w + b).tanh() * t).sum()
        loss.backward()
        opt.step()
        if zero_grad == "end":
            opt.zero_grad()
        return loss.detach()

    return params, opt, step, (graphc.tensor(a["x"]), graphc.tensor(a["t"]))


def _torch_run(opt_name: str, kwargs: dict, zero_grad: str = "start"):
    torch = torch_or_skip()
    a = _arrays()
    params = [torch.tensor(a[k], requires_grad=True) for k in ("w", "b", "unused")]
    opt = getattr(torch.optim, opt_name)(params, **kwargs)
    x, t = torch.tensor(a["x"]), torch.tensor(a["t"])
    for _ in range(STEPS):
        if zero_grad == "start":
            opt.zero_grad()
        ((x @ params[0] + params[1]).tanh() * t).sum().backward()
        opt.step()
        if zero_grad == "end":
            opt.zero_grad()
    return [p.detach().numpy() for p in params], opt.state_dict()


class _Counts:
    """How often the compiled callable traced and the interpreter ran a graph."""

    def __init__(self, monkeypatch) -> None:
        self.traces = self.interpreted = 0
        trace_call, run = retrace.trace_call, InterpExecutable.run

        def counting_trace(*args, **kwargs):
            self.traces += 1
            return trace_call(*args, **kwargs)

        def counting_run(executable, *arrays):
            self.interpreted += 1
            return run(executable, *arrays)

        monkeypatch.setattr(retrace, "trace_call", counting_trace)
        monkeypatch.setattr(InterpExecutable, "run", counting_run)


def _values(state_dict) -> dict:
    """{(param index, key): array} of a state_dict, graphc's or torch's."""
    out = {}
    for index, entries in state_dict["state"].items():
        for key, value in entries.items():
            out[(index, key)] = np.asarray(value.detach().numpy() if hasattr(value, "detach")
                                           else value)
    return out


def _assert_same_state(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=str(key))
        if key[1] == "step":
            assert float(got[key]) == float(want[key]) in (0.0, STEPS)


@pytest.mark.parametrize("name", sorted(EXACT))
def test_the_first_call_runs_compiled_from_one_trace(name, monkeypatch):
    opt_name, kwargs = EXACT[name]
    counts = _Counts(monkeypatch)
    params, opt, step, args = _graphc_setup(opt_name, kwargs)
    compiled = graphc.compile(step, backend="cpu")
    compiled(*args)
    assert (counts.traces, counts.interpreted) == (1, 0)
    # no state for the parameter without a gradient (Adagrad makes it at construction)
    assert sorted(opt.state_dict()["state"]) == ([0, 1, 2] if opt_name == "Adagrad" else [0, 1])
    for _ in range(STEPS - 1):
        compiled(*args)
    assert (counts.traces, counts.interpreted) == (1, 0)
    assert len(compiled.graphs) == 1 and compiled.recompile_reasons == []

    eager_params, eager_opt, eager_step, eager_args = _graphc_setup(opt_name, kwargs)
    for _ in range(STEPS):
        eager_step(*eager_args)
    torch_params, torch_state = _torch_run(opt_name, kwargs)
    for p, e, t in zip(params, eager_params, torch_params):
        np.testing.assert_allclose(p.detach().numpy(), e.detach().numpy(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(p.detach().numpy(), t, rtol=RTOL, atol=ATOL)
    assert params[2].grad is None
    state = _values(opt.state_dict())
    _assert_same_state(state, _values(eager_opt.state_dict()))
    _assert_same_state(state, _values(torch_state))


@pytest.mark.parametrize("zero_grad", ["end", "never"])
def test_steps_that_read_the_grads_from_before_the_call_match_torch(zero_grad, monkeypatch):
    """zero_grad at the end (the .grads are None at every call: traced again without the
    stand-ins, still no interpreter) and never (gradients accumulate: the interpreter
    warm-up, one compile)."""
    counts = _Counts(monkeypatch)
    params, opt, step, args = _graphc_setup("Adam", dict(lr=0.05), zero_grad)
    compiled = graphc.compile(step, backend="cpu")
    for _ in range(STEPS):
        compiled(*args)
    assert len(compiled.graphs) == 1 and compiled.recompile_reasons == []
    assert counts.interpreted == (0 if zero_grad == "end" else 1)
    torch_params, torch_state = _torch_run("Adam", dict(lr=0.05), zero_grad)
    for p, t in zip(params, torch_params):
        np.testing.assert_allclose(p.detach().numpy(), t, rtol=RTOL, atol=ATOL)
    _assert_same_state(_values(opt.state_dict()), _values(torch_state))


def test_sgd_with_dampening_keeps_the_interpreter_warm_up(monkeypatch, capsys):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    counts = _Counts(monkeypatch)
    kwargs = dict(lr=0.1, momentum=0.9, dampening=0.3)
    params, opt, step, args = _graphc_setup("SGD", kwargs)
    compiled = graphc.compile(step, backend="cpu")
    for _ in range(STEPS):
        compiled(*args)
    assert counts.interpreted == 1 and len(compiled.graphs) == 1
    assert "SGD: its first step is not its steady update" in capsys.readouterr().err
    torch_params, torch_state = _torch_run("SGD", kwargs)
    for p, t in zip(params, torch_params):
        np.testing.assert_allclose(p.detach().numpy(), t, rtol=RTOL, atol=ATOL)
    _assert_same_state(_values(opt.state_dict()), _values(torch_state))


def test_the_log_is_quiet_when_nothing_traces_again(monkeypatch, capsys):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    _, _, step, args = _graphc_setup("Adam", dict(lr=0.05))
    compiled = graphc.compile(step, backend="cpu")
    for _ in range(STEPS):
        compiled(*args)
    assert capsys.readouterr().err == ""


class _OwnUpdate(optim.SGD):
    """A custom optimizer: SGD's update replaced, its first step unknown to graphc."""

    def _update_group(self, group, params, grads):
        for p, g in zip(params, grads):
            state = self.state[p]
            if "velocity" not in state:
                state["velocity"] = g * 0.5  # not zero: no steady update from zero state
            else:
                state["velocity"].mul_(0.5).add_(g)
            p.add_(state["velocity"], alpha=-group["lr"])


def test_a_custom_optimizer_keeps_the_interpreter_warm_up(monkeypatch):
    counts = _Counts(monkeypatch)
    params, opt, step, args = _graphc_setup("", {}, make_opt=lambda p: _OwnUpdate(p, lr=0.1))
    compiled = graphc.compile(step, backend="cpu")
    for _ in range(STEPS):
        compiled(*args)
    assert counts.interpreted == 1 and len(compiled.graphs) == 1
    eager_params, _, eager_step, eager_args = _graphc_setup(
        "", {}, make_opt=lambda p: _OwnUpdate(p, lr=0.1))
    for _ in range(STEPS):
        eager_step(*eager_args)
    for p, e in zip(params, eager_params):
        np.testing.assert_allclose(p.detach().numpy(), e.detach().numpy(), rtol=RTOL, atol=ATOL)


def test_a_first_call_that_fails_leaves_no_state(monkeypatch):
    """The state made ahead goes again when the call is refused: a trace that raises, and a
    compiled run refused by GRAPHC_CHECK_NANS."""
    params, opt, step, args = _graphc_setup("Adam", dict(lr=0.05))

    def failing(x, t):
        step(x, t)
        raise ValueError("the step failed")

    with pytest.raises(ValueError, match="the step failed"):
        graphc.compile(failing, backend="cpu")(*args)
    assert len(opt.state) == 0 and all(p.grad is None for p in params)

    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    before = [p.detach().numpy().copy() for p in params]
    bad = (graphc.tensor(np.full((5, 4), np.nan, np.float32)), args[1])
    with pytest.raises(graphc.errors.GraphcError, match="NaN"):
        graphc.compile(step, backend="cpu")(*bad)
    assert len(opt.state) == 0 and all(p.grad is None for p in params)
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.detach().numpy(), b)


def test_a_parameter_group_added_later_traces_once_more_without_the_interpreter(monkeypatch):
    counts = _Counts(monkeypatch)
    params, opt, step, args = _graphc_setup("Adagrad", dict(lr=0.1))
    compiled = graphc.compile(step, backend="cpu")
    compiled(*args)
    extra = graphc.tensor(np.ones(3, np.float32), requires_grad=True)
    opt.add_param_group({"params": [extra], "lr": 0.5})

    def step_with_extra(x, t):  # the same optimizer, its new parameter in the loss
        opt.zero_grad()
        loss = ((x @ params[0] + params[1] + extra).tanh() * t).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    compiled_extra = graphc.compile(step_with_extra, backend="cpu")
    for _ in range(2):
        compiled_extra(*args)
    assert counts.interpreted == 0 and counts.traces == 2
    state = opt.state_dict()["state"]
    assert float(state[3]["step"]) == 2.0  # the new parameter's state, from its first step
    assert float(state[2]["step"]) == 0.0  # made at construction, never had a gradient


def test_adagrad_makes_state_for_a_parameter_added_later_as_torch():
    torch = torch_or_skip()
    a = _arrays()
    g = [graphc.tensor(a["b"], requires_grad=True), graphc.tensor(a["unused"], requires_grad=True)]
    t = [torch.tensor(a["b"], requires_grad=True), torch.tensor(a["unused"], requires_grad=True)]
    g_opt = optim.Adagrad([g[0]], lr=0.1, initial_accumulator_value=0.2)
    t_opt = torch.optim.Adagrad([t[0]], lr=0.1, initial_accumulator_value=0.2)
    g_opt.add_param_group({"params": [g[1]], "initial_accumulator_value": 0.7})
    t_opt.add_param_group({"params": [t[1]], "initial_accumulator_value": 0.7})
    for _ in range(2):
        for p in g:
            p.grad = graphc.tensor(np.full(p.shape, 0.5, np.float32))
        for p in t:
            p.grad = torch.full(p.shape, 0.5)
        g_opt.step()
        t_opt.step()
    for gp, tp in zip(g, t):
        np.testing.assert_allclose(gp.detach().numpy(), tp.detach().numpy(), rtol=RTOL)
    got, want = _values(g_opt.state_dict()), _values(t_opt.state_dict())
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, err_msg=str(key))


def test_a_scheduled_learning_rate_keeps_one_graph(monkeypatch):
    counts = _Counts(monkeypatch)
    params, opt, step, args = _graphc_setup("Adam", dict(lr=0.05))
    scheduler = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    compiled = graphc.compile(step, backend="cpu")
    eager_params, eager_opt, eager_step, eager_args = _graphc_setup("Adam", dict(lr=0.05))
    eager_scheduler = optim.lr_scheduler.StepLR(eager_opt, step_size=1, gamma=0.5)
    for _ in range(STEPS):
        compiled(*args)
        scheduler.step()
        eager_step(*eager_args)
        eager_scheduler.step()
    assert counts.interpreted == 0 and len(compiled.graphs) == 1
    for p, e in zip(params, eager_params):
        np.testing.assert_allclose(p.detach().numpy(), e.detach().numpy(), rtol=RTOL, atol=ATOL)
