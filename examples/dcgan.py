"""A DCGAN (transposed-convolution generator, strided-convolution discriminator, BatchNorm,
LeakyReLU) on scikit-learn's handwritten digits padded to 16x16: the usual PyTorch program
with `graphc` in place of `torch`.

    python examples/dcgan.py [--steps 200] [--batch-size 32] [--nz 16] [--compile]
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.constant_(m.bias, 0)


class Generator(nn.Module):
    def __init__(self, nz=16, ngf=32):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),                                            # 4x4
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf),
            nn.ReLU(True),                                            # 8x8
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False), nn.Tanh())  # 16x16

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, ndf=32):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False))

    def forward(self, x):
        return self.main(x).view(-1)


def main(argv: list[str] | None = None) -> list[tuple[float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--nz", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    graphc.manual_seed(0)
    digits = graphc.tensor((load_digits().images / 8.0 - 1.0).astype(np.float32)).unsqueeze(1)
    real_images = F.pad(digits, (4, 4, 4, 4), value=-1.0)  # 8x8 -> 16x16, background -1
    netG, netD = Generator(args.nz, args.width), Discriminator(args.width)
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCEWithLogitsLoss()
    optD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def train_step(real, noise):
        b = real.shape[0]
        ones, zeros = graphc.ones(b), graphc.zeros(b)
        optD.zero_grad()
        fake = netG(noise)
        errD = criterion(netD(real), ones) + criterion(netD(fake.detach()), zeros)
        errD.backward()
        optD.step()
        optG.zero_grad()
        errG = criterion(netD(fake), ones)
        errG.backward()
        optG.step()
        return errD, errG

    step = graphc.compile(train_step, backend="cpu") if args.compile else train_step
    history = []
    for i in range(args.steps):
        idx = graphc.randint(0, real_images.shape[0], (args.batch_size,))
        errD, errG = step(real_images[idx], graphc.randn(args.batch_size, args.nz, 1, 1))
        history.append((float(errD), float(errG)))
        if i % 20 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss_D {history[-1][0]:.4f}  loss_G {history[-1][1]:.4f}")
    return history


if __name__ == "__main__":
    main()
