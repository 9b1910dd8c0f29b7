"""Bad inputs: Ctrl-C during a compiled training step. The step is never half applied: the
interrupt is held until the native run and every write-back (parameters, optimizer state,
`.grad`s) are done, then KeyboardInterrupt is raised; the state is exactly one full step on."""

import signal

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F


def _setup():
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = graphc.optim.Adam(model.parameters(), lr=0.01)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, step


def _state(model, opt):
    params = [p.detach().numpy().copy() for p in model.parameters()]
    moments = [v.numpy().copy() for s in opt.state.values() for v in s.values()
               if hasattr(v, "numpy")]
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    return params, moments, grads


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_ctrl_c_during_the_native_run_completes_the_step_then_raises(backend, monkeypatch):
    pytest.importorskip("llvmlite") if backend == "cpu" else None
    # Python's own Ctrl-C handler, whatever the process inherited: started in the background
    # by a shell without job control, SIGINT is ignored and graphc rightly raises nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_step(backend, monkeypatch)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_step(backend, monkeypatch):
    x, y = graphc.randn(5, 6), graphc.randint(0, 3, (5,))
    model, opt, step = _setup()
    compiled = graphc.compile(step, backend=backend)
    for _ in range(3):
        compiled(x, y)
    twin, twin_opt, twin_step = _setup()
    for _ in range(4):
        twin_step(x, y)  # the reference: four whole steps
    executable = compiled.executable
    real_run = executable.run

    def interrupted(*arrays):
        result = real_run(*arrays)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C lands as the native code returns
        return result

    monkeypatch.setattr(executable, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compiled(x, y)
    monkeypatch.undo()
    for got, want in zip(_state(model, opt), _state(twin, twin_opt)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    compiled(x, y)  # and the step goes on as before
