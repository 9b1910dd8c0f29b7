"""Which BLAS the CPU backend calls (graphc.backends.cpu.blas, GRAPHC_BLAS): MKL where the `mkl`
wheel is installed, else OpenBLAS; either gives GEMMs within the rounding rule of float64
(docs/performance.md § Rounding), on one thread and on two, and shares libgomp's team.

Each library runs in a child process (a process resolves its BLAS once, and MKL's threading
layer is chosen once per process), with a cache folder of its own."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("llvmlite")

from graphc import config  # noqa: E402
from graphc.backends.cpu import blas  # noqa: E402
from graphc.errors import ArgumentError, GraphcError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_MKL = blas.mkl_library() is not None

CHILD = textwrap.dedent("""
    import json
    import numpy as np
    import graphc
    from graphc.backends.cpu import blas, threads
    from graphc.testing import assert_rounding_within

    found = blas.resolve_blas()
    rng = np.random.default_rng(7)

    def check(fn, *arrays):
        got = graphc.compile(fn, backend="cpu")(*map(graphc.tensor, arrays)).numpy()
        eager = fn(*map(graphc.tensor, arrays)).numpy()
        wide = fn(*(graphc.tensor(a.astype(np.float64)) for a in arrays)).numpy()
        assert_rounding_within(got, eager, wide)

    def mlp(x, w1, w2):
        return (x @ w1.t()).relu() @ w2

    x = rng.standard_normal((64, 784)).astype(np.float32)
    w1 = rng.standard_normal((256, 784)).astype(np.float32) / 28
    w2 = rng.standard_normal((256, 10)).astype(np.float32) / 16
    check(mlp, x, w1, w2)
    a = rng.standard_normal((96, 40)).astype(np.float32)
    b = rng.standard_normal((96, 72)).astype(np.float32)
    check(lambda a, b: a.t() @ b, a, b)  # a transposed operand
    check(lambda a, b: a[::2, :].t() @ b[1::2, :], a, b)  # strided views
    h = rng.standard_normal((4, 64, 32)).astype(np.float32)
    check(lambda h: h @ h.transpose(1, 2), h)  # batched, attention-shaped
    # every core: an executable held to `most` threads, whose GEMM the BLAS splits
    from graphc.backends.cpu.executable import CpuExecutable
    square = rng.standard_normal((512, 512)).astype(np.float32)
    on_all = CpuExecutable(graphc.trace(lambda s: s @ s, graphc.tensor(square)))
    on_all.thread_chooser = threads.ThreadChooser(threads.most_threads(),
                                                  fixed=threads.most_threads())
    got = on_all.run(square)[0]
    counted = threads.blas_threads()
    wide = square.astype(np.float64)
    assert_rounding_within(got, square @ square, wide @ wide)
    print(json.dumps({"path": found.path, "policy": threads.policy()[found.path],
                      "threads": counted, "most": threads.most_threads()}))
""")


def _run_child(choice: str, tmp_path) -> dict:
    env = dict(os.environ, GRAPHC_BLAS=choice, GRAPHC_CACHE_DIR=str(tmp_path / choice),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("choice", ["openblas", "mkl"])
def test_each_blas_multiplies_within_the_rounding_rule(choice, tmp_path):
    if choice == "mkl" and not HAS_MKL:
        pytest.skip("the mkl wheel is not installed (pip install mkl)")
    report = _run_child(choice, tmp_path)
    assert ("libmkl_rt" in report["path"]) == (choice == "mkl"), report
    assert report["policy"].startswith("shared"), report  # one pool: libgomp's team
    assert report["threads"] == report["most"], report


def test_auto_prefers_mkl_where_installed(monkeypatch):
    monkeypatch.delenv("GRAPHC_BLAS", raising=False)
    first = next(iter(blas.blas_libraries()))
    assert ("libmkl_rt" in first) == HAS_MKL, first
    monkeypatch.setenv("GRAPHC_BLAS", "openblas")
    assert not any("mkl" in path for path in blas.blas_libraries())


def test_mkl_asked_for_but_missing_says_to_install_it(monkeypatch):
    monkeypatch.setenv("GRAPHC_BLAS", "mkl")
    monkeypatch.setattr(blas, "mkl_library", lambda: None)
    blas.resolve_blas.cache_clear()
    try:
        with pytest.raises(GraphcError, match="pip install mkl"):
            blas.resolve_blas()
    finally:
        blas.resolve_blas.cache_clear()
    monkeypatch.undo()
    assert blas.resolve_blas().sgemm


def test_a_bad_graphc_blas_value_is_refused(monkeypatch):
    monkeypatch.setenv("GRAPHC_BLAS", "atlas")
    with pytest.raises(ArgumentError, match="GRAPHC_BLAS: expected 'auto', 'openblas' or 'mkl'"):
        config.blas_choice()
    monkeypatch.setenv("GRAPHC_BLAS", " MKL ")
    assert config.blas_choice() == "mkl"
