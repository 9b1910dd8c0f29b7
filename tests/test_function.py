"""autograd.Function (seeds 001/004) and gradcheck/gradgradcheck.

The PyTorch documentation's LinearFunction and MulConstant run unchanged but for the import,
and are checked with gradcheck; the ctx API (save_for_backward / saved_tensors with version
checks, needs_input_grad, mark_dirty, mark_non_differentiable, set_materialize_grads), the
errors (wrong gradient count, bad gradient shape), double backward through a Function, and
gradcheck's report for a deliberately wrong backward."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.autograd import Function, gradcheck, gradgradcheck
from tests.conftest import torch_or_skip


# ---- the PyTorch docs' examples, verbatim but for the import ------------------------------
class LinearFunction(Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


class MulConstant(Function):
    @staticmethod
    def forward(ctx, tensor, constant):
        ctx.constant = constant
        return tensor * constant

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output * ctx.constant, None


class Exp(Function):
    @staticmethod
    def forward(ctx, i):
        result = i.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        (result,) = ctx.saved_tensors
        return grad_output * result


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


def _x64(rng, *shape, requires_grad=True):
    return graphc.tensor(rng.standard_normal(shape), dtype=graphc.float64,
                         requires_grad=requires_grad)


def test_linear_function_gradcheck(rng):
    x, w, b = _x64(rng, 4, 3), _x64(rng, 2, 3), _x64(rng, 2)
    assert gradcheck(LinearFunction.apply, (x, w, b), eps=1e-6, atol=1e-4)
    assert gradcheck(LinearFunction.apply, (x, w))
    w_const = _x64(rng, 2, 3, requires_grad=False)
    assert gradcheck(LinearFunction.apply, (x, w_const, b))


def test_linear_function_matches_torch(rng):
    torch = torch_or_skip()

    class TorchLinear(torch.autograd.Function):
        forward = LinearFunction.forward
        backward = LinearFunction.backward

    data = [rng.standard_normal(s) for s in ((4, 3), (2, 3), (2,))]
    g_args = [graphc.tensor(a, requires_grad=True) for a in data]
    t_args = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in data]
    g_out = LinearFunction.apply(*g_args)
    t_out = TorchLinear.apply(*t_args)
    assert type(g_out.grad_fn).__name__ == "LinearFunctionBackward"
    (g_out * g_out).sum().backward()
    (t_out * t_out).sum().backward()
    np.testing.assert_allclose(g_out.detach().numpy(), t_out.detach().numpy(), rtol=1e-5)
    for g, t in zip(g_args, t_args):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_mul_constant(rng):
    x = _x64(rng, 3)
    assert gradcheck(lambda t: MulConstant.apply(t, 2.5), (x,))
    y = MulConstant.apply(x, 3.0)
    assert repr(y).endswith("grad_fn=<MulConstantBackward>)")
    assert y.grad_fn.constant == 3.0  # the node is the ctx, as in PyTorch
    assert y.grad_fn.needs_input_grad == (True, False)
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0, 3.0]


def test_forward_runs_without_history_and_no_record_when_nothing_requires_grad(rng):
    x = _x64(rng, 3, requires_grad=False)
    assert not Exp.apply(x).requires_grad
    with graphc.no_grad():
        assert Exp.apply(_x64(rng, 3)).grad_fn is None

    class Peek(Function):
        @staticmethod
        def forward(ctx, t):
            assert not graphc.is_grad_enabled()
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    assert Peek.apply(_x64(rng, 2)).requires_grad


# ---- ctx API ---------------------------------------------------------------------------------
def test_saved_tensors_are_version_checked(rng):
    x = _x64(rng, 3)
    y = Exp.apply(x)
    y.add_(1)
    with pytest.raises(RuntimeError, match=r"one of the variables needed for gradient "
                                           r"computation has been modified by an inplace "
                                           r"operation: \[graphc.DoubleTensor \[3\]\], which is "
                                           r"output 0 of ExpBackward, is at version 1; expected "
                                           r"version 0 instead"):
        y.sum().backward()


def test_saved_input_changed_under_no_grad(rng):
    x = _x64(rng, 3)
    y = Cube.apply(x)
    with graphc.no_grad():
        x.mul_(2)
    with pytest.raises(RuntimeError, match=r"\[graphc.DoubleTensor \[3\]\] is at version 1; "
                                           r"expected version 0 instead"):
        y.sum().backward()


def test_wrong_number_of_gradients():
    class MyFn(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g

    a = graphc.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function MyFnBackward returned an incorrect number "
                                           r"of gradients \(expected 2, got 1\)"):
        MyFn.apply(a, a).sum().backward()


def test_extra_none_gradients_are_accepted_and_bad_shape_rejected():
    class Extra(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None, None

    class BadShape(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return graphc.ones(2)

    a = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    Extra.apply(a).sum().backward()
    assert a.grad.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RuntimeError, match=r"Function BadShapeBackward returned an invalid "
                                           r"gradient at index 0 - got \[2\] but expected shape "
                                           r"compatible with \[3\]"):
        BadShape.apply(a).sum().backward()


def test_non_tensor_arguments_get_none_and_needs_input_grad():
    seen = {}

    class Scale(Function):
        @staticmethod
        def forward(ctx, a, b, k, name):
            seen["forward"] = ctx.needs_input_grad
            ctx.save_for_backward(a, b)
            ctx.k = k
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            seen["backward"] = ctx.needs_input_grad
            ga = g * b * ctx.k if ctx.needs_input_grad[0] else None
            gb = g * a * ctx.k if ctx.needs_input_grad[1] else None
            return ga, gb, None, None

    a = graphc.tensor([1.0, 2.0], requires_grad=True)
    b = graphc.tensor([3.0, 4.0])
    Scale.apply(a, b, 2.0, "x").sum().backward()
    assert seen["forward"] == seen["backward"] == (True, False, False, False)
    assert a.grad.tolist() == [6.0, 8.0] and b.grad is None


def test_mark_dirty():
    class AddOne_(Function):
        @staticmethod
        def forward(ctx, a):
            a.add_(1)
            ctx.mark_dirty(a)
            return a

        @staticmethod
        def backward(ctx, g):
            return g

    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    z = AddOne_.apply(y)
    assert z is y and y.grad_fn.name() == "AddOne_Backward" and y._version == 2
    (z * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0] and y.tolist() == [2.0, 3.0]
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad has been used in "
                                           "an in-place operation"):
        AddOne_.apply(graphc.tensor([1.0], requires_grad=True))


def test_mark_non_differentiable_and_multiple_outputs():
    class SortLike(Function):
        @staticmethod
        def forward(ctx, a):
            mask = a > 0
            doubled = a * 2
            ctx.mark_non_differentiable(mask)
            return doubled, mask, 7

        @staticmethod
        def backward(ctx, g_doubled, g_mask, g_int):
            assert g_int is None
            return g_doubled * 2

    x = graphc.tensor([-1.0, 2.0], requires_grad=True)
    doubled, mask, k = SortLike.apply(x)
    assert k == 7 and not mask.requires_grad and doubled.requires_grad
    doubled.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_materialize_grads():
    class Two(Function):
        @staticmethod
        def forward(ctx, a, materialize):
            ctx.set_materialize_grads(materialize)
            return a * 2, a * 3

        @staticmethod
        def backward(ctx, g1, g2):
            out = g1 * 2 if g1 is not None else None
            if g2 is not None:
                out = g2 * 3 if out is None else out + g2 * 3
            return out, None

    for materialize in (True, False):
        x = graphc.tensor([1.0], requires_grad=True)
        a, _ = Two.apply(x, materialize)
        a.sum().backward()
        assert x.grad.tolist() == [2.0]


def test_returning_an_input_makes_a_new_node():
    class Identity(Function):
        @staticmethod
        def forward(ctx, a):
            return a

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = graphc.tensor([1.0], requires_grad=True)
    y = Identity.apply(x)
    assert y is not x and y.grad_fn is not None and x.is_leaf
    y.sum().backward()
    assert x.grad.tolist() == [2.0]


def test_setup_context_style():
    class Square(Function):
        @staticmethod
        def forward(a):
            return a * a

        @staticmethod
        def setup_context(ctx, inputs, output):
            (a,) = inputs
            ctx.save_for_backward(a)

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return 2 * a * g

    x = graphc.tensor([3.0], dtype=graphc.float64, requires_grad=True)
    assert gradcheck(Square.apply, (x,))
    Square.apply(x).sum().backward()
    assert x.grad.tolist() == [6.0]


def test_function_backward_twice_needs_retain_graph():
    x = graphc.tensor([1.0], requires_grad=True)
    y = Exp.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward()


def test_constructing_a_function_is_an_error():
    with pytest.raises(RuntimeError, match=r"Exp.apply\(...\)"):
        Exp()


# ---- double backward and gradgradcheck ------------------------------------------------
def test_double_backward_through_function(rng):
    x = _x64(rng, 3)
    y = Cube.apply(x)
    (g,) = graphc.autograd.grad(y.sum(), x, create_graph=True)
    np.testing.assert_allclose(g.detach().numpy(), 3 * x.detach().numpy() ** 2)
    (gg,) = graphc.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), 6 * x.detach().numpy())
    assert gradgradcheck(Cube.apply, (x,))
    assert gradgradcheck(LinearFunction.apply, (_x64(rng, 2, 3), _x64(rng, 2, 3), _x64(rng, 2)))


def test_gradgradcheck_plain_ops(rng):
    x = graphc.tensor(rng.uniform(0.5, 2.0, 4), dtype=graphc.float64, requires_grad=True)
    assert gradcheck(lambda a: a.exp() * a.log(), (x,))
    assert gradgradcheck(lambda a: a.exp() * a.sin() / a, (x,))
    assert gradgradcheck(lambda a: (a * a).sum(), (x,), graphc.tensor(1.5, dtype=graphc.float64))


# ---- gradcheck failure report ---------------------------------------------------------
class WrongCube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2 * x * x  # wrong: should be 3 x^2


def test_gradcheck_reports_both_jacobians():
    x = graphc.tensor([0.5, 1.0, -2.0], dtype=graphc.float64, requires_grad=True)
    with pytest.raises(graphc.autograd.GradcheckError) as info:
        gradcheck(WrongCube.apply, (x,))
    text = str(info.value)
    assert text.startswith("Jacobian mismatch for output 0 with respect to input 0,\n")
    assert "numerical:tensor([[ 0.7500,  0.0000,  0.0000],\n" in text
    assert "analytical:tensor([[0.5000, 0.0000, 0.0000],\n" in text
    assert "d out[2] / d in[2]: numerical 12, analytical 8" in text
    assert isinstance(info.value, RuntimeError)
    assert gradcheck(WrongCube.apply, (x,), raise_exception=False) is False


def test_gradgradcheck_catches_wrong_second_derivative():
    class WrongDouble(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * (x * x).detach()  # right first derivative, no second one

    x = graphc.tensor([0.5, 1.0], dtype=graphc.float64, requires_grad=True)
    assert gradcheck(WrongDouble.apply, (x,))
    assert gradgradcheck(WrongDouble.apply, (x,), raise_exception=False) is False


def test_gradcheck_report_matches_torch_layout():
    torch = torch_or_skip()

    class TorchWrongCube(torch.autograd.Function):
        forward = WrongCube.forward
        backward = WrongCube.backward

    x = graphc.tensor([0.5, 1.0, -2.0], dtype=graphc.float64, requires_grad=True)
    tx = torch.tensor([0.5, 1.0, -2.0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(graphc.autograd.GradcheckError) as ours:
        gradcheck(WrongCube.apply, (x,))
    with pytest.raises(RuntimeError) as theirs:
        torch.autograd.gradcheck(TorchWrongCube.apply, (tx,))
    expected = str(theirs.value).replace("torch", "graphc").replace("-0.0000", " 0.0000")
    head = expected.split("analytical:")[0]
    assert str(ours.value).startswith(head)


def test_gradcheck_float32_warns():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    with pytest.warns(UserWarning, match="not a double precision"):
        gradcheck(lambda a: a * 2, (x,), eps=1e-2, atol=1e-2)
