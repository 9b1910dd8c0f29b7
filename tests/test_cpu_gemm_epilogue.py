"""A fused GEMM's elementwise epilogue (a Linear's bias and GELU, and in a training step the
GELU's derivative) runs row chunk by row chunk inside the medium kernel's loop
(graphc.backends.cpu.gemm_epilogue): the same bits as the separate elementwise kernel at one
and two threads, within rounding of a float64 run, next to PyTorch's exact (erf) and tanh
GELU; epilogues it cannot fold keep their kernel."""

import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends.cpu import gemm_epilogue, small_gemm, threads  # noqa: E402
from graphc.backends.cpu.threads import ThreadChooser  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

if small_gemm.lanes() != 16:
    pytest.skip("medium products (the row chunks) are AVX-512 only", allow_module_level=True)


def _gelu(x, w, bias):  # GPT's first Linear: x @ W^T + b, then the exact GELU
    return F.gelu(x @ w.t() + bias)


def _gelu_tanh(x, w, bias):
    return F.gelu(x @ w.t() + bias, approximate="tanh")


def _bias_scaled(x, w, bias):  # b read as laid out (W [k, n]), a multiply in the body
    return (x @ w + bias) * 0.5


def _inputs(x_shape, w_shape, seed):
    rng = np.random.default_rng(seed)
    k = x_shape[-1]
    arrays = (rng.standard_normal(x_shape), rng.standard_normal(w_shape) / np.sqrt(k),
              rng.standard_normal(w_shape[0] if w_shape[-1] == k else w_shape[-1]))
    return [graphc.tensor(a.astype(np.float32)) for a in arrays]


def _compiled(f, fold: bool, args):
    """f compiled (traced and lowered by its first call) with or without folding."""
    saved = gemm_epilogue.FOLD
    gemm_epilogue.FOLD = fold
    try:
        compiled = graphc.compile(f, backend="cpu")
        compiled(*args)
        return compiled
    finally:
        gemm_epilogue.FOLD = saved


def _results(compiled, args, counts):
    out = []
    for count in counts:
        compiled.executable.thread_chooser = ThreadChooser(threads.most_threads(), fixed=count)
        out.append(compiled(*args).numpy())
    return out


CASES = [  # (f, x shape, w shape)
    (_gelu, (16, 64, 128), (512, 128)),  # GPT: 8 row chunks of [128 x 512], W^T packed
    (_gelu_tanh, (4, 64, 128), (384, 128)),  # two chunks, 12 panels
    (_bias_scaled, (512, 96), (96, 128)),  # k 96, b as laid out
]


@pytest.mark.parametrize("f, x_shape, w_shape", CASES,
                         ids=[f"{f.__name__}-{x}-{w}" for f, x, w in CASES])
def test_the_epilogue_runs_in_the_row_chunks_with_the_same_bits(f, x_shape, w_shape):
    args = _inputs(x_shape, w_shape, sum(x_shape) + w_shape[0])
    counts = sorted({1, threads.most_threads()})
    folded, unfolded = _compiled(f, True, args), _compiled(f, False, args)
    got = _results(folded, args, counts)
    want = _results(unfolded, args, counts[:1])[0]
    text = folded.executable.lowered.ir_text
    assert re.search(r"graphc_small_sgemm_128x\d+x\d+_\w*_bp_", text), "no chunked medium kernel"
    assert len(folded.executable.lowered.kernel_nodes) \
        == len(unfolded.executable.lowered.kernel_nodes) - 1  # the epilogue's own kernel
    for result in got:  # the same instructions per element, on any number of threads
        np.testing.assert_array_equal(result, want)
    np.testing.assert_allclose(got[0], graphc.compile(f, backend="interp")(*args).numpy(),
                               rtol=1e-4, atol=1e-4)
    assert_rounding_within(got[0], f(*args).numpy(), f(*(a.double() for a in args)).numpy())


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_pytorch_to_float32_rounding(approximate):
    torch = pytest.importorskip("torch")
    args = _inputs((4, 64, 128), (512, 128), 7)

    def f(x, w, bias):
        return F.gelu(x @ w.t() + bias, approximate=approximate)

    got = _compiled(f, True, args)(*args).numpy()
    x, w, bias = (torch.from_numpy(a.numpy()) for a in args)
    want = torch.nn.functional.gelu(x @ w.t() + bias, approximate=approximate).numpy()
    exact = torch.nn.functional.gelu(x.double() @ w.double().t() + bias.double(),
                                     approximate=approximate).numpy()
    assert_rounding_within(got, want, exact)  # as close to float64 as PyTorch's float32


def test_a_training_step_with_gelu_has_the_same_bits_folded():
    """An MLP block's step: the forward's epilogue writes GELU(h) and its derivative (both
    outputs of the chunked body); losses and weights after two SGD steps, folded or not."""
    def run(fold: bool, dtype=np.float32, compiled=True):
        graphc.manual_seed(0)
        fc1, fc2 = graphc.nn.Linear(128, 512), graphc.nn.Linear(512, 128)
        params = list(fc1.parameters()) + list(fc2.parameters())
        if dtype is np.float64:
            for p in params:
                p.data = p.data.double()
        opt = graphc.optim.SGD(params, lr=0.05)

        def step(x, y):
            opt.zero_grad()
            loss = ((fc2(F.gelu(fc1(x))) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        rng = np.random.default_rng(3)
        x, y = (graphc.tensor(rng.standard_normal((1024, 128)).astype(dtype)) for _ in range(2))
        saved = gemm_epilogue.FOLD
        gemm_epilogue.FOLD = fold
        try:
            fn = graphc.compile(step, backend="cpu") if compiled else step
            losses = [float(fn(x, y)) for _ in range(2)]
        finally:
            gemm_epilogue.FOLD = saved
        return losses, fc1.weight.detach().numpy().copy()

    (losses, w), (losses_unfolded, w_unfolded) = run(True), run(False)
    assert losses == losses_unfolded
    np.testing.assert_array_equal(w, w_unfolded)
    eager_losses, eager_w = run(True, compiled=False)
    _, reference_w = run(True, np.float64, compiled=False)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    assert_rounding_within(w, eager_w, reference_w)


def _broadcast_rows(x, w, bias):  # a [4, 1, 512] operand: c's rows do not fold over it
    return F.gelu(x @ w.t() + bias)


def _blas_product(x, w, bias):  # 40 columns: not whole vectors, the BLAS's product
    return F.gelu(x @ w.t())


KEPT = [(_broadcast_rows, (4, 64, 128), (512, 128)), (_blas_product, (4, 64, 128), (40, 128))]


@pytest.mark.parametrize("f, x_shape, w_shape", KEPT, ids=[f.__name__ for f, _, _ in KEPT])
def test_other_epilogues_keep_their_kernel(f, x_shape, w_shape):
    args = _inputs(x_shape, w_shape, 11)
    if f is _broadcast_rows:
        args[2] = graphc.tensor(np.linspace(-1, 1, 4 * 512, dtype=np.float32).reshape(4, 1, 512))
    folded = _compiled(f, True, args)
    got = folded(*args).numpy()
    assert len(folded.executable.lowered.kernel_nodes) \
        == len(_compiled(f, False, args).executable.lowered.kernel_nodes)
    np.testing.assert_allclose(got, graphc.compile(f, backend="interp")(*args).numpy(),
                               rtol=1e-4, atol=1e-4)
