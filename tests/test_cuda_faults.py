"""Kernel faults in compiled cuda graphs (issue 18, item 5), on the emulation.

Covers: a kernel that faults (a `__syncthreads()` reached by part of its block, which the
emulation reports as CUDA would hang or misbehave) names the kernel, the graph node and the
user's source line; without GRAPHC_CUDA_SYNC the message says launches are asynchronous and
how to find the kernel at fault; a sticky error (simulated GC_ERROR_DEVICE_LOST: the
emulation has none) resets the device, the error says how many values only the device held,
those keep their last host values, and the next call rebuilds and runs; the CUDA-graph capture
is tried once and refused by the emulation, which runs the launch list directly.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc import nn
from graphc.backends import compile as compile_graph
from graphc.backends import residency
from graphc.ir import parse
from tests.conftest import sgd_training_step
from tests.cuda_support import loaded_emulation_runtime


@pytest.fixture(autouse=True)
def _emulation(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CUDA", "emu")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def rt():
    return loaded_emulation_runtime()


GRAPH = '''graph @f(%x: f32[300]) -> (f32[300]) {
  %0: f32[300] = exp(%x)  # model.py:3
  %1: f32[300] = mul(%0, %0)  # model.py:4
  return (%1)
}'''

# a barrier inside a branch only 10 threads of each block take: a fault in the emulation
BAD_KERNEL = '''
#ifndef GC_EMU_EXPORT
#define GC_EMU_EXPORT(name)
#endif
extern "C" __global__ void bad_barrier(PARAMS) {
  if (threadIdx.x < 10) __syncthreads();
}
GC_EMU_EXPORT(bad_barrier)
'''


def _with_bad_second_kernel(rt):
    from graphc.backends.cuda.compile import load_module

    exe = compile_graph(parse(GRAPH), "cuda")
    k = 1  # the mul kernel
    assert exe.lowered.steps[k].function.endswith("_mul")
    params = ", ".join(f"float *p{i}" for i in range(len(exe.lowered.steps[k].args)))
    module = load_module(rt, BAD_KERNEL.replace("PARAMS", params), "bad")
    fn, args, keep, name = exe._steps[k]
    exe._steps[k] = (fn, (module.function("bad_barrier"),) + args[1:], keep + (module,), name)
    return exe


def test_a_fault_names_the_kernel_node_and_source_line_under_sync(rt, monkeypatch):
    monkeypatch.setenv("GRAPHC_CUDA_SYNC", "1")
    exe = _with_bad_second_kernel(rt)
    from graphc.backends.cuda.rt import CudaEmulationError

    with pytest.raises(CudaEmulationError) as info:
        exe.run(np.ones(300, np.float32))
    message = str(info.value)
    assert "graph @f, kernel k1_mul (node `%1: f32[300] = mul(%0, %0)" in message
    assert "# model.py:4`)" in message and "__syncthreads()" in message
    assert "asynchronous" not in message and info.value.step == 1


def test_without_sync_the_message_says_where_to_look(rt, monkeypatch):
    monkeypatch.delenv("GRAPHC_CUDA_SYNC", raising=False)
    exe = _with_bad_second_kernel(rt)
    from graphc.backends.cuda.rt import CudaEmulationError

    with pytest.raises(CudaEmulationError, match="rerun with GRAPHC_CUDA_SYNC=1"):
        exe.run(np.ones(300, np.float32))
    # the emulation's faults are not sticky: the executable still works once repaired
    exe._steps = [exe._bind(step, exe._base.value) for step in exe.lowered.steps]
    x = np.linspace(-1, 1, 300).astype(np.float32)
    np.testing.assert_allclose(exe.run(x)[0], np.exp(x) ** 2, rtol=1e-5)


def test_capture_is_tried_once_and_refused_by_the_emulation(rt):
    exe = compile_graph(parse(GRAPH), "cuda")
    x = np.linspace(-1, 1, 300).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(exe.run(x)[0], np.exp(x) ** 2, rtol=1e-5)
    assert exe._capture == "refused" and exe._graph_exec is None


def test_a_sticky_error_resets_the_device_and_lost_values_raise_once(rt, rng):
    from graphc.backends.cuda.rt import STATUS, CudaDeviceLostError

    model, step = sgd_training_step(
        lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    step = graphc.compile(step, backend="cuda")

    def batch():
        return (graphc.tensor(rng.standard_normal((4, 8)).astype(np.float32)),
                graphc.tensor(rng.integers(0, 3, 4)))

    for _ in range(3):
        step(*batch())
    weight = next(iter(model.parameters()))
    before = weight._array.copy()  # the host copy: out of date
    assert residency.marked_by(weight._array) is not None
    exe = step.executable

    def fault(*args):
        raise CudaDeviceLostError("gc_launch: an illegal memory access was encountered "
                                  "(simulated)", "gc_launch", STATUS["GC_ERROR_DEVICE_LOST"])

    exe._steps[2] = (fault, (), (), exe._steps[2][3])
    with pytest.raises(CudaDeviceLostError, match="the device was reset .* the current "
                       "values of [0-9]+ tensors .* were lost"):
        step(*batch())
    # (this step: 8 state arrays and 4 .grads; the count is of every executable in the process)
    np.testing.assert_array_equal(weight.detach().numpy(), before)  # its last host value
    assert residency.marked_by(weight._array) is None
    loss = step(*batch())  # rebuilt: runs again from the host values
    assert np.isfinite(loss.item())
    assert exe._lost is None and residency.marked_by(weight._array) is not None


def _training_step_with_a_faulting_kernel(rt, rng):
    """A compiled MLP training step after 3 calls (state on the device), its first generated
    kernel replaced by one whose barrier only part of each block reaches (a kernel fault)."""
    from graphc.backends.cuda.compile import load_module
    from graphc.backends.cuda.lowering import Launch

    model, step = sgd_training_step(
        lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)))
    step = graphc.compile(step, backend="cuda")

    def batch():
        return (graphc.tensor(rng.standard_normal((4, 8)).astype(np.float32)),
                graphc.tensor(rng.integers(0, 3, 4)))

    for _ in range(3):
        step(*batch())
    exe = step.executable
    k = next(i for i, s in enumerate(exe.lowered.steps) if isinstance(s, Launch))
    params = ", ".join(f"float *p{i}" for i in range(len(exe.lowered.steps[k].args)))
    module = load_module(rt, BAD_KERNEL.replace("PARAMS", params), "bad")
    fn, args, keep, name = exe._steps[k]
    exe._steps[k] = (fn, (module.function("bad_barrier"),) + args[1:], keep + (module,), name)
    return model, step, batch


def test_an_emulated_sticky_fault_resets_the_device_and_the_next_call_uploads_again(
        rt, rng, monkeypatch):
    """GRAPHC_EMU_STICKY=1: the emulation's kernel fault is sticky, as on a GPU (the runtime
    returns GC_ERROR_DEVICE_LOST and frees every device allocation at the reset). The failing
    call names the fault, resets the device, and the next call rebuilds the executable and
    uploads the state again from the host."""
    from graphc.backends.cuda.rt import CudaDeviceLostError

    monkeypatch.setenv("GRAPHC_EMU_STICKY", "1")
    model, step, batch = _training_step_with_a_faulting_kernel(rt, rng)
    weight = next(iter(model.parameters()))
    before = weight._array.copy()  # the host copy: its last upload
    with pytest.raises(CudaDeviceLostError) as info:
        step(*batch())
    message = str(info.value)
    assert "bad_barrier: kernel bad_barrier block" in message and "__syncthreads()" in message
    assert "GRAPHC_EMU_STICKY" in message and "the device was reset" in message
    np.testing.assert_array_equal(weight.detach().numpy(), before)
    rt.gc_transfer_bytes_reset()
    loss = step(*batch())  # rebuilt: the state crosses again
    assert np.isfinite(loss.item())
    import ctypes

    h2d = ctypes.c_int64()
    rt.gc_transfer_bytes(ctypes.byref(h2d), ctypes.byref(ctypes.c_int64()))
    params = sum(p.numel() for p in model.parameters()) * 4
    assert h2d.value >= params  # the parameters (and momentum) uploaded again
    assert not np.array_equal(weight.detach().numpy(), before)  # and trained on


def test_after_a_failed_reset_every_call_names_the_first_fault(rt, rng, monkeypatch):
    """GRAPHC_EMU_STICKY=unrecoverable: the reset fails too, and from then on every call of
    every executable fails at once with a message naming the first fault."""
    from graphc.backends.cuda import executable
    from graphc.backends.cuda.rt import CudaDeviceLostError

    monkeypatch.setattr(executable, "_unusable", None)
    monkeypatch.setenv("GRAPHC_EMU_STICKY", "unrecoverable")
    _, step, batch = _training_step_with_a_faulting_kernel(rt, rng)
    other = compile_graph(parse(GRAPH), "cuda")
    try:
        with pytest.raises(CudaDeviceLostError, match="the device could not be reset .* "
                           "restart the process"):
            step(*batch())
        for call in (lambda: step(*batch()), lambda: other.run(np.ones(300, np.float32))):
            with pytest.raises(CudaDeviceLostError, match=r"unusable since an earlier fault "
                               r"and could not be reset; restart the process \(the first "
                               r"fault: .*bad_barrier: kernel bad_barrier block"):
                call()
    finally:  # recover the emulated context for the tests after this one
        monkeypatch.setenv("GRAPHC_EMU_STICKY", "1")
        executable._reset_device(rt, "test cleanup")
