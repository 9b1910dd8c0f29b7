"""ONNX's own backend node tests through graphc.onnx.backend: every case the installed onnx
generates (1,884 in onnx 1.23) runs, in memory, in about 20 s; the pass count may only go up.
The 140 small model tests stored in onnx's test data run the same way.

A case graphc does not map is *refused* (UnsupportedOnnxOp, or value types graphc has no
tensor for); docs/onnx.md lists the refusals by op. A case that runs must match: no case may
fail or error (a wrong answer or a crash is a bug, unlike a refusal)."""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx", reason="ONNX tests need the [onnx] extra: pip install onnx")

from graphc.onnx import conformance  # noqa: E402

# Node tests passing with onnx 1.23.2. Raise it when more pass; never lower it.
NODE_TESTS_PASSING = 1384
# The small model tests in onnx's test data (simple, pytorch-converted, pytorch-operator).
MODEL_TESTS_PASSING = 124


@pytest.fixture(scope="module")
def outcomes():
    return conformance.run_node_tests()


def test_node_test_pass_count_never_goes_down(outcomes):
    passed = sum(o.status == "passed" for o in outcomes)
    assert passed >= NODE_TESTS_PASSING, conformance.summary(outcomes)


def test_no_node_test_fails_or_errors(outcomes):
    bad = [o for o in outcomes if o.status in ("failed", "error")]
    assert not bad, "\n".join(f"{o.name} ({o.op_type}): {o.status}: {o.detail}" for o in bad)


def test_refusals_say_what(outcomes):
    refused = [o for o in outcomes if o.status == "refused"]
    assert refused and all(o.detail for o in refused)
    assert all("not supported by graphc" in o.detail or "no tensor for" in o.detail
               for o in refused)


def test_subset_is_deterministic(outcomes):
    cases = conformance.collect_cases()
    assert [c.name for c in conformance.subset(cases, 8)] == \
        [c.name for c in conformance.subset(cases, 8)]
    assert 0 < len(conformance.subset(cases, 8)) < len(cases)


def test_model_tests_of_onnx_test_data():
    outcomes = conformance.run_node_tests(conformance.collect_model_cases())
    passed = sum(o.status == "passed" for o in outcomes)
    assert passed >= MODEL_TESTS_PASSING, conformance.summary(outcomes)
    bad = [o for o in outcomes if o.status in ("failed", "error")]
    assert not bad, "\n".join(f"{o.name} ({o.op_type}): {o.status}: {o.detail}" for o in bad)
