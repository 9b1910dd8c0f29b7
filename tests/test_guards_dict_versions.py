"""The guards' dict version tags (graphc.jit.dict_versions): a guard whose dicts are checked
by their tags must still see every change its key-and-value comparison saw. Each kind of
change a training step's state can go through is made to a fresh model and optimizer, and
the guard built before it must fail, with the tags (CPython 3.11) and without them (the
comparison every other Python uses, forced here by turning the tags off)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.optim as optim
from graphc.jit import dict_versions
from graphc.jit.dict_versions import DictVersions, tagged_dict
from graphc.jit.guards import Guard

TAGS = dict_versions.AVAILABLE
NEEDS_TAGS = pytest.mark.skipif(
    not TAGS, reason=f"dict version tags are read on CPython 3.11 only; this is "
                     f"{sys.implementation.name} {sys.version_info[:2]}")

SETTINGS = {"offset": 0.5}


class _Net(nn.Module):
    factor = 1.5

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4, 2)
        self.scale = 2.0

    def helper(self, x):
        return x * self.factor

    def forward(self, x):
        return self.helper(self.fc2(self.act(self.fc1(x)))) * self.scale


def _setup():
    """A model, its SGD-momentum optimizer (its state made by one eager step), a step that
    reads both, a global dict and a closure, and the step's arguments."""
    graphc.manual_seed(0)

    class Net(_Net):  # a class of its own: a test may change its attributes
        pass

    model = Net()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    shift = [1.0]

    def step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() * shift[0] + SETTINGS["offset"]
        loss.backward()
        opt.step()
        return loss.detach()

    x, y = graphc.ones(5, 3), graphc.zeros(5, 2)
    step(x, y)  # the momentum buffers
    return {"model": model, "opt": opt, "step": step, "shift": shift, "Net": Net,
            "args": (x, y)}


def _set_hook_order(s) -> None:
    hooks = s["model"].fc1._forward_hooks
    hooks.move_to_end(next(iter(hooks)))


def _replace_weight(s) -> None:
    s["model"].fc1.weight = nn.Parameter(graphc.ones(4, 3))


def _replace_momentum(s) -> None:
    p = s["model"].fc1.weight
    s["opt"].state[p]["momentum_buffer"] = graphc.zeros(4, 3)


def _drop_momentum(s) -> None:
    del s["opt"].state[s["model"].fc2.bias]["momentum_buffer"]


def _add_group(s) -> None:
    s["opt"].add_param_group({"params": [nn.Parameter(graphc.ones(2))], "lr": 0.01})


def _drop_grad(s) -> None:
    s["model"].fc1.bias.grad = None  # the eager step left one


def _reshape_in_place(s) -> None:
    s["model"].fc2.bias._array.shape = (2, 1)


def _move_to_the_end(s) -> None:
    """A module attribute that moves to the end of its `__dict__`: the same keys and values
    in another order (the signature reads `vars(module)` in order)."""
    attrs = vars(s["model"])
    attrs["training"] = attrs.pop("training")


def _hooked(s):
    """Two forward hooks on fc1 before the guard is built (for `_set_hook_order`)."""
    s["model"].fc1.register_forward_hook(lambda m, i, o: o * 2)
    s["model"].fc1.register_forward_hook(lambda m, i, o: o + 1)
    return s


MUTATIONS = {
    "a module attribute set": lambda s: setattr(s["model"], "scale", 3.0),
    "a module attribute set to a new equal float": lambda s: setattr(
        s["model"], "scale", float("2.0")),
    "a module attribute added": lambda s: setattr(s["model"], "extra", 1),
    "a module attribute deleted": lambda s: delattr(s["model"], "scale"),
    "a module attribute moved in its dict": _move_to_the_end,
    "eval()": lambda s: s["model"].eval(),
    "a forward hook added": lambda s: s["model"].fc2.register_forward_hook(
        lambda m, i, o: o),
    "a forward pre-hook added": lambda s: s["model"].act.register_forward_pre_hook(
        lambda m, i: None),
    "a backward hook added": lambda s: s["model"].register_full_backward_hook(
        lambda m, gi, go: None),
    "a parameter replaced": _replace_weight,
    "a buffer registered": lambda s: s["model"].fc2.register_buffer("b", graphc.zeros(2)),
    "a submodule replaced": lambda s: setattr(s["model"], "act", nn.Tanh()),
    "a class attribute set": lambda s: setattr(s["Net"], "factor", 4.0),
    "a method replaced": lambda s: setattr(s["Net"], "helper", lambda self, x: x),
    "an optimizer's lr changed": lambda s: s["opt"].param_groups[0].__setitem__("lr", 0.5),
    "an optimizer's momentum changed": lambda s: s["opt"].param_groups[0].__setitem__(
        "momentum", 0.5),
    "a param group added": _add_group,
    "a momentum buffer replaced": _replace_momentum,
    "a momentum buffer deleted": _drop_momentum,
    "requires_grad flipped": lambda s: s["model"].fc1.weight.requires_grad_(False),
    "a .grad dropped": _drop_grad,
    "a parameter's array reshaped in place": _reshape_in_place,
    "a global dict's value set": lambda s: SETTINGS.__setitem__("offset", 0.25),
    "a closure's list changed": lambda s: s["shift"].__setitem__(0, 3.0),
    "the function's attribute set": lambda s: setattr(s["step"], "tag", 1),
}


@pytest.fixture(params=[pytest.param(True, marks=NEEDS_TAGS, id="tags"),
                        pytest.param(False, id="keys-and-values")])
def tags(request, monkeypatch):
    monkeypatch.setattr(dict_versions, "AVAILABLE", request.param)
    yield request.param
    SETTINGS["offset"] = 0.5


def _guard(s) -> Guard:
    guard = Guard(s["step"], s["args"], {})
    assert guard.holds(s["args"], {})
    assert guard.holds(s["args"], {})  # the tags kept by the first
    return guard


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_guard_sees_each_kind_of_change(tags, mutation):
    s = _setup()
    guard = _guard(s)
    assert ("matches()" in guard.source) is tags
    MUTATIONS[mutation](s)
    assert not guard.holds(s["args"], {})
    assert not guard.holds(s["args"], {})  # and keeps failing: no tags kept on a failure


def test_the_guard_sees_the_order_of_hooks_change(tags):
    """A non-empty OrderedDict can be reordered with no change of its tag (`move_to_end`),
    so hook tables with hooks in them are compared key by key."""
    s = _hooked(_setup())
    guard = _guard(s)
    _set_hook_order(s)
    assert not guard.holds(s["args"], {})


def test_a_hook_removed_fails_the_guard(tags):
    s = _setup()
    handle = s["model"].fc1.register_forward_hook(lambda m, i, o: o)
    guard = _guard(s)
    handle.remove()
    assert not guard.holds(s["args"], {})


def test_a_change_before_the_first_check_is_seen(tags):
    """The tags are read at the guard's first check, not when it is built: a change in
    between is caught by the key and value comparison the first check runs."""
    s = _setup()
    guard = Guard(s["step"], s["args"], {})
    s["opt"].param_groups[0]["lr"] = 0.5
    assert not guard.holds(s["args"], {})


@NEEDS_TAGS
def test_a_dict_changed_and_changed_back_is_trusted_again():
    s = _setup()
    guard = _guard(s)
    versions = next(v for v in guard._checks.__globals__.values()
                    if isinstance(v, DictVersions))
    group = s["opt"].param_groups[0]
    lr = group["lr"]
    group["lr"] = 0.5
    group["lr"] = lr
    assert not versions.matches()
    assert guard.holds(s["args"], {})  # the keys and values decide, then the tags are kept
    assert versions.matches()


@pytest.mark.parametrize("backend", ["interp", "cpu"])
def test_a_compiled_step_follows_each_change(tags, backend):
    """End to end: each change retraces (or runs the right entry), and the compiled step's
    loss and weights follow the eager step's."""
    if backend == "cpu":
        pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
    eager, compiled = _setup(), _setup()
    fn = graphc.compile(compiled["step"], backend=backend)
    changes = ["an optimizer's lr changed", "a forward hook added", "a class attribute set",
               "a module attribute set", "requires_grad flipped", "a closure's list changed"]
    for change in [None] + changes:
        if change is not None:
            MUTATIONS[change](eager)
            MUTATIONS[change](compiled)
        for _ in range(2):
            want = eager["step"](*eager["args"])
            got = fn(*compiled["args"])
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        for name, p in eager["model"].named_parameters():
            q = dict(compiled["model"].named_parameters())[name]
            np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert len(fn.graphs) >= 1 + len(changes)


# ---- the tags themselves ---------------------------------------------------------------------
@NEEDS_TAGS
@pytest.mark.parametrize("change", [
    lambda d: d.__setitem__("a", [2]), lambda d: d.__setitem__("new", 1),
    lambda d: d.__delitem__("a"), lambda d: d.pop("b"), lambda d: d.popitem(),
    lambda d: d.clear(), lambda d: d.update(c=3), lambda d: d.setdefault("z", 0),
    lambda d: d.__ior__({"a": 5}),
], ids=["set", "add", "del", "pop", "popitem", "clear", "update", "setdefault", "ior"])
def test_every_change_of_a_dict_changes_its_tag(change):
    d = {"a": [1], "b": 2}
    versions = DictVersions([d, {}])
    assert versions.confirm(lambda: True) and versions.matches()
    change(d)
    assert not versions.matches()


@NEEDS_TAGS
def test_attribute_stores_change_the_instance_dict_tag():
    """Enough stores of one attribute for the interpreter to specialise them
    (STORE_ATTR_WITH_HINT writes the dict's entry itself, and sets a new tag)."""
    model = nn.Linear(2, 2)
    versions = DictVersions([vars(model)])
    for i in range(20):
        versions.confirm(lambda: True)
        model.some_number = i
        assert not versions.matches()


@NEEDS_TAGS
def test_which_containers_a_tag_stands_for():
    from collections import OrderedDict, defaultdict

    assert tagged_dict({}, empty=False) is not None
    assert tagged_dict(defaultdict(list), empty=False) is not None
    assert tagged_dict(OrderedDict(), empty=True) is not None
    assert tagged_dict(OrderedDict(a=1), empty=False) is None  # reorderable: key by key
    assert tagged_dict(vars(_Net), empty=False) is dict_versions.class_dict(vars(_Net))
    assert tagged_dict([1], empty=False) is None


@NEEDS_TAGS
def test_a_confirm_that_fails_keeps_no_tags():
    versions = DictVersions([{"a": 1}])
    assert not versions.matches()  # none kept yet
    assert not versions.confirm(lambda: False)
    assert not versions.matches()


def test_other_pythons_use_the_key_and_value_comparison(monkeypatch):
    """PEP 699 deprecated the tag in 3.12 and 3.13 removed it: only 3.11 reads it."""
    for version in ((3, 10), (3, 12), (3, 13), (3, 14)):
        assert dict_versions._probe(version) is False
    monkeypatch.setattr(dict_versions, "AVAILABLE", False)
    assert tagged_dict({}, empty=True) is None
    with pytest.raises(RuntimeError, match="CPython 3.11"):
        DictVersions([{}])


def _doubled(x):
    return x * 2


@NEEDS_TAGS
def test_a_guard_of_few_dict_items_compares_them_directly():
    """A gather of tags costs about what comparing TAGS_FROM_ITEMS keys does: a guard with
    fewer (a plain function: its empty `__dict__`) compares them as it always did."""
    x = graphc.ones(2)
    guard = Guard(_doubled, (x,), {})
    assert guard.holds((x,), {})
    assert "matches()" not in guard.source and "not any(map(len" in guard.source
    _doubled.note = 1
    try:
        assert not guard.holds((x,), {})
    finally:
        del _doubled.note


@NEEDS_TAGS
def test_the_call_overhead_benchmark_compares_tags_off_and_on():
    """benchmarks/call_overhead.py --tags (a smoke run of its smallest case; no timing is
    judged): both variants are timed, and the tags are as they were afterwards."""
    pytest.importorskip("llvmlite", reason="the benchmark compiles for the cpu backend")
    from benchmarks.call_overhead import ROUNDS, compare_tags

    times = compare_tags("tiny")
    assert sorted(times) == ["call off", "call on", "guard off", "guard on", "in call off",
                             "in call on"]
    assert all(len(v) == ROUNDS and min(v) > 0 for v in times.values())
    assert dict_versions.AVAILABLE
