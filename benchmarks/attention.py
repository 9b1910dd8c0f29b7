"""Fused attention at long contexts: graphc with and without `fuse_attention`, next to PyTorch.

    python -m benchmarks.attention --threads 1 --clock cpu
    python -m benchmarks.attention --quick               # a smoke run (small sizes)

Cases:
- `gpt_long`: benchmarks/model_steps.py's GPT (pre-norm `TransformerEncoderLayer`s, causal)
  at n_embd 128, 4 heads, 2 layers, context 1024, batch 2: one training step (cross-entropy,
  SGD momentum), as the other training steps.
- `attention_T<T>`: softmax(q k^T / sqrt(d)) v alone, causal, batch 2, 4 heads, head dim 32,
  forward and backward (the gradients of q, k and v of sum(out * w)).
Contenders: "graphc cpu" (the cpu pipeline: the chain becomes `attention` /
`attention_backward`, graphc/passes/attention.py), "graphc unfused" (the same compiled with
`MIN_SCORE_BYTES` raised so the pass leaves the chain: matmul, scale, mask, softmax, matmul
with the [B, H, T, T] scores in memory, the code before the pass), and PyTorch eager (the
ratio's anchor; `torch.nn.functional.scaled_dot_product_attention` picks its own fused CPU
kernel inside the GPT's layers). Timing and agreement: benchmarks/harness.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import graphc  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    CaseResult,
    Contender,
    check_agreement,
    interleaved_medians,
    markdown_table,
    run_with_threads,
    set_clock,
)

FULL = dict(gpt=dict(embed=128, layers=2, heads=4, block=1024, batch=2),
            attention=(1024, 2048))
QUICK = dict(gpt=dict(embed=16, layers=1, heads=2, block=384, batch=1), attention=(384,))


@contextlib.contextmanager
def unfused():
    """graphc.compile leaves every attention chain unfused while this holds."""
    from graphc.passes import attention

    before = attention.MIN_SCORE_BYTES
    attention.MIN_SCORE_BYTES = 1 << 62
    try:
        yield
    finally:
        attention.MIN_SCORE_BYTES = before


def _unfused_call(fn):
    def call(*args):
        with unfused():
            return fn(*args)
    return call


def gpt_long(shape: dict, repeat: int, warmup: float) -> CaseResult:
    from benchmarks import cases, model_steps

    graphc.manual_seed(0)
    base = model_steps.gpt(graphc, **shape)
    x, y = model_steps.batch_of("gpt", shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)

    def copy():
        other = model_steps.gpt(graphc, **shape)
        other.load_state_dict(base.state_dict())
        return other

    fused_model, plain_model = copy(), copy()
    fused = graphc.compile(models.graphc_step(fused_model), backend="cpu")
    plain = graphc.compile(models.graphc_step(plain_model), backend="cpu")
    contenders = [cases.step_contender("graphc cpu", fused, gx, gy, fused_model, fused),
                  cases.step_contender("graphc unfused", _unfused_call(plain), gx, gy,
                                       plain_model, plain)]
    torch = cases.torch_or_none()
    if torch is not None:
        eager = model_steps.gpt(torch, **shape)
        eager.load_state_dict({k: torch.from_numpy(v.detach().numpy().copy())
                               for k, v in base.state_dict().items()})
        contenders.insert(0, cases.step_contender("torch eager", models.torch_step(eager),
                                                  torch.from_numpy(x), torch.from_numpy(y),
                                                  eager))
    check_agreement(contenders, 1e-3)
    interleaved_medians(contenders, repeat, warmup_seconds=warmup)
    return CaseResult("gpt_long", f"GPT (n_embd {shape['embed']}, {shape['layers']} layers, "
                      f"{shape['heads']} heads, context {shape['block']}) training step, batch "
                      f"{shape['batch']}", "graphc cpu", "torch eager" if torch else
                      "graphc unfused", ("<=", 1.0), contenders)


def attention_case(length: int, repeat: int, warmup: float) -> CaseResult:
    from benchmarks import cases

    batch, heads, dim = 2, 4, 32
    rng = np.random.default_rng(0)
    q, k, v, w = (rng.standard_normal((batch, heads, length, dim)).astype(np.float32)
                  for _ in range(4))

    def graphc_grads(q, k, v, w):
        out = graphc.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out * w).sum().backward()
        return q.grad, k.grad, v.grad

    def contender(name, fn, lib, tensors, compiled=None):
        made = {}

        def run():
            leaves = [lib.tensor(a, requires_grad=True) if i < 3 else lib.tensor(a)
                      for i, a in enumerate(tensors)]
            made["grads"] = fn(*leaves)

        def result():
            return np.concatenate([np.asarray(g.detach().numpy(), np.float64).ravel()
                                   for g in made["grads"]])

        def prepare():
            run()
            run()

        return Contender(name, run, result=result, prepare=prepare)

    fused = graphc.compile(graphc_grads, backend="cpu")
    plain = graphc.compile(graphc_grads, backend="cpu")
    contenders = [contender("graphc cpu", fused, graphc, (q, k, v, w)),
                  contender("graphc unfused", _unfused_call(plain), graphc, (q, k, v, w))]
    torch = cases.torch_or_none()
    if torch is not None:
        def torch_grads(q, k, v, w):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            (out * w).sum().backward()
            return q.grad, k.grad, v.grad

        contenders.insert(0, contender("torch eager", torch_grads, torch, (q, k, v, w)))
    check_agreement(contenders, 1e-4)
    interleaved_medians(contenders, repeat, warmup_seconds=warmup)
    scores = batch * heads * length * length * 4 / 2**20
    return CaseResult(f"attention_T{length}", f"causal attention forward + backward, batch "
                      f"{batch}, {heads} heads, T {length}, head dim {dim} ([B,H,T,T] scores "
                      f"{scores:.0f} MiB)", "graphc cpu",
                      "torch eager" if torch else "graphc unfused", ("<=", 1.0), contenders)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--repeat", type=int, default=None, help="timed rounds per case")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="threads for OpenMP, OpenBLAS and PyTorch (default: every core)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--only", choices=("gpt", "attention"), default=None)
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    run_with_threads("benchmarks.attention", args.threads, argv)
    if args.threads is not None:
        with contextlib.suppress(ImportError):
            import torch
            torch.set_num_threads(args.threads)
    set_clock(args.clock)
    sizes = QUICK if args.quick else FULL
    repeat = args.repeat or (3 if args.quick else 7)
    warmup = 0.0 if args.quick else 1.0
    results = []
    if args.only in (None, "attention"):
        results += [attention_case(t, repeat, warmup) for t in sizes["attention"]]
    if args.only in (None, "gpt"):
        results.append(gpt_long(sizes["gpt"], repeat, warmup))
    load = os.getloadavg()
    print(f"command: python -m benchmarks.attention {' '.join(argv)}; threads "
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}; clock {args.clock}; load average "
          f"at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print(markdown_table(results))
    return 0 if all(r.agreed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["gpt_long", "attention_case", "main", "unfused"]
