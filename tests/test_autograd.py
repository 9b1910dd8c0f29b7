"""The autograd engine against PyTorch: backward and autograd.grad with their options and
errors, fan-in, multiple roots, hooks and their order, retain_grad, create_graph (grad of grad,
a gradient penalty), AccumulateGrad semantics, and grad mode (no_grad / enable_grad /
set_grad_enabled as context managers and decorators)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from tests.conftest import torch_or_skip


def _pair(data, requires_grad=True):
    """The same leaf in graphc and in torch."""
    torch = torch_or_skip()
    g = graphc.tensor(data, requires_grad=requires_grad)
    t = torch.tensor(data, requires_grad=requires_grad)
    return g, t


def _close(g, t):
    np.testing.assert_allclose(g.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


# ---- backward basics ---------------------------------------------------------------------
def test_backward_scalar_and_gradient_argument():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    x.grad = None
    (x * 3).backward(graphc.tensor([1.0, 0.5, 0.0]))
    assert x.grad.tolist() == [3.0, 1.5, 0.0]


def test_backward_errors_use_pytorch_wording():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar "
                                           "outputs"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does "
                                           "not have a grad_fn"):
        (graphc.tensor([1.0]) * 2).backward()
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of "
                                           r"\[3\] and output\[0\] has a shape of \[2\]"):
        (x * 2).backward(graphc.ones(3))


def test_backward_twice_needs_retain_graph():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 8.0]
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time "
                                           r".*Specify retain_graph=True"):
        y.backward()
    z = x.exp().sum()
    graphc.autograd.grad(z, x)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        graphc.autograd.grad(z, x)


def test_nan_output_still_gets_unit_seed():
    x = graphc.tensor(float("nan"), requires_grad=True)
    (x * 1.0).backward()  # the implicit seed is 1, whatever the output's value
    assert x.grad.item() == 1.0


# ---- graph shapes --------------------------------------------------------------------------
def test_fan_in_accumulates():
    gx, tx = _pair([0.5, -1.0, 2.0])
    for x in (gx, tx):
        a = x * 2
        y = (a * a + a.exp() * x + x.sin()).sum()
        y.backward()
    _close(gx.grad, tx.grad)


def test_multiple_roots():
    gx, tx = _pair([0.5, -1.0, 2.0])
    for mod, x in ((graphc, gx), (torch_or_skip(), tx)):
        a, b = x * 2, (x * x).sum()
        mod.autograd.backward([a, b], [mod.ones(3), None])
    _close(gx.grad, tx.grad)
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    z = y * y  # one root depends on the other
    graphc.autograd.backward([y, z], [graphc.ones(2), graphc.ones(2)])
    assert x.grad.tolist() == [3.0 + 18.0, 3.0 + 36.0]


def test_gradients_match_torch_for_elementwise_compositions():
    torch = torch_or_skip()
    rng = np.random.default_rng(0)
    data = rng.uniform(0.5, 2.0, size=(3, 4)).tolist()
    bias = rng.standard_normal(4).tolist()
    for mod in (graphc, torch):
        x = mod.tensor(data, requires_grad=True)
        b = mod.tensor(bias, requires_grad=True)
        y = ((x * b + 1.0).tanh() * x.log() - x.sqrt() / (b * b + 1.0)).sigmoid()
        z = (y * y.exp() + x.pow(2.5) - mod.maximum(x, b.abs())).sum()
        z.backward()
        if mod is graphc:
            gx, gb = x.grad, b.grad
        else:
            _close(gx, x.grad)
            _close(gb, b.grad)


def test_broadcast_gradients_sum_back_to_operand_shapes():
    gx, tx = _pair([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    gb, tb = _pair([0.5, -0.5, 2.0])
    gc, tc = _pair([[2.0]])
    for x, b, c in ((gx, gb, gc), (tx, tb, tc)):
        ((x * b + c) / (c + b)).sum().backward()
    for g, t in ((gx, tx), (gb, tb), (gc, tc)):
        assert tuple(g.grad.shape) == tuple(t.grad.shape)
        _close(g.grad, t.grad)


# ---- autograd.grad ---------------------------------------------------------------------------
def test_grad_returns_without_touching_dot_grad():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    (g,) = graphc.autograd.grad((x * x).sum(), x)
    assert g.tolist() == [2.0, 4.0] and x.grad is None and not g.requires_grad


def test_grad_allow_unused():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    w = graphc.tensor([1.0, 1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="The differentiated Tensor at index 1 appears to not "
                                           "have been used in the graph. Set allow_unused=True"):
        graphc.autograd.grad((x * x).sum(), [x, w])
    gx, gw = graphc.autograd.grad((x * x).sum(), [x, w], allow_unused=True)
    assert gx.tolist() == [2.0, 4.0] and gw is None


def test_grad_of_non_leaf_and_of_output_itself():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = (y * y).sum()
    (gy,) = graphc.autograd.grad(z, y, retain_graph=True)
    assert gy.tolist() == [4.0, 8.0]
    (gz,) = graphc.autograd.grad(z, z)
    assert gz.item() == 1.0


def test_create_graph_grad_of_grad_matches_torch():
    gx, tx = _pair([0.5, 1.5, -2.0])
    out = []
    for mod, x in ((graphc, gx), (torch_or_skip(), tx)):
        y = (x * x * x + x.sin()).sum()
        (g,) = mod.autograd.grad(y, x, create_graph=True)
        assert g.requires_grad
        (gg,) = mod.autograd.grad(g.sum(), x)
        out.append((g, gg))
    _close(out[0][0], out[1][0])
    _close(out[0][1], out[1][1])


def test_gradient_penalty_matches_torch():
    torch = torch_or_skip()
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((3, 4)).tolist()
    x0 = rng.standard_normal((2, 3)).tolist()
    grads = []
    for mod in (graphc, torch):
        w = mod.tensor(w0, requires_grad=True)
        x = mod.tensor(x0, requires_grad=True)
        out = (x @ w).tanh().sum()
        (gx,) = mod.autograd.grad(out, x, create_graph=True)
        penalty = ((gx * gx).sum(dim=1).sqrt() - 1.0).pow(2).mean()
        penalty.backward()
        grads.append((w.grad, x.grad))
    _close(grads[0][0], grads[1][0])
    _close(grads[0][1], grads[1][1])


def test_backward_create_graph_makes_grad_differentiable():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    (x * x * x).sum().backward(create_graph=True)
    assert x.grad.requires_grad and x.grad.tolist() == [3.0, 12.0]
    (g2,) = graphc.autograd.grad(x.grad.sum(), x)
    assert g2.tolist() == [6.0, 12.0]


def test_backward_inputs_restricts_accumulation():
    x = graphc.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = graphc.tensor([2.0, 2.0, 2.0], requires_grad=True)
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None and w.grad.tolist() == [1.0, 2.0, 3.0]
    y = x * 2
    (y * y).sum().backward(inputs=[y])
    assert x.grad is None and y.grad.tolist() == [4.0, 8.0, 12.0]


# ---- AccumulateGrad ------------------------------------------------------------------------
def test_accumulation_across_backward_calls():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(3):
        (x * x).sum().backward()
    assert x.grad.tolist() == [6.0, 12.0]
    grad_before = x.grad
    (x * 1).sum().backward()
    assert x.grad is grad_before  # accumulated in place, as PyTorch (no create_graph)


def test_grads_are_not_aliased():
    a = graphc.tensor([1.0, 2.0], requires_grad=True)
    b = graphc.tensor([3.0, 4.0], requires_grad=True)
    seed = graphc.tensor([1.0, 1.0])
    (a + b).backward(seed)  # the same incoming gradient object reaches both leaves
    assert a.grad is not b.grad and a.grad is not seed
    a.grad.mul_(5)
    assert b.grad.tolist() == [1.0, 1.0] and seed.tolist() == [1.0, 1.0]
    c = graphc.tensor([1.0], requires_grad=True)
    d = graphc.tensor([1.0], requires_grad=True)
    gc, gd = graphc.autograd.grad((c + d).sum(), [c, d])
    assert gc.tolist() == gd.tolist() == [1.0]
    (c + d).sum().backward(create_graph=True)
    assert c.grad is not d.grad and c.grad.tolist() == [1.0]


def test_leaf_grad_dtype_follows_leaf():
    x = graphc.tensor([1.0, 2.0], dtype=graphc.float64, requires_grad=True)
    (x.float() * 2).sum().backward()
    assert x.grad.dtype is graphc.float64 and x.grad.tolist() == [2.0, 2.0]


# ---- hooks and retain_grad ---------------------------------------------------------------
def test_tensor_hooks_order_and_replacement_match_torch():
    torch = torch_or_skip()
    logs = []
    for mod in (graphc, torch):
        log = []
        x = mod.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 2
        y.register_hook(lambda g, log=log: log.append(("y1", g.tolist())))
        h = y.register_hook(lambda g, log=log: g * 10)
        y.register_hook(lambda g, log=log: log.append(("y3", g.tolist())))
        y.grad_fn.register_prehook(lambda go, log=log: log.append(("pre", go[0].tolist())))
        y.grad_fn.register_hook(lambda gi, go, log=log: log.append(("post", gi[0].tolist())))
        y.retain_grad()
        x.register_hook(lambda g, log=log: log.append(("x", g.tolist())))
        (y * y).sum().backward(retain_graph=True)
        log.append(("x.grad", x.grad.tolist()))
        log.append(("y.grad", y.grad.tolist()))
        h.remove()
        x.grad = None
        (y * y).sum().backward()
        log.append(("x.grad2", x.grad.tolist()))
        logs.append(log)
    assert logs[0] == logs[1]


def test_leaf_hook_replaces_accumulated_grad_and_handle_removes():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    handle = x.register_hook(lambda g: g * 0 + 7.0)
    (x * 3).sum().backward()
    assert x.grad.tolist() == [7.0, 7.0]
    handle.remove()
    (x * 3).sum().backward()
    assert x.grad.tolist() == [10.0, 10.0]
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't "
                                           "require gradient"):
        graphc.tensor([1.0]).register_hook(lambda g: g)


def test_retain_grad():
    x = graphc.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    assert y.retains_grad
    z = (y * y).sum()
    z.backward()
    assert y.grad.tolist() == [4.0, 8.0] and x.grad.tolist() == [8.0, 16.0]
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has "
                                           "requires_grad=False"):
        graphc.tensor([1.0]).retain_grad()


def test_post_accumulate_grad_hook_style_via_accumulator():
    x = graphc.tensor([1.0], requires_grad=True)
    seen = []
    x._grad_accumulator().post_accumulate_hooks[0] = lambda t: seen.append(t.grad.item())
    (x * 4).sum().backward()
    assert seen == [4.0]


# ---- grad mode ---------------------------------------------------------------------------
def test_grad_modes_as_context_managers_and_decorators():
    x = graphc.tensor([1.0], requires_grad=True)
    with graphc.no_grad():
        assert not (x * 2).requires_grad
        assert not graphc.is_grad_enabled()
        with graphc.enable_grad():
            assert (x * 2).requires_grad
        assert not graphc.is_grad_enabled()
    assert graphc.is_grad_enabled()

    @graphc.no_grad()
    def f():
        return x * 2

    @graphc.enable_grad()
    def g():
        return x * 2

    assert not f().requires_grad
    with graphc.no_grad():
        assert g().requires_grad
    with graphc.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert graphc.is_grad_enabled()
    graphc.set_grad_enabled(False)
    assert not graphc.is_grad_enabled()
    graphc.set_grad_enabled(True)
    assert (x * 2).requires_grad
    assert graphc.autograd.no_grad is graphc.no_grad


def test_grad_mode_restored_after_exception():
    with pytest.raises(ValueError), graphc.no_grad():
        raise ValueError("boom")
    assert graphc.is_grad_enabled()


def test_python_control_flow_rebuilds_graph_each_time():
    x = graphc.tensor([1.0, -2.0], requires_grad=True)
    for step in range(3):
        x.grad = None
        y = x * 2 if step % 2 == 0 else x * x
        y.sum().backward()
        assert x.grad.tolist() == ([2.0, 2.0] if step % 2 == 0 else [2.0, -4.0])


def test_grad_mode_bare_decorators_and_inference_mode():
    x = graphc.tensor([1.0], requires_grad=True)

    @graphc.no_grad
    def bare():
        return x * 2

    @graphc.set_grad_enabled(False)
    def disabled():
        return x * 2

    assert graphc.is_grad_enabled()  # the decorator form does not leak the mode
    assert not bare().requires_grad and not disabled().requires_grad
    with graphc.autograd.inference_mode():
        assert not (x * 2).requires_grad
    with graphc.autograd.inference_mode(False):
        assert (x * 2).requires_grad
    with graphc.autograd.detect_anomaly():
        (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0]


def test_ready_nodes_run_latest_first_like_torch():
    torch = torch_or_skip()
    logs = []
    for mod in (graphc, torch):
        log = []
        x = mod.tensor([1.0, 2.0], requires_grad=True)
        a, b = x * 2, x * 3
        c, d = a * b, a.exp()
        e, f = c + d, b.sin()
        for name, t in (("a", a), ("b", b), ("c", c), ("d", d), ("e", e), ("f", f), ("x", x)):
            t.register_hook(lambda g, name=name, log=log: log.append(name))
        (e.sum() + f.sum()).backward()
        p, q = x * 2, x * 5
        p.register_hook(lambda g, log=log: log.append("p"))
        q.register_hook(lambda g, log=log: log.append("q"))
        mod.autograd.backward([p.sum(), q.sum()], retain_graph=True)
        mod.autograd.backward([q.sum(), p.sum()])
        logs.append(log)
    assert logs[0] == logs[1]
