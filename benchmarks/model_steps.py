"""GPT and ResNet-18 training steps, graphc next to PyTorch (the issue-14 anchors).

- `gpt_b16`: a decoder-only transformer (n_embd 128, 4 layers, 4 heads, context 64, vocab
  128; pre-norm `TransformerEncoderLayer`s with a causal mask, GELU), batch 16.
- `resnet18_b32`: ResNet-18 for CIFAR shapes (3x32x32, BasicBlocks 2-2-2-2, width 64,
  BatchNorm), batch 32.
Both are built by one function from either library's `nn` (graphc's and PyTorch's share
these names and parameter layouts), so PyTorch gets a copy of graphc's initial weights
through its state_dict. The step is cross-entropy and SGD momentum, as the other training
steps (benchmarks/models.py). `--quick` shrinks both to a smoke size.
"""

from __future__ import annotations

import numpy as np

import graphc
from benchmarks import models
from benchmarks.harness import CaseResult, Contender, check_agreement, interleaved_medians

FULL = {"gpt": dict(embed=128, layers=4, heads=4, block=64, batch=16),
        "resnet18": dict(width=64, size=32, batch=32)}
QUICK = {"gpt": dict(embed=16, layers=1, heads=2, block=8, batch=2),
         "resnet18": dict(width=4, size=8, batch=2)}
VOCAB, CLASSES = 128, 10


def gpt(lib, embed: int, layers: int, heads: int, block: int, **_):
    """The GPT of `lib` (graphc or torch): logits (B*T, vocab) from token ids (B, T)."""
    nn = lib.nn

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, embed)
            self.pos = nn.Embedding(block, embed)
            layer = nn.TransformerEncoderLayer(embed, heads, 4 * embed, dropout=0.0,
                                               activation="gelu", batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(embed)
            self.head = nn.Linear(embed, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block))

        def forward(self, idx):
            x = self.tok(idx) + self.pos(lib.arange(idx.shape[1]))
            x = self.blocks(x, mask=self.mask, is_causal=True)
            return self.head(self.norm(x)).reshape(-1, VOCAB)

    return GPT()


def resnet18(lib, width: int, **_):
    """ResNet-18 (CIFAR stem) of `lib`."""
    nn = lib.nn

    def block(cin, cout, stride):
        body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(),
                             nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        return body, short

    class Residual(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body, self.short = block(cin, cout, stride)

        def forward(self, x):
            return (self.body(x) + self.short(x)).relu()

    layers, cin = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()], \
        width
    for k, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
        for j in range(2):
            layers.append(Residual(cin, cout, 2 if k and not j else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, CLASSES)]
    return nn.Sequential(*layers)


def batch_of(name: str, shape: dict, seed: int = 1):
    """(x, y) as numpy arrays for one step of `name` at `shape`."""
    rng = np.random.default_rng(seed)
    if name == "gpt":
        x = rng.integers(0, VOCAB, (shape["batch"], shape["block"]))
        y = rng.integers(0, VOCAB, shape["batch"] * shape["block"])
        return x, y
    x = rng.standard_normal((shape["batch"], 3, shape["size"], shape["size"]))
    return x.astype(np.float32), rng.integers(0, CLASSES, shape["batch"])


def model_step(name: str, quick: bool, repeat: int, torch_compile: bool,
               warmup_seconds: float) -> CaseResult:
    """One table row: the compiled graphc step against eager graphc, PyTorch eager and
    torch.compile, from the same weights and batch."""
    from benchmarks import cases

    shape = (QUICK if quick else FULL)[name]
    build = gpt if name == "gpt" else resnet18
    graphc.manual_seed(0)
    base = build(graphc, **shape)
    x, y = batch_of(name, shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)

    def graphc_copy():
        other = build(graphc, **shape)
        other.load_state_dict(base.state_dict())
        return other

    compiled_model = graphc_copy()
    compiled = graphc.compile(models.graphc_step(compiled_model), backend="cpu")
    eager_model = graphc_copy()
    contenders = [
        cases.step_contender("graphc cpu", compiled, gx, gy, compiled_model, compiled),
        cases.step_contender("graphc eager", models.graphc_step(eager_model), gx, gy,
                             eager_model),
    ]
    torch = cases.torch_or_none()
    if torch is None:
        contenders += [Contender(n, run=lambda: None, status="skipped: torch is not installed")
                       for n in ("torch eager", "torch.compile")]
    else:
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def torch_copy():
            other = build(torch, **shape)
            other.load_state_dict({k: torch.from_numpy(v.detach().numpy().copy())
                                   for k, v in base.state_dict().items()})
            return other

        eager = torch_copy()
        contenders.append(cases.step_contender("torch eager", models.torch_step(eager), tx,
                                               ty, eager))
        if torch_compile:
            tc_model = torch_copy()
            contenders.append(cases.step_contender(
                "torch.compile", torch.compile(models.torch_step(tc_model)), tx, ty,
                tc_model))
        else:
            contenders.append(Contender("torch.compile", lambda: None,
                                        status="skipped: --quick"))
    contenders.sort(key=lambda c: c.name != "torch eager")
    check_agreement(contenders, 1e-3)  # deep float32 steps: summation orders differ more
    interleaved_medians(contenders, repeat, warmup_seconds=warmup_seconds)
    contenders.sort(key=lambda c: ["graphc cpu", "graphc eager", "torch eager",
                                   "torch.compile"].index(c.name))
    label = (f"GPT (n_embd {shape['embed']}, {shape['layers']} layers, context "
             f"{shape['block']})" if name == "gpt" else
             f"ResNet-18 ({shape['size']}x{shape['size']}, width {shape['width']})")
    return CaseResult(f"{name}_b{shape['batch']}", f"{label} training step, batch "
                      f"{shape['batch']}", "graphc cpu", "torch eager", ("<=", 0.5),
                      contenders)
