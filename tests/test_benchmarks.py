"""The benchmark suite (benchmarks/run.py): a `--quick` smoke run on tiny sizes checks the
table's shape and that every contender agreed with its case's reference; the harness's
agreement, timing and target rules are checked on toy contenders."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.harness import CaseResult, Contender, check_agreement, interleaved_medians
from benchmarks.run import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_CASES = ["mlp_b8", "mlp_b1", "lenet5_b4", "gpt_b2", "resnet18_b2", "lstm_b2", "vae_b4",
               "dcgan_b2", "mobilenet_b4", "elementwise_chain", "sgemm_64", "conv2d",
               "compile_cold", "compile_warm"]
# deep float32 steps (GPT, ResNet-18 with BatchNorm on a tiny batch, Adam steps) agree within
# 1e-3
TOLERANCE = {name: 1e-3 for name in ("gpt_b2", "resnet18_b2", "lstm_b2", "vae_b4", "dcgan_b2",
                                     "mobilenet_b4")}
# the quick ResNet-18 is ill-conditioned (BatchNorm over 2 images): PyTorch float32 itself is
# 3.3e-3 from float64 after 3 steps (benchmarks/model_steps.py)
TOLERANCE["resnet18_b2"] = 5e-3


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--json",
                           str(out / "r.json"), "--markdown", str(out / "r.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "r.json") as f:
        results = json.load(f)
    with open(out / "r.md") as f:
        markdown = f.read()
    return results, markdown, proc.stdout


def test_quick_run_has_every_case_and_every_contender_agreed(quick_run):
    results, _, _ = quick_run
    cases = results["cases"]
    assert [c["name"] for c in cases] == QUICK_CASES
    for case in cases:
        assert case["agreed"], case
        assert isinstance(case["met"], bool) and case["ratio"] > 0, case
        graphc = next(c for c in case["contenders"] if c["name"] == case["graphc"])
        assert graphc["status"] == "ok" and graphc["figure"] > 0 and graphc["rounds"] >= 1
        for c in case["contenders"]:
            if c["status"] == "ok":
                limit = TOLERANCE.get(case["name"], 1e-4)
                assert c["seconds"] > 0 and (c["error"] is None or c["error"] <= limit), c
            else:
                assert c["status"].startswith("skipped: "), c  # a skip says why
    steps = {c["name"]: c for c in cases}
    names = [c["name"] for c in steps["mlp_b8"]["contenders"]]
    assert names == ["graphc cpu", "graphc eager", "torch eager", "torch.compile"]
    compared = [c for c in steps["mlp_b8"]["contenders"] if c["status"] == "ok"]
    assert {"graphc cpu", "graphc eager"} <= {c["name"] for c in compared}


def test_quick_run_markdown_table_shape(quick_run):
    results, markdown, stdout = quick_run
    assert markdown.strip() in stdout
    assert markdown.startswith("command: `python -m benchmarks.run --quick")
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| case |") and len(rows) == 1 + len(QUICK_CASES)
    for row, case in zip(rows[1:], results["cases"]):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, row
        assert cells[0] == case["description"]
        assert cells[3] == case["target"] and cells[4] in ("met", "**missed**")
    targets = [c["target"] for c in results["cases"]]
    assert targets == ["<= 0.6x", "<= 0.35x", "<= 0.35x", "<= 0.5x", "<= 0.5x", "<= 1x",
                       "<= 1x", "<= 1x", "<= 1x", "<= 0.5x", ">= 0.95x", "<= 0.8x", "<= 2 s",
                       "<= 0.3 s"]


def test_a_disagreeing_contender_is_reported_and_not_timed():
    good = Contender("a", run=lambda: None, result=lambda: np.ones(3))
    same = Contender("b", run=lambda: None, result=lambda: np.ones(3) * (1 + 1e-7))
    wrong = Contender("c", run=lambda: None, result=lambda: np.array([1.0, 1.0, 2.0]))

    def broken():
        raise ValueError("no kernel")

    failing = Contender("d", run=lambda: None, result=broken)
    contenders = [good, same, wrong, failing]
    check_agreement(contenders, 1e-5)
    interleaved_medians(contenders, repeat=3, warmup=1)
    assert same.status == "ok" and same.error == pytest.approx(1e-7)
    assert wrong.status.startswith("disagrees: rel. error 1.0e+00") and wrong.seconds is None
    assert failing.status == "failed: ValueError: no kernel" and failing.seconds is None
    assert good.seconds > 0 and good.rounds == 3
    case = CaseResult("x", "x", "b", "a", ("<=", 100.0), contenders)
    assert not case.agreed and case.met is True


def test_targets_on_throughput_and_absolute_seconds():
    fast, slow = Contender("g", run=lambda: None), Contender("np", run=lambda: None)
    fast.seconds, slow.seconds = 1.0, 2.0
    gemm = CaseResult("s", "s", "g", "np", (">=", 0.95), [fast, slow], unit="GFLOP/s",
                      flops=4e9)
    assert gemm.figure(fast) == 4.0 and gemm.ratio == 2.0 and gemm.met is True
    compile_time = CaseResult("c", "c", "g", None, ("<=", 0.3), [fast])
    assert compile_time.ratio == 1.0 and compile_time.met is False
    assert compile_time.target_text == "<= 0.3 s" and gemm.target_text == ">= 0.95x"


def test_only_with_an_unknown_case_names_the_cases():
    with pytest.raises(SystemExit, match="matches no case; the cases are mlp_b64"):
        main(["--only", "vgg"])


def test_run_with_threads_keeps_a_process_that_runs_another_program(monkeypatch):
    """A benchmark's `main` called in-process (as tests do) must never replace the caller's
    process: under pytest that ended the whole run with exit status 0, the rest untested."""
    from benchmarks import harness

    def refuse(*args):
        raise AssertionError(f"os.execv{args} from a benchmark called in-process")

    monkeypatch.setattr(harness.os, "execv", refuse)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    harness.run_with_threads("benchmarks.gemm_neighbours", 1, ["--quick"])
    assert harness._is_main_program("benchmarks.gemm_neighbours") is False


def test_run_with_threads_restarts_a_program_that_runs_the_module(tmp_path):
    """Run as the process's program (`python -m ...`), a benchmark still starts again with
    the thread variables set: a child process prints what it sees after the restart."""
    (tmp_path / "probe_threads.py").write_text(
        "import os, sys\n"
        "from benchmarks.harness import run_with_threads\n"
        "run_with_threads('probe_threads', 1, sys.argv[1:])\n"
        "print('threads', os.environ.get('OMP_NUM_THREADS'), "
        "os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), root])
    out = subprocess.run([sys.executable, "-m", "probe_threads"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "threads 1 1"
