"""GPT and ResNet-18 training steps, graphc next to PyTorch (the issue-14 anchors).

- `gpt_b16`: a decoder-only transformer (n_embd 128, 4 layers, 4 heads, context 64, vocab
  128; pre-norm `TransformerEncoderLayer`s with a causal mask, GELU), batch 16.
- `resnet18_b32`: ResNet-18 for CIFAR shapes (3x32x32, BasicBlocks 2-2-2-2, width 64,
  BatchNorm), batch 32.
Both are built by one function from either library's `nn` (graphc's and PyTorch's share
these names and parameter layouts), so PyTorch gets a copy of graphc's initial weights
through its state_dict. The step is cross-entropy and SGD momentum, as the other training
steps (benchmarks/models.py). `--quick` shrinks both to a smoke size.

The compile-time benchmark (benchmarks/model_compile.py) also times four more of issue 12's
families, graphc only, each with its example's optimizer (`training_step(name, shape)`):
- `lstm`: examples/lstm_lm.py's CharLSTM (vocabulary 96, embedding 32, 2 LSTM layers of
  hidden 128, dropout 0.1), sequence 32, batch 16; Adam (lr 3e-3), gradients clamped to
  [-1, 1] by value.
- `vae`: examples/vae.py's VAE (64-128-4 MLP encoder, SiLU, 4-128-64 decoder, noise drawn
  in the step), batch 64; Adam (lr 1e-3).
- `dcgan`: examples/dcgan.py's generator (nz 16, 3 transposed convolutions to 1x16x16,
  width 32) and discriminator (3 convolutions, width 32), batch 32; one step is the
  discriminator update then the generator update, each with its own Adam (lr 2e-4, betas
  0.5, 0.999), BCE with logits.
- `mobilenet`: tests/test_models_vision.py's MobileNet-style net (depthwise-separable blocks,
  BatchNorm, Hardswish and ReLU6) at CIFAR size: a 3->32 stride-2 stem and four separable
  blocks 32-64-128-128-256 (strides 1, 2, 1, 2) on 3x32x32, pooled, 256-128-10 head,
  batch 32; cross-entropy and SGD momentum.
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
COMPILE_ONLY = {"lstm": dict(vocab=96, embed=32, hidden=128, layers=2, seq=32, batch=16),
                "vae": dict(features=64, hidden=128, latent=4, batch=64),
                "dcgan": dict(nz=16, width=32, batch=32),
                "mobilenet": dict(width=32, size=32, batch=32)}


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
            x = self.tok(idx) + self.pos(lib.arange(idx.shape[1], device=idx.device))
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


def build(lib, name: str, shape: dict):
    """The model `name` ("gpt" or "resnet18") of `lib` (graphc or torch) at `shape`."""
    return (gpt if name == "gpt" else resnet18)(lib, **shape)


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
    graphc.manual_seed(0)
    base = build(graphc, name, shape)
    x, y = batch_of(name, shape)
    gx, gy = graphc.tensor(x), graphc.tensor(y)

    def graphc_copy():
        other = build(graphc, name, shape)
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
            other = build(torch, name, shape)
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
    # deep float32 steps: summation orders differ more. The quick ResNet-18 (BatchNorm over 2
    # images at 1x1 in its last stage) is ill-conditioned: after 3 steps PyTorch float32 is
    # 3.3e-3 from PyTorch float64, graphc eager 4.0e-3, compiled on OpenBLAS 2.7e-3 and on
    # MKL 1.5e-3, but 2.1e-3 from PyTorch float32 (docs/performance.md, "The BLAS: MKL")
    check_agreement(contenders, 5e-3 if quick and name == "resnet18" else 1e-3)
    interleaved_medians(contenders, repeat, warmup_seconds=warmup_seconds)
    contenders.sort(key=lambda c: ["graphc cpu", "graphc eager", "torch eager",
                                   "torch.compile"].index(c.name))
    label = (f"GPT (n_embd {shape['embed']}, {shape['layers']} layers, context "
             f"{shape['block']})" if name == "gpt" else
             f"ResNet-18 ({shape['size']}x{shape['size']}, width {shape['width']})")
    return CaseResult(f"{name}_b{shape['batch']}", f"{label} training step, batch "
                      f"{shape['batch']}", "graphc cpu", "torch eager", ("<=", 0.5),
                      contenders)


def mobilenet(lib, width: int, **_):
    """tests/test_models_vision.py's MobileNet-style net at CIFAR size (3x32x32 inputs)."""
    nn = lib.nn

    def separable(cin, cout, stride, act):
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
            act(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), act())

    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.Hardswish(),
        separable(w, 2 * w, 1, nn.ReLU6), separable(2 * w, 4 * w, 2, nn.Hardswish),
        separable(4 * w, 4 * w, 1, nn.ReLU6), separable(4 * w, 8 * w, 2, nn.Hardswish),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * w, 4 * w), nn.Hardswish(),
        nn.Linear(4 * w, CLASSES))


def _lstm_step(vocab: int, embed: int, hidden: int, layers: int, seq: int, batch: int):
    """examples/lstm_lm.py's model (with its inter-layer dropout) and training step (Adam,
    gradients clamped by value): benchmarks/family_steps.py's builders."""
    from benchmarks import family_steps

    shape = dict(vocab=vocab, embed=embed, hidden=hidden, layers=layers, seq=seq, batch=batch)
    model = family_steps.char_lstm(graphc, dropout=0.1, **shape)
    return family_steps.lstm_step(graphc, model), family_steps.batch("lstm", shape)


def _vae_step(features: int, hidden: int, latent: int, batch: int):
    """examples/vae.py's model and training step (Adam), with the noise drawn in the step:
    benchmarks/family_steps.py's builders."""
    from benchmarks import family_steps

    shape = dict(features=features, hidden=hidden, latent=latent, batch=batch)
    model = family_steps.vae(graphc, **shape)
    train = family_steps.vae_step(graphc, model)

    def step(x):
        return train(x, graphc.randn(x.shape[0], model.fc_mu.out_features))

    return step, family_steps.batch("vae", shape)[:1]


def _dcgan_step(nz: int, width: int, batch: int):
    """examples/dcgan.py's generator, discriminator and step: the discriminator's Adam
    update on real and (detached) fake images, then the generator's through it (the runtime
    benchmark's builders, benchmarks/family_steps.py: no random draws inside this step)."""
    from benchmarks import family_steps

    shape = dict(nz=nz, width=width, batch=batch)
    step = family_steps.dcgan_step(graphc, family_steps.dcgan(graphc, **shape))
    return step, family_steps.batch("dcgan", shape)


def training_step(name: str, shape: dict):
    """(step, numpy arguments) of the compile-only family `name` (COMPILE_ONLY) at `shape`."""
    if name == "mobilenet":
        model = mobilenet(graphc, **shape)
        step = models.graphc_step(model)
        x, y = batch_of("resnet18", shape)
        return step, (x, y)
    make = {"lstm": _lstm_step, "vae": _vae_step, "dcgan": _dcgan_step}[name]
    return make(**shape)


def graphc_gpt_step(quick: bool):
    """(graphc training step, its arguments as tensors) of the GPT case, at the quick or the
    full size (for the in-process A/Bs of benchmarks/gpt_gemms.py and gelu_epilogue.py)."""
    shape = (QUICK if quick else FULL)["gpt"]
    step = models.graphc_step(gpt(graphc, **shape))
    return step, tuple(graphc.tensor(a) for a in batch_of("gpt", shape))
