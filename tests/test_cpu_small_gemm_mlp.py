"""The MLP's first layers in graphc.backends.cpu.small_gemm's generated kernels (issue 14):
a medium product with k up to MEDIUM_K = 1024 where b fits MEDIUM_B_BYTES (the first
Linear's W [256 x 784] @ x^T in the order graphc.passes.gemm_order picks), and weight
gradients dh^T @ x with a short k (the batch: SHORT_K_MIN..SHORT_K_MAX) in the k-outer
kernel. Each layout, odd sizes included, agrees with the interpreter and is judged by
distance from a float64 run (`assert_rounding_within`); the products the rules leave out
keep the BLAS, and the whole MLP step matches eager within rounding
(docs/performance.md, "The MLP's first layer")."""

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from benchmarks.mlp_gemms import transposed_times, weight_times_transposed  # noqa: E402
from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import small_gemm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.ir import parse  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

if small_gemm.lanes() != 16:
    pytest.skip("medium products and k-outer weight gradients are generated on AVX-512 "
                "hosts only; this host has none", allow_module_level=True)


def _kernels(executable) -> set[str]:
    return set(re.findall(r'define[^@]*@"?(graphc_small_sgemm_\w+)', executable.lowered.ir_text))


def _run_and_judge(text: str, seed: int):
    """Compile `text` for the cpu, run it on random operands and judge its result against
    the interpreter and a float64 run; return the executable."""
    g = parse(text)
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs)
    executable = compile_graph(g, "cpu")
    got = np.asarray(executable.run(a, b)[0])
    want = np.asarray(compile_graph(parse(text), "interp").run(a, b)[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    transposed_b = "%x: f32[" in text and "matmul(%w" in text
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64.T if transposed_b else a64.T @ b64
    blas = a @ b.T if transposed_b else a.T @ b
    assert_rounding_within(got, blas, exact)
    return executable


MEDIUM_LONG_K = [  # (m, n, k): a read row by row, k above the former 512
    (256, 64, 784),  # the MLP's first Linear: k in three blocks of 256 and one of 16
    (384, 48, 1000),  # three row chunks, n in three one-vector panels, k not a block multiple
    (300, 32, 520),  # rows not in whole chunks (a within MEDIUM_A_BYTES): one call
]


@pytest.mark.parametrize("m, n, k", MEDIUM_LONG_K, ids=[f"{m}x{n}x{k}" for m, n, k in
                                                        MEDIUM_LONG_K])
def test_medium_products_with_k_up_to_1024_run_the_generated_kernel(m, n, k):
    executable = _run_and_judge(weight_times_transposed(m, n, k), seed=m * 7 + n + k)
    names = _kernels(executable)
    assert names, "the BLAS ran a medium product with k <= MEDIUM_K"
    assert all(f"x{k}_a{k}_1_" in name for name in names)


SHORT_K = [  # (m, n, k): a read transposed, k the batch
    (256, 256, 64),  # the MLP's second Linear's weight gradient: four column chunks
    (256, 96, 33),  # an odd k, three vectors of columns (not chunked: 96 % 64)
    (144, 64, 128),  # rows that leave a smaller last tile, k at SHORT_K_MAX
]


@pytest.mark.parametrize("m, n, k", SHORT_K, ids=[f"{m}x{n}x{k}" for m, n, k in SHORT_K])
def test_weight_gradients_with_a_short_k_run_the_k_outer_kernel(m, n, k):
    text = transposed_times(m, n, k)
    executable = _run_and_judge(text, seed=m * 5 + n + k)
    names = _kernels(executable)
    assert names and all(name.endswith(("_ko", f"_ko_c{n}")) for name in names), names
    rng = np.random.default_rng(k)
    a, b = (rng.standard_normal(v.type.shape).astype(np.float32) for v in parse(text).inputs)
    results = []
    for count in sorted({1, threads.most_threads()}):  # chunks of columns: the same sums
        executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        results.append(np.asarray(executable.run(a, b)[0]).copy())
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])


def test_the_rules_leave_other_products_to_the_blas():
    """b beyond MEDIUM_B_BYTES (GPT's [512 x 1024] @ [1024 x 128]), a k beyond MEDIUM_K, a
    short-k weight gradient in one-vector panels (the MLP's 256 x 784 x 64: OpenBLAS was
    faster), too few rows, a k beyond SHORT_K_MAX or under SHORT_K_MIN."""
    tile_for = small_gemm.tile_for
    assert tile_for(256, 64, 784, 784, 1, 64, True) is not None
    assert tile_for(512, 128, 1024, 1024, 1, 128) is None  # b 512 KB
    assert tile_for(256, 32, 1040, 1040, 1, 32) is None  # k above MEDIUM_K
    assert tile_for(256, 784, 64, 1, 256, 784) is None  # 49 vectors: one-vector panels
    assert tile_for(256, 768, 64, 1, 256, 768).k_outer
    assert tile_for(112, 256, 64, 1, 112, 256) is None  # m under SHORT_K_MIN_M
    assert tile_for(256, 256, 256, 1, 256, 256) is None  # k between SHORT_K_MAX and LONG_K_MIN
    assert tile_for(256, 256, 16, 1, 256, 256) is None  # k under SHORT_K_MIN
    assert tile_for(256, 2048, 64, 1, 256, 2048) is None  # n above SHORT_K_MAX_MN


def test_the_mlp_training_step_matches_eager_within_rounding():
    """The MLP 784-256-256-10 batch-64 SGD step, compiled (the first Linear's forward and the
    second's weight gradient in the generated kernels), against eager float32 and float64
    runs from the same weights: the losses of three steps and the first layer's weight."""
    from benchmarks import models

    x, y = models.batch("mlp", 64)
    results = {}
    for name, dtype, compile_it in [("compiled", graphc.float32, True),
                                    ("eager", graphc.float32, False),
                                    ("reference", graphc.float64, False)]:
        model = models.graphc_model("mlp").to(dtype)
        step = models.graphc_step(model)
        if compile_it:
            step = graphc.compile(step, backend="cpu")
        xs, ys = graphc.tensor(x).to(dtype), graphc.tensor(y)
        losses = [float(step(xs, ys).item()) for _ in range(3)]
        first = next(iter(model.parameters()))
        results[name] = (np.array(losses), first.detach().numpy().copy())
        if compile_it:
            names = _kernels(step.executable)
            assert any("x64x784_a784_1_" in name for name in names), names
            assert any(name.startswith("graphc_small_sgemm_256x64x64_") and "_ko" in name
                       for name in names), names
    for k in range(2):
        assert_rounding_within(results["compiled"][k], results["eager"][k],
                               results["reference"][k])
