"""A CIFAR-style ResNet (BasicBlocks, BatchNorm, AdaptiveAvgPool2d) trained on scikit-learn's
handwritten digits, upsampled from 8x8 to 32x32: the usual PyTorch program with `graphc`
in place of `torch`.

    python examples/resnet.py [--steps 100] [--batch-size 64] [--width 16] [--size 32] [--compile]

With --compile the whole training step (forward, backward, SGD update) runs as one compiled
executable on the CPU backend. Prints the loss as it trains and the held-out accuracy.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
import graphc.optim as optim


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, num_blocks=(2, 2, 2, 2), width=64, in_channels=1, num_classes=10):
        super().__init__()
        self.in_planes = width
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(width, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(2 * width, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(4 * width, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(8 * width, num_blocks[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.linear = nn.Linear(8 * width, num_classes)

    def _make_layer(self, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = graphc.flatten(self.avgpool(out), 1)
        return self.linear(out)


def digits(size: int):
    """scikit-learn's 8x8 digits scaled to [0, 1], resized to size x size; (train, test)."""
    data = load_digits()
    images = graphc.tensor((data.images / 16.0).astype(np.float32)).unsqueeze(1)
    images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    images = (images - 0.5) / 0.5
    labels = graphc.tensor(data.target)
    split = 1500
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def main(argv: list[str] | None = None) -> tuple[list[float], float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    graphc.manual_seed(0)
    (x_train, y_train), (x_test, y_test) = digits(args.size)
    model = ResNet((args.blocks,) * 4, width=args.width)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()

    def train_step(inputs, targets):
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    step = graphc.compile(train_step, backend="cpu") if args.compile else train_step
    losses = []
    model.train()
    for i in range(args.steps):
        idx = graphc.randint(0, x_train.shape[0], (args.batch_size,))
        loss = float(step(x_train[idx], y_train[idx]))
        losses.append(loss)
        if i % 10 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {loss:.4f}")
    model.eval()
    with graphc.no_grad():
        correct = (model(x_test).argmax(1) == y_test).sum().item()
    accuracy = correct / y_test.shape[0]
    print(f"test accuracy {accuracy:.3f}")
    return losses, accuracy


if __name__ == "__main__":
    main()
