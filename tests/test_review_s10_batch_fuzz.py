"""Review of the tenth session's batch-per-call and convolution work, as seeded fuzzers:

- generated GEMMs with a batch known per call (graphc.backends.cpu.small_gemm,
  small_gemm_columns, traced_sizes): a Linear + ReLU training step traced at one batch and
  called at others (1, primes, around the tiles' rows, larger than the traced one, 2-d and
  3-d inputs, Fortran-ordered ones), against float64 numpy;
- convolutions of odd shapes (groups, stride 2 and 3 on odd planes, padding up to 2,
  dilation, 1x1 planes) forward and both gradients on cpu and on cuda (the emulation: the
  weight gradient's explicit columns in several passes, the strided input gradient),
  against PyTorch in float64;
- a small CNN training step (a stride-2 convolution, batch norm, a grouped convolution,
  pooling) with a batch known per call (graphc.backends.cpu.conv_threads) on cpu and cuda,
  against eager graphc over the same batches.

Found nothing wrong; they guard the code.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from tests.conftest import sgd_training_step

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _linear_step(x, w, b):
    y = (x @ w.t() + b).relu()
    (y * y).sum().backward()
    return y.detach(), w.grad, b.grad, x.grad


def _linear_reference(x, w, b):
    """y, dw, db, dx of `_linear_step` in float64 numpy."""
    rows = x.astype(np.float64).reshape(-1, x.shape[-1])
    z = rows @ w.astype(np.float64).T + b
    y = np.maximum(z, 0)
    dy = 2 * y * (z > 0)
    dx = dy @ w.astype(np.float64)
    return [y.reshape(*x.shape[:-1], -1), dy.T @ rows, dy.sum(0), dx.reshape(x.shape)]


LINEAR_SIZES = {2: ((3, 16, 17, 48, 100, 257, 784), (1, 4, 10, 16, 33, 64, 256)),
                3: ((64, 128, 384), (64, 256, 768))}
BATCHES = {2: (1, 2, 5, 7, 15, 16, 17, 31, 33, 63, 65, 97, 129, 257, 300),
           3: (1, 2, 3, 5, 7, 9, 13, 17)}


@pytest.mark.parametrize("rank", [2, 3])
def test_linear_steps_with_a_batch_known_per_call_match_float64(rng, rank):
    for case in range(3):
        features_in, features_out = (int(rng.choice(s)) for s in LINEAR_SIZES[rank])
        tokens = (int(rng.choice([8, 33])),) if rank == 3 else ()
        traced = int(rng.choice([8, 9, 64])) if rank == 2 else int(rng.choice([2, 4]))
        w = (rng.standard_normal((features_out, features_in)) / np.sqrt(features_in)).astype(
            np.float32)
        b = rng.standard_normal(features_out).astype(np.float32)
        step = graphc.compile(_linear_step, backend="cpu")
        for n in [traced, *(int(v) for v in rng.choice(BATCHES[rank], 4, replace=False))]:
            x = rng.standard_normal((n, *tokens, features_in)).astype(np.float32)
            if rank == 2 and rng.integers(2):
                x = np.asfortranarray(x)
            tx = graphc.tensor(x, requires_grad=True)
            if n == traced:
                graphc.mark_dynamic(tx, 0)
            got = step(tx, graphc.tensor(w, requires_grad=True),
                       graphc.tensor(b, requires_grad=True))
            for name, g, want in zip(("y", "dw", "db", "dx"), got,
                                     _linear_reference(x, w, b)):
                scale = max(1.0, float(np.abs(want).max()))
                np.testing.assert_allclose(
                    g.numpy(), want, rtol=2e-4, atol=2e-4 * scale,
                    err_msg=f"{name}: case {case}, {features_in} -> {features_out}, tokens "
                            f"{tokens}, traced at {traced}, called at {n}")


def _conv_case(rng):
    groups = int(rng.choice([1, 1, 2, 4]))
    c_in = groups * int(rng.choice([1, 2, 3, 16]))
    c_out = groups * int(rng.choice([1, 2, 5, 16]))
    k = int(rng.choice([1, 2, 3, 5]))
    stride, padding, dilation = (int(rng.choice(s)) for s in ([1, 2, 3], [0, 1, 2], [1, 1, 2]))
    h, w = int(rng.integers(1, 18)), int(rng.integers(1, 18))
    n = int(rng.choice([1, 2, 3]))
    return dict(shape=(n, c_in, h, w), weight=(c_out, c_in // groups, k, k), stride=stride,
                padding=padding, dilation=dilation, groups=groups)


def _conv_valid(case) -> bool:
    reach = case["dilation"] * (case["weight"][-1] - 1)
    return all(d + 2 * case["padding"] - reach - 1 >= 0 for d in case["shape"][-2:])


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_convolutions_of_odd_shapes_forward_and_gradients_match_pytorch_float64(
        rng, backend, request):
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    if backend == "cuda":
        request.getfixturevalue("cuda_runtime_built")
        request.getfixturevalue("cuda_backend")
    checked = 0
    while checked < 6:
        case = _conv_case(rng)
        if not _conv_valid(case):
            continue
        checked += 1
        attrs = {k: case[k] for k in ("stride", "padding", "dilation", "groups")}
        fan_in = int(np.prod(case["weight"][1:]))
        arrays = [rng.standard_normal(case["shape"]).astype(np.float32),
                  (rng.standard_normal(case["weight"]) / np.sqrt(fan_in)).astype(np.float32),
                  rng.standard_normal(case["weight"][0]).astype(np.float32)]
        tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays)
        ty = torch.nn.functional.conv2d(tx, tw, tb, **attrs)
        (ty * ty.sin()).sum().backward()
        want = [ty.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()]

        def step(x, w, b, attrs=attrs):
            y = F.conv2d(x, w, b, **attrs)
            (y * y.sin()).sum().backward()
            return y.detach(), x.grad, w.grad, b.grad

        got = graphc.compile(step, backend=backend)(
            *(graphc.tensor(a, requires_grad=True) for a in arrays))
        for name, g, r in zip(("y", "dx", "dw", "db"), got, want):
            scale = max(1.0, float(np.abs(r).max()))
            np.testing.assert_allclose(g.numpy(), r, rtol=1e-3, atol=1e-4 * scale,
                                       err_msg=f"{name} of {case}")


def _cnn():
    return sgd_training_step(lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1, groups=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 4 * 4, 5)))


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_cnn_step_with_a_batch_known_per_call_matches_eager(rng, backend, request):
    if backend == "cuda":
        request.getfixturevalue("cuda_runtime_built")
        request.getfixturevalue("cuda_backend")
    model, step = _cnn()
    ref_model, ref_step = _cnn()
    compiled = graphc.compile(step, backend=backend)
    plane = int(rng.choice([15, 16, 17]))
    batches = [int(n) for n in rng.choice([2, 3, 5, 7, 13, 16, 17, 33, 65], 5)]
    for n in batches:
        x = graphc.tensor(rng.standard_normal((n, 3, plane, plane)).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 5, n))
        np.testing.assert_allclose(compiled(x, y).item(), ref_step(x, y).item(), rtol=1e-3,
                                   atol=1e-4, err_msg=f"batches {batches}, at {n}")
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-3,
                                   atol=1e-4, err_msg=name)
    for (name, b), r in zip(model.named_buffers(), ref_model.buffers()):
        np.testing.assert_allclose(b.numpy(), r.numpy(), rtol=1e-3, atol=1e-4, err_msg=name)
