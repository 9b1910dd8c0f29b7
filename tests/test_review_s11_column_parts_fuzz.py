"""Review of the eleventh session's column sums forked over parts of their rows (h5:
graphc.backends.cpu.column_parts; reductions.py and rows.py take it), as a seeded fuzzer
over what its tests leave out: column sums and means of random row and column counts
(rows that do and do not cut into the thread count, columns over a page), sums over two
leading dims, a transposed input, keepdim, float64, results written into a stack's or a
concatenation's slots (strided and offset outputs), and a bias gradient and a LayerNorm's
gamma/beta gradients in one training step.

Each case: the results on 2 threads are the same bits as on 1; within 2x eager graphc's
distance from a float64 run (docs/performance.md, "Rounding").
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
from graphc.backends.cpu import threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _on_threads(fn, make_inputs):
    compiled = graphc.compile(fn, backend="cpu")
    compiled(*make_inputs())
    results = []
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        out = compiled(*make_inputs())
        results.append([t.numpy().copy() for t in (out if isinstance(out, tuple) else (out,))])
    for got in results[1:]:
        for i, (a, b) in enumerate(zip(got, results[0])):
            np.testing.assert_array_equal(a, b, err_msg=f"result {i}: 1 vs 2 threads")
    return results[0]


def _least_factor(n: int) -> int:
    return next(d for d in range(2, n + 1) if n % d == 0)


FORMS = {  # (x [R, C], y [R, C]) -> column sums, in some form
    "sum(0)": lambda x, y: x.sum(0) * 1.0,
    "mean(0, keepdim) of a product": lambda x, y: (x * y).mean(0, keepdim=True),
    "stacked along the columns": lambda x, y: graphc.stack([x.sum(0), (x * y).sum(0)], 1),
    "stacked along the rows": lambda x, y: graphc.stack([x.sum(0), y.mean(0)], 0) + 0.0,
    "concatenated": lambda x, y: graphc.cat([x.exp().sum(0), y.sum(0)]),
    "over two leading dims": lambda x, y: x.reshape(_least_factor(x.shape[0]), -1,
                                                    x.shape[1]).sum((0, 1)),
    # (not x.t().contiguous().t().sum(0): the compiled graph sums x's columns row by row,
    # as for x.sum(0), where numpy sums the copy's contiguous columns pairwise, so eager's
    # distance is 15x smaller there by layout, on main before column_parts as after)
    "of a transposed input": lambda x, y: x.sum(0) + y.t().sum(1),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_column_sums_of_every_form_on_one_and_two_threads(form):
    rng = np.random.default_rng(sorted(FORMS).index(form))
    for rows, columns, dtype in [(1024, 128, np.float32), (772, 96, np.float32),
                                 (512, 1100, np.float32), (1024, 64, np.float64),
                                 (1028, 257, np.float32), (1023, 128, np.float32)]:
        x, y = (rng.standard_normal((rows, columns)).astype(dtype) for _ in range(2))
        x = x + 3.0  # a column's sum well away from 0
        got = _on_threads(FORMS[form], lambda: (graphc.tensor(x), graphc.tensor(y)))
        eager = FORMS[form](graphc.tensor(x), graphc.tensor(y)).numpy()
        wide = FORMS[form](graphc.tensor(x.astype(np.float64)),
                           graphc.tensor(y.astype(np.float64))).numpy()
        what = f"{form}: [{rows}, {columns}] {np.dtype(dtype).name}"
        assert got[0].shape == eager.shape, what
        if dtype is np.float64:
            np.testing.assert_allclose(got[0], eager, rtol=1e-12, atol=1e-12, err_msg=what)
            continue
        try:
            assert_rounding_within(got[0], eager, wide)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from None


def test_a_layer_norm_and_linear_step_on_one_and_two_threads():
    """Bias and LayerNorm gradients (column sums in a row program) over 15 x 67 tokens."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((15, 67, 96)).astype(np.float32)  # 1005 tokens: odd
    graphc.manual_seed(0)
    norm, linear = nn.LayerNorm(96), nn.Linear(96, 128)
    params = [norm.weight, norm.bias, linear.weight, linear.bias]

    def step(x):
        for p in params:
            p.grad = None
        y = linear(norm(x)).tanh()
        (y * y).sum().backward()
        return tuple(p.grad for p in params)

    got = _on_threads(step, lambda: (graphc.tensor(x),))
    eager = [t.numpy() for t in step(graphc.tensor(x))]
    for g, e in zip(got, eager):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-3 * float(np.abs(e).max()))


def test_two_column_sums_of_different_inputs_in_one_graph():
    """Two column sums of one form in one graph: the second calls the kernel the first
    emitted, then its own merge of the partial rows (it once skipped the merge, so its
    result was never written: NaN or ~1e35, the GPT step's in_proj_bias gradient 463x off)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1024, 128)).astype(np.float32) for _ in range(2))

    def two_sums(a, b):
        return a.sum(0) + b.sum(0)

    got = graphc.compile(two_sums, backend="cpu")(graphc.tensor(a), graphc.tensor(b)).numpy()
    want = two_sums(graphc.tensor(a), graphc.tensor(b)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
