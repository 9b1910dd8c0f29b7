"""Review of the GPT kernels of the eleventh and twelfth sessions as whole training steps: a
seeded fuzzer of small GPTs (benchmarks.model_steps.gpt: pre-norm TransformerEncoder layers,
causal mask, GELU) over embeds off the GPT's 128 (32-96), 1 to 4 heads, contexts off the
vector width (8-64), batches of 1 to 5, one or two layers; several SGD-momentum steps, state
carried from call to call.

Each case runs the same steps compiled for the cpu on one thread and on two (each its own
twin model, the count fixed from the first call; a third twin switching two, one, two
threads from call to call), eagerly (graphc float32) and in PyTorch
2.13 float64, and checks: every thread count gives the same bits (the one-block attention
kernels, the weight gradients' chunks of k, the column sums over row parts all promise it)
where the BLAS does (tests/blas_threads_support.blas_keeps_bits_across_threads: not numpy's
OpenBLAS on a Zen 5, where each count is checked on its own instead); every loss and every
parameter after the steps within 2x eager graphc's distance from float64
(docs/performance.md, "Rounding").
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")
torch = pytest.importorskip("torch", reason="PyTorch 2.13 CPU is the reference")

import graphc  # noqa: E402
from benchmarks.model_steps import VOCAB, gpt  # noqa: E402
from graphc.backends.cpu.blas import resolve_blas  # noqa: E402
from graphc.testing import assert_rounding_within  # noqa: E402
from tests.blas_threads_support import blas_keeps_bits_across_threads  # noqa: E402
from tests.conftest import sgd_step  # noqa: E402
from tests.test_review_s12_resnet_steps_fuzz import fixed_threads  # noqa: E402

resolve_blas()
STEPS = 3


@pytest.fixture(autouse=True)
def _shared_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    embed = int(rng.choice([32, 48, 64, 96]))
    heads = int(rng.choice([h for h in (1, 2, 3, 4) if embed % h == 0 and embed // h >= 8]))
    # contexts of 16-64 keys a multiple of 16 take the one-block attention kernels, 24 and
    # 13 the unfused chain; 512 tokens a step take the weight gradients' chunks of k
    block = int(rng.choice([16, 32, 48, 64, 24, 13]))
    batch = int(rng.choice([1, 3, 5]))
    if seed % 3 == 0 and block % 16 == 0:
        batch = 512 // block
    return {"embed": embed, "heads": heads, "layers": int(rng.choice([1, 2])),
            "block": block, "batch": batch, "data": int(rng.integers(1 << 30))}


@pytest.mark.parametrize("seed", range(5))
def test_small_gpt_training_steps_same_bits_on_two_threads_and_within_rounding(
        seed, monkeypatch):
    case = _case(seed)
    shape = {k: case[k] for k in ("embed", "heads", "layers", "block")}
    what = f"{case}"
    graphc.manual_seed(seed)
    models = [gpt(graphc, **shape) for _ in range(4)]
    for twin in models[1:]:
        twin.load_state_dict(models[0].state_dict())
    reference = gpt(torch, **shape)
    reference.load_state_dict({k: torch.tensor(v.detach().numpy().copy())
                               for k, v in models[0].state_dict().items()})
    reference.double()
    rng = np.random.default_rng(case["data"])
    idx = rng.integers(0, VOCAB, (case["batch"], case["block"]))
    y = rng.integers(0, VOCAB, case["batch"] * case["block"])
    xs, ys = graphc.tensor(idx), graphc.tensor(y)
    eager_step = sgd_step(graphc, models[0])
    runs = {"eager": [eager_step(xs, ys).numpy().copy() for _ in range(STEPS)]}
    for count, model in zip((1, 2), models[1:]):
        fixed_threads(monkeypatch, count)
        compiled = graphc.compile(sgd_step(graphc, model), backend="cpu")
        runs[count] = [compiled(xs, ys).numpy().copy() for _ in range(STEPS)]
    # the thread count switched between calls (as ThreadChooser's trials do): two, one, two
    compiled = graphc.compile(sgd_step(graphc, models[3]), backend="cpu")
    runs["switched"] = []
    for i in range(STEPS):
        runs["switched"].append(compiled(xs, ys).numpy().copy())
        compiled.executable.thread_chooser.current = 1 if i % 2 == 0 else 2
    ref_step = sgd_step(torch, reference)
    want = [ref_step(torch.tensor(idx), torch.tensor(y)).numpy() for _ in range(STEPS)]
    names = [k for k, _ in reference.named_parameters()]
    state = {key: [p.detach().numpy().copy() for p in m.parameters()]
             for key, m in zip(("eager", 1, 2, "switched"), models)}
    want_state = [p.detach().numpy() for p in reference.parameters()]
    same_bits = blas_keeps_bits_across_threads()
    for other in (2, "switched") if same_bits else ():
        for i, (a, b) in enumerate(zip(runs[1], runs[other])):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: loss of step {i}, 1 vs {other}")
        for name, a, b in zip(names, state[1], state[other]):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name}, 1 vs {other}")
    # where the BLAS rounds otherwise on two threads, each count is judged on its own
    for count in (1,) if same_bits else (1, 2, "switched"):
        for i, (g, e, r) in enumerate(zip(runs[count], runs["eager"], want)):
            _within(g, e, r, f"{what}: {count} thread(s), loss of step {i}")
        for name, g, e, r in zip(names, state[count], state["eager"], want_state):
            _within(g, e, r, f"{what}: {count} thread(s), {name} after {STEPS} steps")


def _within(got, eager, want, what: str) -> None:
    try:
        assert_rounding_within(got, eager, want)
    except AssertionError as error:
        raise AssertionError(f"{what}: {error}") from None
