"""graphc.nn.Module and Parameter: registration, errors, iteration, modes, state_dict, hooks,
repr, each checked against PyTorch's behaviour (messages compared after 'torch' -> 'graphc')."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from tests.conftest import torch_or_skip


def _error_of(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 (the test compares what was raised)
        return err
    raise AssertionError("expected an error")


def _message(err) -> str:
    return err.args[0] if isinstance(err, KeyError) else str(err)


def assert_same_error(g_fn, t_fn, kind):
    """Both raise `kind` and graphc's message is PyTorch's with 'torch' -> 'graphc'."""
    g_err, t_err = _error_of(g_fn), _error_of(t_fn)
    assert isinstance(t_err, kind), t_err
    assert isinstance(g_err, kind), g_err
    assert _message(g_err) == _message(t_err).replace("torch", "graphc")


def g2n(t):
    return t.detach().numpy()


# ---- Parameter -------------------------------------------------------------------------------
def test_parameter_is_a_leaf_tensor_sharing_memory():
    data = graphc.tensor([1.0, 2.0])
    p = nn.Parameter(data)
    assert isinstance(p, graphc.Tensor) and isinstance(p, nn.Parameter)
    assert p.requires_grad and p.is_leaf and p.grad_fn is None
    with graphc.no_grad():
        data.add_(1.0)
    np.testing.assert_array_equal(g2n(p), [2.0, 3.0])
    assert not nn.Parameter(data, requires_grad=False).requires_grad
    assert nn.Parameter().shape == (0,)
    assert type(p * 2) is graphc.Tensor  # results of ops are plain tensors


def test_parameter_repr_matches_torch():
    torch = torch_or_skip()
    g = nn.Parameter(graphc.tensor([1.0, 2.5]))
    t = torch.nn.Parameter(torch.tensor([1.0, 2.5]))
    assert repr(g) == repr(t)
    g = nn.Parameter(graphc.tensor([1.0, 2.0]), requires_grad=False)
    t = torch.nn.Parameter(torch.tensor([1.0, 2.0]), requires_grad=False)
    assert repr(g) == repr(t)


def test_parameter_deepcopy_and_pickle_keep_the_type():
    p = nn.Parameter(graphc.tensor([1.0, 2.0]))
    p.grad = graphc.tensor([0.5, 0.5])
    q = copy.deepcopy(p)
    assert type(q) is nn.Parameter and q.requires_grad
    np.testing.assert_array_equal(g2n(q), g2n(p))
    np.testing.assert_array_equal(q.grad.numpy(), [0.5, 0.5])
    assert not np.shares_memory(q._data, p._data)
    r = pickle.loads(pickle.dumps(nn.Parameter(graphc.tensor([3.0]), requires_grad=False)))
    assert type(r) is nn.Parameter and not r.requires_grad and r.tolist() == [3.0]


def test_parameter_of_integer_tensor_cannot_require_grad():
    with pytest.raises(RuntimeError, match="floating point"):
        nn.Parameter(graphc.tensor([1, 2]))
    assert nn.Parameter(graphc.tensor([1, 2]), requires_grad=False).dtype is graphc.int64


# ---- registration through __setattr__ --------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(graphc.ones(3))
        self.register_buffer("b", graphc.zeros(3))
        self.register_buffer("scratch", graphc.zeros(1), persistent=False)
        self.child = nn.Identity()
        self.plain = 5

    def forward(self, x):
        return x * self.w + self.b


def test_setattr_routes_parameters_buffers_modules():
    m = Net()
    assert list(m._parameters) == ["w"]
    assert list(m._buffers) == ["b", "scratch"]
    assert list(m._modules) == ["child"]
    assert m.__dict__["plain"] == 5 and "w" not in m.__dict__
    assert m.w is m._parameters["w"] and m.b is m._buffers["b"] and m.child is m._modules["child"]
    new_b = graphc.ones(3)
    m.b = new_b  # a tensor assigned to a buffer name stays a buffer
    assert m._buffers["b"] is new_b and "b" not in m.__dict__
    m.scratch = graphc.ones(1)
    assert "scratch" in m._non_persistent_buffers_set  # keeps its persistence
    m.w = None
    assert m._parameters["w"] is None and m.w is None
    m.child = None
    assert m._modules["child"] is None
    m.b = nn.Parameter(graphc.zeros(3))  # a Parameter moves the name to the parameters
    assert "b" in m._parameters and "b" not in m._buffers
    m.plain = nn.Linear(2, 2)
    assert "plain" in m._modules and "plain" not in m.__dict__
    m.buf2 = nn.Buffer(graphc.zeros(2), persistent=False)
    assert "buf2" in m._buffers and "buf2" in m._non_persistent_buffers_set


def test_getattr_and_delattr():
    m = Net()
    del m.w, m.b, m.child, m.plain
    assert not m._parameters and list(m._buffers) == ["scratch"] and not m._modules
    err = _error_of(lambda: m.w)
    assert isinstance(err, AttributeError) and str(err) == "'Net' object has no attribute 'w'"
    assert not hasattr(m, "plain")
    del m.scratch
    assert "scratch" not in m._non_persistent_buffers_set


def test_register_parameter_and_buffer_none():
    m = nn.Module()
    m.register_parameter("w", None)
    m.register_buffer("b", None)
    assert m.w is None and m.b is None
    assert list(m.parameters()) == [] and list(m.buffers()) == []
    assert list(m.state_dict()) == []


class _TooEarly:
    """Module subclasses whose __init__ assigns before calling Module.__init__."""

    @staticmethod
    def make(nn_mod, what, value_fn):
        class Early(nn_mod.Module):
            def __init__(self):
                if what == "register_parameter":
                    self.register_parameter("w", value_fn())
                elif what == "register_buffer":
                    self.register_buffer("b", value_fn())
                else:
                    self.w = value_fn()
                super().__init__()

        return Early


@pytest.mark.parametrize("what", ["setattr_param", "setattr_module", "register_parameter",
                                  "register_buffer"])
def test_assigning_before_module_init_is_an_error(what):
    torch = torch_or_skip()

    def value(lib, nn_mod):
        if what == "setattr_module":
            return lambda: nn_mod.Identity()
        if what == "register_buffer":
            return lambda: lib.zeros(2)
        return lambda: nn_mod.Parameter(lib.zeros(2))

    g_cls = _TooEarly.make(nn, what, value(graphc, nn))
    t_cls = _TooEarly.make(torch.nn, what, value(torch, torch.nn))
    assert_same_error(g_cls, t_cls, AttributeError)


def test_plain_tensor_assigned_to_parameter_name_is_an_error():
    torch = torch_or_skip()
    g, t = nn.Linear(2, 3), torch.nn.Linear(2, 3)
    assert_same_error(lambda: setattr(g, "weight", graphc.zeros(3, 2)),
                      lambda: setattr(t, "weight", torch.zeros(3, 2)), TypeError)
    assert_same_error(lambda: setattr(g, "weight", graphc.zeros(3, 2, dtype=graphc.float64)),
                      lambda: setattr(t, "weight", torch.zeros(3, 2, dtype=torch.float64)),
                      TypeError)
    assert_same_error(lambda: setattr(g, "weight", 3),
                      lambda: setattr(t, "weight", 3), TypeError)


def test_wrong_kinds_for_module_and_buffer_names():
    torch = torch_or_skip()
    g, t = nn.Sequential(nn.Identity()), torch.nn.Sequential(torch.nn.Identity())
    assert_same_error(lambda: setattr(g, "0", graphc.zeros(1)),
                      lambda: setattr(t, "0", torch.zeros(1)), TypeError)
    g, t = nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    assert_same_error(lambda: setattr(g, "running_mean", [1.0]),
                      lambda: setattr(t, "running_mean", [1.0]), TypeError)


def test_register_parameter_errors_match_torch():
    torch = torch_or_skip()
    g, t = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    cases = [
        (lambda m, lib, nnm: m.register_parameter("w", lib.zeros(2)), TypeError),
        (lambda m, lib, nnm: m.register_parameter("a.b", None), KeyError),
        (lambda m, lib, nnm: m.register_parameter("", None), KeyError),
        (lambda m, lib, nnm: m.register_parameter(3, None), TypeError),
        (lambda m, lib, nnm: m.register_parameter("reset_parameters", None), KeyError),
        (lambda m, lib, nnm: m.register_buffer("x", [1.0]), TypeError),
        (lambda m, lib, nnm: m.register_buffer("a.b", None), KeyError),
        (lambda m, lib, nnm: m.register_buffer("", None), KeyError),
        (lambda m, lib, nnm: m.register_buffer("weight", None), KeyError),
    ]
    for fn, kind in cases:
        assert_same_error(lambda: fn(g, graphc, nn), lambda: fn(t, torch, torch.nn), kind)


def test_non_leaf_parameter_is_refused():
    torch = torch_or_skip()

    def non_leaf(lib, nn_mod):
        p = nn_mod.Parameter(lib.zeros(2), requires_grad=False)
        p.add_(lib.ones(2, requires_grad=True))  # p now has history: not a leaf
        return p

    g_p, t_p = non_leaf(graphc, nn), non_leaf(torch, torch.nn)
    assert g_p.grad_fn is not None
    assert_same_error(lambda: nn.Module().register_parameter("w", g_p),
                      lambda: torch.nn.Module().register_parameter("w", t_p), ValueError)


# ---- iteration ---------------------------------------------------------------------------------
def _tied(nn_mod, lib):
    class Block(nn_mod.Module):
        def __init__(self, shared):
            super().__init__()
            self.lin = shared
            self.own = nn_mod.Linear(2, 2, bias=False)
            self.register_buffer("count", lib.zeros(1))

    class Tied(nn_mod.Module):
        def __init__(self):
            super().__init__()
            shared = nn_mod.Linear(2, 2)
            self.scale = nn_mod.Parameter(lib.ones(1))
            self.first = Block(shared)
            self.second = Block(shared)
            self.again = self.first  # the same module twice
            self.alias = self.scale  # ... a parameter registered under two names
            self.seq = nn_mod.Sequential(nn_mod.ReLU(), shared, nn_mod.BatchNorm1d(2))

    return Tied()


def _names(pairs):
    return [name for name, _ in pairs]


def test_named_members_order_and_dedup_match_torch():
    torch = torch_or_skip()
    g, t = _tied(nn, graphc), _tied(torch.nn, torch)
    assert _names(g.named_parameters()) == _names(t.named_parameters())
    assert _names(g.named_parameters(remove_duplicate=False)) == _names(
        t.named_parameters(remove_duplicate=False))
    assert _names(g.named_parameters(prefix="model", recurse=False)) == _names(
        t.named_parameters(prefix="model", recurse=False))
    assert _names(g.named_buffers()) == _names(t.named_buffers())
    assert _names(g.named_children()) == _names(t.named_children())
    assert _names(g.named_modules()) == _names(t.named_modules())
    assert _names(g.named_modules(remove_duplicate=False)) == _names(
        t.named_modules(remove_duplicate=False))
    assert _names(g.named_modules(prefix="m")) == _names(t.named_modules(prefix="m"))
    assert len(list(g.parameters())) == len(list(t.parameters())) == 7
    assert len(list(g.modules())) == len(list(t.modules()))
    assert len(list(g.children())) == len(list(t.children()))
    assert list(g.children())[0] is g.first
    assert next(iter(g.modules())) is g
    ids = [id(p) for p in g.parameters()]
    assert len(ids) == len(set(ids))


def test_train_eval_propagate_to_all_submodules():
    m = _tied(nn, graphc)
    assert all(s.training for s in m.modules())
    assert m.eval() is m
    assert not any(s.training for s in m.modules())
    m.train()
    assert all(s.training for s in m.modules())
    m.seq.train(False)
    assert m.training and not m.seq[2].training
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        m.train("yes")


def test_zero_grad_and_requires_grad_():
    m = nn.Linear(3, 2)
    x = graphc.ones(4, 3)
    m(x).sum().backward()
    assert m.weight.grad is not None
    m.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(m.weight.grad.numpy(), np.zeros((2, 3)))
    m.zero_grad()
    assert m.weight.grad is None and m.bias.grad is None
    assert m.requires_grad_(False) is m
    assert not any(p.requires_grad for p in m.parameters())
    m.requires_grad_()
    assert all(p.requires_grad for p in m.parameters())


def test_apply_visits_children_first_like_torch():
    torch = torch_or_skip()
    seen_g, seen_t = [], []
    _tied(nn, graphc).apply(lambda mod: seen_g.append(type(mod).__name__))
    _tied(torch.nn, torch).apply(lambda mod: seen_t.append(type(mod).__name__))
    assert seen_g == seen_t


def test_to_double_keeps_parameter_objects():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    params = list(m.parameters())
    m[0](graphc.ones(1, 3)).sum().backward()
    assert m.double() is m
    assert [id(p) for p in m.parameters()] == [id(p) for p in params]
    assert all(p.dtype is graphc.float64 and isinstance(p, nn.Parameter) for p in params)
    assert m[0].weight.grad.dtype is graphc.float64
    assert m[1].running_mean.dtype is graphc.float64
    assert m[1].num_batches_tracked.dtype is graphc.int64  # integer buffers stay
    m.to(graphc.float32)
    assert all(p.dtype is graphc.float32 for p in params)
    m.to(dtype=graphc.float64)
    assert m[0].weight.dtype is graphc.float64
    m.float()
    assert m[0].weight.dtype is graphc.float32
    out = m.to("cpu")(graphc.ones(4, 3))
    assert out.dtype is graphc.float32
    with pytest.raises(TypeError, match="floating point"):
        m.to(graphc.int64)


def test_forward_missing_and_unexpected_init_arguments():
    torch = torch_or_skip()
    assert_same_error(lambda: nn.Module()(graphc.ones(1)),
                      lambda: torch.nn.Module()(torch.ones(1)), NotImplementedError)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        nn.Module(bogus=1)


def test_get_submodule_parameter_buffer():
    m = _tied(nn, graphc)
    assert m.get_submodule("first.own") is m.first.own
    assert m.get_parameter("first.lin.weight") is m.first.lin.weight
    assert m.get_buffer("seq.2.running_var") is m.seq[2].running_var
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        m.get_submodule("first.nope")
    with pytest.raises(AttributeError, match="is not an nn.Parameter"):
        m.get_parameter("first.count")


def test_deepcopy_and_pickle_of_a_module():
    m = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    c = copy.deepcopy(m)
    assert c[0].weight is not m[0].weight and isinstance(c[0].weight, nn.Parameter)
    np.testing.assert_array_equal(g2n(c[0].weight), g2n(m[0].weight))
    p = pickle.loads(pickle.dumps(m))
    assert isinstance(p[0].weight, nn.Parameter) and p[0].weight.requires_grad
    np.testing.assert_array_equal(g2n(p[0].bias), g2n(m[0].bias))
    assert "0" not in dir(m) and "append" in dir(m)


# ---- state_dict --------------------------------------------------------------------------------
def test_state_dict_keys_match_torch_and_share_memory():
    torch = torch_or_skip()
    g, t = _tied(nn, graphc), _tied(torch.nn, torch)
    g.register_buffer("tmp", graphc.zeros(1), persistent=False)
    t.register_buffer("tmp", torch.zeros(1), persistent=False)
    gs, ts = g.state_dict(), t.state_dict()
    assert list(gs) == list(ts)
    assert isinstance(gs, OrderedDict)
    w = gs["first.lin.weight"]
    assert type(w) is graphc.Tensor and not w.requires_grad
    assert np.shares_memory(w._data, g.first.lin.weight._data)
    assert g.state_dict(keep_vars=True)["scale"] is g.scale
    assert list(g.state_dict(prefix="net.")) == list(t.state_dict(prefix="net."))


def test_load_state_dict_round_trip_copies_in_place():
    src, dst = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4))
    src.train()
    src(graphc.ones(5, 3) * graphc.tensor([1.0, 2.0, 3.0]))  # moves the running stats
    before = {name: p for name, p in dst.named_parameters()}
    result = dst.load_state_dict(src.state_dict())
    assert repr(result) == "<All keys matched successfully>"
    assert result.missing_keys == [] and result.unexpected_keys == []
    for name, p in dst.named_parameters():
        assert p is before[name]  # same objects: optimizers keep their references
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
    assert int(dst[1].num_batches_tracked.item()) == 1


def test_load_state_dict_from_torch_arrays():
    torch = torch_or_skip()
    t = torch.nn.Linear(3, 2)
    g = nn.Linear(3, 2)
    g.load_state_dict(t.state_dict())
    np.testing.assert_array_equal(g2n(g.weight), t.weight.detach().numpy())


def _strict_pair(torch):
    def make(nn_mod, lib):
        return nn_mod.Sequential(nn_mod.Linear(2, 3), nn_mod.ReLU(), nn_mod.Linear(3, 1))

    return make(nn, graphc), make(torch.nn, torch)


def test_load_state_dict_strict_errors_match_torch():
    torch = torch_or_skip()
    g, t = _strict_pair(torch)
    gs, ts = g.state_dict(), t.state_dict()
    for sd in (gs, ts):
        del sd["2.bias"]
        sd["2.extra"] = sd["0.bias"]
        sd["5.weight"] = sd["0.bias"]
    assert_same_error(lambda: g.load_state_dict(gs), lambda: t.load_state_dict(ts),
                      RuntimeError)
    err = _error_of(lambda: g.load_state_dict(gs))
    assert isinstance(err, nn.StateDictError)
    assert 'Missing key(s) in state_dict: "2.bias".' in str(err)
    assert 'Unexpected key(s) in state_dict: "5.weight", "2.extra".' in str(err)
    result = g.load_state_dict(gs, strict=False)
    assert result.missing_keys == ["2.bias"]
    assert result.unexpected_keys == ["5.weight", "2.extra"]


def test_load_state_dict_shape_mismatch_matches_torch():
    torch = torch_or_skip()
    g, t = _strict_pair(torch)
    gs, ts = g.state_dict(), t.state_dict()
    gs["0.weight"] = graphc.zeros(3, 5)
    ts["0.weight"] = torch.zeros(3, 5)
    assert_same_error(lambda: g.load_state_dict(gs), lambda: t.load_state_dict(ts),
                      RuntimeError)
    assert_same_error(lambda: g.load_state_dict([1]), lambda: t.load_state_dict([1]),
                      TypeError)


def test_load_state_dict_assign_replaces_parameters():
    g = nn.Linear(2, 1)
    new_w = graphc.tensor([[5.0, 6.0]])
    g.load_state_dict({"weight": new_w, "bias": graphc.tensor([1.0])}, assign=True)
    assert isinstance(g.weight, nn.Parameter) and g.weight.requires_grad
    assert g.weight.tolist() == [[5.0, 6.0]]


def test_batchnorm_loads_checkpoint_without_num_batches_tracked():
    bn = nn.BatchNorm1d(2)
    sd = bn.state_dict()
    del sd["num_batches_tracked"]
    sd._metadata[""] = {"version": 1}
    assert repr(bn.load_state_dict(sd)) == "<All keys matched successfully>"


# ---- forward hooks -------------------------------------------------------------------------------
class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(graphc.tensor([2.0, 3.0]))

    def forward(self, x, shift=0.0):
        return x * self.w + shift


def test_forward_pre_hook_and_forward_hook():
    m = Scale()
    calls = []

    def pre(mod, args):
        calls.append(("pre", mod))
        return (args[0] + 1.0,)

    def post(mod, args, out):
        calls.append(("post", args[0].tolist()))
        return out * 10.0

    h1 = m.register_forward_pre_hook(pre)
    h2 = m.register_forward_hook(post)
    out = m(graphc.tensor([1.0, 1.0]))
    assert out.tolist() == [40.0, 60.0]
    assert calls == [("pre", m), ("post", [2.0, 2.0])]
    h1.remove()
    h2.remove()
    assert m(graphc.tensor([1.0, 1.0])).tolist() == [2.0, 3.0]
    single = m.register_forward_pre_hook(lambda mod, args: args[0] * 0.0)  # non-tuple result
    assert m(graphc.tensor([1.0, 1.0])).tolist() == [0.0, 0.0]
    single.remove()


def test_hooks_with_kwargs_and_prepend():
    m = Scale()
    order = []

    def pre_kw(mod, args, kwargs):
        order.append("pre_kw")
        return args, {"shift": kwargs.get("shift", 0.0) + 100.0}

    def fwd_kw(mod, args, kwargs, out):
        order.append(("fwd_kw", kwargs["shift"]))

    m.register_forward_pre_hook(pre_kw, with_kwargs=True)
    m.register_forward_hook(fwd_kw, with_kwargs=True)
    m.register_forward_hook(lambda *a: order.append("first"), prepend=True)
    out = m(graphc.tensor([1.0, 1.0]), shift=1.0)
    assert out.tolist() == [103.0, 104.0]
    assert order == ["pre_kw", "first", ("fwd_kw", 101.0)]
    m.register_forward_pre_hook(lambda mod, args, kwargs: 5, with_kwargs=True)
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        m(graphc.tensor([1.0, 1.0]))


def test_hook_handle_as_context_manager():
    m = Scale()
    with m.register_forward_hook(lambda mod, a, out: out * 0.0):
        assert m(graphc.ones(2)).tolist() == [0.0, 0.0]
    assert m(graphc.ones(2)).tolist() == [2.0, 3.0]
    assert not m._forward_hooks and not m._forward_hooks_with_kwargs


def test_always_call_forward_hook_runs_when_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m, seen = Boom(), []
    m.register_forward_hook(lambda mod, args, out: seen.append(("always", out)), always_call=True)
    m.register_forward_hook(lambda mod, args, out: seen.append("normal"))
    with pytest.raises(ValueError, match="boom"):
        m(graphc.ones(1))
    assert seen == [("always", None)]


def test_state_dict_hooks():
    m = nn.Linear(2, 1)
    log = []
    m.register_state_dict_pre_hook(lambda mod, prefix, keep_vars: log.append(("pre", prefix)))
    m.register_state_dict_post_hook(
        lambda mod, sd, prefix, meta: log.append(("post", list(sd))))
    sd = m.state_dict()
    assert log == [("pre", ""), ("post", ["weight", "bias"])]

    def load_pre(mod, state_dict, prefix, meta, strict, missing, unexpected, errors):
        log.append(("load_pre", mod is m))
        state_dict[prefix + "bias"] = graphc.tensor([7.0])

    def load_post(mod, keys):
        log.append(("load_post", list(keys.missing_keys)))

    m.register_load_state_dict_pre_hook(load_pre)
    handle = m.register_load_state_dict_post_hook(load_post)
    del sd["bias"]
    m.load_state_dict(sd)
    assert m.bias.tolist() == [7.0]
    assert log[-2:] == [("load_pre", True), ("load_post", [])]
    handle.remove()
    m.register_load_state_dict_post_hook(lambda mod, keys: keys)
    with pytest.raises(AssertionError, match="not expected to return new values"):
        m.load_state_dict(m.state_dict())


def test_to_other_devices_is_refused():
    with pytest.raises(ValueError, match="got device 'cuda'"):
        nn.Linear(2, 2).to("cuda")
    with pytest.raises(ValueError, match="got device 'cuda:0'"):
        nn.Linear(2, 2).to(device="cuda:0")


# ---- full backward hooks vs PyTorch --------------------------------------------------------------
def _two_input_module(nn_mod, lib):
    class TwoIn(nn_mod.Module):
        def __init__(self):
            super().__init__()
            self.w = nn_mod.Parameter(lib.tensor([0.5, -1.5, 2.0]))

        def forward(self, x, y):
            return (x * self.w).tanh() * y, x + y

    return TwoIn()


def _run_backward_hook_case(lib, nn_mod, x_grad, y_grad, replace):
    m = _two_input_module(nn_mod, lib)
    log = []

    def hook(mod, grad_input, grad_output):
        log.append(("hook", [None if g is None else g.tolist() for g in grad_input],
                     [None if g is None else g.tolist() for g in grad_output]))
        if replace and grad_input[0] is not None:
            return (grad_input[0] * 2.0,) + tuple(grad_input[1:])
        return None

    def pre_hook(mod, grad_output):
        log.append(("pre", [None if g is None else g.tolist() for g in grad_output]))

    m.register_full_backward_hook(hook)
    m.register_full_backward_pre_hook(pre_hook)
    x = lib.tensor([0.1, 0.2, 0.3], requires_grad=x_grad)
    y = lib.tensor([1.0, -2.0, 0.5], requires_grad=y_grad)
    a, b = m(x, y)
    (a * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
    grads = [None if t.grad is None else t.grad.tolist() for t in (x, y, m.w)]
    return log, grads


@pytest.mark.parametrize("x_grad,y_grad", [(True, True), (True, False), (False, True),
                                           (False, False)])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_full_backward_hook_matches_torch(x_grad, y_grad, replace):
    torch = torch_or_skip()
    g_log, g_grads = _run_backward_hook_case(graphc, nn, x_grad, y_grad, replace)
    t_log, t_grads = _run_backward_hook_case(torch, torch.nn, x_grad, y_grad, replace)
    assert [e[0] for e in g_log] == [e[0] for e in t_log]
    for ge, te in zip(g_log, t_log):
        for gv, tv in zip(ge[1:], te[1:]):
            assert len(gv) == len(tv)
            for a, b in zip(gv, tv):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(a, b, rtol=1e-6)
    for a, b in zip(g_grads, t_grads):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-6)


def _nested_hook_order(lib, nn_mod):
    order = []

    def tag(name):
        def hook(mod, gi, go):
            order.append(name)

        return hook

    inner = nn_mod.Sequential(nn_mod.Tanh(), nn_mod.Sigmoid())
    outer = nn_mod.Sequential(nn_mod.ReLU(), inner, nn_mod.Tanh())
    for name, mod in outer.named_modules():
        mod.register_full_backward_hook(tag(name or "root"))
        mod.register_forward_hook(lambda mod, a, o, n=name: order.append("fwd " + (n or "root")))
    x = lib.tensor([0.3, -0.2, 1.0], requires_grad=True)
    outer(x).sum().backward()
    return order, x.grad.tolist()


def test_full_backward_hook_order_in_nested_modules_matches_torch():
    torch = torch_or_skip()
    g_order, g_grad = _nested_hook_order(graphc, nn)
    t_order, t_grad = _nested_hook_order(torch, torch.nn)
    assert g_order == t_order
    np.testing.assert_allclose(g_grad, t_grad, rtol=1e-6)


def test_full_backward_hook_errors_and_removal():
    m = _two_input_module(nn, graphc)
    h = m.register_full_backward_hook(lambda mod, gi, go: (gi[0],))
    x = graphc.ones(3, requires_grad=True)
    a, _ = m(x, graphc.ones(3, requires_grad=True))
    with pytest.raises(RuntimeError, match="invalid number of grad_input, got 1, but expected 2"):
        a.sum().backward()
    h.remove()
    x.grad = None
    a, _ = m(x, graphc.ones(3))
    a.sum().backward()
    assert x.grad is not None
    m.register_full_backward_hook(lambda mod, gi, go: (graphc.ones(3), None))
    a, _ = m(graphc.ones(3), graphc.ones(3))  # no input requires grad: the hook runs early
    with pytest.raises(RuntimeError, match="no input requires gradient should always return"):
        with pytest.warns(UserWarning, match="Full backward hook is firing"):
            a.sum().backward()


def test_full_backward_hook_outside_grad_mode_is_inert():
    m = _two_input_module(nn, graphc)
    called = []
    m.register_full_backward_hook(lambda *a: called.append(1))
    with graphc.no_grad():
        a, _ = m(graphc.ones(3, requires_grad=True), graphc.ones(3))
    assert a.grad_fn is None and not called


# ---- repr ----------------------------------------------------------------------------------------
def _zoo(nn_mod):
    class Zoo(nn_mod.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn_mod.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn_mod.Conv2d(6, 16, (3, 5), stride=2, dilation=2, groups=2,
                                       bias=False)
            self.conv3 = nn_mod.Conv2d(16, 16, 3, padding="same")
            self.pool = nn_mod.MaxPool2d(2)
            self.avg = nn_mod.AvgPool2d(3, stride=1, padding=1)
            self.bn = nn_mod.BatchNorm2d(16, momentum=None, affine=False)
            self.bn1 = nn_mod.BatchNorm1d(8, eps=1e-3, track_running_stats=False)
            self.bn2 = nn_mod.BatchNorm1d(8, bias=False)
            self.head = nn_mod.Sequential(
                nn_mod.Flatten(), nn_mod.Linear(16, 8), nn_mod.ReLU(inplace=True),
                nn_mod.Dropout(0.25), nn_mod.Linear(8, 3, bias=False),
                nn_mod.Sequential(nn_mod.LeakyReLU(0.2), nn_mod.GELU(approximate="tanh")))
            self.blocks = nn_mod.ModuleList([nn_mod.Linear(3, 3) for _ in range(3)]
                                            + [nn_mod.Tanh(), nn_mod.Sigmoid(), nn_mod.Sigmoid()])
            self.heads = nn_mod.ModuleDict({"a": nn_mod.Softmax(dim=1),
                                            "b": nn_mod.LogSoftmax(dim=-1)})
            self.emb = nn_mod.Embedding(10, 4, padding_idx=0)
            self.emb2 = nn_mod.Embedding(7, 2)
            self.unflat = nn_mod.Unflatten(1, (2, 4))
            self.ident = nn_mod.Identity()
            self.losses = nn_mod.ModuleList([nn_mod.CrossEntropyLoss(), nn_mod.NLLLoss(),
                                             nn_mod.MSELoss(), nn_mod.BCEWithLogitsLoss()])
            self.empty = nn_mod.ModuleList()

    return Zoo()


def test_repr_matches_torch():
    torch = torch_or_skip()
    g, t = _zoo(nn), _zoo(torch.nn)
    assert repr(g) == repr(t).replace("torch", "graphc")
    for (name, gm), (_, tm) in zip(g.named_modules(), t.named_modules()):
        assert repr(gm) == repr(tm).replace("torch", "graphc"), name
    assert repr(nn.Sequential()) == repr(torch.nn.Sequential())


def test_repr_of_custom_extra_repr_with_children():
    torch = torch_or_skip()

    def make(nn_mod):
        class Custom(nn_mod.Module):
            def __init__(self):
                super().__init__()
                self.inner = nn_mod.Linear(2, 2)

            def extra_repr(self):
                return "alpha=1,\nbeta=2"

        return Custom()

    assert repr(make(nn)) == repr(make(torch.nn))


# ---- the seeds' example --------------------------------------------------------------------------
class SeedsModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 20, 5)

    def forward(self, x):
        x = nn.functional.relu(self.conv1(x))
        return nn.functional.relu(self.conv2(x))


def test_seeds_example_module_runs_and_trains():
    graphc.manual_seed(0)
    model = SeedsModel()
    out = model(graphc.randn(2, 1, 12, 12))
    assert out.shape == (2, 20, 4, 4)
    out.sum().backward()
    assert [n for n, p in model.named_parameters() if p.grad is not None] == [
        "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]
    assert repr(model) == (
        "SeedsModel(\n"
        "  (conv1): Conv2d(1, 20, kernel_size=(5, 5), stride=(1, 1))\n"
        "  (conv2): Conv2d(20, 20, kernel_size=(5, 5), stride=(1, 1))\n"
        ")"
    )
