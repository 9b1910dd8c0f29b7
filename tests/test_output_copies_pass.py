"""drop_output_copies (graphc/passes/output_copies.py), IR text in, IR text out: a graph
output copying a computed value becomes that value; copies of inputs, of views, of values
that are outputs already or copied twice, and update values keep their copy; the cuda
pipeline runs the pass and a compiled training step's gradients stay right."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.ir import parse
from graphc.ir.printer import format_graph
from graphc.passes import default_passes
from graphc.passes.output_copies import drop_output_copies


def _ops(text: str) -> tuple[list[str], list[str]]:
    g = drop_output_copies(parse(text))
    return [n.op for n in g.nodes], [v.name for v in g.outputs]


def test_an_output_copy_of_a_computed_shared_value_is_the_value():
    ops, outs = _ops('''graph @f(%x: f32[4]) -> (f32[4], f32[4]) {
  %0: f32[4] = exp(%x)
  %1: f32[4] = copy(%0)
  %2: f32[4] = mul(%0, %1)
  return (%1, %2)
}''')
    assert ops == ["exp", "mul"] and outs == ["0", "2"]


@pytest.mark.parametrize("text", [
    # a copy of a graph input: the output must not be the caller's array
    '''graph @f(%x: f32[4]) -> (f32[4]) {
  %1: f32[4] = copy(%x)
  return (%1)
}''',
    # the source is an output already: two outputs would be one value
    '''graph @f(%x: f32[4]) -> (f32[4], f32[4]) {
  %0: f32[4] = exp(%x)
  %1: f32[4] = copy(%0)
  return (%0, %1)
}''',
    # a view's bytes belong to its source
    '''graph @f(%x: f32[2,2]) -> (f32[4]) {
  %0: f32[2,2] = exp(%x)
  %v: f32[4] = reshape[shape=(4,)](%0)
  %1: f32[4] = copy(%v)
  return (%1)
}''',
    # copied twice: both outputs would be one value
    '''graph @f(%x: f32[4]) -> (f32[4], f32[4]) {
  %0: f32[4] = exp(%x)
  %1: f32[4] = copy(%0)
  %2: f32[4] = copy(%0)
  return (%1, %2)
}''',
])
def test_copies_that_stay(text):
    assert "copy" in _ops(text)[0]


def test_an_update_value_keeps_its_copy():
    base = parse('''graph @f(%x: f32[4]) -> (f32[4]) {
  %0: f32[4] = exp(%x)
  %1: f32[4] = copy(%0)
  return (%1)
}''')
    base.updates = [(base.inputs[0], base.outputs[0])]  # x <- copy(exp(x))
    out = drop_output_copies(base)
    assert [n.op for n in out.nodes] == ["exp", "copy"]
    assert format_graph(out) == format_graph(base)


def test_the_cuda_pipeline_runs_it():
    assert "drop_output_copies" in [p.__name__ for p in default_passes(None, "cuda")]
    assert "drop_output_copies" not in [p.__name__ for p in default_passes(None, "cpu")]


@pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")
def test_a_batch_norm_step_on_cuda_has_no_gradient_copies(rng):
    import graphc
    from graphc import nn
    from tests.conftest import sgd_training_step

    def model():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Flatten(), nn.Linear(4 * 6 * 6, 3))

    (net, step), (ref_net, ref_step) = sgd_training_step(model), sgd_training_step(model)
    step, ref_step = graphc.compile(step, backend="cuda"), graphc.compile(ref_step,
                                                                          backend="interp")
    for _ in range(2):
        x = graphc.tensor(rng.standard_normal((4, 3, 6, 6)).astype(np.float32))
        y = graphc.tensor(rng.integers(0, 3, 4))
        np.testing.assert_allclose(step(x, y).numpy(), ref_step(x, y).numpy(), rtol=1e-5)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        scale = max(float(np.abs(q.grad.numpy()).max()), 1e-3)
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), atol=1e-4 * scale)
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert "copy" not in [n.op for n in step.executable.graph.nodes]
