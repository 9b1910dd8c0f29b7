"""Gradients through compiled callables (the torch.compile habit): outputs carry a grad_fn,
and eager `backward()` runs the compiled backward graph partitioned from one joint graph."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim
from graphc.ir import format_graph, parse
from graphc.jit.compiled_autograd import partition
from graphc.passes.autodiff import derive_backward


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3),
                         nn.Linear(16, 4))


def _lenet_bn():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 84), nn.ReLU(), nn.Dropout(0.2), nn.Linear(84, 10))


def _rel(a, b) -> float:
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-6)))


@pytest.mark.parametrize("make,shape", [(_mlp, (6, 8)), (_lenet_bn, (4, 1, 28, 28))],
                         ids=["mlp_bn_dropout", "lenet5_bn_dropout"])
def test_compiled_model_trains_from_eager_code_like_the_eager_model(make, shape):
    graphc.manual_seed(0)
    model = make()
    reference = copy.deepcopy(model)
    compiled = graphc.compile(model, backend="interp")
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    x = graphc.randn(*shape)
    y = graphc.randint(0, 4, (shape[0],))
    for step in range(5):
        graphc.manual_seed(100 + step)  # the same dropout masks in both
        opt.zero_grad()
        out = compiled(x)
        assert out.grad_fn is not None
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        graphc.manual_seed(100 + step)
        ref_opt.zero_grad()
        ref_loss = F.cross_entropy(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        assert _rel(loss.detach().numpy(), ref_loss.detach().numpy()) <= 1e-5
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"  # replays ran compiled
    assert len(compiled.graphs) == 1
    for p, q in zip(model.parameters(), reference.parameters()):
        assert _rel(p.detach().numpy(), q.detach().numpy()) <= 1e-5
    for b, c in zip(model.buffers(), reference.buffers()):
        np.testing.assert_allclose(b.numpy(), c.numpy(), rtol=1e-5)


def test_inputs_that_require_grad_get_gradients():
    w = graphc.randn(3, 3)

    def f(x):
        return (x @ w).tanh() * x

    compiled = graphc.compile(f, backend="interp")
    for _ in range(2):
        x = graphc.randn(2, 3, requires_grad=True)
        compiled(x).sum().backward()
        x_ref = x.detach().clone().requires_grad_()
        f(x_ref).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), x_ref.grad.numpy(), rtol=1e-5)


def test_forward_saves_only_what_the_backward_reads():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
    with graphc.no_grad():
        graph = graphc.trace(model, graphc.randn(3, 4))
    wrt = [i for i, v in enumerate(graph.inputs) if v.name != "input"]
    part = partition(derive_backward(graph, wrt=wrt))
    seeds = [v for v in part.backward.inputs if v.name.startswith("grad_")]
    assert len(seeds) == 1 and len(part.backward.outputs) == len(wrt)
    assert part.backward.inputs == part.saved + seeds
    assert all(n.op != "matmul" or "backward" not in (n.loc or "") for n in part.forward.nodes)
    for g in (part.forward, part.backward):
        assert parse(format_graph(g)) == g


def test_double_backward_through_a_compiled_call_is_refused():
    compiled = graphc.compile(lambda x: (x * x).sum(), backend="interp")
    x = graphc.randn(3, requires_grad=True)
    compiled(x)
    (g,) = graphc.autograd.grad(compiled(x), x, create_graph=False)
    np.testing.assert_allclose(g.numpy(), 2 * x.detach().numpy(), rtol=1e-6)
    with pytest.raises(graphc.AutogradError, match="create_graph=True.*compiled callable"):
        graphc.autograd.grad(compiled(x), x, create_graph=True)


def test_a_parameter_changed_between_forward_and_backward_is_an_error():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    compiled = graphc.compile(model, backend="interp")
    x = graphc.randn(4, 3)
    compiled(x)  # the trace
    out = compiled(x)
    with graphc.no_grad():  # the first layer's gradient reads this weight
        model[2].weight.add_(1.0)
    with pytest.raises(graphc.AutogradError, match="modified by an inplace operation"):
        out.sum().backward()


def test_no_grad_calls_run_the_plain_forward():
    model = nn.Linear(3, 2)
    compiled = graphc.compile(model, backend="interp")
    with graphc.no_grad():
        compiled(graphc.randn(4, 3))
        out = compiled(graphc.randn(4, 3))
    assert out.grad_fn is None and not out.requires_grad


class _StraightThroughSign(graphc.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sign()

    @staticmethod
    def backward(ctx, g):
        return g  # deliberately not the derivative of sign


def test_custom_function_backward_is_not_silently_replaced():
    """A compiled call whose output needs a grad_fn runs the Function's own backward."""
    w = graphc.ones(3, requires_grad=True)

    def f(x):
        return _StraightThroughSign.apply(x * w)

    compiled = graphc.compile(f, backend="interp")
    x = graphc.tensor([2.0, -1.0, 3.0])
    for _ in range(2):  # the trace, then the compiled forward and backward
        w.grad = None
        compiled(x).sum().backward()
        assert w.grad.tolist() == [2.0, -1.0, 3.0]  # x * (straight-through 1), not 0
    with graphc.no_grad():
        assert compiled(x).tolist() == [1.0, -1.0, 1.0]


class _ReadsItsGradient(graphc.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * float(g.sum().item())  # a data-dependent value: not traceable


def test_a_compiled_training_step_runs_the_custom_backward():
    w = graphc.ones(3, requires_grad=True)

    def step(x):
        w.grad = None
        loss = _StraightThroughSign.apply(x * w).sum()
        loss.backward()
        return loss.detach()

    compiled = graphc.compile(step, backend="interp")
    x = graphc.tensor([2.0, -1.0, 3.0])
    for _ in range(3):
        compiled(x)
        assert w.grad.tolist() == [2.0, -1.0, 3.0]  # x * (straight-through 1), not 0


def test_a_compiled_gradient_penalty_step_matches_eager_and_gradgradcheck():
    """grad of grad inside a compiled training step: autograd.grad(create_graph=True) is
    traced with its double-backward ops, and ten steps track the eager steps."""
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = copy.deepcopy(model)

    def make_step(m, opt):
        def step(x):
            opt.zero_grad()
            x = x.detach().requires_grad_()
            (gx,) = graphc.autograd.grad(m(x).sum(), x, create_graph=True)
            penalty = ((gx * gx).sum(1) - 1.0).pow(2).mean()
            penalty.backward()
            opt.step()
            return penalty.detach()
        return step

    compiled = graphc.compile(make_step(model, optim.SGD(model.parameters(), lr=0.1)),
                              backend="interp")
    eager = make_step(reference, optim.SGD(reference.parameters(), lr=0.1))
    x = graphc.randn(5, 3)
    for _ in range(10):
        assert _rel(compiled(x).numpy(), eager(x).numpy()) <= 1e-5
    for p, q in zip(model.parameters(), reference.parameters()):
        assert _rel(p.detach().numpy(), q.detach().numpy()) <= 1e-5
    double = copy.deepcopy(reference).double()
    assert graphc.autograd.gradgradcheck(lambda t: double(t).sum(),
                                         (graphc.randn(2, 3, dtype=graphc.float64,
                                                       requires_grad=True),))


def test_a_refused_or_failed_trace_leaves_no_state_behind():
    graphc.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    x = graphc.randn(5, 3)
    before = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    rng_before = graphc.get_rng_state().numpy().copy()

    def refused(x):  # a custom backward reading a value: refused after the tracing run
        return _ReadsItsGradient.apply(model(x))

    def fails(x):  # a data-dependent branch after BatchNorm updated its running stats
        y = model(x)
        return y if y.sum() > 0 else -y

    for fn, error in ((refused, graphc.GraphcError), (fails, graphc.TraceError)):
        with pytest.raises(error):
            graphc.compile(fn, backend="interp")(x)
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(v.detach().numpy(), before[k], err_msg=k)
        assert all(p.grad is None for p in model.parameters())
        np.testing.assert_array_equal(graphc.get_rng_state().numpy(), rng_before)
