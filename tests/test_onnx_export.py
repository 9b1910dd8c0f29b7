"""graphc.onnx.export: each model family passes onnx.checker (full_check) and gives graphc's
outputs in onnxruntime; the export reads back through graphc.onnx.load to the same outputs."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX tests need the [onnx] extra: pip install onnx")
ort = pytest.importorskip("onnxruntime", reason="parity needs the [onnx] extra (onnxruntime)")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
import graphc.onnx  # noqa: E402
from graphc.jit.pytree import flatten  # noqa: E402

ATOL = 1e-5


def _tensors(out):
    return [t for _, t in flatten(out)]


def _eager(model, args):
    if isinstance(model, nn.Module):
        model.eval()
    with graphc.no_grad():
        return [t.numpy() for t in _tensors(model(*args))]


def _ort(proto, args, feed=None):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = feed or {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    return sess.run(None, feed)


def roundtrip(model, *args, tmp_path=None, **kwargs):
    """Export, re-check, compare with onnxruntime and with the imported module."""
    path = tmp_path / "model.onnx"
    proto = graphc.onnx.export(model, args, path, **kwargs)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    want = _eager(model, args)
    got = _ort(proto, args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=ATOL)
    imported = graphc.onnx.load(path)
    for g, w in zip(_eager(imported, args), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=ATOL)
    return proto


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
        nn.LogSoftmax(-1))


class BasicBlock(nn.Module):
    """A ResNet basic block with BatchNorm (exported in eval mode) and a strided shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class GPTBlock(nn.Module):
    """nanoGPT's block: pre-LayerNorm causal self-attention and a GELU MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, d=32, block=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.block, self.ln = GPTBlock(d), nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = graphc.arange(0, idx.shape[1])
        return self.head(self.ln(self.block(self.wte(idx) + self.wpe(pos))))


def _randomize_bn(model, rng):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(graphc.tensor(rng.normal(size=n).astype(np.float32)))
            m.running_var.copy_(graphc.tensor(rng.uniform(0.5, 2, size=n).astype(np.float32)))
            m.weight.data.copy_(graphc.tensor(rng.normal(size=n).astype(np.float32)))


def test_mlp(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    proto = roundtrip(model, graphc.randn(3, 8), tmp_path=tmp_path)
    names = {i.name for i in proto.graph.initializer}
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= names


def test_lenet5(tmp_path):
    roundtrip(lenet5(), graphc.randn(2, 1, 28, 28), tmp_path=tmp_path)


def test_resnet_block_batchnorm_eval(tmp_path, rng):
    model = nn.Sequential(BasicBlock(4, 8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 3))
    with graphc.no_grad():
        _randomize_bn(model, rng)
    model.train()
    x = graphc.randn(2, 4, 8, 8)
    graphc.onnx.to_model(model, (x,))
    assert model.training  # the export traced in eval mode and restored the caller's
    roundtrip(model, x, tmp_path=tmp_path)


def test_gpt_block_layernorm_attention(tmp_path):
    roundtrip(TinyGPT(), graphc.randint(0, 50, (2, 7)), tmp_path=tmp_path)


@pytest.mark.parametrize("name", ["encoder", "mha", "mobilenet", "gru", "lstm", "convtranspose",
                                  "activations", "upsample"])
def test_model_families(name, tmp_path):
    make = {
        "encoder": lambda: (nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                       batch_first=True), (2, 5, 16)),
        "mha": lambda: (_SelfAttention(), (2, 5, 16)),
        "mobilenet": lambda: (nn.Sequential(
            nn.Conv2d(4, 4, 3, groups=4, padding=1), nn.BatchNorm2d(4), nn.ReLU6(),
            nn.Conv2d(4, 8, 1), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten()),
            (2, 4, 8, 8)),
        "gru": lambda: (nn.GRU(6, 8, batch_first=True), (2, 4, 6)),
        "lstm": lambda: (nn.LSTM(6, 8, batch_first=True), (2, 4, 6)),
        "convtranspose": lambda: (nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1,
                                                     output_padding=1), (1, 3, 5, 5)),
        "activations": lambda: (nn.Sequential(
            nn.SiLU(), nn.Mish(), nn.ELU(), nn.Softplus(), nn.LeakyReLU(0.1), nn.GELU(),
            nn.Tanh(), nn.Hardsigmoid(), nn.Sigmoid(), nn.Softmax(-1)), (3, 5)),
        "upsample": lambda: (nn.Upsample(scale_factor=2), (1, 3, 5, 5)),
    }
    model, shape = make[name]()
    roundtrip(model, graphc.randn(*shape), tmp_path=tmp_path)


class _SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, q):
        return self.attn(q, q, q, need_weights=False)[0]


def test_functions_and_integer_ops(tmp_path):
    def f(x, y):
        q = graphc.floor_divide(x, y)
        r = graphc.remainder(x, y)
        return q, r, (x > y) & (y > 0), graphc.where(x > 0, x, -x).sum(0)

    x = graphc.tensor([[7, -7, 5], [-5, 9, 0]])
    y = graphc.tensor([[2, 2, -3], [3, -4, 1]])
    roundtrip(f, x, y, tmp_path=tmp_path)
    a, b = graphc.randn(3, 4), graphc.randn(3, 4)
    roundtrip(lambda a, b: (graphc.remainder(a, b), graphc.clamp(a, -0.5, 0.5).mean(1),
                            a.amax(0), a.argmax(1), graphc.log1p(a.abs()), a.abs().rsqrt()),
              a, b, tmp_path=tmp_path)


@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_opsets(opset, tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    proto = roundtrip(model, graphc.randn(2, 4), tmp_path=tmp_path, opset_version=opset)
    assert proto.opset_import[0].version == opset


def test_names_and_dynamic_axes(tmp_path):
    model = lenet5()
    proto = graphc.onnx.export(model, (graphc.randn(3, 1, 28, 28),), tmp_path / "m.onnx",
                               input_names=["image"], output_names=["logits"],
                               dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    assert [i.name for i in proto.graph.input] == ["image"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = graphc.randn(5, 1, 28, 28)  # another batch size than the traced one
    got = _ort(proto, (), {"image": x.numpy()})[0]
    np.testing.assert_allclose(got, _eager(model, (x,))[0], rtol=1e-4, atol=ATOL)


@pytest.mark.parametrize("name", ["gpt", "lstm", "encoder"])
def test_dynamic_batch_follows_through_shapes(name):
    """Reshapes, broadcasts, constants and slices sized by the batch read it at run time."""
    make = {"gpt": lambda: (TinyGPT(), lambda b: graphc.randint(0, 50, (b, 7))),
            "lstm": lambda: (nn.LSTM(4, 5, batch_first=True), lambda b: graphc.randn(b, 6, 4)),
            "encoder": lambda: (nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                           batch_first=True),
                                lambda b: graphc.randn(b, 5, 16))}
    model, sample = make[name]()
    proto = graphc.onnx.to_model(model, (sample(3),), input_names=["x"],
                                 dynamic_axes={"x": {0: "batch"}})
    assert proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    for batch in (1, 5):
        x = sample(batch)
        got = _ort(proto, (), {"x": x.numpy()})[0]
        np.testing.assert_allclose(got, _eager(model, (x,))[0], rtol=1e-4, atol=ATOL)


def test_export_to_file_object(tmp_path):
    with open(tmp_path / "f.onnx", "wb") as f:
        graphc.onnx.export(nn.Linear(2, 2), (graphc.randn(1, 2),), f)
    onnx.checker.check_model(onnx.load(str(tmp_path / "f.onnx")), full_check=True)


def test_refusals_name_the_op():
    with pytest.raises(graphc.onnx.OnnxExportError, match="dropout.*eval"):
        graphc.onnx.to_model(lambda x: F.dropout(x, 0.5, training=True), (graphc.randn(3),))
    with pytest.raises(graphc.onnx.OnnxExportError, match="opset_version 7"):
        graphc.onnx.to_model(nn.Linear(2, 2), (graphc.randn(1, 2),), opset_version=7)
    assert issubclass(graphc.onnx.OnnxExportError, graphc.GraphcError)


def test_every_registry_op_has_an_export_or_a_reason():
    from graphc.onnx.export_ops import EXPORTERS, REFUSED
    from graphc.ops.registry import REGISTRY

    missing = sorted(set(REGISTRY) - set(EXPORTERS) - set(REFUSED))
    assert not missing, f"registry ops with neither an ONNX export nor a refusal: {missing}"
