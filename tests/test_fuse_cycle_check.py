"""fuse's cycle check answers the same whether it searches group by group or turns to bit
sets (`_SEARCH_BUDGET`): random elementwise DAGs, with shared values read again far below
(as a training step's saved activations are), fuse to the same graph both ways."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.ir import parse
from graphc.ir.printer import format_graph
from graphc.passes import fuse as fusing


def random_graph(rng, n):
    """Elementwise ops over two sizes (a reduction or a reshape now and then), each reading
    one or two earlier values, often ones defined long before."""
    lines, values = [], [("x", 64), ("y", 64), ("s", 1)]
    for k in range(n):
        pick = [v for v, size in values if size == 64]
        far = rng.random() < 0.3
        a = pick[int(rng.integers(0, max(1, len(pick) // 3)))] if far else pick[-1]
        if rng.random() < 0.1:
            lines.append(f"  %{k}: f32[1] = reduce_sum[axes=(0,), keepdim=true](%{a})")
            values.append((str(k), 1))
            continue
        if rng.random() < 0.15:  # a node fuse leaves alone: a path may go out and back
            lines.append(f"  %{k}: f32[64] = reshape[shape=(64,)](%{a})")
            values.append((str(k), 64))
            continue
        if rng.random() < 0.6:
            b = rng.choice(pick + [v for v, size in values if size == 1])
            lines.append(f"  %{k}: f32[64] = {rng.choice(['add', 'mul'])}(%{a}, %{b})")
        else:
            lines.append(f"  %{k}: f32[64] = {rng.choice(['exp', 'neg', 'tanh'])}(%{a})")
        values.append((str(k), 64))
    last = [v for v, size in values if size == 64][-2:]
    return parse("graph @g(%x: f32[64], %y: f32[64], %s: f32[1]) -> (f32[64], f32[64]) {\n"
                 + "\n".join(lines) + f"\n  return (%{last[0]}, %{last[1]})\n}}")


@pytest.mark.parametrize("seed", range(10))
def test_bit_set_answer_equals_the_search(seed, monkeypatch):
    graph = random_graph(np.random.default_rng(seed), 120)
    monkeypatch.setattr(fusing, "_SEARCH_BUDGET", 10**9)  # always the group-by-group search
    searched = format_graph(fusing.fuse(graph))
    monkeypatch.setattr(fusing, "_SEARCH_BUDGET", 0)  # always bit sets
    assert format_graph(fusing.fuse(graph)) == searched
