"""The backward engine: runs the autograd graph from the roots to the leaves.

`run_backward` finds every node reachable from the roots, counts how many edges lead into
each, and runs a node once all gradients for it have arrived (a topological order), adding
gradients that fan in. Tensor hooks and `retain_grad` act on a node's output gradient before
the node runs; node pre/post hooks around it. Without `retain_graph` the saved tensors of every
node that ran are freed. With `create_graph` the VJPs run with grad mode on, so the gradients
have history of their own and can be differentiated again.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from graphc.autograd.grad_mode import set_grad_enabled
from graphc.autograd.graph import AccumulateGrad, Node, gradient_edge
from graphc.errors import AutogradError, ShapeError, where

if TYPE_CHECKING:
    from graphc.tensor import Tensor


_tiebreak = itertools.count()



def _dependencies(roots: list[Node]) -> dict[Node, int]:
    deps: dict[Node, int] = {}
    seen = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        deps.setdefault(node, 0)
        for child, _ in node.next_functions:
            if child is not None:
                deps[child] = deps.get(child, 0) + 1
                stack.append(child)
    return deps


def _nodes_leading_to(targets: set[Node], roots: list[Node]) -> set[Node]:
    """Nodes from which some target is reachable (so autograd.grad runs no other node)."""
    order, visited = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        node, finished = stack.pop()
        if finished:
            order.append(node)  # post-order: every child is finished before its parent
            continue
        if node in visited:
            continue
        visited.add(node)
        stack.append((node, True))
        stack.extend((c, False) for c, _ in node.next_functions if c is not None)
    wanted = set()
    for node in order:
        if node in targets or any(c in wanted for c, _ in node.next_functions):
            wanted.add(node)
    return wanted


def _add(a: Tensor | None, b: Tensor) -> Tensor:
    return b if a is None else a + b


def _run_tensor_hooks(node: Node, grads: list) -> None:
    for nr, hooks in node.tensor_pre_hooks.items():
        for hook in list(hooks.values()):
            if grads[nr] is None:
                continue
            new = hook(grads[nr])
            if new is not None:
                grads[nr] = new
    for nr, retain in node.retains_grad.items():
        if grads[nr] is not None:
            retain(grads[nr])


def run_backward(
    tensors: Sequence[Tensor],
    grad_tensors: Sequence[Tensor | None],
    retain_graph: bool,
    create_graph: bool,
    inputs: Sequence[Tensor] | None = None,
    allow_unused: bool = False,
) -> tuple | None:
    """Backpropagate; with `inputs`, return their gradients instead of accumulating .grad."""
    from graphc.tensor import Tensor

    root_edges = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        node, nr = gradient_edge(t)
        if node is None:
            raise AutogradError(
                f"element {i} of tensors does not require grad and does not have a grad_fn"
            )
        if g is None:
            if t.numel() != 1:
                raise AutogradError(
                    f"{where('backward')}: grad can be implicitly created only for scalar "
                    f"outputs, got a tensor of shape {list(t.shape)}; reduce it first "
                    "(loss.sum().backward() or loss.mean().backward()) or pass the gradient: "
                    "loss.backward(gradient)")
            g = Tensor._wrap(np.ones(tuple(t.shape), t.dtype.np))  # no data read: t may be abstract
        elif tuple(g.shape) != tuple(t.shape):
            raise ShapeError(
                f"Mismatch in shape: grad_output[{i}] has a shape of {list(g.shape)} and "
                f"output[{i}] has a shape of {list(t.shape)}."
            )
        root_edges.append((node, nr, g))

    roots = [n for n, _, _ in root_edges]
    deps = _dependencies(roots)
    captured: dict[tuple[int, int], Tensor] = {}
    targets: dict[tuple[int, int], int] = {}
    if inputs is not None:
        for k, t in enumerate(inputs):
            node, nr = gradient_edge(t)
            if node is None:
                raise AutogradError(f"One of the differentiated Tensors (index {k}) does not "
                                    "require grad")
            targets[(id(node), nr)] = k
        wanted = _nodes_leading_to({gradient_edge(t)[0] for t in inputs}, roots)
    else:
        wanted = None

    buffers: dict[Node, list] = {}
    for node, nr, g in root_edges:
        buf = buffers.setdefault(node, [None] * _num_outputs(node))
        buf[nr] = _add(buf[nr], g)

    ready: list = []  # a heap: the most recently created ready node runs first
    for n in dict.fromkeys(roots):
        if deps[n] == 0:
            heapq.heappush(ready, (-n.sequence_nr, next(_tiebreak), n))
    with set_grad_enabled(create_graph):
        while ready:
            node = heapq.heappop(ready)[2]
            grads = buffers.pop(node, None) or [None] * _num_outputs(node)
            _run_tensor_hooks(node, grads)
            for k in (key for key in targets if key[0] == id(node)):
                if grads[k[1]] is not None:
                    captured[k] = grads[k[1]]
            runs = wanted is None or (node in wanted and not isinstance(node, AccumulateGrad))
            if runs:
                grads_in = _run_node(node, grads, create_graph)
            else:
                grads_in = (None,) * len(node.next_functions)
            if not retain_graph:
                node.release()
            for (child, nr), g in zip(node.next_functions, grads_in):
                if child is None:
                    continue
                if g is not None:
                    buf = buffers.setdefault(child, [None] * _num_outputs(child))
                    buf[nr] = _add(buf[nr], g)
                deps[child] -= 1
                if deps[child] == 0:
                    heapq.heappush(ready, (-child.sequence_nr, next(_tiebreak), child))
            # hold no gradient past its node: a leaf's may then become its .grad uncopied
            grads = grads_in = g = None

    if inputs is None:
        return None
    result = []
    for k, t in enumerate(inputs):
        node, nr = gradient_edge(t)
        g = captured.get((id(node), nr))
        if g is None and not allow_unused:
            raise AutogradError(
                f"The differentiated Tensor at index {k} appears to not have been used in the "
                "graph. Set allow_unused=True if this is the desired behavior."
            )
        result.append(g)
    return tuple(result)


def _num_outputs(node: Node) -> int:
    n = getattr(node, "num_outputs", None)
    if n is None:
        n = len(getattr(node, "output_types", ())) or 1
    return n


def _run_node(node: Node, grads: list, create_graph: bool) -> tuple:
    if isinstance(node, AccumulateGrad):
        if grads[0] is not None:  # held by the buffer list only (run_backward keeps no other)
            node.accumulate(grads[0], create_graph, handed_over=True)
        return ()
    for hook in list(node.pre_hooks.values()):
        new = hook(tuple(grads))
        if new is not None:
            grads = list(new)
    if all(g is None for g in grads):
        return (None,) * len(node.next_functions)
    grads_in = node.check_grads(tuple(node(tuple(grads))))
    for hook in list(node.post_hooks.values()):
        new = hook(grads_in, tuple(grads))
        if new is not None:
            grads_in = tuple(new)
    return grads_in
