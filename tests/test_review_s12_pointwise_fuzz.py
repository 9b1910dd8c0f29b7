"""Review of the twelfth session's strided 1x1 convolutions (h3: graphc.backends.cpu.
conv_pointwise, ResNet's downsample shortcuts), as a seeded fuzzer over what its own tests
leave out: strides 2 to 4, output rows of 1 to 32 positions (a whole vector, or 16 / W_out
rows shuffled into one), batches of 1 to 7 (blocks of images that do not divide the batch),
channel counts on and off 16 (the weight gradient's own condition), a bias, planes the kernel
declines (an odd extra row or column, padding, a non-contiguous input), on one thread and two.

Each case compiles the output and both gradients of `sum(conv2d(x, w, b, stride) * g)` (g
fixed: the gradient flowing in is exact) and checks: 1 and 2 threads give the same bits, or,
for the weight gradient whose images conv_threads splits into shares, both within rounding;
every result within 2x eager graphc's distance from PyTorch 2.13 in float64 (docs/
performance.md, "Rounding"). On main before the kernel landed the same cases run conv.py's
im2col path.
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


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _cases(seed: int, count: int):
    """(n, c, o, h, w, stride, bias, layout) of planes the kernel takes (H = s * H_out,
    W = s * W_out, P a multiple of 16, W_out dividing 16 or a multiple of it) and, every
    third case, one it declines."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        s = int(rng.choice([2, 2, 3, 4]))
        wo = int(rng.choice([w for w in (1, 2, 4, 8, 16, 32) if s * w <= 64]))
        ho = int(rng.choice([h for h in (1, 2, 4, 8, 16, 32) if (h * wo) % 16 == 0
                             and h * s <= 64]))
        h, w = s * ho, s * wo
        layout = "contiguous"
        if i % 3 == 2:  # declined: an extra row or column, or a transposed input
            kind = int(rng.integers(3))
            h, w, layout = (h + 1, w, layout) if kind == 0 else (h, w + 1, layout) \
                if kind == 1 else (h, w, "transposed")
        c = int(rng.choice([16, 32, 48, 20, 8]))
        o = int(rng.choice([16, 32, 24, 64]))
        yield (int(rng.choice([1, 2, 3, 5, 7])), c, o, h, w, s, bool(rng.integers(2)),
               layout), int(rng.integers(1 << 30))


def _step(functional, stride, bias):
    def step(x, w, b, g):
        for t in (x, w, b):
            t.grad = None
        y = functional.conv2d(x, w, b if bias else None, stride=stride)
        (y * g).sum().backward()
        return [y.detach(), x.grad, w.grad] + ([b.grad] if bias else [])

    return step


def _leaves(lib, arrays, layout, double=False):
    out = []
    for i, a in enumerate(arrays):
        t = lib.tensor(a.astype(np.float64) if double else a)
        if i == 0 and layout == "transposed":  # the same values, W and H strides swapped
            swapped = lib.tensor(np.ascontiguousarray(np.swapaxes(a, 2, 3)))
            t = swapped.transpose(2, 3).detach()
        out.append(t.requires_grad_() if i < 3 else t)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_strided_1x1_convolutions_within_rounding_and_the_same_on_two_threads(
        seed, monkeypatch):
    for (n, c, o, h, w, s, bias, layout), data in _cases(seed, 4):
        what = f"x[{n},{c},{h},{w}] -> {o} channels, stride {s}, bias {bias}, {layout}"
        rng = np.random.default_rng(data)
        ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
        arrays = [rng.standard_normal((n, c, h, w)).astype(np.float32),
                  (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32),
                  rng.standard_normal(o).astype(np.float32),
                  rng.standard_normal((n, o, ho, wo)).astype(np.float32)]
        step = _step(F, s, bias)
        got = {}
        for count in (1, 2):
            fixed_threads(monkeypatch, count)
            compiled = graphc.compile(step, backend="cpu")
            got[count] = [t.numpy().copy() for t in compiled(*_leaves(graphc, arrays, layout))]
        eager = [t.numpy() for t in step(*_leaves(graphc, arrays, "contiguous"))]
        want = [t.detach().numpy() for t in _step(torch.nn.functional, s, bias)(
            *_leaves(torch, arrays, "contiguous", double=True))]
        names = ["y", "x.grad", "w.grad", "b.grad"]
        for count in (1, 2):
            for name, g, e, r in zip(names, got[count], eager, want):
                try:
                    assert_rounding_within(g, e, r)
                except AssertionError as error:
                    raise AssertionError(f"{what}: {name}, {count} thread(s): {error}") \
                        from None
        for name, a, b in zip(names, got[1], got[2]):
            if name != "w.grad":  # conv_threads' shares sum their images apart
                np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name}, 1 vs 2 threads")
