"""Helpers shared by the bad-input catalogue (`tests/test_bad_inputs*.py`).

- `marker_lookup(path)`: the `line(marker)` function of one test file, which finds the line
  carrying `# LINE:<marker>` in that very file (markers are looked up where they are written,
  so each test file builds its own `line = marker_lookup(__file__)`).
- `t`, `close`: a float32 tensor of random values, and closeness of two tensors.
- `snapshot`, `assert_unchanged`: copies of everything a failed call must leave untouched
  (module parameters, buffers and `.grad`s, optimizer state, given tensors) and the check.
- `module_object_cache`: an autouse, module-scoped fixture giving each catalogue file one
  temporary object cache for its CPU-backend cases, never the user's; a test file enables it
  by importing it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest

import graphc
import graphc.nn as nn


def marker_lookup(path: str) -> Callable[[str], str]:
    """`line(marker)` for the file at `path`: `<file name>:N` of its one line carrying
    `# LINE:<marker>`."""
    file_name = os.path.basename(path)
    with open(path) as source:
        lines = source.read().splitlines()

    def line(marker: str) -> str:
        tag = f"# LINE:{marker}"
        hits = [i + 1 for i, text in enumerate(lines) if (text + " ").count(tag + " ") == 1]
        assert len(hits) == 1, (f"marker {marker!r} must be on exactly one line of "
                                f"{file_name}, found {hits}")
        return f"{file_name}:{hits[0]}"

    return line


def t(rng, *shape) -> graphc.Tensor:
    return graphc.tensor(rng.standard_normal(shape).astype(np.float32))


def close(a, b) -> None:
    np.testing.assert_allclose(np.asarray(a._data), np.asarray(b._data), rtol=1e-5, atol=1e-5)


def snapshot(*objects) -> list[np.ndarray]:
    """Copies of every parameter and buffer of the modules, every state tensor and `.grad` of
    the optimizers, and the tensors given, in a fixed order."""
    arrays = []
    for obj in objects:
        if isinstance(obj, nn.Module):
            tensors = list(obj.parameters()) + list(obj.buffers())
            arrays += [p._data.copy() for p in tensors]
            arrays += [None if p.grad is None else p.grad._data.copy()
                       for p in obj.parameters()]
        elif isinstance(obj, graphc.optim.Optimizer):
            for state in obj.state.values():
                arrays += [v._data.copy() for _, v in sorted(state.items())
                           if isinstance(v, graphc.Tensor)]
        else:
            arrays.append(obj._data.copy())
    return arrays


def assert_unchanged(before: list, *objects) -> None:
    after = snapshot(*objects)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        if a is None or b is None:
            assert a is None and b is None
        else:
            np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module", autouse=True)
def module_object_cache(tmp_path_factory):
    """One object cache for the CPU cases of the importing file, never the user's."""
    previous = os.environ.get("GRAPHC_CACHE_DIR")
    os.environ["GRAPHC_CACHE_DIR"] = str(tmp_path_factory.mktemp("graphc_cache"))
    yield
    if previous is None:
        del os.environ["GRAPHC_CACHE_DIR"]
    else:
        os.environ["GRAPHC_CACHE_DIR"] = previous
