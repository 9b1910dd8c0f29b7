"""Review of the ninth session's sibling-sums merge (graphc.passes.sibling_sums and its cpu
lowering) and the reduction producers of graphc.passes.row_recompute, on graphs built to break
them: sums of other dtypes and keepdim, a value of A that B reads (small or of the sums'
domain, returned or not), bare sums, an int64 count beside a float sum, three siblings, a node
between that reads A's output and feeds B, escaping values of a batch-norm backward. Each
graph runs merged on the cpu backend and on the interpreter against the unmerged interpreter
run."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes.fuse import fuse
from graphc.passes.fuse_rows import fuse_rows
from graphc.passes.row_recompute import recompute_row_values
from graphc.passes.sibling_sums import merge_sibling_sums
from tests.test_recompute_reduction_producers import BN_BACKWARD, _arrays

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")


def _sum(arg: int, axes: str = "(0, 2)", keepdim: str = "false") -> str:
    return f'("reduce_sum", ({arg},), (("axes", {axes}), ("keepdim", {keepdim})))'


def _graph(inputs: str, outputs: str, lines: str, returned: str) -> str:
    return f"graph @f({inputs}) -> ({outputs}) {{\n{lines}\n  return ({returned})\n}}"


XY = "%x: f32[4,3,8], %y: f32[4,3,8]"
XW = "%x: f32[4,3,8], %w: f32[3,1]"
CASES = {  # name: (graph text, merged?)
    "float32 and float64 sums": (_graph(
        "%x: f32[4,3,8], %y: f64[4,3,8]", "f32[3], f64[3]",
        f'  %0: f32[3] = fused[body=(("relu", (0,), ()), {_sum(1)}), outputs=(2,)](%x)\n'
        f'  %1: f64[3] = fused[body=(("cast", (0,), (("dtype", "float64"),)), '
        f'("mul", (2, 1), ()), {_sum(3)}), outputs=(4,)](%x, %y)', "%0, %1"), True),
    "keepdim differs": (_graph(
        XY, "f32[3], f32[1,3,1]",
        f'  %0: f32[3] = fused[body=(("relu", (0,), ()), {_sum(1)}), outputs=(2,)](%x)\n'
        f'  %1: f32[1,3,1] = fused[body=(("mul", (0, 1), ()), {_sum(2, keepdim="true")}), '
        f'outputs=(3,)](%x, %y)', "%0, %1"), False),
    "keepdim both": (_graph(
        XY, "f32[1,3,1], f32[1,3,1]",
        f'  %0: f32[1,3,1] = fused[body=(("relu", (0,), ()), {_sum(1, keepdim="true")}), '
        f'outputs=(2,)](%x)\n'
        f'  %1: f32[1,3,1] = fused[body=(("mul", (0, 1), ()), {_sum(2, keepdim="true")}), '
        f'outputs=(3,)](%x, %y)', "%0, %1"), True),
    "a small value of A read by B and returned": (_graph(
        XW, "f32[3], f32[3], f32[3,1]",
        f'  %a: f32[3,1], %0: f32[3] = fused[body=(("exp", (1,), ()), ("relu", (0,), ()), '
        f'{_sum(3)}), outputs=(2, 4)](%x, %w)\n'
        f'  %1: f32[3] = fused[body=(("mul", (0, 1), ()), {_sum(2)}), outputs=(3,)](%x, %a)',
        "%0, %1, %a"), True),
    "a small value of A read by B alone": (_graph(
        XW, "f32[3], f32[3]",
        f'  %a: f32[3,1], %0: f32[3] = fused[body=(("exp", (1,), ()), ("relu", (0,), ()), '
        f'{_sum(3)}), outputs=(2, 4)](%x, %w)\n'
        f'  %1: f32[3] = fused[body=(("mul", (0, 1), ()), {_sum(2)}), outputs=(3,)](%x, %a)',
        "%0, %1"), True),
    "A's domain value read by B and returned": (_graph(
        XY, "f32[3], f32[3], f32[4,3,8]",
        f'  %r: f32[4,3,8], %0: f32[3] = fused[body=(("relu", (0,), ()), {_sum(1)}), '
        f'outputs=(1, 2)](%x)\n'
        f'  %1: f32[3] = fused[body=(("mul", (0, 1), ()), {_sum(2)}), outputs=(3,)](%r, %y)',
        "%0, %1, %r"), True),
    "bare sums of one input": (_graph(
        XY, "f32[3], f32[3]",
        f'  %0: f32[3] = fused[body=({_sum(0)},), outputs=(1,)](%x)\n'
        f'  %1: f32[3] = fused[body=({_sum(0)},), outputs=(1,)](%x)', "%0, %1"), True),
    "an int64 count beside a float sum": (_graph(
        "%x: f32[4,3,8], %z: f32[]", "i64[3], f32[3]",
        f'  %0: i64[3] = fused[body=(("gt", (0, 1), ()), {_sum(2)}), outputs=(3,)](%x, %z)\n'
        f'  %1: f32[3] = fused[body=(("exp", (0,), ()), {_sum(1)}), outputs=(2,)](%x)',
        "%0, %1"), True),
    "a node between reads A's value and feeds B": (_graph(
        XY, "f32[3], f32[3]",
        f'  %r: f32[4,3,8], %0: f32[3] = fused[body=(("relu", (0,), ()), {_sum(1)}), '
        f'outputs=(1, 2)](%x)\n'
        f'  %m: f32[4,3,8] = fused[body=(("neg", (0,), ()),), outputs=(1,)](%r)\n'
        f'  %1: f32[3] = fused[body=(("mul", (0, 1), ()), {_sum(2)}), outputs=(3,)](%x, %m)',
        "%0, %1"), False),
    "three siblings": (_graph(
        XY, "f32[3], f32[3], f32[3]",
        f'  %0: f32[3] = fused[body=(("relu", (0,), ()), {_sum(1)}), outputs=(2,)](%x)\n'
        f'  %1: f32[3] = fused[body=(("mul", (0, 1), ()), {_sum(2)}), outputs=(3,)](%x, %y)\n'
        f'  %2: f32[3] = fused[body=(("sin", (0,), ()), {_sum(1)}), outputs=(2,)](%y)',
        "%0, %1, %2"), True),
    "sums over every axis": (_graph(
        XY, "f32[], f32[]",
        f'  %0: f32[] = fused[body=(("relu", (0,), ()), {_sum(1, "(0, 1, 2)")}), '
        f'outputs=(2,)](%x)\n'
        f'  %1: f32[] = fused[body=(("mul", (0, 1), ()), {_sum(2, "(0, 1, 2)")}), '
        f'outputs=(3,)](%x, %y)', "%0, %1"), True),
}


def _inputs(graph, rng):
    return [rng.standard_normal(v.type.shape).astype(v.type.dtype.name) for v in graph.inputs]


def _agree(before, after, args):
    want = compile_graph(before, "interp").run(*args)
    for backend in ("cpu", "interp"):
        for got, expected in zip(compile_graph(after, backend).run(*args), want):
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=backend)


@pytest.mark.parametrize("name", list(CASES))
def test_merged_or_apart_the_values_stay(name):
    text, merges = CASES[name]
    graph = parse(text)
    merged = merge_sibling_sums(graph)
    assert (merged is not graph) == merges
    _agree(graph, merged, _inputs(graph, np.random.default_rng(len(name))))


RETURNED = {"g": "%1", "xhat": "%4"}


@pytest.mark.parametrize("name", list(RETURNED))
def test_batch_norm_backward_whose_g_or_xhat_is_also_returned(name):
    """The readers recompute g = where(mask, dy, 0) and xhat, but the graph returns one of
    them: its producer keeps writing it."""
    text = BN_BACKWARD.replace("-> (f32[4,3,5,6], f32[3], f32[3])",
                               "-> (f32[4,3,5,6], f32[3], f32[3], f32[4,3,5,6])")
    text = text.replace("return (%15, %2, %6)", f"return (%15, %2, %6, {RETURNED[name]})")
    graph = parse(text)
    passed = merge_sibling_sums(fuse_rows(recompute_row_values(fuse_rows(fuse(graph)))))
    assert RETURNED[name].lstrip("%") in {v.name for n in passed.nodes for v in n.outputs}
    args = _arrays(np.random.default_rng(5))
    want = compile_graph(graph, "interp").run(*args)
    for got, expected in zip(compile_graph(passed, "cpu").run(*args), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
