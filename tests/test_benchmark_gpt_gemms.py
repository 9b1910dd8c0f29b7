"""benchmarks/gpt_gemms.py: its variants set module constants that exist (a renamed one
would otherwise be set on the module and change nothing, every variant then the same), and
--rounds below 1 is refused with a message before anything compiles."""

from __future__ import annotations

import pytest

from benchmarks import gpt_gemms


def test_every_variant_sets_constants_that_exist():
    for name, settings in gpt_gemms.VARIANTS.items():
        for key in settings:
            owner, attr = gpt_gemms.owner(key)
            assert hasattr(owner, attr), f"variant {name!r}: {owner.__name__} has no {attr}"


def test_the_variant_puts_the_constants_back(tmp_path, monkeypatch):
    from graphc.backends.cpu import gemm_addends, small_gemm

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # the variant sets it: put back
    with gpt_gemms._variant("before", str(tmp_path)):
        assert small_gemm.MEDIUM_N == 0 and gemm_addends.FOLD is False
    assert small_gemm.MEDIUM_N > 0 and gemm_addends.FOLD is True


@pytest.mark.parametrize("rounds", ["0", "-3"])
def test_no_rounds_is_refused_clearly(rounds, capsys):
    with pytest.raises(SystemExit):
        gpt_gemms.main(["--rounds", rounds])
    assert f"--rounds must be at least 1, got {rounds}" in capsys.readouterr().err


def test_the_mathlib_variant_swaps_every_user_and_puts_it_back(tmp_path, monkeypatch):
    """mathlib@HEAD: the committed mathlib.py as a module of its own in every module that
    bound mathlib at import (a module left out would lower with the working tree's)."""
    import importlib

    from graphc.backends.cpu import mathlib, scalars

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    users = [importlib.import_module(name) for name in gpt_gemms.MATHLIB_USERS]
    with gpt_gemms._variant(f"{gpt_gemms.MATHLIB_AT}HEAD", str(tmp_path)):
        assert all(user.mathlib is scalars.mathlib is not mathlib for user in users)
        assert callable(scalars.mathlib.gelu)
    assert all(user.mathlib is mathlib for user in users)


def test_the_shapes_table_names_each_product_by_m_n_k():
    """--shapes: each GEMM node's kernel labelled m x n x k from the profiled graph's
    operands (a's leading dims folded into m), with its FLOPs."""
    import numpy as np

    import graphc

    def two_products(x, w1, w2):
        return (x @ w1) @ w2

    rng = np.random.default_rng(3)
    args = [graphc.tensor(rng.standard_normal(s).astype(np.float32))
            for s in ((4, 64, 48), (48, 32), (32, 16))]
    compiled = graphc.compile(two_products, backend="cpu")
    compiled(*args)
    report = graphc.profile(compiled, *args, repeat=2)
    rows = sorted(report.rows, key=lambda row: row.step)  # as interleaved_profiles gives them
    seconds = {row.step: row.seconds for row in rows}
    shapes = gpt_gemms.gemm_shapes(rows, seconds, report.graph)
    assert {label: (count, flops) for label, (count, flops, _) in shapes.items()} == {
        "256 x 32 x 48 matmul": (1, 2 * 256 * 32 * 48),
        "256 x 16 x 32 matmul": (1, 2 * 256 * 16 * 32)}
