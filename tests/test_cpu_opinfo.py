"""Every OpInfo op, forward and backward, compiled on the CPU backend matches the interpreter.

One test per (OpInfo entry, sample) from tests/compile_opinfo.py: the sample traced, compiled
with graphc.backends.compile(graph, "cpu") and compared with eager, the interpreter and the
float64 reference (graphc.testing.assert_compiled_matches), gradients included for
differentiable entries. Cases the CPU backend (or tracing) refuses by design are listed in
compile_opinfo.EXPECTED_ERRORS with the reason, and checked to fail with that clear error.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from tests.compile_opinfo import EXPECTED_ERRORS, cases, check_case, coverage_gaps  # noqa: E402

CASES = list(cases())


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_compiled_matches_interpreter(case):
    check_case(case, "cpu")


def test_every_registry_op_is_checked_on_cpu():
    assert coverage_gaps("cpu") == [], "registry ops no checked OpInfo case exercises on cpu"


def test_expected_errors_name_real_cases():
    keys = {c.key for c in CASES}
    listed = {k for table in EXPECTED_ERRORS.values() for k in table}
    assert listed <= keys, f"EXPECTED_ERRORS names cases the table lacks: {listed - keys}"
