"""Issue 12's criterion for the transformer family: a small nanoGPT-style model (the natural
PyTorch program, written once over a library namespace: torch or graphc) trains 5 steps with
AdamW, gradient clipping by global norm and a LinearLR warmup, from the same weights, in
PyTorch float64, PyTorch float32, graphc eager float32 and graphc compiled (backend="cpu")
float32. Each graphc run's parameters must end within

    max(10 * (PyTorch float32's own distance from PyTorch float64), 1e-4)

of PyTorch float64's (largest absolute difference over all parameters). Also: the compiled
step traces once for the changing learning rate, and the example examples/gpt.py runs."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

import graphc
from tests.cuda_support import built_test_runtime, cuda_test_kind
from tests.torch_parity import torch

STEPS = 5
VOCAB, BLOCK, EMBD, HEADS, LAYERS, BATCH = 16, 8, 16, 2, 2, 4


def build_gpt(lib):
    """nanoGPT's model over `lib` (torch or graphc): the same code for both."""
    nn, F = lib.nn, lib.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            # no bias on q, k, v: the key bias has no gradient (softmax ignores a shift per
            # query), so Adam turns its rounding noise into +-lr steps that test nothing
            self.c_attn = nn.Linear(EMBD, 3 * EMBD, bias=False)
            self.c_proj = nn.Linear(EMBD, EMBD)

        def forward(self, x):
            B, T, C = x.size()  # noqa: N806
            q, k, v = self.c_attn(x).split(EMBD, dim=2)
            q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(EMBD), CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(EMBD)
            self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(),
                                     nn.Linear(4 * EMBD, EMBD))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
            self.h = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(EMBD)
            self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
            self.wte.weight = self.lm_head.weight  # weight tying

        def forward(self, idx, targets):
            t = idx.size(1)
            pos = lib.arange(0, t, dtype=lib.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    return GPT()


def _train(lib, model, batches, compiled=False):
    opt = lib.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = lib.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=STEPS)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        lib.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        return loss

    if compiled:
        fn = graphc.compile(step, backend="cpu" if compiled is True else compiled)
    else:
        fn = step
    for x, y in batches:
        fn(lib.tensor(x), lib.tensor(y))
        sched.step()
    return fn


def _params(model) -> dict:
    return {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}


def _distance(a: dict, b: dict) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def test_gpt_trains_like_pytorch():
    rng = np.random.default_rng(12)
    batches = [(rng.integers(0, VOCAB, (BATCH, BLOCK)), rng.integers(0, VOCAB, (BATCH, BLOCK)))
               for _ in range(STEPS)]
    torch.manual_seed(0)
    reference = build_gpt(torch).double()
    start = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    t32 = build_gpt(torch).float()
    t32.load_state_dict(start)
    runs = {}
    for name in ("eager", "compiled"):
        model = build_gpt(graphc)
        model.load_state_dict({k: graphc.tensor(v.float().numpy()) for k, v in start.items()})
        runs[name] = model
    _train(torch, reference, batches)
    _train(torch, t32, batches)
    _train(graphc, runs["eager"], batches)
    compiled = _train(graphc, runs["compiled"], batches, compiled=True)

    want = _params(reference)
    own = _distance(_params(t32), want)
    tolerance = max(10 * own, 1e-4)
    moved = _distance(want, {k: v.numpy() for k, v in start.items()})
    assert moved > 2 * tolerance, "training moved the weights too little to test anything"
    for name, model in runs.items():
        d = _distance(_params(model), want)
        assert d <= tolerance, (f"graphc {name}: {d:.3g} from PyTorch float64, allowed "
                                f"{tolerance:.3g} (PyTorch float32 is {own:.3g} away)")
    assert not any("lr" in r for rs in compiled.recompile_reasons for r in rs)
    assert len(compiled.graphs) <= 2, compiled.recompile_reasons  # the 2nd: lazy AdamW state


@pytest.mark.skipif(importlib.util.find_spec("llvmlite") is None,
                    reason="the example compiles for the CPU backend")
def test_gpt_example_smoke(capsys):
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "gpt.py"
    spec = importlib.util.spec_from_file_location("example_gpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the example's dataclass looks its module up
    spec.loader.exec_module(module)
    args = ["--steps", "3", "--n-layer", "1", "--n-embd", "32", "--block-size", "16",
            "--batch-size", "4", "--chars", "20000", "--sample", "10"]
    eager, sample = module.main(args)
    compiled, _ = module.main(args + ["--compile"])
    assert all(math.isfinite(v) for v in eager) and len(sample) == 13
    np.testing.assert_allclose(eager, compiled, rtol=1e-4)
    assert "loss" in capsys.readouterr().out


def test_gpt_step_on_emulated_cuda_matches_eager(monkeypatch, tmp_path):
    """The same training step (AdamW, clipping, a scheduled lr) compiled for the cuda backend
    under the CPU emulation (GRAPHC_CUDA=emu) tracks eager graphc."""
    monkeypatch.setenv("GRAPHC_CUDA", cuda_test_kind())
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    built_test_runtime()
    rng = np.random.default_rng(5)
    batches = [(rng.integers(0, VOCAB, (BATCH, BLOCK)), rng.integers(0, VOCAB, (BATCH, BLOCK)))
               for _ in range(3)]
    graphc.manual_seed(0)
    eager, emulated = build_gpt(graphc), build_gpt(graphc)
    emulated.load_state_dict(eager.state_dict())
    _train(graphc, eager, batches)
    _train(graphc, emulated, batches, compiled="cuda")
    assert _distance(_params(eager), _params(emulated)) < 1e-5
