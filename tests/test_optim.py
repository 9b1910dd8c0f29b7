"""graphc.optim against torch.optim: trajectories, state, state_dict, errors, zero_grad, groups.

Trajectory tests isolate the optimizer: each step computes the gradients of a small
quadratic/linear loss in torch, copies them into the graphc parameters, steps both optimizers
and compares parameters and state. Both libraries then see identical gradients, so any
difference is the update's. float64 agrees to rounding; float32 to a few ulps (ATen fuses some
multiply-adds, numpy does not).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import graphc
from graphc.optim import SGD, Adam, AdamW, Optimizer
from tests.conftest import torch_or_skip

STEPS = 6
SHAPES = ((3, 4), (4,), ())  # a matrix, a vector and a 0-d parameter

SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.8, nesterov=True),
    dict(lr=0.1, weight_decay=0.2),
    dict(lr=0.1, maximize=True),
    dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True, maximize=True),
    dict(lr=0.05, momentum=0.5, dampening=0.5, weight_decay=0.01, maximize=True),
]
ADAM_CONFIGS = [
    dict(),
    dict(lr=0.05),
    dict(lr=0.05, weight_decay=0.1),
    dict(lr=0.05, amsgrad=True),
    dict(lr=0.05, maximize=True),
    dict(lr=0.05, betas=(0.3, 0.6), eps=1e-3),  # 1 - beta1 >= 0.5: lerp's second formula
    dict(lr=0.02, betas=(0.8, 0.99), weight_decay=0.05, amsgrad=True, maximize=True),
]
ADAMW_CONFIGS = [
    dict(),
    dict(lr=0.05, weight_decay=0.1),
    dict(lr=0.05, weight_decay=0.0),
    dict(lr=0.05, amsgrad=True, maximize=True),
    dict(lr=0.05, betas=(0.5, 0.9), weight_decay=0.3, eps=1e-6),
]
CASES = (
    [("SGD", c) for c in SGD_CONFIGS]
    + [("Adam", c) for c in ADAM_CONFIGS]
    + [("AdamW", c) for c in ADAMW_CONFIGS]
)
GRAPHC_CLASSES = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}
TOLERANCE = {np.float32: dict(rtol=2e-6, atol=1e-7), np.float64: dict(rtol=1e-13, atol=1e-15)}


def _case_id(case) -> str:
    name, cfg = case
    return name + "-" + ",".join(f"{k}={v}" for k, v in cfg.items())


# ---- helpers ---------------------------------------------------------------------------------
def _pairs(rng, dtype, shapes=SHAPES):
    """Parameters with the same initial values in both libraries."""
    torch = torch_or_skip()
    values = [rng.standard_normal(s).astype(dtype) for s in shapes]
    g_params = [graphc.tensor(v, requires_grad=True) for v in values]
    t_params = [torch.tensor(v, requires_grad=True) for v in values]
    return g_params, t_params


def _torch_grads(t_params, x, y):
    """Gradients of a quadratic loss with a linear model plus a quartic term on the scalar."""
    torch = torch_or_skip()
    w, b, s = t_params
    loss = ((x @ w + b - y) ** 2).mean() + 0.5 * s**4 + (w * w).sum() * 0.01
    return torch.autograd.grad(loss, t_params)


def _set_grads(g_params, t_params, rng, dtype, skip=()):
    """Compute torch's gradients at torch's parameters and give the same ones to both."""
    torch = torch_or_skip()
    x = torch.tensor(rng.standard_normal((5, 3)).astype(dtype))
    y = torch.tensor(rng.standard_normal((5, 4)).astype(dtype))
    grads = _torch_grads(t_params, x, y)
    for i, (gp, tp, g) in enumerate(zip(g_params, t_params, grads)):
        if i in skip:
            gp.grad, tp.grad = None, None
            continue
        tp.grad = g.detach().clone()
        gp.grad = graphc.tensor(g.detach().numpy().copy())


def _assert_close(g_tensor, t_tensor, dtype, what=""):
    actual = np.asarray(g_tensor.detach().numpy())
    expected = t_tensor.detach().numpy()
    np.testing.assert_allclose(actual, expected, err_msg=what, **TOLERANCE[dtype])


def _assert_state_matches(g_opt, t_opt, g_params, t_params, dtype):
    for i, (gp, tp) in enumerate(zip(g_params, t_params)):
        g_state, t_state = g_opt.state.get(gp, {}), t_opt.state.get(tp, {})
        assert set(g_state) == set(t_state), f"param {i}: state keys differ"
        for key, t_value in t_state.items():
            g_value = g_state[key]
            assert isinstance(g_value, graphc.Tensor), f"state {key} must be a graphc tensor"
            if key == "step":
                assert g_value.dtype is graphc.float32 and tuple(g_value.shape) == ()
                assert float(g_value.item()) == float(t_value.item())
            else:
                _assert_close(g_value, t_value, dtype, f"param {i} state {key}")


def _make(name, params, cfg):
    torch = torch_or_skip()
    return GRAPHC_CLASSES[name](params[0], **cfg), getattr(torch.optim, name)(params[1], **cfg)


# ---- trajectories ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_trajectory_matches_torch(case, dtype, rng):
    name, cfg = case
    g_params, t_params = _pairs(rng, dtype)
    g_opt, t_opt = _make(name, (g_params, t_params), cfg)
    for step in range(STEPS):
        # the scalar parameter sits out step 2: no gradient, no update, no state change
        _set_grads(g_params, t_params, rng, dtype, skip=(2,) if step == 2 else ())
        g_opt.step()
        t_opt.step()
        for i, (gp, tp) in enumerate(zip(g_params, t_params)):
            _assert_close(gp, tp, dtype, f"step {step}, param {i}")
    _assert_state_matches(g_opt, t_opt, g_params, t_params, dtype)
    for gp in g_params:
        assert gp.is_leaf and gp.requires_grad and gp.grad_fn is None


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_param_groups_with_different_options(name, rng):
    torch = torch_or_skip()
    dtype = np.float64
    g_params, t_params = _pairs(rng, dtype)
    extra = {"SGD": dict(momentum=0.9), "Adam": dict(amsgrad=True), "AdamW": dict()}[name]

    def groups(params):
        return [
            {"params": params[:2], "lr": 0.1, **extra},
            {"params": params[2:], "lr": 0.01, "weight_decay": 0.3},
        ]

    g_opt = GRAPHC_CLASSES[name](groups(g_params), lr=0.05)
    t_opt = getattr(torch.optim, name)(groups(t_params), lr=0.05)
    assert [g["lr"] for g in g_opt.param_groups] == [0.1, 0.01]
    for key in g_opt.defaults:
        assert g_opt.param_groups[1][key] == t_opt.param_groups[1][key], key
    for _step in range(4):
        _set_grads(g_params, t_params, rng, dtype)
        g_opt.step()
        t_opt.step()
    for i, (gp, tp) in enumerate(zip(g_params, t_params)):
        _assert_close(gp, tp, dtype, f"param {i}")
    _assert_state_matches(g_opt, t_opt, g_params, t_params, dtype)


def test_add_param_group_midway_matches_torch(rng):
    torch = torch_or_skip()
    dtype = np.float64
    g_params, t_params = _pairs(rng, dtype)
    g_opt = SGD(g_params[:1], lr=0.1, momentum=0.9)
    t_opt = torch.optim.SGD(t_params[:1], lr=0.1, momentum=0.9)
    for step in range(4):
        if step == 2:
            g_opt.add_param_group({"params": g_params[1:], "lr": 0.3})
            t_opt.add_param_group({"params": t_params[1:], "lr": 0.3})
        _set_grads(g_params, t_params, rng, dtype)
        g_opt.step()
        t_opt.step()
    for gp, tp in zip(g_params, t_params):
        _assert_close(gp, tp, dtype)
    assert g_opt.param_groups[1]["momentum"] == 0.9  # filled from the defaults
    assert len(g_opt.param_groups) == 2


def test_changing_lr_in_a_group_takes_effect(rng):
    torch_or_skip()
    dtype = np.float64
    g_params, t_params = _pairs(rng, dtype)
    g_opt, t_opt = _make("Adam", (g_params, t_params), dict(lr=0.1))
    for step in range(4):
        _set_grads(g_params, t_params, rng, dtype)
        for opt in (g_opt, t_opt):
            opt.param_groups[0]["lr"] = 0.1 / (step + 1)
        g_opt.step()
        t_opt.step()
    for gp, tp in zip(g_params, t_params):
        _assert_close(gp, tp, dtype)


def test_defaults_match_torch():
    torch = torch_or_skip()
    p = graphc.tensor([1.0], requires_grad=True)
    tp = torch.tensor([1.0], requires_grad=True)
    for name in ("SGD", "Adam", "AdamW"):
        ours = GRAPHC_CLASSES[name]([p]).defaults
        theirs = getattr(torch.optim, name)([tp]).defaults
        for key, value in ours.items():
            assert theirs[key] == value, (name, key)


# ---- the step's contract ---------------------------------------------------------------------
def test_step_returns_closure_loss_and_runs_it_with_grad_enabled():
    p = graphc.tensor([1.0, 2.0], requires_grad=True)
    opt = SGD([p], lr=0.5)
    seen = []

    def closure():
        seen.append(graphc.is_grad_enabled())
        p.grad = graphc.tensor([2.0, 4.0])
        return 7.5

    with graphc.no_grad():
        assert opt.step(closure) == 7.5
    assert seen == [True]
    np.testing.assert_array_equal(p.detach().numpy(), [0.0, 0.0])
    assert opt.step() is None


def test_step_runs_without_recording_history_and_keeps_grad_mode():
    p = graphc.tensor([1.0, 2.0], requires_grad=True)
    opt = Adam([p], lr=0.1)
    p.grad = graphc.tensor([1.0, -1.0])
    assert graphc.is_grad_enabled()
    opt.step()
    assert graphc.is_grad_enabled()
    assert p.is_leaf and p.grad_fn is None
    for value in opt.state[p].values():
        assert value.grad_fn is None and not value.requires_grad


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_updates_go_through_graphc_ops(name, monkeypatch):
    """Every write of the op-by-op update is an in-place graphc op (so a trace records it),
    none is a numpy write. (Eager mode's numpy update, foreach, is held to it bit for bit by
    tests/test_optim_foreach.py.)"""
    from graphc.ops import registry

    applied, written = [], []
    apply, apply_inplace = registry._dispatcher, registry._inplace_dispatcher

    def counting_apply(opdef, *inputs, **attrs):
        applied.append(opdef.name)
        return apply(opdef, *inputs, **attrs)

    def counting_inplace(target, op_name, compute, operands=None, op=None):
        written.append(id(target))
        return apply_inplace(target, op_name, compute, operands, op)

    params = [graphc.tensor([1.0, -2.0], requires_grad=True),
              graphc.tensor(0.5, requires_grad=True)]
    cfg = dict(lr=0.1, momentum=0.9) if name == "SGD" else dict(lr=0.1, amsgrad=True)
    opt = GRAPHC_CLASSES[name](params, foreach=False, **cfg)
    for step in range(2):
        for p in params:
            p.grad = graphc.tensor(np.full(p.shape, 0.25 + step, dtype=np.float32))
        before = [p.detach().numpy().copy() for p in params]
        versions = [p._version for p in params]
        state_before = {
            (i, k): (v.detach().numpy().copy(), v._version)
            for i, p in enumerate(params) for k, v in opt.state.get(p, {}).items()
        }
        monkeypatch.setattr(registry, "_dispatcher", counting_apply)
        monkeypatch.setattr(registry, "_inplace_dispatcher", counting_inplace)
        opt.step()
        monkeypatch.setattr(registry, "_dispatcher", apply)
        monkeypatch.setattr(registry, "_inplace_dispatcher", apply_inplace)
        assert applied, "the update must call graphc ops"
        for p, old, version in zip(params, before, versions):
            assert not np.array_equal(p.detach().numpy(), old)
            assert id(p) in written and p._version > version
        for (i, key), (old, version) in state_before.items():
            value = opt.state[params[i]][key]
            if not np.array_equal(value.detach().numpy(), old):
                assert id(value) in written and value._version > version, key


class _RecordingTracer:
    """A stand-in trace mode that records op names and in-place targets.

    While a tracer is installed, an update that needs a value (`.item()`, `bool(tensor)`,
    numpy) fails with graphc's TraceError, as in a real trace.
    """

    def __init__(self) -> None:
        self.ops, self.targets = [], []

    def record(self, opdef, inputs, attrs, outputs):
        self.ops.append(opdef.name)

    def rebind(self, target, result):
        self.targets.append(id(target))

    def before_write(self, target):
        pass


@pytest.mark.parametrize("name, cfg", [
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("Adam", dict(lr=0.1, amsgrad=True, weight_decay=0.1, maximize=True)),
    ("AdamW", dict(lr=0.1)),
])
def test_step_records_as_graph_ops_under_a_trace(name, cfg):
    """The whole update (first step and later steps) runs without reading a tensor's value."""
    from graphc.dispatch import set_tracer

    params = _two_params()
    opt = GRAPHC_CLASSES[name](params, **cfg)
    for _step in range(2):
        for p in params:
            p.grad = graphc.ones_like(p)
        tracer = _RecordingTracer()
        previous = set_tracer(tracer)
        try:
            opt.step()
        finally:
            set_tracer(previous)
        assert all(id(p) in tracer.targets for p in params), "each parameter is written in place"
        if name != "SGD":  # the step counter and the bias corrections are graph ops too
            assert all(id(opt.state[p]["step"]) in tracer.targets for p in params)
            assert "pow" in tracer.ops and "sqrt" in tracer.ops


# ---- no half-updates -------------------------------------------------------------------------
def _snapshot(opt, params):
    values = [p.detach().numpy().copy() for p in params]
    state = {
        (i, k): v.detach().numpy().copy()
        for i, p in enumerate(params) for k, v in opt.state.get(p, {}).items()
    }
    return values, state


def _assert_unchanged(opt, params, snapshot):
    values, state = snapshot
    for p, old in zip(params, values):
        np.testing.assert_array_equal(p.detach().numpy(), old)
    now = {
        (i, k): v.detach().numpy()
        for i, p in enumerate(params) for k, v in opt.state.get(p, {}).items()
    }
    assert set(now) == set(state)
    for key, old in state.items():
        np.testing.assert_array_equal(now[key], old)


def _two_params():
    return [graphc.tensor([1.0, 2.0, 3.0], requires_grad=True),
            graphc.tensor([[1.0, -1.0], [0.5, 2.0]], requires_grad=True)]


# The `grad` setter refuses a mismatched gradient, but `.data` can still change a gradient's
# (or a parameter's) shape and dtype after assignment, as in PyTorch: step() must catch that.
BAD_GRADS = [
    ("shape", graphc.tensor([1.0, 2.0, 3.0, 4.0]), graphc.ShapeError,
     r"assigned grad has data of a different size.*\[2, 2\].*\[4\]"),
    ("int", graphc.tensor([[1, 2], [3, 4]]), graphc.DTypeError,
     r"assigned grad has data of a different type.*float32.*int64"),
    ("float64", graphc.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float64"),
     graphc.DTypeError, r"different type"),
]


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("bad", BAD_GRADS, ids=[b[0] for b in BAD_GRADS])
def test_bad_gradient_leaves_everything_untouched(name, bad):
    _, bad_value, error, match = bad
    params = _two_params()
    cfg = dict(lr=0.1, momentum=0.9) if name == "SGD" else dict(lr=0.1, amsgrad=True)
    opt = GRAPHC_CLASSES[name](params, foreach=False, **cfg)
    params[0].grad = graphc.tensor([1.0, 1.0, 1.0])
    params[1].grad = graphc.tensor([[1.0, 1.0], [1.0, 1.0]])
    opt.step()  # some state exists now
    params[0].grad = graphc.tensor([0.5, 0.5, 0.5])
    params[1].grad = graphc.tensor([[0.5, 0.5], [0.5, 0.5]])
    params[1].grad.data = bad_value
    snap = _snapshot(opt, params)
    with pytest.raises(error, match=match):
        opt.step()
    _assert_unchanged(opt, params, snap)


def test_parameter_reshaped_through_data_is_caught_before_any_write():
    params = _two_params()
    opt = SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = graphc.ones_like(p)
    params[1].data = graphc.zeros(4)  # the parameter changed shape; its gradient did not
    snap = _snapshot(opt, params)
    with pytest.raises(graphc.ShapeError, match=r"different size.*\[4\].*\[2, 2\]"):
        opt.step()
    _assert_unchanged(opt, params, snap)
    assert len(opt.state) == 0


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_bad_gradient_before_any_state_creates_no_state(name):
    params = _two_params()
    opt = GRAPHC_CLASSES[name](params, lr=0.1, **({"momentum": 0.9} if name == "SGD" else {}))
    params[0].grad = graphc.tensor([1.0, 1.0, 1.0])
    params[1].grad = graphc.ones_like(params[1])
    params[1].grad.data = graphc.tensor([1.0])
    with pytest.raises(graphc.ShapeError):
        opt.step()
    assert len(opt.state) == 0
    np.testing.assert_array_equal(params[0].detach().numpy(), [1.0, 2.0, 3.0])


def test_sparse_gradient_is_refused_with_torch_wording():
    params = _two_params()
    opt = Adam(params, lr=0.1)
    params[0].grad = graphc.tensor([1.0, 1.0, 1.0])
    params[1].grad = graphc.tensor([[1.0, 1.0], [1.0, 1.0]])
    params[1].grad.is_sparse = True  # graphc has no sparse tensors; the check guards the future
    snap = _snapshot(opt, params)
    with pytest.raises(RuntimeError, match="^Adam does not support sparse gradients, please "
                                           "consider SparseAdam instead$"):
        opt.step()
    _assert_unchanged(opt, params, snap)


@pytest.mark.parametrize("name, key, value, message", [
    ("SGD", "lr", -0.1, "Invalid learning rate: -0.1"),
    ("SGD", "momentum", -1.0, "Invalid momentum value: -1.0"),
    ("Adam", "eps", -1.0, "Invalid epsilon value: -1.0"),
    ("Adam", "betas", (0.9, 1.0), "Invalid beta parameter at index 1: 1.0"),
    ("AdamW", "weight_decay", -0.5, "Invalid weight_decay value: -0.5"),
])
def test_hyperparameter_broken_after_construction_fails_before_any_write(name, key, value,
                                                                         message):
    params = _two_params()
    opt = GRAPHC_CLASSES[name]([{"params": params[:1]}, {"params": params[1:]}], lr=0.1)
    for p in params:
        p.grad = graphc.ones_like(p)
    opt.param_groups[1][key] = value
    snap = _snapshot(opt, params)
    with pytest.raises(ValueError, match=re.escape(message)):
        opt.step()
    _assert_unchanged(opt, params, snap)


def test_state_of_the_wrong_shape_fails_before_any_write():
    params = _two_params()
    opt = SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = graphc.ones_like(p)
    opt.step()
    opt.state[params[1]]["momentum_buffer"] = graphc.zeros(3)
    snap = _snapshot(opt, params)
    with pytest.raises(graphc.ShapeError, match=r"state 'momentum_buffer'.*\[2, 2\].*\[3\]"):
        opt.step()
    _assert_unchanged(opt, params, snap)


# ---- zero_grad -------------------------------------------------------------------------------
def test_zero_grad_sets_to_none_by_default():
    params = _two_params()
    opt = SGD(params, lr=0.1)
    for p in params:
        p.grad = graphc.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    opt.zero_grad()  # no gradients: nothing to do


def test_zero_grad_in_place():
    params = _two_params()
    opt = SGD(params, lr=0.1)
    grads = [graphc.ones_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    grads[0].requires_grad_(True)
    opt.zero_grad(set_to_none=False)
    for p, g in zip(params, grads):
        assert p.grad is g  # the same tensor, zeroed in place
        assert not g.requires_grad
        np.testing.assert_array_equal(g.numpy(), np.zeros(tuple(p.shape), np.float32))


def test_zero_grad_detaches_a_grad_with_history():
    p = graphc.tensor([1.0, 2.0], requires_grad=True)
    q = graphc.tensor([3.0, 4.0], requires_grad=True)
    p.grad = q * 2.0  # a gradient with history, as create_graph=True leaves it
    SGD([p]).zero_grad(set_to_none=False)
    assert p.grad.grad_fn is None and not p.grad.requires_grad
    np.testing.assert_array_equal(p.grad.numpy(), [0.0, 0.0])


# ---- state_dict ------------------------------------------------------------------------------
STATE_DICT_CASES = [
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.1)),
    ("Adam", dict(lr=0.05, amsgrad=True)),
    ("AdamW", dict(lr=0.05, weight_decay=0.1)),
]


@pytest.mark.parametrize("case", STATE_DICT_CASES, ids=[_case_id(c) for c in STATE_DICT_CASES])
def test_state_dict_round_trip_continues_the_same_trajectory(case, rng):
    torch = torch_or_skip()
    name, cfg = case
    dtype = np.float64
    g_params, t_params = _pairs(rng, dtype)
    cls = GRAPHC_CLASSES[name]
    groups = [{"params": g_params[:2]}, {"params": g_params[2:], "lr": 0.02}]
    g_opt = cls(groups, **cfg)
    t_opt = getattr(torch.optim, name)(
        [{"params": t_params[:2]}, {"params": t_params[2:], "lr": 0.02}], **cfg)
    for _ in range(3):
        _set_grads(g_params, t_params, rng, dtype)
        g_opt.step()
        t_opt.step()

    saved = g_opt.state_dict()
    t_saved = t_opt.state_dict()
    assert [g["params"] for g in saved["param_groups"]] == [[0, 1], [2]]
    assert [g["params"] for g in saved["param_groups"]] == \
        [g["params"] for g in t_saved["param_groups"]]
    assert set(saved["state"]) == set(t_saved["state"])
    for index, entry in saved["state"].items():
        assert set(entry) == set(t_saved["state"][index])
    # the saved tensors are copies: stepping on does not change them
    frozen = {(i, k): v.numpy().copy() for i, s in saved["state"].items() for k, v in s.items()}

    # a fresh optimizer on fresh parameters holding the same values, loaded from the state
    fresh = [graphc.tensor(p.detach().numpy().copy(), requires_grad=True) for p in g_params]
    fresh_opt = cls([{"params": fresh[:2]}, {"params": fresh[2:]}], lr=123.0)
    fresh_opt.load_state_dict(saved)
    assert [g["lr"] for g in fresh_opt.param_groups] == [cfg["lr"], 0.02]
    assert fresh_opt.param_groups[0]["params"][0] is fresh[0]

    for _ in range(3):
        _set_grads(g_params, t_params, rng, dtype)
        for a, b in zip(fresh, g_params):
            a.grad = graphc.tensor(b.grad.numpy().copy())
        g_opt.step()
        fresh_opt.step()
        t_opt.step()
    for a, b, t in zip(fresh, g_params, t_params):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
        _assert_close(a, t, dtype)
    for (i, key), value in frozen.items():
        np.testing.assert_array_equal(saved["state"][i][key].numpy(), value)
    # the loaded state is a copy too: it is not the saved dict's tensors
    for i, p in enumerate(fresh):
        for key, value in fresh_opt.state[p].items():
            assert value is not saved["state"][i][key]


def test_load_state_dict_casts_state_to_the_parameter_dtype_but_not_step():
    p32 = graphc.tensor([1.0, 2.0], requires_grad=True)
    opt = Adam([p32], lr=0.1)
    p32.grad = graphc.tensor([1.0, 1.0])
    opt.step()
    saved = opt.state_dict()
    p64 = graphc.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    opt64 = Adam([p64], lr=0.1)
    opt64.load_state_dict(saved)
    assert opt64.state[p64]["exp_avg"].dtype is graphc.float64
    assert opt64.state[p64]["step"].dtype is graphc.float32
    p64.grad = graphc.tensor([1.0, 1.0], dtype="float64")
    opt64.step()
    assert opt64.state[p64]["step"].item() == 2.0


def test_state_dict_of_a_fresh_optimizer_matches_torch_layout():
    torch = torch_or_skip()
    p = graphc.tensor([1.0], requires_grad=True)
    sd = SGD([p], lr=0.1, momentum=0.9).state_dict()
    t_sd = torch.optim.SGD([torch.tensor([1.0], requires_grad=True)], lr=0.1,
                           momentum=0.9).state_dict()
    assert sd["state"] == t_sd["state"] == {}
    assert set(sd["param_groups"][0]) <= set(t_sd["param_groups"][0])
    assert sd["param_groups"][0]["params"] == t_sd["param_groups"][0]["params"] == [0]


@pytest.mark.parametrize("groups, message", [
    (lambda ps: [{"params": ps[:1]}, {"params": ps[1:]}],
     "loaded state dict has a different number of parameter groups"),
    (lambda ps: [{"params": ps[:1]}],
     "loaded state dict contains a parameter group that doesn't match the size of optimizer's "
     "group"),
])
def test_load_state_dict_errors_match_torch(groups, message):
    torch = torch_or_skip()
    saved = SGD(_two_params(), lr=0.1).state_dict()
    t_saved = torch.optim.SGD([torch.zeros(3, requires_grad=True),
                               torch.zeros(2, 2, requires_grad=True)], lr=0.1).state_dict()
    params = _two_params()
    opt = SGD(groups(params), lr=0.5)
    before = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError) as ours:
        opt.load_state_dict(saved)
    t_params = [torch.zeros(3, requires_grad=True), torch.zeros(2, 2, requires_grad=True)]
    with pytest.raises(ValueError) as theirs:
        torch.optim.SGD(groups(t_params), lr=0.5).load_state_dict(t_saved)
    assert str(ours.value) == str(theirs.value) == message
    assert opt.param_groups == before  # nothing changed


# ---- construction errors (PyTorch's wording, checked against torch itself) -------------------
def _both_raise(build, error=None):
    """Build with graphc and with torch; both must raise the same class and message."""
    torch = torch_or_skip()
    with pytest.raises(Exception) as theirs:
        build(torch, lambda *s: torch.zeros(*s, requires_grad=True))
    with pytest.raises(type(theirs.value) if error is None else error) as ours:
        build(graphc, lambda *s: graphc.zeros(*s, requires_grad=True))
    return str(ours.value), str(theirs.value)


CONSTRUCTION_ERRORS = {
    "empty": lambda m, z: m.optim.SGD([], lr=0.1),
    "empty-generator": lambda m, z: m.optim.Adam(iter([])),
    "lr": lambda m, z: m.optim.SGD([z(2)], lr=-0.1),
    "adam-lr": lambda m, z: m.optim.Adam([z(2)], lr=-0.1),
    "adamw-lr": lambda m, z: m.optim.AdamW([z(2)], lr=-0.1),
    "momentum": lambda m, z: m.optim.SGD([z(2)], lr=0.1, momentum=-0.5),
    "sgd-weight-decay": lambda m, z: m.optim.SGD([z(2)], lr=0.1, weight_decay=-1e-4),
    "nesterov-no-momentum": lambda m, z: m.optim.SGD([z(2)], lr=0.1, nesterov=True),
    "nesterov-dampening": lambda m, z: m.optim.SGD([z(2)], lr=0.1, momentum=0.9,
                                                   dampening=0.1, nesterov=True),
    "eps": lambda m, z: m.optim.Adam([z(2)], eps=-1e-8),
    "beta0": lambda m, z: m.optim.Adam([z(2)], betas=(1.0, 0.999)),
    "beta0-negative": lambda m, z: m.optim.AdamW([z(2)], betas=(-0.1, 0.999)),
    "beta1": lambda m, z: m.optim.Adam([z(2)], betas=(0.9, 1.5)),
    "adam-weight-decay": lambda m, z: m.optim.Adam([z(2)], weight_decay=-0.01),
    "adamw-weight-decay": lambda m, z: m.optim.AdamW([z(2)], weight_decay=-0.01),
    "not-a-tensor": lambda m, z: m.optim.SGD([z(2), 1.5], lr=0.1),
    "non-leaf": lambda m, z: m.optim.SGD([z(2) * 2], lr=0.1),
    "set-in-group": lambda m, z: m.optim.SGD([{"params": {z(2)}}], lr=0.1),
    "two-groups": lambda m, z: _shared(m, z),
    "group-not-dict": lambda m, z: m.optim.SGD([z(2)], lr=0.1).add_param_group([z(2)]),
    "add-existing": lambda m, z: _add_existing(m, z),
    "names-mixed": lambda m, z: m.optim.SGD([("a", z(2)), z(2)], lr=0.1),
    "names-groups-mixed": lambda m, z: m.optim.SGD(
        [{"params": [("a", z(2))]}, {"params": [z(2)]}], lr=0.1),
}


def _shared(m, z):
    p = z(2)
    return m.optim.SGD([{"params": [p]}, {"params": [z(3), p]}], lr=0.1)


def _add_existing(m, z):
    p = z(2)
    opt = m.optim.Adam([p])
    opt.add_param_group({"params": p})


@pytest.mark.parametrize("case", sorted(CONSTRUCTION_ERRORS))
def test_construction_errors_match_torch(case):
    """PyTorch's wording; a bad hyperparameter's message also names the optimizer first and
    says the accepted range after it."""
    ours, theirs = _both_raise(CONSTRUCTION_ERRORS[case])
    name, _, rest = ours.partition(": ")
    assert ours == theirs or (name in ("SGD", "Adam", "AdamW")
                              and (rest == theirs or rest.startswith(theirs + " (")))


def test_tensor_or_non_iterable_params_are_refused():
    torch = torch_or_skip()
    with pytest.raises(TypeError) as theirs:
        torch.optim.SGD(torch.zeros(2, requires_grad=True), lr=0.1)
    with pytest.raises(TypeError) as ours:
        SGD(graphc.zeros(2, requires_grad=True), lr=0.1)
    assert str(ours.value) == str(theirs.value).replace("torch.", "graphc.")
    with pytest.raises(TypeError, match="^params argument given to the optimizer should be an "
                                        "iterable of Tensors or dicts, but got int$"):
        SGD(5, lr=0.1)


def test_invalid_per_group_option_is_refused_with_torch_wording():
    """Stricter than PyTorch (which checks only the defaults): a group is checked when added."""
    p, q = graphc.zeros(2, requires_grad=True), graphc.zeros(2, requires_grad=True)
    with pytest.raises(ValueError,
                       match=r"^SGD: Invalid learning rate: -0\.1 \(lr must be >= 0\)$"):
        SGD([{"params": [p]}, {"params": [q], "lr": -0.1}], lr=0.1)
    opt = SGD([p], lr=0.1)
    with pytest.raises(ValueError, match="^SGD: Nesterov momentum requires a momentum and zero "
                                         "dampening$"):
        opt.add_param_group({"params": [q], "nesterov": True})
    assert len(opt.param_groups) == 1


def test_required_option_must_be_given():
    from graphc.optim import required

    class Custom(Optimizer):
        def __init__(self, params, lr=required):
            super().__init__(params, {"lr": lr})

    with pytest.raises(ValueError, match="^parameter group didn't specify a value of required "
                                         "optimization parameter lr$"):
        Custom([graphc.zeros(1, requires_grad=True)])
    assert Custom([graphc.zeros(1, requires_grad=True)], lr=0.5).param_groups[0]["lr"] == 0.5


def test_duplicate_parameters_in_a_group_warn():
    p = graphc.zeros(2, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SGD([p, p], lr=0.1)
    assert any("duplicate parameters" in str(w.message) for w in caught)


def test_named_parameters_and_repr():
    torch = torch_or_skip()
    p = graphc.zeros(2, requires_grad=True)
    opt = SGD([("weight", p)], lr=0.1, momentum=0.9)
    assert opt.param_groups[0]["param_names"] == ["weight"]
    assert opt.param_groups[0]["params"][0] is p
    assert opt.state_dict()["param_groups"][0]["param_names"] == ["weight"]
    text = repr(opt)
    assert text.startswith("SGD (\nParameter Group 0\n") and "    lr: 0.1\n" in text
    t_text = repr(torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1, momentum=0.9))
    assert "    momentum: 0.9\n" in text and "    momentum: 0.9\n" in t_text


def test_parameter_without_grad_is_skipped_and_gets_no_state():
    p, q = graphc.tensor([1.0], requires_grad=True), graphc.tensor([2.0], requires_grad=True)
    opt = Adam([p, q], lr=0.1)
    p.grad = graphc.tensor([1.0])
    opt.step()
    assert q not in opt.state and p in opt.state
    assert q.item() == 2.0 and p.item() != 1.0
