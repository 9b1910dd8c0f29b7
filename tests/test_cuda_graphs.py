"""The cuda executable's stream and CUDA-graph path (issue 18, item 3's launch list), on the
emulation with a runtime shim that captures as CUDA does.

The emulation runs launches as they are issued and refuses capture (tests/test_cuda_faults.py
checks that the executable then runs its list directly). Here a shim around the emulation
records, between `gc_graph_begin_capture` and `gc_graph_end_capture`, every call issued to the
capturing stream instead of running it, and `gc_graph_launch` replays the record: so the
executable's real capture path runs. Covers: the first call runs the list directly, the
second captures and replays, later calls only replay; every step goes to the executable's own
stream (never NULL); the error words are cleared inside the graph, so a bad index raises on
the replay that saw it and the next replay is clean; GRAPHC_CUDA_SYNC=1 bypasses the graph.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from graphc.backends import compile as compile_graph
from graphc.errors import IndexOutOfRangeError
from graphc.ir import parse


@pytest.fixture(autouse=True)
def _emulation(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("GRAPHC_CUDA", "emu")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("GRAPHC_CUDA_SYNC", raising=False)


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    os.environ.setdefault("GRAPHC_CUDA", "emu")
    try:
        from tests.cuda_support import runtime_library
    except ImportError:
        pytest.skip("tests/cuda_support.py (which builds the emulation library) is missing")
    runtime_library("emu")


class CapturingRuntime:
    """The emulation runtime, capturing like CUDA: calls whose stream argument (the last) is
    the capturing stream are recorded, not run, until the capture ends; a graph launch
    replays them in order. `log` names what ran: functions, or "graph"."""

    _GRAPH_CALLS = ("gc_graph_begin_capture", "gc_graph_end_capture", "gc_graph_launch",
                    "gc_graph_destroy")

    def __init__(self, rt) -> None:
        self._rt, self._stream, self._record = rt, None, None
        self.graphs: list[list] = []
        self.log: list[str] = []
        self.streams: set = set()

    def __getattr__(self, name):
        real = getattr(self._rt, name)
        if not name.startswith("gc_"):
            return real

        def call(*args):
            if args and isinstance(args[-1], ctypes.c_void_p) and name not in (
                    "gc_malloc", "gc_host_alloc", "gc_stream_create"):
                self.streams.add(args[-1].value)
            if self._record is not None and args and args[-1] is self._stream:
                self._record.append((name, real, args))
                return None
            self.log.append(name)
            return real(*args)

        return call

    def gc_graph_begin_capture(self, stream) -> None:
        self._stream, self._record = stream, []

    def gc_graph_end_capture(self, graph, stream) -> None:
        assert stream is self._stream
        self.graphs.append(self._record)
        graph._obj.value = len(self.graphs)
        self._stream, self._record = None, None

    def gc_graph_launch(self, graph, stream) -> None:
        self.log.append("graph")
        for _, real, args in self.graphs[graph.value - 1]:
            real(*args)

    def gc_graph_destroy(self, graph) -> None:
        pass


EMBED = '''graph @t(%w: f32[4,3], %i: i64[2]) -> (f32[2,3]) {
  %0: f32[2,3] = embedding[padding_idx=none](%w, %i)
  %1: f32[2,3] = exp(%0)
  return (%1)
}'''


def _shimmed():
    exe = compile_graph(parse(EMBED), "cuda")
    shim = CapturingRuntime(exe.rt)
    exe.rt = shim
    exe._steps = [exe._bind(step, exe._base.value) for step in exe.lowered.steps]
    return exe, shim


def test_the_second_call_captures_and_later_calls_replay():
    exe, shim = _shimmed()
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    for call, index in enumerate(([3, 0], [1, 2], [0, 0], [2, 3])):
        shim.log.clear()
        out = exe.run(w, np.array(index))[0]
        np.testing.assert_allclose(out, np.exp(w[index]), rtol=1e-6)
        launches = shim.log.count("gc_launch") + shim.log.count("gc_memset")
        if call == 0:
            assert "graph" not in shim.log and launches == 1 + len(exe.lowered.steps)
        else:
            assert shim.log.count("graph") == 1 and launches == 0, shim.log
    assert exe._capture == "captured" and len(shim.graphs) == 1
    names = [name for name, _, _ in shim.graphs[0]]
    assert names[0] == "gc_memset" and names.count("gc_launch") == len(exe.lowered.steps)
    assert shim.streams == {exe._stream.value} and exe._stream.value  # never the NULL stream


def test_errors_are_cleared_inside_the_graph():
    exe, shim = _shimmed()
    w = np.ones((4, 3), np.float32)
    exe.run(w, np.array([0, 1]))
    exe.run(w, np.array([0, 1]))  # captured
    with pytest.raises(IndexOutOfRangeError, match="embedding: an index is out of bounds"):
        exe.run(w, np.array([1, 7]))
    np.testing.assert_allclose(exe.run(w, np.array([2, 3]))[0], np.e * np.ones((2, 3)),
                               rtol=1e-6)
    assert shim.log.count("graph") == 3


def test_sync_mode_runs_step_by_step(monkeypatch):
    exe, shim = _shimmed()
    w = np.ones((4, 3), np.float32)
    monkeypatch.setenv("GRAPHC_CUDA_SYNC", "1")
    for _ in range(3):
        exe.run(w, np.array([0, 1]))
    assert "graph" not in shim.log and not shim.graphs
    assert shim.log.count("gc_stream_synchronize") >= 3 * len(exe.lowered.steps)
