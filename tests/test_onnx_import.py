"""graphc.onnx.load: an ONNX model as a graphc Module that runs eagerly, traces, compiles and
fine-tunes; ops outside the mapping are refused with UnsupportedOnnxOp."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX tests need the [onnx] extra: pip install onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import graphc  # noqa: E402
import graphc.onnx  # noqa: E402
from graphc.onnx import UnsupportedOnnxOp  # noqa: E402


def convnet(rng, opset=17):
    """Conv -> Relu -> MaxPool -> a Reshape whose shape is computed from Shape (as
    torch.onnx exports flatten) -> Gemm -> Softmax, built with onnx.helper."""
    f32 = np.float32
    inits = [
        numpy_helper.from_array(rng.normal(size=(4, 2, 3, 3)).astype(f32), "conv.weight"),
        numpy_helper.from_array(rng.normal(size=4).astype(f32), "conv.bias"),
        numpy_helper.from_array(rng.normal(size=(3, 36)).astype(f32) * 0.3, "fc.weight"),
        numpy_helper.from_array(rng.normal(size=3).astype(f32), "fc.bias"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Shape", ["p"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "minus_one"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["p", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_load_matches_the_reference_evaluator(rng, tmp_path):
    model = convnet(rng)
    x = rng.normal(size=(2, 2, 6, 6)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    path = tmp_path / "convnet.onnx"
    onnx.save(model, str(path))
    for source in (model, str(path), path, model.SerializeToString()):
        module = graphc.onnx.load(source)
        assert isinstance(module, graphc.nn.Module)
        got = module(graphc.tensor(x))
        np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    assert module(x=graphc.tensor(x)).shape == (2, 3)  # inputs by name too


def test_initializers_are_parameters_with_their_names(rng):
    module = graphc.onnx.load(convnet(rng))
    state = module.state_dict()
    assert set(state) == {"conv.weight", "conv.bias", "fc.weight", "fc.bias"}
    params = dict(module.named_parameters())
    assert all(isinstance(p, graphc.nn.Parameter) and p.requires_grad for p in params.values())
    assert params["conv.weight"].shape == (4, 2, 3, 3)


def test_fine_tune(rng):
    module = graphc.onnx.load(convnet(rng))
    x = graphc.tensor(rng.normal(size=(2, 2, 6, 6)).astype(np.float32))
    target = graphc.tensor([0, 2])
    opt = graphc.optim.SGD(module.parameters(), lr=0.01)
    before = module.state_dict()["fc.weight"].numpy().copy()
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = graphc.nn.functional.nll_loss(module(x).log(), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert not np.allclose(module.state_dict()["fc.weight"].numpy(), before)


def test_traces_without_shape_ops_and_compiles(rng):
    module = graphc.onnx.load(convnet(rng))
    x = graphc.tensor(rng.normal(size=(2, 2, 6, 6)).astype(np.float32))
    with graphc.no_grad():
        graph = graphc.trace(module, x)
        ops = [n.op for n in graph.nodes]
        assert "conv2d" in ops and "softmax" in ops
        # Shape -> Gather -> Concat folded to a literal: the reshape has a static shape
        assert any(n.op == "reshape" and n.attrs["shape"] == (2, 36) for n in graph.nodes)
        want = module(x).numpy()
        compiled = graphc.compile(module, backend="interp")
        np.testing.assert_allclose(compiled(x).numpy(), want, rtol=1e-5, atol=1e-6)


def test_compiles_on_cpu(rng):
    pytest.importorskip("llvmlite", reason="the cpu backend needs llvmlite")
    module = graphc.onnx.load(convnet(rng))
    x = graphc.tensor(rng.normal(size=(2, 2, 6, 6)).astype(np.float32))
    with graphc.no_grad():
        want = module(x).numpy()
        got = graphc.compile(module, backend="cpu")(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _one_node_model(node, inputs, outputs, opset=17):
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unsupported_op_names_op_opset_and_node():
    model = _one_node_model(
        helper.make_node("NonZero", ["x"], ["y"], name="find_them"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, None])], opset=13)
    with pytest.raises(UnsupportedOnnxOp) as info:
        graphc.onnx.load(model)
    err = info.value
    assert (err.op_type, err.opset, err.node) == ("NonZero", 13, "find_them")
    assert "NonZero" in str(err) and "opset 13" in str(err) and "find_them" in str(err)
    assert isinstance(err, graphc.GraphcError)


def test_unsupported_forms_and_types_are_refused():
    deconv = _one_node_model(
        helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv3d"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4, 4]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 1, 2, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedOnnxOp, match="ConvTranspose.*deconv3d.*3 spatial dim"):
        graphc.onnx.load(deconv)(graphc.ones(1, 1, 4, 4, 4), graphc.ones(1, 1, 2, 2, 2))
    u64 = _one_node_model(
        helper.make_node("Relu", ["x"], ["y"]),
        [helper.make_tensor_value_info("x", TensorProto.UINT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.UINT64, [2])])
    with pytest.raises(UnsupportedOnnxOp, match="UINT64"):
        graphc.onnx.load(u64)


def test_narrow_types_widen_and_the_backend_casts_back():
    import graphc.onnx.backend as backend

    node = helper.make_node("Add", ["a", "b"], ["c"])
    a = np.array([1, 2, 3], np.int32)
    out = backend.run_node(node, [a, a])[0]
    assert out.dtype == np.int32 and out.tolist() == [2, 4, 6]
    half = np.array([0.5, 1.5], np.float16)
    out = backend.run_node(node, [half, half])[0]
    assert out.dtype == np.float16 and out.tolist() == [1.0, 3.0]


def test_backend_interface():
    from onnx.backend.base import Backend

    import graphc.onnx.backend as backend

    assert issubclass(backend.GraphcBackend, Backend)
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    model = _one_node_model(
        helper.make_node("Softmax", ["x"], ["y"], axis=1),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    rep = backend.prepare(model)
    np.testing.assert_allclose(rep.run([x])[0], want, rtol=1e-6)
    np.testing.assert_allclose(rep.run({"x": x})[0], want, rtol=1e-6)
    np.testing.assert_allclose(backend.run_model(model, [x])[0], want, rtol=1e-6)
    compiled = backend.prepare(model, backend="interp")
    np.testing.assert_allclose(compiled.run([x])[0], want, rtol=1e-6)


def test_graphc_import_stays_light():
    import subprocess
    import sys

    code = "import graphc, sys; assert 'onnx' not in sys.modules and 'graphc.onnx' not in " \
           "sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


class _TorchModels:
    """PyTorch models exported with torch.onnx (the TorchScript exporter), built lazily."""

    @staticmethod
    def conv_lstm(torch):
        class ConvLSTM(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
                self.lstm = torch.nn.LSTM(32, 16, batch_first=True, bidirectional=True)
                self.ln, self.fc = torch.nn.LayerNorm(32), torch.nn.Linear(32, 5)

            def forward(self, x):
                y = torch.relu(self.bn(self.conv(x))).permute(0, 3, 1, 2).flatten(2)
                y, _ = self.lstm(y)
                return torch.softmax(self.fc(torch.nn.functional.gelu(self.ln(y))), -1)

        return ConvLSTM(), (2, 3, 4, 6)

    @staticmethod
    def gpt_block(torch):
        class Block(torch.nn.Module):
            def __init__(self, d=16, heads=2):
                super().__init__()
                self.heads, self.ln1, self.ln2 = heads, torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
                self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
                self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                               torch.nn.Linear(4 * d, d))

            def forward(self, x):
                b, t, c = x.shape
                q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
                q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
                att = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
                mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
                att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
                y = (att @ v).transpose(1, 2).reshape(b, t, c)
                x = x + self.proj(y)
                return x + self.mlp(self.ln2(x))

        return Block(), (2, 5, 16)

    @staticmethod
    def resnet_block(torch):
        block = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(8, 4))
        return block, (2, 3, 16, 16)


@pytest.mark.parametrize("name", ["conv_lstm", "gpt_block", "resnet_block"])
def test_torch_exported_models_match_pytorch(name, rng):
    import io

    from tests.conftest import torch_or_skip

    torch = torch_or_skip()
    torch.manual_seed(0)
    model, shape = getattr(_TorchModels, name)(torch)
    model.eval()
    x = torch.tensor(rng.normal(size=shape).astype(np.float32))
    buffer = io.BytesIO()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    module = graphc.onnx.load(buffer.getvalue())
    with graphc.no_grad():
        got = module(graphc.tensor(x.numpy())).numpy()
        want = model(x).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert list(module.parameters())  # the weights are trainable Parameters


def test_exported_gpt_imports_compiles_and_fine_tunes_compiled():
    pytest.importorskip("llvmlite", reason="the cpu backend needs llvmlite")
    from tests.test_onnx_export import TinyGPT

    model = TinyGPT().eval()
    idx = graphc.randint(0, 50, (2, 7))
    module = graphc.onnx.load(graphc.onnx.to_model(model, (idx,)))
    with graphc.no_grad():
        np.testing.assert_allclose(graphc.compile(module, backend="cpu")(idx).numpy(),
                                   model(idx).numpy(), rtol=1e-4, atol=1e-5)
    opt = graphc.optim.SGD(module.parameters(), lr=0.1)

    def step(idx, target):
        opt.zero_grad()
        loss = graphc.nn.functional.cross_entropy(module(idx).reshape(-1, 50),
                                                  target.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    compiled = graphc.compile(step, backend="cpu")
    target = graphc.randint(0, 50, (2, 7))
    losses = [float(compiled(idx, target)) for _ in range(4)]
    assert losses[-1] < losses[0]
