"""LSTM, VAE, DCGAN and MobileNet training steps, graphc next to PyTorch (issue 14's
real-model rows beyond GPT and ResNet-18).

The four families of benchmarks/model_steps.py's COMPILE_ONLY, at those sizes, each built by
one function from either library (`lib` is graphc or torch: their `nn`, `optim` and tensor
functions share these names and parameter layouts), so PyTorch gets a copy of graphc's
initial weights through state_dict and every contender runs the same step on the same batch:
- `lstm_b16`: examples/lstm_lm.py's CharLSTM (embedding, 2-layer LSTM, linear head), Adam
  (lr 3e-3), gradients clamped to [-1, 1] by value.
- `vae_b64`: examples/vae.py's VAE (SiLU MLP encoder and decoder, BCE-with-logits + KL), Adam.
- `dcgan_b32`: examples/dcgan.py's generator and discriminator, one discriminator Adam update
  then one generator Adam update per step, BCE with logits.
- `mobilenet_b32`: the MobileNet-style net (depthwise-separable blocks, BatchNorm, Hardswish,
  ReLU6) at CIFAR size, cross-entropy and SGD momentum.
Where the examples draw random numbers inside the step, the benchmark makes them inputs so
that the libraries can agree: the VAE's reparameterisation noise is drawn once with the
batch (the step still multiplies and adds it), and the LSTM runs without inter-layer dropout
(graphc's and PyTorch's generators draw different masks). benchmarks/model_compile.py keeps
the examples' random steps for compile times. Agreement: the losses of the third step and the
first parameter of every network, relative error within 1e-3 (deep float32 steps, Adam).
The target is issue 14's "ahead of PyTorch": graphc compiled <= 1.0x PyTorch eager.
"""

from __future__ import annotations

import numpy as np

import graphc
from benchmarks import cases, models
from benchmarks.harness import CaseResult, Contender, check_agreement, interleaved_medians
from benchmarks.model_steps import COMPILE_ONLY, batch_of, mobilenet

FULL = {name: dict(shape) for name, shape in COMPILE_ONLY.items()}
QUICK = {"lstm": dict(vocab=16, embed=8, hidden=8, layers=2, seq=4, batch=2),
         "vae": dict(features=8, hidden=8, latent=2, batch=4),
         "dcgan": dict(nz=4, width=4, batch=2),
         "mobilenet": dict(width=4, size=16, batch=4)}
TARGET = 1.0
TOLERANCE = 1e-3
DESCRIPTIONS = {
    "lstm": "CharLSTM (embed {embed}, {layers}x LSTM {hidden}, seq {seq}), Adam",
    "vae": "VAE ({features}-{hidden}-{latent} MLP), Adam",
    "dcgan": "DCGAN (nz {nz}, width {width}, 16x16), D then G Adam updates",
    "mobilenet": "MobileNet-style (width {width}, {size}x{size}), SGD momentum"}


# ---- the networks, from either library ------------------------------------------------------
def char_lstm(lib, vocab: int, embed: int, hidden: int, layers: int, dropout: float = 0.0,
              **_):
    """examples/lstm_lm.py's CharLSTM (here without dropout unless given: the libraries draw
    different masks): logits (B, T, vocab) from ids (B, T)."""
    nn = lib.nn

    class CharLSTM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, embed)
            self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True,
                                dropout=dropout)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, idx):
            out, _ = self.lstm(self.embed(idx))
            return self.head(out)

    return CharLSTM()


def vae(lib, features: int, hidden: int, latent: int, **_):
    """examples/vae.py's VAE; forward(x, noise) takes the reparameterisation noise."""
    nn = lib.nn

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(features, hidden), nn.SiLU())
            self.fc_mu = nn.Linear(hidden, latent)
            self.fc_logvar = nn.Linear(hidden, latent)
            self.decoder = nn.Sequential(nn.Linear(latent, hidden), nn.SiLU(),
                                         nn.Linear(hidden, features))

        def forward(self, x, noise):
            h = self.encoder(x)
            mu, logvar = self.fc_mu(h), self.fc_logvar(h)
            std = lib.exp(0.5 * logvar)
            return self.decoder(mu + noise * std), mu, logvar

    return VAE()


def dcgan(lib, nz: int, width: int, **_):
    """examples/dcgan.py's generator (nz -> 1x16x16) and discriminator, as one module."""
    nn = lib.nn
    ngf = ndf = width

    class GAN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator = nn.Sequential(
                nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2),
                nn.ReLU(True),
                nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf),
                nn.ReLU(True),
                nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False), nn.Tanh())
            self.discriminator = nn.Sequential(
                nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Flatten(0))

    return GAN()


BUILDERS = {"lstm": char_lstm, "vae": vae, "dcgan": dcgan, "mobilenet": mobilenet}


# ---- the training steps, from either library ------------------------------------------------
def lstm_step(lib, model):
    """Cross-entropy over every position, backward, clamp the gradients, Adam."""
    optimizer = lib.optim.Adam(model.parameters(), lr=3e-3)
    functional = lib.nn.functional

    def step(x, y):
        optimizer.zero_grad()
        logits = model(x)
        loss = functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        for p in model.parameters():
            p.grad.clamp_(-1.0, 1.0)
        optimizer.step()
        return loss.detach()

    return step


def vae_step(lib, model):
    """Reconstruction (BCE with logits, summed) + KL divergence per sample, backward, Adam."""
    optimizer = lib.optim.Adam(model.parameters(), lr=1e-3)
    functional = lib.nn.functional

    def step(x, noise):
        optimizer.zero_grad()
        logits, mu, logvar = model(x, noise)
        recon = functional.binary_cross_entropy_with_logits(logits, x, reduction="sum")
        kld = -0.5 * lib.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = (recon + kld) / x.shape[0]
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def dcgan_step(lib, model):
    """The discriminator's update on real and (detached) fake images, then the generator's."""
    generator, discriminator = model.generator, model.discriminator
    criterion = lib.nn.BCEWithLogitsLoss()
    opt_d = lib.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = lib.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step(real, noise):
        b = real.shape[0]
        ones, zeros = lib.ones(b), lib.zeros(b)
        opt_d.zero_grad()
        fake = generator(noise)
        err_d = criterion(discriminator(real), ones) + criterion(
            discriminator(fake.detach()), zeros)
        err_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        err_g = criterion(discriminator(fake), ones)
        err_g.backward()
        opt_g.step()
        return err_d.detach(), err_g.detach()

    return step


def mobilenet_step(lib, model):
    """Cross-entropy and SGD momentum (benchmarks/models.py's step)."""
    return models.graphc_step(model) if lib is graphc else models.torch_step(model)


STEPS = {"lstm": lstm_step, "vae": vae_step, "dcgan": dcgan_step, "mobilenet": mobilenet_step}


def batch(name: str, shape: dict, seed: int = 1) -> tuple[np.ndarray, ...]:
    """The step's numpy arguments for `name` at `shape`."""
    rng = np.random.default_rng(seed)
    if name == "lstm":
        window = rng.integers(0, shape["vocab"], (shape["batch"], shape["seq"] + 1))
        return window[:, :-1].copy(), window[:, 1:].copy()
    if name == "vae":
        x = rng.random((shape["batch"], shape["features"])).astype(np.float32)
        return x, rng.standard_normal((shape["batch"], shape["latent"])).astype(np.float32)
    if name == "dcgan":
        real = np.tanh(rng.standard_normal((shape["batch"], 1, 16, 16))).astype(np.float32)
        return real, rng.standard_normal((shape["batch"], shape["nz"], 1, 1)).astype(np.float32)
    return batch_of("resnet18", shape, seed)


def build(lib, name: str, shape: dict, state: dict | None = None):
    """(model, step) of `name` in `lib`; `state` is a graphc state_dict to start from."""
    model = BUILDERS[name](lib, **shape)
    if state is not None:
        if lib is graphc:
            model.load_state_dict(state)
        else:
            model.load_state_dict({k: lib.from_numpy(v.detach().numpy().copy())
                                   for k, v in state.items()})
    return model, STEPS[name](lib, model)


# ---- the case -------------------------------------------------------------------------------
def _contender(name: str, step, args, model, compiled=None) -> Contender:
    """A contender running `step(*args)`; agreement runs AGREE_STEPS steps and compares the
    last losses and the first parameter of every network."""
    state: dict = {}

    def prepare():
        for _ in range(cases.AGREE_STEPS):
            state["losses"] = step(*args)
        if compiled is not None and len(compiled.graphs) >= cases.AGREE_STEPS:
            raise RuntimeError(f"the compiled step traced on all {cases.AGREE_STEPS} calls: "
                               "the native code never ran, so there is nothing to compare")

    def result():
        losses = state["losses"]
        losses = losses if isinstance(losses, tuple) else (losses,)
        parts = [np.asarray(v.detach().numpy(), np.float64).reshape(-1) for v in losses]
        nets = [model.generator, model.discriminator] if hasattr(model, "generator") else [
            model]
        parts += [models.first_weight(net).ravel() for net in nets]
        return np.concatenate(parts)

    return Contender(name, run=lambda: step(*args), result=result, prepare=prepare)


def _torch_compiled(torch, name: str, shape: dict, state: dict):
    """(model, step) for the torch.compile contender: the whole step compiled, but for DCGAN
    its two networks (torch 2.13's compiled DCGAN step fails in its second backward, "Trying
    to backward through the graph a second time": the generator's output feeds both
    updates)."""
    if name != "dcgan":
        model, step = build(torch, name, shape, state)
        return model, torch.compile(step)
    model, _ = build(torch, name, shape, state)
    model.generator = torch.compile(model.generator)
    model.discriminator = torch.compile(model.discriminator)
    return model, STEPS[name](torch, model)


def family_step(name: str, quick: bool, repeat: int, torch_compile: bool,
                warmup_seconds: float) -> CaseResult:
    """One table row: graphc compiled against graphc eager, PyTorch eager and torch.compile,
    from the same weights and batch."""
    shape = (QUICK if quick else FULL)[name]
    graphc.manual_seed(0)
    base = BUILDERS[name](graphc, **shape)
    arrays = batch(name, shape)
    g_args = tuple(graphc.tensor(a) for a in arrays)
    compiled_model, compiled_step = build(graphc, name, shape, base.state_dict())
    compiled = graphc.compile(compiled_step, backend="cpu")
    eager_model, eager_step = build(graphc, name, shape, base.state_dict())
    contenders = [_contender("graphc cpu", compiled, g_args, compiled_model, compiled),
                  _contender("graphc eager", eager_step, g_args, eager_model)]
    torch = cases.torch_or_none()
    if torch is None:
        contenders += [Contender(n, run=lambda: None, status="skipped: torch is not installed")
                       for n in ("torch eager", "torch.compile")]
    else:
        t_args = tuple(torch.from_numpy(a) for a in arrays)
        t_model, t_step = build(torch, name, shape, base.state_dict())
        contenders.append(_contender("torch eager", t_step, t_args, t_model))
        if torch_compile:
            tc_model, tc_step = _torch_compiled(torch, name, shape, base.state_dict())
            contenders.append(_contender("torch.compile", tc_step, t_args, tc_model))
        else:
            contenders.append(Contender("torch.compile", lambda: None,
                                        status="skipped: --quick"))
    contenders.sort(key=lambda c: c.name != "torch eager")
    check_agreement(contenders, TOLERANCE)
    interleaved_medians(contenders, repeat, warmup_seconds=warmup_seconds)
    contenders.sort(key=lambda c: ["graphc cpu", "graphc eager", "torch eager",
                                   "torch.compile"].index(c.name))
    return CaseResult(f"{name}_b{shape['batch']}", f"{DESCRIPTIONS[name].format(**shape)} "
                      f"training step, batch {shape['batch']}", "graphc cpu", "torch eager",
                      ("<=", TARGET), contenders)


def profile_family_step(name: str) -> str:
    """The full-size step under graphc.profile: time per kind of kernel, the slowest kernels,
    and PyTorch's own profile of its eager step."""
    from benchmarks import profiles

    shape = FULL[name]
    graphc.manual_seed(0)
    model, step = build(graphc, name, shape)
    args = tuple(graphc.tensor(a) for a in batch(name, shape))
    compiled = graphc.compile(step, backend="cpu")
    report = graphc.profile(compiled, *args, repeat=5)
    parts = [profiles.kernel_kinds(report)]
    torch = cases.torch_or_none()
    if torch is not None:
        t_model, t_step = build(torch, name, shape, model.state_dict())
        t_args = tuple(torch.from_numpy(a) for a in batch(name, shape))
        parts += ["The anchor, PyTorch eager, profiled by torch.profiler:",
                  profiles.torch_profile(lambda: t_step(*t_args))]
    return "\n\n".join(parts)
