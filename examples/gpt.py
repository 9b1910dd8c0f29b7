"""A nanoGPT-style character model trained on the source of Python's own standard library,
read from disk: the usual PyTorch program with `graphc` in place of `torch`.

    python examples/gpt.py [--steps 200] [--n-layer 4] [--n-embd 128] [--compile]

The model is Karpathy's nanoGPT (token and position embeddings, pre-norm blocks of causal
self-attention through F.scaled_dot_product_attention and a GELU MLP, tied output weights).
Training uses AdamW with weight decay on the matrices only, gradient clipping by global norm,
and a warmup-then-cosine learning rate from optim.lr_scheduler. With --compile the whole step
(forward, loss, backward, clipping, AdamW) runs as one compiled executable on the CPU backend;
the scheduler's learning rate is a runtime input of it, so it is traced once. Prints the loss
as it trains and a sample drawn with torch.multinomial from the top-k logits.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
from dataclasses import dataclass

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


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()  # noqa: N806 (nanoGPT's names)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        device = idx.device
        b, t = idx.size()
        pos = graphc.arange(0, t, dtype=graphc.long, device=device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return optim.AdamW(groups, lr=learning_rate, betas=betas)

    @graphc.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else \
                idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = graphc.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = graphc.multinomial(probs, num_samples=1)
            idx = graphc.cat((idx, idx_next), dim=1)
        return idx


def main(argv: list[str] | None = None) -> tuple[list[float], str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--chars", type=int, default=300_000)
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    graphc.manual_seed(1337)
    device = "cpu"
    text = stdlib_text(args.chars)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = {i: c for i, c in enumerate(chars)}
    data = graphc.tensor([stoi[c] for c in text], dtype=graphc.long)
    n = int(0.9 * len(data))
    train_data = data[:n]

    def get_batch():
        ix = graphc.randint(len(train_data) - args.block_size, (args.batch_size,))
        x = graphc.stack([train_data[i:i + args.block_size] for i in ix.tolist()])
        y = graphc.stack([train_data[i + 1:i + 1 + args.block_size] for i in ix.tolist()])
        return x.to(device), y.to(device)

    config = GPTConfig(block_size=args.block_size, vocab_size=len(chars), n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd)
    model = GPT(config).to(device)
    optimizer = model.configure_optimizers(0.1, args.lr, (0.9, 0.95))
    warmup = max(1, args.steps // 10)
    scheduler = optim.lr_scheduler.SequentialLR(optimizer, [
        optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
        optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.steps - warmup),
                                             eta_min=args.lr / 10),
    ], milestones=[warmup])

    def train_step(x, y):
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.detach()

    step = graphc.compile(train_step, backend="cpu") if args.compile else train_step
    losses = []
    for it in range(args.steps):
        losses.append(float(step(*get_batch())))
        scheduler.step()
        if it % max(1, args.steps // 10) == 0 or it == args.steps - 1:
            print(f"step {it:4d}  loss {losses[-1]:.4f}  lr {scheduler.get_last_lr()[0]:.2e}")

    model.eval()
    prompt = graphc.tensor([[stoi["d"], stoi["e"], stoi["f"]]], dtype=graphc.long)
    out = model.generate(prompt, args.sample, temperature=0.8, top_k=20)[0].tolist()
    sample = "".join(itos[i] for i in out)
    print(sample)
    return losses, sample


if __name__ == "__main__":
    main()
