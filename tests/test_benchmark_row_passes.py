"""benchmarks/row_passes.py at its smoke size: both variants run and the row passes leave
fewer kernels (timings are the benchmark's business, never asserted here)."""

from __future__ import annotations

import re

from benchmarks import row_passes


def test_the_row_passes_benchmark_runs_both_variants(capsys):
    row_passes.main(["--quick", "--rounds", "1", "--top", "3"])
    out = capsys.readouterr().out
    kernels = dict(re.findall(r"^(without|with) the row passes: .*?, (\d+) kernels,", out,
                              re.MULTILINE))
    assert set(kernels) == {"without", "with"}, out
    assert int(kernels["with"]) < int(kernels["without"])
    assert "load average:" in out
