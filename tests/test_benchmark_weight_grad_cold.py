"""benchmarks/weight_grad_cold.py: its variants set small_gemm constants that exist (a renamed
one would be set on the module and change nothing), and --rounds below 1 is refused."""

from __future__ import annotations

import pytest

from benchmarks import gpt_gemms, weight_grad_cold


def test_every_variant_sets_constants_that_exist():
    for name, settings in weight_grad_cold.VARIANTS.items():
        for key in settings:
            owner, attr = gpt_gemms.owner(key)
            assert hasattr(owner, attr), f"variant {name!r}: {owner.__name__} has no {attr}"


@pytest.mark.parametrize("rounds", ["0", "-3"])
def test_no_rounds_is_refused_clearly(rounds, capsys):
    with pytest.raises(SystemExit):
        weight_grad_cold.main(["--rounds", rounds])
    assert f"--rounds must be at least 1, got {rounds}" in capsys.readouterr().err
