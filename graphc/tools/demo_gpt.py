"""`graphc demo --model gpt`: a small character-level GPT trained on Python's own source.

The text is the source of Python's standard library, read from disk (no download): every
`.py` file beside the `os` module, in sorted order, up to CHARS characters, as bytes below
128. The model is the usual PyTorch decoder-only transformer written with graphc: token and
position embeddings, pre-norm `nn.TransformerEncoderLayer`s with a causal mask and GELU,
a final LayerNorm and a linear head. The whole training step (forward, cross-entropy,
backward, AdamW update) is compiled on the chosen backend; a progress bar shows the loss.
At the end it prints a sample of generated text (top-k sampling with `graphc.topk` and
`graphc.multinomial`, eager), the compile time and the step time, and writes the loss curve
(`loss.png`) and `summary.txt` into the output folder.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from typing import TextIO

import numpy as np

import graphc
import graphc.nn as nn
import graphc.nn.functional as F

BLOCK, EMBED, HEADS, LAYERS, BATCH = 32, 64, 4, 2, 16
CHARS = 200_000
LEARNING_RATE = 3e-3
SAMPLE_CHARS = 160


def stdlib_text(limit: int = CHARS) -> bytes:
    """The standard library's source as ASCII bytes (others dropped), up to `limit`."""
    folder = os.path.dirname(os.__file__)
    chunks, size = [], 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        try:
            with open(os.path.join(folder, name), "rb") as f:
                data = bytes(b for b in f.read() if b < 128)
        except OSError:
            continue
        chunks.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


class TinyGPT(nn.Module):
    """A decoder-only transformer over 128 byte values."""

    def __init__(self, vocab: int = 128, block: int = BLOCK, embed: int = EMBED,
                 heads: int = HEADS, layers: int = LAYERS) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, embed)
        self.pos = nn.Embedding(block, embed)
        layer = nn.TransformerEncoderLayer(embed, heads, 4 * embed, dropout=0.0,
                                           activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(embed)
        self.head = nn.Linear(embed, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block))

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(graphc.arange(t))
        x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


def batches(data: np.ndarray, rng: np.random.Generator, steps: int):
    """`steps` (inputs, targets) pairs of BATCH random windows of the text."""
    for _ in range(steps):
        starts = rng.integers(0, len(data) - BLOCK - 1, BATCH)
        x = np.stack([data[s:s + BLOCK] for s in starts]).astype(np.int64)
        y = np.stack([data[s + 1:s + BLOCK + 1] for s in starts]).astype(np.int64)
        yield graphc.tensor(x), graphc.tensor(y)


@graphc.no_grad()
def sample(model: TinyGPT, prompt: bytes, n: int, top_k: int = 8) -> str:
    """`n` characters after `prompt`, drawn from the top_k most likely each time (eager)."""
    idx = graphc.tensor(np.frombuffer(prompt, np.uint8).astype(np.int64)[None])
    for _ in range(n):
        logits = model(idx[:, -model.block:])[:, -1, :]
        values, _ = graphc.topk(logits, top_k)
        logits = logits.masked_fill(logits < values[:, [-1]], -math.inf)
        nxt = graphc.multinomial(F.softmax(logits, dim=-1), num_samples=1)
        idx = graphc.cat((idx, nxt), dim=1)
    return bytes(idx[0].tolist()[len(prompt):]).decode("ascii", "replace")


def run(options, out: TextIO | None = None) -> int:
    """Train, sample and report (see the module docstring); returns 0."""
    from tqdm import tqdm

    from graphc.tools.demo import backend_label, check_backend
    from graphc.tools.demo_outputs import prepare_folder

    out = out or sys.stdout
    started = time.perf_counter()
    folder = prepare_folder(options.out)
    check_backend(options.backend)
    text = np.frombuffer(stdlib_text(), np.uint8)
    graphc.manual_seed(options.seed)
    model = TinyGPT()
    opt = graphc.optim.AdamW(model.parameters(), lr=LEARNING_RATE)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = graphc.compile(step, backend=options.backend)
    params = sum(p.numel() for p in model.parameters())
    header = [f"graphc demo: a character-level GPT on Python's standard library, the whole "
              f"training step compiled (backend {backend_label(options.backend)})",
              f"  model  {LAYERS} pre-norm transformer layers, {HEADS} heads, width {EMBED}, "
              f"context {BLOCK}; {params:,} parameters",
              f"  data   {len(text):,} characters of the standard library's source; AdamW lr "
              f"{LEARNING_RATE}, batch {BATCH}, {options.steps} steps, seed {options.seed}"]
    print("\n".join(header), file=out, flush=True)
    losses, step_seconds, compile_seconds = [], [], 0.0
    rng = np.random.default_rng(options.seed)
    with tqdm(total=options.steps, desc="training", unit="step", file=sys.stderr) as bar:
        for x, y in batches(text, rng, options.steps):
            traced = len(compiled._entries)
            start = time.perf_counter()
            losses.append(compiled(x, y).item())
            seconds = time.perf_counter() - start
            if len(compiled._entries) > traced:
                compile_seconds += seconds
            else:
                step_seconds.append(seconds)
            bar.set_postfix_str(f"loss {losses[-1]:.3f}")
            bar.update()
    text_out = sample(model, b"def ", SAMPLE_CHARS)
    plot = _loss_plot(losses, os.path.join(folder, "loss.png"))
    median = statistics.median(step_seconds) * 1e3 if step_seconds else float("nan")
    lines = [f"loss            {losses[0]:.3f} -> {losses[-1]:.3f} "
             f"(uniform guess: {math.log(128):.3f})",
             f"compile time    {compile_seconds:.2f} s for {len(compiled.graphs)} graph"
             f"{'s' * (len(compiled.graphs) != 1)}",
             f"step time       {median:.2f} ms (median of {len(step_seconds)} compiled steps)",
             "sample          def " + text_out.replace("\n", "\n                "),
             f"total time      {time.perf_counter() - started:.1f} s",
             f"wrote           {folder}/",
             f"  loss.png      {plot}",
             "  summary.txt   this report"]
    with open(os.path.join(folder, "summary.txt"), "w") as f:
        f.write("\n".join(header + lines) + "\n")
    print("\n".join(lines), file=out)
    return 0


def _loss_plot(losses: list[float], path: str) -> str:
    """The loss per step as a PNG; returns what it shows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.plot(range(1, len(losses) + 1), losses, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title("graphc demo --model gpt: training loss")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"the training loss over {len(losses)} steps"
