"""Review of the ninth session's Winograd transforms (graphc.backends.cpu.winograd_transforms)
on small planes: 2x2, 4x4 and 8x8 images at ResNet's 256 and 512 channels (the input and
output transforms 16 tiles a vector, `planes_by_vectors` / `output_planes_by_vectors`),
padding 0, 1 and 2, partial vectors of images, a dynamic batch, strided input views; the
forward and both gradients against PyTorch, within rounding of a float64 run. (Odd planes,
3x3, 5x5 and 9x9, take no Winograd kernel; 1x1 none either.)"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends.cpu import conv_winograd, winograd_transforms  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

torch = pytest.importorskip("torch")
VECTOR_PATHS = ("planes_by_vectors", "output_planes_by_vectors")


@pytest.fixture
def taken(monkeypatch, tmp_path):
    """The names of the vector paths the lowering called."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # lowered here, not from a cache
    names = set()
    for name in VECTOR_PATHS:
        emit = getattr(winograd_transforms, name)

        def recording(*args, emit=emit, name=name):
            names.add(name)
            return emit(*args)

        monkeypatch.setattr(winograd_transforms, name, recording)
        if hasattr(conv_winograd, name):
            monkeypatch.setattr(conv_winograd, name, recording)
    return names


def _step(padding, view):
    def step(x, w):
        y = F.conv2d(view(x), w, padding=padding)
        (y * y.sin()).sum().backward()
        return y.detach(), x.grad, w.grad
    return step


def _torch(x, w, padding, view):
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = torch.nn.functional.conv2d(view(xt), wt, padding=padding)
    (y * y.sin()).sum().backward()
    return [y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()]


def _check(fn, step, x, w, padding, view):
    def run(f, dtype):
        return [r.numpy() for r in f(graphc.tensor(x.astype(dtype), requires_grad=True),
                                     graphc.tensor(w.astype(dtype), requires_grad=True))]
    for got, eager, reference in zip(run(fn, np.float32), run(step, np.float32),
                                     _torch(x, w, padding, view)):
        assert_rounding_within(got, eager, reference)


def _same(x):
    return x


CASES = [  # channels, images, plane, padding
    (256, 2, 8, 0), (256, 2, 8, 1), (256, 3, 8, 2), (512, 3, 4, 1), (256, 5, 4, 1),
    (256, 17, 2, 1), (64, 16, 2, 2)]


@pytest.mark.parametrize("channels,images,plane,padding", CASES)
def test_small_planes_against_pytorch(taken, channels, images, plane, padding):
    rng = np.random.default_rng(channels + images + plane + padding)
    x = rng.standard_normal((images, channels, plane, plane))
    w = rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)
    step = _step(padding, _same)
    _check(graphc.compile(step, backend="cpu"), step, x, w, padding, _same)
    if plane == 8 and padding < 2:  # the 256 stage of ResNet-18: both transforms in vectors
        assert taken == set(VECTOR_PATHS)


VIEWS = {"a slice of a larger plane": ((16, 64, 6, 6), lambda x: x[:, :, 1:5, 2:6]),
         "channels last": ((2, 8, 8, 64), lambda x: x.permute(0, 3, 1, 2)),
         "every other channel": ((4, 128, 4, 4), lambda x: x[:, ::2])}


@pytest.mark.parametrize("name", list(VIEWS))
def test_strided_input_views(taken, name):
    shape, view = VIEWS[name]
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal(shape)
    w = rng.standard_normal((64, 64, 3, 3)) / 24
    step = _step(1, view)
    _check(graphc.compile(step, backend="cpu"), step, x, w, 1, view)
    assert taken == set(VECTOR_PATHS)


def test_a_dynamic_batch_of_two_by_two_planes(taken):
    """16 images a vector, then 17 (the batch symbolic: a partial vector per call) and 5."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 64, 3, 3)) / 24
    step = _step(1, _same)
    compiled = graphc.compile(step, backend="cpu")
    for images in (16, 17, 5):
        _check(compiled, step, rng.standard_normal((images, 64, 2, 2)), w, 1, _same)
    assert taken == set(VECTOR_PATHS)
