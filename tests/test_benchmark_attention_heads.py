"""Smoke run of benchmarks/attention_heads.py: the GPT's heads compile to the one-block
kernels, both kernels are timed, attention_small.py of a revision compiles as a variant of
its own with the same results, and attention's module is put back."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llvmlite")

from benchmarks import attention_heads  # noqa: E402
from graphc.backends.cpu import attention, attention_small, small_gemm  # noqa: E402


@pytest.mark.skipif(not small_gemm.lanes(), reason="no AVX2/FMA: no one-block kernels")
def test_attention_heads_against_a_revision(capsys):
    attention_heads.main(["--rounds", "1", "--against", "HEAD"])
    out = capsys.readouterr().out
    for name in ("tree", "HEAD"):
        assert re.search(rf"{name}: attention [\d.]+ us, attention_backward [\d.]+ us", out), out
    assert out.count("of its largest value apart") == 4 and "load average:" in out
    assert attention.attention_small is attention_small
    with pytest.raises(SystemExit, match="no graphc/backends/cpu/attention_small.py"):
        attention_heads.main(["--rounds", "1", "--against", "no-such-revision"])
