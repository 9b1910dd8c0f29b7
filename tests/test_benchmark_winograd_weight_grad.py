"""benchmarks/winograd_weight_grad.py: --rounds, --batch or --threads below 1 is refused with
a message before any layer compiles (else minutes of compiling, then every figure the median
of nothing: nan)."""

from __future__ import annotations

import pytest

from benchmarks import winograd_weight_grad


@pytest.mark.parametrize("flag", ["--rounds", "--batch", "--threads"])
def test_a_count_below_one_is_refused_clearly(flag, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # main sets both from --threads: put back
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    with pytest.raises(SystemExit):
        winograd_weight_grad.main([flag, "0"])
    assert f"{flag} must be at least 1, got 0" in capsys.readouterr().err
