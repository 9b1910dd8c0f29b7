"""softmax / log_softmax rows on the cpu backend (graphc.backends.cpu.rows and the scalar
path): odd row lengths around the vector width, rows along other dims, non-contiguous
inputs, fused bodies, -inf / inf / NaN rows, float64, and rows enough to fork over threads;
row programs prefetching rows ahead with the same bits. Judged by distance from a float64
run (the sum reassociates: docs/performance.md, Rounding)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

OPS = ["softmax", "log_softmax"]
SHAPES = [((5, 1), -1), ((3, 7), -1), ((4, 15), -1), ((2, 3, 16), -1), ((6, 17), 1),
          ((2, 33), -1), ((3, 64), -1), ((2, 130), -1), ((40,), 0), ((4, 6, 5), 1),
          ((3, 9, 2, 2), 1), ((7, 3), 0)]


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _check(f, *arrays, dtype=np.float32):
    """f compiled on cpu against eager graphc and a float64 run of f."""
    tensors = [graphc.tensor(a.astype(dtype)) for a in arrays]
    got = graphc.compile(f, backend="cpu")(*tensors).numpy()
    eager = f(*tensors).numpy()
    reference = f(*[graphc.tensor(a.astype(np.float64)) for a in arrays]).numpy()
    assert got.dtype == eager.dtype
    finite = np.isfinite(reference)
    np.testing.assert_array_equal(got[~finite], reference[~finite])  # inf, -inf, NaN alike
    assert_rounding_within(got[finite], eager[finite], reference[finite])
    return got


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, dim", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_of_every_length_and_dim(op, shape, dim, dtype):
    x = np.random.default_rng(_seed(op, shape, dim)).standard_normal(shape) * 4
    _check(lambda t: getattr(t, op)(dim), x, dtype=dtype)


@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_input_rows(op):
    """A permuted input: its rows are strided, the output's are contiguous."""
    x = np.random.default_rng(_seed(op, "permuted")).standard_normal((19, 6, 3))
    _check(lambda t: getattr(t.permute(2, 1, 0), op)(-1), x)


@pytest.mark.parametrize("op", OPS)
def test_fused_body_before_the_rows(op):
    """softmax of an elementwise body (fused into the row kernel) and a second output."""
    rng = np.random.default_rng(_seed(op, "fused"))
    x, b = rng.standard_normal((5, 21)), rng.standard_normal(21)

    def f(x, b):
        z = (x * 2.0 + b).tanh()
        return getattr(z, op)(-1) + z

    _check(f, x, b)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_rows(op, dtype):
    """Masked (-inf) entries, an all -inf row, a row with +inf, a row with NaN, huge and tiny
    magnitudes: NaN exactly where the float64 run has NaN, the rest close to it."""
    rows = np.random.default_rng(_seed(op, "special")).standard_normal((8, 37)) * 3
    rows[0, 5:] = -math.inf  # causal-mask style
    rows[1, :] = -math.inf  # every entry masked: NaN
    rows[2, 7] = math.inf  # NaN (inf - inf)
    rows[3, 30] = math.nan
    rows[4] *= 1e4  # most exps underflow to 0
    rows[5] *= 1e-30
    rows[6, ::2] = -math.inf
    got = _check(lambda t: getattr(t, op)(-1), rows, dtype=dtype)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all() and np.isnan(got[3]).all()
    if op == "softmax":
        assert (got[0, 5:] == 0).all() and (got[6, ::2] == 0).all()
    else:
        assert (got[0, 5:] == -math.inf).all()


@pytest.mark.parametrize("op", OPS)
def test_many_rows_fork_over_threads(op):
    """Over kernels.PARALLEL_MIN_ELEMENTS: the row loop is split between threads."""
    x = np.random.default_rng(_seed(op, "big")).standard_normal((2048, 67))
    _check(lambda t: getattr(t, op)(-1), x)


def test_row_kernel_uses_vector_registers():
    """The contiguous-row kernel reads rows as <16 x float> vectors (not one at a time)."""
    compiled = graphc.compile(lambda t: t.softmax(-1), backend="cpu")
    compiled(graphc.tensor(np.ones((4, 40), np.float32)))
    ir_text = compiled.executable.lowered.ir_text
    assert "load <16 x float>" in ir_text and "store <16 x float>" in ir_text


def test_row_programs_prefetch_rows_ahead_with_the_same_bits(monkeypatch, tmp_path):
    """A LayerNorm's row programs (forward, and backward with its column sums) over enough
    rows ask for the rows PREFETCH_AHEAD_ROWS on (rows.PREFETCH): the same bits as without."""
    import graphc.nn.functional as F
    from graphc.backends.cpu import rows

    def step(x, w, b):
        y = F.layer_norm(x, (128,), w, b)
        (y * y.sin()).sum().backward()
        return y, x.grad, w.grad, b.grad

    rng = np.random.default_rng(_seed("prefetch"))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((16, 64, 128), (128,), (128,))]
    results, texts = {}, {}
    for prefetch in (True, False):
        monkeypatch.setattr(rows, "PREFETCH", prefetch)
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / str(prefetch)))  # lowered here
        compiled = graphc.compile(step, backend="cpu")
        tensors = [graphc.tensor(a, requires_grad=True) for a in arrays]
        results[prefetch] = [r.detach().numpy() for r in compiled(*tensors)]
        texts[prefetch] = compiled.executable.lowered.ir_text
    assert texts[True].count("llvm.prefetch") > texts[False].count("llvm.prefetch")
    for on, off in zip(results[True], results[False]):
        np.testing.assert_array_equal(on, off)
