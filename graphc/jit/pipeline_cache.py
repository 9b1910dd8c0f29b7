"""graphc.compile's lookup of a traced graph in the pipeline cache, before the passes.

`lookup(graph, passes, backend)` names the traced graph's entry in
graphc.backends.cache.PIPELINES (`pipeline_key`: the graph's text, the passes, the backend,
its toolchain, graphc's source) and returns the executable and pipeline report a process
made for it earlier, skipping the passes, the lowering and LLVM; `store` keeps what a cold
compile made, for the next process. Only what the key fully covers is cached:
- the "cpu" backend as graphc registers it (`cache.storable`: its executables know how to
  be stored);
- static graphs (a symbolic graph's passes also read the trace's ShapeEnv);
- graphc's own passes (a user's pass is code the key cannot see);
- no GRAPHC_DUMP (the dumps are written by the passes and the lowering, which a hit skips);
- no collectives (their symbols are registered by the lowering).
A bad entry (the cache's checksum, the sections' structure, a graph that does not parse or
verify, objects that do not load) is deleted and counted corrupt, and the call compiles as
if there had been none.
"""

from __future__ import annotations

import json

from graphc import config
from graphc.backends import cache
from graphc.errors import GraphcError
from graphc.ir.graph import Graph
from graphc.ir.printer import format_graph


def key_of(graph: Graph, passes, backend: str, options: dict | None = None) -> str | None:
    """The graph's pipeline key, or None when this graph and pipeline are not cached."""
    kind = cache.storable(backend)
    if kind is None or config.dump_dir() is not None:
        return None
    if any(v.type.is_symbolic for v in graph.inputs):
        return None
    toolchain = kind.toolchain(graph)
    if toolchain is None:
        return None
    return cache.pipeline_key(format_graph(graph), passes, backend, options or {}, toolchain,
                              (kind.__module__.rsplit(".", 1)[0],))


def lock(key: str):
    """The lock under which this process compiles the graph `key` names."""
    return cache.PIPELINES.lock(key)


def lookup(key: str, backend: str):
    """(executable, report) from the entry `key`, or None (a miss, or a bad entry: deleted)."""
    sections = cache.PIPELINES.read(key)
    if sections is None:
        cache.PIPELINES.count("misses")
        return None
    try:
        sections = cache.unpack_sections(sections)
        executable = cache.storable(backend).from_sections(sections)
        report = _report(sections.get("report", b"[]"))
    except (ValueError, GraphcError):
        cache.PIPELINES.discard(key)
        cache.PIPELINES.count("misses")
        return None
    cache.PIPELINES.count("hits")
    return executable, report


def store(key: str, executable, report) -> None:
    """Keep what the passes and the backend made of the graph `key` names."""
    sections = executable.sections()
    if sections is None:
        return
    records = [[r.name, r.seconds, r.nodes_before, r.nodes_after] for r in report.records]
    sections["report"] = json.dumps(records).encode()
    cache.PIPELINES.write(key, cache.pack_sections(sections))


def _report(data: bytes):
    """The PipelineReport the cold compile made (its passes, times and node counts)."""
    from graphc.passes import PassRecord, PipelineReport

    try:
        records = [PassRecord(str(n), float(s), int(b), int(a)) for n, s, b, a in
                   json.loads(data)]
    except (TypeError, ValueError) as err:
        raise ValueError(f"a bad pipeline report: {err}") from None
    return PipelineReport(records)
