"""A character-level LSTM language model trained on the source of Python's own standard
library, read from disk: the usual PyTorch program with `graphc` in place of `torch`.

    python examples/lstm_lm.py [--steps 200] [--seq-len 32] [--batch-size 16] [--compile]

With --compile the whole training step (forward through the unrolled LSTM, backward, Adam
update, gradient clipping by value) runs as one compiled executable on the CPU backend. Prints
the loss as it trains and a sample of generated text.
"""

from __future__ import annotations

import argparse
import os
import pathlib

import numpy as np

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim


def stdlib_text(max_chars: int) -> str:
    """Python source files of the standard library, concatenated in a fixed order."""
    root = pathlib.Path(os.__file__).parent
    parts, total = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


class CharLSTM(nn.Module):
    def __init__(self, vocab_size, embed_dim=32, hidden_size=128, num_layers=2, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=num_layers, batch_first=True,
                            dropout=dropout)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, idx, state=None):
        out, state = self.lstm(self.embed(idx), state)
        return self.head(out), state


def sample(model, stoi, itos, prompt: str, length: int, rng) -> str:
    """Feed the prompt, then draw one character at a time from the softmax."""
    model.eval()
    out = list(prompt)
    with graphc.no_grad():
        idx = graphc.tensor([[stoi.get(c, 0) for c in prompt]])
        logits, state = model(idx)
        for _ in range(length):
            probs = F.softmax(logits[0, -1], dim=-1).numpy().astype(np.float64)
            nxt = int(rng.choice(len(probs), p=probs / probs.sum()))
            out.append(itos[nxt])
            logits, state = model(graphc.tensor([[nxt]]), state)
    model.train()
    return "".join(out)


def main(argv: list[str] | None = None) -> tuple[list[float], str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--chars", type=int, default=200_000)
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    graphc.manual_seed(0)
    rng = np.random.default_rng(0)
    text = stdlib_text(args.chars)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = dict(enumerate(chars))
    data = np.array([stoi[c] for c in text], dtype=np.int64)
    print(f"{len(text)} characters of the standard library, vocabulary {len(chars)}")

    model = CharLSTM(len(chars), hidden_size=args.hidden)
    optimizer = optim.Adam(model.parameters(), lr=3e-3)

    def train_step(x, y):
        optimizer.zero_grad()
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        for p in model.parameters():  # clip by value (nn.utils.clip_grad_value_ by hand)
            p.grad.clamp_(-1.0, 1.0)
        optimizer.step()
        return loss

    step = graphc.compile(train_step, backend="cpu") if args.compile else train_step
    losses = []
    for i in range(args.steps):
        starts = rng.integers(0, len(data) - args.seq_len - 1, args.batch_size)
        window = np.stack([data[s:s + args.seq_len + 1] for s in starts])
        loss = float(step(graphc.tensor(window[:, :-1]), graphc.tensor(window[:, 1:])))
        losses.append(loss)
        if i % 20 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {loss:.4f}")
    text_out = sample(model, stoi, itos, "def ", args.sample, rng)
    print("sample:\n" + text_out)
    return losses, text_out


if __name__ == "__main__":
    main()
