"""graphc.compile's fast path: a guard never accepts a call the full signature would reject.

For each mutation of the state a call reaches (hyperparameters, train/eval, hooks, parameters,
module attributes, captured tensors, `.grad`s, optimizer state, arguments, grad mode) the tests
compare the entry's `_Guard` with the full signature computed from the same state: the guard
may only hold where the signature is equal, and every mutation the signature sees fails it.
They then call the compiled function and check it retraced exactly when the signature differs,
that a benign change refreshes the guard (the next call is fast again), and that the fast path
is really taken. Also the CPU executable's per-call contract: fresh outputs, reused pointers.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.backends.cpu.executable import CpuExecutable
from graphc.ir import parse
from graphc.jit import compiler
from graphc.jit.compiler import reachable_state, signature_of

_SCALE = graphc.ones(3)  # a global the step below reads


class _Setup:
    """A small training step (Linear, Dropout, ReLU, Linear; SGD momentum; a captured global
    and a closure tensor; a Python hyperparameter in a plain object) compiled on the
    interpreter, and its arguments."""

    def __init__(self, zero_grad: bool = True, backend: str = "interp") -> None:
        graphc.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.0), nn.ReLU(), nn.Linear(4, 2))
        self.opt = optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.offset = graphc.zeros(2)
        self.config = type("Config", (), {})()
        self.config.weight = 1.0
        model, opt, offset, config = self.model, self.opt, self.offset, self.config

        def step(x, y):
            if zero_grad:
                opt.zero_grad()
            out = model(x * _SCALE) + offset
            loss = ((out - y) ** 2).mean() * config.weight
            loss.backward()
            opt.step()
            return loss.detach()

        self.compiled = graphc.compile(step, backend=backend)
        rng = np.random.default_rng(0)
        self.args = (graphc.tensor(rng.standard_normal((5, 3)).astype(np.float32)),
                     graphc.tensor(rng.standard_normal((5, 2)).astype(np.float32)))

    def call(self, *args):
        return self.compiled(*(args or self.args))

    def full_signature(self, args=None) -> dict:
        args = args or self.args
        modules, captured = reachable_state(self.compiled.fn, args, {})
        return signature_of(self.compiled.fn, modules, args, {}, captured)

    def check_guards(self, args=None) -> list[bool]:
        """For every entry: whether its guard holds; asserts none holds where the full
        signature differs."""
        args = args or self.args
        sig = self.full_signature(args)
        holds = []
        for entry in self.compiled._entries:
            ok = entry.guard is not None and entry.guard.holds(args, {})
            assert not ok or entry.signature == sig, "a guard accepted a changed signature"
            holds.append(ok)
        return holds


def _set_global(value):
    global _SCALE
    _SCALE = value


# (name, mutation, whether the full signature sees it)
MUTATIONS = [
    ("lr in a param group", lambda s: s.opt.param_groups[0].__setitem__("lr", 0.05), True),
    ("momentum", lambda s: s.opt.param_groups[0].__setitem__("momentum", 0.5), True),
    ("a new param group key", lambda s: s.opt.param_groups[0].__setitem__("foo", 1), True),
    ("eval()", lambda s: s.model.eval(), True),
    ("eval() of one submodule", lambda s: s.model[1].eval(), True),
    ("a forward hook", lambda s: s.model[0].register_forward_hook(lambda *a: None), True),
    ("a forward pre-hook", lambda s: s.model.register_forward_pre_hook(lambda *a: None), True),
    ("a replaced parameter", lambda s: setattr(s.model[0], "weight", nn.Parameter(
        graphc.ones(4, 3))), True),
    ("dropout p", lambda s: setattr(s.model[1], "p", 0.3), True),
    ("a new module attribute", lambda s: setattr(s.model[2], "alpha", 2.0), True),
    ("a replaced child module", lambda s: setattr(s.model, "2", nn.Tanh()), True),
    ("requires_grad off", lambda s: s.model[3].bias.requires_grad_(False), True),
    ("a captured global of another shape", lambda s: _set_global(graphc.ones(1)), True),
    ("a captured global replaced", lambda s: _set_global(graphc.ones(3)), True),
    ("a closure tensor's object attribute", lambda s: setattr(s.config, "weight", 2.0), True),
    ("a literal attribute set to an equal object", lambda s: setattr(
        s.config, "weight", float("1.0")), False),
    ("lr set to an equal new float", lambda s: s.opt.param_groups[0].__setitem__(
        "lr", float(str(0.1))), False),
    ("a .grad disappears", lambda s: setattr(s.model[0].weight, "grad", None), True),
    ("a .grad that requires grad", lambda s: setattr(s.model[0].weight, "grad", graphc.zeros(
        4, 3).requires_grad_()), True),
    ("a .grad replaced by one of its type", lambda s: setattr(
        s.model[0].weight, "grad", graphc.zeros(4, 3)), False),
    ("optimizer state cleared", lambda s: s.opt.state.clear(), True),
    ("a momentum buffer replaced", lambda s: s.opt.state[s.model[0].bias].__setitem__(
        "momentum_buffer", graphc.zeros(4)), True),
    ("parameter values changed in place", lambda s: s.model[0].weight.mul_(0.5), False),
    ("train() when already training", lambda s: s.model.train(), False),
]


def _warm(s: _Setup) -> None:
    """Trace, let lazily created state (momentum buffers) retrace once, and leave the guard
    of the entry in use fresh."""
    for _ in range(3):
        s.call()


@pytest.mark.parametrize("name,mutate,differs", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_the_guard_fails_exactly_when_the_signature_differs(name, mutate, differs):
    s = _Setup()
    saved = _SCALE
    try:
        _warm(s)
        assert s.check_guards()[-1], "the warm entry's guard must hold before any change"
        with graphc.no_grad():
            mutate(s)
        holds = s.check_guards()[-1]
        assert (s.full_signature() != s.compiled._entries[-1].signature) == differs
        if differs:
            assert not holds
        n = len(s.compiled._entries)
        s.call()
        assert (len(s.compiled._entries) > n) == differs
        s.call()  # the guard of the entry now in use holds again
        assert any(s.check_guards())
    finally:
        _set_global(saved)


def test_grad_presence_and_type_without_zero_grad():
    s = _Setup(zero_grad=False)  # .grads accumulate: each is read as an input
    _warm(s)
    w = s.model[0].weight
    assert s.check_guards()[-1]
    saved = w.grad
    w.grad = None
    assert not s.check_guards()[-1]
    w.grad = graphc.zeros(4, 3).requires_grad_()
    assert not s.check_guards()[-1]
    w.grad = graphc.zeros(4, 3)  # another tensor of the same type: the signature is equal
    assert s.check_guards()[-1]
    w.grad = saved
    assert s.check_guards()[-1]


def test_arguments_and_grad_mode():
    s = _Setup()
    _warm(s)
    x, y = s.args
    assert not s.check_guards((x[:4], y[:4]))[-1]  # another shape
    assert not s.check_guards((x.double(), y))[-1]  # another dtype
    assert not s.check_guards((x.clone().requires_grad_(), y))[-1]
    with graphc.no_grad():
        assert not s.check_guards()[-1]
    assert s.check_guards((x.clone(), y.clone()))[-1]  # new tensors of the same type: fast


def test_python_arguments_by_value_and_type():
    calls = graphc.compile(lambda x, k: x * k, backend="interp")
    x = graphc.ones(3)
    calls(x, 2)
    calls(x, 2)
    guard = calls._entries[-1].guard
    assert guard.holds((x, 2), {})
    assert not guard.holds((x, 3), {})
    assert not guard.holds((x, 2.0), {})
    assert not guard.holds((x, True), {})


def test_random_sequences_of_mutations_never_fool_a_guard():
    rng = random.Random(0)
    for _ in range(3):
        s = _Setup()
        saved = _SCALE
        try:
            _warm(s)
            s.compiled.recompile_limit = 100
            for _ in range(6):
                _, mutate, _ = rng.choice(MUTATIONS)
                with graphc.no_grad():
                    mutate(s)
                s.check_guards()
                s.call()
                s.check_guards()
        finally:
            _set_global(saved)


def test_the_fast_path_skips_the_full_signature(monkeypatch):
    s = _Setup()
    _warm(s)

    def refuse(*args, **kwargs):
        raise AssertionError("the full signature was computed on a steady-state call")

    monkeypatch.setattr(compiler, "reachable_state", refuse)
    before = [p.detach().clone() for p in s.model.parameters()]
    s.call()
    assert any(not np.array_equal(b._data, p._data) for b, p in zip(before, s.model.parameters()))


def test_the_recompile_reasons_are_the_full_signatures(monkeypatch, capsys):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    s = _Setup()
    _warm(s)
    s.opt.param_groups[0]["lr"] = 0.05
    s.call()
    assert "opt.param_groups[0]['lr']: 0.1 -> 0.05" in "; ".join(s.compiled.recompile_reasons[-1])
    assert "opt.param_groups[0]['lr']: 0.1 -> 0.05" in capsys.readouterr().err


def test_an_old_signature_comes_back_to_its_entry_through_the_fast_path():
    s = _Setup()
    _warm(s)
    s.model.eval()
    s.call()
    s.call()
    s.model.train()
    n = len(s.compiled._entries)
    s.call()  # full signature: the training entry again, its guard refreshed
    s.call()
    assert len(s.compiled._entries) == n
    assert s.check_guards() == [False, True, False]


def test_a_stale_entry_is_not_taken_by_the_fast_path():
    x = graphc.ones(3)
    nested = [[[graphc.ones(3)]]]  # too deep for the signature: a binding only
    f = graphc.compile(lambda a: a * nested[0][0][0][0:3], backend="interp")
    f(x)
    f(x)
    assert f._entries[-1].guard.holds((x,), {})
    nested[0][0][0]._data = np.ones(4, np.float32)  # the same tensor, another shape: stale
    out = f(x)
    np.testing.assert_array_equal(out._data, np.ones(3, np.float32))
    assert len(f._entries) == 2
    assert f._entries[0].shadowed and not f._entries[1].shadowed  # the same signature
    f(x)  # the new entry, through its guard
    assert len(f._entries) == 2


def test_the_cpu_step_matches_eager_and_outputs_are_fresh():
    s = _Setup(backend="cpu")
    eager = _Setup()
    losses = [(s.call(), eager.compiled.fn(*eager.args)) for _ in range(4)]
    for compiled_loss, eager_loss in losses:
        np.testing.assert_allclose(compiled_loss._data, eager_loss._data, rtol=1e-5)
    assert len({id(c._data) for c, _ in losses}) == 4  # a fresh array every call
    grads = s.model[0].weight.grad
    s.call()
    assert s.model[0].weight.grad is not grads
    assert not np.shares_memory(s.model[0].weight.grad._data, grads._data)


def test_cpu_executable_reuses_and_refreshes_input_pointers():
    g = parse('''graph @f(%x: f32[4], %b: f32[4]) -> (f32[4]) {
      %0: f32[4] = add(%x, %b)
      return (%0)
    }''')
    ex = CpuExecutable(g)
    x, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    first = ex.run(x, b)[0]
    x += 10  # the same array, new values: its pointer is reused
    second = ex.run(x, b)[0]
    np.testing.assert_array_equal(second, np.arange(4) + 11)
    np.testing.assert_array_equal(first, np.arange(4) + 1)  # outputs never alias across calls
    other = np.full(4, 5, np.float32)
    np.testing.assert_array_equal(ex.run(other, b)[0], np.full(4, 6))
    strided = np.arange(8, dtype=np.float32)[::2]  # non-contiguous: copied
    np.testing.assert_array_equal(ex.run(strided, b)[0], np.arange(0, 8, 2) + 1)
    with pytest.raises(graphc.GraphcError, match="expects f32"):
        ex.run(np.ones(5, np.float32), b)


def test_an_argument_that_becomes_a_grad_holder_fails_the_guard():
    f = graphc.compile(lambda x: x.detach() * 2, backend="interp")
    interior = graphc.ones(3, requires_grad=True) * 1  # requires grad, not a leaf: no .grad
    f(interior)
    f(interior)
    guard = f._entries[-1].guard
    assert guard.holds((graphc.ones(3, requires_grad=True) * 1,), {})
    leaf = graphc.ones(3, requires_grad=True)  # a leaf: its .grad is part of the signature
    assert not guard.holds((leaf,), {})
    f(leaf)
    assert len(f._entries) == 2
    shared = f._entries[-1].guard
    assert shared.holds((graphc.ones(3, requires_grad=True),), {})
