"""Review of the jit's retrace path after compiler.py's split (graphc.jit.retrace): what a call
that is refused leaves behind (recompile reasons, the recompile limit's listing), and new
signatures after a dimension became dynamic, on the interpreter and the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.errors import ShapeError
from graphc.jit.compiler import RecompileLimitError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _ones(*shape) -> graphc.Tensor:
    return graphc.tensor(np.ones(shape, np.float32))


def _project(x, w):
    return x @ w


def test_calls_over_the_recompile_limit_list_the_same_recompiles():
    """Each refused call listed its own attempt and kept it: the third refused call's message
    named three recompiles that never happened."""
    f = graphc.compile(lambda x: x * 2, recompile_limit=2, backend="interp", dynamic=False)
    f(_ones(1))
    f(_ones(2))
    messages = []
    for n in (3, 4, 5):
        with pytest.raises(RecompileLimitError) as info:
            f(_ones(n))
        messages.append(str(info.value))
    assert f.recompile_reasons == [["arg 0 shape (1) -> (2)"]]
    for n, message in zip((3, 4, 5), messages):
        assert "recompile 1: arg 0 shape (1) -> (2)" in message
        assert f"recompile 2: arg 0 shape (2) -> ({n})" in message
        assert "recompile 3" not in message


def test_a_retrace_that_fails_leaves_no_recompile_reason():
    f = graphc.compile(_project, backend="interp", dynamic=False)
    w = _ones(4, 3)
    f(_ones(2, 4), w)
    with pytest.raises(ShapeError, match="matmul"):
        f(_ones(2, 5), w)  # inner dimensions differ: refused, nothing traced
    assert f.recompile_reasons == [] and len(f.graphs) == 1
    f(_ones(6, 4), w)
    assert f.recompile_reasons == [["arg 0 shape (2,4) -> (6,4)"]]


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_an_argument_with_fewer_dims_after_one_became_dynamic_traces(backend):
    """dynamic=None made x's dim 1 symbolic after (4, 5) -> (4, 6); a 1-D x then raised
    IndexError in the tracer, which indexed that dim of a tensor that has none."""
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
    f = graphc.compile(lambda x: x.sum(-1) * 2, backend=backend)
    for shape in ((4, 5), (4, 6), (7,), (2, 3, 4)):
        x = graphc.tensor(np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
        got = f(x)
        np.testing.assert_array_equal(got.numpy(), x.numpy().sum(-1) * 2)
    assert len(f.graphs) == 4  # (4, 5); (4, s1); (7,); (2, 3, s) with dim 2 symbolic
