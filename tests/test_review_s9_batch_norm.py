"""Review of the ninth session's batch_norm kernel (graphc.backends.cpu.batch_norm: one walk
of shifted float64 sums in memory order, split over the channels) as a user drives it through
nn.BatchNorm2d: train and eval, affine and running statistics on or off, momentum, hostile
values, one value per channel, one and two threads; against PyTorch in float64.

momentum=None (the cumulative average) read `num_batches_tracked.item()` in forward, so a
compiled step failed to trace; the factor is now a 0-d tensor (tests at the end, with
BatchNorm3d).
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.testing import assert_rounding_within

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
torch = pytest.importorskip("torch")


def _graphc_run(x, channels, compiled, train=True, **options):
    """(out, x's gradient, running mean, running var) of a BatchNorm2d step in float32."""
    module = graphc.nn.BatchNorm2d(channels, **options)
    if module.affine:
        with graphc.no_grad():
            module.weight.copy_(graphc.tensor(np.linspace(0.5, 1.5, channels, dtype=np.float32)))
            module.bias.copy_(graphc.tensor(np.linspace(-1, 1, channels, dtype=np.float32)))
    module.train(train)

    def step(x):
        out = module(x)
        (out * out.sin()).sum().backward()
        return out.detach(), x.grad

    fn = graphc.compile(step, backend="cpu") if compiled else step
    out, grad = fn(graphc.tensor(x.astype(np.float32), requires_grad=True))
    stats = [module.running_mean.numpy().copy(), module.running_var.numpy().copy()] \
        if module.running_mean is not None else []
    return [out.numpy(), grad.numpy()] + stats


def _torch_run(x, channels, train=True, **options):
    module = torch.nn.BatchNorm2d(channels, **options).double()
    if module.affine:
        with torch.no_grad():
            module.weight.copy_(torch.linspace(0.5, 1.5, channels))
            module.bias.copy_(torch.linspace(-1, 1, channels))
    module.train(train)
    xt = torch.tensor(x, requires_grad=True)
    out = module(xt)
    (out * out.sin()).sum().backward()
    stats = [module.running_mean.numpy().copy(), module.running_var.numpy().copy()] \
        if module.running_mean is not None else []
    return [out.detach().numpy(), xt.grad.numpy()] + stats


def _check(x, channels, train=True, **options):
    got = _graphc_run(x, channels, True, train, **options)
    eager = _graphc_run(x, channels, False, train, **options)
    reference = _torch_run(x, channels, train, **options)
    assert len(got) == len(reference)
    for g, e, r in zip(got, eager, reference):
        if not np.isfinite(r).all():  # the same NaN and inf, where PyTorch has them
            np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
            np.testing.assert_array_equal(np.isinf(g), np.isinf(r))
            continue
        assert_rounding_within(g, e, r)


OPTIONS = [dict(), dict(affine=False), dict(track_running_stats=False), dict(momentum=0.0),
           dict(momentum=1.0)]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("channels", [1, 3, 17])
def test_modes_and_options_against_pytorch(channels, options, train):
    rng = np.random.default_rng(channels)
    _check(rng.standard_normal((2, channels, 5, 5)), channels, train, **options)


def _with(value, at):
    def make(z):
        z = z.copy()
        z[at] = value
        return z
    return make


HOSTILE = {
    "mean 1e5, deviation 0.1": lambda z: 1e5 + 0.1 * z,
    "deviation 1e-4": lambda z: 1e-4 * z,
    "an outlier first (the shift)": _with(1e6, (0, 0, 0, 0)),
    "inf first": _with(np.inf, (0, 0, 0, 0)),
    "inf later": _with(np.inf, (1, 1, 2, 2)),
    "NaN": _with(np.nan, (1, 1, 2, 2)),
    "constant": lambda z: np.full_like(z, 3.0),
    "two values a channel": None,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_values(name):
    rng = np.random.default_rng(len(name))
    if HOSTILE[name] is None:
        _check(rng.standard_normal((2, 3, 1, 1)), 3)
    else:
        _check(HOSTILE[name](rng.standard_normal((4, 3, 4, 4))), 3)


@pytest.mark.parametrize("compiled", [True, False])
def test_one_value_a_channel_in_training_raises_as_pytorch(compiled):
    x = np.ones((1, 3, 1, 1))
    with pytest.raises(ValueError) as expected:
        _torch_run(x, 3)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel") as raised:
        _graphc_run(x, 3, compiled)
    assert "per channel" in str(expected.value)
    assert "batch_norm" in str(raised.value)  # names the op
    _check(x, 3, train=False)  # eval mode takes it


def test_one_and_two_threads_give_the_same_bits():
    """Split over the channels, each channel's sums are added in one order."""
    from graphc.backends.cpu import threads
    from graphc.backends.cpu.blas import resolve_blas
    from graphc.backends.cpu.threads import ThreadChooser

    resolve_blas()  # hands the BLAS's thread count to generated code (threads.install)
    if threads.image_threads() < 2:
        pytest.skip("one core (or a BLAS whose thread count cannot be held): no split")
    x = np.random.default_rng(2).standard_normal((8, 64, 16, 16)).astype(np.float32)
    results = []
    for count in (1, 2):
        module = graphc.nn.BatchNorm2d(64)

        def step(x, module=module):
            out = module(x)
            (out * out.sin()).sum().backward()
            return out.detach(), x.grad

        compiled = graphc.compile(step, backend="cpu")
        compiled(graphc.tensor(x, requires_grad=True))  # compiled on this call
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        out, grad = compiled(graphc.tensor(x, requires_grad=True))
        results.append([out.numpy(), grad.numpy(), module.running_mean.numpy().copy(),
                        module.running_var.numpy().copy()])
        assert "batch_norm.split" in compiled.executable.lowered.ir_text
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


def test_cumulative_average_compiles():
    """momentum=None: the factor 1 / num_batches_tracked is a 0-d tensor, per call (it was a
    float read off the buffer with .item(), and a compiled step failed to trace)."""
    _check(np.random.default_rng(0).standard_normal((4, 3, 3, 3)), 3, momentum=None)


def test_cumulative_average_over_calls_matches_pytorch():
    """Three compiled calls: the running statistics average the three batches' (1/1, 1/2,
    1/3), as PyTorch's do."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((4, 3, 5, 5)) * (1 + k) + k for k in range(3)]
    module = graphc.nn.BatchNorm3d(3, momentum=None)
    reference = torch.nn.BatchNorm3d(3, momentum=None).double()
    step = graphc.compile(lambda x: module(x), backend="cpu")
    for x in xs:
        step(graphc.tensor(x[:, :, None].astype(np.float32)))
        reference(torch.tensor(x[:, :, None]))
    assert int(module.num_batches_tracked.item()) == 3
    for got, want in ((module.running_mean, reference.running_mean),
                      (module.running_var, reference.running_var)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
