"""Attention masks against PyTorch 2.13 CPU (the installed reference), eager and compiled.

- nn.MultiheadAttention(need_weights=True) builds its own softmax, in PyTorch as here: a query
  whose every key is masked (key_padding_mask or attn_mask, bool or float -inf) gives NaN in
  its output row and its weights (averaged over the heads or not), where the need_weights=False
  path (scaled_dot_product_attention) gives 0. graphc matches both, NaN where PyTorch's are.
- A mask of fewer than 2 dims: F.scaled_dot_product_attention raises IndexError where PyTorch
  2.13 does (4-d query, key and value its flash kernel takes: the mask's dim -2 is read) and
  broadcasts it elsewhere, as PyTorch's math kernel; nn.MultiheadAttention refuses it, and
  every other input its `_mha_shape_check` refuses, with AssertionError and PyTorch's words.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import graphc
import graphc.nn as gnn
import graphc.nn.functional as F
from graphc.errors import GraphcError

torch = pytest.importorskip("torch", reason="PyTorch is the reference")

BACKENDS = ["eager", "interp", "cpu"]


def _twins(embed=8, heads=2, batch_first=True, **kw):
    """A graphc and a PyTorch MultiheadAttention with the same weights."""
    graphc.manual_seed(0)
    ours = gnn.MultiheadAttention(embed, heads, batch_first=batch_first, **kw)
    ref = torch.nn.MultiheadAttention(embed, heads, batch_first=batch_first, **kw)
    ref.load_state_dict({k: torch.tensor(v.detach().numpy())
                         for k, v in ours.state_dict().items()})
    return ours, ref


def _run(backend: str, fn, *args):
    if backend == "eager":
        return fn(*args)
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the cpu backend generates code with llvmlite")
    return graphc.compile(fn, backend=backend)(*args)


def _same_with_nans(got, want) -> None:
    got, want = got.detach().numpy(), want.detach().numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-6)


def _masks():
    """(name, key_padding_mask, attn_mask) as numpy arrays, each hiding every key of some
    query (batch 2, length 3)."""
    kpm = np.array([[True, True, True], [False, True, False]])
    row = np.zeros((3, 3), dtype=bool)
    row[1] = True
    float_row = np.where(row, -np.inf, 0.0).astype(np.float32)
    return [("key_padding_mask", kpm, None), ("bool attn_mask", None, row),
            ("float attn_mask", None, float_row), ("both", kpm, row)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("masks", _masks(), ids=lambda m: m[0])
def test_fully_masked_query_as_pytorch(masks, need_weights, average, backend):
    _, kpm, am = masks
    ours, ref = _twins()
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)

    def call(mha, x, kpm, am):
        return mha(x, x, x, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights,
                   average_attn_weights=average)

    def wrap(lib, a):
        return None if a is None else lib.tensor(a)

    want_out, want_w = call(ref, torch.tensor(x), wrap(torch, kpm), wrap(torch, am))
    got_out, got_w = _run(backend, lambda x, kpm, am: call(ours, x, kpm, am),
                          graphc.tensor(x), wrap(graphc, kpm), wrap(graphc, am))
    assert np.isnan(want_out.detach().numpy()).any() == need_weights  # the reference's NaNs
    _same_with_nans(got_out, want_out)
    assert (got_w is None) == (want_w is None)
    if want_w is not None:
        _same_with_nans(got_w, want_w)


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_query_on_emulated_cuda(need_weights, monkeypatch, tmp_path):
    """The cuda backend (its emulation here; on a GPU the lead's run) gives PyTorch's NaNs
    and zeros too."""
    monkeypatch.setenv("GRAPHC_CUDA", "emu")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    try:
        from tests.cuda_support import runtime_library

        runtime_library("emu")
    except Exception as error:  # noqa: BLE001 (no g++, a failing build: say why)
        pytest.skip(f"the cuda emulation runtime does not build here: {error}")
    _, kpm, am = _masks()[-1]
    ours, ref = _twins()
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    want = ref(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(kpm),
               attn_mask=torch.tensor(am), need_weights=need_weights)
    got = graphc.compile(lambda x, kpm, am: ours(x, x, x, key_padding_mask=kpm, attn_mask=am,
                                                 need_weights=need_weights), backend="cuda")(
        graphc.tensor(x), graphc.tensor(kpm), graphc.tensor(am))
    _same_with_nans(got[0], want[0])
    if need_weights:
        _same_with_nans(got[1], want[1])


def _outcome(fn):
    """The exception type fn raises (its PyTorch builtin base for graphc's), or "ok"."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 (the type is what is compared)
        for base in (IndexError, AssertionError, RuntimeError, ValueError, TypeError):
            if isinstance(err, base):
                return base, str(err)
        raise
    return "ok", ""


SDPA_CASES = {  # (q, k, v shapes, mask shape, keywords)
    "4-d, 1-d mask": ((2, 2, 3, 4),) * 3 + ((3,), {}),
    "4-d, 0-d mask": ((2, 2, 3, 4),) * 3 + ((), {}),
    "4-d, 1-d mask, is_causal": ((2, 2, 3, 4),) * 3 + ((3,), {"is_causal": True}),
    "4-d, 1-d mask, scale": ((2, 2, 3, 4),) * 3 + ((3,), {"scale": 0.3}),
    "4-d, 1-d mask, value head size 5": ((2, 2, 3, 4),) * 2 + ((2, 2, 3, 5), (3,), {}),
    "4-d, 1-d mask, gqa": ((2, 2, 3, 4),) + ((2, 1, 3, 4),) * 2 + ((3,), {"enable_gqa": True}),
    "4-d, 1-d mask, dropout": ((2, 2, 3, 4),) * 3 + ((3,), {"dropout_p": 0.5}),
    "4-d, 1-d mask, key batch 1": ((2, 2, 3, 4),) + ((1, 2, 3, 4),) * 2 + ((3,), {}),
    "4-d, 1-d mask, key heads 1": ((2, 2, 3, 4),) + ((2, 1, 3, 4),) * 2 + ((3,), {}),
    "4-d, 1-d mask, no keys": ((2, 2, 3, 4),) + ((2, 2, 0, 4),) * 2 + ((0,), {}),
    "4-d, 2-d mask": ((2, 2, 3, 4),) * 3 + ((1, 3), {}),
    "3-d, 1-d mask": ((2, 3, 4),) * 3 + ((3,), {}),
    "3-d, 0-d mask": ((2, 3, 4),) * 3 + ((), {}),
    "5-d, 1-d mask": ((2, 2, 2, 3, 4),) * 3 + ((3,), {}),
}


@pytest.mark.parametrize("mask_dtype", ["bool", "float32"])
@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_sdpa_short_mask_as_pytorch(case, mask_dtype):
    *shapes, mask_shape, kw = SDPA_CASES[case]
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    mask = rng.standard_normal(mask_shape) > 0 if mask_dtype == "bool" \
        else rng.standard_normal(mask_shape).astype(np.float32)
    want, _ = _outcome(lambda: torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(a) for a in (q, k, v)), attn_mask=torch.tensor(mask), **kw))
    args = tuple(graphc.tensor(a) for a in (q, k, v, mask))

    def sdpa(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    for backend in ("eager", "interp"):
        got, message = _outcome(lambda: _run(backend, sdpa, *args))
        assert got == want, (backend, message)
        if want is IndexError:
            assert message.startswith("scaled_dot_product_attention at ")
            assert "test_attention_mask_parity.py:" in message
            assert "attn_mask.reshape(1, -1)" in message


def test_sdpa_short_mask_advice_works():
    q = graphc.randn(2, 2, 3, 4)
    mask = graphc.tensor([True, False, True])
    with pytest.raises(IndexError):
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    np.testing.assert_allclose(
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask.reshape(1, -1)).numpy(),
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask.expand(3, 3)).numpy())


def _mha_cases():
    """(name, module keywords, query, key, value shapes, keyword arrays)."""
    b3, u2 = (2, 3, 8), (3, 8)
    boolean = np.bool_

    def m(*shape, dtype=boolean):
        return np.zeros(shape, dtype=dtype)

    return {
        "batched, 1-d attn_mask": ({}, b3, b3, b3, {"attn_mask": m(3)}),
        "batched, 4-d attn_mask": ({}, b3, b3, b3, {"attn_mask": m(1, 2, 3, 3)}),
        "batched, 1-d key_padding_mask": ({}, b3, b3, b3, {"key_padding_mask": m(3)}),
        "batched, key_padding_mask of another batch": (
            {}, b3, b3, b3, {"key_padding_mask": m(3, 3)}),
        "batched, key_padding_mask of another length": (
            {}, b3, b3, b3, {"key_padding_mask": m(2, 4)}),
        "batched, 2-d attn_mask of another length": ({}, b3, b3, b3, {"attn_mask": m(3, 4)}),
        "batched, 3-d attn_mask of another batch": ({}, b3, b3, b3, {"attn_mask": m(3, 3, 3)}),
        "batched, int attn_mask": ({}, b3, b3, b3, {"attn_mask": m(3, 3, dtype=np.int64)}),
        "batched, 2-d key": ({}, b3, u2, u2, {}),
        "batched, value longer than key": ({}, b3, b3, (2, 4, 8), {}),
        "batched, kdim, value longer than key": (
            {"kdim": 5, "vdim": 6}, b3, (2, 3, 5), (2, 4, 6), {}),
        "batched, other embedding": ({}, (2, 3, 6), (2, 3, 6), (2, 3, 6), {}),
        "4-d query": ({}, (1,) + b3, (1,) + b3, (1,) + b3, {}),
        "unbatched, 1-d attn_mask": ({}, u2, u2, u2, {"attn_mask": m(3)}),
        "unbatched, 2-d key_padding_mask": ({}, u2, u2, u2, {"key_padding_mask": m(1, 3)}),
        "unbatched, 3-d attn_mask of other heads": ({}, u2, u2, u2, {"attn_mask": m(4, 3, 3)}),
        "unbatched, 1-d key_padding_mask": ({}, u2, u2, u2, {"key_padding_mask": m(3)}),
        "unbatched, 3-d attn_mask": ({}, u2, u2, u2, {"attn_mask": m(2, 3, 3)}),
    }


@pytest.mark.parametrize("backend", ["eager", "interp"])
@pytest.mark.parametrize("case", sorted(_mha_cases()))
def test_multihead_attention_bad_input_as_pytorch(case, backend):
    module_kw, *shapes, masks = _mha_cases()[case]
    ours, ref = _twins(**module_kw)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    want, want_message = _outcome(lambda: ref(
        *(torch.tensor(a) for a in (q, k, v)), **{n: torch.tensor(a) for n, a in masks.items()}))
    names = sorted(masks)

    def call(q, k, v, *mask_tensors):
        return ours(q, k, v, **dict(zip(names, mask_tensors)))

    got, message = _outcome(lambda: _run(
        backend, call, *(graphc.tensor(a) for a in (q, k, v)),
        *(graphc.tensor(masks[n]) for n in names)))
    assert got == want, message
    if want != "ok":
        # PyTorch's words (its torch.Size printed as graphc.Size), where, and what to do
        assert want_message.replace("torch.Size", "graphc.Size") in message, message
        assert re.match(r"MultiheadAttention at test_attention_mask_parity\.py:\d+: ", message)
        assert len(message) > len("MultiheadAttention at x.py:1: ") + len(want_message) + 10


def test_multihead_attention_refusals_are_graphc_errors():
    ours, _ = _twins()
    x = graphc.randn(2, 3, 8)
    with pytest.raises(GraphcError):
        ours(x, x, x, attn_mask=graphc.zeros(3, dtype=graphc.bool))
