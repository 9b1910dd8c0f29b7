"""Differential fuzzing: random graphc programs on eager, the interpreter, the passes and the
backends, against a float64 reference (tests/fuzz/).

Hypothesis draws programs of one family at a time (tests/fuzz/strategies.py FAMILIES:
elementwise, reduce, movement, matmul, conv_pool, softmax_loss, mixed), half of them with
gradients; tests/fuzz/harness.py traces each, runs eager, the interpreter, the default pass
pipeline and the CPU backend, and compares everything with graphc.testing's tolerances.

A CI run checks `sum(CI_EXAMPLES.values())` graphs (1,080) with fixed seeds and no example
database, so it is reproducible; each family is split into shards so pytest-xdist spreads the
work. A longer, random run:

    GRAPHC_FUZZ_EXAMPLES=20000 python -m pytest -q -n 2 tests/test_fuzz.py

(N graphs in all, shared among the families by their CI weights, fresh random seeds every
run, compiled objects cached in a temporary directory). A failure shrinks to a small program
and its message prints the program's source, the wrong and the expected numbers, and the
repro written under a temporary directory: `graphc run <repro>.gir --inputs <repro>.npz
--backend cpu` (float64 reference outputs in `<repro>.expected.npz`).

The CUDA backend runs under emulation (GRAPHC_CUDA=emu) on `CUDA_EXAMPLES` programs when
graphc.backends.cuda can compile a graph: each emulated graph compiles C++ with g++.

Bugs the fuzzer found are kept as fixtures in tests/fixtures/fuzz/ (`<name>.gir`,
`<name>.npz` inputs, `<name>.expected.npz` float64 reference outputs; `<name>.xfail` holds
the description of a bug not fixed yet, and the case is then expected to fail).
"""

from __future__ import annotations

import glob
import os
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

from graphc.backends import compile as compile_graph
from graphc.backends import register_backend
from graphc.backends.interp import InterpExecutable
from graphc.ir.interpreter import Interpreter
from graphc.testing import compare, tolerance
from graphc.testing.repro import load_repro, run_repro
from tests.fuzz.harness import STATS, FuzzMismatch, check_program
from tests.fuzz.strategies import programs

SHARDS = 2
CI_EXAMPLES = {"elementwise": 260, "movement": 200, "reduce": 160, "matmul": 160,
               "conv_pool": 60, "softmax_loss": 80, "mixed": 160}
CUDA_EXAMPLES = 12
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "fuzz")
LONG_RUN = int(os.environ.get("GRAPHC_FUZZ_EXAMPLES", "0") or 0)

_COMMON = dict(database=None, deadline=None, derandomize=False,
               suppress_health_check=list(HealthCheck))


def examples(family: str) -> int:
    """Graphs per shard of `family`: the CI count, or its share of GRAPHC_FUZZ_EXAMPLES."""
    total = CI_EXAMPLES[family]
    if LONG_RUN:
        total = max(1, round(LONG_RUN * total / sum(CI_EXAMPLES.values())))
    return max(1, total // SHARDS)


def fuzz(strategy, count: int, key: str, backends):
    """Check `count` programs drawn from `strategy`; returns how many graphs were checked."""

    def check(program):
        check_program(program, backends)

    run = given(strategy)(check)
    run = settings(max_examples=count, print_blob=bool(LONG_RUN), **_COMMON)(run)
    if not LONG_RUN:
        run = seed(zlib.crc32(key.encode()))(run)  # a CI run is the same every time
    before = STATS["graphs"]
    run()
    return STATS["graphs"] - before


@pytest.fixture(autouse=True)
def _long_run_cache(tmp_path_factory, monkeypatch):
    """A long random run compiles thousands of throwaway graphs: keep them out of the user's
    object cache."""
    if LONG_RUN:
        monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("shard", range(SHARDS))
@pytest.mark.parametrize("family", sorted(CI_EXAMPLES))
def test_fuzz_cpu(family: str, shard: int) -> None:
    count = examples(family)
    checked = fuzz(programs(family), count, f"{family}/{shard}", ("cpu",))
    # rejected draws (ties, overflow) do not count: hypothesis keeps drawing until `count`
    assert checked >= count * 0.9, f"only {checked} of {count} {family} programs checked"


def _cuda_emulation_or_skip() -> None:
    try:
        from graphc.backends.cuda.executable import CudaExecutable  # noqa: F401
    except ImportError as err:
        pytest.skip(f"graphc.backends.cuda has no executable yet ({err}): the CUDA backend "
                    "is being written")
    try:
        from tests.cuda_support import runtime_library
    except ImportError:
        pytest.skip("tests/cuda_support.py (which builds the emulation library) is missing")
    runtime_library("emu")  # built once per session, under the build lock


def test_fuzz_cuda_emulated(monkeypatch) -> None:
    _cuda_emulation_or_skip()
    monkeypatch.setenv("GRAPHC_CUDA", "emu")
    count = CUDA_EXAMPLES if not LONG_RUN else max(CUDA_EXAMPLES, LONG_RUN // 100)
    before = STATS["cuda"]
    checked = fuzz(programs("mixed", max_steps=3), count, "cuda", ("cuda",))
    assert checked >= count * 0.9, f"only {checked} of {count} programs checked"
    refused = {k: n for k, n in STATS.items() if k.startswith("cuda refused")}
    assert STATS["cuda"] > before, f"the cuda backend refused every program: {refused}"


# ---- the fuzzer itself: it finds a wrong backend, shrinks and writes a repro --------------------
class _OffByAMilli(InterpExecutable):
    """The interpreter, except that any node computing a sigmoid adds 1e-3 to its result."""

    backend = "off_by_a_milli"

    def __init__(self, graph, options=None) -> None:
        super().__init__(graph)
        self._interpreter = _WrongSigmoid(graph)


class _WrongSigmoid(Interpreter):
    def run_node(self, node, args):
        results = super().run_node(node, args)
        if "sigmoid" in node.op or "sigmoid" in str(node.attrs):
            results = [r + np.asarray(1e-3, r.dtype) for r in results]
        return results


def test_fuzzer_finds_shrinks_and_writes_a_repro() -> None:
    register_backend("off_by_a_milli", _OffByAMilli)
    with pytest.raises(FuzzMismatch) as caught:
        fuzz(programs("elementwise"), 400, "self-test", ("off_by_a_milli",))
    message = str(caught.value)
    assert "graphc.sigmoid" in message and "off_by_a_milli" in message
    command = next(line for line in message.splitlines() if "graphc run" in line).split()
    gir, npz = command[2], command[4]
    source = message[message.index("def program"):message.index("Repro")]
    assert source.count("\n    v") == 1, f"not shrunk to one step:\n{source}"
    wrong = run_repro(gir, npz, backend="off_by_a_milli")
    right = run_repro(gir, npz, backend="interp")
    assert any(compare(w, r, 1e-4, 1e-5) is not None for w, r in zip(wrong, right))


# ---- regression fixtures of bugs the fuzzer found ---------------------------------------------
def _fixtures() -> list:
    stems = sorted(p[:-4] for p in glob.glob(os.path.join(FIXTURES, "*.gir")))
    if not stems:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"no fuzz-found bug is recorded in {FIXTURES}"))]
    return [pytest.param(s, id=os.path.basename(s)) for s in stems]


def _known_bug(stem: str, backend: str) -> str | None:
    """The description in `<stem>.xfail` when the bug shows on `backend`. The file's first
    line may read `backends: cpu cuda` (default: every backend)."""
    if not os.path.exists(stem + ".xfail"):
        return None
    with open(stem + ".xfail") as f:
        text = f.read().strip()
    first, _, rest = text.partition("\n")
    if first.startswith("backends:"):
        return rest.strip() if backend in first.split(":", 1)[1].split() else None
    return text


@pytest.mark.parametrize("backend", ["interp", "cpu"])
@pytest.mark.parametrize("stem", _fixtures())
def test_fuzz_regression(stem: str, backend: str, request) -> None:
    bug = _known_bug(stem, backend)
    if bug:
        request.applymarker(pytest.mark.xfail(reason=bug, strict=True))
    graph, inputs = load_repro(stem + ".gir", stem + ".npz")
    with np.load(stem + ".expected.npz") as archive:
        expected = [archive[f"arr_{k}"] for k in range(len(archive.files))]
    got = compile_graph(graph, backend).run(*inputs)
    assert len(got) == len(expected)
    for k, (g, e, v) in enumerate(zip(got, expected, graph.outputs)):
        err = compare(g, e, *tolerance(v.type.dtype.name))
        assert err is None, f"{os.path.basename(stem)} output {k} on {backend}: {err}"
