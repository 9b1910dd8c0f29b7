"""graphc.passes.scatter_sum: a sum of slices scattered into zeros (the gradient of `x[t]`
over a loop, or of `chunk`) becomes one concat, with zeros in the gaps; anything else is left
alone."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from graphc.passes.scatter_sum import concat_disjoint_scatters
from graphc.passes.simplify import simplify


def _run(graph, backend, *args):
    return compile_graph(graph, backend).run(*args)


# three slabs of an odd-sized axis 1 (7): rows [5, 7), [0, 2) and [3, 4), gaps at 2 and 4
GAPS = '''graph @f(%a: f32[3,2,5], %b: f32[3,2,5], %c: f32[3,1,5]) -> (f32[3,7,5]) {
  %0: f32[3,7,5] = full[shape=(3, 7, 5), value=0.0, dtype="float32"]()
  %1: f32[3,7,5] = slice_scatter[starts=(0, 5, 0), stops=(3, 7, 5), steps=(1, 1, 1)](%0, %a)
  %2: f32[3,7,5] = slice_scatter[starts=(0, 0, 0), stops=(3, 2, 5), steps=(1, 1, 1)](%0, %b)
  %3: f32[3,7,5] = add(%1, %2)
  %4: f32[3,7,5] = slice_scatter[starts=(0, 3, 0), stops=(3, 4, 5), steps=(1, 1, 1)](%0, %c)
  %5: f32[3,7,5] = add(%4, %3)
  return (%5)
}'''


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_disjoint_slabs_with_gaps_become_one_concat(rng, backend):
    g = parse(GAPS)
    out = simplify(g)
    ops = [n.op for n in out.nodes]
    assert "slice_scatter" not in ops and "add" not in ops and ops.count("concat") == 1
    concat = out.nodes[-1]
    assert concat.op == "concat" and concat.attrs["axis"] == 1
    assert [v.type.shape[1] for v in concat.inputs] == [2, 1, 1, 1, 2]  # b, 0, c, 0, a
    args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 2, 5), (3, 2, 5),
                                                                 (3, 1, 5))]
    want = _run(g, "interp", *args)[0]
    np.testing.assert_array_equal(_run(out, backend, *args)[0], want)


def test_slabs_tiling_the_axis_need_no_zeros(rng):
    g = parse('''graph @f(%a: f32[4,3], %b: f32[4,2]) -> (f32[4,5]) {
  %0: f32[4,5] = full[shape=(4, 5), value=0.0, dtype="float32"]()
  %1: f32[4,5] = slice_scatter[starts=(0, 3), stops=(4, 5), steps=(1, 1)](%0, %b)
  %2: f32[4,5] = slice_scatter[starts=(0, 0), stops=(4, 3), steps=(1, 1)](%0, %a)
  %3: f32[4,5] = add(%1, %2)
  return (%3)
}''')
    out = simplify(g)
    assert [n.op for n in out.nodes] == ["concat"]
    assert out.nodes[0].inputs == list(g.inputs)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(
        np.float32)
    np.testing.assert_array_equal(_run(out, "cpu", a, b)[0], np.concatenate([a, b], 1))


@pytest.mark.parametrize("text", [
    # overlapping slabs: the overlap is a real sum
    '''graph @f(%a: f32[3,4], %b: f32[3,4]) -> (f32[6,4]) {
  %0: f32[6,4] = full[shape=(6, 4), value=0.0, dtype="float32"]()
  %1: f32[6,4] = slice_scatter[starts=(0, 0), stops=(3, 4), steps=(1, 1)](%0, %a)
  %2: f32[6,4] = slice_scatter[starts=(2, 0), stops=(5, 4), steps=(1, 1)](%0, %b)
  %3: f32[6,4] = add(%1, %2)
  return (%3)
}''',
    # slabs along different axes
    '''graph @f(%a: f32[1,4], %b: f32[6,1]) -> (f32[6,4]) {
  %0: f32[6,4] = full[shape=(6, 4), value=0.0, dtype="float32"]()
  %1: f32[6,4] = slice_scatter[starts=(0, 0), stops=(1, 4), steps=(1, 1)](%0, %a)
  %2: f32[6,4] = slice_scatter[starts=(0, 3), stops=(6, 4), steps=(1, 1)](%0, %b)
  %3: f32[6,4] = add(%1, %2)
  return (%3)
}''',
    # a base that is not zeros
    '''graph @f(%a: f32[1,4], %b: f32[1,4]) -> (f32[6,4]) {
  %0: f32[6,4] = full[shape=(6, 4), value=1.0, dtype="float32"]()
  %1: f32[6,4] = slice_scatter[starts=(0, 0), stops=(1, 4), steps=(1, 1)](%0, %a)
  %2: f32[6,4] = slice_scatter[starts=(1, 0), stops=(2, 4), steps=(1, 1)](%0, %b)
  %3: f32[6,4] = add(%1, %2)
  return (%3)
}''',
    # a strided slab
    '''graph @f(%a: f32[3,4], %b: f32[1,4]) -> (f32[6,4]) {
  %0: f32[6,4] = full[shape=(6, 4), value=0.0, dtype="float32"]()
  %1: f32[6,4] = slice_scatter[starts=(0, 0), stops=(6, 4), steps=(2, 1)](%0, %a)
  %2: f32[6,4] = slice_scatter[starts=(1, 0), stops=(2, 4), steps=(1, 1)](%0, %b)
  %3: f32[6,4] = add(%1, %2)
  return (%3)
}''',
])
def test_left_alone(text):
    g = parse(text)
    assert concat_disjoint_scatters(g) is g


def test_lstm_input_gradient_has_no_scatter_left(rng):
    """A traced LSTM step: the per-step gradients of the input projection and of the gate
    chunks are concats, and the compiled gradients match eager graphc's."""
    graphc.manual_seed(0)
    models = [nn.LSTM(3, 5, batch_first=True) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x = graphc.tensor(rng.standard_normal((2, 7, 3)).astype(np.float32))

    def step_of(model):
        def step(x):
            model.zero_grad()
            out, _ = model(x)
            loss = (out ** 2).sum()
            loss.backward()
            return loss.detach()
        return step

    compiled = graphc.compile(step_of(models[0]), backend="cpu")
    for _ in range(2):
        compiled(x)
    step_of(models[1])(x)
    assert "slice_scatter" not in [n.op for n in compiled.optimized_graph.nodes]
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)
