"""Passes: functions Graph -> Graph, and the pipeline that runs them in order.

A pass is a plain function `Graph -> Graph` whose docstring states what it needs and what it
guarantees; it returns a graph that verifies (it may return a new graph or change and return
the one it got; callers keep only the result). `run_pipeline` runs passes in order, verifies
after each one (`verify=True`, the default: a bad graph is rejected with the node and its
line, never "fixed"), records each pass's time and node counts, and, with GRAPHC_DUMP=<dir>,
writes the IR after every pass, one file per stage (`<graph>.<k>.<pass>.gir`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from graphc import config
from graphc.ir.graph import Graph
from graphc.ir.printer import format_graph
from graphc.ir.verifier import verify as verify_graph

Pass = Callable[[Graph], Graph]


@dataclass
class PassRecord:
    """What one pass did: its name, wall time, and the node count before and after."""

    name: str
    seconds: float
    nodes_before: int
    nodes_after: int

    def __str__(self) -> str:
        return (f"{self.name:<16} {self.seconds * 1e3:8.2f} ms   nodes {self.nodes_before:>4} -> "
                f"{self.nodes_after:<4}")


@dataclass
class PipelineReport:
    """The records of one pipeline run (provenance of the final graph)."""

    records: list[PassRecord] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self.records)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.records)


def _dump(graph: Graph, stage: int, name: str, record: PassRecord | None,
          prefix: str | None) -> None:
    directory = config.dump_dir()
    if not directory or not config.dumps("ir"):
        return
    header = f"# after {name}" + (f" ({record.seconds * 1e3:.2f} ms)" if record else "")
    config.write_dump_file(directory, f"{prefix or graph.name}.{stage}.{name}.gir",
                           header + "\n" + format_graph(graph) + "\n")


def run_pipeline(graph: Graph, passes: list[Pass], verify: bool = True,
                 dump_prefix: str | None = None) -> tuple[Graph, PipelineReport]:
    """Run `passes` in order on `graph`; return the final graph and the report.

    Dumps go to `<dump_prefix or graph name>.<stage>.<pass>.gir` under GRAPHC_DUMP."""
    report = PipelineReport()
    if verify:
        verify_graph(graph)
    for stage, fn in enumerate(passes, start=1):
        name = getattr(fn, "__name__", type(fn).__name__)
        before = len(graph.nodes)
        start = time.perf_counter()
        graph = fn(graph)
        seconds = time.perf_counter() - start
        if not isinstance(graph, Graph):
            raise TypeError(f"pass {name} returned {type(graph).__name__}, not a Graph")
        if verify:
            verify_graph(graph)
        record = PassRecord(name, seconds, before, len(graph.nodes))
        report.records.append(record)
        _dump(graph, stage, name, record, dump_prefix)
    return graph, report


def default_passes(graph: Graph | None = None, backend: str | None = None) -> list[Pass]:
    """What graphc.compile runs between tracing and the backend, in order; for a `graph`
    with collectives, bucket_allreduce and fuse_waits as well (before the plan, which keeps
    their order); for the "cpu" backend, the passes that serve its kernels, which the
    interpreter, the reference, does not need: transpose_weight_products after simplify (a
    GEMM order its BLAS runs faster) and fuse_attention; share_reshape_copies before fuse;
    fuse_rows, recompute_row_values and fuse_rows again after it (row programs), then
    merge_sibling_sums; fuse_batch_norm_relu right after fuse (batch_norm_relu.py), then
    fuse_conv_channel_sums (conv_channel_sums.py); fuse_batch_norm_backward after
    merge_sibling_sums (batch_norm_backward.py);
    fuse_gemm_column_sums and lay_out_gemm_outputs before the plan (docs/passes.md); for the
    "cuda" backend, share_reshape_copies and drop_output_copies before fuse."""
    from graphc.passes.attention import fuse_attention
    from graphc.passes.fuse import fuse
    from graphc.passes.gemm_order import transpose_weight_products
    from graphc.passes.plan import plan_buffers
    from graphc.passes.simplify import simplify

    front = [simplify, transpose_weight_products] if backend == "cpu" else [simplify]
    front += [fuse_attention] if backend == "cpu" else []  # graphc/passes/attention.py
    if graph is not None:
        from graphc.passes.bucket import bucket_allreduce, has_collectives
        from graphc.passes.fuse_waits import fuse_waits

        if has_collectives(graph):
            return front + [fuse, bucket_allreduce, fuse_waits, plan_buffers]
    if backend == "cpu":  # row programs (graphc.passes.fuse_rows): the cpu backend lowers them
        from graphc.passes.batch_norm_backward import fuse_batch_norm_backward
        from graphc.passes.batch_norm_relu import fuse_batch_norm_relu
        from graphc.passes.conv_channel_sums import fuse_conv_channel_sums
        from graphc.passes.fuse_rows import fuse_rows
        from graphc.passes.gemm_column_sums import fuse_gemm_column_sums
        from graphc.passes.gemm_output_layout import lay_out_gemm_outputs
        from graphc.passes.reshape_share import share_reshape_copies
        from graphc.passes.row_recompute import recompute_row_values
        from graphc.passes.sibling_sums import merge_sibling_sums

        # fuse_rows again: the column sums that now read what a row program reads join it;
        # fuse_gemm_column_sums: a bias gradient summed in the epilogue that computes it;
        # lay_out_gemm_outputs: head merges written by their GEMM instead of copied
        return front + [share_reshape_copies, fuse, fuse_batch_norm_relu,
                        fuse_conv_channel_sums, fuse_rows,
                        recompute_row_values, fuse_rows, merge_sibling_sums,
                        fuse_batch_norm_backward, fuse_gemm_column_sums,
                        lay_out_gemm_outputs, plan_buffers]
    if backend == "cuda":  # a head merge reshaped twice is copied once (reshape_share.py)
        from graphc.passes.output_copies import drop_output_copies
        from graphc.passes.reshape_share import share_reshape_copies

        return front + [share_reshape_copies, drop_output_copies, fuse, plan_buffers]
    return front + [fuse, plan_buffers]


__all__ = ["Pass", "PassRecord", "PipelineReport", "default_passes", "run_pipeline"]
