"""Large one-dimensional elementwise kernels run in blocks that prefetch ahead of themselves
(cpu backend, graphc.backends.cpu.prefetch): the kernels that get the blocks and the ones that
do not, results bit for bit those of the plain loop and close to the interpreter's, at lengths
that leave a remainder, over a thread's share of the domain, and at sizes known per call."""

from __future__ import annotations

import ctypes
import re
import zlib

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from graphc.backends import compile as backend_compile  # noqa: E402
from graphc.backends.cpu import prefetch  # noqa: E402
from graphc.backends.cpu.runtime_sizes import RuntimeSizedExecutable  # noqa: E402
from graphc.ir import parse  # noqa: E402

# tanh(x*0.5+1)*sigmoid(x)+relu(x-0.1), the benchmark's elementwise chain, as the fuse pass
# leaves it: one fused node
BODY = ('(("full", (), (("shape", ()), ("value", 0.5), ("dtype", "{dtype}"))), '
        '("mul", (0, 1), ()), '
        '("full", (), (("shape", ()), ("value", 1.0), ("dtype", "{dtype}"))), '
        '("add", (2, 3), ()), ("tanh", (4,), ()), ("sigmoid", (0,), ()), ("mul", (5, 6), ()), '
        '("full", (), (("shape", ()), ("value", 0.1), ("dtype", "{dtype}"))), '
        '("sub", (0, 8), ()), ("relu", (9,), ()), ("add", (7, 10), ()))')
CHAIN = """graph @chain(%x: {t}[{n}]) -> ({t}[{n}]) {{
  %0: {t}[{n}] = fused[body={body}, outputs=(11,)](%x)
  return (%0)
}}"""
LARGE = 3 * prefetch.PREFETCH_MIN_ELEMENTS + 37  # not a whole number of blocks


def _chain(n, dtype="float32") -> str:
    return CHAIN.format(n=n, t={"float32": "f32", "float64": "f64"}[dtype],
                        body=BODY.format(dtype=dtype))


def _input(name: str, n: int, dtype="float32") -> np.ndarray:
    x = np.random.default_rng(zlib.crc32(name.encode())).standard_normal(n) * 4
    specials = [0.0, -0.0, 30.0, -30.0]
    x[:4] = specials[:min(n, 4)]
    return x.astype(dtype)


def _compiled(text: str, cache_dir, monkeypatch, prefetching: bool = True):
    """The cpu executable of `text`; `prefetching` False: every domain nested as before (the
    pipeline cache keys on graphc's source, so each variant has a cache folder of its own)."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(cache_dir))
    if not prefetching:
        monkeypatch.setattr(prefetch, "PREFETCH_MIN_ELEMENTS", 1 << 62)
    executable = backend_compile(parse(text), "cpu")
    monkeypatch.undo()
    return executable


def _prefetches(executable) -> int:
    return sum("call" in line and "@\"llvm.prefetch" in line
               for line in executable.lowered.ir_text.splitlines())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_large_chain_prefetches_and_computes_what_the_plain_loop_does(dtype, tmp_path,
                                                                        monkeypatch):
    x = _input(dtype, LARGE, dtype)
    blocked = _compiled(_chain(LARGE, dtype), tmp_path / "blocked", monkeypatch)
    plain = _compiled(_chain(LARGE, dtype), tmp_path / "plain", monkeypatch, prefetching=False)
    assert _prefetches(blocked) > 0 and _prefetches(plain) == 0
    got, = blocked.run(x)
    want, = plain.run(x)
    np.testing.assert_array_equal(got, want)
    reference, = backend_compile(parse(_chain(LARGE, "float64")), "interp").run(
        x.astype(np.float64))
    np.testing.assert_allclose(got, reference, rtol=4 * np.finfo(dtype).eps,
                               atol=4 * np.finfo(dtype).eps)


def test_small_and_two_dimensional_domains_are_nested_as_before(tmp_path, monkeypatch):
    small = _compiled(_chain(prefetch.PREFETCH_MIN_ELEMENTS - 1), tmp_path / "s", monkeypatch)
    assert _prefetches(small) == 0
    rows = _compiled('''graph @rows(%x: f32[512,300], %b: f32[300]) -> (f32[512,300]) {
      %0: f32[512,300] = fused[body=(("add", (0, 1), ()), ("tanh", (2,), ())), outputs=(3,)](%x, %b)
      return (%0)
    }''', tmp_path / "r", monkeypatch)  # the bias's stride 0 keeps two dimensions
    assert _prefetches(rows) == 0
    x, b = _input("rows", 512 * 300).reshape(512, 300), _input("bias", 300)
    got, = rows.run(x, b)
    np.testing.assert_allclose(got, np.tanh(x + b), rtol=1e-6, atol=1e-6)


def test_a_threads_share_writes_only_its_range(tmp_path, monkeypatch):
    """`<kernel>.range(x, out, lo, hi)`, as a libgomp thread calls it, with a share that starts
    and ends inside blocks."""
    blocked = _compiled(_chain(LARGE), tmp_path / "range", monkeypatch)
    name = re.search(r'define void @"?([\w.]+)\.range"?\(', blocked.lowered.ir_text)
    if name is None:
        pytest.skip("libgomp is not loaded here, so the kernel has no thread shares")
    share = blocked.library.ctypes_function(
        f"{name.group(1)}.range", None,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64])
    x = _input("range", LARGE)
    want, = blocked.run(x)
    out = np.full(LARGE, np.nan, np.float32)
    lo, hi = 1000, LARGE - 5
    share(x.ctypes.data, out.ctypes.data, lo, hi)
    np.testing.assert_array_equal(out[lo:hi], want[lo:hi])
    assert np.isnan(out[:lo]).all() and np.isnan(out[hi:]).all()


def test_a_length_known_per_call_prefetches_at_every_size(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    symbolic = RuntimeSizedExecutable(parse(_chain("s0")))
    assert _prefetches(symbolic) > 0
    for n in (1, 63, 64, 65, 1000, LARGE):
        x = _input(f"n{n}", n)
        got, = symbolic.at({"s0": n}).run(x)
        reference, = backend_compile(parse(_chain(n, "float64")), "interp").run(
            x.astype(np.float64))
        assert got.shape == (n,)
        np.testing.assert_allclose(got, reference, rtol=5e-7, atol=5e-7)
