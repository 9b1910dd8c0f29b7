"""merge_sibling_sums (graphc.passes.sibling_sums) and its cpu lowering
(graphc.backends.cpu.sibling_sums): sums over the same axes of one domain that read the same
tensors become one node, walked once; what may not merge stays apart."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.ops.fused import FusedBody
from graphc.passes.fuse import fuse
from graphc.passes.fuse_rows import is_row_program
from graphc.passes.row_recompute import recompute_row_values
from graphc.passes.sibling_sums import is_sibling_sums, merge_sibling_sums
from tests.test_recompute_reduction_producers import BN_BACKWARD, _arrays

SUM = '("reduce_sum", ({arg},), (("axes", {axes}), ("keepdim", false)))'


def _two_sums(axes=(0, 2), second_axes=None, between="") -> str:
    """Two fused sums of x-derived values over [4,3,8]; `between`: IR lines between them."""
    first = SUM.format(arg=1, axes=axes)
    second = SUM.format(arg=2, axes=second_axes or axes)
    out = "f32[3]" if axes == (0, 2) else "f32[8]"
    out2 = "f32[3]" if (second_axes or axes) == (0, 2) else "f32[8]"
    return f'''graph @f(%x: f32[4,3,8], %y: f32[4,3,8]) -> ({out}, {out2}) {{
  %0: {out} = fused[body=(("relu", (0,), ()), {first}), outputs=(2,)](%x)
{between}  %1: {out2} = fused[body=(("mul", (0, 1), ()), {second}), outputs=(3,)](%x, %y)
  return (%0, %1)
}}'''


def _sums(graph) -> list:
    return [n for n in graph.nodes if n.op == "fused" and is_sibling_sums(FusedBody.of_node(n))]


def _run_both(before, after, args):
    for a, e in zip(compile_graph(after, "cpu").run(*args),
                    compile_graph(before, "cpu").run(*args)):
        # the same sums over the same elements; within a row the additions are reassociated
        # (vector registers), which LLVM may group otherwise with two accumulators
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)
    for a, e in zip(compile_graph(after, "cpu").run(*args),
                    compile_graph(after, "interp").run(*args)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axes", [(0, 2), (0, 1)])
def test_two_sums_of_one_input_walk_it_once(axes):
    """Over (0, 2) the innermost loop is reduced (sums in registers); over (0, 1) it is not
    (each element added to its output)."""
    graph = parse(_two_sums(axes))
    out = merge_sibling_sums(graph)
    (node,) = out.nodes
    body = FusedBody.of_node(node)
    assert is_sibling_sums(body) and not is_row_program(body)
    rng = np.random.default_rng(len(axes) + axes[-1])
    _run_both(graph, out, [rng.standard_normal((4, 3, 8)).astype(np.float32)
                           for _ in range(2)])


def test_sums_over_other_axes_stay_apart():
    graph = parse(_two_sums((0, 2), (0, 1)))
    assert merge_sibling_sums(graph) is graph


def test_a_sum_that_reads_the_other_through_a_node_between_stays_apart():
    """B reads a value made from A's sum: merged, it would read its own result."""
    between = ("  %3: f32[1,3,1] = reshape[shape=(1, 3, 1)](%0)\n"
               "  %2: f32[4,3,8] = add(%x, %3)\n")
    graph = parse(_two_sums(between=between).replace("](%x, %y)\n  return", "](%x, %2)\n"
                                                     "  return"))
    assert merge_sibling_sums(graph) is graph


def test_readers_of_the_first_sum_between_them_move_after_the_merged_node():
    between = "  %2: f32[3] = fused[body=((\"neg\", (0,), ()),), outputs=(1,)](%0)\n"
    text = _two_sums(between=between).replace("-> (f32[3], f32[3])",
                                              "-> (f32[3], f32[3], f32[3])")
    text = text.replace("return (%0, %1)", "return (%0, %1, %2)")
    graph = parse(text)
    out = merge_sibling_sums(graph)
    assert [len(n.outputs) for n in out.nodes] == [2, 1]  # the sums, then neg
    rng = np.random.default_rng(7)
    _run_both(graph, out, [rng.standard_normal((4, 3, 8)).astype(np.float32)
                           for _ in range(2)])


def test_batch_norm_backward_sums_become_one_walk_over_dy_the_mask_and_x():
    fused = recompute_row_values(fuse(parse(BN_BACKWARD)))
    assert not _sums(fused)
    out = merge_sibling_sums(fused)
    (node,) = _sums(out)
    assert {v.name for v in node.inputs} >= {"dy", "mask", "x"}
    assert all(tuple(v.type.shape) == (3,) for v in node.outputs)  # nothing D-shaped written
    _run_both(fused, out, _arrays(np.random.default_rng(11)))
