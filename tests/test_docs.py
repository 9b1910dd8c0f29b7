"""The docs stay true: docs/ops.md is the registry's current table (line numbers aside), and
the IR examples of docs/passes.md parse and are what the passes make of them."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from graphc.ir import format_graph, parse
from graphc.passes.batch_norm_backward import fuse_batch_norm_backward
from graphc.passes.batch_norm_relu import fuse_batch_norm_relu
from graphc.passes.conv_channel_sums import fuse_conv_channel_sums
from graphc.passes.fuse import fuse
from graphc.passes.fuse_rows import fuse_rows
from graphc.passes.sibling_sums import merge_sibling_sums
from graphc.passes.simplify import simplify

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def without_line_numbers(text: str) -> list[str]:
    return [re.sub(r"\.py:\d+", ".py", line) for line in text.splitlines() if line.startswith("|")]


def test_op_table_is_current():
    out = subprocess.run([sys.executable, "-m", "graphc.ops", "--markdown"], check=True,
                         capture_output=True, text=True).stdout
    documented = without_line_numbers((DOCS / "ops.md").read_text())
    assert documented == without_line_numbers(out), (
        "docs/ops.md is stale: regenerate its table with `python -m graphc.ops --markdown`")


def ir_blocks(path: pathlib.Path) -> list[str]:
    blocks = re.findall(r"```\n(graph @.*?)```", path.read_text(), re.S)
    return [b.strip() for b in blocks]


def test_passes_doc_examples_are_real(monkeypatch):
    from graphc.passes import batch_norm_backward

    monkeypatch.setattr(batch_norm_backward, "FUSE", True)  # off by default: the doc shows it on
    blocks = ir_blocks(DOCS / "passes.md")
    assert len(blocks) == 15
    graphs = [parse(b) for b in blocks]
    before, simplified, fused = graphs[2], graphs[3], graphs[4]
    assert format_graph(simplify(before)) == format_graph(simplified)
    assert format_graph(fuse(simplified)) == format_graph(fused)
    fused_groups, row_program = graphs[5], graphs[6]  # "Row programs (cpu)"
    assert format_graph(fuse_rows(fused_groups)) == format_graph(row_program)
    two_sums, merged = graphs[7], graphs[8]  # merge_sibling_sums
    assert format_graph(merge_sibling_sums(two_sums)) == format_graph(merged)
    batch_norm_then_relu, one_node = graphs[9], graphs[10]  # fuse_batch_norm_relu
    assert format_graph(fuse_batch_norm_relu(batch_norm_then_relu)) == format_graph(one_node)
    conv_then_bn, with_sums = graphs[11], graphs[12]  # fuse_conv_channel_sums
    assert format_graph(fuse_conv_channel_sums(conv_then_bn)) == format_graph(with_sums)
    two_nodes, backward = graphs[13], graphs[14]  # fuse_batch_norm_backward
    assert format_graph(fuse_batch_norm_backward(two_nodes)) == format_graph(backward)


def test_readme_layout_names_every_package():
    """README's Layout section names every package under graphc/ (`graphc/jit`, ...)."""
    readme = (DOCS.parent / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    packages = sorted(p.parent.name for p in (DOCS.parent / "graphc").glob("*/__init__.py"))
    missing = [name for name in packages if f"graphc/{name}" not in layout]
    assert not missing, f"README.md's Layout section does not name graphc/{missing[0]}"
