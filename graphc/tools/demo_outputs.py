"""The output folder of `graphc demo` (default `graphc-out/demo`).

    ir/step.0.traced.gir ... ir/step.14.plan_buffers.gir  the step's IR after each pass
    step.svg          the optimized step, fused groups boxed (graphc.ir.export.render_svg)
    step.html         the same step in the interactive viewer: zoom, search, collapse
                      (graphc.tools.viewer.render_html; one file, no network)
    memory.png        its buffers over the schedule (graphc.tools.memory_viz.render_memory)
    summary.txt       what the run printed, the passes' report and the memory report

Invariants:
- Files are named as GRAPHC_DUMP names them (`<graph>.<stage>.<pass>.gir`, a `# after <pass>`
  header line), and every .gir file parses with `graphc.ir.parse`.
- The IR files come from running the compiled callable's passes again, stage by stage, on a
  copy of its latest traced graph (the steady-state step, with Adam's state): passes may
  change the graph they get, and the compiled callable's own graph must stay as it is.
- A run replaces the files it writes and leaves other files in the folder alone.
"""

from __future__ import annotations

import os

from graphc.ir.graph import Graph
from graphc.ir.parser import parse
from graphc.ir.printer import format_graph
from graphc.passes import PassRecord, default_passes, run_pipeline
from graphc.tools.demo_model import DemoError


def prepare_folder(path: str) -> str:
    """Create the output folder (and its `ir/`) or raise DemoError saying why it cannot be."""

    try:
        os.makedirs(os.path.join(path, "ir"), exist_ok=True)
    except OSError as err:
        raise DemoError(f"--out {path}: cannot create the output folder ({err.strerror}); "
                        "pass another folder with --out DIR", exit_code=2) from err
    return os.path.normpath(path)


def _write_gir(path: str, graph: Graph, record: PassRecord | None, name: str) -> None:
    header = f"# after {name}" + (f" ({record.seconds * 1e3:.2f} ms)" if record else "")
    with open(path, "w") as f:
        f.write(header + "\n" + format_graph(graph) + "\n")


def write_pass_dumps(traced: Graph, folder: str, passes=None) -> list[str]:
    """Write `traced` and the graph after each pass into `folder`; return the file names."""
    graph = parse(format_graph(traced))  # a copy: passes may change the graph they get
    names = [f"{graph.name}.0.traced.gir"]
    _write_gir(os.path.join(folder, names[0]), graph, None, "tracing")
    for stage, one_pass in enumerate(default_passes() if passes is None else passes, start=1):
        graph, report = run_pipeline(graph, [one_pass])
        record = report.records[0]
        names.append(f"{graph.name}.{stage}.{record.name}.gir")
        _write_gir(os.path.join(folder, names[-1]), graph, record, record.name)
    return names


def write_artifacts(folder: str, compiled) -> dict[str, str]:
    """The IR dumps, step.svg, step.html and memory.png of a compiled training step, and
    summary.txt's entry (write_summary writes it last); returns {name in `folder`: what it
    holds}."""
    from graphc.ir.export import render_svg
    from graphc.tools.memory_viz import render_memory
    from graphc.tools.viewer import render_html

    # the passes the step was compiled with (the backend's: cpu adds its own, default_passes)
    dumps = write_pass_dumps(compiled.graph, os.path.join(folder, "ir"),
                             compiled._passes(compiled.graph))
    written = {"summary.txt": "this report, the passes' times and the memory plan"}
    optimized = compiled.optimized_graph
    render_svg(optimized, os.path.join(folder, "step.svg"))
    written["step.svg"] = "the optimized training step, fused groups boxed"
    render_html(optimized, os.path.join(folder, "step.html"))
    written["step.html"] = "the same step to explore in a browser (zoom, search, collapse)"
    plan = optimized.meta.get("memory_plan")
    if plan is not None:
        render_memory(plan, os.path.join(folder, "memory.png"))
        written["memory.png"] = "its buffers over the schedule (arena offset x step)"
    written["ir/"] = f"its IR after tracing and after each pass ({len(dumps)} .gir files)"
    return written


def write_summary(folder: str, lines: list[str], compiled) -> str:
    """summary.txt: the printed report, then the passes' report and the memory report."""
    sections = ["\n".join(lines), f"passes of the latest trace:\n{compiled.report}"]
    plan = compiled.optimized_graph.meta.get("memory_plan")
    if plan is not None:
        sections.append(plan.report)
    path = os.path.join(folder, "summary.txt")
    with open(path, "w") as f:
        f.write("\n\n".join(sections) + "\n")
    return path
