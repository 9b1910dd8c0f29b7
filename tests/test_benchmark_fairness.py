"""The benchmark harness is fair to every contender alike (benchmarks/harness.py): a sample
never pays for the state another contender's sample left behind, and the timed loop never
holds a contender's result (so a contender that reuses dropped memory can do so).

The clock is a fake one here: each call advances it by a fixed cost, so the figures are exact
and no assertion depends on this machine's speed.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from benchmarks import harness
from benchmarks.harness import Contender, interleaved_medians


class FakeMachine:
    """A clock and a shared cache: `noisy` evicts the cache, so the next call of `quiet`
    costs COLD seconds instead of WARM (as PyTorch's page faults slowed graphc's conv2d)."""

    WARM, COLD, NOISY = 1.0, 3.0, 2.0

    def __init__(self) -> None:
        self.time = 0.0
        self.evicted = False

    def quiet(self) -> None:
        self.time += self.COLD if self.evicted else self.WARM
        self.evicted = False

    def noisy(self) -> None:
        self.time += self.NOISY
        self.evicted = True


@pytest.fixture
def machine(monkeypatch):
    fake = FakeMachine()
    monkeypatch.setitem(harness.CLOCKS, "fake", lambda: fake.time)
    harness.set_clock("fake")
    yield fake
    harness.set_clock("wall")


def test_a_sample_does_not_pay_for_the_previous_contenders_evictions(machine):
    quiet = Contender("quiet", run=machine.quiet)
    noisy = Contender("noisy", run=machine.noisy)
    interleaved_medians([quiet, noisy], repeat=6, warmup=1, warmup_seconds=0.0)
    assert quiet.rounds == noisy.rounds == 6
    assert quiet.seconds == FakeMachine.WARM  # COLD if its sample followed noisy's directly
    assert noisy.seconds == FakeMachine.NOISY


def test_reset_runs_after_the_priming_calls_just_before_the_sample(machine):
    events = []
    step = Contender("step", run=lambda: (events.append("run"), machine.quiet()),
                     reset=lambda: events.append("reset"))
    interleaved_medians([step], repeat=5, warmup=1, warmup_seconds=0.0)
    # a warm-up call, the reset, the calibrating call; then per round: the priming call, the
    # reset and the timed call
    assert events == ["run", "reset", "run"] + ["run", "reset", "run"] * 5
    assert step.seconds == FakeMachine.WARM


def test_the_timed_loop_holds_no_result(machine):
    class Result:
        pass

    previous: list[weakref.ref] = []
    held = []

    def run():
        machine.quiet()
        gc.collect()
        if previous:
            held.append(previous[-1]() is not None)
        result = Result()
        previous[:] = [weakref.ref(result)]
        return result

    interleaved_medians([Contender("r", run=run)], repeat=5, warmup=2, warmup_seconds=0.0)
    assert len(held) >= 7 and not any(held)


def test_the_report_header_names_the_malloc_setting():
    from benchmarks.run import header

    assert "malloc" not in header(["--quick"], "cpu")
    assert header(["--quick"], "cpu", malloc="malloc: kept").endswith("; malloc: kept")
