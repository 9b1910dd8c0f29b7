"""Review of the eleventh session's nn.MultiheadAttention checks (h7: PyTorch 2.13's
_mha_shape_check, key_padding_mask, embed, key/value and mask-dtype refusals as
AssertionError, errors.InputCheckError; fully masked rows NaN with need_weights), as a seeded
fuzzer against PyTorch 2.13 CPU: batched and unbatched inputs, batch_first or not, key and
value of other lengths, key_padding_mask and attn_mask of right and wrong ranks, sizes and
dtypes (bool, float32, int64), need_weights and average_attn_weights. Either both raise
with the same exception class (graphc's a GraphcError naming the user's line) or both
return the same output and weights, NaN where PyTorch's are.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as gnn
from graphc.errors import GraphcError

torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")

EMBED, HEADS = 8, 2
# (PyTorch warns of a bool and a float mask together; graphc takes both as PyTorch does)
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")


def _twins(batch_first):
    graphc.manual_seed(0)
    ours = gnn.MultiheadAttention(EMBED, HEADS, batch_first=batch_first)
    ref = torch.nn.MultiheadAttention(EMBED, HEADS, batch_first=batch_first)
    ref.load_state_dict({k: torch.tensor(v.detach().numpy())
                         for k, v in ours.state_dict().items()})
    return ours, ref


def _draw(rng):
    batched = bool(rng.random() < 0.75)
    batch_first = bool(rng.integers(2))
    b, length, source = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
    value_source = source if rng.random() < 0.85 else source + 1
    embed_k = EMBED if rng.random() < 0.9 else EMBED + 1

    def seq(n, e):
        if not batched:
            return (n, e)
        return (b, n, e) if batch_first else (n, b, e)

    shapes = [seq(length, EMBED), seq(source, embed_k), seq(value_source, embed_k)]
    kpm = None
    if rng.random() < 0.5:
        kpm_shape = (b, source) if batched else (source,)
        if rng.random() < 0.2:  # wrong rank or size
            kpm_shape = (source,) if batched else (1, source + int(rng.integers(2)))
        kpm = (str(rng.choice(["bool", "float32", "bool", "int64"])), kpm_shape)
    mask = None
    if rng.random() < 0.5:
        shape = (length, source) if rng.random() < 0.6 else \
            ((b if batched else 1) * HEADS, length, source)
        if rng.random() < 0.2:
            shape = shape[:-1] + (shape[-1] + 1,)
        mask = (str(rng.choice(["bool", "float32", "bool", "int64"])), shape)
    options = dict(need_weights=bool(rng.integers(2)),
                   average_attn_weights=bool(rng.integers(2)))
    data = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    masks = [None if m is None else _mask_array(rng, *m) for m in (kpm, mask)]
    what = f"batch_first={batch_first} q{shapes[0]} k{shapes[1]} v{shapes[2]} kpm {kpm} " \
        f"mask {mask} {options}"
    return batch_first, data, masks, options, what


def _mask_array(rng, dtype, shape):
    hide = rng.random(shape) < 0.3
    if dtype == "bool":
        return hide
    if dtype == "int64":
        return hide.astype(np.int64)
    return np.where(hide, -np.inf, rng.standard_normal(shape)).astype(np.float32)


def _run(module, lib, data, masks, options):
    q, k, v = (lib.tensor(a) for a in data)
    kpm, mask = (None if m is None else lib.tensor(m) for m in masks)
    out, weights = module(q, k, v, key_padding_mask=kpm, attn_mask=mask, **options)
    return [t.detach().numpy() for t in (out, weights) if t is not None]


def _outcome(fn):
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 (the class is what is compared)
        return error


@pytest.mark.parametrize("seed", range(4))
def test_multihead_attention_raises_or_returns_as_pytorch(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        batch_first, data, masks, options, what = _draw(rng)
        ours, ref = _twins(batch_first)
        want = _outcome(lambda: _run(ref, torch, data, masks, options))
        got = _outcome(lambda: _run(ours, graphc, data, masks, options))
        if isinstance(want, Exception):
            assert isinstance(got, Exception), f"{what}: PyTorch raised {want!r}, graphc not"
            base = next(c for c in (AssertionError, IndexError, RuntimeError, ValueError,
                                    TypeError) if isinstance(want, c))
            assert isinstance(got, base), f"{what}: PyTorch raised {want!r}, graphc {got!r}"
            assert isinstance(got, GraphcError) and " at test_" in str(got), \
                f"{what}: {got!r} names no user line"
            continue
        assert not isinstance(got, Exception), f"{what}: graphc raised {got!r}, PyTorch not"
        assert len(got) == len(want), what
        for g, w in zip(got, want):
            assert g.shape == w.shape, what
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=what)
            np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-4,
                                       atol=1e-5, err_msg=what)
