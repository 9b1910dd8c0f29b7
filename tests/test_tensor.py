"""The Tensor class against PyTorch: creation and dtype inference, memory sharing, conversions,
metadata, requires_grad rules, detach/.data, `.grad` assignment, and `repr` character for
character (PyTorch's text with `torch` replaced by `graphc`)."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest

import graphc
from tests.conftest import torch_or_skip


def _torch_str(t) -> str:
    return str(t).replace("torch", "graphc")


# ---- creation and dtype inference ----------------------------------------------------------
@pytest.mark.parametrize("data, dtype", [
    (1.5, graphc.float32), (1, graphc.int64), (True, graphc.bool),
    ([1, 2.5], graphc.float32), ([True, 2], graphc.int64), ([[1, 2], [3, 4]], graphc.int64),
    (np.array([1.0]), graphc.float64), (np.array([1.0], dtype=np.float32), graphc.float32),
    (np.float64(2.0), graphc.float64), ([np.float64(1.0), 2.0], graphc.float64),
    (np.array([1, 2]), graphc.int64), (np.array([True]), graphc.bool),
    ([], graphc.float32),
])
def test_tensor_dtype_inference(data, dtype):
    assert graphc.tensor(data).dtype is dtype


def test_dtype_inference_matches_torch():
    torch = torch_or_skip()
    cases = [1.5, 1, True, [1, 2.5], [True, 2], np.array([1.0]), np.float64(2.0), [[1.0]],
             np.array([1.0], dtype=np.float32), [], [[True]]]
    for data in cases:
        assert repr(graphc.tensor(data).dtype) == repr(torch.tensor(data).dtype).replace(
            "torch", "graphc"), data


def test_tensor_of_tensors_keeps_their_dtype():
    t = graphc.tensor([graphc.tensor(1.0, dtype=graphc.float64), graphc.tensor(2.0,
                                                                              dtype=graphc.float64)])
    assert t.dtype is graphc.float64 and t.tolist() == [1.0, 2.0]


def test_tensor_copies_and_from_numpy_shares():
    a = np.array([1.0, 2.0])
    copied, shared, as_t = graphc.tensor(a), graphc.from_numpy(a), graphc.as_tensor(a)
    a[0] = 7.0
    assert copied.tolist() == [1.0, 2.0]
    assert shared.tolist() == [7.0, 2.0] and as_t.tolist() == [7.0, 2.0]
    assert shared.dtype is graphc.float64
    shared.numpy()[1] = -1.0  # .numpy() shares too, both ways
    assert a[1] == -1.0


def test_as_tensor_returns_same_tensor_or_converts():
    t = graphc.tensor([1.0, 2.0])
    assert graphc.as_tensor(t) is t
    assert graphc.as_tensor(t, dtype=graphc.float64).dtype is graphc.float64
    assert graphc.as_tensor([1, 2]).dtype is graphc.int64
    assert graphc.as_tensor(np.array([1, 2], dtype=np.int32)).dtype is graphc.int64


def test_creation_errors():
    with pytest.raises(TypeError, match="expected np.ndarray"):
        graphc.from_numpy([1, 2])
    with pytest.raises(ValueError, match=r"expected sequence of length 2 at dim 1 \(got 1\)"):
        graphc.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="invalid data type 'str'"):
        graphc.tensor(["a"])
    with pytest.raises(RuntimeError, match="Only Tensors of floating point and complex dtype "
                                           "can require gradients"):
        graphc.tensor([1, 2], requires_grad=True)
    with pytest.raises(ValueError, match="CPU"):
        graphc.tensor([1.0], device="cuda")


def test_tensor_constructor_like_torch_Tensor():
    assert graphc.Tensor([1, 2]).dtype is graphc.float32
    assert graphc.Tensor(2, 3).shape == (2, 3)
    assert graphc.Tensor().shape == (0,)


# ---- conversions -----------------------------------------------------------------------------
def test_numpy_refuses_requires_grad_with_pytorch_wording():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad. "
                                           r"Use tensor.detach\(\).numpy\(\) instead."):
        x.numpy()
    assert x.detach().numpy().tolist() == [1.0, 2.0]
    assert x.numpy(force=True).tolist() == [1.0, 2.0]


def test_item_tolist_and_python_numbers():
    assert graphc.tensor([2.5]).item() == 2.5 and isinstance(graphc.tensor(3).item(), int)
    assert graphc.tensor(True).item() is True
    assert graphc.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert graphc.tensor(1.5).tolist() == 1.5
    assert float(graphc.tensor([2.0])) == 2.0 and int(graphc.tensor(2.7)) == 2
    assert f"{graphc.tensor(3.14159):.2f}" == "3.14"
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to "
                                           "Scalar"):
        graphc.tensor([1.0, 2.0]).item()
    with pytest.raises(ValueError, match="only one element tensors can be converted"):
        float(graphc.tensor([1.0, 2.0]))
    with pytest.raises(RuntimeError, match="Boolean value of Tensor with more than one value is "
                                           "ambiguous"):
        bool(graphc.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(graphc.tensor(1.0))


@pytest.mark.parametrize("method, dtype", [("float", graphc.float32), ("double", graphc.float64),
                                           ("long", graphc.int64), ("bool", graphc.bool)])
def test_dtype_conversion_methods(method, dtype):
    t = getattr(graphc.tensor([1.7, -2.5, 0.0]), method)()
    assert t.dtype is dtype
    torch = torch_or_skip()
    ref = getattr(torch.tensor([1.7, -2.5, 0.0]), method)()
    assert t.tolist() == pytest.approx(ref.tolist())


def test_to():
    x = graphc.tensor([1, 2])
    assert x.to(graphc.float64).dtype is graphc.float64
    assert x.to(dtype=graphc.float32).dtype is graphc.float32
    assert x.to("cpu") is x and x.to(x.device) is x
    assert x.to(graphc.tensor([1.0])).dtype is graphc.float32
    y = graphc.tensor([1.0], requires_grad=True)
    z = y.to(graphc.float64)
    assert z.requires_grad and z.grad_fn.name() == "ToCopyBackward0"
    z.backward(graphc.ones(1, dtype=graphc.float64))
    assert y.grad.dtype is graphc.float32 and y.grad.tolist() == [1.0]


# ---- metadata ----------------------------------------------------------------------------------
def test_shape_size_dim_numel():
    t = graphc.zeros(2, 3)
    assert t.shape == (2, 3) and t.size() == (2, 3) and t.size(1) == 3 and t.size(-2) == 2
    assert repr(t.shape) == "graphc.Size([2, 3])"
    assert t.dim() == 2 and t.ndim == 2 and t.numel() == 6 and t.shape.numel() == 6
    assert graphc.tensor(1.0).shape == () and graphc.tensor(1.0).dim() == 0
    assert t.is_floating_point() and not graphc.tensor([1]).is_floating_point()
    assert t.device == "cpu" and repr(t.device) == "device(type='cpu')"
    assert t.type_name() == "graphc.FloatTensor"
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of "
                                         r"\[-2, 1\], but got 2\)"):
        t.size(2)
    with pytest.raises(IndexError, match="Dimension specified as 0 but tensor has no dimensions"):
        graphc.tensor(1.0).size(0)


# ---- requires_grad rules, leaves, detach, .data ------------------------------------------
def test_requires_grad_only_floating_and_only_leaves():
    with pytest.raises(RuntimeError, match="only Tensors of floating point dtype can require "
                                           "gradients"):
        graphc.tensor([1, 2]).requires_grad_()
    with pytest.raises(RuntimeError, match="only Tensors of floating point and complex dtype"):
        graphc.tensor([True]).requires_grad = True
    x = graphc.tensor([1.0], requires_grad=True)
    y = x * 2
    assert not y.is_leaf and x.is_leaf and (graphc.tensor([1.0]) * 2).is_leaf
    y.requires_grad_(True)  # already requires grad: allowed, as PyTorch
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf "
                                           "variables."):
        y.requires_grad = False
    x.requires_grad_(False)
    assert not x.requires_grad and x.is_leaf


def test_requires_grad_propagation():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    c = graphc.tensor([3.0, 4.0])
    assert (x * c).requires_grad and not (c * c).requires_grad
    assert not (x > 1.0).requires_grad  # bool results never require grad
    with graphc.no_grad():
        assert not (x * c).requires_grad


def test_detach_shares_memory_and_version():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d.is_leaf and d.grad_fn is None
    d.add_(1)
    assert x.tolist() == [2.0, 3.0] and x._version == 1
    y = x * 2
    y.detach_()
    assert not y.requires_grad and y.grad_fn is None


def test_data_is_invisible_to_autograd():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * x
    x.data.mul_(2)  # not seen by the version counter, exactly as PyTorch
    assert x._version == 0
    y.backward(graphc.ones(3))
    assert x.grad.tolist() == [4.0, 8.0, 12.0]
    x.data = graphc.tensor([0.5, 0.5, 0.5])
    assert x.tolist() == [0.5, 0.5, 0.5] and x.requires_grad


def test_grad_assignment_is_checked():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x.grad = graphc.ones(3)
    x.grad = None
    with pytest.raises(RuntimeError, match=r"attempting to assign a gradient of size '\[2\]' to "
                                           r"a tensor of size '\[3\]'"):
        x.grad = graphc.ones(2)
    with pytest.raises(RuntimeError, match="attempting to assign a gradient with dtype"):
        x.grad = graphc.ones(3, dtype=graphc.float64)
    with pytest.raises(TypeError, match="assigned grad expected to be a Tensor or None"):
        x.grad = np.ones(3)


def test_non_leaf_grad_access_warns():
    x = graphc.tensor([1.0], requires_grad=True)
    y = x * 2
    with pytest.warns(UserWarning, match="is not a leaf Tensor is being accessed"):
        assert y.grad is None
    y.retain_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert y.grad is None


def test_copy_pickle():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    x.grad = graphc.tensor([0.5, 0.5])
    c = copy.deepcopy(x)
    assert c.tolist() == [1.0, 2.0] and c.requires_grad and c.grad.tolist() == [0.5, 0.5]
    c.detach().add_(1)
    assert x.tolist() == [1.0, 2.0]
    p = pickle.loads(pickle.dumps(x))
    assert p.tolist() == [1.0, 2.0] and p.requires_grad
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


def test_operators_with_foreign_operands():
    x = graphc.tensor([1.0, 2.0])
    assert (x == None) is False  # noqa: E711 (the operator itself is under test)
    assert (x != None) is True  # noqa: E711
    assert (x + np.array([1.0, 1.0])).tolist() == [2.0, 3.0]
    assert (abs(-x)).tolist() == [1.0, 2.0]
    with pytest.raises(TypeError):
        x + "a"


# ---- repr ------------------------------------------------------------------------------------
REPR_CASES = [
    [1.0, 2.0, 3.0], [1.5, 2.25, -3.0], [0.1, 100.0, 1e-5], [1e10, 1.0], [[1.0, 2.0], [3.0, 4.0]],
    [[1.5, -2.0], [3.0, 4.123456]], [1, 2, 3], [[1, 2], [3, -4]], [True, False], 2.5, 3, 1.0,
    True, -0.5, [], [[]], [0.0, -0.0], [1e-3, 1.0], [123456.0, 1.0], [1e-5, 1e-6],
    [float("nan"), 1.0], [float("inf"), 1.5], [float("-inf"), 2.0], [-1.0, -2.0],
    [1234.5678], [12345.678], [1e8], [1e7, 1.0], [100.5, 0.01], list(range(30)),
    [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]], np.arange(2000.0).tolist(),
    np.linspace(-1, 1, 13).tolist(), [0.0], [1e16], [99999.5], [0.001, 0.002],
    np.arange(1200).reshape(40, 30).tolist(), (np.arange(1200.0).reshape(30, 40) / 7).tolist(),
]


@pytest.mark.parametrize("data", REPR_CASES, ids=[str(i) for i in range(len(REPR_CASES))])
@pytest.mark.parametrize("dtype", [None, "float64"])
def test_repr_matches_torch(data, dtype):
    torch = torch_or_skip()
    t = torch.tensor(data) if dtype is None else torch.tensor(data, dtype=torch.float64)
    g = graphc.tensor(data, dtype=dtype)
    assert repr(g) == _torch_str(t)


def test_repr_autograd_suffixes_match_torch():
    torch = torch_or_skip()
    for data in ([1.0, 2.0], 2.0, np.arange(100.0).tolist()):
        t = torch.tensor(data, requires_grad=True)
        g = graphc.tensor(data, requires_grad=True)
        assert repr(g) == _torch_str(t)
        assert repr(g * 2) == _torch_str(t * 2)
        assert repr(g.exp()) == _torch_str(t.exp())
        assert repr(g.double()) == _torch_str(t.double())
    assert repr(graphc.zeros(0, 3, dtype=graphc.int64)) == _torch_str(
        torch.zeros(0, 3, dtype=torch.int64))


def test_repr_without_torch():
    assert repr(graphc.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(graphc.tensor([1.5, -2.0])) == "tensor([ 1.5000, -2.0000])"
    assert repr(graphc.tensor([1, 2], dtype=graphc.float64)) == \
        "tensor([1., 2.], dtype=graphc.float64)"
    x = graphc.tensor([1.0], requires_grad=True)
    assert repr(x) == "tensor([1.], requires_grad=True)"
    assert repr(x * 2) == "tensor([2.], grad_fn=<MulBackward0>)"
    assert repr(graphc.tensor([])) == "tensor([])"
    assert repr(graphc.tensor([[True, False]])) == "tensor([[ True, False]])"


def test_methods_are_written_out_in_the_mixins():
    """Every op module's TENSOR_METHODS entry is a method defined in a mixin's class body
    (graphc.tensor_methods, graphc.tensor_shape), not attached at import, so grep, IDEs and
    type checkers find it; each has a docstring."""
    import inspect

    from graphc.ops import OP_MODULES
    from graphc.tensor_methods import TensorMethods
    from graphc.tensor_shape import ShapeMethods

    sources = inspect.getsource(TensorMethods) + inspect.getsource(ShapeMethods)
    names = {n for m in OP_MODULES for n in getattr(m, "TENSOR_METHODS", {})}
    assert names
    for name in sorted(names):
        assert f"def {name}(" in sources, f"Tensor.{name} is not written out"
        member = inspect.getattr_static(graphc.Tensor, name)
        doc = (member.fget if isinstance(member, property) else member).__doc__
        assert doc and doc.strip(), f"Tensor.{name} has no docstring"
