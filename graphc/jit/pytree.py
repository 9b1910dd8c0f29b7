"""Pytree helpers of the jit: the tensors in nested tuples, lists and dicts, and back.

A *path* is the tuple of indices and keys that leads to an item: `(0, 1)` is `args[1]` when the
tree is `(args, kwargs)`. `flatten` yields (path, tensor) in a fixed order; `output_spec`
records a function's output structure with each tensor replaced by its output index, and
`unflatten` rebuilds it from a run's outputs.
"""

from __future__ import annotations

import numpy as np

from graphc.tensor import Tensor

LITERALS = (bool, int, float, str, type(None), np.generic)  # Python values a graph bakes in


def is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def flatten(obj, path=()):
    """Yield (path, tensor) for every tensor in nested tuples, lists and dicts."""
    if isinstance(obj, Tensor):
        yield path, obj
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from flatten(item, path + (i,))
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from flatten(item, path + (k,))


def output_spec(obj, index: dict[int, int]):
    """The output structure with each tensor replaced by ('out', position)."""
    if isinstance(obj, Tensor):
        return ("out", index[id(obj)])
    if is_namedtuple(obj):
        return type(obj)(*(output_spec(item, index) for item in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(output_spec(item, index) for item in obj)
    if isinstance(obj, dict):
        return {k: output_spec(v, index) for k, v in obj.items()}
    return ("const", obj)


def unflatten(spec, outputs: list):
    """Rebuild the traced function's output structure from the outputs of a run."""
    if type(spec) is tuple and len(spec) == 2 and spec[0] in ("out", "const"):
        return outputs[spec[1]] if spec[0] == "out" else spec[1]
    if is_namedtuple(spec):
        return type(spec)(*(unflatten(s, outputs) for s in spec))
    if isinstance(spec, (tuple, list)):
        return type(spec)(unflatten(s, outputs) for s in spec)
    if isinstance(spec, dict):
        return {k: unflatten(v, outputs) for k, v in spec.items()}
    return spec


def flat_leaves(obj, path=()):
    """(path, leaf) for every non-container leaf of nested tuples, lists and dicts."""
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            yield from flat_leaves(item, path + (i,))
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from flat_leaves(item, path + (k,))
    else:
        yield path, obj


def path_name(path: tuple) -> str:
    head = f"arg {path[1]}" if path[0] == 0 else f"kwarg {path[1]}"
    return head + "".join(f"[{p!r}]" for p in path[2:])


def at(tree, path: tuple):
    """The item at `path` in nested tuples, lists and dicts."""
    for p in path:
        tree = tree[p]
    return tree
