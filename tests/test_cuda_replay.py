"""CudaExecutable.replay and step_times (what benchmarks/gpu.py times the kernels with), on
the emulation (or the GPU with GRAPHC_TEST_ON_GPU=1): both need a call's device values first
and a positive count; calls after replays give their own results; step_times gives one
duration per step."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.errors import ArgumentError

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


def test_replay_and_step_times(rng):
    from graphc.backends import compile as compile_graph
    from graphc.ir import parse

    ex = compile_graph(parse('''graph @f(%x: f32[8]) -> (f32[8]) {
  %0: f32[8] = relu(%x)
  %1: f32[8] = mul(%0, %0)
  return (%1)
}'''), "cuda")
    with pytest.raises(ArgumentError, match="replay needs the device values of a call"):
        ex.replay(1)
    x = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(ex.run(x)[0], np.maximum(x, 0) ** 2, rtol=1e-6)
    ex.replay(3)
    times = ex.step_times(2)
    assert len(times) == len(ex.lowered.steps) and all(t >= 0 for t in times)
    with pytest.raises(ArgumentError, match="the count must be at least 1, got 0"):
        ex.replay(0)
    y = rng.standard_normal(8).astype(np.float32)  # calls after replays are still calls
    np.testing.assert_allclose(ex.run(y)[0], np.maximum(y, 0) ** 2, rtol=1e-6)
