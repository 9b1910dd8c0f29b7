"""Consecutive small elementwise kernels of the cuda backend share one launch
(graphc.backends.cuda.lowering.merge_kernels), on the emulation (or the GPU with
GRAPHC_TEST_ON_GPU=1). Covers: independent outputs of different shapes and dtypes in one
launch with results equal to numpy; an in-place optimizer-like update of several parameters;
a kernel reading what a waiting one writes starts a launch of its own; kernels reaching
memory without a known span and large (several items a thread) kernels never merge; the
launch list names every node a merged launch serves."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.backends.cuda import cudagen, lowering
from graphc.backends.cuda.lowering import KernelText, Launch, Layout, merge_kernels
from graphc.types import TensorType, float32

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def _launches(compiled) -> list[Launch]:
    return [s for s in compiled.executable.lowered.steps if isinstance(s, Launch)]


def test_independent_small_outputs_run_as_one_launch(rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    c = rng.integers(-9, 9, (2, 2, 3))

    def f(x, y, z):
        return graphc.exp(x) + 1, y * 2, z * 3, (y > 0).reshape(7, 1), x > 0

    compiled = graphc.compile(f, backend="cuda")
    got = [t.numpy() for t in compiled(graphc.tensor(a), graphc.tensor(b), graphc.tensor(c))]
    np.testing.assert_allclose(got[0], np.exp(a.astype(np.float64)) + 1, rtol=1e-6)
    np.testing.assert_array_equal(got[1], b * 2)
    np.testing.assert_array_equal(got[2], c * 3)
    np.testing.assert_array_equal(got[3], (b > 0).reshape(7, 1))
    np.testing.assert_array_equal(got[4], a > 0)
    (launch,) = _launches(compiled)
    assert launch.function.endswith("_merged")
    assert launch.threads == 2 * a.size + 2 * b.size + c.size


def test_an_update_of_several_parameters_is_one_launch(rng):
    shapes = [(4, 3), (3,), (2, 2, 2), (5,)]
    params = [graphc.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    grads = [graphc.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    before = [p.numpy().copy() for p in params]

    def step(*gs):
        for p, g in zip(params, gs):
            p.sub_(g * 0.5)

    compiled = graphc.compile(step, backend="cuda")
    compiled(*grads)
    for p, old, g in zip(params, before, grads):
        np.testing.assert_allclose(p.numpy(), old - g.numpy() * np.float32(0.5), rtol=1e-6,
                                   atol=1e-7)
    assert len(_launches(compiled)) == 1


def test_a_kernel_reading_a_waiting_kernels_output_gets_its_own_launch(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)

    def f(x):
        y = x * 2 + 1
        return y, (y.transpose(0, 1).contiguous() * 3).sum(0)

    compiled = graphc.compile(f, backend="cuda")
    y, s = compiled(graphc.tensor(a))
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(y.numpy(), a64 * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(s.numpy(), ((a64 * 2 + 1).T * 3).sum(0), rtol=1e-5, atol=1e-5)
    first = _launches(compiled)[0]
    assert not first.function.endswith("_merged")


def _kernel(offset: int, n: int, written: bool, name: str = "k") -> KernelText:
    k = KernelText(name, n)
    layout = Layout(offset, (1,), TensorType((n,), float32))
    if written:
        k.lines.append(f"{k.at(layout, ['gi'])} = 1.0f;")
    else:
        k.lines.append(f"float x = {k.read(layout, ['gi'], (n,))};")
    return k


def test_touches_sees_a_write_meeting_a_read_and_not_two_reads():
    writer, reader, apart = _kernel(0, 8, True), _kernel(16, 8, False), _kernel(64, 8, True)
    assert writer.touches(reader) and reader.touches(writer)
    assert not writer.touches(apart)
    assert not _kernel(0, 8, False).touches(_kernel(0, 8, False))
    raw = KernelText("raw", 8)
    raw.ptr(512)  # a pointer without a span: any byte, maybe written
    assert raw.touches(apart) and not lowering.mergeable(raw)
    big = _kernel(1024, cudagen.ITEMS_FROM, True)
    assert not lowering.mergeable(big)


def test_merge_kernels_renames_parameters_and_offsets_each_part():
    parts = [_kernel(0, 8, True, "a"), _kernel(64, 3, False, "b"), _kernel(0 + 128, 5, True)]
    merged = merge_kernels("m", parts)
    assert merged.threads == 16 and merged.params == [0, 64, 128]
    text = "\n".join(merged.lines)
    assert "if (gi < 8LL) {" in text and "} else if (gi < 11LL) {" in text
    assert "long long gc_part_gi = gi - 11LL;" in text and "((float *)p2)[gi] = 1.0f;" in text
    assert merged.written == {0, 128} and merged.disjoint()


def test_the_launch_list_names_every_node_of_a_merged_launch(rng):
    a = rng.standard_normal(5).astype(np.float32)
    compiled = graphc.compile(lambda x: (x + 1, x * 2), backend="cuda")
    compiled(graphc.tensor(a))
    ex = compiled.executable
    (k,) = [i for i, s in enumerate(ex.lowered.steps) if s.function.endswith("_merged")]
    assert len(ex.lowered.step_nodes[k]) == 2
    assert "and 1 more" in ex.describe_step(k)


def test_a_head_merge_reshaped_twice_is_copied_once(rng):
    """The cuda pipeline runs share_reshape_copies: the second reshape of a permuted value
    (an attention head merge, forward and weight gradient) is a view of the first copy."""
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)

    def merge_heads(v):
        p = v.permute(0, 2, 1, 3)
        return p.reshape(2, 4, 15) * 2, p.reshape(8, 15) + 1

    compiled = graphc.compile(merge_heads, backend="cuda")
    a, b = compiled(graphc.tensor(x))
    p = x.transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(a.numpy(), p.reshape(2, 4, 15) * 2)
    np.testing.assert_array_equal(b.numpy(), p.reshape(8, 15) + 1)
    copies = [s for s in _launches(compiled) if s.function.endswith("_reshape")]
    assert len(copies) == 1


def test_merged_kernels_past_items_from_run_several_items_a_thread(rng):
    """Two kernels each below ITEMS_FROM, together above it: one launch of ITEMS items a
    thread (each item finds its part), results equal to numpy."""
    n = cudagen.ITEMS_FROM // 2 + 333
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    compiled = graphc.compile(lambda x, y: (x * 2, y - 1), backend="cuda")
    got = compiled(graphc.tensor(a), graphc.tensor(b))
    np.testing.assert_array_equal(got[0].numpy(), a * 2)
    np.testing.assert_array_equal(got[1].numpy(), b - 1)
    (launch,) = _launches(compiled)
    assert launch.function.endswith("_merged") and launch.items == cudagen.ITEMS
