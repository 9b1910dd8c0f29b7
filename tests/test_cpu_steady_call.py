"""The cpu executable's steady call (`CpuExecutable.run`'s one-frame path: the last call's
input arrays again, its outputs dropped) gives what the general path gives and refuses what
it refuses: inputs changed in place are read through the same pointers, an input reshaped or
retyped in place is refused, a held output is never written, a failed run raises, the
chooser's thread count applies, a training step's pattern (the last call's outputs held, those
of two calls ago dropped) ping-pongs between two arrays per output, and a call it does not take
(both arrays held, a new input) goes the general way."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.errors import ArgumentError, IndexOutOfRangeError  # noqa: E402
from graphc.ir import parse  # noqa: E402

N = 64  # N x N float32 = 16 KB; the outputs below are N x 4N = 64 KB: kept for reuse


def _assert_product(got, x, w) -> None:
    """`got` is x @ w to float32 rounding: within 1e-5 of the largest magnitude of the float64
    product, elementwise (a stale or wrongly bound buffer is off by the magnitude itself; a
    near-zero element's float32 rounding depends on the GEMM's order, this host's BLAS
    included, and is no error)."""
    want = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def _two_outputs():
    """A graph with two large outputs: x @ w and -(x @ w)."""
    return backend_compile(parse(f'''graph @f(%x: f32[{N},{N}], %w: f32[{N},{4 * N}])
        -> (f32[{N},{4 * N}], f32[{N},{4 * N}]) {{
      %0: f32[{N},{4 * N}] = matmul(%x, %w)
      %1: f32[{N},{4 * N}] = neg(%0)
      return (%0, %1)
    }}'''), "cpu")


@pytest.fixture
def inputs(request):
    rng = np.random.default_rng(abs(hash(request.node.name)) % 2**32)
    return (rng.standard_normal((N, N)).astype(np.float32),
            rng.standard_normal((N, 4 * N)).astype(np.float32))


def count_general_calls(ex, monkeypatch) -> list[int]:
    """Count the calls that leave the steady path for `_call`."""
    general = [0]
    real = ex._call

    def counted(*args):
        general[0] += 1
        return real(*args)

    monkeypatch.setattr(ex, "_call", counted)
    return general


def test_the_steady_call_reuses_the_dropped_outputs_and_reads_inputs_changed_in_place(
        inputs, monkeypatch):
    x, w = inputs
    ex = _two_outputs()
    first = [id(a) for a in ex.run(x, w)]  # dropped at once
    general = count_general_calls(ex, monkeypatch)
    for _ in range(3):
        x *= -0.5  # the same array, new values: the pointer it had still reads them
        product, negated = ex.run(x, w)
        assert [id(product), id(negated)] == first
        _assert_product(product, x, w)
        np.testing.assert_array_equal(negated, -product)
        del product, negated
    assert general == [0]


def test_an_output_still_held_is_never_written_and_the_other_is_reused(inputs, monkeypatch):
    x, w = inputs
    ex = _two_outputs()
    product, negated = ex.run(x, w)
    dropped, held = id(product), negated
    want = held.copy()
    del product, negated
    general = count_general_calls(ex, monkeypatch)
    x2 = x * 2  # and a new input array: its pointer is bound anew
    product, negated = ex.run(x2, w)
    assert general == [1]  # the held output sends the call the general way
    assert id(product) == dropped and negated is not held
    np.testing.assert_array_equal(held, want)
    _assert_product(product, x2, w)
    np.testing.assert_array_equal(negated, -product)


def test_the_same_inputs_with_an_output_held_reuse_what_was_dropped(inputs, monkeypatch):
    """As a training step's `.grad` outputs are held until the next step replaces them: the
    steady call takes the array of two calls ago (the general way's pick), never the held
    one."""
    x, w = inputs
    ex = _two_outputs()
    older = ex.run(x, w)[0]
    older_id = id(older)
    held = ex.run(x, w)[0]  # a new array: `older` is still held
    del older  # now the last call's array is held, the one before dropped
    general = count_general_calls(ex, monkeypatch)
    x *= 3.0
    product, negated = ex.run(x, w)
    assert general == [0]
    assert id(product) == older_id and product is not held
    _assert_product(product, x, w)
    np.testing.assert_array_equal(negated, -product)
    _assert_product(held, x / 3.0, w)


def test_an_input_reshaped_or_retyped_in_place_is_refused(inputs):
    x, w = inputs
    ex = _two_outputs()
    ex.run(x, w)
    x.shape = (N * N,)  # the same array object, another shape
    with pytest.raises(ArgumentError, match=r"input %x expects f32\[64,64\]"):
        ex.run(x, w)
    x.shape = (N, N)
    x.dtype = np.int32  # the same bytes, another dtype
    with pytest.raises(ArgumentError, match=r"input %x expects f32\[64,64\]"):
        ex.run(x, w)
    x.dtype = np.float32
    _assert_product(ex.run(x, w)[0], x, w)


@pytest.mark.parametrize("most", [1, 2])
def test_the_steady_call_runs_on_the_choosers_thread_count(inputs, monkeypatch, most):
    x, w = inputs
    ex = _two_outputs()
    ex.thread_chooser = ThreadChooser(most, fixed=1)
    want = [a.copy() for a in ex.run(x, w)]
    general = count_general_calls(ex, monkeypatch)
    chosen = [0]
    real_native = ex._native

    def native(tail):
        chosen[0] += 1
        return real_native(tail)

    monkeypatch.setattr(ex, "_native", native)
    for _ in range(2):
        got = ex.run(x, w)
        for g, v in zip(got, want):
            np.testing.assert_array_equal(g, v)
        del got, g  # the caller drops this call's outputs
    assert general == [0]
    assert chosen == [0 if most == 1 else 2]  # one thread: the driver straight away


def test_a_failed_steady_run_raises_and_the_next_good_one_runs(monkeypatch):
    weight = graphc.tensor(np.random.default_rng(1).standard_normal((8, 4096))
                           .astype(np.float32))
    indices = graphc.tensor(np.array([0, 3, 7, 1], np.int64))
    f = graphc.compile(lambda i, w: F.embedding(i, w), backend="cpu")
    with graphc.no_grad():
        for _ in range(3):  # the output (4 x 4096 floats) is kept and dropped
            f(indices, weight)
        general = count_general_calls(f.executable, monkeypatch)
        indices._array[2] = 9  # in place: the steady call reads it
        with pytest.raises(IndexOutOfRangeError, match="embedding"):
            f(indices, weight)
        indices._array[2] = 5
        np.testing.assert_array_equal(f(indices, weight).numpy(),
                                      weight.numpy()[[0, 3, 5, 1]])
    assert general == [0]
