"""Review of the eleventh session's attention errors and empty keys (h7:
F.scaled_dot_product_attention's IndexError for a mask under 2-d where PyTorch 2.13's flash
kernel reads its dim -2; no keys give zeros with a mask too), as a seeded fuzzer against
PyTorch 2.13 CPU: 3-d and 4-d query, key and value (grouped heads with enable_gqa, key and
value of other head counts), masks of 0 to 4 dims (bool, float32, broadcast or misshapen),
is_causal, dropout_p 0, empty query or key sequences. For each draw either both raise, with
the same exception class (graphc's a GraphcError naming the op and the user's line), or
both return the same values, eagerly and through the interpreter.

Left out: an empty query or key sequence with inputs PyTorch would refuse otherwise (a
misshapen mask, key heads that do not divide the query's, is_causal with a mask): PyTorch
2.13 returns an empty or zero result there before any check, where graphc raises its usual
error (noted in the review's report, left as it is).
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn.functional as F
from graphc.errors import GraphcError

torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")


def _draw(rng):
    rank = int(rng.choice([3, 4, 4]))
    b, h, e = int(rng.integers(1, 3)), int(rng.choice([1, 2, 4])), int(rng.choice([2, 4]))
    length, source = int(rng.choice([0, 1, 3, 5])), int(rng.choice([0, 1, 3, 4]))
    kv_heads = int(rng.choice([h, 1, 2])) if rank == 4 else h
    gqa = bool(rng.integers(2)) and rank == 4
    if rank == 4:
        shapes = [(b, h, length, e), (b, kv_heads, source, e), (b, kv_heads, source, e)]
    else:
        shapes = [(b, length, e), (b, source, e), (b, source, e)]
    mask_rank = int(rng.choice([-1, 0, 1, 2, 2, 3, 4]))
    full = (b, h, length, source)
    if mask_rank < 0:
        mask_shape = None
    else:
        mask_shape = tuple(full[4 - mask_rank:]) if mask_rank else ()
        mask_shape = tuple(1 if rng.random() < 0.3 else d for d in mask_shape)
        if mask_shape and rng.random() < 0.15:  # misshapen
            k = int(rng.integers(len(mask_shape)))
            mask_shape = mask_shape[:k] + (mask_shape[k] + 2,) + mask_shape[k + 1:]
    kind = str(rng.choice(["bool", "float32"]))
    causal = bool(rng.random() < 0.25)
    if 0 in (length, source):  # PyTorch returns before any check (module docstring)
        shapes[1:] = [s[:1] + (h,) + s[2:] if rank == 4 else s for s in shapes[1:]]
        mask_shape = None if mask_shape is None else \
            tuple(m if m == f else 1 for m, f in zip(mask_shape, full[4 - len(mask_shape):]))
        causal = causal and mask_shape is None
        if mask_shape is not None and rank == 3:  # a 3-d query's dims are (b, L, S)
            mask_shape = tuple(1 for _ in mask_shape[:-2]) + mask_shape[-2:]
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    mask = None
    if mask_shape is not None:
        keep = rng.random(mask_shape) < 0.7
        mask = keep if kind == "bool" else np.where(keep, rng.standard_normal(mask_shape),
                                                    -np.inf).astype(np.float32)
    what = (f"q{shapes[0]} k{shapes[1]} mask {None if mask is None else (kind, mask_shape)} "
            f"causal={causal} gqa={gqa}")
    return arrays, mask, causal, gqa, what


def _call(lib, arrays, mask, causal, gqa):
    q, k, v = (lib.tensor(a) for a in arrays)
    m = None if mask is None else lib.tensor(mask)
    return lib.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                          is_causal=causal, enable_gqa=gqa)


def _outcome(fn):
    try:
        return fn().detach().numpy() if hasattr(fn(), "detach") else fn()
    except Exception as error:  # noqa: BLE001 (the class is what is compared)
        return error


def _check(got, want, what):
    if isinstance(want, Exception):
        assert isinstance(got, Exception), f"{what}: PyTorch raised {want!r}, graphc returned"
        base = next(c for c in (IndexError, AssertionError, RuntimeError, ValueError,
                                TypeError) if isinstance(want, c))
        assert isinstance(got, base), f"{what}: PyTorch raised {want!r}, graphc {got!r}"
        assert isinstance(got, GraphcError), f"{what}: {got!r} is not a GraphcError"
        # attention's own checks name it, its primitives' (add, matmul) themselves; both the
        # user's line
        assert " at test_review_s11_attention" in str(got), f"{what}: no user line: {got}"
        return
    assert not isinstance(got, Exception), f"{what}: graphc raised {got!r}, PyTorch did not"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-4, atol=1e-5,
                               err_msg=what)


@pytest.mark.parametrize("seed", range(4))
def test_eager_attention_raises_or_returns_as_pytorch(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        arrays, mask, causal, gqa, what = _draw(rng)
        want = _outcome(lambda: _call(torch, arrays, mask, causal, gqa))
        got = _outcome(lambda: _call(graphc, arrays, mask, causal, gqa))
        _check(got, want, what)


def test_interpreted_attention_raises_or_returns_as_pytorch():
    rng = np.random.default_rng(99)
    for _ in range(25):
        arrays, mask, causal, gqa, what = _draw(rng)
        want = _outcome(lambda: _call(torch, arrays, mask, causal, gqa))

        def compiled():
            def attend(q, k, v, m):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                      enable_gqa=gqa)
            fn = graphc.compile(attend, backend="interp")
            return fn(*(graphc.tensor(a) for a in arrays),
                      None if mask is None else graphc.tensor(mask))

        _check(_outcome(compiled), want, what)


ENLARGING = [  # (query, key, mask): a mask whose broadcast with the scores is larger
    ((1, 4, 5, 2), (1, 4, 1, 2), (3, 4, 5, 1)),
    ((1, 5, 2), (1, 3, 2), (2, 5, 3)),
    ((2, 5, 2), (2, 3, 2), (4, 2, 5, 3)),
    ((1, 2, 5, 2), (1, 2, 3, 2), (2, 1, 5, 3)),
]


@pytest.mark.parametrize("kind", ["bool", "float32"])
@pytest.mark.parametrize("shapes", ENLARGING, ids=lambda s: "-".join(map(str, s[2])))
def test_a_mask_that_would_enlarge_the_scores_raises_as_pytorch(shapes, kind):
    """PyTorch 2.13 adds the mask to the scores in place: a mask whose broadcast with them is
    larger (more leading dims, or a larger one) raises RuntimeError "output with shape [...]
    doesn't match the broadcast shape [...]"; graphc broadcast the output to the larger shape.
    Where a sequence is empty PyTorch returns before, with the query's shape."""
    rng = np.random.default_rng(0)
    q, k, m = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    m = m > 0 if kind == "bool" else m
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape") as torch_error:
        _call(torch, [q, k, k], m, False, False)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape") as error:
        _call(graphc, [q, k, k], m, False, False)
    assert isinstance(error.value, GraphcError)
    assert str(torch_error.value) in str(error.value)
    assert "scaled_dot_product_attention at test_review_s11_attention_errors_fuzz.py" in str(
        error.value)
    no_keys = k[..., :0, :]
    want = _call(torch, [q, no_keys, no_keys], m[..., :0], False, False)
    got = _call(graphc, [q, no_keys, no_keys], m[..., :0], False, False)
    assert tuple(got.shape) == tuple(want.shape) == q.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())
