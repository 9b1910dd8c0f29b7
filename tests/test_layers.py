"""graphc.nn layers, losses, functional and init against PyTorch: forward values, input and
parameter gradients (weights copied over from the torch layer), running statistics, defaults."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from tests.conftest import torch_or_skip


def _np(t):
    return t.detach().numpy()


def assert_close(g, t, rtol=1e-7, atol=1e-9, what=""):
    np.testing.assert_allclose(_np(g), t.detach().numpy(), rtol=rtol, atol=atol, err_msg=what)


def check_layer(rng, g_mod, t_mod, x, *, train=True, backward=True, steps=1, int_input=False):
    """Copy torch's state into g_mod, run both in float64 and compare everything."""
    torch = torch_or_skip()
    g_mod.load_state_dict(t_mod.state_dict())
    g_mod.double()
    t_mod.double()
    g_mod.train(train)
    t_mod.train(train)
    for _ in range(steps):
        if int_input:
            gx, tx = graphc.tensor(x), torch.tensor(x)
        else:
            gx = graphc.tensor(x, requires_grad=True)
            tx = torch.tensor(x, requires_grad=True)
        gy, ty = g_mod(gx), t_mod(tx)
        assert tuple(gy.shape) == tuple(ty.shape)
        assert_close(gy, ty, what="forward")
        if backward:
            grad = rng.standard_normal(tuple(ty.shape))
            gy.backward(graphc.tensor(grad))
            ty.backward(torch.tensor(grad))
            if not int_input:
                assert_close(gx.grad, tx.grad, what="input grad")
    for (name, gp), (_, tp) in zip(g_mod.named_parameters(), t_mod.named_parameters()):
        assert (gp.grad is None) == (tp.grad is None), name
        if gp.grad is not None:
            assert_close(gp.grad, tp.grad, what=f"grad of {name}")
    g_buf, t_buf = dict(g_mod.named_buffers()), dict(t_mod.named_buffers())
    assert list(g_buf) == list(t_buf)
    for name in g_buf:
        assert_close(g_buf[name], t_buf[name], what=f"buffer {name}")
    return g_mod, t_mod


def _pair(nn_name, *args, **kwargs):
    torch = torch_or_skip()
    return getattr(nn, nn_name)(*args, **kwargs), getattr(torch.nn, nn_name)(*args, **kwargs)


# ---- layers with parameters ------------------------------------------------------------------
@pytest.mark.parametrize("args,kwargs,shape", [
    ((4, 3), {}, (5, 4)),
    ((4, 3), {"bias": False}, (5, 4)),
    ((4, 2), {}, (2, 3, 4)),
    ((4, 2), {}, (4,)),
])
def test_linear(rng, args, kwargs, shape):
    check_layer(rng, *_pair("Linear", *args, **kwargs), rng.standard_normal(shape))


def test_linear_float32_matches_torch(rng):
    torch = torch_or_skip()
    g, t = _pair("Linear", 6, 3)
    g.load_state_dict(t.state_dict())
    x = rng.standard_normal((4, 6)).astype(np.float32)
    out = g(graphc.tensor(x))
    assert out.dtype is graphc.float32
    np.testing.assert_allclose(_np(out), t(torch.tensor(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("args,kwargs,shape", [
    ((3, 4, 3), {}, (2, 3, 7, 7)),
    ((4, 6, (3, 2)), {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}, (2, 4, 9, 8)),
    ((2, 3, 4), {"padding": "same", "bias": False}, (1, 2, 6, 5)),
    ((2, 3, 3), {"padding": "valid", "stride": (1, 2)}, (2, 2, 6, 7)),
    ((2, 3, 3), {"padding": 1}, (2, 5, 5)),
])
def test_conv2d(rng, args, kwargs, shape):
    check_layer(rng, *_pair("Conv2d", *args, **kwargs), rng.standard_normal(shape))


@pytest.mark.parametrize("nn_name,kwargs,shape", [
    ("BatchNorm1d", {}, (8, 4)),
    ("BatchNorm1d", {}, (6, 4, 5)),
    ("BatchNorm1d", {"momentum": None}, (8, 4)),
    ("BatchNorm1d", {"affine": False}, (8, 4)),
    ("BatchNorm1d", {"bias": False, "eps": 1e-3}, (8, 4)),
    ("BatchNorm2d", {}, (4, 4, 3, 5)),
    ("BatchNorm2d", {"momentum": 0.3}, (3, 4, 2, 2)),
    ("BatchNorm2d", {"track_running_stats": False}, (3, 4, 2, 2)),
])
def test_batchnorm_training_then_eval(rng, nn_name, kwargs, shape):
    g, t = _pair(nn_name, 4, **kwargs)
    x = rng.standard_normal(shape) * 3.0 + 1.0
    check_layer(rng, g, t, x, train=True, steps=3)
    check_layer(rng, g, t, rng.standard_normal(shape), train=False)


def test_batchnorm_errors():
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        nn.BatchNorm1d(3)(graphc.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 2D input\)"):
        nn.BatchNorm2d(3)(graphc.zeros(2, 3))


def test_embedding(rng):
    torch = torch_or_skip()
    idx = rng.integers(0, 7, size=(3, 4))
    idx[0, 0] = 2
    check_layer(rng, *_pair("Embedding", 7, 3), idx, int_input=True)
    g, t = check_layer(rng, *_pair("Embedding", 7, 3, padding_idx=2), idx, int_input=True)
    assert np.all(g.weight.grad.numpy()[2] == 0)
    frozen = nn.Embedding.from_pretrained(graphc.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert not frozen.weight.requires_grad
    assert frozen(graphc.tensor([1, 0])).tolist() == [[3.0, 4.0], [1.0, 2.0]]
    assert repr(nn.Embedding(5, 2, padding_idx=-1)) == repr(
        torch.nn.Embedding(5, 2, padding_idx=-1))


# ---- parameter-free layers -----------------------------------------------------------------
@pytest.mark.parametrize("nn_name,args,kwargs,shape", [
    ("MaxPool2d", (2,), {}, (2, 3, 6, 6)),
    ("MaxPool2d", (3,), {"stride": 2, "padding": 1}, (1, 2, 7, 6)),
    ("MaxPool2d", (2,), {"ceil_mode": True}, (1, 2, 5, 5)),
    ("MaxPool2d", ((2, 3),), {"dilation": (1, 2)}, (2, 8, 9)),
    ("AvgPool2d", (2,), {}, (2, 3, 6, 6)),
    ("AvgPool2d", (3, 2, 1), {"count_include_pad": False}, (1, 2, 7, 6)),
    ("AvgPool2d", (2,), {"ceil_mode": True, "divisor_override": 3}, (1, 2, 5, 5)),
    ("ReLU", (), {}, (3, 4)),
    ("LeakyReLU", (0.2,), {}, (3, 4)),
    ("Tanh", (), {}, (3, 4)),
    ("Sigmoid", (), {}, (3, 4)),
    ("GELU", (), {}, (3, 4)),
    ("GELU", (), {"approximate": "tanh"}, (3, 4)),
    ("Softmax", (), {"dim": 1}, (3, 4, 2)),
    ("LogSoftmax", (), {"dim": -1}, (3, 4)),
    ("Flatten", (), {}, (2, 3, 4, 5)),
    ("Flatten", (0, 2), {}, (2, 3, 4, 5)),
    ("Unflatten", (1, (2, 3)), {}, (4, 6)),
    ("Identity", (3, "ignored"), {}, (2, 2)),
    ("Dropout", (0.4,), {}, (3, 4)),
])
def test_parameter_free_layers(rng, nn_name, args, kwargs, shape):
    x = rng.standard_normal(shape)
    if nn_name in ("ReLU", "LeakyReLU"):
        x = np.where(np.abs(x) < 1e-3, 0.5, x)  # away from the kink
    train = nn_name != "Dropout"  # dropout's random mask is checked on its own below
    check_layer(rng, *_pair(nn_name, *args, **kwargs), x, train=train)


def test_max_pool_return_indices(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((2, 2, 6, 6))
    g_out, g_idx = nn.MaxPool2d(2, return_indices=True)(graphc.tensor(x))
    t_out, t_idx = torch.nn.MaxPool2d(2, return_indices=True)(torch.tensor(x))
    assert_close(g_out, t_out)
    np.testing.assert_array_equal(g_idx.numpy(), t_idx.numpy())


def test_inplace_relu_and_leaky_relu(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((3, 4)) + 0.01
    for g_mod, t_mod in (_pair("ReLU", inplace=True), _pair("LeakyReLU", 0.1, inplace=True)):
        gx = graphc.tensor(x, requires_grad=True)
        tx = torch.tensor(x, requires_grad=True)
        gh, th = gx * 2.0, tx * 2.0
        gy, ty = g_mod(gh), t_mod(th)
        assert gy is gh and gh._version == 1
        assert_close(gy, ty)
        gy.sum().backward()
        ty.sum().backward()
        assert_close(gx.grad, tx.grad)


def test_dropout_train_and_eval():
    graphc.manual_seed(0)
    drop = nn.Dropout(0.25)
    x = graphc.ones(200, 50)
    y = drop(x).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but "
                                         "got 1.5"):
        nn.Dropout(1.5)


def test_sequential_and_containers(rng):
    torch = torch_or_skip()

    def build(nn_mod):
        return nn_mod.Sequential(nn_mod.Linear(4, 6), nn_mod.Tanh(), nn_mod.Linear(6, 3),
                                 nn_mod.LogSoftmax(dim=1))

    g, t = build(nn), build(torch.nn)
    check_layer(rng, g, t, rng.standard_normal((5, 4)))
    assert len(g) == 4 and isinstance(g[-1], nn.LogSoftmax)
    assert isinstance(g[1:3], nn.Sequential) and len(g[1:3]) == 2
    assert g[1:3][1] is g[2]
    g.append(nn.Identity())
    assert len(g) == 5 and list(g._modules)[-1] == "4"
    del g[0]
    assert list(g._modules) == ["0", "1", "2", "3"] and isinstance(g[0], nn.Tanh)
    g.insert(0, nn.ReLU())
    assert isinstance(g[0], nn.ReLU) and len(g) == 5
    assert isinstance(g.pop(0), nn.ReLU) and len(g) == 4
    g[0] = nn.Sigmoid()
    assert isinstance(g[0], nn.Sigmoid)
    with pytest.raises(IndexError, match="index 9 is out of range"):
        g[9]
    named = nn.Sequential(__import__("collections").OrderedDict(a=nn.ReLU(), b=nn.Tanh()))
    assert list(named._modules) == ["a", "b"] and isinstance(named.b, nn.Tanh)
    assert len(named + nn.Sequential(nn.ReLU())) == 3

    ml = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
    ml.append(nn.Tanh())
    ml.extend([nn.Sigmoid()])
    ml.insert(1, nn.Identity())
    assert [type(m).__name__ for m in ml] == ["Linear", "Identity", "ReLU", "Tanh", "Sigmoid"]
    assert len(list(ml.parameters())) == 2 and isinstance(ml[1:], nn.ModuleList)
    del ml[1]
    assert list(ml._modules) == ["0", "1", "2", "3"]
    with pytest.raises(IndexError, match="index 7 is out of range"):
        ml[7]

    md = nn.ModuleDict({"lin": nn.Linear(2, 2)})
    md["act"] = nn.ReLU()
    md.update([("out", nn.Tanh())])
    assert list(md.keys()) == ["lin", "act", "out"] and "act" in md and len(md) == 3
    assert [n for n, _ in md.named_parameters()] == ["lin.weight", "lin.bias"]
    assert isinstance(md.pop("act"), nn.ReLU) and list(md) == ["lin", "out"]


# ---- losses -------------------------------------------------------------------------------------
def _loss_pair(nn_name, torch, **kwargs):
    g_kwargs = {k: graphc.tensor(v) if isinstance(v, np.ndarray) else v
                for k, v in kwargs.items()}
    t_kwargs = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v
                for k, v in kwargs.items()}
    return getattr(nn, nn_name)(**g_kwargs), getattr(torch.nn, nn_name)(**t_kwargs)


@pytest.mark.parametrize("nn_name,kwargs,target_kind", [
    ("CrossEntropyLoss", {}, "class"),
    ("CrossEntropyLoss", {"reduction": "sum", "ignore_index": 1}, "class"),
    ("CrossEntropyLoss", {"weight": np.array([0.2, 1.0, 3.0, 0.5]), "label_smoothing": 0.1},
     "class"),
    ("CrossEntropyLoss", {"reduction": "none"}, "probs"),
    ("NLLLoss", {}, "class"),
    ("NLLLoss", {"weight": np.array([0.2, 1.0, 3.0, 0.5]), "reduction": "none"}, "class"),
    ("MSELoss", {}, "same"),
    ("MSELoss", {"reduction": "sum"}, "same"),
    ("BCEWithLogitsLoss", {}, "binary"),
    ("BCEWithLogitsLoss", {"pos_weight": np.array([1.0, 2.0, 0.5, 3.0]),
                           "weight": np.array([0.5, 1.0, 1.0, 2.0])}, "binary"),
])
def test_losses(rng, nn_name, kwargs, target_kind):
    torch = torch_or_skip()
    g_loss, t_loss = _loss_pair(nn_name, torch, **kwargs)
    x = rng.standard_normal((6, 4))
    if target_kind == "class":
        target = rng.integers(0, 4, size=(6,))
    elif target_kind == "probs":
        target = rng.dirichlet(np.ones(4), size=6)
    elif target_kind == "binary":
        target = (rng.random((6, 4)) > 0.5).astype(np.float64)
    else:
        target = rng.standard_normal((6, 4))
    if nn_name == "NLLLoss":
        x = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    gx, tx = graphc.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    g_out = g_loss(gx, graphc.tensor(target))
    t_out = t_loss(tx, torch.tensor(target))
    assert_close(g_out, t_out)
    g_out.sum().backward()
    t_out.sum().backward()
    assert_close(gx.grad, tx.grad)
    assert [n for n, _ in g_loss.named_buffers()] == [n for n, _ in t_loss.named_buffers()]


def test_loss_legacy_flags_map_to_reduction():
    with pytest.warns(UserWarning, match="reduction='sum'"):
        loss = nn.MSELoss(size_average=False)
    assert loss.reduction == "sum"
    with pytest.warns(UserWarning, match="reduction='none'"):
        assert nn.CrossEntropyLoss(reduce=False).reduction == "none"


# ---- functional ---------------------------------------------------------------------------------
def test_functional_matches_torch(rng):
    torch = torch_or_skip()
    tf = torch.nn.functional
    x = rng.standard_normal((2, 3, 4, 4))
    gx, tx = graphc.tensor(x), torch.tensor(x)
    w = rng.standard_normal((5, 3, 3, 3))
    assert_close(F.conv2d(gx, graphc.tensor(w), stride=2, padding=1),
                 tf.conv2d(tx, torch.tensor(w), stride=2, padding=1))
    assert_close(F.max_pool2d(gx, 2), tf.max_pool2d(tx, 2))
    assert_close(F.avg_pool2d(gx, 2, padding=1), tf.avg_pool2d(tx, 2, padding=1))
    assert_close(F.pad(gx, (1, 2, 0, 1), value=0.5), tf.pad(tx, (1, 2, 0, 1), value=0.5))
    assert_close(F.flatten(gx, 1), torch.flatten(tx, 1))
    assert_close(F.softmax(gx, dim=1), tf.softmax(tx, dim=1))
    assert_close(F.log_softmax(gx, 1), tf.log_softmax(tx, 1))
    assert_close(F.leaky_relu(gx, 0.3), tf.leaky_relu(tx, 0.3))
    assert_close(F.gelu(gx), tf.gelu(tx))
    assert_close(F.tanh(gx), tf.tanh(tx))
    assert_close(F.sigmoid(gx), tf.sigmoid(tx))
    lin_w, lin_b = rng.standard_normal((2, 4)), rng.standard_normal(2)
    assert_close(F.linear(gx, graphc.tensor(lin_w), graphc.tensor(lin_b)),
                 tf.linear(tx, torch.tensor(lin_w), torch.tensor(lin_b)))
    y = graphc.tensor(x.copy())
    assert F.relu(y, inplace=True) is y
    assert_close(y, tf.relu(tx))
    assert F.dropout(gx, 0.5, training=False) is gx
    rm, rv = np.zeros(3), np.ones(3)
    g_rm, g_rv = graphc.tensor(rm), graphc.tensor(rv)
    t_rm, t_rv = torch.tensor(rm), torch.tensor(rv)
    assert_close(F.batch_norm(gx, g_rm, g_rv, training=True),
                 tf.batch_norm(tx, t_rm, t_rv, training=True))
    assert_close(g_rm, t_rm)
    assert_close(g_rv, t_rv)
    idx = rng.integers(0, 5, size=(2, 3))
    table = rng.standard_normal((5, 2))
    assert_close(F.embedding(graphc.tensor(idx), graphc.tensor(table)),
                 tf.embedding(torch.tensor(idx), torch.tensor(table)))
    logits, labels = rng.standard_normal((4, 3)), rng.integers(0, 3, size=4)
    with pytest.warns(UserWarning):
        g_ce = F.cross_entropy(graphc.tensor(logits), graphc.tensor(labels), reduce=False)
    assert_close(g_ce, tf.cross_entropy(torch.tensor(logits), torch.tensor(labels),
                                        reduction="none"))
    assert_close(F.nll_loss(graphc.tensor(logits), graphc.tensor(labels)),
                 tf.nll_loss(torch.tensor(logits), torch.tensor(labels)))
    assert_close(F.mse_loss(graphc.tensor(logits), graphc.tensor(logits * 0.5)),
                 tf.mse_loss(torch.tensor(logits), torch.tensor(logits * 0.5)))
    probs = (logits > 0).astype(np.float64)
    assert_close(F.binary_cross_entropy_with_logits(graphc.tensor(logits), graphc.tensor(probs)),
                 tf.binary_cross_entropy_with_logits(torch.tensor(logits), torch.tensor(probs)))
    with pytest.raises(ValueError, match="sparse=True is not supported"):
        F.embedding(graphc.tensor(idx), graphc.tensor(table), sparse=True)


@pytest.mark.parametrize("kwargs", [{"max_norm": 1.0}, {"max_norm": 0.5, "norm_type": 1.0},
                                    {"scale_grad_by_freq": True},
                                    {"scale_grad_by_freq": True, "padding_idx": 1,
                                     "max_norm": 2.0}])
def test_embedding_max_norm_and_scale_grad_by_freq(rng, kwargs):
    """The rows the batch references are renormalised in place (the others untouched) and
    the gradient is divided by each row's count in the batch, as PyTorch; eager and compiled."""
    torch = torch_or_skip()
    idx = np.array([[0, 2, 2], [4, 1, 2]])
    table = rng.standard_normal((6, 3)) * 2
    seed = rng.standard_normal((2, 3, 3))
    t_w = torch.tensor(table, requires_grad=True)
    t_out = torch.nn.functional.embedding(torch.tensor(idx), t_w, **kwargs)
    (t_out * torch.tensor(seed)).sum().backward()

    def step(w, i, s):
        out = F.embedding(i, w, **kwargs)
        (out * s).sum().backward()
        return out

    for run in (step, graphc.compile(step)):
        g_w = graphc.tensor(table, requires_grad=True)
        g_out = run(g_w, graphc.tensor(idx), graphc.tensor(seed))
        np.testing.assert_allclose(g_out.detach().numpy(), t_out.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(g_w.detach().numpy(), t_w.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(g_w.grad.numpy(), t_w.grad.numpy(), rtol=1e-12)


# ---- init ---------------------------------------------------------------------------------------
def test_default_init_within_torch_bounds():
    torch = torch_or_skip()
    graphc.manual_seed(1)
    torch.manual_seed(1)
    cases = [(nn.Linear(64, 32), torch.nn.Linear(64, 32), 64),
             (nn.Conv2d(8, 16, 3), torch.nn.Conv2d(8, 16, 3), 72)]
    for g, t, fan_in in cases:
        bound = 1 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)) and the bias rule agree
        for name in ("weight", "bias"):
            gv, tv = _np(getattr(g, name)), getattr(t, name).detach().numpy()
            for v in (gv, tv):
                assert np.abs(v).max() <= bound + 1e-7
                assert np.abs(v).max() > 0.8 * bound
            if name == "weight":  # U(-b, b): std b/sqrt(3)
                assert abs(gv.std() - bound / math.sqrt(3)) < 0.1 * bound
                assert abs(gv.std() - tv.std()) < 0.1 * bound
    emb = _np(nn.Embedding(200, 50).weight)
    assert abs(emb.mean()) < 0.05 and abs(emb.std() - 1.0) < 0.05
    bn = nn.BatchNorm2d(5)
    assert bn.weight.tolist() == [1.0] * 5 and bn.bias.tolist() == [0.0] * 5
    assert bn.running_var.tolist() == [1.0] * 5 and bn.num_batches_tracked.item() == 0


def test_init_functions():
    torch = torch_or_skip()
    graphc.manual_seed(3)
    w = graphc.empty(300, 200)
    fan_in, fan_out = 200, 300
    nn.init.xavier_uniform_(w, gain=2.0)
    a = 2.0 * math.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(w.numpy()).max() <= a and np.abs(w.numpy()).max() > 0.99 * a
    nn.init.xavier_normal_(w)
    assert abs(w.numpy().std() - math.sqrt(2.0 / (fan_in + fan_out))) < 0.01 * 2
    nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    assert abs(w.numpy().std() / math.sqrt(2.0 / fan_out) - 1) < 0.02
    nn.init.kaiming_uniform_(w, a=0.1)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + 0.01)) / math.sqrt(fan_in)
    assert np.abs(w.numpy()).max() <= bound and np.abs(w.numpy()).max() > 0.99 * bound
    nn.init.uniform_(w, -0.5, 2.0)
    assert w.numpy().min() >= -0.5 and w.numpy().max() < 2.0
    nn.init.normal_(w, 3.0, 0.5)
    assert abs(w.numpy().mean() - 3.0) < 0.01 and abs(w.numpy().std() - 0.5) < 0.01
    nn.init.constant_(w, 0.25)
    assert np.all(w.numpy() == 0.25)
    nn.init.zeros_(w)
    assert not w.numpy().any()
    nn.init.ones_(w)
    assert np.all(w.numpy() == 1.0)
    p = nn.Parameter(graphc.empty(3, 4))  # a leaf that requires grad: init runs under no_grad
    assert nn.init.kaiming_uniform_(p) is p and p.grad_fn is None
    for shape in ((3, 4), (6, 2, 3, 5)):
        assert nn.init._calculate_fan_in_and_fan_out(graphc.empty(*shape)) == \
            torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape))
    for nl, param in [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None),
                      ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)]:
        assert nn.init.calculate_gain(nl, param) == torch.nn.init.calculate_gain(nl, param)


def test_init_errors_match_torch():
    torch = torch_or_skip()
    cases = [
        (lambda: nn.init.xavier_uniform_(graphc.empty(3)),
         lambda: torch.nn.init.xavier_uniform_(torch.empty(3))),
        (lambda: nn.init.kaiming_uniform_(graphc.empty(3, 3), mode="fan_x"),
         lambda: torch.nn.init.kaiming_uniform_(torch.empty(3, 3), mode="fan_x")),
        (lambda: nn.init.calculate_gain("swish"), lambda: torch.nn.init.calculate_gain("swish")),
        (lambda: nn.init.calculate_gain("leaky_relu", "x"),
         lambda: torch.nn.init.calculate_gain("leaky_relu", "x")),
    ]
    for g_fn, t_fn in cases:
        with pytest.raises(ValueError) as t_err:
            t_fn()
        with pytest.raises(ValueError) as g_err:
            g_fn()
        assert str(g_err.value) == str(t_err.value)


def test_batchnorm_base_class_takes_any_n_c_input():
    from graphc.errors import ArgumentError
    from graphc.nn.modules.batchnorm import _BatchNorm

    m = _BatchNorm(3)
    assert tuple(m(graphc.randn(4, 3, 5, 2)).shape) == (4, 3, 5, 2)
    with pytest.raises(ArgumentError, match=r"expected 2D or more input \(got 1D input\)"):
        m(graphc.randn(3))
