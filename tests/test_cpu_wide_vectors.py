"""Kernels that evaluate a polynomial mathlib function prefer 512-bit vectors (cpu backend,
graphc.backends.cpu.scalars.WIDE_VECTOR_FUNCTIONS), others keep LLVM's default; the wider
vectors compute each element with the same instructions, so results are bit-identical with
and without the hint, and judged against a float64 run like any compiled result
(docs/performance.md, "GELU epilogue")."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends.cpu import scalars  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

PREFER_512 = '"prefer-vector-width"="512"'


def _gelu_and_derivative(h, b):
    """The GPT's linear1 epilogue body: gelu(h + b) and the derivative the backward reads."""
    x = h + b
    derivative = (graphc.erf(x * 0.7071067690849304) + 1.0) * 0.5 \
        + x * (graphc.exp(x * x * -0.5) * 0.3989422917366028)
    return F.gelu(x), derivative


def _inputs(name: str, dtype=np.float32):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    h = rng.standard_normal((8, 300)) * 4  # both tails of erf and gelu, odd row length
    h[0, :6] = [-12.0, -40.0, 0.0, -0.0, 9.0, -5.5]
    return h.astype(dtype), (rng.standard_normal(300) * 0.1).astype(dtype)


def _compiled(f, arrays, cache_dir, monkeypatch, wide=True):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(cache_dir))
    if not wide:
        monkeypatch.setattr(scalars, "WIDE_VECTOR_FUNCTIONS", frozenset())
    compiled = graphc.compile(f, backend="cpu")
    outputs = compiled(*[graphc.tensor(a) for a in arrays])
    monkeypatch.undo()
    return compiled, [o.numpy() for o in outputs]


def _kernel_defines(compiled) -> list[str]:
    text = compiled.executable.lowered.ir_text
    return [line for line in text.splitlines() if line.startswith("define")
            and "_fused" in line]


def test_mathlib_kernels_prefer_512_bit_vectors_and_others_do_not(tmp_path, monkeypatch):
    arrays = _inputs("defines")
    compiled, _ = _compiled(_gelu_and_derivative, arrays, tmp_path / "a", monkeypatch)
    defines = _kernel_defines(compiled)
    assert defines and all(PREFER_512 in line for line in defines), defines
    plain, _ = _compiled(lambda h, b: h * b + 1.0, arrays, tmp_path / "b", monkeypatch)
    defines = _kernel_defines(plain)
    assert defines and not any(PREFER_512 in line for line in defines), defines
    without, _ = _compiled(_gelu_and_derivative, arrays, tmp_path / "c", monkeypatch,
                           wide=False)
    assert not any(PREFER_512 in line for line in _kernel_defines(without))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wide_vectors_give_the_same_bits(dtype, tmp_path, monkeypatch):
    arrays = _inputs(f"bits-{np.dtype(dtype).name}", dtype)
    _, wide = _compiled(_gelu_and_derivative, arrays, tmp_path / "wide", monkeypatch)
    _, narrow = _compiled(_gelu_and_derivative, arrays, tmp_path / "narrow", monkeypatch,
                          wide=False)
    for got, other in zip(wide, narrow):
        np.testing.assert_array_equal(got, other)
    tensors = [graphc.tensor(a) for a in arrays]
    eager = [o.numpy() for o in _gelu_and_derivative(*tensors)]
    reference = [o.numpy() for o in _gelu_and_derivative(
        *[graphc.tensor(a.astype(np.float64)) for a in arrays])]
    for got, e, ref in zip(wide, eager, reference):
        assert_rounding_within(got, e, ref)
