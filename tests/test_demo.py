"""`graphc demo` and `graphc build-runtime`, run in-process through `graphc.tools.cli.main`.

One small demo run (300 images, one epoch, the benchmark cut to a few steps) checks the
printed summary and every file of the output folder; the rest checks that bad options, a
backend that cannot run and a missing runtime builder each give one line and a non-zero exit.
The full default demo (>= 97% test accuracy) is measured by hand: it takes too long for CI.
"""

from __future__ import annotations

import re
import sys
import types
import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest

import graphc.backends
import graphc.tools.demo_bench as demo_bench
from graphc.errors import GraphcError
from graphc.ir import parse, verify
from graphc.tools.cli import main
from graphc.tools.demo import batches, load_digits
from graphc.tools.demo_model import build_model

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _one_error_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def test_small_demo_prints_its_summary_and_writes_valid_files(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(demo_bench, "WARMUP_STEPS", 1)
    monkeypatch.setattr(demo_bench, "MAX_STEPS", 3)
    out = tmp_path / "demo"
    rc = main(["demo", "--limit", "300", "--epochs", "1", "--out", str(out), "--seed", "1"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    text = printed.out
    assert "240 training / 60 test images" in text and "(backend cpu)" in text
    train, test = re.search(r"accuracy\s+train (\d+\.\d)%\s+test (\d+\.\d)%", text).groups()
    assert 0.0 <= float(train) <= 100.0 and 0.0 <= float(test) <= 100.0
    compile_seconds = re.search(r"compile time\s+(\d+\.\d+) s for 1 graph \(the first step",
                                text).group(1)
    assert float(compile_seconds) > 0.0
    # two decimals below 100 ms, none above (a loaded machine): graphc.tools.demo._ms
    compiled_ms = re.search(r"graphc compiled \(cpu\)\s+(\d+(?:\.\d+)?) ms", text).group(1)
    assert float(compiled_ms) > 0.0
    assert re.search(r"graphc eager\s+\d+(\.\d+)? ms\s+\d+\.\dx (slower|faster) than", text)
    assert re.search(r"PyTorch eager( \(\d+ threads?\))?\s+(\d+(\.\d+)? ms|torch not installed)",
                     text)
    assert re.search(r"total time\s+\d+\.\d s", text)
    assert "epoch 1/1" in printed.err  # the tqdm bar

    gir = sorted((out / "ir").glob("*.gir"), key=lambda p: int(p.name.split(".")[1]))
    # the passes the step was compiled with: the cpu backend's pipeline
    assert [p.name for p in gir] == ["step.0.traced.gir", "step.1.simplify.gir",
                                     "step.2.transpose_weight_products.gir",
                                     "step.3.fuse_attention.gir",
                                     "step.4.share_reshape_copies.gir", "step.5.fuse.gir",
                                     "step.6.fuse_batch_norm_relu.gir",
                                     "step.7.fuse_conv_channel_sums.gir",
                                     "step.8.fuse_rows.gir", "step.9.recompute_row_values.gir",
                                     "step.10.fuse_rows.gir", "step.11.merge_sibling_sums.gir",
                                     "step.12.fuse_batch_norm_backward.gir",
                                     "step.13.fuse_gemm_column_sums.gir",
                                     "step.14.lay_out_gemm_outputs.gir",
                                     "step.15.plan_buffers.gir"]
    graphs = [verify(parse(p.read_text())) for p in gir]
    assert len(graphs[5].nodes) < len(graphs[0].nodes)
    assert any(node.op == "fused" for node in graphs[12].nodes)
    assert any(node.op == "conv2d" for node in graphs[0].nodes)
    svg = ElementTree.parse(out / "step.svg").getroot()
    assert svg.tag.endswith("svg")
    assert (out / "memory.png").read_bytes().startswith(PNG_SIGNATURE)
    page = (out / "step.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "graph @step" in page
    summary = (out / "summary.txt").read_text()
    assert summary.startswith(text.strip()) and "plan_buffers @step" in summary
    for name in ("summary.txt", "step.svg", "step.html", "memory.png", "ir/"):
        assert re.search(rf"^  {re.escape(name)}\s+\w", text, re.MULTILINE), name


@pytest.mark.parametrize("argv, says", [
    (["--epochs", "0"], "--epochs: expected a positive integer, got 0"),
    (["--batch-size", "many"], "--batch-size: expected a positive integer, got 'many'"),
    (["--backend", "gpu"], "invalid choice: 'gpu'"),
    (["--seed", "-1"], "expected 0 <= seed < 2**32"),
    (["--limit", "10"], "--limit 10: expected 50 to 1797 images"),
    (["--limit", "100", "--batch-size", "500"], "--batch-size 500: larger than the 80"),
    (["--epochs", "1", "leftover"], "unrecognized arguments: leftover"),
])
def test_bad_options_give_one_line_and_exit_2(capsys, tmp_path, argv, says):
    out = tmp_path / "never-written"
    try:
        rc = main(["demo", "--out", str(out)] + argv)
    except SystemExit as exit_:
        rc = exit_.code
    assert rc == 2
    assert says in _one_error_line(capsys, "graphc demo: error:")
    assert not out.exists()


def test_unwritable_output_folder_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    rc = main(["demo", "--limit", "100", "--out", str(blocker / "demo")])
    assert rc == 2
    assert "cannot create the output folder" in _one_error_line(capsys, "graphc demo: error:")


def _unavailable(graph, options):
    raise GraphcError("cuda backend: no CUDA device found; set GRAPHC_CUDA=emu to run on the "
                      "CPU emulation library")


def _not_installed(graph, options):
    raise ModuleNotFoundError("No module named 'graphc.backends.cuda.executable'")


@pytest.mark.parametrize("factory, says", [
    (_unavailable, "--backend cuda: cuda backend: no CUDA device found; set GRAPHC_CUDA=emu"),
    (_not_installed, "--backend cuda is not available in this installation"),
])
def test_a_backend_that_cannot_run_is_one_line_and_exit_1(capsys, tmp_path, monkeypatch,
                                                          factory, says):
    monkeypatch.setitem(graphc.backends.BACKENDS, "cuda", factory)
    out = tmp_path / "demo"
    rc = main(["demo", "--backend", "cuda", "--limit", "100", "--out", str(out)])
    assert rc == 1
    assert says in _one_error_line(capsys, "graphc demo: error:")


def test_step_timings_without_torch_say_so(monkeypatch):
    monkeypatch.setattr(demo_bench, "WARMUP_STEPS", 1)
    monkeypatch.setattr(demo_bench, "MAX_STEPS", 3)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    data = load_digits(seed=0, limit=100)
    timings = demo_bench.step_timings(build_model(), data, batch_size=8, lr=1e-3)
    assert timings["PyTorch eager"] == "torch not installed"
    assert timings["graphc eager"] > 0.0


def test_help_lists_demo_and_build_runtime(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    listing = capsys.readouterr().out
    assert "demo" in listing and "build-runtime" in listing


def test_build_runtime_hands_its_arguments_to_the_builder(monkeypatch):
    seen = []
    fake = types.ModuleType("graphc.backends.cuda.build")
    fake.main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "graphc.backends.cuda.build", fake)
    assert main(["build-runtime", "--emu", "--help"]) == 7
    assert seen == [["--emu", "--help"]]


def test_build_runtime_without_the_builder_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "graphc.backends.cuda.build", None)  # import fails
    assert main(["build-runtime"]) == 1
    assert "no CUDA runtime builder" in _one_error_line(capsys, "graphc build-runtime: error:")


def test_batches_are_full_disjoint_and_reshuffled():
    rng = np.random.default_rng(0)
    first, second = batches(rng, 10, 4), batches(rng, 10, 4)
    assert [len(b) for b in first] == [4, 4]
    assert len(set(np.concatenate(first).tolist())) == 8
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))


def test_the_gpt_demo_trains_samples_and_plots(capsys, tmp_path):
    out = tmp_path / "gpt"
    rc = main(["demo", "--model", "gpt", "--steps", "5", "--out", str(out), "--seed", "1"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    text = printed.out
    assert "character-level GPT on Python's standard library" in text
    first, last = map(float, re.search(r"loss\s+(\d+\.\d+) -> (\d+\.\d+)", text).groups())
    assert last < first
    assert re.search(r"compile time\s+\d+\.\d+ s for 1 graph\n", text)
    assert re.search(r"^sample {10}def ", text, re.MULTILINE)
    assert (out / "loss.png").read_bytes().startswith(PNG_SIGNATURE)
    assert (out / "summary.txt").read_text().startswith("graphc demo: a character-level GPT")
    assert "training" in printed.err  # the tqdm bar
