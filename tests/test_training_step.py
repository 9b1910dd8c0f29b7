"""Whole training steps as one graph: zero_grad, forward, loss.backward() and opt.step() compiled
together, run N times against N eager steps (parameters, buffers, optimizer state, .grad and
the loss), with the retraces the guards promise and the updates named after what they write."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc import optim
from graphc.errors import GraphcError
from graphc.ir import parse, verify
from graphc.jit.bindings import GradBinding
from graphc.jit.tracer import trace_call

STEPS = 10
RTOL = 1e-5


# ---- models, optimizers, steps ------------------------------------------------------------
def mlp():
    return nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 10))


def lenet_bn():
    """LeNet-5 with BatchNorm after each convolution (running stats) and Dropout."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10),
    )


MODELS = {"mlp": (mlp, (32,)), "lenet_bn": (lenet_bn, (1, 28, 28))}
OPTIMIZERS = {
    "sgd_momentum": lambda p: optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: optim.Adam(p, lr=1e-3),
    "adamw": lambda p: optim.AdamW(p, lr=1e-3, weight_decay=0.1),
}


def make_step(model, opt, zero_grad: str = "start"):
    """A training step; `zero_grad` is where it resets gradients: "start" (set_to_none),
    "start_zeros" (set_to_none=False), "end" (set_to_none, after the update), or "never"
    (gradients accumulate across calls)."""

    def step(x, y):
        if zero_grad == "start":
            opt.zero_grad()
        elif zero_grad == "start_zeros":
            opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if zero_grad == "end":
            opt.zero_grad(set_to_none=True)
        return loss

    return step


def batches(rng, in_shape, n=STEPS, batch=4):
    return [(graphc.tensor(rng.standard_normal((batch, *in_shape)).astype(np.float32)),
             graphc.tensor(rng.integers(0, 10, batch))) for _ in range(n)]


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(|b|, 1e-3): relative, without blowing up at zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3), initial=0.0))


def state_arrays(model, opt) -> dict[str, np.ndarray]:
    """Every parameter, buffer, .grad and optimizer state tensor, by a stable name."""
    out = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        out[name] = t._data
    for name, p in model.named_parameters():
        out[f"{name}.grad"] = None if p.grad is None else p.grad._data
    for p, state in opt.state.items():
        for key, value in state.items():
            out[f"{names[id(p)]}.{key}"] = value._data
    return out


def compare(model_a, opt_a, model_b, opt_b) -> float:
    a, b = state_arrays(model_a, opt_a), state_arrays(model_b, opt_b)
    assert a.keys() == b.keys()
    worst = 0.0
    for key in a:
        if a[key] is None or b[key] is None:
            assert a[key] is None and b[key] is None, f"{key}: one side has no .grad"
            continue
        np.testing.assert_allclose(a[key], b[key], rtol=RTOL, atol=1e-7, err_msg=key)
        worst = max(worst, rel_diff(a[key], b[key]))
    return worst


def train_both(model_name: str, opt_name: str, rng, zero_grad: str = "start"):
    """N eager steps and N compiled steps from the same start and seeds; returns the compiled
    step, both (model, opt) pairs and the worst relative difference seen."""
    build, in_shape = MODELS[model_name]
    graphc.manual_seed(0)
    eager_model = build()
    model = copy.deepcopy(eager_model)
    eager_opt = OPTIMIZERS[opt_name](eager_model.parameters())
    opt = OPTIMIZERS[opt_name](model.parameters())
    eager_step = make_step(eager_model, eager_opt, zero_grad)
    compiled = graphc.compile(make_step(model, opt, zero_grad), backend="interp")
    data = batches(rng, in_shape)
    eager_rng = compiled_rng = graphc.manual_seed(7).get_state()  # same dropout masks
    worst = 0.0
    for x, y in data:
        graphc.set_rng_state(eager_rng)
        want = eager_step(x, y)
        eager_rng = graphc.get_rng_state()
        graphc.set_rng_state(compiled_rng)
        got = compiled(x, y)
        compiled_rng = graphc.get_rng_state()
        np.testing.assert_allclose(got._data, want._data, rtol=RTOL, err_msg="loss")
        worst = max(worst, rel_diff(got._data, want._data), compare(model, opt, eager_model,
                                                                    eager_opt))
    return compiled, (model, opt), (eager_model, eager_opt), worst


# ---- N compiled steps match N eager steps ---------------------------------------------------
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_compiled_training_matches_eager(model_name, opt_name, rng, monkeypatch, capsys):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    compiled, (model, opt), _, worst = train_both(model_name, opt_name, rng)
    print(f"\n{model_name}/{opt_name}: max relative difference over {STEPS} steps: {worst:.3g}")
    assert worst <= RTOL
    # call 1 traces with no grads and no optimizer state; call 2 sees both (the first step
    # made them): it traces once more; calls 3..N replay that graph
    assert len(compiled.graphs) == 2
    [reasons] = compiled.recompile_reasons
    assert any(r.endswith(".grad: None -> tensor(10) float32") for r in reasons)
    state_key = "momentum_buffer" if opt_name.startswith("sgd") else "exp_avg_sq"
    assert any(f".{state_key}: '<absent>' -> tensor" in r for r in reasons)
    err = capsys.readouterr().err
    assert err.count("graphc: recompiling step:") == 1
    graph = compiled.graph
    # one graph: forward, backward and the update
    ops = {n.op for n in graph}
    assert "nll_loss" in ops and "nll_loss_backward" in ops and "sqrt" in ops or \
        opt_name.startswith("sgd")
    # the updates name every parameter, every buffer and every optimizer state tensor
    targets = {v.name for v, _ in graph.updates}
    want = {f"model.{n}" for n, _ in model.named_parameters()}  # `model`: the closure cell
    want |= {f"model.{n}" for n, _ in model.named_buffers()}
    want |= {f"model.{n}.{key}" for n, p in model.named_parameters() for key in opt.state[p]}
    assert targets == want
    # the fresh .grads are outputs after the loss, assigned after every run
    assert len(graph.outputs) == 1 + len(list(model.parameters()))
    # an ordinary graph: verified, and its text parses back to it
    assert parse(str(verify(graph))) == graph


def test_inference_graph_of_an_eval_model_has_no_backward(rng):
    model = lenet_bn()
    compiled_step = graphc.compile(make_step(model, optim.SGD(model.parameters(), lr=0.1)),
                                   backend="interp")
    x, y = batches(rng, (1, 28, 28), n=1)[0]
    compiled_step(x, y)
    train_ops = {n.op for n in compiled_step.graph}
    assert {"conv2d_input_grad", "conv2d_weight_grad", "max_pool2d_grad"} <= train_ops

    model.eval()
    infer = graphc.compile(model, backend="interp")
    with graphc.no_grad():
        got = infer(x)
        got = infer(x)  # the replay
        want = model(x)
    np.testing.assert_allclose(got._data, want._data, rtol=RTOL, atol=1e-6)
    graph = infer.graph
    assert len(infer.graphs) == 1
    assert not [n.op for n in graph if n.op.endswith(("_grad", "_backward"))]
    assert graph.updates == [] and len(graph.outputs) == 1
    assert not any(isinstance(b, GradBinding) for b in infer._entries[-1].traced.bindings)


# ---- zero_grad variants ------------------------------------------------------------------------
@pytest.mark.parametrize("zero_grad", ["start", "start_zeros", "end", "never"])
def test_zero_grad_variants_match_eager(zero_grad, rng):
    compiled, (model, opt), (eager_model, _), worst = train_both("mlp", "sgd_momentum", rng,
                                                                 zero_grad)
    assert worst <= RTOL
    assert len(compiled.graphs) == 2  # the momentum buffers (and the grads) appear at call 2
    for p, q in zip(model.parameters(), eager_model.parameters()):
        assert (p.grad is None) == (q.grad is None) == (zero_grad == "end")


def test_grads_read_and_accumulated_are_bound_inputs_updated_in_place(rng):
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.01)
    compiled = graphc.compile(make_step(model, opt, "never"), backend="interp")
    data = batches(rng, (32,), n=3)
    compiled(*data[0])
    compiled(*data[1])  # the grads exist now: read and accumulated into
    grads = [p.grad for p in model.parameters()]
    compiled(*data[2])
    graph = compiled.graph
    names = {f"model.{n}.grad" for n, _ in model.named_parameters()}
    assert {v.name for v in graph.inputs if v.name.endswith(".grad")} == names
    assert {v.name for v, _ in graph.updates} >= set(names)
    assert len(graph.outputs) == 1  # no fresh .grad: every one is updated in place
    # written back into the same tensor objects, as eager accumulation does
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))


def test_zeroed_grads_keep_their_tensors(rng):
    """zero_grad(set_to_none=False) writes zeros into the existing .grad, which the step does
    not read before writing: the graph still takes it as an input, to update it."""
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    compiled = graphc.compile(make_step(model, opt, "start_zeros"), backend="interp")
    data = batches(rng, (32,), n=4)
    for x, y in data[:2]:
        compiled(x, y)
    grads = [p.grad for p in model.parameters()]
    for x, y in data[2:]:
        compiled(x, y)
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert len(compiled.graphs) == 2


def test_plain_sgd_zeroing_at_the_end_traces_once(rng):
    """Nothing the step depends on changes between calls (no state, grads None at entry)."""
    model = mlp()
    opt = optim.SGD(model.parameters(), lr=0.01)
    compiled = graphc.compile(make_step(model, opt, "end"), backend="interp")
    for x, y in batches(rng, (32,), n=4):
        compiled(x, y)
    assert len(compiled.graphs) == 1
    assert all(p.grad is None for p in model.parameters())
    assert len(compiled.graph.outputs) == 1  # the None grads need no output


def test_trace_of_a_training_step_binds_grads_explicitly(rng):
    w = graphc.tensor([1.0, -2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.5)

    def step(x):
        loss = (w * x).sum()
        loss.backward()
        opt.step()
        return loss

    x = graphc.tensor([3.0, 4.0])
    step(x)  # eager: w.grad exists now
    traced = trace_call(step, (x,))
    text = str(traced.graph)
    assert "%w.grad: f32[2]" in text and "%w.grad <- " in text and "%w <- " in text
    assert traced.grad_outputs == []
    assert isinstance(traced.bindings[[v.name for v in traced.graph.inputs].index("w.grad")],
                      GradBinding)


def test_a_returned_grad_is_the_assigned_tensor(rng):
    w = graphc.tensor([1.0, -2.0], requires_grad=True)

    def f(x):
        w.grad = None
        (w * x).sum().backward()
        return w.grad

    cf = graphc.compile(f, backend="interp")
    for _ in range(3):
        x = graphc.tensor(rng.standard_normal(2).astype(np.float32))
        g = cf(x)
        assert g is w.grad
        np.testing.assert_array_equal(g._data, x._data)
    assert len(cf.graphs) == 2  # w.grad None at call 1 only


# ---- what stays refused --------------------------------------------------------------------
def test_outputs_needing_a_grad_fn_after_a_backward_inside_are_refused(rng):
    w = graphc.ones(2, requires_grad=True)

    def forward_after_backward(x):
        (w * x).sum().backward()
        return (w * x).sum()  # fresh history, not consumed by a backward

    with pytest.raises(GraphcError, match="requires grad, and the function also ran "
                                          "backward"):
        graphc.compile(forward_after_backward, backend="interp")(graphc.ones(2))


def test_a_compiled_method_of_a_trainer_object(rng):
    """The model and optimizer reached through `self`: same numbers, named inputs, guards."""

    class Trainer:
        def __init__(self, model):
            self.model = model
            self.opt = optim.Adam(model.parameters(), lr=1e-2)

        def step(self, x, y):
            self.opt.zero_grad()
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            return loss

        compiled_step = graphc.compile(step, backend="interp")

    graphc.manual_seed(0)
    eager = Trainer(mlp())
    compiled = Trainer(copy.deepcopy(eager.model))
    for x, y in batches(rng, (32,), n=4):
        np.testing.assert_allclose(compiled.compiled_step(x, y)._data, eager.step(x, y)._data,
                                   rtol=RTOL)
    compare(compiled.model, compiled.opt, eager.model, eager.opt)
    assert len(Trainer.compiled_step.graphs) == 2
    names = [v.name for v in Trainer.compiled_step.graph.inputs]
    assert names[:4] == ["x", "y", "self.model.0.weight", "self.model.0.bias"]
    assert "self.model.0.weight.exp_avg" in names
