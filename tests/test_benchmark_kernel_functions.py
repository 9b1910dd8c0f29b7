"""benchmarks/kernel_functions.py: the perf map lists every generated function of a compiled
one-op kernel once, at its address, sized up to the next; the report keeps only generated
functions and gives their shares of those samples; a call without a kernel is refused."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite", reason="the benchmark compiles LLVM functions")

from benchmarks import kernel_functions  # noqa: E402

REPORT = """
# Overhead  Symbol
    45.00%  [.] graphc_winograd_gemm_128x64x64_p25.range
    15.00%  [.] k1_conv2d_polyphase
     5.00%  [.] _PyEval_EvalFrameDefault
    30.00%  [.] k2_conv2d_polyphase_filter.range
     5.00%  [k] clear_page_erms
"""


def test_report_shares_count_generated_code_only():
    got = kernel_functions.shares(REPORT)
    assert [name for name, _ in got] == ["graphc_winograd_gemm_128x64x64_p25.range",
                                         "k2_conv2d_polyphase_filter.range",
                                         "k1_conv2d_polyphase"]
    assert [round(share, 3) for _, share in got] == [0.5, 0.333, 0.167]


def test_the_perf_map_lists_each_function_once(tmp_path, monkeypatch):
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.passes.plan import plan_buffers

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    graph, _ = kernel_functions.one_op("fwd", 16, 8, 3, stem=False, n=2)
    plan_buffers(graph)
    exe = CpuExecutable(graph)
    path = kernel_functions.perf_map(exe.library, str(tmp_path / "perf.map"))
    rows = [line.split() for line in open(path).read().splitlines()]
    assert sorted(name for _, _, name in rows) == sorted(exe.library.symbols)
    starts = [int(address, 16) for address, _, _ in rows]
    sizes = [int(size, 16) for _, size, _ in rows]
    assert starts == sorted(starts) and all(size > 0 for size in sizes)
    for start, size, following in zip(starts, sizes, starts[1:]):
        assert start + size == following  # each up to the next
    for (address, _, name) in rows:
        assert int(address, 16) == exe.library.address(name)


def test_a_call_without_a_kernel_is_refused(capsys):
    with pytest.raises(SystemExit):
        kernel_functions.main(["fwd"])
    assert "give kind, channels and side" in capsys.readouterr().err
