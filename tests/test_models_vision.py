"""Vision model families trained 5 steps against PyTorch (the issue-12 criterion, see
tests/model_parity_support.py): a CIFAR-style ResNet, an MLP VAE, a DCGAN generator and
discriminator, and a MobileNet-style net (depthwise convolutions, Hardswish, ReLU6). Each
program is written once against a module namespace, as PyTorch code with `nn` swapped."""

from __future__ import annotations

import numpy as np
import pytest

from tests.model_parity_support import STEPS, run_family


# ---- ResNet ---------------------------------------------------------------------------------
def resnet(nn, widths=(8, 16), classes=10):
    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                              nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.bn1(self.conv1(x)).relu()
            out = self.bn2(self.conv2(out))
            return (out + self.shortcut(x)).relu()

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(widths[0]), nn.ReLU())
            layers, cin = [], widths[0]
            for i, w in enumerate(widths):
                layers.append(BasicBlock(cin, w, 1 if i == 0 else 2))
                cin = w
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.pool(self.layers(self.stem(x)))
            return self.fc(x.flatten(1))

    return ResNet()


def classify(F, model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def image_batches(rng, shape, classes=10):
    return [(rng.standard_normal(shape), rng.integers(0, classes, shape[0]))
            for _ in range(STEPS)]


def test_resnet(rng):
    run_family(resnet, classify, image_batches(rng, (4, 1, 12, 12)))


# ---- MobileNet-style --------------------------------------------------------------------------
def mobilenet(nn):
    def separable(cin, cout, stride, act):
        return nn.Sequential(
            nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
            act(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), act())

    return nn.Sequential(
        nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish(),
        separable(8, 16, 1, nn.ReLU6), separable(16, 16, 2, nn.Hardswish),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 32), nn.Hardswish(),
        nn.Linear(32, 10))


def test_mobilenet(rng):
    run_family(mobilenet, classify, image_batches(rng, (4, 1, 16, 16)))


# ---- VAE ------------------------------------------------------------------------------------
def vae(nn):
    class VAE(nn.Module):
        def __init__(self, d=64, h=32, z=4):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(d, h), nn.SiLU())
            self.mu = nn.Linear(h, z)
            self.logvar = nn.Linear(h, z)
            self.dec = nn.Sequential(nn.Linear(z, h), nn.ELU(), nn.Linear(h, d))

        def forward(self, x, eps):
            hidden = self.enc(x)
            mu, logvar = self.mu(hidden), self.logvar(hidden)
            z = mu + eps * (0.5 * logvar).exp()
            return self.dec(z), mu, logvar

    return VAE()


def vae_loss(F, model, batch):
    x, eps = batch
    logits, mu, logvar = model(x, eps)
    recon = F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
    kld = -0.5 * (1 + logvar - mu * mu - logvar.exp()).sum()
    return (recon + kld) / x.shape[0]


def test_vae(rng):
    batches = [(rng.random((8, 64)), rng.standard_normal((8, 4))) for _ in range(STEPS)]
    run_family(vae, vae_loss, batches, optimizer="adam", lr=1e-2)


# ---- DCGAN ----------------------------------------------------------------------------------
def dcgan(nn, nz=8, ngf=8, ndf=8):
    class GAN(nn.Module):
        def __init__(self):
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
                nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Flatten())

    return GAN()


def gan_loss(F, model, batch):
    """One combined step: the discriminator on real and (detached) fake images, and the
    generator through the discriminator (both networks' gradients in one backward)."""
    real, noise = batch
    fake = model.generator(noise)
    d_real = model.discriminator(real)
    d_fake = model.discriminator(fake.detach())
    ones, zeros = d_real * 0 + 1, d_fake * 0
    d_loss = (F.binary_cross_entropy_with_logits(d_real, ones)
              + F.binary_cross_entropy_with_logits(d_fake, zeros))
    g_out = model.discriminator(fake)
    g_loss = F.binary_cross_entropy_with_logits(g_out, g_out * 0 + 1)
    return d_loss + g_loss


def test_dcgan(rng):
    batches = [(np.tanh(rng.standard_normal((4, 1, 16, 16))), rng.standard_normal((4, 8, 1, 1)))
               for _ in range(STEPS)]
    run_family(dcgan, gan_loss, batches, optimizer="adam", lr=2e-3)


@pytest.mark.parametrize("family", ["resnet"])
def test_families_state_dicts_interchange(family):
    """The graphc program names its tensors exactly as the torch one (checkpoints load)."""
    from tests.conftest import torch_or_skip

    torch = torch_or_skip()
    import graphc.nn as gnn

    builders = {"resnet": resnet}
    g, t = builders[family](gnn), builders[family](torch.nn)
    assert {k: tuple(v.shape) for k, v in g.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in t.state_dict().items()}
