"""graphc.compile: captured state as bound inputs, guards and retracing, calling conventions."""

from __future__ import annotations

import os

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.ir import parse, verify
from graphc.jit.compiler import Compiled, RecompileLimitError, default_backend


def t(rng, *shape) -> graphc.Tensor:
    return graphc.tensor(rng.standard_normal(shape).astype(np.float32))


def close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a._data), np.asarray(b._data), rtol=1e-5, atol=1e-6,
                               **kw)


@pytest.fixture(autouse=True)
def _inference():
    with graphc.no_grad():
        yield


# ---- module state is bound, not baked ----------------------------------------------------------
def test_parameters_changed_in_place_change_the_compiled_output(rng):
    model = nn.Linear(4, 3)
    cmodel = graphc.compile(model, backend="interp")
    x = t(rng, 2, 4)
    close(cmodel(x), model(x))
    close(cmodel(x), model(x))  # the replay
    model.weight.mul_(2)
    model.bias.fill_(1.5)
    close(cmodel(x), model(x))
    assert len(cmodel.graphs) == 1


def test_load_state_dict_reaches_the_compiled_model(rng):
    model, other = nn.Linear(4, 3), nn.Linear(4, 3)
    cmodel = graphc.compile(model, backend="interp")
    x = t(rng, 5, 4)
    cmodel(x)
    model.load_state_dict(other.state_dict())
    close(cmodel(x), other(x))
    assert len(cmodel.graphs) == 1


def _lenet_bn():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10),
    )


def test_batchnorm_running_stats_update_through_graph_updates(rng):
    import copy

    model = _lenet_bn()
    eager = copy.deepcopy(model)
    cmodel = graphc.compile(model, backend="interp")
    g = None
    for step in range(3):
        x = t(rng, 4, 1, 28, 28)
        graphc.manual_seed(step)
        want = eager(x)
        graphc.manual_seed(step)
        got = cmodel(x)
        close(got, want)
        if g is None:
            g = cmodel.graph
            assert {a.name for a, _ in g.updates} == {
                "1.running_mean", "1.running_var", "1.num_batches_tracked",
                "5.running_mean", "5.running_var", "5.num_batches_tracked"}
        for (name, b), (_, e) in zip(model.named_buffers(), eager.named_buffers()):
            close(b, e, err_msg=f"{name} after step {step}")
    assert model[1].num_batches_tracked.item() == 3
    assert len(cmodel.graphs) == 1


def test_dropout_draws_fresh_masks_matching_eager_step_by_step(rng):
    drop = nn.Dropout(0.5)
    cdrop = graphc.compile(drop, backend="interp")
    x = graphc.ones(64)
    graphc.manual_seed(7)
    eager = [drop(x).numpy().copy() for _ in range(4)]
    graphc.manual_seed(7)
    compiled = [cdrop(x).numpy().copy() for _ in range(4)]
    for e, c in zip(eager, compiled):
        np.testing.assert_array_equal(e, c)
    assert not np.array_equal(compiled[1], compiled[2])
    assert len(cdrop.graphs) == 1


def test_two_random_ops_in_one_graph_follow_the_eager_stream():
    def f(x):
        return nn.functional.dropout(x, 0.5, training=True) * graphc.rand(5) + graphc.randn(5)

    cf = graphc.compile(f, backend="interp")
    x = graphc.ones(5)
    graphc.manual_seed(11)
    want = [f(x).numpy().copy() for _ in range(3)]
    graphc.manual_seed(11)
    got = [cf(x).numpy().copy() for _ in range(3)]
    np.testing.assert_allclose(np.stack(got), np.stack(want), rtol=1e-6)
    verify(parse(str(cf.graph)))


# ---- hooks ------------------------------------------------------------------------------------
def test_forward_hooks_are_recorded_and_adding_or_removing_one_retraces(rng):
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    calls = []

    def add_one(module, args, output):
        calls.append("hook")
        return output + 1

    cmodel = graphc.compile(model, backend="interp")
    x = t(rng, 2, 3)
    close(cmodel(x), model(x))
    handle = model[0].register_forward_hook(add_one)
    want = model(x)
    close(cmodel(x), want)  # retraced: the hook ran during the trace
    close(cmodel(x), want)  # replayed: the hook's op is in the graph
    assert calls == ["hook", "hook"]  # eager call and trace; the replay runs no Python
    assert len(cmodel.graphs) == 2
    assert "add" in [n.op for n in cmodel.graph]
    assert cmodel.recompile_reasons[0][0].startswith("0 hooks: ")
    handle.remove()
    close(cmodel(x), model(x))  # the first executable again: its guards hold once more
    assert len(cmodel.graphs) == 2 and calls == ["hook", "hook"]
    pre = model.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    close(cmodel(x), model(x))
    assert len(cmodel.graphs) == 3
    relu_bias = np.maximum(model[0].bias.detach().numpy(), 0)  # the pre-hook zeroes the input
    np.testing.assert_allclose(cmodel(x).numpy(), np.broadcast_to(relu_bias, (2, 3)))
    pre.remove()


# ---- guards and retracing ---------------------------------------------------------------------
def test_recompile_log_shows_a_field_level_diff(rng, monkeypatch, capsys):
    monkeypatch.setenv("GRAPHC_LOG", "recompiles")
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 26 * 26, 3))
    cmodel = graphc.compile(model, backend="interp")
    cmodel(t(rng, 64, 1, 28, 28))
    assert capsys.readouterr().err == ""
    cmodel(t(rng, 32, 1, 28, 28))
    err = capsys.readouterr().err
    assert "recompiling" in err and "arg 0 shape (64,1,28,28) -> (32,1,28,28)" in err, err
    cmodel(t(rng, 64, 1, 28, 28))  # the first signature's executable is still there
    assert capsys.readouterr().err == ""
    model.eval()
    cmodel(t(rng, 64, 1, 28, 28))
    assert "training: True -> False" in capsys.readouterr().err


def test_no_log_without_the_topic(rng, monkeypatch, capsys):
    monkeypatch.delenv("GRAPHC_LOG", raising=False)
    f = graphc.compile(lambda x: x + 1, backend="interp")
    f(graphc.ones(2))
    f(graphc.ones(3))
    assert capsys.readouterr().err == ""


def test_recompile_limit_error_lists_the_diffs(monkeypatch):
    f = graphc.compile(lambda x: x * 2, recompile_limit=3, backend="interp", dynamic=False)
    for n in (1, 2, 3):
        f(graphc.ones(n))
    with pytest.raises(RecompileLimitError) as info:
        f(graphc.ones(4))
    message = str(info.value)
    assert "over the limit of 3" in message
    assert "recompile 1: arg 0 shape (1) -> (2)" in message
    assert "recompile 3: arg 0 shape (3) -> (4)" in message
    monkeypatch.setenv("GRAPHC_RECOMPILE_LIMIT", "2")
    g = graphc.compile(lambda x: x * 2, backend="interp", dynamic=False)
    g(graphc.ones(1))
    g(graphc.ones(2))
    with pytest.raises(RecompileLimitError):
        g(graphc.ones(3))


def test_train_eval_switch_retraces(rng):
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    cmodel = graphc.compile(model, backend="interp")
    x = t(rng, 8, 4)
    cmodel(x)
    model.eval()
    close(cmodel(x), model(x))
    assert "dropout" not in [n.op for n in cmodel.graph]
    assert not cmodel.graph.updates
    model.train()
    cmodel(x)
    assert len(cmodel.graphs) == 2  # back to the first executable


def test_python_scalars_are_guarded_by_value_and_type():
    f = graphc.compile(lambda x, k: x * k, backend="interp")
    x = graphc.tensor([1, 2])
    assert f(x, 2).tolist() == [2, 4]
    assert f(x, 3).tolist() == [3, 6]
    out = f(x, 3.0)  # a float scalar promotes the int tensor: another graph
    assert out.dtype is graphc.float32 and out.tolist() == [3.0, 6.0]
    assert f(x, 3).dtype is graphc.int64
    assert len(f.graphs) == 3
    assert f.recompile_reasons[0] == ["arg 1: 2 -> 3"]


def test_module_attributes_are_guarded():
    drop = nn.Dropout(0.5)
    cdrop = graphc.compile(drop, backend="interp")
    cdrop(graphc.ones(8))
    drop.p = 0.0
    assert cdrop(graphc.ones(8)).tolist() == [1.0] * 8
    assert any("p: 0.5 -> 0.0" in r for r in cdrop.recompile_reasons[-1])


def test_a_parameter_replaced_by_one_of_another_shape_retraces(rng):
    model = nn.Linear(4, 3)
    cmodel = graphc.compile(model, backend="interp")
    cmodel(t(rng, 2, 4))
    model.weight = nn.Parameter(t(rng, 5, 4))
    model.bias = nn.Parameter(t(rng, 5))
    x = t(rng, 2, 4)
    out = cmodel(x)
    assert tuple(out.shape) == (2, 5)
    close(out, model(x))
    assert "weight shape (3,4) -> (5,4)" in "; ".join(cmodel.recompile_reasons[0])


def test_a_parameter_replaced_by_one_of_the_same_shape_is_bound_anew(rng):
    model = nn.Linear(4, 3)
    cmodel = graphc.compile(model, backend="interp")
    x = t(rng, 2, 4)
    cmodel(x)
    model.weight = nn.Parameter(t(rng, 3, 4))
    close(cmodel(x), model(x))
    assert "weight replaced by another tensor" in cmodel.recompile_reasons[0]


def test_parameter_data_swapped_for_another_shape_is_never_replayed(rng):
    model = nn.Linear(4, 3)
    cmodel = graphc.compile(model, backend="interp")
    x = t(rng, 2, 4)
    cmodel(x)
    model.weight.data = t(rng, 6, 4)
    model.bias.data = t(rng, 6)
    close(cmodel(x), model(x))


def test_a_replaced_closure_tensor_is_never_stale(rng):
    w = t(rng, 3)

    def f(x):
        return x * w

    cf = graphc.compile(f, backend="interp")
    x = t(rng, 3)
    close(cf(x), x * w)
    w = t(rng, 3)  # noqa: F841 (read by f through its closure cell)
    close(cf(x), x * w)
    assert cf.recompile_reasons == [["captured w replaced by another tensor"]]


GLOBAL_W = graphc.ones(3)


def _uses_global(x):
    return x + GLOBAL_W


def test_a_replaced_global_tensor_is_never_stale():
    global GLOBAL_W
    cf = graphc.compile(_uses_global, backend="interp")
    x = graphc.zeros(3)
    assert cf(x).tolist() == [1.0] * 3
    saved, GLOBAL_W = GLOBAL_W, graphc.full((3,), 5.0)
    try:
        assert cf(x).tolist() == [5.0] * 3
    finally:
        GLOBAL_W = saved


def test_a_module_inside_a_plain_object_is_guarded(rng):
    class Trainer:
        def __init__(self):
            self.model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.9))

        def predict(self, x):
            return self.model(x)

    trainer = Trainer()
    predict = graphc.compile(trainer.predict, backend="interp")
    x = t(rng, 4, 3)
    predict(x)
    trainer.model.eval()
    close(predict(x), trainer.model(x))


def test_the_same_tensor_twice_then_two_tensors_retraces(rng):
    f = graphc.compile(lambda a, b: a - b, backend="interp")
    x, y = t(rng, 3), t(rng, 3)
    assert f(x, x).tolist() == [0.0] * 3
    close(f(x, y), x - y)
    assert f(y, y).tolist() == [0.0] * 3
    assert len(f.graphs) == 2


def test_a_parameter_passed_as_an_argument_is_not_confused_with_the_capture(rng):
    model = nn.Linear(3, 3, bias=False)

    def f(w):
        return model(w)

    cf = graphc.compile(f, backend="interp")
    close(cf(model.weight), model(model.weight))
    x = t(rng, 3, 3)
    close(cf(x), model(x))


def test_outputs_that_require_grad_carry_a_compiled_grad_fn(rng):
    with graphc.enable_grad():
        w = graphc.ones(2, requires_grad=True)
        compiled = graphc.compile(lambda x: x * w, backend="interp")
        for _ in range(3):  # traces (again once w.grad exists: it is guarded), then replays
            out = compiled(graphc.tensor([2.0, 3.0]))
            assert out.requires_grad and out.grad_fn is not None
            out.sum().backward()
        assert w.grad.tolist() == [6.0, 9.0]  # accumulated over the three calls
        assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"


# ---- calling conventions ---------------------------------------------------------------------
def test_decorator_forms():
    @graphc.compile(backend="interp")
    def f(x):
        return x + 1

    @graphc.compile(backend="interp")
    def g(x):
        return x * 3

    assert isinstance(f, Compiled) and isinstance(g, Compiled)
    assert f(graphc.ones(2)).tolist() == [2.0, 2.0]
    assert g(graphc.ones(2)).tolist() == [3.0, 3.0]
    assert f.__name__ == "f" and g.graph.name == "g"
    with pytest.raises(ValueError, match="unknown backend"):
        graphc.compile(lambda x: x, backend="nope")


def test_decorated_method_binds_self(rng):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        @graphc.compile(backend="interp")
        def forward(self, x):
            return self.fc(x).relu()

    model = Model()
    x = t(rng, 4, 3)
    first = model(x)
    close(model(x), first)
    model.fc.weight.mul_(-1)
    close(model(x), model.fc(x).relu())


def test_nested_tuple_and_dict_outputs(rng):
    @graphc.compile(backend="interp")
    def f(x):
        return {"a": (x + 1, [x * 2, 3]), "b": x.sum(), "c": "label"}

    x = t(rng, 3)
    f(x)
    out = f(x)
    assert set(out) == {"a", "b", "c"} and out["c"] == "label"
    assert isinstance(out["a"], tuple) and isinstance(out["a"][1], list)
    assert out["a"][1][1] == 3
    close(out["a"][0], x + 1)
    close(out["a"][1][0], x * 2)
    close(out["b"], x.sum())


def test_kwargs_and_the_same_output_twice(rng):
    @graphc.compile(backend="interp")
    def f(x, *, shift, scale=1.0):
        y = x * scale + shift
        return y, y

    x, s = t(rng, 3), t(rng, 3)
    f(x, shift=s, scale=2.0)
    a, b = f(x, shift=s, scale=2.0)
    assert a is b
    close(a, x * 2.0 + s)
    close(f(x, scale=2.0, shift=x)[0], x * 3.0)  # keyword order does not matter


def test_outputs_that_are_inputs_come_back_as_those_tensors(rng):
    model = nn.Linear(2, 2)

    @graphc.compile(backend="interp")
    def f(x, y):
        x.add_(1)
        return x, y, y * 2, model.weight

    for _ in range(2):
        x, y = t(rng, 2), t(rng, 2)
        x0 = x.numpy().copy()
        a, b, c, w = f(x, y)
        assert a is x and b is y and w is model.weight
        np.testing.assert_allclose(x.numpy(), x0 + 1)
        close(c, y * 2)


def test_constants_are_not_corrupted_by_changes_to_outputs():
    @graphc.compile(backend="interp")
    def f(x):
        return graphc.tensor([1.0, 2.0]).reshape(2, 1), x

    for _ in range(3):
        c, _ = f(graphc.ones(1))
        assert c.tolist() == [[1.0], [2.0]]
        c.mul_(10)


def test_python_control_flow_on_shapes(rng):
    @graphc.compile(backend="interp")
    def f(x):
        if x.shape[0] > 2:
            return x[:2].sum(0)
        return x.sum(0) * 10

    x = t(rng, 4, 3)
    close(f(x), x[:2].sum(0))
    close(f(x), x[:2].sum(0))
    x = t(rng, 2, 3)
    close(f(x), x.sum(0) * 10)
    assert len(f.graphs) == 2


def test_compiled_callable_inside_a_trace_is_inlined():
    inner = graphc.compile(lambda x: x.exp(), backend="interp")
    g = graphc.trace(lambda x: inner(x) + 1, graphc.ones(2))
    assert [n.op for n in g][0] == "exp" and not inner.graphs


def test_graph_dump_writes_one_file_per_traced_graph_and_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_DUMP", str(tmp_path))

    @graphc.compile(backend="interp")
    def dumped(x):
        return x.tanh()

    dumped(graphc.ones(2))
    dumped(graphc.ones(2))
    dumped(graphc.ones(3))
    files = sorted(os.listdir(tmp_path))
    stages = ["0.traced", "1.simplify", "2.fuse", "3.plan_buffers"]
    assert files == [f"dumped.{n}.{stage}.gir" for n in (1, 2) for stage in stages], files
    traced = [parse((tmp_path / f).read_text()) for f in files if "traced" in f]
    assert traced == dumped.graphs
    last = parse((tmp_path / "dumped.2.3.plan_buffers.gir").read_text())
    assert last == dumped.optimized_graph


def test_a_generator_made_inside_the_function_is_made_afresh_on_every_run():
    def f(x):
        return graphc.dropout(x, 0.5, True, generator=graphc.Generator().manual_seed(5))

    cf = graphc.compile(f, backend="interp")
    x = graphc.ones(32)
    want = f(x).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(cf(x).numpy(), want)


def test_a_generator_passed_in_advances_as_in_eager():
    def f(x, gen):
        return x * graphc.rand(8, generator=gen)

    cf = graphc.compile(f, backend="interp")
    gen, ref = graphc.Generator().manual_seed(1), graphc.Generator().manual_seed(1)
    x = graphc.ones(8)
    for _ in range(3):
        np.testing.assert_array_equal(cf(x, gen).numpy(), f(x, ref).numpy())
    assert gen.offset == ref.offset == 6


SCALE = 2.0


def _scaled(x):
    return x * SCALE


def test_python_values_the_function_reads_are_guarded():
    global SCALE
    cf = graphc.compile(_scaled, backend="interp")
    assert cf(graphc.ones(2)).tolist() == [2.0, 2.0]
    SCALE = 3.0
    try:
        assert cf(graphc.ones(2)).tolist() == [3.0, 3.0]
        assert cf.recompile_reasons == [["captured SCALE: 2.0 -> 3.0"]]
    finally:
        SCALE = 2.0


def test_plain_tensor_attributes_of_modules_are_guarded():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.mask = graphc.ones(3)

        def forward(self, x):
            return x * self.mask

    m = Masked()
    cm = graphc.compile(m, backend="interp")
    assert cm(graphc.ones(3)).tolist() == [1.0] * 3
    m.mask = graphc.zeros(3)
    assert cm(graphc.ones(3)).tolist() == [0.0] * 3


def test_numpy_scalar_arguments_are_guarded_by_value():
    cf = graphc.compile(lambda x, k: x * float(k), backend="interp")
    for _ in range(3):
        assert cf(graphc.ones(1), np.float32(2.0)).tolist() == [2.0]
    assert cf(graphc.ones(1), np.float32(4.0)).tolist() == [4.0]
    assert len(cf.graphs) == 2


def test_inplace_ops_under_grad_mode_replay_with_new_values():
    with graphc.enable_grad():
        @graphc.compile(backend="interp")
        def f(x):
            y = x * 2
            y.add_(1)
            return y

        assert f(graphc.ones(2)).tolist() == [3.0, 3.0]
        assert f(graphc.tensor([0.0, 5.0])).tolist() == [1.0, 11.0]


# ---- the default backend -----------------------------------------------------------------------
def test_the_default_backend_is_the_native_one(rng):
    """As torch.compile: no backend named compiles natively ("cuda" with a usable GPU, else
    "cpu"); the tests above name "interp", since they are about tracing and guards."""
    f = graphc.compile(lambda x: (x * 2).relu())
    assert f.backend == default_backend() in ("cpu", "cuda")
    x = t(rng, 3, 4)
    close(f(x), (x * 2).relu())
    assert graphc.compile(lambda x: x, backend="interp").backend == "interp"


def test_an_emulated_gpu_is_not_a_default(monkeypatch):
    monkeypatch.setenv("GRAPHC_CUDA", "emu")
    default_backend.cache_clear()
    try:
        assert default_backend() == "cpu"
    finally:
        default_backend.cache_clear()


def test_torch_compile_keywords_are_accepted_or_refused_clearly():
    """A torch.compile call runs unchanged: fullgraph, mode and disable are understood;
    dynamic=True traces symbolic sizes (tests/test_dynamic_shapes.py); backend options and an
    unknown `dynamic` are refused with what to do."""
    f = graphc.compile(lambda x: x * 2, backend="interp", fullgraph=True, mode="max-autotune",
                       dynamic=False)
    assert f(graphc.ones(2)).tolist() == [2.0, 2.0]

    def g(x):
        return x

    assert graphc.compile(g, disable=True) is g
    assert graphc.compile(g, dynamic=True).dynamic is True
    with pytest.raises(graphc.errors.ArgumentError, match="expected None"):
        graphc.compile(g, dynamic="yes")
    with pytest.raises(graphc.errors.ArgumentError, match="unknown mode 'fastest'"):
        graphc.compile(g, mode="fastest")
