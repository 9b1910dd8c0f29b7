"""Tensor.where(condition, other) means where(condition, self, other), as in PyTorch."""

import numpy as np
import pytest

import graphc


def test_the_method_takes_the_tensor_as_the_value_not_the_condition():
    x = graphc.tensor([1.0, 2.0, 3.0])
    cond = graphc.tensor([True, False, True])
    assert x.where(cond, graphc.tensor(0.0)).tolist() == [1.0, 0.0, 3.0]


def test_it_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)).astype(np.float32)
    cond = rng.standard_normal((3, 1)) > 0
    got = graphc.tensor(a).where(graphc.tensor(cond), graphc.tensor(b)).numpy()
    want = torch.tensor(a).where(torch.tensor(cond), torch.tensor(b)).numpy()
    np.testing.assert_array_equal(got, want)
