"""The bad-input catalogue, part 3: non-finite values under GRAPHC_CHECK_NANS (compiled
calls, training steps, a compiled forward with a grad_fn), bad optimizer arguments and
broken training steps, and indices out of range inside compiled graphs.

Each case asserts the error class, that the message names what failed (with the user's source
line, found by the `# LINE:<name>` markers in this file), what was expected and what came, and
that nothing was corrupted: parameters, buffers, optimizer state, `.grad`s and generators as
they were, the compiled callable still usable and correct. See `tests/test_bad_inputs.py` for
the whole catalogue and `tests/bad_inputs_support.py` for the shared helpers.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.errors import ArgumentError, AutogradError, GraphcError, IndexOutOfRangeError
from graphc.jit.nan_check import NonFiniteError
from tests.bad_inputs_support import (  # noqa: F401 (module_object_cache: an autouse fixture)
    assert_unchanged,
    close,
    marker_lookup,
    module_object_cache,
    snapshot,
    t,
)

line = marker_lookup(__file__)


# ---- GRAPHC_CHECK_NANS ------------------------------------------------------------------------
def _log_shifted(x):
    y = x * 2.0
    return (y - 1.0).log().sum()  # LINE:log


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_check_nans_names_the_first_node_its_ir_line_and_source_line(monkeypatch, backend):
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    f = graphc.compile(_log_shifted, backend=backend)
    good, bad = graphc.tensor([2.0, 3.0]), graphc.tensor([2.0, 0.25])
    close(f(good), _log_shifted(good))
    with pytest.raises(NonFiniteError) as err:
        f(bad)
    message = str(err.value)
    assert message.startswith("graphc.compile(_log_shifted): GRAPHC_CHECK_NANS=1: output 0 "
                              "(f32[]) holds 1 NaN of 1 element(s)")
    assert "expected finite values" in message
    assert f"op 'log' at {line('log')}, IR line" in message
    node = err.value.node
    assert node.op == "log" and err.value.loc == line("log")
    assert str(node) in message  # the IR line itself
    traced_text = str(f.graphs[0]).splitlines()
    ir_line = int(message.split("IR line ")[1].split(";")[0])
    assert traced_text[ir_line - 1].strip() == str(node).strip()
    assert "its inputs were finite" in message and "unset GRAPHC_CHECK_NANS" in message
    close(f(good), _log_shifted(good))  # still usable
    assert len(f.graphs) == 1


def test_check_nans_is_off_by_default(monkeypatch):
    monkeypatch.delenv("GRAPHC_CHECK_NANS", raising=False)
    f = graphc.compile(_log_shifted, backend="interp")
    f(graphc.tensor([2.0, 3.0]))
    assert np.isnan(f(graphc.tensor([2.0, 0.25])).item())


def test_check_nans_names_the_inf_origin_and_the_later_nan(monkeypatch):
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")

    def f(x):
        big = x.exp()  # LINE:overflow
        return big - big  # LINE:nan

    with pytest.raises(NonFiniteError) as err:
        graphc.compile(f, backend="interp")(graphc.tensor([1.0, 100.0]))
    message = str(err.value)
    assert f"op 'exp' at {line('overflow')}" in message and "1 Inf of 2 element(s)" in message
    assert f"The first NaN appears later, at op 'sub' at {line('nan')}" in message
    assert "its inputs: %" in message  # the sub's inputs already held the Inf


def _regression_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()  # LINE:loss
        loss.backward()
        opt.step()
        return loss.detach()
    return step


@pytest.mark.parametrize("backend, calls_before", [("interp", 0), ("interp", 3), ("cpu", 3)],
                         ids=["interp-first-call", "interp-compiled", "cpu-compiled"])
def test_check_nans_in_a_training_step_leaves_parameters_and_state_untouched(
        rng, monkeypatch, backend, calls_before):
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = graphc.compile(_regression_step(model, opt), backend=backend)
    x, y = t(rng, 6, 4), t(rng, 6, 1)
    for _ in range(calls_before):
        step(x, y)
    before = snapshot(model, opt)
    state_keys = [sorted(s) for s in opt.state.values()]
    with pytest.raises(NonFiniteError) as err:
        step(x, graphc.full((6, 1), 1e30))  # (out - 1e30)**2 overflows float32
    assert f"op 'pow' at {line('loss')}" in str(err.value)
    assert_unchanged(before, model, opt)
    assert [sorted(s) for s in opt.state.values()] == state_keys
    # the same steps on an eager twin agree: the failed call left nothing behind
    twin = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    twin.load_state_dict(model.state_dict())
    twin_opt = graphc.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    twin_opt.load_state_dict(opt.state_dict())
    twin_step = _regression_step(twin, twin_opt)
    for _ in range(2):
        close(step(x, y), twin_step(x, y))
    for p, q in zip(model.parameters(), twin.parameters()):
        close(p, q)


def test_check_nans_rewinds_the_generator_a_failing_call_advanced(monkeypatch):
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    gen = graphc.Generator().manual_seed(7)
    f = graphc.compile(lambda x: (graphc.rand(3, generator=gen) * x).log(), backend="interp")
    f(graphc.ones(3))
    state = gen.get_state()._data.copy()
    with pytest.raises(NonFiniteError, match="op 'log'"):
        f(-graphc.ones(3))
    np.testing.assert_array_equal(gen.get_state()._data, state)




def test_check_nans_on_a_compiled_forward_that_carries_a_grad_fn(rng, monkeypatch):
    monkeypatch.setenv("GRAPHC_CHECK_NANS", "1")
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))  # normalised: |z| < 3
    shift = graphc.tensor(10.0)

    def forward(x):
        return (model(x) + shift).log()  # LINE:shifted-log

    f = graphc.compile(forward, backend="interp")
    x = t(rng, 5, 3).requires_grad_()
    f(x)
    f(x).sum().backward()  # the compiled forward and backward work
    x.grad = None
    before = snapshot(model)
    shift.fill_(-10.0)
    with pytest.raises(NonFiniteError) as err:
        f(x)
    assert f"op 'log' at {line('shifted-log')}" in str(err.value)
    assert_unchanged(before, model)  # BatchNorm's running stats were not written
    assert x.grad is None
    shift.fill_(10.0)
    f(x).sum().backward()
    assert np.isfinite(x.grad._data).all()


# ---- optimizers and training steps ------------------------------------------------------------
@pytest.mark.parametrize("make, error, expected", [
    (lambda ps: graphc.optim.SGD(ps, lr=-1.0), ValueError, "Invalid learning rate: -1.0"),
    (lambda ps: graphc.optim.SGD(ps, lr=0.1, momentum=-0.5), ValueError,
     "Invalid momentum value: -0.5"),
    (lambda ps: graphc.optim.SGD(ps, lr=0.1, weight_decay=-1), ValueError,
     "Invalid weight_decay value: -1"),
    (lambda ps: graphc.optim.SGD(ps, lr=0.1, nesterov=True), ValueError,
     "Nesterov momentum requires a momentum and zero dampening"),
    (lambda ps: graphc.optim.Adam(ps, betas=(1.5, 0.9)), ValueError,
     "Invalid beta parameter at index 0: 1.5"),
    (lambda ps: graphc.optim.Adam(ps, eps=-1e-8), ValueError, "Invalid epsilon value: -1e-08"),
    (lambda ps: graphc.optim.SGD([], lr=0.1), ValueError,
     "optimizer got an empty parameter list"),
    (lambda ps: graphc.optim.SGD(ps[0], lr=0.1), TypeError,
     "should be an iterable of Tensors or dicts, but got graphc.FloatTensor"),
    (lambda ps: graphc.optim.SGD([ps[0] * 2], lr=0.1), ValueError,
     "can't optimize a non-leaf Tensor"),
], ids=["sgd-lr", "sgd-momentum", "sgd-weight-decay", "sgd-nesterov", "adam-betas", "adam-eps",
        "empty", "a-tensor", "non-leaf"])
def test_bad_optimizer_arguments_use_pytorchs_words(make, error, expected):
    model = nn.Linear(3, 2)
    before = snapshot(model)
    with pytest.raises(error) as err:
        make(list(model.parameters()))
    assert expected in str(err.value)
    assert_unchanged(before, model)


def test_bad_optimizer_arguments_are_argument_errors_naming_the_optimizer():
    with pytest.raises(ArgumentError, match="SGD.*lr.*>= 0"):
        graphc.optim.SGD(nn.Linear(3, 2).parameters(), lr=-1.0)


def _non_scalar_step(model, opt):
    def step(x):
        opt.zero_grad()
        out = model(x)  # a (4, 2) "loss"
        out.backward()
        opt.step()
        return out.detach()
    return step


def test_a_training_step_whose_loss_is_not_a_scalar(rng):
    model = nn.Linear(3, 2)
    opt = graphc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = snapshot(model, opt)
    step = graphc.compile(_non_scalar_step(model, opt), backend="interp")
    with pytest.raises(AutogradError, match="grad can be implicitly created only for scalar"):
        step(t(rng, 4, 3))
    assert_unchanged(before, model, opt)
    assert step._entries == []


def test_a_non_scalar_loss_message_names_the_shape_and_what_to_do(rng):
    model = nn.Linear(3, 2)
    opt = graphc.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(AutogradError, match=r"\[4, 2\].*(mean|sum)"):
        graphc.compile(_non_scalar_step(model, opt), backend="interp")(t(rng, 4, 3))


def test_a_step_returning_a_loss_with_history_after_backward_is_refused_and_undone(rng):
    model = nn.Linear(3, 1)
    opt = graphc.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, opt)

    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward(retain_graph=True)
        opt.step()
        return loss  # not detached: it would need a grad_fn

    with pytest.raises(GraphcError) as err:
        graphc.compile(step, backend="interp")(t(rng, 4, 3))
    message = str(err.value)
    assert "graphc.compile(step): output requires grad" in message
    assert "return loss.detach()" in message
    assert_unchanged(before, model, opt)  # the refused call's optimizer step was undone


# ---- indices out of range inside compiled graphs ----------------------------------------------
def _nll(logits, target):
    return F.nll_loss(logits.log_softmax(-1), target)  # LINE:nll


def _gather(x, index):
    return graphc.gather(x, 1, index)  # LINE:gather


def _names_the_traced_line(message: str, traced_line: str, backend: str) -> None:
    """The error of a compiled run names the line the op was traced from, on every backend."""
    assert traced_line in message


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_an_nll_target_out_of_range_in_a_compiled_graph(rng, backend):
    f = graphc.compile(_nll, backend=backend)
    logits, good = t(rng, 4, 5), graphc.tensor([0, 1, 2, 3])
    f(logits, good)
    with pytest.raises(IndexOutOfRangeError) as err:
        f(logits, graphc.tensor([0, 1, 7, 3]))
    message = str(err.value)
    assert "nll_loss" in message
    assert "Target 7 is out of bounds" in message or "out of bounds (classes 0...4)" in message
    close(f(logits, good), _nll(logits, good))
    _names_the_traced_line(message, line("nll"), backend)


@pytest.mark.parametrize("backend", ["interp", "cpu"])
@pytest.mark.parametrize("bad", [9, -1])
def test_a_gather_index_out_of_range_in_a_compiled_graph(rng, backend, bad):
    f = graphc.compile(_gather, backend=backend)
    x, good = t(rng, 4, 5), graphc.tensor([[0], [1], [2], [3]])
    f(x, good)
    with pytest.raises(IndexOutOfRangeError) as err:
        f(x, graphc.tensor([[0], [1], [bad], [3]]))
    message = str(err.value)
    assert "gather" in message
    if backend == "interp":  # the reference says which index and what size
        assert f"index {bad} is out of bounds for dimension 1 with size 5" in message
    close(f(x, good), _gather(x, good))
    _names_the_traced_line(message, line("gather"), backend)


def test_an_embedding_index_out_of_range_in_a_compiled_model(rng):
    model = nn.Embedding(5, 3)
    compiled = graphc.compile(model, backend="interp")
    good = graphc.tensor([0, 4])
    before = snapshot(model)
    with graphc.no_grad():
        compiled(good)
        with pytest.raises(IndexOutOfRangeError, match="embedding at .*index out of range"):
            compiled(graphc.tensor([0, 9]))
        close(compiled(good), model(good))
    assert_unchanged(before, model)
