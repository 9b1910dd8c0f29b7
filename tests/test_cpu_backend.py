"""The CPU backend (graphc.backends.cpu): every lowered op, fused groups and models compiled
with llvmlite and compared with the interpreter on random inputs; unsupported ops refused
clearly; vectorised loops; BLAS resolution."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

import graphc  # noqa: E402
from graphc import nn  # noqa: E402
from graphc.backends.cpu import blas as cpu_blas  # noqa: E402
from graphc.backends.cpu.codegen import CpuLoweringError  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.errors import GraphcError  # noqa: E402
from graphc.ir.graph import Graph, Node, Value  # noqa: E402
from graphc.ir.interpreter import run as interpret  # noqa: E402
from graphc.ops.registry import REGISTRY  # noqa: E402
from graphc.passes.fuse import fuse  # noqa: E402
from graphc.passes.plan import plan_buffers  # noqa: E402
from graphc.types import TensorType, as_dtype  # noqa: E402
from tests.conftest import sgd_training_step  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


# ---- helpers -------------------------------------------------------------------------------
def one_op_graph(op: str, types: list[tuple], **attrs) -> Graph:
    """graph @op(%a, %b, ...) -> op[attrs](%a, %b, ...), types as (shape, dtype name)."""
    inputs = [Value(f"x{i}", TensorType(tuple(s), as_dtype(d))) for i, (s, d) in
              enumerate(types)]
    out = REGISTRY[op].infer(*(v.type for v in inputs), **attrs)
    outs = [Value(str(i), t) for i, t in enumerate(out if isinstance(out, tuple) else (out,))]
    return Graph(op, inputs, [Node(op, inputs, attrs, outs)], outs)


def sample(rng, shape, dtype: str, low=-3.0, high=3.0) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "int64":
        return rng.integers(int(low), int(high) + 1, shape).astype(np.int64)
    return rng.uniform(low, high, shape).astype(dtype)


def compare(graph: Graph, arrays, rtol=1e-5, atol=None, planned=False):
    """Compile `graph` for the cpu backend and check it against the interpreter."""
    want = interpret(graph, *[np.array(a, copy=True) for a in arrays])
    if not planned:
        plan_buffers(graph)
    exe = CpuExecutable(graph)
    got = exe.run(*[np.array(a, copy=True) for a in arrays])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            scale = float(np.nanmax(np.abs(w[np.isfinite(w)]), initial=1.0))
            np.testing.assert_allclose(g, w, rtol=rtol,
                                       atol=(rtol * scale if atol is None else atol),
                                       equal_nan=True)
    return exe


SHAPES = [(), (7,), (3, 5), (2, 3, 33)]


# ---- elementwise ---------------------------------------------------------------------------
UNARY = {  # op: (low, high) of the inputs, attrs
    "neg": ((-3, 3), {}), "abs": ((-3, 3), {}), "sign": ((-3, 3), {}),
    "relu": ((-3, 3), {}), "exp": ((-10, 10), {}), "log": ((0.01, 10), {}),
    "log1p": ((-0.9, 10), {}), "sqrt": ((0, 10), {}), "rsqrt": ((0.01, 10), {}),
    "tanh": ((-5, 5), {}), "sigmoid": ((-20, 20), {}), "erf": ((-3, 3), {}),
    "sin": ((-6, 6), {}), "cos": ((-6, 6), {}),
    "leaky_relu": ((-3, 3), {"negative_slope": 0.1}),
    "gelu": ((-4, 4), {"approximate": "none"}),
    "clamp": ((-3, 3), {"min": -1.0, "max": 0.5}),
    "cast": ((-3, 3), {"dtype": "int64"}),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_ops_match_the_interpreter(op, dtype, rng):
    (low, high), attrs = UNARY[op]
    for shape in SHAPES:
        x = sample(rng, shape, dtype, low, high)
        compare(one_op_graph(op, [(shape, dtype)], **attrs), [x], rtol=1e-5)


def test_gelu_tanh_and_unary_ops_on_integers(rng):
    compare(one_op_graph("gelu", [((4, 9), "float32")], approximate="tanh"),
            [sample(rng, (4, 9), "float32")])
    for op in ("neg", "abs", "relu", "sign", "exp", "sigmoid"):
        compare(one_op_graph(op, [((5, 6), "int64")]), [sample(rng, (5, 6), "int64")])
    compare(one_op_graph("clamp", [((8,), "int64")], min=-1, max=2),
            [sample(rng, (8,), "int64")])
    compare(one_op_graph("logical_not", [((8,), "float32")]), [sample(rng, (8,), "float32")])
    for src, dst in (("bool", "float32"), ("float32", "bool"), ("int64", "float64"),
                     ("float64", "float32"), ("float32", "float64"), ("bool", "int64")):
        compare(one_op_graph("cast", [((3, 4), src)], dtype=dst), [sample(rng, (3, 4), src)])


BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "floor_divide",
          "remainder", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor"]
BROADCASTS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 5), (3, 1)), ((), (6,)),
              ((4, 1), (1, 70))]


@pytest.mark.parametrize("op", BINARY)
def test_binary_ops_broadcast_like_the_interpreter(op, rng):
    dtypes = [("float32", "float32"), ("float64", "float32"), ("int64", "float32")]
    if op not in ("div", "pow"):
        dtypes.append(("int64", "int64"))
    for sa, sb in BROADCASTS:
        for da, db in dtypes:
            a = sample(rng, sa, da, -4, 4)
            b = sample(rng, sb, db, -4, 4)
            if op == "pow":
                a = np.abs(a) + (0.5 if a.dtype.kind == "f" else 0)
                b = np.abs(b) if b.dtype.kind == "i" else b
            if op in ("floor_divide", "remainder", "div"):
                b = np.where(b == 0, 3, b).astype(b.dtype)
            compare(one_op_graph(op, [(sa, da), (sb, db)]), [a, b])


def test_integer_pow_and_nan_propagation(rng):
    a = rng.integers(-3, 4, (20,))
    b = rng.integers(0, 6, (20,))
    compare(one_op_graph("pow", [((20,), "int64"), ((20,), "int64")]), [a, b])
    x = np.array([np.nan, 1.0, -2.0, np.inf, -np.inf, 0.0], np.float32)
    y = np.array([1.0, np.nan, -3.0, 1.0, np.nan, -0.0], np.float32)
    for op in ("maximum", "minimum", "eq", "ne", "lt", "ge", "add"):
        compare(one_op_graph(op, [((6,), "float32"), ((6,), "float32")]), [x, y])
    for op in ("relu", "abs", "sign", "exp", "tanh", "sigmoid"):
        compare(one_op_graph(op, [((6,), "float32")]), [x])
    compare(one_op_graph("clamp", [((6,), "float32")], min=-1.0, max=None), [x])


def test_where_broadcasts_its_three_operands(rng):
    for (sc, sa, sb) in (((3, 4), (3, 4), (3, 4)), ((3, 1), (4,), ()), ((5,), (2, 5), (1,))):
        for dt in ("float32", "int64"):
            compare(one_op_graph("where", [(sc, "bool"), (sa, dt), (sb, dt)]),
                    [sample(rng, sc, "bool"), sample(rng, sa, dt), sample(rng, sb, dt)])


def test_contiguous_loops_vectorise(rng):
    g = one_op_graph("mul", [((4096,), "float32"), ((4096,), "float32")])
    exe = compare(g, [sample(rng, (4096,), "float32"), sample(rng, (4096,), "float32")])
    asm = exe.asm
    assert "vmulps" in asm and ("zmm" in asm or "ymm" in asm), "the mul loop did not vectorise"
    g = one_op_graph("exp", [((64, 512), "float32")])
    exe = compare(g, [sample(rng, (64, 512), "float32")])
    assert ("zmm" in exe.asm or "ymm" in exe.asm) and "expf" not in exe.asm


# ---- reductions and softmax ----------------------------------------------------------------
REDUCE_AXES = [((5, 7), (1,)), ((5, 7), (0,)), ((4, 3, 6), (0, 2)), ((4, 3, 6), (1,)),
               ((4, 3, 6), (0, 1, 2)), ((9,), ()), ((), ()), ((6, 0), (1,))]


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
                                "reduce_prod"])
def test_reductions_match_the_interpreter(op, rng):
    for shape, axes in REDUCE_AXES:
        if op in ("reduce_max", "reduce_min") and 0 in shape:
            continue
        for keepdim in (False, True):
            for dt in ("float32", "float64") + (("int64", "bool")
                                                if op in ("reduce_sum", "reduce_prod") else ()):
                x = sample(rng, shape, dt, -2, 2)
                compare(one_op_graph(op, [(shape, dt)], axes=axes, keepdim=keepdim), [x])


def test_long_float32_sum_stays_accurate(rng):
    x = rng.uniform(0, 1, (3, 100_000)).astype(np.float32)
    compare(one_op_graph("reduce_sum", [((3, 100_000), "float32")], axes=(1,),
                         keepdim=False), [x], rtol=1e-5)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_over_any_dim(op, rng):
    for shape, dim in (((4, 10), 1), ((4, 10), 0), ((2, 3, 17), 2), ((2, 3, 5), 1), ((7,), 0)):
        for dt in ("float32", "float64"):
            x = sample(rng, shape, dt, -10, 10)
            compare(one_op_graph(op, [(shape, dt)], dim=dim), [x])


# ---- matmul --------------------------------------------------------------------------------
MATMULS = [((8, 5), (5, 3)), ((1, 4), (4, 1)), ((3, 7, 5), (5, 2)), ((2, 1, 4, 3), (5, 3, 6)),
           ((5,), (5, 3)), ((3, 5), (5,)), ((6,), (6,)), ((33, 17), (17, 65))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_through_blas(dtype, rng):
    for sa, sb in MATMULS:
        compare(one_op_graph("matmul", [(sa, dtype), (sb, dtype)]),
                [sample(rng, sa, dtype), sample(rng, sb, dtype)], rtol=1e-5)


def test_matmul_reads_transposed_and_strided_views(rng):
    def f(a, b):
        return a.t() @ b, a[::2, :].t() @ b[:3, :], (a.t() @ b.t().t()), b[1::2, 1:].t() @ a[::2, :]

    a = graphc.tensor(sample(rng, (6, 4), "float32"))
    b = graphc.tensor(sample(rng, (6, 5), "float32"))
    g = graphc.trace(f, a, b)
    ops = [n.op for n in g.nodes]
    assert "permute" in ops and "slice" in ops
    compare(g, [a.numpy(), b.numpy()])


def test_matmul_needs_a_blas(monkeypatch):
    cpu_blas.resolve_blas.cache_clear()
    monkeypatch.setattr(cpu_blas, "blas_libraries", lambda: [])
    try:
        with pytest.raises(GraphcError, match="no BLAS"):
            CpuExecutable(one_op_graph("matmul", [((2, 2), "float32"), ((2, 2), "float32")]))
    finally:
        cpu_blas.resolve_blas.cache_clear()
    monkeypatch.undo()
    assert cpu_blas.resolve_blas().sgemm


# ---- movement and sources ------------------------------------------------------------------
def test_movement_ops_as_views_and_copies(rng):
    def f(x, y):
        p = x.permute(2, 0, 1)  # a view ...
        r = p.reshape(6, 4)  # ... that reshape must copy
        s = x[:, 1:, ::2]
        c = graphc.cat([x, y], dim=1)
        e = y[:, :1, :].expand(2, 5, 4)
        return r * 2, s + 1, c.reshape(-1), e.contiguous(), x.reshape(4, 6).t()

    x = graphc.tensor(sample(rng, (2, 3, 4), "float32"))
    y = graphc.tensor(sample(rng, (2, 2, 4), "float32"))
    compare(graphc.trace(f, x, y), [x.numpy(), y.numpy()])


def test_sources_full_and_arange(rng):
    def f(x):
        return x + graphc.arange(5.0), graphc.full((2, 3), 7, dtype=graphc.int64), \
            graphc.arange(0, 10, 3) * 2

    x = graphc.tensor(sample(rng, (4, 5), "float32"))
    compare(graphc.trace(f, x), [x.numpy()])


# ---- fused groups, models ------------------------------------------------------------------
def traced_fused(fn, *tensors) -> Graph:
    g = fuse(graphc.trace(fn, *tensors))
    assert any(n.op == "fused" for n in g.nodes)
    return g


def test_fused_elementwise_chains(rng):
    def chain(x, b):
        return (x * 0.5 + 1).tanh() * x.sigmoid() + (x - b).relu(), (x > b).float() * 3

    x = graphc.tensor(sample(rng, (16, 33), "float32"))
    b = graphc.tensor(sample(rng, (33,), "float32"))
    compare(traced_fused(chain, x, b), [x.numpy(), b.numpy()])


def test_fused_reductions_and_softmax(rng):
    def f(x, w):
        sq = ((x - w) ** 2).sum(dim=1)
        col = (x * w).mean(dim=0, keepdim=True)
        sm = graphc.softmax(x * 2.0 + w, dim=-1)
        lsm = graphc.log_softmax(x - 1.0, dim=0)
        return sq, col, sm, lsm, (x.exp() * w).amax(dim=(0, 1))

    x = graphc.tensor(sample(rng, (6, 40), "float32"))
    w = graphc.tensor(sample(rng, (40,), "float32"))
    g = traced_fused(f, x, w)
    assert any(n.op == "fused" and n.attrs["body"][-1][0] in ("softmax", "reduce_sum")
               for n in g.nodes)
    compare(g, [x.numpy(), w.numpy()])


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def test_mlp_forward_matches_the_interpreter(rng):
    graphc.manual_seed(0)
    model = mlp()
    x = graphc.tensor(sample(rng, (64, 784), "float32"))
    f = graphc.compile(lambda x: model(x), backend="interp")
    with graphc.no_grad():
        f(x)
    g = f.optimized_graph
    assert any(n.op == "fused" and n.attrs["body"][0][0] == "matmul" for n in g.nodes)
    arrays = [x.numpy()] + [p.detach().numpy() for p in model.parameters()]
    compare(g, arrays, rtol=1e-5, planned=True)
    cf = graphc.compile(lambda x: model(x), backend="cpu")
    with graphc.no_grad():
        for _ in range(2):
            np.testing.assert_allclose(cf(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert isinstance(cf.executable, CpuExecutable)


# ---- errors, lifetime ----------------------------------------------------------------------
def test_unsupported_ops_are_refused_at_compile_time(monkeypatch):
    # Every registry op is lowered: an op the backend has never heard of stands in.
    import dataclasses
    monkeypatch.setitem(REGISTRY, "mystery", dataclasses.replace(
        REGISTRY["flip"], name="mystery"))
    g = one_op_graph("mystery", [((3, 4), "float32")], axes=(1,))
    with pytest.raises(CpuLoweringError) as err:
        CpuExecutable(g)
    msg = str(err.value)
    assert "'mystery'" in msg and "mystery[" in msg and 'backend="interp"' in msg


def test_bad_inputs_are_refused_and_executables_outlive_their_graphs(rng):
    g = one_op_graph("add", [((3,), "float32"), ((3,), "float32")])
    exe = CpuExecutable(g)
    with pytest.raises(GraphcError, match="expects f32"):
        exe.run(np.zeros(3, np.float64), np.zeros(3, np.float32))
    with pytest.raises(GraphcError, match="takes 2 inputs"):
        exe.run(np.zeros(3, np.float32))
    del g
    gc.collect()
    strided = np.arange(6, dtype=np.float32)[::2]
    np.testing.assert_array_equal(exe.run(strided, strided)[0], strided * 2)


def test_concurrent_calls_are_serialised(rng):
    g = one_op_graph("reduce_sum", [((64, 1000), "float32")], axes=(1,), keepdim=False)
    exe = CpuExecutable(g)
    xs = [sample(rng, (64, 1000), "float32") for _ in range(4)]
    results = {}

    def work(i):
        for _ in range(20):
            results[i] = exe.run(xs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_allclose(results[i], xs[i].sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_and_its_backward(reduction, rng):
    x = sample(rng, (6, 5), "float32")
    t = np.array([0, 4, 2, -100, 1, 4])
    w = rng.uniform(0.5, 2, 5).astype(np.float32)
    g = one_op_graph("nll_loss", [((6, 5), "float32"), ((6,), "int64"), ((5,), "float32")],
                     ignore_index=-100, reduction=reduction)
    compare(g, [x, t, w])
    gshape = (6,) if reduction == "none" else ()
    gb = one_op_graph("nll_loss_backward", [(gshape, "float32"), ((6,), "int64"),
                                            ((5,), "float32"), ((), "float32")],
                      ignore_index=-100, reduction=reduction, input_shape=(6, 5))
    compare(gb, [sample(rng, gshape, "float32"), t, w, np.float32(3.5)])
    bad = t.copy()
    bad[2] = 5
    with pytest.raises(GraphcError, match="out of bounds"):
        CpuExecutable(g).run(x, bad, w)


def test_mlp_training_step_matches_the_interpreter(rng):
    def make():
        return sgd_training_step(mlp)

    (m_cpu, s_cpu), (m_ref, s_ref) = make(), make()
    s_cpu, s_ref = graphc.compile(s_cpu, backend="cpu"), graphc.compile(s_ref, backend="interp")
    for _ in range(4):  # the first call traces (eagerly), the others run the executables
        x = graphc.tensor(sample(rng, (64, 784), "float32"))
        y = graphc.tensor(rng.integers(0, 10, 64))
        np.testing.assert_allclose(s_cpu(x, y).detach().numpy(), s_ref(x, y).detach().numpy(),
                                   rtol=1e-5)
    assert isinstance(s_cpu.executable, CpuExecutable)
    for a, b in zip(m_cpu.parameters(), m_ref.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


# ---- OpenMP: large elementwise kernels fork over the cores ----------------------------------
@pytest.mark.skipif(__import__("graphc.backends.cpu.llvm", fromlist=["x"]).load_openmp() is None,
                    reason="libgomp is not installed: kernels stay on one core")
def test_large_elementwise_copy_and_fill_kernels_run_on_all_cores(rng, monkeypatch):
    from graphc.backends.cpu import kernels
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 64)
    g = graphc.ir.parse('''graph @par(%x: f32[37,5,3], %w: f32[5,1]) -> (f32[3,5,37], f32[37,5,3]) {
      %0: f32[37,5,3] = tanh(%x)
      %1: f32[37,5,3] = mul(%0, %w)
      %2: f32[3,5,37] = permute[dims=(2, 1, 0)](%1)
      %3: f32[3,5,37] = copy(%2)
      %4: f32[37,5,3] = full[shape=(37, 5, 3), value=2.5, dtype="float32"]()
      %5: f32[37,5,3] = add(%x, %4)
      return (%3, %5)
    }''')
    fused = fuse(g)
    exe = compare(fused, [sample(rng, (37, 5, 3), "float32"), sample(rng, (5, 1), "float32")])
    assert "GOMP_parallel" in exe.library.ir and ".omp" in exe.library.ir
    monkeypatch.setattr(kernels, "PARALLEL_MIN_ELEMENTS", 1 << 40)
    serial = CpuExecutable(fuse(g))
    assert "GOMP_parallel" not in serial.library.ir


def test_outputs_computed_in_place_and_views_of_them(rng):
    """Outputs made by a node are computed straight into their output arrays; an output that
    is a view of another output, or the same value returned twice, is still copied out."""
    g = graphc.ir.parse('''graph @outs(%x: f32[2,3]) -> (f32[3,2], f32[2,3], f32[2,3], f32[2,3]) {
      %0: f32[2,3] = exp(%x)
      %1: f32[3,2] = reshape[shape=(3, 2)](%0)
      %2: f32[2,3] = tanh(%x)
      return (%1, %0, %2, %2)
    }''')
    exe = compare(g, [sample(rng, (2, 3), "float32")])
    outs = exe.run(np.ones((2, 3), np.float32))
    assert not np.shares_memory(outs[2], outs[3])
