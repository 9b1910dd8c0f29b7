"""Reductions forked over a kept dim (graphc.backends.cpu.kernels.reduction_loops, used by
reductions.py and sibling_sums.py): a batch norm's channels cut into one part a thread, rows
already outermost. The loops first (kept_outermost), then compiled kernels: forked, the same
bits on one thread and on all cores and as the serial kernel, the interpreter's result.
Column sums (graphc.backends.cpu.column_parts: a lone or GEMM-fused column reduce_sum or
reduce_mean, a LayerNorm backward row program's gamma and beta gradients) fork over parts of
their rows, each into its own partial row: the same bits on one thread and on all cores,
within the float64-distance rule of the serial kernel's order."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import column_parts, kernels, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.test_cpu_backend import one_op_graph  # noqa: E402

ALL_CORES = threads.most_threads()
needs_cores = pytest.mark.skipif(ALL_CORES < 2, reason="one core (or no libgomp): nothing "
                                 "forks")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def two():
    return 2


def test_kept_outermost_cuts_the_kept_dim():
    # operands: input (contiguous), result (stride 0 along reduced dims)
    # [N, C, HW] summed over N and HW: C cut in two parts, the parts outermost, each part's
    # channels where they were (an image's channels of a part one contiguous run)
    sizes, strides = kernels.kept_outermost([32, 64, 1024], [(65536, 1024, 1), (0, 1, 0)], 1,
                                            two)
    assert sizes == [2, 32, 32, 1024]
    assert strides == [(32768, 65536, 1024, 1), (32, 0, 1, 0)]
    # already outermost: as it is
    assert kernels.kept_outermost([64, 1024], [(1024, 1), (1, 0)], 1, two) == \
        ([64, 1024], [(1024, 1), (1, 0)])
    # channels not a multiple of the parts, one thread, a column sum (the only kept dim
    # innermost), a sum of everything: None
    assert kernels.kept_outermost([32, 63, 1024], [(64512, 1024, 1), (0, 1, 0)], 1,
                                  two) is None
    assert kernels.kept_outermost([32, 64, 1024], [(65536, 1024, 1), (0, 1, 0)], 1,
                                  lambda: 1) is None
    assert kernels.kept_outermost([1024, 512], [(512, 1), (0, 1)], 1, two) is None
    assert kernels.kept_outermost([1024], [(1,), (0,)], 1, two) is None


SUM = '("reduce_sum", ({arg},), (("axes", {axes}), ("keepdim", false)))'
# batch norm's backward sums over one walk (graphc.passes.sibling_sums): sum(g), sum(g * x)
SIBLING = f'''graph @f(%g: f32[8,32,16,16], %x: f32[8,32,16,16]) -> (f32[32], f32[32]) {{
  %0: f32[32], %1: f32[32] = fused[body=(("mul", (0, 1), ()), {SUM.format(arg=0, axes=(0, 2, 3))}, {SUM.format(arg=2, axes=(0, 2, 3))}), outputs=(3, 4)](%g, %x)
  return (%0, %1)
}}'''  # noqa: E501

# (graph, its inputs' shapes): each over PARALLEL_MIN_ELEMENTS (65,536) elements
CASES = {
    "row sum": (lambda: one_op_graph("reduce_sum", [((256, 512), "float32")],
                                     axes=(1,), keepdim=False), [(256, 512)]),
    "channel mean": (lambda: one_op_graph("reduce_mean", [((8, 32, 16, 16), "float32")],
                                          axes=(0, 2, 3), keepdim=True), [(8, 32, 16, 16)]),
    "row max": (lambda: one_op_graph("reduce_max", [((512, 256), "float32")], axes=(1,),
                                     keepdim=False), [(512, 256)]),
    "sibling sums": (lambda: parse(SIBLING), [(8, 32, 16, 16)] * 2),
}


def _results(graph, args, count: int, monkeypatch, serial: bool = False) -> tuple:
    with monkeypatch.context() as patch:
        if serial:  # the kernels as before: nothing forks
            patch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1 << 40)
        exe = compile_graph(graph, "cpu")
    exe.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
    return exe, [np.array(r) for r in exe.run(*[a.copy() for a in args])]


@needs_cores
@pytest.mark.parametrize("case", sorted(CASES))
def test_forked_reductions_give_the_serial_kernels_bits(case, monkeypatch, tmp_path):
    make, shapes = CASES[case]
    rng = np.random.default_rng(len(case))
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    exe, one = _results(make(), args, 1, monkeypatch)
    assert '.omp"' in exe.lowered.ir_text, case
    _, every = _results(make(), args, ALL_CORES, monkeypatch)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # the serial build apart
    serial_exe, serial = _results(make(), args, 1, monkeypatch, serial=True)
    assert '.omp"' not in serial_exe.lowered.ir_text, case
    interpreted = compile_graph(make(), "interp").run(*args)
    assert len(one) == len(interpreted)
    for got, same, before, want in zip(one, every, serial, interpreted):
        np.testing.assert_array_equal(same, got, err_msg=f"{case}: all cores")
        np.testing.assert_array_equal(before, got, err_msg=f"{case}: the serial kernel")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case)


# (graph, its input's shape, axes): column sums over PARALLEL_MIN_ELEMENTS elements
COLUMN_CASES = {
    "column sum": (lambda: one_op_graph("reduce_sum", [((16, 64, 512), "float32")],
                                        axes=(0, 1), keepdim=False), (16, 64, 512), (0, 1)),
    "column mean, odd width": (lambda: one_op_graph("reduce_mean", [((1024, 67), "float32")],
                                                    axes=(0,), keepdim=True), (1024, 67), (0,)),
}


def _two_counts(exe, args) -> list:
    results = []
    for count in (1, ALL_CORES):
        exe.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
        results.append([np.array(r) for r in exe.run(*[a.copy() for a in args])])
    return results


@needs_cores
@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_column_sums_fork_over_row_parts_with_one_threads_bits(case, monkeypatch, tmp_path):
    make, shape, axes = COLUMN_CASES[case]
    x = (np.random.default_rng(len(case)).standard_normal(shape) + 3).astype(np.float32)
    exe = compile_graph(make(), "cpu")
    assert '.omp"' in exe.lowered.ir_text and "column_merge" in exe.lowered.ir_text, case
    (one,), (every,) = _two_counts(exe, [x])
    np.testing.assert_array_equal(every, one, err_msg=f"{case}: all cores")
    monkeypatch.setattr(column_parts, "SPLIT", False)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))  # the serial build apart
    serial_exe = compile_graph(make(), "cpu")
    assert "column_merge" not in serial_exe.lowered.ir_text, case
    serial = np.array(serial_exe.run(x)[0])
    mean = "mean" in case
    reference = (x.astype(np.float64).mean if mean else x.astype(np.float64).sum)(
        axis=axes, keepdims=mean)
    assert_rounding_within(one, serial, reference)


def test_partial_rows_lie_a_page_apart():
    """Each part's partial row (and each output's) a page from any other: a core's
    prefetchers fetch within a page, and the other core's writes there cost the fork its
    gain (column_parts.PAGE_BYTES)."""
    class Lowerer:  # what plan reads: the workspace's scratch, libgomp, the thread count
        openmp, arena_end, scratch = True, 1000, 0

        @staticmethod
        def most_threads():
            return 2

        def add_scratch(self, n):
            at, self.scratch = self.scratch, self.scratch + n
            return at

    from graphc.types import float32

    parts = column_parts.plan(Lowerer(), (1024, 130), [(130, 1), (0, 1), (0, 1)],
                              [float32, float32])
    starts = sorted(loc.offset + p * parts.padded * 4 for loc in parts.locs
                    for p in range(parts.parts))
    assert parts.width == 130 and len(starts) == 4
    assert all(b - a >= column_parts.PAGE_BYTES + 130 * 4 for a, b in zip(starts, starts[1:]))
    assert starts[0] - Lowerer.arena_end >= column_parts.PAGE_BYTES


@needs_cores
def test_layer_norm_backward_rows_fork_with_one_threads_bits(monkeypatch, tmp_path):
    """A LayerNorm backward row program with its gamma and beta gradients (column sums)
    forks over parts of its rows: the same bits on one thread and on all cores, as close to
    float64 as the serial row program."""
    import graphc.nn.functional as F

    def step(x, w, b, g):
        y = F.layer_norm(x, (128,), w, b)
        (y * g).sum().backward()
        return x.grad, w.grad, b.grad

    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s) for s in ((16, 64, 128), (128,), (128,), (16, 64, 128))]

    def tensors(dtype):
        return [graphc.tensor(a.astype(dtype), requires_grad=i < 3)
                for i, a in enumerate(arrays)]

    compiled = graphc.compile(step, backend="cpu")
    compiled(*tensors(np.float32))
    exe = compiled.executable
    assert "column_merge" in exe.lowered.ir_text
    results = []
    for count in (1, ALL_CORES):
        exe.thread_chooser = ThreadChooser(ALL_CORES, fixed=count)
        results.append([r.numpy() for r in compiled(*tensors(np.float32))])
    for got, same in zip(*results):
        np.testing.assert_array_equal(same, got)
    monkeypatch.setattr(column_parts, "SPLIT", False)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    serial = graphc.compile(step, backend="cpu")
    before = [r.numpy() for r in serial(*tensors(np.float32))]
    assert "column_merge" not in serial.executable.lowered.ir_text
    reference = [r.numpy() for r in step(*tensors(np.float64))]
    for got, was, want in zip(results[0], before, reference):
        assert_rounding_within(got, was, want)
