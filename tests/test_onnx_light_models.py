"""The real architectures in onnx's test data ("light" models: AlexNet, DenseNet-121,
Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, random weights)
imported with graphc.onnx.load: every node output matches onnxruntime on a random input, and
the smaller ones compile on cpu to eager's logits (all nine: `python -m
graphc.onnx.conformance --light --compile cpu`, about 30 s)."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx", reason="ONNX tests need the [onnx] extra: pip install onnx")
pytest.importorskip("onnxruntime", reason="the light models are compared with onnxruntime")

from graphc.onnx import conformance  # noqa: E402

COMPILED_IN_CI = ("bvlc_alexnet", "squeezenet", "zfnet512")


@pytest.mark.parametrize("name", conformance.LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    backend = "cpu" if name in COMPILED_IN_CI else None
    result = conformance.run_light_model(name, backend)
    assert result.values > 30
    assert result.worst_eager < 1e-4, f"{result.worst_value} differs by {result.worst_eager}"
    if backend is not None:
        assert result.compiled < 1e-4
