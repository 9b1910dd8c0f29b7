"""Custom autograd.Functions in derived backwards: `derive_backward` calls the Function's own
`backward` (recorded as a `function` region by the tracer), so compiled calls from eager code
and IR-level differentiation give eager autograd's gradients, even where the backward is not
the derivative of the forward (straight-through estimators)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.autograd import Function, grad
from graphc.ir import ParseError, format_graph, parse, run, verify
from graphc.jit.tracer import trace_call
from graphc.passes.autodiff import AutodiffError, derive_backward

BACKENDS = ["interp", "cpu"]


class StraightThroughClamp(Function):
    """clamp(x, low, high) forward, identity backward (not the clamp's derivative)."""

    @staticmethod
    def forward(ctx, x, low: float, high: float):
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class TanhSaved(Function):
    """tanh(x) * w, saving an input (w) and an output (t = tanh(x)) for backward."""

    @staticmethod
    def forward(ctx, x, w):
        t = x.tanh()
        ctx.save_for_backward(w, t)
        return t * w

    @staticmethod
    def backward(ctx, g):
        w, t = ctx.saved_tensors
        return g * w * (1 - t * t), g * t


SEEN_NEEDS = []  # needs_input_grad as ScaledMul.backward saw it, call by call


class ScaledMul(Function):
    """alpha * x * w (** 2 when mode == "square"): non-tensor arguments on ctx, and gradients
    computed only for the inputs in needs_input_grad."""

    @staticmethod
    def forward(ctx, x, alpha: float, w, mode: str):
        ctx.save_for_backward(x, w)
        ctx.alpha, ctx.mode = alpha, mode
        return x * (w * w if mode == "square" else w) * alpha

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        SEEN_NEEDS.append(ctx.needs_input_grad)
        factor = w * w if ctx.mode == "square" else w
        gx = g * factor * ctx.alpha if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[2]:
            gw = g * x * ctx.alpha * (2 * w if ctx.mode == "square" else 1)
        return gx, None, gw, None


class ReluWithMask(Function):
    """relu(x) and its (float) mask; the mask is marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        mask = (x > 0).to(x.dtype)
        ctx.mark_non_differentiable(mask)
        ctx.save_for_backward(mask)
        return x * mask, mask

    @staticmethod
    def backward(ctx, g, g_mask):
        (mask,) = ctx.saved_tensors
        return g * mask


class Quantize(Function):
    """Rounds down to multiples of 1/4 with floor_divide, an op with no VJP: the
    straight-through backward stands in for it."""

    @staticmethod
    def forward(ctx, x):
        return (x // 0.25) * 0.25

    @staticmethod
    def backward(ctx, g):
        return g


class Cube(Function):
    """x ** 3 with an exact backward built from differentiable ops (grad of grad works)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


class ItemBackward(Function):
    """A backward that reads a tensor's value: it cannot become a graph."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * float(x.sum().item())


class Passthrough(Function):
    """Returns its input unchanged: the IR cannot tell the output from the input."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _grads(fn, inputs: list[np.ndarray], requires: list[bool]):
    """fn's summed output (times a fixed projection) and its gradients, run eagerly on fresh
    tensors; returns (outputs, grads of the inputs that require grad)."""
    tensors = [graphc.tensor(a, requires_grad=r) for a, r in zip(inputs, requires)]
    out = fn(*tensors)
    projection = graphc.tensor(np.linspace(-1.0, 2.0, out.numel()).reshape(out.shape)
                               .astype(np.float32))
    (out * projection).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in tensors if t.requires_grad]


def _stc(x, w):
    return StraightThroughClamp.apply(x * w, -0.5, 0.5) * x


def _tanh_saved(x, w):
    return TanhSaved.apply(x, w).exp()


def _scaled_mul(x, w):
    return ScaledMul.apply(x, 1.5, w, "square") + x


def _relu_mask(x, w):
    y, mask = ReluWithMask.apply(x - w)
    return y * 2 + mask


def _quantize(x, w):
    return Quantize.apply(x * w).tanh()


CASES = {"straight_through": _stc, "saves_input_and_output": _tanh_saved,
         "non_tensor_args": _scaled_mul, "non_differentiable_output": _relu_mask,
         "forward_op_without_vjp": _quantize}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_call_gradients_equal_eager(case, backend, rng):
    fn = CASES[case]
    x0 = rng.uniform(-1.5, 1.5, (3, 4)).astype(np.float32)
    w0 = rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    compiled = graphc.compile(fn, backend=backend)
    want_out, want = _grads(fn, [x0, w0], [True, True])
    for _ in range(2):  # the first call traces, the second runs the compiled forward/backward
        out, got = _grads(compiled, [x0, w0], [True, True])
        np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    assert len(compiled.graphs) == 1


def test_straight_through_gradient_is_not_the_clamp_derivative(rng):
    x0 = np.array([[-2.0, -0.2, 0.3, 3.0]], np.float32)
    w0 = np.ones((1, 4), np.float32)
    compiled = graphc.compile(_stc, backend="interp")
    for _ in range(2):
        x = graphc.tensor(x0, requires_grad=True)
        compiled(x, graphc.tensor(w0)).sum().backward()
        # d/dx [ste(x) * x] = 1 * x + clamp(x): where clamped, the clamp's derivative is 0
        np.testing.assert_allclose(x.grad.numpy(), x0 + np.clip(x0, -0.5, 0.5))


def test_needs_input_grad_follows_the_inputs_that_require_grad(rng):
    x0 = rng.standard_normal((2, 3)).astype(np.float32)
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    for requires in ([True, False], [False, True], [True, True]):
        compiled = graphc.compile(_scaled_mul, backend="interp")
        want_out, want = _grads(_scaled_mul, [x0, w0], requires)
        eager_needs = SEEN_NEEDS[-1]
        assert eager_needs == (requires[0], False, requires[1], False)
        seen = []
        for _ in range(2):
            SEEN_NEEDS.clear()
            out, got = _grads(compiled, [x0, w0], requires)
            for g, e in zip(got, want):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
            seen.append(list(SEEN_NEEDS))
        # the first call: derive_backward's call of backward (the trace is abstract and the
        # call's result comes from the compiled forward); then only the compiled backward runs
        assert seen == [[eager_needs], []]


def test_compiled_module_with_a_custom_function_trains_like_eager(rng):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return StraightThroughClamp.apply(self.fc(x), -0.3, 0.3)

    graphc.manual_seed(0)
    net = Net()
    compiled = graphc.compile(net, backend="cpu")
    x = graphc.tensor(rng.standard_normal((5, 4)).astype(np.float32))
    for _ in range(2):
        net.zero_grad()
        out = compiled(x)
        (out ** 2).sum().backward()
        got = [p.grad.numpy().copy() for p in net.parameters()]
        net.zero_grad()
        (net(x) ** 2).sum().backward()
        for g, p in zip(got, net.parameters()):
            np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-6)
        net.zero_grad()
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"  # the replay compiled


# ---- derive_backward on the traced graph ---------------------------------------------------
def _x_and_w(rng):
    return (rng.uniform(-1.5, 1.5, (3, 4)), rng.uniform(0.5, 1.5, (3, 4)))


@pytest.mark.parametrize("case", list(CASES))
def test_derive_backward_on_the_traced_graph_equals_eager(case, rng):
    fn = CASES[case]
    x0, w0 = _x_and_w(rng)
    traced = trace_call(fn, (graphc.tensor(x0), graphc.tensor(w0)))  # float64, no grad
    joint = derive_backward(traced.graph)
    verify(joint)
    seed = np.linspace(-1.0, 2.0, x0.size).reshape(x0.shape)
    out, gx, gw = run(joint, x0, w0, seed)
    x, w = graphc.tensor(x0, requires_grad=True), graphc.tensor(w0, requires_grad=True)
    want = fn(x, w)
    ex, ew = grad(want, [x, w], grad_outputs=graphc.tensor(seed))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gx, ex.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gw, ew.numpy(), rtol=1e-12, atol=1e-14)
    if case not in ("straight_through", "forward_op_without_vjp"):  # backward returns g
        assert any(n.loc and "(backward of " in n.loc for n in joint.nodes)


def test_derive_backward_wrt_one_input_sets_needs_input_grad(rng):
    x0, w0 = _x_and_w(rng)
    graph = trace_call(_scaled_mul, (graphc.tensor(x0), graphc.tensor(w0))).graph
    SEEN_NEEDS.clear()
    joint = derive_backward(graph, wrt=["w"])
    assert SEEN_NEEDS == [(False, False, True, False)]
    assert [v.name for v in joint.inputs] == ["x", "w", f"grad_{graph.outputs[0].name}"]
    assert joint.meta["autodiff"]["wrt"] == ["w"] and len(joint.outputs) == 2


def test_grad_of_grad_differentiates_the_custom_backward(rng):
    x0 = rng.uniform(0.5, 1.5, 4)
    graph = trace_call(lambda x: Cube.apply(x).sum(), (graphc.tensor(x0),)).graph
    joint = derive_backward(graph, seeds="ones")
    # the joint keeps the region (its forward part), so it differentiates again through the
    # custom backward's ops: d/dx sum(3 x^2) = 6 x
    assert [r.name for r in joint.meta["functions"]] == ["Cube"]
    first = verify(parse(format_graph(joint)))  # the region survives the text form too
    second = derive_backward(first, wrt=["x"])  # seeds: 0 for the sum, 1 for its gradient
    out, gx, ggx = run(second, x0, np.zeros(()), np.ones(4))
    x = graphc.tensor(x0, requires_grad=True)
    (g,) = grad(Cube.apply(x).sum(), x, create_graph=True)
    (gg,) = grad(g.sum(), x)
    np.testing.assert_allclose(gx, 3 * x0 ** 2, rtol=1e-12)
    np.testing.assert_allclose(ggx, gg.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ggx, 6 * x0, rtol=1e-12)


# ---- IR text --------------------------------------------------------------------------------
def test_function_lines_round_trip_through_the_text_form(rng):
    x0, w0 = _x_and_w(rng)
    graph = trace_call(_scaled_mul, (graphc.tensor(x0), graphc.tensor(w0))).graph
    text = format_graph(graph)
    (line,) = [s.strip() for s in text.splitlines() if s.strip().startswith("function ")]
    assert line.startswith('function ScaledMul[class="tests.test_custom_function_compiled:'
                           'ScaledMul", nodes=')
    assert 'saved=(%x, %w), ctx.alpha=1.5, ctx.mode="square"](%x, 1.5, %w, "square") -> (%' \
        in line
    parsed = verify(parse(text))
    assert format_graph(parsed) == text and parsed == graph
    (region,) = parsed.meta["functions"]
    assert region.cls is None and region.ctx == {"alpha": 1.5, "mode": "square"}
    seed = np.ones(x0.shape)
    for a, b in zip(run(derive_backward(parsed), x0, w0, seed),
                    run(derive_backward(graph), x0, w0, seed)):
        np.testing.assert_array_equal(a, b)  # the class is found in the registry


def test_non_differentiable_and_materialize_grads_round_trip(rng):
    x0, w0 = _x_and_w(rng)
    graph = trace_call(_relu_mask, (graphc.tensor(x0), graphc.tensor(w0))).graph
    text = format_graph(graph)
    assert "non_differentiable=(1,)" in text
    assert format_graph(parse(text)) == text


def test_a_local_function_class_is_refused_after_parsing_with_the_reason():
    class Local(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g

    graph = trace_call(lambda x: Local.apply(x), (graphc.ones(2),)).graph
    derive_backward(graph)  # in memory the class is known
    with pytest.raises(ParseError, match="Local .*defined inside a function"):
        parse(format_graph(graph))  # IR text names only registered, module-level classes


# ---- what still cannot work: clear errors ----------------------------------------------------
def test_a_backward_that_reads_tensor_values_is_refused_with_the_reason():
    w = graphc.ones(3, requires_grad=True)
    compiled = graphc.compile(lambda x: ItemBackward.apply(x * w), backend="interp")
    with pytest.raises(graphc.GraphcError, match=r"requires grad.*custom autograd.Function "
                       r"ItemBackward applied at test_custom_function_compiled.py:\d+: its "
                       r"backward reads tensor values.*graphc ops only"):
        compiled(graphc.ones(3))
    assert w.grad is None
    with graphc.no_grad():  # no backward needed: fine
        assert compiled(graphc.ones(3)).tolist() == [2.0, 2.0, 2.0]


def test_a_function_returning_its_input_unchanged_is_refused_with_what_to_do():
    graph = trace_call(lambda x: Passthrough.apply(x) * 2, (graphc.ones(2),)).graph
    with pytest.raises(AutodiffError, match=r"Passthrough.*returned unchanged.*x.clone\(\)"):
        derive_backward(graph)
