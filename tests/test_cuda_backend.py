"""The cuda backend (graphc.backends.cuda) under the CPU emulation (GRAPHC_CUDA=emu).

Covers: the OpInfo table compiled with backend="cuda" and compared with the interpreter and
the float64 reference, forward and gradients (tests/compile_opinfo.py; every entry's first
sample plus `_REGRESSIONS`, later samples that once failed; GRAPHC_CUDA_ALL_OPINFO=1 runs every
sample; `EXPECTED_REFUSALS` are checked, not skipped); fused kernels (elementwise, reductions,
epilogues); the MLP 784-256-256-10 and LeNet-5 training steps (batch 4) against the
interpreter over a few steps; the on-disk kernel cache (a hit, a corrupt entry rebuilt, the
precompiled emulation header, an unwritable cache folder); randint/randperm bit for bit with
eager; the clear refusal of float64 library ops; and the clear error with no GPU and no
emulation.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import graphc
from graphc import config, nn
from graphc.backends import compile as compile_graph
from graphc.ir import parse
from tests.compile_opinfo import cases, check_case
from tests.conftest import sgd_training_step
from tests.cuda_support import emulation_only

pytestmark = pytest.mark.usefixtures("cuda_runtime_built", "cuda_backend")


# ---- OpInfo ----------------------------------------------------------------------------------
# Every entry's first sample: ~70 s on 2 busy cores (~35 s CPU; a graph's emulated compile
# is ~0.2 s with the precompiled header). GRAPHC_CUDA_ALL_OPINFO=1 runs every sample.
_ALL = list(cases()) if config.cuda_all_opinfo() else [c for c in cases() if c.index == 0]
# later samples that once failed on the cuda backend (wrong results, a crash, a refusal)
_REGRESSIONS = ("matmul/5", "conv2d/6", "max_pool2d/6", "max_pool2d_grad/6",
                "avg_pool2d_grad/8", "random.randint/2", "random.randint/3",
                "random.randperm/1")
_ALL += [c for c in cases() if c.key in _REGRESSIONS and c.key not in {a.key for a in _ALL}]
# case key -> (error class, message regex, why): what the cuda backend refuses, checked
EXPECTED_REFUSALS: dict[str, tuple[type, str, str]] = {}


@pytest.mark.parametrize("case", _ALL, ids=[c.id for c in _ALL])
def test_opinfo_sample_matches(case):
    refusal = EXPECTED_REFUSALS.get(case.key)
    if refusal is not None:
        with pytest.raises(refusal[0], match=refusal[1]):
            check_case(case, "cuda")
        return
    check_case(case, "cuda")


# ---- fused kernels ---------------------------------------------------------------------------
def _run_both(text: str, *arrays):
    g = parse(text)
    got = compile_graph(parse(text), "cuda").run(*arrays)
    want = compile_graph(g, "interp").run(*arrays)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return got


def test_fused_elementwise_with_broadcasting_and_strides(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    (out,) = _run_both('''graph @f(%x: f32[3,4], %b: f32[4]) -> (f32[4,3]) {
  %0: f32[3,4] = fused[body=(("mul", (0, 1), ()), ("tanh", (2,), ())), outputs=(3,)](%x, %b)
  %1: f32[4,3] = permute[dims=(1, 0)](%0)
  %2: f32[4,3] = exp(%1)
  return (%2)
}''', x, b)
    np.testing.assert_allclose(out, np.exp(np.tanh(x * b)).T, rtol=1e-5)


def test_fused_reduction_and_softmax(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    _run_both('''graph @f(%x: f32[3,5]) -> (f32[5], f32[3,5]) {
  %0: f32[5] = fused[body=(("mul", (0, 0), ()), ("reduce_sum", (1,), (("axes", (0,)), ("keepdim", false)))), outputs=(2,)](%x)
  %1: f32[3,5] = fused[body=(("neg", (0,), ()), ("log_softmax", (1,), (("dim", 1),))), outputs=(2,)](%x)
  return (%0, %1)
}''', x)  # noqa: E501


def test_matmul_epilogue_and_transposed_operands(rng):
    a = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    _run_both('''graph @f(%a: f32[4,3], %w: f32[5,3], %b: f32[5]) -> (f32[4,5]) {
  %0: f32[3,5] = permute[dims=(1, 0)](%w)
  %1: f32[4,5] = fused[body=(("matmul", (0, 1), ()), ("add", (3, 2), ()), ("relu", (4,), ())), outputs=(5,)](%a, %0, %b)
  return (%1)
}''', a, w, b)  # noqa: E501


# ---- models ----------------------------------------------------------------------------------
def _track(make_model, x_shape, classes, rng, steps=3):
    def make():
        return sgd_training_step(make_model)

    (m_cuda, s_cuda), (m_ref, s_ref) = make(), make()
    s_cuda, s_ref = graphc.compile(s_cuda, backend="cuda"), graphc.compile(s_ref, backend="interp")
    for _ in range(steps):
        x = graphc.tensor(rng.standard_normal(x_shape).astype(np.float32))
        y = graphc.tensor(rng.integers(0, classes, x_shape[0]))
        np.testing.assert_allclose(s_cuda(x, y).detach().numpy(),
                                   s_ref(x, y).detach().numpy(), rtol=1e-4, atol=1e-5)
    for a, b in zip(m_cuda.parameters(), m_ref.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_mlp_training_step_tracks_the_interpreter(rng):
    _track(lambda: nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                                 nn.ReLU(), nn.Linear(256, 10)), (4, 784), 10, rng)


def test_lenet5_training_step_tracks_the_interpreter(rng):
    _track(lambda: nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10)), (4, 1, 28, 28), 10, rng, steps=2)


# ---- the kernel cache ------------------------------------------------------------------------
_CACHED = '''graph @c(%x: f32[6]) -> (f32[6]) {
  %0: f32[6] = sigmoid(%x)
  return (%0)
}'''


def test_kernel_cache_hit_and_corrupt_entry_rebuilt(tmp_path, monkeypatch):
    from graphc.backends.cuda import compile as cuda_compile

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    x = np.linspace(-3, 3, 6).astype(np.float32)
    first = compile_graph(parse(_CACHED), "cuda")
    assert first.module.from_cache is False
    second = compile_graph(parse(_CACHED), "cuda")
    assert second.module.from_cache is True and second.module.key == first.module.key
    (entry,) = (tmp_path / cuda_compile.CACHE_FORMAT).glob(f"{second.module.key}.*")
    with open(entry, "r+b") as f:  # damage the stored object
        f.seek(64)
        f.write(b"\0garbage\0")
    before = cuda_compile.cache_stats()["corrupt"]
    third = compile_graph(parse(_CACHED), "cuda")
    assert third.module.from_cache is False
    assert cuda_compile.cache_stats()["corrupt"] == before + 1
    np.testing.assert_allclose(third.run(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-6)


@emulation_only
def test_emulated_compiles_use_the_precompiled_header(tmp_path, monkeypatch):
    from graphc.backends.cuda import emu_pch

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    ex = compile_graph(parse(_CACHED), "cuda")
    (gch,) = tmp_path.glob("cuda-*/pch-*/gc_emu.h.gch")
    assert emu_pch.header_for(str(gch.parent.parent), b"", "") == str(gch)[:-len(".gch")]
    x = np.linspace(-3, 3, 6).astype(np.float32)
    np.testing.assert_allclose(ex.run(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_unwritable_cache_folder_costs_only_speed(tmp_path, monkeypatch):
    from graphc.backends.cuda import compile as cuda_compile

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(cuda_compile, "_fallback", [])
    monkeypatch.setattr(cuda_compile, "_warned", [])
    x = np.linspace(-3, 3, 6).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="cannot be written.*GRAPHC_CACHE_DIR"):
        first = compile_graph(parse(_CACHED), "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning comes once per process
        second = compile_graph(parse(_CACHED.replace("sigmoid", "tanh")), "cuda")
    assert os.path.dirname(first.module.path) == cuda_compile._fallback[0]
    np.testing.assert_allclose(first.run(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(second.run(x)[0], np.tanh(x), rtol=1e-6)


# ---- errors ----------------------------------------------------------------------------------
def test_no_gpu_and_no_emulation_is_a_clear_error(monkeypatch):
    from graphc.backends.cuda import rt

    monkeypatch.delenv("GRAPHC_CUDA")
    monkeypatch.setattr(rt, "_cuda_driver_present", lambda: False)
    monkeypatch.setattr(rt, "_runtimes", {})
    with pytest.raises(rt.CudaNoDeviceError,
                       match="no CUDA device found.*set GRAPHC_CUDA=emu"):
        compile_graph(parse(_CACHED), "cuda")


def test_float64_library_ops_are_a_clear_refusal():
    from graphc.backends.cuda.lowering import CudaLoweringError

    g = '''graph @c(%x: f64[1,1,4,4], %w: f64[1,1,3,3]) -> (f64[1,1,2,2]) {
  %0: f64[1,1,2,2] = conv2d[stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1](%x, %w)
  return (%0)
}'''
    with pytest.raises(CudaLoweringError, match=r"conv2d on float64 \(float32 only\).*"
                                                 r"backend=\"cpu\""):
        compile_graph(parse(g), "cuda")


def test_randperm_and_randint_match_eager_bit_for_bit():
    def draw():
        return graphc.randperm(300), graphc.randint(-5, 1 << 40, (64,)), graphc.randint(7, (9,))

    compiled = graphc.compile(draw, backend="cuda")
    for seed in (0, 1):
        graphc.manual_seed(seed)
        want = [t.numpy() for t in draw()]
        graphc.manual_seed(seed)
        compiled(), compiled()  # the first calls of a signature may run eagerly
        graphc.manual_seed(seed)
        got = [t.numpy() for t in compiled()]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert sorted(got[0].tolist()) == list(range(300))


def test_bad_index_raises_after_the_call():
    from graphc.errors import IndexOutOfRangeError

    g = '''graph @t(%w: f32[4,3], %i: i64[2]) -> (f32[2,3]) {
  %0: f32[2,3] = embedding[padding_idx=none](%w, %i)
  return (%0)
}'''
    ex = compile_graph(parse(g), "cuda")
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(ex.run(w, np.array([3, 0]))[0], w[[3, 0]])
    with pytest.raises(IndexOutOfRangeError, match="embedding: an index is out of bounds"):
        ex.run(w, np.array([1, 7]))
