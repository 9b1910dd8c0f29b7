"""Symbolic graphs compiled once on cpu (graphc.backends.cpu.runtime_sizes): kernels that read
their sizes per call, one executable for every size, results equal to the interpreter at
sizes that cross vector widths, row tails and the parallel threshold, clear errors, and the
per-size fallback for ops that take no sizes per call."""

import numpy as np
import pytest

import graphc
import graphc.nn as nn
import graphc.nn.functional as F
from graphc.backends import compile as backend_compile
from graphc.backends.cpu.runtime_sizes import RuntimeSizedExecutable
from graphc.errors import GraphcError
from graphc.ir import parse
from graphc.tools.demo_gpt import TinyGPT


def _both(text: str):
    g = parse(text)
    return backend_compile(g, "cpu"), backend_compile(parse(text), "interp")


def _generic(ex) -> bool:
    return ex.runs_generic and ex.compiled_sizes == []


def test_linear_relu_serves_every_batch_from_one_executable():
    cpu, interp = _both('''graph @f(%x: f32[s0,40], %w: f32[40,24], %b: f32[24]) -> (f32[s0,24]) {
      %0: f32[s0,24] = matmul(%x, %w)
      %1: f32[s0,24] = add(%0, %b)
      %2: f32[s0,24] = relu(%1)
      return (%2)
    }''')
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((40, 24), np.float32), rng.standard_normal(24, np.float32)
    for n in (2, 3, 17, 64, 3000):  # 3000 * 24 elements: the parallel threshold is crossed
        x = rng.standard_normal((n, 40), np.float32)
        got, = cpu.run(x, w, b)
        want, = interp.run(x, w, b)
        assert got.shape == (n, 24)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _generic(cpu)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_rows_of_a_length_known_per_call(op):
    cpu, interp = _both(f'''graph @f(%x: f32[3,s0]) -> (f32[3,s0]) {{
      %0: f32[3,s0] = {op}[dim=1](%x)
      return (%0)
    }}''')
    rng = np.random.default_rng(1)
    for n in (2, 15, 16, 17, 33, 100):  # below, at and past the 16 vector lanes
        x = rng.standard_normal((3, n)).astype(np.float32) * 4
        np.testing.assert_allclose(cpu.run(x)[0], interp.run(x)[0], rtol=1e-5, atol=1e-6)
    assert _generic(cpu)


def test_mean_over_a_symbolic_dim_divides_by_the_calls_count():
    cpu, interp = _both('''graph @f(%x: f32[s0,5]) -> (f32[5]) {
      %0: f32[5] = reduce_mean[axes=(0,), keepdim=false](%x)
      return (%0)
    }''')
    for n in (2, 7, 300):
        x = np.arange(n * 5, dtype=np.float32).reshape(n, 5)
        np.testing.assert_allclose(cpu.run(x)[0], interp.run(x)[0], rtol=1e-6)
    assert _generic(cpu)


def test_embedding_out_of_range_fails_with_a_clear_error_at_any_size():
    cpu, _ = _both('''graph @f(%w: f32[10,4], %i: i64[s0]) -> (f32[s0,4]) {
      %0: f32[s0,4] = embedding[padding_idx=none](%w, %i)
      return (%0)
    }''')
    w = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.testing.assert_array_equal(cpu.run(w, np.array([9, 0, 3]))[0], w[[9, 0, 3]])
    with pytest.raises(GraphcError, match=r"index out of range.*0\.\.9"):
        cpu.run(w, np.array([1, 2, 3, 10, 4]))
    assert _generic(cpu)


def test_a_shape_that_breaks_the_symbols_is_refused_with_the_input_named():
    cpu, _ = _both('''graph @f(%x: f32[s0,3], %y: f32[s0,3]) -> (f32[s0,3]) {
      %0: f32[s0,3] = add(%x, %y)
      return (%0)
    }''')
    with pytest.raises(GraphcError, match="input %y: dimension 0 is s0 = 4, got size 5"):
        cpu.run(np.ones((4, 3), np.float32), np.ones((5, 3), np.float32))


def test_an_op_without_sizes_per_call_is_compiled_per_size(monkeypatch):
    from graphc.backends.cpu import codegen
    from graphc.backends.cpu.index_ops import INDEX_LOWERINGS

    # flip as if its lowering took no sizes per call (randint and randperm really do not)
    monkeypatch.setattr(codegen, "RUNTIME_SIZE_LOWERINGS",
                        codegen.RUNTIME_SIZE_LOWERINGS - {INDEX_LOWERINGS["flip"]})
    cpu, interp = _both('''graph @f(%x: f32[s0,3]) -> (f32[s0,3]) {
      %0: f32[s0,3] = flip[axes=(0,)](%x)
      return (%0)
    }''')
    for n in (2, 3):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(cpu.run(x)[0], interp.run(x)[0])
    assert not cpu.runs_generic and len(cpu.compiled_sizes) == 2


_INDEX_GRAPHS = {
    "flip": ("%0: f32[s0,5] = flip[axes=(0,)](%x)", "f32[s0,5]",
             lambda n, r: [r.standard_normal((n, 5), np.float32)]),
    "pad": ("%0: f32[s0,9] = pad[pads=(0,0,1,3), value=0.5](%x)", "f32[s0,9]",
            lambda n, r: [r.standard_normal((n, 5), np.float32)]),
    "argmax": ("%0: i64[s0] = argmax[axis=1, keepdim=false](%x)", "i64[s0]",
               lambda n, r: [r.standard_normal((n, 7), np.float32)]),
    "argmin over the symbolic dim": ("%0: i64[7] = argmin[axis=0, keepdim=false](%x)", "i64[7]",
                                     lambda n, r: [r.standard_normal((n, 7), np.float32)]),
    "scatter_add": ("%0: f32[4,6] = scatter_add[axis=0](%z, %i, %x)", "f32[4,6]",
                    lambda n, r: [r.standard_normal((n, 6), np.float32), np.zeros((4, 6),
                                  np.float32), r.integers(0, 4, (n, 6))]),
    "index_add": ("%0: f32[4,6] = index_add[axis=0](%z, %j, %x)", "f32[4,6]",
                  lambda n, r: [r.standard_normal((n, 6), np.float32), np.zeros((4, 6),
                                np.float32), r.integers(0, 4, (n,))]),
    "slice_scatter": ("%0: f32[s0,7] = slice_scatter[starts=(0, 3), stops=(s0, 5), "
                      "steps=(1, 1)](%y, %x)", "f32[s0,7]",
                      lambda n, r: [r.standard_normal((n, 2), np.float32),
                                    r.standard_normal((n, 7), np.float32)]),
}
_INDEX_INPUTS = {
    "flip": "%x: f32[s0,5]", "pad": "%x: f32[s0,5]", "argmax": "%x: f32[s0,7]",
    "argmin over the symbolic dim": "%x: f32[s0,7]",
    "scatter_add": "%x: f32[s0,6], %z: f32[4,6], %i: i64[s0,6]",
    "index_add": "%x: f32[s0,6], %z: f32[4,6], %j: i64[s0]",
    "slice_scatter": "%x: f32[s0,2], %y: f32[s0,7]",
}


@pytest.mark.parametrize("name", sorted(_INDEX_GRAPHS))
def test_index_and_movement_ops_take_sizes_per_call(name):
    line, out, make = _INDEX_GRAPHS[name]
    cpu, interp = _both(f"""graph @f({_INDEX_INPUTS[name]}) -> ({out}) {{
      {line}
      return (%0)
    }}""")
    rng = np.random.default_rng(3)
    for n in (2, 3, 17):
        args = make(n, rng)
        np.testing.assert_allclose(cpu.run(*[a.copy() for a in args])[0],
                                   interp.run(*[a.copy() for a in args])[0], rtol=1e-6)
    assert _generic(cpu)


def test_an_index_error_names_the_sizes_of_the_call():
    cpu, _ = _both('''graph @f(%x: f32[s0,6], %i: i64[3], %s: f32[3,6]) -> (f32[s0,6]) {
      %0: f32[s0,6] = index_put[axis=0](%x, %i, %s)
      return (%0)
    }''')
    x, s = np.zeros((4, 6), np.float32), np.ones((3, 6), np.float32)
    np.testing.assert_array_equal(cpu.run(x.copy(), np.array([0, 2, 3]), s)[0][[0, 2, 3]], 1)
    with pytest.raises(GraphcError, match=r"index_put: an index is out of bounds .*s0 = 4"):
        cpu.run(x, np.array([0, 1, 4]), s)
    assert _generic(cpu)


def test_a_static_graph_run_through_the_generic_executable_directly_is_refused():
    ex = RuntimeSizedExecutable(parse('''graph @f(%x: f32[s0]) -> (f32[s0]) {
      %0: f32[s0] = neg(%x)
      return (%0)
    }'''))
    with pytest.raises(GraphcError, match="symbolic sizes"):
        ex.run(np.ones(3, np.float32))
    np.testing.assert_array_equal(ex.at({"s0": 3}).run(np.ones(3, np.float32))[0], -np.ones(3))


def _backend_compiles(f) -> int:
    total = 0
    for entry in f._entries:
        ex = entry.executable
        total += len(getattr(ex, "compiled_sizes", [None])) + \
            bool(getattr(ex, "runs_generic", False))
    return total


def test_gpt_inference_sweep_compiles_each_trace_once():
    graphc.manual_seed(0)
    m = TinyGPT(block=16, embed=32, heads=2, layers=1).eval()
    f = graphc.compile(m, backend="cpu", dynamic=True)
    with graphc.no_grad():
        for b, t in ((2, 16), (3, 16), (5, 16), (3, 4), (3, 7), (4, 13)):
            idx = graphc.randint(0, 128, (b, t))
            np.testing.assert_allclose(f(idx).numpy(), m(idx).numpy(), rtol=1e-4, atol=1e-4)
    assert [str(g.inputs[0].type) for g in f.graphs] == ["i64[s0,s1]"]
    assert _backend_compiles(f) == 1


def _train_both(make, loss_of, batches, loss_tol: dict, param_atol: float):
    """Two copies (same seed) of the model and optimizer `make` returns, the first trained by
    a training step compiled on cpu with dynamic=True, the second eagerly, over the batches
    `batches()` yields (drawn as they are needed, after graphc.manual_seed(1)): the losses
    agree within `loss_tol`, the parameters within rtol 1e-4 and `param_atol`. Returns the
    compiled step."""
    m, opt = make()
    m2, opt2 = make()

    @graphc.compile(backend="cpu", dynamic=True)
    def step(*inputs):
        opt.zero_grad()
        loss = loss_of(m, *inputs)
        loss.backward()
        opt.step()
        return loss.detach()

    graphc.manual_seed(1)
    for inputs in batches():
        got = step(*inputs)
        opt2.zero_grad()
        want = loss_of(m2, *inputs)
        want.backward()
        opt2.step()
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), **loss_tol)
    for p, q in zip(m.parameters(), m2.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4,
                                   atol=param_atol)
    return step


def _classifier_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def test_training_step_with_a_symbolic_batch_matches_eager():
    def make():
        graphc.manual_seed(0)
        m = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
        return m, graphc.optim.Adam(m.parameters(), lr=0.01)

    def batches():
        for n in (16, 5, 16, 2, 40):
            yield graphc.randn(n, 10), graphc.randint(0, 3, (n,))

    step = _train_both(make, _classifier_loss, batches, dict(rtol=1e-4, atol=1e-6), 1e-5)
    assert _backend_compiles(step) == len(step.graphs)


def test_dropout_masks_match_the_interpreter_at_every_size():
    cpu, interp = _both('''graph @f(%x: f32[s0,37], %seed: i64[2]) -> (f32[s0,37]) {
      %0: f32[s0,37] = dropout[p=0.3](%x, %seed)
      return (%0)
    }''')
    seed = np.array([1234, 7], np.int64)
    for n in (2, 9, 2000):
        x = np.ones((n, 37), np.float32)
        np.testing.assert_array_equal(cpu.run(x, seed)[0], interp.run(x, seed)[0])
    assert _generic(cpu)


def test_gpt_training_step_over_batches_and_lengths_compiles_once():
    def make():
        graphc.manual_seed(0)
        m = TinyGPT(block=32, embed=32, heads=2, layers=2)
        # (not Adam: the key bias's gradient is zero up to rounding, and Adam's update
        # divides that noise by its own size)
        return m, graphc.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

    def loss_of(model, idx, tgt):
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    def batches():
        for b, t in ((4, 32), (4, 16), (2, 9), (3, 32)):
            yield graphc.randint(0, 128, (b, t)), graphc.randint(0, 128, (b, t))

    step = _train_both(make, loss_of, batches, dict(rtol=1e-5), 1e-5)
    assert [str(g.inputs[0].type) for g in step.graphs] == ["i64[s0,s1]"]
    assert _backend_compiles(step) == 1


class _ConvNet(nn.Module):
    """Strided, depthwise, pointwise and 3x3 convolutions, batch norms, both poolings and a
    residual add: every convolution path of the cpu backend at a batch known per call."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 32, 1)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.b3 = nn.BatchNorm2d(32)
        self.short = nn.Conv2d(16, 32, 1, bias=False)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        y = self.b3(self.c3(F.relu(self.pw(self.dw(h))))) + self.short(h)
        return self.fc(F.adaptive_avg_pool2d(F.relu(y), 1).flatten(1))


def test_cnn_training_step_over_batches_compiles_once():
    def make():
        graphc.manual_seed(0)
        m = _ConvNet()
        return m, graphc.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)

    def batches():
        for n in (8, 3, 17, 2):  # whole blocks of images and the rest, image by image
            yield graphc.randn(n, 3, 32, 32), graphc.randint(0, 10, (n,))

    step = _train_both(make, _classifier_loss, batches, dict(rtol=1e-5), 1e-6)
    assert _backend_compiles(step) == 1
