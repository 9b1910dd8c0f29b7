"""graphc.passes.reshape_share: later reshapes of a value read the first reshape's result, so
an attention head merge reshaped twice is copied once."""

from __future__ import annotations

import numpy as np

from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes.reshape_share import share_reshape_copies

HEAD_MERGE = '''graph @m(%a: f32[2,3,4,5], %w: f32[15,6]) -> (f32[8,6], f32[15,6]) {
  %0: f32[2,4,3,5] = permute[dims=(0, 2, 1, 3)](%a)
  %1: f32[2,4,15] = reshape[shape=(2, 4, 15)](%0)
  %2: f32[2,4,6] = matmul(%1, %w)
  %3: f32[8,6] = reshape[shape=(8, 6)](%2)
  %4: f32[8,15] = reshape[shape=(8, 15)](%0)
  %5: f32[15,8] = permute[dims=(1, 0)](%4)
  %6: f32[15,6] = matmul(%5, %3)
  return (%3, %6)
}'''


def test_the_second_reshape_reads_the_first(rng):
    graph = parse(HEAD_MERGE)
    out = share_reshape_copies(graph)
    second = out.nodes[4]
    assert second.op == "reshape" and second.outputs[0].name == "4"
    assert second.inputs[0].name == "1"  # the contiguous copy, not the permuted view
    assert out.nodes[3].inputs[0].name == "2"  # a reshape of another value: unchanged
    args = [rng.standard_normal(tuple(v.type.shape)).astype(np.float32) for v in graph.inputs]
    expected = compile_graph(graph, "interp").run(*args)
    for backend in ("interp", "cpu"):
        for got, want in zip(compile_graph(out, backend).run(*args), expected):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_graph_without_repeated_reshapes_is_returned_as_it_is():
    graph = parse('''graph @r(%x: f32[2,6]) -> (f32[12]) {
  %0: f32[12] = reshape[shape=(12,)](%x)
  return (%0)
}''')
    assert share_reshape_copies(graph) is graph
