"""A small parity helper for the composite functions and layers of issue 12: run the same
function on graphc and PyTorch tensors built from the same float64 arrays, compare outputs
and the gradients of every floating-point input (through a fixed random cotangent)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc

torch = pytest.importorskip("torch")


def _flat(out):
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out] if out is not None else []


def check_parity(fn_graphc, fn_torch, *arrays, grad: bool = True, atol: float = 1e-10,
                 rtol: float = 1e-7, seed: int = 0, **kwargs):
    """fn_graphc(*graphc tensors, **kwargs) equals fn_torch(*torch tensors, **kwargs), and so do
    the gradients of a random projection of its float outputs (float64 arrays: tight
    tolerances by default)."""
    gx = [graphc.tensor(a, requires_grad=grad and a.dtype.kind == "f")
          if isinstance(a, np.ndarray) else a for a in arrays]
    tx = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f")
          if isinstance(a, np.ndarray) else a for a in arrays]
    gout, tout = _flat(fn_graphc(*gx, **kwargs)), _flat(fn_torch(*tx, **kwargs))
    assert len(gout) == len(tout)
    rng = np.random.default_rng(seed)
    gloss, tloss = 0, 0
    for g, t in zip(gout, tout):
        assert tuple(g.shape) == tuple(t.shape)
        np.testing.assert_allclose(g.detach().numpy(), t.detach().numpy(), atol=atol, rtol=rtol)
        if grad and t.dtype.is_floating_point and t.requires_grad:
            w = rng.standard_normal(tuple(t.shape))
            gloss = gloss + (g * graphc.tensor(w, dtype=g.dtype)).sum()
            tloss = tloss + (t * torch.tensor(w, dtype=t.dtype)).sum()
    if grad and not isinstance(tloss, int):
        gloss.backward()
        tloss.backward()
        for g, t in zip(gx, tx):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                want = np.zeros(tuple(t.shape)) if t.grad is None else t.grad.numpy()
                got = np.zeros(tuple(g.shape)) if g.grad is None else g.grad.numpy()
                np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)
