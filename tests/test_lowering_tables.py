"""Every registry op is lowered, rendered through a scalar rule, or refused with a reason,
in every backend (graphc.backends.common states the table contract)."""

from __future__ import annotations

import pytest

import graphc  # noqa: F401  (registers every op)
from graphc.backends.coverage import TABLES, coverage
from graphc.ops.registry import REGISTRY


@pytest.mark.parametrize("backend", sorted(TABLES))
def test_every_op_is_lowered_or_refused_with_a_reason(backend):
    missing = [op for op, how in coverage(backend).items() if how == "missing"]
    assert not missing, (f"{backend} backend: no lowering, scalar rule or declared refusal "
                         f"for {missing}; add a table entry (docs/dev/writing-ops.md)")


@pytest.mark.parametrize("backend", sorted(TABLES))
def test_tables_name_registry_ops_and_refusals_give_reasons(backend):
    import importlib

    ops_module = importlib.import_module(TABLES[backend][0])
    assert set(ops_module.LOWERINGS) <= set(REGISTRY), "a lowering of an op that is not there"
    for op, reason in ops_module.REFUSALS.items():
        assert op in REGISTRY and isinstance(reason, str) and reason.strip(), op
    for op, lower in ops_module.LOWERINGS.items():
        assert callable(lower) and lower.__name__ != "<lambda>", op


def test_epilogue_anchors_have_anchor_lowerings():
    import importlib

    anchors = {name for name, op in REGISTRY.items() if op.epilogue_anchor}
    for backend in TABLES:
        module = importlib.import_module(TABLES[backend][0])
        # an anchor that renders the whole fused node (a bucket's wait, cpu), or one the
        # backend refuses with its reason, needs no epilogue lowering
        whole = set(getattr(module, "FUSED_ANCHOR_LOWERINGS", ()))
        assert set(module.EPILOGUE_ANCHOR_LOWERINGS) | whole | set(module.REFUSALS) >= \
            anchors, backend
        assert set(module.EPILOGUE_ANCHOR_LOWERINGS) | whole <= anchors, backend


def test_an_op_without_a_table_entry_is_reported_missing(monkeypatch):
    import dataclasses

    monkeypatch.setitem(REGISTRY, "mystery", dataclasses.replace(REGISTRY["flip"],
                                                                 name="mystery"))
    for backend in TABLES:
        assert coverage(backend)["mystery"] == "missing"
