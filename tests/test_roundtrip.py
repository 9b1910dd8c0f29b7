"""Every traced graph prints, parses back to an equal graph, verifies, and interprets to eager.

A property over the whole OpInfo table (each sample's op traced on its tensors under no_grad)
and over model graphs: an MLP with dropout, LeNet-5 with BatchNorm in train and eval mode,
and a model made of custom autograd Functions. The eager values are the trace's own (a trace
runs eagerly); the interpreter gets the inputs as they were before the trace, so in-place
writes (BatchNorm's running stats, setitem) are checked through the graph's updates.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.errors import TraceError
from graphc.ir import format_graph, parse, run, verify
from graphc.jit.bindings import ArgBinding, ConstantBinding, RngBinding, TensorBinding
from graphc.jit.tracer import trace_call
from tests.opinfo import OP_INFOS, OpInfo
from tests.test_ops import _to_graphc

# OpInfo name -> (sample desc fragments that cannot trace, why)
UNTRACEABLE = {
    "getitem": (("mask",), "boolean-mask indexing has a shape that depends on the mask's "
                           "values; TraceError tells the user to use graphc.where"),
    "setitem": (("bool mask",), "boolean-mask assignment reads the mask's values (its "
                                "indexing step has a data-dependent shape)"),
}


def _snapshot(tensors) -> dict[int, np.ndarray]:
    return {id(t): t._data.copy() for t in tensors}


def _leaves(obj):
    if isinstance(obj, graphc.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)


def _inputs(traced, args, kwargs, before: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The graph's input arrays as they were before the (eager) trace ran."""
    out = []
    for b in traced.bindings:
        if isinstance(b, ArgBinding):
            t = (tuple(args), kwargs)
            for p in b.path:
                t = t[p]
            out.append(before[id(t)])
        elif isinstance(b, TensorBinding):
            out.append(before[id(b.tensor)])
        elif isinstance(b, ConstantBinding):
            out.append(b.array)
        else:
            assert isinstance(b, RngBinding)
            out.append(np.array(b.traced_state, np.uint64).view(np.int64))
    return out


def check_graph(traced, args=(), kwargs=None, before=None, exact=True) -> None:
    """parse(format(g)) == g, verify(g), and the interpreter reproduces the eager call."""
    kwargs = kwargs or {}
    g = traced.graph
    text = format_graph(g)
    again = parse(text)
    assert again == g, f"round trip changed the graph:\n{text}\n---\n{format_graph(again)}"
    assert format_graph(again) == text
    verify(g)
    verify(again)
    results = run(again, *_inputs(traced, args, kwargs, before))
    outputs, updates = results[:len(g.outputs)], results[len(g.outputs):]
    eager = list(_unique(_leaves(traced.result)))
    assert len(outputs) == len(eager)
    bound = {id(v): b for v, b in zip(g.inputs, traced.bindings)}
    finals = [_bound_tensor(bound[id(target)], args, kwargs) for target, _ in g.updates]
    for got, want in zip(outputs + updates, eager + finals):
        want = want._data
        assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
        if exact:
            np.testing.assert_array_equal(got, want, err_msg=text)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=text)


def _unique(tensors):
    seen = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def _bound_tensor(binding, args, kwargs):
    if isinstance(binding, TensorBinding):
        return binding.tensor
    t = (tuple(args), kwargs)
    for p in binding.path:
        t = t[p]
    return t


# ---- every OpInfo sample --------------------------------------------------------------------
def _samples(info: OpInfo) -> list:
    return info.samples(np.random.default_rng(zlib.crc32(f"{info.name}/roundtrip".encode())))


CASES = [(info, i) for info in OP_INFOS for i in range(len(_samples(info)))]


@pytest.mark.parametrize("info,index", CASES, ids=[f"{info.name}-{i}" for info, i in CASES])
def test_opinfo_samples_round_trip_verify_and_interpret_to_eager(info: OpInfo, index: int):
    sample = _samples(info)[index]
    args, kwargs = _to_graphc(sample)
    before = _snapshot(_leaves((args, kwargs)))
    graphc.manual_seed(zlib.crc32(sample.desc.encode()))
    fragments, reason = UNTRACEABLE.get(info.name, ((), ""))
    try:
        with graphc.no_grad():
            shapes_only = _trace(info.op, tuple(args), kwargs, info.name, abstract=True)
            shapes_only.restore()  # the generator draws it took
            traced = _trace(info.op, tuple(args), kwargs, info.name, abstract=False)
    except TraceError as err:
        assert any(f in sample.desc for f in fragments), \
            f"{info.name} [{sample.desc}] does not trace: {err}"
        assert "graphc.where" in str(err)
        pytest.skip(f"{info.name} [{sample.desc}]: {reason}")
    assert shapes_only.graph == traced.graph, "the abstract and the eager trace differ"
    check_graph(traced, args, kwargs, before)


def _trace(fn, args: tuple, kwargs: dict, name: str, abstract: bool):
    """trace_call from one call site, so that the abstract and the eager (value-giving) trace
    record the same source lines."""
    return trace_call(fn, args, kwargs, name=name, abstract=abstract)


def test_every_opinfo_has_a_traceable_sample():
    untraced = []
    for info in OP_INFOS:
        fragments = UNTRACEABLE.get(info.name, ((), ""))[0]
        if all(any(f in s.desc for f in fragments) for s in _samples(info)):
            untraced.append(info.name)
    assert not untraced


# ---- model graphs -----------------------------------------------------------------------------
def _mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10),
                         nn.LogSoftmax(dim=1))


def _lenet5_bn():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.BatchNorm1d(120), nn.ReLU(), nn.Linear(120, 84),
        nn.ReLU(), nn.Linear(84, 10),
    )


class SiLUFn(graphc.autograd.Function):
    """x * sigmoid(x) with a hand-written backward, forward built from graphc ops."""

    @staticmethod
    def forward(ctx, x):
        s = x.sigmoid()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * s * (1 + x * (1 - s))


class AffineFn(graphc.autograd.Function):
    """x @ w.T + b in one custom Function (two outputs: the result and its row norms)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        y = x @ w.t() + b
        return y, (y * y).sum(1)

    @staticmethod
    def backward(ctx, gy, gn):
        raise NotImplementedError("forward-only in these tests")


class CustomFnModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.w = nn.Parameter(graphc.randn(4, 6))
        self.b = nn.Parameter(graphc.zeros(4))

    def forward(self, x):
        h = SiLUFn.apply(self.fc(x))
        y, norms = AffineFn.apply(h, self.w, self.b)
        return y.softmax(dim=1), norms


MODELS = {
    "mlp": (_mlp, (8, 20)),
    "lenet5_bn": (_lenet5_bn, (4, 1, 28, 28)),
    "custom_fn": (CustomFnModel, (5, 6)),
}


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", list(MODELS))
def test_model_graphs_round_trip_verify_and_interpret_to_eager(name, mode, rng):
    build, shape = MODELS[name]
    graphc.manual_seed(0)
    model = build().train(mode == "train")
    x = graphc.tensor(rng.standard_normal(shape).astype(np.float32))
    before = _snapshot([x, *model.parameters(), *model.buffers()])
    with graphc.no_grad():
        shapes_only = _trace(model, (x,), {}, None, abstract=True)
        shapes_only.restore()
        traced = _trace(model, (x,), {}, None, abstract=False)
    g = traced.graph
    assert shapes_only.graph == g, "the abstract and the eager trace differ"
    check_graph(traced, (x,), {}, before, exact=False)
    ops = {n.op for n in g}
    state = {id(t) for t in [*model.parameters(), *model.buffers()]}
    if mode == "eval":  # BatchNorm counts batches in training only
        state -= {id(m.num_batches_tracked) for m in model.modules()
                  if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))}
    assert {id(b.tensor) for b in traced.bindings if isinstance(b, TensorBinding)} == state
    if name == "lenet5_bn":
        assert {"conv2d", "batch_norm", "max_pool2d", "matmul"} <= ops
        assert len(g.updates) == (9 if mode == "train" else 0)
    if name == "mlp":
        assert ("dropout" in ops) == (mode == "train")


def test_tracing_with_autograd_recording_gives_the_same_graph(rng):
    model = _lenet5_bn().eval()
    x = graphc.tensor(rng.standard_normal((2, 1, 28, 28)).astype(np.float32))

    def trace():  # one call site, so the source lines in both graphs are the same
        return trace_call(model, (x,))

    with graphc.no_grad():
        plain = trace().graph
    recorded = trace()
    assert recorded.graph == plain
    assert recorded.result.grad_fn is not None
