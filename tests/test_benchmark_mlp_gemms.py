"""benchmarks/mlp_gemms.py: its variants set small_gemm thresholds that exist (a renamed
constant would otherwise be set on the module and change nothing), "before" takes the
generated kernels away from the first Linear's forward and the short-k weight gradients,
one round of the products alone runs, and --rounds below 1 is refused with a message."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")

from benchmarks import mlp_gemms  # noqa: E402
from graphc.backends.cpu import small_gemm  # noqa: E402


def test_every_variant_sets_thresholds_that_exist():
    for name, thresholds in mlp_gemms.VARIANTS.items():
        for attr in thresholds:
            assert hasattr(small_gemm, attr), f"variant {name!r}: small_gemm has no {attr}"


@pytest.mark.skipif(small_gemm.lanes() != 16, reason="the rules under test are AVX-512 only")
def test_before_leaves_the_first_layers_products_to_the_blas(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # the variant sets it: put back
    forward = (256, 64, 784, 784, 1, 64, True)
    weight_gradient = (256, 256, 64, 1, 256, 256)
    with mlp_gemms._variant("before", str(tmp_path), "rules"):
        assert small_gemm.tile_for(*forward) is None
        assert small_gemm.tile_for(*weight_gradient) is None
    assert small_gemm.tile_for(*forward) is not None  # the thresholds are put back
    assert small_gemm.tile_for(*weight_gradient).k_outer


def test_one_round_of_the_products_alone(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    mlp_gemms._products(1, str(tmp_path), ["before", "after"])
    out = capsys.readouterr().out
    for label, _, _ in mlp_gemms.PRODUCTS:
        assert label in out
    assert out.count(" us ") == 2 * len(mlp_gemms.PRODUCTS)


def test_no_rounds_is_refused_clearly(capsys):
    with pytest.raises(SystemExit):
        mlp_gemms.main(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
