"""A runtime-sized cpu executable's steady call (graphc.backends.cpu.runtime_sizes, written out
per call size by graphc.backends.cpu.steady_call), and a symbolic entry's first try
(graphc.jit.shape_checks): the same checks, errors and bits as the general path, with sizes
changing between steady calls, the arena growing, and wrong inputs after a few steady calls."""

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.backends import compile as backend_compile
from graphc.errors import GraphcError
from graphc.ir import parse
from graphc.jit.shape_checks import fast_checks

LINEAR = '''graph @f(%x: f32[s0,40], %w: f32[40,24], %b: f32[24]) -> (f32[s0,24], f32[s0,24]) {
  %0: f32[s0,24] = matmul(%x, %w)
  %1: f32[s0,24] = add(%0, %b)
  %2: f32[s0,24] = relu(%1)
  %3: f32[s0,24] = tanh(%1)
  return (%2, %3)
}'''


def _inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 40), np.float32), rng.standard_normal((40, 24), np.float32),
            rng.standard_normal(24, np.float32))


def _sized(ex, n: int):
    """The runtime-sized executable's table for the size s0 = n (its steady call on it)."""
    return ex._generic._sized[(n,)]


def _error(call) -> tuple[type, str]:
    with pytest.raises(GraphcError) as info:
        call()
    return type(info.value), str(info.value)


def test_a_size_called_again_takes_its_steady_call_with_the_general_calls_bits():
    ex = backend_compile(parse(LINEAR), "cpu")
    general = backend_compile(parse(LINEAR), "cpu")
    assert ex.runs_generic
    arrays = _inputs(3000)  # 3000 rows: large outputs, kept and reused (RECYCLE_MIN_BYTES)
    results = []
    for _ in range(4):
        results.append(ex.run(*arrays))
    assert _sized(ex, 3000).steady is not None  # written out at the size's second call
    # the general path of another executable: a fresh copy of the inputs every call
    want = general.run(*(a.copy() for a in arrays))
    assert _sized(general, 3000).steady is None
    for got in results[1:]:
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_sizes_changing_between_steady_calls_give_each_size_its_results():
    ex = backend_compile(parse(LINEAR), "cpu")
    reference = backend_compile(parse(LINEAR), "interp")
    by_size = {n: _inputs(n, seed=n) for n in (8, 5, 3000, 8)}
    for n in (8, 8, 8, 5, 8, 3000, 3000, 8, 5, 5, 3000, 8):  # 3000 grows the arena
        got = ex.run(*by_size[n])
        want = reference.run(*by_size[n])
        assert got[0].shape == (n, 24)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert all(_sized(ex, n).steady is not None for n in (8, 5, 3000))
    # each steady call is for the arena it was written for: none holds an older one
    arena = ex._generic._raw
    assert all(_sized(ex, n).arena is None or _sized(ex, n).arena is arena for n in (8, 5, 3000))


def test_a_grown_arena_is_not_used_through_an_older_steady_call():
    ex = backend_compile(parse(LINEAR), "cpu")
    small, large = _inputs(4), _inputs(5000, seed=1)
    for _ in range(3):
        ex.run(*small)
    old = _sized(ex, 4).steady
    assert old is not None
    ex.run(*large)  # the arena grows: every size's tail and steady call are dropped
    assert _sized(ex, 4).steady is None
    reference = backend_compile(parse(LINEAR), "interp")
    for _ in range(3):
        for g, w in zip(ex.run(*small), reference.run(*small)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert _sized(ex, 4).steady is not None and _sized(ex, 4).steady is not old


@pytest.mark.parametrize("bad", ["columns", "dtype", "rank", "count", "weight_rows"])
def test_a_wrong_input_after_steady_calls_raises_the_first_calls_error(bad):
    x, w, b = _inputs(16)
    wrong = {"columns": lambda: (np.ones((16, 41), np.float32), w, b),
             "dtype": lambda: (x.astype(np.float64), w, b),
             "rank": lambda: (np.ones((16, 40, 1), np.float32), w, b),
             "count": lambda: (x, w),
             "weight_rows": lambda: (x, np.ones((41, 24), np.float32), b)}[bad]()
    fresh = backend_compile(parse(LINEAR), "cpu")
    fresh.run(x, w, b)  # the size's first call: the general path only
    expected = _error(lambda: fresh.run(*wrong))
    ex = backend_compile(parse(LINEAR), "cpu")
    for _ in range(4):
        ex.run(x, w, b)
    assert _sized(ex, 16).steady is not None
    assert _error(lambda: ex.run(*wrong)) == expected
    # and the next right call is served as before
    np.testing.assert_array_equal(ex.run(x, w, b)[0], fresh.run(x, w, b)[0])


def test_an_index_out_of_range_in_a_steady_call_names_the_calls_sizes():
    ex = backend_compile(parse('''graph @f(%w: f32[10,4], %i: i64[s0]) -> (f32[s0,4]) {
      %0: f32[s0,4] = embedding[padding_idx=none](%w, %i)
      return (%0)
    }'''), "cpu")
    w, i = np.arange(40, dtype=np.float32).reshape(10, 4), np.array([9, 0, 3])
    for _ in range(3):
        np.testing.assert_array_equal(ex.run(w, i)[0], w[[9, 0, 3]])
    assert _sized(ex, 3).steady is not None
    i[1] = 10  # the same array, changed: the steady call runs it and the kernel says so
    with pytest.raises(GraphcError, match=r"index out of range.*\(at this call s0 = 3\)"):
        ex.run(w, i)


def _mlp_step(dynamic: bool):
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    opt = graphc.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, graphc.compile(step, backend="cpu", dynamic=dynamic)


def _batch(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return (graphc.from_numpy(rng.standard_normal((n, 20), np.float32)),
            graphc.from_numpy(rng.integers(0, 5, n)))


def test_a_symbolic_training_step_matches_the_static_steps_bits_through_size_changes():
    static_model, static = _mlp_step(False)
    model, step = _mlp_step(True)
    batches = {n: _batch(n, n) for n in (16, 7, 1)}
    for n in (16, 16, 16, 7, 16, 16, 1, 16, 7, 7, 16):
        got, want = step(*batches[n]), static(*batches[n])
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
        for p, q in zip(model.parameters(), static_model.parameters()):
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    symbolic = [e for e in step._entries if e.shapes is not None]
    assert len(symbolic) == 1  # 16 and 7 by one executable; 1 by a specialised entry
    assert symbolic[0].executable.runs_generic


def test_a_wrong_shape_after_steady_symbolic_steps_raises_the_first_calls_error():
    _, fresh = _mlp_step(True)
    x, y = _batch(16, 0)
    bad = graphc.from_numpy(np.ones((16, 21), np.float32))
    with pytest.raises(GraphcError) as first:
        fresh(bad, y)
    _, step = _mlp_step(True)
    for _ in range(4):
        step(x, y)
    assert step._fast  # the symbolic entry's first try (graphc.jit.shape_checks)
    with pytest.raises(GraphcError) as later:
        step(bad, y)
    assert (type(later.value), str(later.value)) == (type(first.value), str(first.value))
    assert "test_cpu_runtime_sizes_steady.py" in str(later.value)  # the user's line
    step(*_batch(9, 1))  # a right call after it runs
    with pytest.raises(GraphcError):  # batch sizes that contradict each other
        step(x, graphc.from_numpy(np.zeros(9, np.int64)))


def test_a_symbolic_call_with_aliased_arguments_is_not_run_as_distinct():
    def f(a, b):
        a.add_(b)
        return a * 2

    g = graphc.compile(f, backend="cpu", dynamic=True)
    for n in (4, 6, 6, 6):
        a, b = graphc.ones(n), graphc.full((n,), 3.0)
        np.testing.assert_array_equal(g(a, b).numpy(), np.full(n, 8, np.float32))
    a = graphc.ones(6)
    np.testing.assert_array_equal(g(a, a).numpy(), np.full(6, 4, np.float32))  # as eager
    np.testing.assert_array_equal(a.numpy(), np.full(6, 2, np.float32))


def test_the_written_shape_checks_answer_as_the_guard_and_shape_guard_do():
    _, step = _mlp_step(True)
    x, y = _batch(16, 0)
    for _ in range(3):
        step(x, y)
    entry = step._entries[-1]
    checks = fast_checks(entry.guard.checks, entry.shapes)
    calls = [(x, y), _batch(9, 1), (x, graphc.from_numpy(np.zeros(9, np.int64))),
             (graphc.from_numpy(np.ones((1, 20), np.float32)), graphc.zeros(1, dtype="int64")),
             (graphc.from_numpy(np.ones((16, 21), np.float32)), y),
             (graphc.from_numpy(np.ones((16,), np.float32)), y), (x,)]
    for args in calls:
        want = entry.guard.holds(args, {}) and entry.shapes.holds(args, {})
        try:
            got = checks(args, {})
        except (AttributeError, KeyError, TypeError, ValueError):  # the fast path's: fails
            got = False
        assert got == want, [tuple(a.shape) for a in args]


def test_the_call_overhead_benchmark_times_a_symbolic_steps_native_run():
    """benchmarks/call_overhead.py's `_dynamic` cases (a smoke run; no timing is judged): the
    native figure is read from the runtime-sized executable's entry point, inside the call."""
    from benchmarks.call_overhead import measure

    figures = measure("mlp_b64_dynamic")
    assert 0 < figures.native < figures.call and figures.python > 0
