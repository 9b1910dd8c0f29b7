"""The pipeline cache: graphc.compile finds a traced graph's executable before the passes.

A first call whose traced graph an earlier compile already made (another process, or here
another compiled callable in a fresh cache folder) runs neither the passes nor the CPU
lowering nor LLVM: graphc.backends.cache.PIPELINES holds the optimized graph, the lowering's
facts and the key of the object code. The key covers what changes the result (graph text,
passes, backend, graphc's source, tuning constants, toolchain); a bad entry is refused and
rebuilt.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
import graphc.nn as nn  # noqa: E402
import graphc.nn.functional as F  # noqa: E402
from graphc.backends import cache  # noqa: E402
from graphc.backends.cpu import executable as cpu_executable  # noqa: E402
from graphc.backends.cpu import kernels, llvm  # noqa: E402
from graphc.jit import pipeline  # noqa: E402


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(root))
    monkeypatch.delenv("GRAPHC_DUMP", raising=False)
    return root


class _Work:
    """How often the passes and the lowering ran."""

    def __init__(self, monkeypatch) -> None:
        self.passes = self.lowered = 0
        run_pipeline, lower = pipeline.run_pipeline, cpu_executable.lower

        def counting_pipeline(*args, **kwargs):
            self.passes += 1
            return run_pipeline(*args, **kwargs)

        def counting_lower(*args, **kwargs):
            self.lowered += 1
            return lower(*args, **kwargs)

        monkeypatch.setattr(pipeline, "run_pipeline", counting_pipeline)
        monkeypatch.setattr(cpu_executable, "lower", counting_lower)


def _step(hidden: int = 16, **compile_kwargs):
    """A fresh model (same weights every time), its Adam training step compiled, and a batch."""
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, 3))
    opt = graphc.optim.Adam(model.parameters(), lr=0.01)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    rng = np.random.default_rng(0)
    batch = (graphc.tensor(rng.standard_normal((8, 6)).astype(np.float32)),
             graphc.tensor(rng.integers(0, 3, 8)))
    return model, graphc.compile(step, backend="cpu", **compile_kwargs), batch


def _train(steps: int = 3, **kwargs):
    model, compiled, batch = _step(**kwargs)
    losses = [compiled(*batch).item() for _ in range(steps)]
    return losses, [p.detach().numpy().copy() for p in model.parameters()], compiled


def _entries(root) -> list:
    return sorted((root / cache.PIPELINES.name).glob("*.gp"))


def test_a_warm_first_call_skips_the_passes_and_the_lowering(cache_root, monkeypatch):
    work = _Work(monkeypatch)
    cold_losses, cold_params, cold = _train()
    assert (work.passes, work.lowered) == (1, 1) and len(_entries(cache_root)) == 1
    warm_losses, warm_params, warm = _train()
    assert (work.passes, work.lowered) == (1, 1)  # nothing more
    assert warm.executable.library.from_cache
    assert warm_losses == cold_losses
    for a, b in zip(warm_params, cold_params):
        np.testing.assert_array_equal(a, b)
    # the cached executable tells what the cold one told
    ex, cold_ex = warm.executable, cold.executable
    assert str(ex.graph) == str(cold_ex.graph)
    assert ex.lowered.kernels == cold_ex.lowered.kernels
    assert ex.lowered.ir_text == cold_ex.lowered.ir_text
    assert ex.library.aliases == cold_ex.library.aliases
    assert ex.memory_plan.arena_bytes == cold_ex.memory_plan.arena_bytes
    assert [r.name for r in warm.report.records] == [r.name for r in cold.report.records]
    assert cache.PIPELINES.stats["hits"] >= 1


def _misses_after(change, monkeypatch, cache_root) -> bool:
    """Whether a compile after `change()` (of the same step) misses the pipeline cache."""
    _train(steps=1)
    work = _Work(monkeypatch)
    change()
    _train(steps=1)
    return work.passes == 1


def test_the_key_covers_what_changes_the_result(cache_root, monkeypatch):
    assert not _misses_after(lambda: None, monkeypatch, cache_root)
    changes = [(kernels, "PARALLEL_MIN_ELEMENTS", 1 << 40),  # a tuning constant
               (llvm, "OPT_LEVEL", 3),  # the LLVM pipeline
               (cache, "source_fingerprint", lambda: "edited")]  # graphc's code
    for module, name, value in changes:
        assert _misses_after(lambda: monkeypatch.setattr(module, name, value), monkeypatch,
                             cache_root), name


def test_the_key_covers_the_thread_counts_the_kernels_are_built_for(cache_root, monkeypatch):
    """A kernel's split over the cores is decided when it is lowered, so an executable built
    in a one-thread process (`benchmarks.run --threads 1`) must not serve a two-thread one:
    it once did, and the two-thread table ran ResNet-18 and conv2d at one thread's speed."""
    from graphc.backends.cpu import threads

    most = threads.most_threads()
    assert _misses_after(lambda: monkeypatch.setattr(threads, "most_threads", lambda: most + 1),
                         monkeypatch, cache_root)


def test_another_graph_or_pipeline_misses(cache_root, monkeypatch):
    from graphc.passes import default_passes
    from graphc.passes.plan import plan_buffers
    from graphc.passes.simplify import simplify

    _train(steps=1)
    work = _Work(monkeypatch)
    _train(steps=1, hidden=17)  # another graph text
    _train(steps=1, passes=[simplify, plan_buffers])  # other passes
    assert work.passes == 2
    _train(steps=1, passes=default_passes(None, "cpu"))  # the default pipeline, named
    assert work.passes == 2


def test_what_the_key_cannot_see_is_not_cached(cache_root, monkeypatch, tmp_path):
    from graphc.passes.plan import plan_buffers

    def users_pass(graph):
        return graph

    _train(steps=1, passes=[users_pass, plan_buffers])
    assert _entries(cache_root) == []
    monkeypatch.setenv("GRAPHC_DUMP", str(tmp_path / "dump"))  # dumps come from the passes
    _train(steps=1)
    assert _entries(cache_root) == []


@pytest.mark.parametrize("damage", ["truncated", "garbage", "bad_graph", "bad_arena",
                                    "no_objects"])
def test_a_bad_entry_is_refused_and_rebuilt(cache_root, monkeypatch, damage):
    cold_losses, cold_params, _ = _train()
    (entry,) = _entries(cache_root)
    key = entry.name[:-len(".gp")]
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:-100])
    elif damage == "garbage":  # a whole, checksummed entry whose sections do not hold
        cache.PIPELINES.write(key, b"GCSECT01" + bytes(40))
    elif damage == "bad_graph":  # well-formed sections, a graph text that does not parse
        sections = cache.unpack_sections(cache.PIPELINES.read(key))
        sections["graph"] = b"graph @broken("
        cache.PIPELINES.write(key, cache.pack_sections(sections))
    elif damage == "bad_arena":  # facts whose arena size is no size
        sections = cache.unpack_sections(cache.PIPELINES.read(key))
        facts = json.loads(sections["facts"])
        facts["arena_bytes"] = -1
        sections["facts"] = json.dumps(facts).encode()
        cache.PIPELINES.write(key, cache.pack_sections(sections))
    else:  # the object code is gone: LLVM again, but not the passes nor the lowering
        for path in (cache_root / llvm.OBJECT_CACHE.name).glob("*.o"):
            path.unlink()
    work = _Work(monkeypatch)
    losses, params, compiled = _train()
    rebuilt = damage != "no_objects"
    assert (work.passes, work.lowered) == ((1, 1) if rebuilt else (0, 0))
    assert compiled.executable.library.from_cache is rebuilt  # the objects survived damage
    assert losses == cold_losses
    for a, b in zip(params, cold_params):
        np.testing.assert_array_equal(a, b)
    assert len(_entries(cache_root)) == 1
    # and the entry is good again
    work.passes = 0
    _train(steps=1)
    assert work.passes == 0


def test_sections_round_trip_and_malformed_ones_are_refused():
    sections = {"a": b"one", "b": b"", "c": bytes(range(256))}
    assert cache.unpack_sections(cache.pack_sections(sections)) == sections
    packed = cache.pack_sections(sections)
    for bad in (b"", packed[:-1], packed + b"x", b"GCSECT01" + packed[8:12] + b"{" * 20,
                b"XXXXXXXX" + packed[8:]):
        with pytest.raises(ValueError, match="section bundle"):
            cache.unpack_sections(bad)
