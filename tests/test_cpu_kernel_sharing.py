"""The CPU code generator builds each distinct kernel once (graphc.backends.cpu.kernels,
KernelBuilder recipes): a module built with sharing computes what the module built without
it computes, bit for bit, on real training steps; kernels that differ in anything their code
depends on (strides, aliasing, constants, errors) are not shared."""

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import kernels  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.backends.cpu.kernels import Codegen, KernelBuilder  # noqa: E402
from graphc.backends.cpu.values import Loc, contiguous  # noqa: E402
from graphc.errors import IndexOutOfRangeError  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.types import TensorType, float32  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


# ---- whole training steps: shared and unshared modules agree bit for bit -----------------
def _lstm():
    from benchmarks.model_steps import training_step

    step, arrays = training_step("lstm", dict(vocab=20, embed=8, hidden=16, layers=2, seq=5,
                                              batch=3))
    return step, tuple(graphc.tensor(a) for a in arrays)


def _vision(name):
    from benchmarks import model_steps, models

    if name == "lenet5":
        model = models.graphc_model("lenet5")
        x, y = models.batch("lenet5", 4)
    else:
        shape = model_steps.QUICK[name]
        model = model_steps.build(graphc, name, shape)
        x, y = model_steps.batch_of(name, shape)
    return models.graphc_step(model), (graphc.tensor(x), graphc.tensor(y))


def _recorded_calls(monkeypatch, step, args):
    """(graph, input arrays) of every native call one compiled call of `step` makes."""
    calls = []
    run = CpuExecutable.run

    def recording(self, *arrays):
        calls.append((self.graph, [np.array(a, copy=True) for a in arrays]))
        return run(self, *arrays)

    monkeypatch.setattr(CpuExecutable, "run", recording)
    graphc.compile(step, backend="cpu")(*args)
    monkeypatch.setattr(CpuExecutable, "run", run)
    return calls


@pytest.mark.parametrize("name,shares", [("lstm", True), ("resnet18", True), ("gpt", True),
                                         ("lenet5", False)])  # LeNet-5 repeats no kernel
def test_a_step_built_with_shared_kernels_agrees_bit_for_bit(monkeypatch, name, shares):
    graphc.manual_seed(0)
    step, args = _lstm() if name == "lstm" else _vision(name)
    calls = _recorded_calls(monkeypatch, step, args)
    assert calls
    for graph, arrays in calls:
        shared = CpuExecutable(graph)
        monkeypatch.setattr(kernels, "SHARE_KERNELS", False)
        unshared = CpuExecutable(graph)
        monkeypatch.setattr(kernels, "SHARE_KERNELS", True)
        names = shared.lowered.kernels
        assert len(names) == len(unshared.lowered.kernels)
        assert (len(set(names)) < len(names)) == shares
        assert len(set(unshared.lowered.kernels)) == len(names)
        ours = shared.run(*[a.copy() for a in arrays])
        theirs = unshared.run(*[a.copy() for a in arrays])
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()


# ---- graphs: near misses are not shared ---------------------------------------------------
def _names_by_node(ex: CpuExecutable) -> dict[str, str]:
    return {node.outputs[0].name: name
            for name, node in zip(ex.lowered.kernels, ex.lowered.kernel_nodes) if node}


def test_the_same_body_at_other_strides_or_aliasing_is_another_kernel():
    g = parse('''graph @f(%x: f32[8,8], %y: f32[8,8]) -> (f32[8,8], f32[8,8], f32[8,8], f32[8,8]) {
      %t: f32[8,8] = permute[dims=(1, 0)](%x)
      %a: f32[8,8] = add(%x, %y)
      %b: f32[8,8] = add(%t, %y)
      %c: f32[8,8] = add(%x, %x)
      %d: f32[8,8] = add(%y, %x)
      return (%a, %b, %c, %d)
    }''')
    ex = CpuExecutable(g)
    names = _names_by_node(ex)
    assert len({names["a"], names["b"], names["c"]}) == 3
    assert names["d"] == names["a"]  # the same code over other pointers
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    a, b, c, d = ex.run(x, y)
    np.testing.assert_array_equal(a, x + y)
    np.testing.assert_array_equal(b, x.T + y)
    np.testing.assert_array_equal(c, x + x)
    np.testing.assert_array_equal(d, y + x)


def test_constants_that_compare_equal_in_python_are_not_one_kernel():
    g = parse('''graph @f() -> (f32[4], f32[4], f32[4], f32[4]) {
      %a: f32[4] = full[shape=(4,), value=0.0, dtype="float32"]()
      %b: f32[4] = full[shape=(4,), value=-0.0, dtype="float32"]()
      %c: f32[4] = full[shape=(4,), value=1.0, dtype="float32"]()
      %d: f32[4] = full[shape=(4,), value=1.0, dtype="float32"]()
      return (%a, %b, %c, %d)
    }''')
    ex = CpuExecutable(g)
    names = _names_by_node(ex)
    assert names["a"] != names["b"] and names["c"] == names["d"]
    a, b, _, _ = ex.run()
    assert not np.signbit(a).any() and np.signbit(b).all()


def test_an_index_error_names_its_own_node_after_the_same_kernel_ran_before():
    g = parse('''graph @f(%x: f32[5], %i: i64[3], %j: i64[3]) -> (f32[3], f32[3]) {
      %a: f32[3] = take[axis=0](%x, %i)
      %b: f32[3] = take[axis=0](%x, %j)
      return (%a, %b)
    }''')
    ex = CpuExecutable(g)
    x = np.arange(5, dtype=np.float32)
    ok = np.array([0, 1, 2])
    with pytest.raises(IndexOutOfRangeError) as first:
        ex.run(x, np.array([0, 9, 1]), ok)
    with pytest.raises(IndexOutOfRangeError) as second:
        ex.run(x, ok, np.array([0, 9, 1]))
    assert str(first.value) != str(second.value)
    assert "%a" in str(first.value) and "%b" in str(second.value)


# ---- the key itself -------------------------------------------------------------------------
T = TensorType((4, 4), float32)


def _begin(cg, locs, recipe=("copy",), status=False, strides=None):
    kb = KernelBuilder(cg, cg.name("k"), (4, 4), recipe)
    kb.kernel.status = status
    for k, loc in enumerate(locs):
        kb.operand(loc, strides if k == 0 else None)
    b = kb.begin()
    if b is not None:
        kb.finish(b)
    return kb.kernel.name, b is None


def test_the_key_holds_aliasing_strides_status_and_the_recipe():
    cg = Codegen("t", None)
    x, y = contiguous("arena", 0, 0, T), contiguous("arena", 0, 64, T)
    first, _ = _begin(cg, [x, y])
    # other offsets of the same buffer and other buffers: other pointers, the same function
    assert _begin(cg, [contiguous("arena", 0, 128, T), contiguous("input", 1, 0, T)]) == \
        (first, True)
    assert _begin(cg, [x, x])[1] is False  # in place: one pointer argument, not two
    # two pointer arguments both times, but the third operand reads the other one
    z = contiguous("output", 0, 0, T)
    assert _begin(cg, [x, y, x])[1] is False
    assert _begin(cg, [x, y, y])[1] is False
    assert _begin(cg, [z, x, z])[1] is True
    assert _begin(cg, [x, y], strides=(1, 4))[1] is False  # transposed read
    assert _begin(cg, [x, y], strides=(0, 1))[1] is False  # broadcast read
    assert _begin(cg, [Loc("arena", 0, 0, (32, 4), T), y])[1] is False  # rows 8 apart
    assert _begin(cg, [x, y], recipe=("fill", 1.0))[1] is False
    assert _begin(cg, [x, y], recipe=("fill", 1))[1] is False  # 1 == 1.0, other code
    assert _begin(cg, [x, y], recipe=("fill", True))[1] is False
    assert _begin(cg, [x, y], status=True)[1] is False  # errors name their node
    assert _begin(cg, [x, y], status=True)[1] is False
    assert _begin(cg, [x, y], recipe=None)[1] is False
    assert _begin(cg, [x, y], recipe=("copy", object()))[1] is False  # no exact key
