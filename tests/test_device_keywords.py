"""`device=` on every creation function (issue 12): "cpu" (a string or graphc.device) is
accepted, as in PyTorch programs written `device = "cpu"`; another device is refused with an
ArgumentError that says to compile for a GPU instead (eager tensors live on the CPU)."""

from __future__ import annotations

import pytest

import graphc
from graphc.errors import ArgumentError

CREATIONS = {
    "arange": lambda d: graphc.arange(3, device=d),
    "empty": lambda d: graphc.empty(2, device=d),
    "zeros": lambda d: graphc.zeros(2, device=d),
    "ones": lambda d: graphc.ones(2, device=d),
    "full": lambda d: graphc.full((2,), 1.0, device=d),
    "full_like": lambda d: graphc.full_like(graphc.ones(2), 3.0, device=d),
    "zeros_like": lambda d: graphc.zeros_like(graphc.ones(2), device=d),
    "rand": lambda d: graphc.rand(2, device=d),
    "randn": lambda d: graphc.randn(2, device=d),
    "rand_like": lambda d: graphc.rand_like(graphc.ones(2), device=d),
    "randn_like": lambda d: graphc.randn_like(graphc.ones(2), device=d),
    "randint": lambda d: graphc.randint(0, 5, (2,), device=d),
    "randperm": lambda d: graphc.randperm(4, device=d),
    "normal": lambda d: graphc.normal(0.0, 1.0, (2,), device=d),
    "tensor": lambda d: graphc.tensor([1.0], device=d),
    "new_zeros": lambda d: graphc.ones(1).new_zeros(2, device=d),
    "new_full": lambda d: graphc.ones(1).new_full((2,), 1.0, device=d),
}


@pytest.mark.parametrize("name", sorted(CREATIONS))
def test_cpu_is_accepted_and_cuda_refused(name):
    make = CREATIONS[name]
    assert make("cpu").device == graphc.tensor(0.0).device
    assert make(None).device.type == "cpu"
    with pytest.raises(ArgumentError, match="live on the CPU"):
        make("cuda")


def test_to_accepts_cpu_and_dtype_keywords():
    x = graphc.arange(3, device="cpu", dtype=graphc.float64)
    assert x.to("cpu") is x and x.to(device="cpu", dtype=graphc.float32).dtype is graphc.float32
