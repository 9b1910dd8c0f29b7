"""Graphs the viewer and Model Explorer tests share, and where a browser is found."""

from __future__ import annotations

import os
import shutil

import graphc
import graphc.nn as nn
from graphc.ir import Graph, parse

FUSED = """graph @fused(%x: f32[3], %b: f32[3]) -> (f32[3], f32[3]) {
  %0: f32[3] = fused[body=(("add", (0, 1), ()), ("relu", (2,), ())), outputs=(3,)](%x, %b)  # m.py:1
  %1: f32[3] = exp[group=1](%0)                       # m.py:2
  %2: f32[3] = mul[group=1](%1, %1)                   # m.py:2
  %3: f32[3] = neg(%2)                                # m.py:2 (backward)
  return (%3, %0)
}"""


def training_step() -> Graph:
    """The optimized graph of a compiled MLP training step with Adam (fused, planned)."""
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = graphc.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = graphc.compile(step, backend="interp")
    args = graphc.randn(5, 8), graphc.tensor([0, 1, 2, 3, 0])
    compiled(*args)
    compiled(*args)
    return compiled.optimized_graph


def fused_graph() -> Graph:
    return parse(FUSED)


def chromium() -> str | None:
    """A Chromium to drive: GRAPHC_CHROMIUM, Debian's package, or None."""
    for candidate in (os.environ.get("GRAPHC_CHROMIUM"), "chromium", "chromium-browser",
                      "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None
