"""A batched product against one matrix (a Linear layer on a (B, T, C) input) runs as one
GEMM over the folded batch, with the numbers of the interpreter; an A laid out so that it
does not fold (transposed rows, a time-major view) is packed contiguous first and then folds;
a B per batch element keeps the per-batch loop."""

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402

CASES = [
    ((4, 5, 6), (6, 7), lambda a, b: a @ b, True),
    ((2, 3, 4, 5), (5, 6), lambda a, b: a @ b, True),
    ((4, 5, 6), (1, 6, 7), lambda a, b: a @ b, True),
    ((4, 1, 6), (6, 7), lambda a, b: a @ b, True),
    ((4, 6, 5), (6, 7), lambda a, b: a.transpose(1, 2) @ b, True),  # A transposed: packed
    ((5, 4, 6), (6, 7), lambda a, b: a.transpose(0, 1) @ b, True),  # time-major: packed
    ((3, 5, 4, 6), (6, 7), lambda a, b: a.transpose(0, 2) @ b, True),  # two batch dims
    ((4, 5, 6), (4, 6, 7), lambda a, b: a @ b, False),  # a B per batch element
]


@pytest.mark.parametrize("a_shape, b_shape, f, folds", CASES)
def test_batched_products_match_the_interpreter(a_shape, b_shape, f, folds):
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    a = graphc.tensor(rng.standard_normal(a_shape).astype(np.float32))
    b = graphc.tensor(rng.standard_normal(b_shape).astype(np.float32))
    want = graphc.compile(f, backend="interp")(a, b).numpy()
    compiled = graphc.compile(f, backend="cpu")
    got = compiled(a, b).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the fold reassociates nothing within a dot product, but a BLAS may block K: judged by
    # distance from float64 (docs/performance.md, "Rounding")
    reference = f(a.double(), b.double()).numpy()
    assert_rounding_within(got, f(a, b).numpy(), reference)
    kernel = _kernel_text(compiled.executable.lowered.ir_text, "gemm")
    assert ("d0.head" not in kernel) is folds, "a folded product runs without a batch loop"


def _kernel_text(ir: str, name: str) -> str:
    """The body of the module's kernel whose name ends with `name`."""
    for chunk in ir.split("\ndefine ")[1:]:
        header = chunk.split("(", 1)[0]
        if header.rstrip('"').endswith(name):
            return chunk.split("\n}\n", 1)[0]
    raise AssertionError(f"no {name} kernel in the module")


TRANSPOSED = [(lambda a, b: a.t() @ b, (64, 48), (64, 40)),
              (lambda a, b: a @ b.t(), (48, 64), (40, 64)),
              (lambda a, b: a.t() @ b.t(), (64, 48), (40, 64))]


@pytest.mark.parametrize("f, a_shape, b_shape", TRANSPOSED)
def test_transposed_operands_round_within_twice_eager(f, a_shape, b_shape):
    """Transposed views reach the GEMM as BLAS transpose flags, whose summation order may
    differ from numpy's: the result must stay within 2x eager's distance from a float64 run
    of the same product (docs/performance.md, "Rounding")."""
    rng = np.random.default_rng(3)
    a = graphc.tensor(rng.standard_normal(a_shape).astype(np.float32))
    b = graphc.tensor(rng.standard_normal(b_shape).astype(np.float32))
    got = graphc.compile(f, backend="cpu")(a, b).numpy()
    assert_rounding_within(got, f(a, b).numpy(), f(a.double(), b.double()).numpy())
