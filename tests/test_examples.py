"""Every script in examples/ runs (a smoke test on small settings) and says what it promises:
the MLP learns, eager and compiled LeNet-5 agree, the custom Function's straight-through
gradient holds compiled, the gradient penalty matches eager, the inspection writes an SVG."""

from __future__ import annotations

import importlib.util
import pathlib
import xml.etree.ElementTree as ET

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the examples compile for the CPU backend")

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_has_a_smoke_test():
    tested = {"mlp", "lenet5", "custom_function", "gradient_penalty", "inspect_graph"}
    tested |= {"resnet", "lstm_lm", "vae", "dcgan"}  # tests/test_examples_models.py
    tested |= {"gpt"}  # tests/test_models_transformer.py
    tested |= {"ddp_digits"}  # tests/test_distributed.py (2 MPI ranks)
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested


def test_mlp_learns(capsys):
    last = load("mlp").main(["--steps", "60"])
    assert last < 0.2
    assert "compiled steps on cpu" in capsys.readouterr().out


def test_lenet5_compiled_matches_eager():
    losses = load("lenet5").main(["--steps", "2", "--batch-size", "4"])
    assert len(losses) == 2
    for eager, compiled in losses:
        assert np.isfinite(eager) and abs(eager - compiled) <= 1e-4 * max(1.0, abs(eager))


def test_custom_function_straight_through_gradient():
    eager, compiled = load("custom_function").main()
    np.testing.assert_allclose(compiled, [-1.0, -0.5, 0.0, 0.5, 1.0])
    np.testing.assert_allclose(eager, compiled)


def test_gradient_penalty_compiled_matches_eager():
    assert load("gradient_penalty").main() < 1e-4


def test_inspect_graph_writes_an_svg(tmp_path, capsys):
    path = load("inspect_graph").main(["--out", str(tmp_path)])
    assert ET.parse(path).getroot().tag.endswith("svg")
    out = capsys.readouterr().out
    assert "fused[" in out and "plan_buffers" in out and "Arena" in out
