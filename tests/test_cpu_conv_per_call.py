"""A convolution whose batch is known only per call (graphc.compile(dynamic=True): one cpu
executable for every size, graphc.backends.cpu.runtime_sizes) splits its images over the
cores as the static graph at the traced batch does (graphc.backends.cpu.conv_threads: the
choice made at the trace's size, the images counted per call): the same kernels are split,
and a small CNN's loss and gradients equal the interpreter's at batch sizes 1, 2, primes and
above the traced one, on one thread and on all cores. Small shapes are split here
(MIN_SPLIT_MACS patched to 0) so the test stays fast."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
from graphc.backends.cpu import conv_direct, conv_threads, threads  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from tests.conftest import square_loss_gradients  # noqa: E402

resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
ALL_CORES = threads.image_threads()
THRESHOLDS = (conv_threads.MIN_SPLIT_MACS, conv_direct.FEW_ROWS)  # before the fixture's patch
TRACED = 6  # unlike every other size of the input (duck sizing would tie them)
BATCHES = (TRACED, 2, 3, 5, 13, 1, 17)


@pytest.fixture(autouse=True)
def _split_small(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(conv_direct, "FEW_ROWS", 0)  # few output channels: keep im2col


def _model():
    graphc.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 3 * 3, 3))


def _executables(f) -> list:
    """f's cpu executables: a static graph's, and a symbolic graph's one for every size."""
    out = []
    for entry in f._entries:
        ex = entry.executable
        if hasattr(ex, "executable_for"):  # the symbolic graph's: bound to any size
            ex = ex.executable_for({"s0": TRACED}).executable
        out.append(ex)
    return out


def _split_kernels(ex) -> list[str]:
    names = re.findall(r'define[^@]*@"?k\d+_([\w.]+\.split)"?\(', ex.lowered.ir_text)
    return sorted(names)


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot "
                    "be held): convolution kernels are never split")
def test_a_batch_known_per_call_splits_its_convolutions_as_the_static_graph():
    symbolic = graphc.compile(square_loss_gradients(_model()), backend="cpu", dynamic=True)
    static = graphc.compile(square_loss_gradients(_model()), backend="cpu", dynamic=False)
    reference = graphc.compile(square_loss_gradients(_model()), backend="interp",
                               dynamic=False, recompile_limit=len(BATCHES) + 1)
    rng = np.random.default_rng(11)
    x = graphc.tensor(rng.standard_normal((TRACED, 2, 10, 10)).astype(np.float32))
    symbolic(x)
    static(x)
    generic = [ex for ex in _executables(symbolic) if getattr(ex, "generic", False)
               or type(ex).__name__ == "RuntimeSizedExecutable"]
    assert len(generic) == 1, "the symbolic graph was not compiled once for every size"
    wanted = _split_kernels(_executables(static)[0])
    assert any(name.startswith("conv2d") for name in wanted), wanted
    assert _split_kernels(generic[0]) == wanted
    for batch in BATCHES:
        x = graphc.tensor(rng.standard_normal((batch, 2, 10, 10)).astype(np.float32))
        want = [t.numpy() for t in reference(x)]
        for count in sorted({1, ALL_CORES}):
            generic[0].thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
            for got, expected in zip(symbolic(x), want):
                np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4,
                                           err_msg=f"batch {batch}, {count} threads")
    assert [str(g.inputs[0].type) for g in symbolic.graphs] == \
        ["f32[s0,2,10,10]", "f32[1,2,10,10]"]


@pytest.mark.skipif(ALL_CORES < 2, reason="one core (or a BLAS whose thread count cannot "
                    "be held): convolution kernels are never split")
def test_lenet5_with_a_batch_known_per_call_splits_every_kernel_the_static_step_splits(
        monkeypatch):
    """LeNet-5's training step at the real thresholds, traced at batch 64: its convolutions
    (few-channel and im2col, forward and gradients) and poolings split as the static step's
    do; a batch of 7 still equals the interpreter on one thread and on all cores."""
    from benchmarks.models import lenet5

    monkeypatch.setattr(conv_threads, "MIN_SPLIT_MACS", THRESHOLDS[0])
    monkeypatch.setattr(conv_direct, "FEW_ROWS", THRESHOLDS[1])

    def model():
        graphc.manual_seed(0)
        return lenet5()

    symbolic = graphc.compile(square_loss_gradients(model()), backend="cpu", dynamic=True)
    static = graphc.compile(square_loss_gradients(model()), backend="cpu", dynamic=False)
    rng = np.random.default_rng(5)
    x = graphc.tensor(rng.standard_normal((64, 1, 28, 28)).astype(np.float32))
    symbolic(x)
    static(x)
    wanted = _split_kernels(_executables(static)[0])
    assert len(wanted) >= 5, wanted
    generic = [ex for ex in _executables(symbolic)
               if type(ex).__name__ == "RuntimeSizedExecutable"]
    assert len(generic) == 1 and _split_kernels(generic[0]) == wanted
    x = graphc.tensor(rng.standard_normal((7, 1, 28, 28)).astype(np.float32))
    want = [t.numpy() for t in graphc.compile(square_loss_gradients(model()), backend="interp")(x)]
    for count in sorted({1, ALL_CORES}):
        generic[0].thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        for got, expected in zip(symbolic(x), want):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{count} threads")
