"""The seeds' PyTorch examples, run with only the imports changed (issue 2's acceptance).

Each program below is written exactly as for PyTorch, with `torch` bound to graphc; where
torch is installed, the same program runs on torch too and the results are compared.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import graphc
from tests.conftest import torch_or_skip


def _libs():
    import graphc.nn as gnn
    import graphc.nn.functional as gF

    yield "graphc", graphc, gnn, gF
    try:
        import torch
        import torch.nn as tnn
        import torch.nn.functional as tF
    except ImportError:
        return
    yield "torch", torch, tnn, tF


def _conv_model(nn, F):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 20, 5)
            self.conv2 = nn.Conv2d(20, 20, 5)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            return F.relu(self.conv2(x))

    return Model()


def test_module_with_conv1_conv2_and_relu_matches_torch():
    torch = torch_or_skip()
    import torch.nn as tnn
    import torch.nn.functional as tF

    import graphc.nn as gnn
    import graphc.nn.functional as gF

    g_model, t_model = _conv_model(gnn, gF), _conv_model(tnn, tF)
    assert repr(g_model) == repr(t_model)
    g_model.load_state_dict({k: v.detach().numpy() for k, v in t_model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    g_out, t_out = g_model(graphc.tensor(x)), t_model(torch.from_numpy(x))
    np.testing.assert_allclose(g_out.detach().numpy(), t_out.detach().numpy(), atol=1e-5)
    g_out.sum().backward()
    t_out.sum().backward()
    np.testing.assert_allclose(g_model.conv1.weight.grad.numpy(),
                               t_model.conv1.weight.grad.numpy(), rtol=1e-4, atol=1e-4)


def _linear_function(Function):
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

    return LinearFunction


def _mul_constant(Function):
    class MulConstant(Function):
        @staticmethod
        def forward(ctx, tensor, constant):
            ctx.constant = constant
            return tensor * constant

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output * ctx.constant, None

    return MulConstant


def test_linear_function_and_mul_constant_pass_gradcheck():
    torch = graphc
    from graphc.autograd import Function, gradcheck

    linear = _linear_function(Function).apply
    inputs = (torch.randn(20, 20, dtype=torch.double, requires_grad=True),
              torch.randn(30, 20, dtype=torch.double, requires_grad=True),
              torch.randn(30, dtype=torch.double, requires_grad=True))
    assert gradcheck(linear, inputs, eps=1e-6, atol=1e-4)
    mul_constant = _mul_constant(Function)
    x = torch.randn(3, 4, dtype=torch.double, requires_grad=True)
    assert gradcheck(lambda t: mul_constant.apply(t, 5.5), (x,))
    y = mul_constant.apply(x, 2.0)
    assert type(y.grad_fn).__name__ == "MulConstantBackward"


def test_requires_grad_propagation():
    torch = graphc
    x = torch.randn(5, 5)
    y = torch.randn(5, 5)
    z = torch.randn((5, 5), requires_grad=True)
    a = x + y
    assert not a.requires_grad
    b = a + z
    assert b.requires_grad
    with torch.no_grad():
        assert not (z * 2).requires_grad


@pytest.mark.parametrize("a,b,expected", [
    ((5, 7, 3), (5, 7, 3), (5, 7, 3)),
    ((5, 3, 4, 1), (3, 1, 1), (5, 3, 4, 1)),
    ((1,), (3, 1, 7), (3, 1, 7)),
    ((5, 1, 4, 1), (3, 1, 1), (5, 3, 4, 1)),
])
def test_broadcasting_examples(a, b, expected):
    for name, lib, _, _ in _libs():
        assert tuple((lib.empty(*a) + lib.empty(*b)).size()) == expected, name


@pytest.mark.parametrize("a,b,inplace", [((0,), (2, 2), False), ((5, 2, 4, 1), (3, 1, 1), False),
                                          ((1, 3, 1), (3, 1, 7), True)])
def test_broadcasting_errors_match_torch(a, b, inplace):
    messages = {}
    for name, lib, _, _ in _libs():
        x, y = lib.empty(*a), lib.empty(*b)
        with pytest.raises(RuntimeError) as err:
            x.add_(y) if inplace else x + y
        messages[name] = str(err.value)
    if "torch" in messages:
        assert messages["torch"] in messages["graphc"]


def test_module_registration_errors():
    import graphc.nn as nn

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(graphc.ones(2))

    with pytest.raises(AttributeError,
                       match=r"cannot assign parameters before Module.__init__\(\) call"):
        Early()
    layer = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"cannot assign 'graphc.FloatTensor' as parameter "
                                        r"'weight' \(graphc.nn.Parameter or None expected\)"):
        layer.weight = graphc.ones(2, 2)
    with pytest.raises(TypeError, match=r"cannot assign 'graphc.FloatTensor' object to "
                                        r"parameter 'w' \(graphc.nn.Parameter or None required\)"):
        layer.register_parameter("w", graphc.ones(2))
    non_leaf = nn.Parameter(graphc.zeros(2), requires_grad=False)
    non_leaf.add_(graphc.ones(2, requires_grad=True))  # now it has history: not a leaf
    with pytest.raises(ValueError, match=r"Cannot assign non-leaf Tensor to parameter 'w'"):
        layer.register_parameter("w", non_leaf)


def test_inplace_errors():
    torch = graphc
    a = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"a leaf Variable that requires grad"):
        a.mul_(2)
    b = a.sigmoid()
    b.mul_(2)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*SigmoidBackward0, "
                                           r"is at version 1; expected version 0"):
        b.sum().backward()


def test_small_training_loop_and_save_load():
    import graphc.nn as nn
    import graphc.optim as optim

    torch = graphc
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    x = torch.randn(32, 10)
    y = (x[:, 0] > 0).long()
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf)
    clone = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    clone.load_state_dict(state["model"])
    np.testing.assert_array_equal(clone(x).detach().numpy(), model(x).detach().numpy())
