"""Where `sys.getrefcount` counts differently from CPython 3.10-3.13 with the GIL (3.14's
borrowed local loads count one fewer), graphc must not reuse an output array or adopt a
gradient on a count: it would take an array the user holds for a free one. These tests
simulate such an interpreter by making getrefcount read one fewer."""

from __future__ import annotations

import sys
import sysconfig

import numpy as np
import pytest

import graphc
from graphc import refcounts
from graphc.backends.cpu import executable as cpu_executable
from graphc.backends.cpu import steady_call

pytest.importorskip("llvmlite")


class _BorrowedCounts:
    """A `sys` whose getrefcount reads one fewer, as CPython 3.14's borrowed loads do."""

    def __getattr__(self, name):
        return getattr(sys, name)

    @staticmethod
    def getrefcount(value):  # (this frame's own parameter is one more to take away)
        return sys.getrefcount(value) - 2


def test_counts_are_exact_on_a_gil_cpython_before_3_14():
    expected = sys.version_info < (3, 14) and not sysconfig.get_config_var("Py_GIL_DISABLED")
    assert refcounts.COUNTS_ARE_EXACT is expected
    assert refcounts.counts_are_exact() is expected


def test_the_measurement_sees_borrowed_counts(monkeypatch):
    monkeypatch.setattr(refcounts, "sys", _BorrowedCounts())
    assert refcounts.counts_are_exact() is False


def _held_outputs_after_three_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    f = graphc.compile(lambda x: x * 2.0 + 1.0, backend="cpu")
    n = 1 << 16  # 256 KiB outputs: large enough to be kept and reused
    inputs = [graphc.tensor(np.full(n, float(i), np.float32)) for i in range(3)]
    with graphc.no_grad():
        held = [f(inputs[0]), f(inputs[1])]
        held.append(f(inputs[2]))
    return [t.numpy() for t in held]


def test_borrowed_counts_with_the_guard_never_overwrite_a_held_output(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_executable, "sys", _BorrowedCounts())
    monkeypatch.setattr(cpu_executable, "COUNTS_ARE_EXACT", False)
    monkeypatch.setattr(steady_call, "COUNTS_ARE_EXACT", False)
    monkeypatch.setattr(steady_call, "sys", _BorrowedCounts())
    outs = _held_outputs_after_three_calls(tmp_path, monkeypatch)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.full(out.shape, i * 2.0 + 1.0, np.float32))


def test_the_guard_is_what_protects_them(tmp_path, monkeypatch):
    """Without the guard, the same borrowed counts make a held output look free: the
    check above would fail (this test keeps it honest)."""
    monkeypatch.setattr(cpu_executable, "sys", _BorrowedCounts())
    monkeypatch.setattr(steady_call, "sys", _BorrowedCounts())
    outs = _held_outputs_after_three_calls(tmp_path, monkeypatch)
    wrong = [i for i, out in enumerate(outs) if not np.all(out == i * 2.0 + 1.0)]
    assert wrong, "borrowed counts did not reach the reuse check: the test above proves nothing"


def test_borrowed_counts_adopt_no_gradient(monkeypatch):
    from graphc.autograd import graph

    monkeypatch.setattr(graph, "COUNTS_ARE_EXACT", False)
    w = graphc.tensor(np.ones((64, 64), np.float32), requires_grad=True)
    (w * 3.0).sum().backward()
    first = w.grad
    (w * 3.0).sum().backward()
    np.testing.assert_array_equal(first.numpy(), np.full((64, 64), 6.0, np.float32))
