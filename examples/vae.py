"""A variational autoencoder (MLP encoder and decoder, reparameterisation trick) on
scikit-learn's 8x8 handwritten digits: the usual PyTorch program with `graphc` in place of
`torch`.

    python examples/vae.py [--steps 300] [--batch-size 64] [--latent 4] [--compile]
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim


class VAE(nn.Module):
    def __init__(self, input_dim=64, hidden=128, latent=4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(input_dim, hidden), nn.SiLU())
        self.fc_mu = nn.Linear(hidden, latent)
        self.fc_logvar = nn.Linear(hidden, latent)
        self.decoder = nn.Sequential(nn.Linear(latent, hidden), nn.SiLU(),
                                     nn.Linear(hidden, input_dim))

    def reparameterize(self, mu, logvar):
        std = graphc.exp(0.5 * logvar)
        return mu + graphc.randn(*std.shape) * std

    def forward(self, x):
        h = self.encoder(x)
        mu, logvar = self.fc_mu(h), self.fc_logvar(h)
        return self.decoder(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(logits, x, mu, logvar):
    recon = F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
    kld = -0.5 * graphc.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (recon + kld) / x.shape[0]


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--latent", type=int, default=4)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    graphc.manual_seed(0)
    images = graphc.tensor((load_digits().data / 16.0).astype(np.float32))
    model = VAE(latent=args.latent)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)

    def train_step(x):
        optimizer.zero_grad()
        logits, mu, logvar = model(x)
        loss = loss_function(logits, x, mu, logvar)
        loss.backward()
        optimizer.step()
        return loss

    step = graphc.compile(train_step, backend="cpu") if args.compile else train_step
    losses = []
    for i in range(args.steps):
        idx = graphc.randint(0, images.shape[0], (args.batch_size,))
        losses.append(float(step(images[idx])))
        if i % 50 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.3f}")
    return losses


if __name__ == "__main__":
    main()
