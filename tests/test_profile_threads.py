"""graphc.profile's thread count: the count the executable runs now (a fresh one: one
thread, whatever the cores), or `threads=n`; the report says which, and a count the
executable cannot use is a clear error."""

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import threads  # noqa: E402
from graphc.errors import GraphcError  # noqa: E402

ALL_CORES = threads.most_threads()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _function():
    def f(x):  # 2^17 elements: the elementwise kernel forks where there are cores
        return (x * 2.0).relu() + 1.0

    return graphc.compile(f, backend="cpu"), graphc.randn(256, 512)


def _recorded_counts(monkeypatch) -> list:
    """The `fixed` counts of the ThreadChoosers made while the test runs."""
    made = []
    real = threads.ThreadChooser

    def recording(most, fixed=None, **kwargs):
        made.append(fixed)
        return real(most, fixed=fixed, **kwargs)

    monkeypatch.setattr(threads, "ThreadChooser", recording)
    return made


def test_a_fresh_executable_is_profiled_on_its_current_count(monkeypatch):
    f, x = _function()
    f(x)  # a fresh executable's chooser starts on one thread
    made = _recorded_counts(monkeypatch)
    report = graphc.profile(f, x, repeat=2)
    assert made[-1] == 1  # (the profiling twin first makes a chooser of its own)
    assert report.threads == 1
    assert "2 runs, 1 thread)" in report.table()


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or no libgomp): one count to profile")
def test_threads_profiles_the_count_asked(monkeypatch):
    f, x = _function()
    made = _recorded_counts(monkeypatch)
    one = graphc.profile(f, x, repeat=2, threads=1)
    every = graphc.profile(f, x, repeat=2, threads=ALL_CORES)
    assert [c for c in made if c is not None] == [1, ALL_CORES]  # (None: fresh choosers)
    assert (one.threads, every.threads) == (1, ALL_CORES)
    assert f"2 runs, {ALL_CORES} threads)" in every.table()
    # the same kernels at either count
    assert sorted(r.step for r in one.rows) == sorted(r.step for r in every.rows)
    assert np.isfinite(every.total) and every.total > 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_a_bad_thread_count_says_what_to_pass(bad):
    f, x = _function()
    with pytest.raises(GraphcError, match="threads must be a whole number of at least 1"):
        graphc.profile(f, x, repeat=1, threads=bad)


def test_more_threads_than_the_executable_uses_is_an_error():
    f, x = _function()
    with pytest.raises(GraphcError, match=f"at most {ALL_CORES} thread"):
        graphc.profile(f, x, repeat=1, threads=ALL_CORES + 1)
