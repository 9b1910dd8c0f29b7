"""Review of the convolution kernels of the eleventh and twelfth sessions on inputs that are
views made inside the compiled graph (the kernels read them through their strides, or
decline them): a slice of the channels (images further apart than one image), of the rows or
columns (rows longer than the plane's), a transposed plane, a double permute. Each view
feeds a 3x3 stride-1 (Winograd), a 3x3 stride-2 (polyphase), a 1x1 stride-2 (h3's
conv_pointwise) or an odd-sized convolution.

Each case compiles the output and both gradients (the input's reaches the view's backward)
and checks every result within 2x eager graphc's distance from PyTorch 2.13 in float64
(docs/performance.md, "Rounding"), on one thread and on two.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_review_s12_resnet_steps_fuzz import fixed_threads  # noqa: E402

resolve_blas()
EXTRA_CHANNELS = 5


def _channel_slice(x, c):
    return x[:, 3:3 + c]


def _row_slice(x, c):
    return x[:, :c, 1:, :]


def _column_slice(x, c):
    return x[:, :c, :, 1:]


def _transposed(x, c):
    return x[:, :c].transpose(2, 3)


def _permuted_twice(x, c):
    return x[:, :c].permute(1, 0, 2, 3).permute(1, 0, 2, 3)


VIEWS = {"channel slice": _channel_slice, "row slice": _row_slice,
         "column slice": _column_slice, "transposed": _transposed,
         "permuted twice": _permuted_twice}
# (n, c, o, the planes' side before the view, kernel, stride, padding)
CONVOLUTIONS = [(2, 16, 32, 17, 3, 1, 1), (3, 32, 32, 17, 3, 2, 1), (2, 16, 32, 17, 1, 2, 0),
                (2, 32, 16, 33, 3, 2, 1), (1, 16, 16, 9, 3, 1, 1)]


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _step(functional, view, c, stride, padding):
    def step(x, w, q):
        x.grad = None
        w.grad = None
        y = functional.conv2d(view(x, c), w, stride=stride, padding=padding)
        z = y.reshape(y.shape[0], -1) @ q
        (z * z).sum().backward()
        return [y.detach(), x.grad, w.grad]

    return step


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_convolutions_of_views_made_in_the_graph_within_rounding(view, monkeypatch):
    rng = np.random.default_rng(sorted(VIEWS).index(view))
    picked = rng.choice(len(CONVOLUTIONS), 3, replace=False)
    for n, c, o, side, k, stride, padding in (CONVOLUTIONS[i] for i in picked):
        what = f"{view}: x[{n},{c + EXTRA_CHANNELS},{side},{side}] -> {o}, {k}x{k} " \
               f"stride {stride} padding {padding}"
        x = rng.standard_normal((n, c + EXTRA_CHANNELS, side, side)).astype(np.float32)
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        y_shape = torch.nn.functional.conv2d(VIEWS[view](torch.tensor(x), c), torch.tensor(w),
                                             stride=stride, padding=padding).shape
        features = int(np.prod(y_shape[1:]))
        q = (rng.standard_normal((features, 3)) / np.sqrt(features)).astype(np.float32)

        def ours():
            return graphc.tensor(x).requires_grad_(), graphc.tensor(w).requires_grad_(), \
                graphc.tensor(q)

        step = _step(F, VIEWS[view], c, stride, padding)
        eager = [t.numpy() for t in step(*ours())]
        want = [t.detach().numpy() for t in _step(
            torch.nn.functional, VIEWS[view], c, stride, padding)(
            torch.tensor(x).double().requires_grad_(), torch.tensor(w).double().requires_grad_(),
            torch.tensor(q).double())]
        for count in (1, 2):
            fixed_threads(monkeypatch, count)
            got = [t.numpy().copy() for t in graphc.compile(step, backend="cpu")(*ours())]
            for name, g, e, r in zip(("y", "x.grad", "w.grad"), got, eager, want):
                try:
                    assert_rounding_within(g, e, r)
                except AssertionError as error:
                    raise AssertionError(f"{what}: {name}, {count} thread(s): {error}") \
                        from None
