"""BCELoss/binary_cross_entropy, L1Loss, SmoothL1Loss, HuberLoss, KLDivLoss (and their
functionals) against PyTorch in float64: values, gradients, reductions, errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.errors import ArgumentError
from tests.torch_parity import check_parity, torch

TF = torch.nn.functional


@pytest.fixture
def rng(request):
    return np.random.default_rng(abs(hash(request.node.name)) % 2**32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(rng, reduction):
    p, t, w = rng.uniform(0.05, 0.95, (3, 4)), rng.uniform(0, 1, (3, 4)), rng.random((3, 4))
    check_parity(lambda a, b: F.binary_cross_entropy(a, b, graphc.tensor(w),
                                                     reduction=reduction),
                 lambda a, b: TF.binary_cross_entropy(a, b, torch.tensor(w),
                                                      reduction=reduction), p, t)
    check_parity(nn.BCELoss(reduction=reduction), torch.nn.BCELoss(reduction=reduction), p, t)
    edge = np.array([0.0, 1.0, 0.5])
    check_parity(F.binary_cross_entropy, TF.binary_cross_entropy, edge,
                 np.array([1.0, 0.0, 1.0]), grad=False)  # logs clamped at -100


def test_binary_cross_entropy_errors():
    with pytest.raises(ArgumentError, match="Using a target size"):  # a ValueError, as PyTorch
        F.binary_cross_entropy(graphc.full((3,), 0.5), graphc.ones(3, 1))
    with pytest.raises(ArgumentError, match="between 0 and 1"):
        F.binary_cross_entropy(graphc.tensor([1.5]), graphc.ones(1))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(rng, reduction):
    x = rng.standard_normal((2, 3, 4))
    y = x * 0.3 + rng.standard_normal((2, 3, 4)) * 0.5
    check_parity(nn.L1Loss(reduction=reduction), torch.nn.L1Loss(reduction=reduction), x, y)
    for beta in (0.0, 0.5, 1.0):
        check_parity(nn.SmoothL1Loss(reduction=reduction, beta=beta),
                     torch.nn.SmoothL1Loss(reduction=reduction, beta=beta), x, y)
    check_parity(nn.HuberLoss(reduction=reduction, delta=0.7),
                 torch.nn.HuberLoss(reduction=reduction, delta=0.7), x, y)
    with pytest.raises(ArgumentError, match="is not a valid value for reduction"):
        F.l1_loss(graphc.ones(2), graphc.ones(2), reduction="avg")


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none", "mean"])
def test_kl_div(rng, reduction):
    lp = np.log(rng.dirichlet(np.ones(4), 3))
    tg = rng.dirichlet(np.ones(4), 3)
    with pytest.warns(UserWarning) if reduction == "mean" else _nothing():
        check_parity(nn.KLDivLoss(reduction=reduction), torch.nn.KLDivLoss(reduction=reduction),
                     lp, tg)
    check_parity(F.kl_div, TF.kl_div, lp, np.log(tg), reduction=reduction, log_target=True)
    tz = tg.copy()
    tz[0, 1] = 0.0  # 0 log 0 is 0 (PyTorch's gradient there is nan; see the layer's docs)
    check_parity(F.kl_div, TF.kl_div, lp, tz, reduction=reduction, grad=False)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
