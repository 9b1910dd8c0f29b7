"""Review of the eleventh session's GPT kernels together (h4: weight gradients in chunks of k,
merged in order; h3: the one-block attention kernels; h5: column sums over row parts, where
landed): a one-layer GPT's loss and every parameter's gradient (embed 128, 4 heads, context
64, batch 16: the benchmark's shapes) are the same bits on two threads as on one, and equal
eager graphc's to float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from benchmarks.model_steps import gpt  # noqa: E402
from graphc.backends.cpu import threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402


def test_a_gpt_layers_gradients_are_the_same_bits_on_one_and_two_threads(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    graphc.manual_seed(0)
    model = gpt(graphc, embed=128, layers=1, heads=4, block=64)
    named = list(model.named_parameters())

    def step(idx, y):
        for _, p in named:
            p.grad = None
        loss = F.cross_entropy(model(idx), y)
        loss.backward()
        return [loss.detach()] + [p.grad for _, p in named]

    rng = np.random.default_rng(0)
    idx = graphc.tensor(rng.integers(0, 128, (16, 64)))
    y = graphc.tensor(rng.integers(0, 128, 16 * 64))
    compiled = graphc.compile(step, backend="cpu")
    compiled(idx, y)
    results = []
    for count in sorted({1, threads.most_threads()}):
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        results.append([t.numpy().copy() for t in compiled(idx, y)])
    names = ["loss"] + [name for name, _ in named]
    for got in results[1:]:
        for name, a, b in zip(names, got, results[0]):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: 1 vs 2 threads")
    eager = [t.numpy() for t in step(idx, y)]
    for name, a, e in zip(names, results[0], eager):
        np.testing.assert_allclose(a, e, rtol=2e-3, atol=2e-3 * float(np.abs(e).max()),
                                   err_msg=name)
