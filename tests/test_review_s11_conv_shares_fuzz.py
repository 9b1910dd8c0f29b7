"""Review of the eleventh session's convolutions split over the cores (h5: a batch that would
be one im2col block cut into one block a thread, conv_threads.images_per_share; h2's
polyphase stride-2 paths beside them), as a seeded fuzzer: 1x1 and 3x3 convolutions, stride 1
and 2, 8 to 64 channels, planes of 2 to 9, odd batches of 1 to 9 (a last block with fewer
images), forward, input gradient and weight gradient.

Each case: the forward and input gradient are the same bits on 2 threads as on 1 (each image
computed by one thread's code; where the BLAS rounds otherwise on two threads, as numpy's
OpenBLAS on a Zen 5, with the BLAS held to one thread: tests/blas_held_support); all three
within 2x eager graphc's distance from PyTorch 2.13 in float64 (the weight gradient's sum
over images is split into shares on two threads: conv_threads' docstring), on one and on two
threads, the BLAS free.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn.functional as gF
from graphc.testing import assert_rounding_within

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")

from graphc.backends.cpu import threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from tests.blas_held_support import (  # noqa: E402
    blas_keeps_bits_across_threads,
    blas_on_one_thread,
)


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _conv_step(F, stride, padding):
    def step(x, w, g):
        y = F.conv2d(x, w, stride=stride, padding=padding)
        (y * g).sum().backward()
        return y, x.grad, w.grad

    return step


def _case(rng):
    kernel = int(rng.choice([1, 3]))
    stride = int(rng.choice([1, 2]))
    padding = 0 if kernel == 1 else 1
    c, o = int(rng.choice([8, 24, 64])), int(rng.choice([16, 40, 64]))
    h, w = (int(v) for v in rng.choice([2, 4, 5, 8, 9], 2))
    n = int(rng.choice([1, 3, 5, 7, 9]))
    ho, wo = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
    arrays = [rng.standard_normal((n, c, h, w)).astype(np.float32),
              (rng.standard_normal((o, c, kernel, kernel)) / np.sqrt(c * kernel ** 2)).astype(
                  np.float32),
              rng.standard_normal((n, o, ho, wo)).astype(np.float32)]
    return arrays, stride, padding, f"x{[n, c, h, w]} w{[o, c, kernel, kernel]} s{stride}"


def _tensors(lib, arrays, dtype):
    x, w, g = (lib.tensor(a.astype(dtype)) for a in arrays)
    return x.requires_grad_(), w.requires_grad_(), g


def _run(compiled, arrays, count):
    compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
    return [t.detach().numpy().copy() for t in compiled(*_tensors(graphc, arrays, np.float32))]


@pytest.mark.parametrize("seed", range(3))
def test_convolutions_over_odd_batches_on_one_and_two_threads(seed):
    rng = np.random.default_rng(seed)
    for _ in range(4):
        arrays, stride, padding, what = _case(rng)
        step = _conv_step(gF, stride, padding)
        compiled = graphc.compile(step, backend="cpu")
        compiled(*_tensors(graphc, arrays, np.float32))
        results = [_run(compiled, arrays, count) for count in sorted({1, threads.most_threads()})]
        if blas_keeps_bits_across_threads():
            same_bits = results[-1]
        else:  # graphc's image shares alone: the BLAS held to one thread (blas_held_support)
            with blas_on_one_thread():
                same_bits = _run(compiled, arrays, threads.most_threads())
        for name, a, b in zip(("y", "gx"), same_bits, results[0]):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name}, 1 vs 2 threads")
        eager = [t.detach().numpy() for t in step(*_tensors(graphc, arrays, np.float32))]
        want = [t.detach().numpy()
                for t in _conv_step(torch.nn.functional, stride, padding)(
                    *_tensors(torch, arrays, np.float64))]
        for got in results:
            for name, g, e, r in zip(("y", "gx", "gw"), got, eager, want):
                try:
                    assert_rounding_within(g, e, r)
                except AssertionError as error:
                    raise AssertionError(f"{what}: {name}: {error}") from None
