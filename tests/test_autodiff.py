"""derive_backward and rematerialize (graphc.passes.autodiff): IR in, IR out, checked against
eager autograd, finite differences on the interpreter, and the verifier."""

from __future__ import annotations

import os

import numpy as np
import pytest

import graphc
import graphc.nn.functional as F
from graphc import nn
from graphc.autograd import Function, grad, gradgradcheck
from graphc.ir import VerifyError, format_graph, parse, run
from graphc.jit.bindings import ArgBinding, TensorBinding
from graphc.jit.tracer import trace_call
from graphc.passes import run_pipeline
from graphc.passes.autodiff import AutodiffError, derive_backward, peak_bytes, rematerialize

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "autodiff")


def fixture(name: str):
    with open(os.path.join(FIXTURES, name)) as f:
        return parse(f.read())


def arrays_for(graph, rng, scale=1.0):
    return [(scale * rng.standard_normal(v.type.shape)).astype(v.type.dtype.np)
            if v.type.dtype.is_floating else np.zeros(v.type.shape, v.type.dtype.np)
            for v in graph.inputs]


def numeric_grad(graph, arrays, wrt_index, seed, eps=1e-6):
    """Central differences of sum(seed * output 0) by input `wrt_index`, on the interpreter."""
    x = arrays[wrt_index]
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        values = []
        for step in (eps, -eps):
            args = list(arrays)
            args[wrt_index] = x.copy()
            args[wrt_index][i] += step
            values.append(float(np.sum(seed * run(graph, *args)[0])))
        out[i] = (values[0] - values[1]) / (2 * eps)
    return out


# ---- models: traced, derived, run on the interpreter, compared with eager autograd ----------
def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                         nn.ReLU(), nn.Linear(256, 10))


def lenet_batchnorm():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2, bias=False), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120, bias=False), nn.BatchNorm1d(120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def joint_graph(model, batch: int, rng, dtype="float32"):
    """Trace cross_entropy(model(x), y), derive it; return the graph, its inputs as arrays
    (state as it was before the trace: BatchNorm's running stats move while tracing), the
    eager loss, gradients by wrt name, and the eager running stats afterwards."""
    model = model.to(getattr(graphc, dtype))
    state = {id(t): t.detach().numpy().copy()
             for t in list(model.parameters()) + list(model.buffers())}
    x = graphc.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(dtype))
    y = graphc.tensor(rng.integers(0, 10, batch))

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    traced = trace_call(loss_fn, (x, y))
    joint = derive_backward(traced.graph)
    args = []
    for b in traced.bindings:
        assert isinstance(b, (ArgBinding, TensorBinding))
        args.append(state[id(b.tensor)] if isinstance(b, TensorBinding) else
                    (x, y)[b.path[1]].numpy())
    with graphc.no_grad():  # eager reference from the same state
        for t in list(model.parameters()) + list(model.buffers()):
            t.copy_(graphc.tensor(state[id(t)]))
    x.requires_grad_(True)
    loss = loss_fn(x, y)
    wanted = {v.name: b.tensor if isinstance(b, TensorBinding) else x
              for v, b in zip(traced.graph.inputs, traced.bindings)}
    names = [n for n in joint.meta["autodiff"]["wrt"] if wanted[n].requires_grad]
    eager = dict(zip(names, grad(loss, [wanted[n] for n in names])))
    for n in joint.meta["autodiff"]["wrt"]:  # running stats: float inputs, not differentiable
        eager.setdefault(n, graphc.zeros(*wanted[n].shape, dtype=wanted[n].dtype))
    after = {v.name: b.tensor.detach().numpy().copy()
             for v, b in zip(traced.graph.inputs, traced.bindings)
             if isinstance(b, TensorBinding)}
    return joint, args + [np.ones((), dtype)], loss, eager, after


def check_against_eager(joint, args, loss, eager, rtol, atol):
    results = run(joint, *args)
    n_out = joint.meta["autodiff"]["forward_outputs"]
    np.testing.assert_allclose(results[0], loss.detach().numpy(), rtol=rtol, atol=atol)
    names = joint.meta["autodiff"]["wrt"]
    for name, got in zip(names, results[n_out:n_out + len(names)]):
        np.testing.assert_allclose(got, eager[name].numpy(), rtol=rtol, atol=atol, err_msg=name)
    return results


@pytest.mark.parametrize("dtype, rtol, atol", [("float32", 1e-5, 1e-6),
                                               ("float64", 1e-12, 1e-13)])
def test_mlp_gradients_match_eager(dtype, rtol, atol, rng):
    joint, args, loss, eager, _ = joint_graph(mlp(), 16, rng, dtype)
    assert joint.meta["autodiff"]["wrt"][0] == "x" and len(joint.meta["autodiff"]["wrt"]) == 7
    check_against_eager(joint, args, loss, eager, rtol, atol)


@pytest.mark.parametrize("dtype, rtol, atol", [("float32", 1e-5, 1e-6),
                                               ("float64", 1e-11, 1e-12)])
def test_lenet_batchnorm_train_gradients_and_running_stats(dtype, rtol, atol, rng):
    joint, args, loss, eager, after = joint_graph(lenet_batchnorm(), 8, rng, dtype)
    assert [t.name for t, _ in joint.updates] == [
        f"model.{i}.{s}" for i in (1, 5, 10)
        for s in ("num_batches_tracked", "running_mean", "running_var")]
    results = check_against_eager(joint, args, loss, eager, rtol, atol)
    updated = results[len(joint.outputs):]
    for (target, _), got in zip(joint.updates, updated):  # both runs moved the stats once
        np.testing.assert_allclose(got, after[target.name], rtol=rtol, atol=atol)


def test_backward_nodes_point_at_the_forward_line():
    g = derive_backward(fixture("softmax_xent.gir"))
    text = format_graph(g)
    assert "# model.py:4 (backward)" in text  # the softmax's VJP
    backward = g.nodes[len(fixture("softmax_xent.gir").nodes):]
    assert all(n.loc.endswith("(backward)") for n in backward)
    assert parse(text) == g  # the result round-trips through the text form


def test_softmax_cross_entropy_matches_finite_differences(rng):
    forward = fixture("softmax_xent.gir")
    g = derive_backward(forward)
    args = arrays_for(forward, rng)
    results = run(g, *args, np.ones(()))
    for k in range(len(forward.inputs)):
        np.testing.assert_allclose(results[1 + k], numeric_grad(forward, args, k, 1.0),
                                   rtol=1e-6, atol=1e-8, err_msg=forward.inputs[k].name)


# ---- what the pass produces: fan-out, wrt subsets, unused inputs, seeds ----------------------


def test_fan_out_accumulates_ir_text(rng):
    g = derive_backward(fixture("fanout.gir"))
    with open(os.path.join(FIXTURES, "fanout.expected.gir")) as f:
        assert format_graph(g) == f.read().strip()
    x, y, seed = rng.standard_normal((3, 3))
    _, gx, gy = run(g, x, y, seed)
    np.testing.assert_allclose(gx, seed * y * (2 * x + np.exp(x)), rtol=1e-14)
    np.testing.assert_allclose(gy, seed * (x * x + np.exp(x)), rtol=1e-14)


def test_wrt_subset_derives_only_what_it_needs(rng):
    forward = fixture("softmax_xent.gir")
    full = derive_backward(forward)
    only_w = derive_backward(forward, wrt=["w"])
    assert [v.name for v in only_w.inputs] == ["x", "w", "b", "onehot", "grad_6"]
    assert len(only_w.outputs) == 2 and len(only_w.nodes) < len(full.nodes)
    assert not any(n.op == "matmul" and n.inputs[1].type.shape == (3, 5)
                   for n in only_w.nodes)  # no gradient of x is computed
    args = arrays_for(forward, rng) + [np.ones(())]
    np.testing.assert_array_equal(run(only_w, *args)[1], run(full, *args)[2])
    assert derive_backward(forward, wrt=[1]).meta["autodiff"]["wrt"] == ["w"]


def test_unused_input_gets_a_zero_gradient_and_int_outputs_no_seed():
    g = derive_backward(parse("""graph @f(%x: f32[2,3], %u: f32[4]) -> (f32[2], i64[2]) {
      %0: f32[2] = reduce_sum[axes=(1,), keepdim=false](%x)   # model.py:1
      %1: i64[2] = argmax[axis=1, keepdim=false](%x)          # model.py:2
      return (%0, %1)
    }"""))
    assert [v.name for v in g.inputs] == ["x", "u", "grad_0"]  # no seed for the int output
    zero = g.nodes[-1]
    assert zero.op == "full" and "no output depends on %u" in zero.loc
    _, _, gx, gu = run(g, np.ones((2, 3), np.float32), np.ones(4, np.float32),
                       np.array([2.0, 3.0], np.float32))
    np.testing.assert_array_equal(gx, [[2, 2, 2], [3, 3, 3]])
    np.testing.assert_array_equal(gu, np.zeros(4))


def test_seeds_ones_differentiates_the_sum_of_the_outputs(rng):
    forward = fixture("fanout.gir")
    g = derive_backward(forward, seeds="ones")
    assert [v.name for v in g.inputs] == ["x", "y"]
    x, y = rng.standard_normal((2, 3))
    np.testing.assert_allclose(run(g, x, y)[1], y * (2 * x + np.exp(x)), rtol=1e-14)


def test_bad_wrt_and_seeds_are_refused():
    forward = fixture("fanout.gir")
    with pytest.raises(AutodiffError, match="wrt 'z' is not an input"):
        derive_backward(forward, wrt=["z"])
    with pytest.raises(AutodiffError, match="only floating inputs"):
        derive_backward(parse("""graph @f(%i: i64[2]) -> (i64[2]) {
          %0: i64[2] = neg(%i)
          return (%0)
        }"""), wrt=["i"])
    with pytest.raises(AutodiffError, match="seeds must be"):
        derive_backward(forward, seeds="zeros")


# ---- grad of grad ------------------------------------------------------------------------------
PENALTY = """graph @penalty(%x: f64[3,4], %w: f64[4,2]) -> (f64[]) {
  %0: f64[3,2] = matmul(%x, %w)                           # model.py:1
  %1: f64[3,2] = tanh(%0)                                 # model.py:2
  %2: f64[3,2] = mul(%1, %1)                              # model.py:3
  %3: f64[] = reduce_sum[axes=(0, 1), keepdim=false](%2)  # model.py:4
  return (%3)
}"""


def eager_loss(x, w):
    return (graphc.matmul(x, w).tanh() ** 2).sum()


def test_grad_of_grad_gradient_penalty_matches_eager_double_backward(rng):
    x0, w0 = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    first = derive_backward(parse(PENALTY), wrt=["x"])  # (x, w, grad_3) -> (loss, dx)
    second = derive_backward(first, wrt=["w"])  # seeds: grad_3' for loss, grad_<dx> for dx
    assert [v.name for v in second.inputs][:3] == ["x", "w", "grad_3"]
    assert any(n.loc.endswith("(backward) (backward)") for n in second.nodes)
    _, dx = run(first, x0, w0, np.ones(()))
    # the gradient penalty sum(dx ** 2): its cotangent for dx is 2 dx, none for the loss
    results = run(second, x0, w0, np.ones(()), np.zeros(()), 2 * dx)
    x = graphc.tensor(x0, requires_grad=True)
    w = graphc.tensor(w0, requires_grad=True)
    (gx,) = grad(eager_loss(x, w), x, create_graph=True)
    (gw,) = grad((gx ** 2).sum(), w)
    np.testing.assert_allclose(results[1], gx.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(results[2], gw.numpy(), rtol=1e-12, atol=1e-14)
    assert gradgradcheck(eager_loss, (x, w))  # the eager reference is itself right


def test_second_derivative_graph_matches_finite_differences(rng):
    """gradgradcheck on the IR: the derived second-derivative graph against central
    differences of the derived first-derivative graph, both run by the interpreter."""
    first = derive_backward(parse(PENALTY), wrt=["x"])
    second = derive_backward(first, wrt=["w"], seeds="inputs")
    x0, w0 = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    v = rng.standard_normal((3, 4))
    got = run(second, x0, w0, np.ones(()), np.zeros(()), v)[2]

    def dx_only(*args):
        return run(first, *args)[1:]

    expected = np.zeros_like(w0)
    for i in np.ndindex(w0.shape):
        plus, minus = w0.copy(), w0.copy()
        plus[i] += 1e-6
        minus[i] -= 1e-6
        expected[i] = np.sum(v * (dx_only(x0, plus, np.ones(()))[0]
                                  - dx_only(x0, minus, np.ones(()))[0])) / 2e-6
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)


# ---- custom autograd.Function: only its forward ops are in the IR ------------------------------
class Cube(Function):
    """x ** 3 with an exact hand-written backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


class StraightThroughSign(Function):
    """sign(x) forward, identity backward: deliberately not the derivative of its forward."""

    @staticmethod
    def forward(ctx, x):
        return x.sign()

    @staticmethod
    def backward(ctx, g):
        return g


def test_custom_function_backwards_are_honoured(rng):
    x0 = rng.standard_normal(5)

    def f(x):
        return Cube.apply(x).sum() + StraightThroughSign.apply(x).sum()

    g = derive_backward(trace_call(f, (graphc.tensor(x0),)).graph)
    gx = run(g, x0, np.ones(()))[1]
    x = graphc.tensor(x0, requires_grad=True)
    (eager,) = grad(f(x), x)
    # derive_backward runs each Function's own backward (recorded as a `function` region):
    # the straight-through sign adds the identity's 1, exactly as eager autograd does.
    np.testing.assert_allclose(gx, 3 * x0 ** 2 + 1, rtol=1e-14)
    np.testing.assert_allclose(eager.numpy(), gx, rtol=1e-14)


# ---- rematerialisation -------------------------------------------------------------------------
def test_rematerialize_recomputes_the_sigmoid_and_lowers_the_peak(rng):
    joint = derive_backward(fixture("remat.gir"))
    out = rematerialize(joint)
    note = out.meta["remat"]
    assert note["peak_after"] < note["peak_before"] == peak_bytes(joint)
    assert note["peak_after"] == peak_bytes(out) and note["recomputed"] == 1
    (again,) = [n for n in out.nodes if n.loc == "model.py:2 (recomputed)"]
    assert again.op == "sigmoid" and again.inputs[0].name == "x"
    args = arrays_for(joint, rng)
    for a, b in zip(run(joint, *args), run(out, *args)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("model, batch", [(mlp, 64), (lenet_batchnorm, 16)])
def test_rematerialize_joint_graph_identical_results_and_no_higher_peak(model, batch, rng):
    joint, args, _, _, _ = joint_graph(model(), batch, rng)
    out, report = run_pipeline(joint, [rematerialize])
    note = out.meta["remat"]
    assert note["peak_after"] <= note["peak_before"]
    if model is mlp:  # measured: 2146348 -> 2080812 bytes (the input reshape is recomputed)
        assert note["peak_after"] < note["peak_before"]
    for a, b in zip(run(joint, *args), run(out, *args)):
        np.testing.assert_array_equal(a, b)


# ---- the verifier guards the pass ----------------------------------------------------------
def use_before_def():
    """exp's result read by the node before it (the parser refuses such text: reorder)."""
    g = parse("""graph @use_before_def(%x: f32[4]) -> (f32[4]) {
      %1: f32[4] = exp(%x)                                   # model.py:10
      %0: f32[4] = mul(%x, %1)                               # model.py:9
      return (%0)
    }""")
    g.nodes.reverse()
    return g


@pytest.mark.parametrize("make, message", [
    (lambda: fixture("bad_types.gir"),
     r"matmul at model.py:7: output types \['f32\[4,3\]'\] differ"),
    (use_before_def, r"mul at model.py:9: %1 is used before it is defined"),
    (lambda: fixture("update_twice.gir"), r"update %m <- %2: %m is updated twice"),
], ids=["type_mismatch", "use_before_def", "alias_conflict"])
def test_bad_ir_is_rejected_with_the_node_and_line(make, message):
    with pytest.raises(VerifyError, match=message):
        run_pipeline(make(), [derive_backward])
    with pytest.raises(VerifyError, match=message):  # called directly, it verifies too
        derive_backward(make())


def test_op_without_vjp_on_the_path_is_refused():
    g = parse("""graph @f(%x: f32[3], %y: f32[3]) -> (f32[3]) {
      %0: f32[3] = floor_divide(%x, %y)                    # model.py:4
      return (%0)
    }""")
    with pytest.raises(AutodiffError, match="floor_divide at model.py:4: floor_divide has no VJP"):
        derive_backward(g)
    assert len(derive_backward(g, wrt=[]).outputs) == 1  # nothing to differentiate: fine


def test_pipeline_derive_then_rematerialize_records_both():
    g, report = run_pipeline(fixture("remat.gir"), [derive_backward, rematerialize])
    assert [r.name for r in report.records] == ["derive_backward", "rematerialize"]
    assert g.meta["autodiff"]["wrt"] == ["x", "w1", "w2"]


def test_no_kernel_runs_so_huge_types_cost_nothing(monkeypatch):
    """derive_backward works on types: 2**40-element operands would not fit in memory."""
    from graphc.ops.registry import REGISTRY

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel ran")

    monkeypatch.setattr(type(REGISTRY["matmul"]), "kernel", property(lambda self: no_kernel),
                        raising=False)
    g = derive_backward(parse("""graph @f(%x: f32[1048576,1048576], %w: f32[1048576,8]) -> (f32[]) {
      %0: f32[1048576,8] = matmul(%x, %w)                 # model.py:2
      %1: f32[1048576,8] = tanh(%0)                        # model.py:3
      %2: f32[] = reduce_sum[axes=(0, 1), keepdim=false](%1)  # model.py:4
      return (%2)
    }"""), wrt=["w"])
    assert [str(v.type) for v in g.outputs] == ["f32[]", "f32[1048576,8]"]
