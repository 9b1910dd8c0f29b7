"""Duck sizing and a pinned symbol (graphc.jit.retrace `_split_duck_sizes`): when a batch
equals a spatial size (6 images of 6x6), the dims share one symbol; a strided convolution
needs its spatial size as a number (its output size is a floor division), which pins that
symbol, so every dim sharing it, the batch too, stayed static, and each later batch traced
again. Now the call is traced again with those dims apart: only the spatial dims stay static,
one graph serves every batch, and results equal eager graphc's."""

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F


def _model_and_step():
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, stride=2), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    opt = graphc.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_a_batch_equal_to_the_image_size_stays_dynamic(backend, dynamic, monkeypatch,
                                                       tmp_path):
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the cpu backend generates code with llvmlite")
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    m1, step1 = _model_and_step()
    m2, eager = _model_and_step()
    compiled = graphc.compile(step1, backend=backend, dynamic=dynamic)
    # dynamic=None: the first call is static; the batch turns dynamic at the second, at
    # which the batch equals the image size
    sizes = [(4, 6), (6, 6), (5, 6), (7, 6), (8, 8), (3, 8)] if dynamic is None \
        else [(6, 6), (5, 6), (7, 6), (8, 8), (3, 8)]
    for batch, size in sizes:
        x, y = graphc.randn(batch, 3, size, size), graphc.randint(0, 2, (batch,))
        np.testing.assert_allclose(compiled(x, y).numpy(), eager(x, y).numpy(), rtol=1e-5)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_allclose(p1.detach().numpy(), p2.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    types = sorted({str(g.inputs[0].type) for g in compiled.graphs})
    expected = ["f32[s0,3,6,6]", "f32[s0,3,8,8]"]
    assert types == (["f32[4,3,6,6]"] + expected if dynamic is None else expected)


def test_the_split_is_logged_and_kept(monkeypatch, capsys):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    _, step = _model_and_step()
    compiled = graphc.compile(step, backend="interp", dynamic=True)
    compiled(graphc.randn(6, 3, 6, 6), graphc.randint(0, 2, (6,)))
    err = capsys.readouterr().err
    assert "traced again with x.size(0), x.size(2), x.size(3), y.size(0) apart" in err
    assert "x.size(0) stays static" not in err and "x.size(2) stays static" in err
    compiled(graphc.randn(8, 3, 8, 8), graphc.randint(0, 2, (8,)))  # apart from the start
    assert "apart" not in capsys.readouterr().err


def test_unpinned_duck_sized_dims_still_share_a_symbol():
    f = graphc.compile(lambda x, y: x + y, backend="interp", dynamic=True)
    f(graphc.ones(5, 5), graphc.ones(5, 5))
    assert str(f.graphs[0].inputs[0].type) == "f32[s0,s0]"
