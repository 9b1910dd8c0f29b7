"""The CPU executable touches a large arena's pages on a second thread while LLVM compiles
(graphc.backends.cpu.executable._touch_pages), so the first call does not pay the faults."""

from __future__ import annotations

import numpy as np

from graphc.backends import compile as compile_graph
from graphc.backends.cpu import executable
from graphc.ir import parse


def test_small_arenas_are_left_alone():
    assert executable._touch_pages(np.ones(executable.TOUCH_MIN_BYTES - 1, np.uint8)) is None


def test_one_byte_per_page_is_written_and_nothing_else():
    raw = np.full(executable.TOUCH_MIN_BYTES + 5000, 7, np.uint8)
    thread = executable._touch_pages(raw)
    thread.join()
    assert not raw[::4096].any()
    mask = np.ones(raw.size, bool)
    mask[::4096] = False
    assert (raw[mask] == 7).all()


_LARGE = 1 << 22  # 16 MiB float32 intermediates: the arena is touched while compiling


def _large_graph():
    n = _LARGE
    return parse(f'''graph @f(%x: f32[{n}]) -> (f32[]) {{
  %0: f32[{n}] = exp(%x)
  %1: f32[{n}] = mul(%0, %x)
  %2: f32[] = reduce_sum[axes=(0,), keepdim=false](%1)
  return (%2)
}}''')


def test_a_graph_with_a_large_arena_computes_the_same(rng):
    n, g = _LARGE, _large_graph()
    x = rng.standard_normal(n).astype(np.float32) * 0.1
    cpu = compile_graph(g, "cpu")
    assert cpu._raw.nbytes >= executable.TOUCH_MIN_BYTES  # this graph's arena is touched
    got = cpu.run(x)[0]
    want = compile_graph(g, "interp").run(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_an_executable_from_the_pipeline_cache_touches_its_arena_before_running(rng,
                                                                                 monkeypatch):
    n, g = _LARGE, _large_graph()
    x = rng.standard_normal(n).astype(np.float32) * 0.1
    cold = compile_graph(g, "cpu")
    touched = []
    real = executable._touch_pages

    def record(raw):
        thread = real(raw)
        touched.append((raw, thread))
        return thread

    monkeypatch.setattr(executable, "_touch_pages", record)
    warm = executable.CpuExecutable.from_sections(cold.sections())
    ((raw, thread),) = touched
    assert raw is warm._raw and not thread.is_alive()  # joined before any run
    np.testing.assert_array_equal(warm.run(x)[0], cold.run(x)[0])
