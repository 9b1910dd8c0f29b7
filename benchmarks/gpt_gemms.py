"""The GPT step's GEMMs in OpenBLAS or in small_gemm's generated kernels, in one process.

    python -m benchmarks.gpt_gemms                  # the GPT, 20 interleaved rounds
    python -m benchmarks.gpt_gemms --rounds 10 --quick
    python -m benchmarks.gpt_gemms --variant after --variant weights   # two of them

Fifteen variants are compiled from the same weights (benchmarks/model_steps.py's GPT, n_embd
128, 4 layers, context 64, batch 16; `--quick`: its smoke size), each with its own
GRAPHC_CACHE_DIR (the pipeline cache keys on graphc's source, the same for all), by
setting graphc.backends.cpu.small_gemm's thresholds (and gemm_addends.FOLD, gemm_panels.
PANEL_MAJOR_B, gemm_epilogue.FOLD, rows.PREFETCH, graphc.passes.attention.ONE_BLOCK_MAX)
while each compiles:
- "before": neither small blocks with b read transposed (`MAX_TRANSPOSED_BLOCK = 0`) nor
  medium products (`MEDIUM_N = 0`): attention's heads and the projections in OpenBLAS;
- "heads": attention's Q K^T and dO V^T per head in generated kernels;
- "after": those, and the medium products (the projections, the second Linear's forward,
  their input gradients), but the weight gradients in OpenBLAS (`LONG_K_MIN` out of reach);
- "weights": also the weight gradients x^T @ dy (k = 1024 tokens, m <= 128) in the
  k-outer generated kernel;
- "addends": also the bias and residual adds in the generated kernels' stores
  (graphc.backends.cpu.gemm_addends; the variants above keep them elementwise kernels);
  the eighth session's end (b read in place, `MEDIUM_N = 128`);
- "panels": also each medium product's b copied panel-major first
  (graphc.backends.cpu.gemm_panels, `PANEL_MAJOR_B`);
- "wide": also the 1024 x 512 x 128 products (linear1 forward, linear2's input gradient) in
  the medium kernel (`MEDIUM_N = 512`);
- "chunked": also a fused GEMM's elementwise epilogue (linear1's GELU) run row chunk by
  row chunk in the GEMM's kernel (graphc.backends.cpu.gemm_epilogue), which the variants
  above keep a kernel of its own (docs/performance.md, "GPT step, ninth session");
- "fused_heads": also attention fused at context 64 (graphc.passes.attention's
  one-block rule), each head in graphc.backends.cpu.attention_small's kernels, where the
  variants above keep the unfused chain (docs/performance.md, "GPT's heads and weight
  gradients, ninth session");
- "prefetch": also the k-outer kernel prefetching a's lines ahead (small_gemm's
  PREFETCH_A_K), linear1's weight gradient (m 512) still in OpenBLAS;
- "wgrad_cold": also linear1's in the k-outer kernel (`LONG_K_MAX_M = 512`;
  docs/performance.md, "GPT's weight gradients read cold, ninth session");
- "row_prefetch": also the row programs (the LayerNorms) asking for the rows 8 on
  (graphc.backends.cpu.rows `PREFETCH`; docs/performance.md, "GPT's non-GEMM kernels,
  tenth session");
- "k_chunks": also the [128 x 128] weight gradients in two chunks of tokens merged in
  order (small_gemm `K_CHUNKS`, graphc.backends.cpu.gemm_k_chunks), where the variants
  above split them by c's columns (docs/performance.md, "GPT's GEMMs, eleventh session");
- "addend_prefetch": also a residual added in a GEMM's stores asked for, each tile's rows
  of it, before the block of k that adds it (small_gemm `PREFETCH_ADDENDS`);
- "dk_view": the default: also dK's head merge a view (graphc.passes.gemm_output_layout
  `PERMUTE_CHAINS`: attention_backward's dk laid out through its two permutes), where the
  variants above copy it (docs/performance.md, "GPT step, twelfth session").
With `--mathlib-at REV`, one more variant, "mathlib@REV": the default settings with
graphc/backends/cpu/mathlib.py as git revision REV has it (its exp, erf, gelu, ... in every
kernel), so a change to mathlib is timed in one process against the code before it.
It prints each variant's median step time over interleaved rounds (CPU clock, one thread for
OpenMP and OpenBLAS), then from `graphc.profile` (3 interleaved profiles of each, each
kernel's median) the step's kernels by role: GEMMs by kind (a chunked epilogue counts with
its GEMM), b copies ("pack"), GEMM epilogues (a merge of k's chunks among them), row
programs, updates. `--shapes`: also each GEMM shape of the
step (m x n x k, what the node fuses), its count, FLOPs, time and GFLOP/s. `--threads 2`:
instead, each variant's step at one thread and at two, wall clock (benchmarks.step_threads'
step table: blocks of 8 calls rotating over variant and thread count; `--realtime`: each
call under SCHED_FIFO, as if the cores were free).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import defaultdict

from benchmarks.harness import (
    cache_root,
    compiled_variants,
    interleaved_process_times,
    interleaved_profiles,
    run_with_threads,
)

NO_LONG_K = {"LONG_K_MIN": 1 << 40}
NO_ADDENDS = {"gemm_addends.FOLD": False}
# the tenth session's end: the [128 x 128] weight gradients in column chunks, residuals read
# at the stores
# the eleventh session's end: dK's merge (two permutes from the attention's dk) copied
ELEVENTH = {"graphc.passes.gemm_output_layout.PERMUTE_CHAINS": False}
TENTH = {"K_CHUNKS": 0, "PREFETCH_ADDENDS": False, **ELEVENTH}
NO_ROW_PREFETCH = {"rows.PREFETCH": False, **TENTH}
NO_CHUNKED = {"gemm_epilogue.FOLD": False}
# attention at context 64 left as the unfused chain (graphc.passes.attention's one-block rule)
NO_ONE_BLOCK = {"graphc.passes.attention.ONE_BLOCK_MAX": 0}
# the weight gradients before a's prefetch: linear1's (m 512) in OpenBLAS, none prefetched
NO_PREFETCH = {"PREFETCH_A_K": None, "LONG_K_MAX_M": 128, **NO_ROW_PREFETCH}
# the eighth session's medium products: b read in place, n at most 128
EIGHTH = {"gemm_panels.PANEL_MAJOR_B": False, "MEDIUM_N": 128, **NO_CHUNKED, **NO_ONE_BLOCK,
          **NO_PREFETCH}
VARIANTS = {"before": {"MAX_TRANSPOSED_BLOCK": 0, **NO_LONG_K, **NO_ADDENDS, **EIGHTH,
                       "MEDIUM_N": 0},
            "heads": {**NO_LONG_K, **NO_ADDENDS, **EIGHTH, "MEDIUM_N": 0},
            "after": {**NO_LONG_K, **NO_ADDENDS, **EIGHTH},
            "weights": {**NO_ADDENDS, **EIGHTH},
            "addends": EIGHTH,
            "panels": {"MEDIUM_N": 128, **NO_CHUNKED, **NO_ONE_BLOCK, **NO_PREFETCH},
            "wide": {**NO_CHUNKED, **NO_ONE_BLOCK, **NO_PREFETCH},
            "chunked": {**NO_ONE_BLOCK, **NO_PREFETCH},
            "fused_heads": NO_PREFETCH,
            "prefetch": {"LONG_K_MAX_M": 128, **NO_ROW_PREFETCH},
            "wgrad_cold": NO_ROW_PREFETCH,
            "row_prefetch": TENTH,
            "k_chunks": {"PREFETCH_ADDENDS": False, **ELEVENTH},
            "addend_prefetch": ELEVENTH,
            "dk_view": {}}

PACK_SHARE = 0.3  # a GEMM node's leading rows shorter than this share of its longest: packs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (20)")
    parser.add_argument("--quick", action="store_true", help="the GPT's smoke size")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS),
                        help="compare these variants only (repeatable; default: all)")
    parser.add_argument("--mathlib-at", metavar="REV",
                        help="add the variant mathlib@REV: mathlib.py as git revision REV")
    parser.add_argument("--threads", type=int, default=1, choices=(1, 2),
                        help="2: the step only, wall clock, at one thread and two "
                             "(benchmarks.step_threads' blocks of 8 calls; --rounds blocks)")
    parser.add_argument("--realtime", action="store_true",
                        help="with --threads 2: each call under SCHED_FIFO (root)")
    parser.add_argument("--shapes", action="store_true",
                        help="also each GEMM shape: count, FLOPs, time, GFLOP/s")
    args = parser.parse_args(argv)
    if args.rounds < 1:  # else every variant compiles, then each median is of nothing (nan)
        parser.error(f"--rounds must be at least 1, got {args.rounds}: nothing would be timed")
    # one thread for OpenMP and OpenBLAS: set before they load (numpy loads OpenBLAS when the
    # harness imports it), so the process starts again with them where they are not
    run_with_threads("benchmarks.gpt_gemms", args.threads,
                     sys.argv[1:] if argv is None else argv)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    with cache_root("gpt_gemms.") as root:
        variants = args.variant or list(VARIANTS)
        if args.mathlib_at:
            variants = [*variants, f"{MATHLIB_AT}{args.mathlib_at}"]
        _compare(args.rounds, args.quick, root, variants, args.threads, args.shapes,
                 args.realtime)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def owner(key: str):
    """(module, attribute) of a variant's setting: small_gemm's, a name with a module first
    that module of graphc.backends.cpu's, or one named in full from `graphc.` (a pass's)."""
    import importlib

    module, _, attr = key.rpartition(".")
    if module.startswith("graphc."):
        return importlib.import_module(module), attr
    return importlib.import_module(f"graphc.backends.cpu.{module or 'small_gemm'}"), attr


MATHLIB_AT = "mathlib@"  # a variant's name prefix: the default with a revision's mathlib
# the modules that bind graphc.backends.cpu.mathlib at import (others found loaded are
# swapped too: `_mathlib_users`)
MATHLIB_USERS = ("graphc.backends.cpu", "graphc.backends.cpu.scalars",
                 "graphc.backends.cpu.attention", "graphc.backends.cpu.attention_small",
                 "graphc.backends.cpu.philox")


@contextlib.contextmanager
def _variant(name: str, root: str):
    """While lowering variant `name`: its cache dir and its settings (`owner`), or a
    revision's mathlib (`MATHLIB_AT`)."""
    os.environ["GRAPHC_CACHE_DIR"] = os.path.join(root, name)  # read at each use
    if name.startswith(MATHLIB_AT):
        with _mathlib_swapped(name[len(MATHLIB_AT):]):
            yield
        return
    saved = {key: getattr(*owner(key)) for key in VARIANTS[name]}
    for key, value in VARIANTS[name].items():
        setattr(*owner(key), value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(*owner(key), value)


@contextlib.contextmanager
def _mathlib_swapped(revision: str):
    from benchmarks.gelu_loop import mathlib_at

    users = _mathlib_users()
    saved = [user.mathlib for user in users]
    replacement = mathlib_at(revision)
    for user in users:
        user.mathlib = replacement
    try:
        yield
    finally:
        for user, module in zip(users, saved):
            user.mathlib = module


def _mathlib_users() -> list:
    """MATHLIB_USERS, and any other loaded module of graphc that holds mathlib."""
    import importlib

    from graphc.backends.cpu import mathlib

    users = {name: importlib.import_module(name) for name in MATHLIB_USERS}
    for name, module in list(sys.modules.items()):
        if name.startswith("graphc.") and getattr(module, "mathlib", None) is mathlib:
            users[name] = module
    return list(users.values())


def _compare(rounds: int, quick: bool, root: str, variants: list[str], threads: int = 1,
             shapes: bool = False, realtime: bool = False) -> None:
    import numpy as np

    import graphc
    from benchmarks import model_steps

    def variant(name: str):
        return _variant(name, root)

    steps, arguments = compiled_variants(variants, variant,
                                         lambda: model_steps.graphc_gpt_step(quick))
    if threads > 1:  # wall clock, blocks rotating over variants and thread counts
        from benchmarks.step_threads import step_table

        return step_table(steps, arguments, threads, rounds, 8, realtime)
    times = interleaved_process_times(
        {name: lambda n=name: steps[n](*arguments[n]) for name in steps}, rounds)
    profiled = interleaved_profiles(steps, arguments, 3, variant, repeat=11)
    for name in profiled:
        rows, seconds = profiled[name]
        graph = None
        if shapes:
            with variant(name):  # the profiled (fused, planned) graph: its nodes' shapes
                graph = graphc.profile(steps[name], *arguments[name], repeat=1).graph
        roles = by_role(rows, seconds)
        print(f"gpt {name}: step {np.median(times[name]) * 1e3:.3f} ms (median of {rounds}); "
              f"{len(rows)} kernels, {sum(seconds.values()) * 1e3:.2f} ms")
        for role, (count, total) in sorted(roles.items(), key=lambda kv: -kv[1][1]):
            print(f"    {role:<44} {count:4d} kernels {total * 1e3:7.3f} ms")
        if shapes:
            print(f"  {name}: GEMM shapes (m x n x k, fused ops): count, GFLOP, ms, GFLOP/s")
            for label, (count, flops, total) in sorted(gemm_shapes(rows, seconds, graph)
                                                       .items(), key=lambda kv: -kv[1][2]):
                print(f"    {label:<56} {count:3d} {flops / 1e9:6.3f} {total * 1e3:7.3f} "
                      f"{flops / total / 1e9:6.1f}")


def gemm_shapes(rows: list, seconds: dict[int, float], graph) -> dict[str, list]:
    """{"m x n x k op": [nodes, FLOPs, seconds of their GEMM kernels]}: the GEMM kernel of
    each group (`by_role`'s grouping: its copies of b and epilogues left out) by the shape
    of its node's product, read from the profiled graph (a and b its first two inputs)."""
    import math

    producers = {value.name: node for node in graph.nodes for value in node.outputs}
    shapes: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for group in _groups(rows):
        if "matmul" not in group[0].op or not group[0].values:
            continue
        row = group[_gemm_index(group, seconds)]
        node = producers.get(row.values[0])
        if node is None:
            continue
        a, b = (value.type.shape for value in node.inputs[:2])
        m, k, n = math.prod(a[:-1]), a[-1], b[-1]
        op = "matmul" if node.op == "matmul" else row.op.removesuffix(")")[:30] + "..."
        label = f"{m} x {n} x {k} {op}"
        shapes[label][0] += 1
        shapes[label][1] += 2 * m * n * k
        shapes[label][2] += seconds[row.step]
    return dict(shapes)


def by_role(rows: list, seconds: dict[int, float]) -> dict[str, list]:
    """{role: [kernels, seconds]}. A GEMM node is one to three consecutive rows of the same
    output values: a copy of b first where the kernel packs it (a row under PACK_SHARE of
    the group's longest), the GEMM, then its epilogue where it has one."""
    roles: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for group in _groups(rows):
        if "matmul" in group[0].op:
            gemm = _gemm_index(group, seconds)
            for j, row in enumerate(group):
                role = ("b copy (pack)" if j < gemm else _gemm_role(row) if j == gemm
                        else "GEMM epilogue: gelu" if "gelu" in row.op else "GEMM epilogue")
                roles[role][0] += 1
                roles[role][1] += seconds[row.step]
            continue
        role = _other_role(group[0])
        roles[role][0] += 1
        roles[role][1] += seconds[group[0].step]
    return dict(roles)


def _groups(rows: list) -> list[list]:
    """The profile's rows in runs of consecutive kernels of one node (the same outputs)."""
    groups: list[list] = []
    for row in rows:
        if groups and row.values and groups[-1][-1].values == row.values \
                and row.step == groups[-1][-1].step + 1:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _gemm_index(group: list, seconds: dict[int, float]) -> int:
    """The GEMM's place in a node's kernels: copies of b (or a) come first and are short, the
    GEMM next, its epilogue (or a merge of k's chunks) last (a GELU epilogue can take longer
    than its GEMM)."""
    longest = max(seconds[row.step] for row in group)
    return next(j for j, row in enumerate(group) if seconds[row.step] >= PACK_SHARE * longest)


def _gemm_role(row) -> str:
    shape = row.shape
    if "[16,4," in shape:
        return "GEMM attention heads (64 x 64 x 32 ...)"
    if shape.split(",")[0] in ("f32[128", "f32[512") and "]," not in shape:
        return "GEMM weight gradients (k 1024, a^T)"
    if "512]" in shape:
        return "GEMM 1024 x 512 x 128 (linear1 fwd, linear2 dx)"
    return "GEMM 1024 x 128 x 128|512 (projections, dx)"


def _other_role(row) -> str:
    op, shape = row.op, row.shape
    if op.startswith("fused(mul,add,mul,add)"):
        return "SGD momentum updates"
    if "rsqrt" in op:
        return "LayerNorm forward"
    if "reduce_sum" in op and "[16,64,128]" in shape and "f32[128]" in shape:
        return "LayerNorm backward"
    if op == "softmax":
        return "softmax"
    if op.startswith("attention"):
        return "attention, fused (forward, backward)"
    if "where" in op and "reduce_sum" in op:
        return "softmax backward"
    if op in ("log_softmax", "nll_loss", "nll_loss_backward") or "exp,mul,sub" in op:
        return "loss"
    return "other (bias sums, concat, embedding, copies)"


if __name__ == "__main__":
    main()
