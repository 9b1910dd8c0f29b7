"""Where the time goes, for the cases that missed their targets (`run.py --profile`).

For a compiled callable the profile splits one call three ways, each timed as a median:
- *call*: the whole `compiled(...)` (guards: the signature of the call; binding arguments,
  parameters, optimizer state and `.grad`s; the native call; writing updates back; assigning
  `.grad`s; wrapping outputs),
- *run*: `executable.run(*arrays)` on arrays of the graph's input types (checks, output
  allocation, ctypes marshalling, the native call, copying outputs out of the arena),
- *native*: the module's `run` function called directly through ctypes with prepared
  pointer arrays (the generated code alone, plus one ctypes call).
`kernel_table` then times every scheduled kernel of the planned graph on its own: each
non-view node becomes a one-node graph compiled by the CPU backend and called natively (a
kernel alone sees warm caches the full step may not, so the sum need not equal *native*).
For training steps it adds the top of cProfile over compiled calls (the Python per-call work)
and PyTorch's own profile of its eager step, the anchor. Inputs of the standalone graphs are
random normal floats and zero integers (valid class labels).

Reaching into CpuExecutable's private `_run`/`_arena_ptr`/`_copied` is deliberate: measuring
the generated code without the Python around it needs the raw entry point.
"""

from __future__ import annotations

import cProfile
import ctypes
import io
import pstats
import time

import numpy as np

import graphc
from benchmarks import cases, models
from benchmarks.harness import CaseResult, now
from graphc.tools.profile import kernel_label

_TOP = 12


def median_seconds(fn, min_seconds: float = 0.3, max_calls: int = 2000) -> float:
    """Median seconds per call of fn() over ~min_seconds of samples (each >= 0.2 ms), read
    from the harness's clock (wall or CPU time, as run.py --clock chose)."""
    fn()
    start = now()
    fn()
    once = max(now() - start, 1e-7)
    number = max(1, int(2e-4 / once))
    samples, started = [], time.perf_counter()
    while (len(samples) < 5 or time.perf_counter() - started < min_seconds) and \
            len(samples) * number < max_calls:
        start = now()
        for _ in range(number):
            fn()
        samples.append((now() - start) / number)
    return float(np.median(samples))


def random_inputs(graph) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = []
    for v in graph.inputs:
        dtype = np.dtype(v.type.dtype.np)
        shape = tuple(v.type.shape)
        arrays.append(rng.standard_normal(shape).astype(dtype) if dtype.kind == "f"
                      else np.zeros(shape, dtype))
    return arrays


def native_call(executable, arrays: list[np.ndarray]):
    """A no-argument function calling the executable's generated `run` directly."""
    outs = [np.empty(t.shape, t.dtype.np) for t in executable._copied]
    in_ptrs = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
    out_ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
    fn, arena = executable._run, executable._arena_ptr
    # the pointers stay valid while the closure lives (the executable holds the arena and
    # the library: a closure that outlived it wrote into freed memory)
    keep = (arrays, outs, executable)

    def call():
        return fn(in_ptrs, out_ptrs, arena), keep

    return call


def call_breakdown(call, executable) -> tuple[str, float]:
    """A markdown table of call / run / native medians; returns it and the native seconds."""
    arrays = random_inputs(executable.graph)
    t_call = median_seconds(call)
    t_run = median_seconds(lambda: executable.run(*arrays))
    t_native = median_seconds(native_call(executable, arrays))
    rows = [("compiled call (Python guards, binding, write-back)", t_call),
            ("executable.run (checks, ctypes, output copies)", t_run),
            ("native run (generated code + one ctypes call)", t_native)]
    lines = ["| layer | median | share of the call |", "|---|---|---|"]
    lines += [f"| {name} | {_us(t)} | {t / t_call:.0%} |" for name, t in rows]
    return "\n".join(lines), t_native


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def kernel_table(graph, native_total: float | None = None) -> str:
    """Every scheduled non-view node of a planned graph timed alone (see the docstring)."""
    from graphc.backends.common import planned
    from graphc.backends.cpu.executable import CpuExecutable
    from graphc.ir.graph import Graph, Node, Value
    from graphc.ops.registry import REGISTRY

    plan = planned(graph)  # an executable from the pipeline cache plans on first use
    rows = []
    for step, node in enumerate(plan.schedule):
        if REGISTRY[node.op].view:
            continue
        inputs = [Value(f"i{k}", v.type) for k, v in enumerate(node.inputs)]
        outputs = [Value(f"o{k}", v.type) for k, v in enumerate(node.outputs)]
        alone = Graph(f"kernel{step}", inputs,
                      [Node(node.op, inputs, dict(node.attrs), outputs, node.loc)], outputs)
        executable = CpuExecutable(alone)
        seconds = median_seconds(native_call(executable, random_inputs(alone)), 0.05)
        shapes = ", ".join(str(v.type) for v in node.outputs)
        rows.append((seconds, step, kernel_label(node), shapes))
    total = sum(r[0] for r in rows)
    lines = ["| step | kernel | output | median alone | share of the sum |",
             "|---|---|---|---|---|"]
    for seconds, step, label, shapes in sorted(rows, reverse=True):
        lines.append(f"| {step} | {label[:90]} | {shapes} | {_us(seconds)} | "
                     f"{seconds / total:.0%} |")
    summary = f"\n\n{len(rows)} kernels, sum {_us(total)}"
    if native_total is not None:
        summary += f" (the whole native step: {_us(native_total)})"
    return "\n".join(lines) + summary


def cprofile_top(call, calls: int) -> str:
    """The top of cProfile (by own time) over `calls` calls, as a text block."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(_TOP)
    body = out.getvalue()
    body = body[body.index("ncalls"):] if "ncalls" in body else body
    return f"```\n{calls} calls\n{body.rstrip()}\n```"


def torch_profile(step, calls: int = 30) -> str:
    """PyTorch's profile of its own eager step (the anchor), top ops by self CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=_TOP)
    return f"```\n{calls} calls, torch {torch.__version__}\n{table.rstrip()}\n```"


# ---- per case -------------------------------------------------------------------------------
def profile_train_step(name: str, batch: int, sizes: cases.Sizes) -> str:
    x, y = models.batch(name, batch, sizes.mlp)
    model = models.graphc_model(name, sizes.mlp)
    compiled = graphc.compile(models.graphc_step(model), backend="cpu")
    gx, gy = graphc.tensor(x), graphc.tensor(y)
    for _ in range(cases.AGREE_STEPS):
        compiled(gx, gy)
    breakdown, native = call_breakdown(lambda: compiled(gx, gy), compiled.executable)
    parts = ["Per-call layers:", breakdown,
             "Scheduled kernels of the compiled step, each compiled and timed alone:",
             kernel_table(compiled.optimized_graph, native),
             "Python time inside compiled calls (cProfile, by own time):",
             cprofile_top(lambda: compiled(gx, gy), 200 if batch == 1 else 50)]
    try:
        import torch
    except ImportError:
        return "\n\n".join(parts)
    cases.torch_or_none()
    tmodel = models.torch_copy(model, name, sizes.mlp)
    tstep = models.torch_step(tmodel)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    parts += ["The anchor, PyTorch eager, profiled by torch.profiler:",
              torch_profile(lambda: tstep(tx, ty))]
    return "\n\n".join(parts)


def profile_elementwise(sizes: cases.Sizes) -> str:
    n = sizes.chain_elements
    x = graphc.tensor(np.random.default_rng(2).standard_normal(n).astype(np.float32))
    compiled = graphc.compile(cases.graphc_chain, backend="cpu")
    with graphc.no_grad():
        compiled(x)
        breakdown, native = call_breakdown(lambda: compiled(x), compiled.executable)
    src = x.numpy()
    dst = np.empty_like(src)
    copy = median_seconds(lambda: np.copyto(dst, src))
    ir = compiled.executable.lowered.ir_text
    parallel = any(s in ir for s in ("GOMP_", "__kmpc_", "omp_"))
    traffic = 2 * src.nbytes  # read x, write the result
    return "\n\n".join([
        "Per-call layers:", breakdown,
        f"The native kernel moves {traffic / 2**20:.0f} MiB in {_us(native)}: "
        f"{traffic / native / 1e9:.1f} GB/s; numpy's copy of the same array (same traffic) "
        f"takes {_us(copy)} ({traffic / copy / 1e9:.1f} GB/s). The generated module "
        f"{'calls' if parallel else 'does not call'} the OpenMP runtime "
        f"({'multi-threaded' if parallel else 'the kernel runs on one core'}).",
        "The kernel in the optimized graph:",
        f"```\n{compiled.optimized_graph}\n```"])


def profile_sgemm(n: int) -> str:
    rng = np.random.default_rng(3)
    a, b = (graphc.tensor(rng.standard_normal((n, n)).astype(np.float32)) for _ in range(2))
    compiled = graphc.compile(cases.graphc_matmul, backend="cpu")
    with graphc.no_grad():
        compiled(a, b)
        breakdown, native = call_breakdown(lambda: compiled(a, b), compiled.executable)
    an, bn = a.numpy(), b.numpy()
    t_numpy = median_seconds(lambda: an @ bn)
    flops = 2.0 * n**3
    return "\n\n".join([
        "Per-call layers:", breakdown,
        f"numpy `a @ b`: {_us(t_numpy)} ({flops / t_numpy / 1e9:.1f} GFLOP/s); graphc's native "
        f"run: {_us(native)} ({flops / native / 1e9:.1f} GFLOP/s). Both call the same "
        "OpenBLAS (numpy's bundled scipy-openblas)."])


def profile_conv(sizes: cases.Sizes) -> str:
    n, c_in, c_out, hw = sizes.conv
    rng = np.random.default_rng(4)
    x = graphc.tensor(rng.standard_normal((n, c_in, hw, hw)).astype(np.float32))
    w = graphc.tensor(rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32))
    b = graphc.tensor(rng.standard_normal(c_out).astype(np.float32))
    compiled = graphc.compile(lambda x, w, b: graphc.conv2d(x, w, b, padding=1), backend="cpu")
    with graphc.no_grad():
        compiled(x, w, b)
        breakdown, native = call_breakdown(lambda: compiled(x, w, b), compiled.executable)
    k = c_in * 9
    per_image_a = rng.standard_normal((c_out, k)).astype(np.float32)
    per_image_b = rng.standard_normal((k, hw * hw)).astype(np.float32)
    batched_b = rng.standard_normal((k, n * hw * hw)).astype(np.float32)
    t_image = median_seconds(lambda: per_image_a @ per_image_b)
    t_batched = median_seconds(lambda: per_image_a @ batched_b)
    return "\n\n".join([
        "Per-call layers:", breakdown,
        f"The GEMM work of this convolution through numpy's OpenBLAS: one image's "
        f"[{c_out}x{k}] @ [{k}x{hw * hw}] takes {_us(t_image)}, so {n} per-image GEMMs take "
        f"~{_us(n * t_image)}; one GEMM over the whole batch [{c_out}x{k}] @ "
        f"[{k}x{n * hw * hw}] takes {_us(t_batched)}. graphc's native run: {_us(native)}.",
        "The kernel in the optimized graph:", f"```\n{compiled.optimized_graph}\n```"])


def profile_compile(case: CaseResult) -> str:
    stages = case.extra["stages"]
    lines = ["| stage | median |", "|---|---|"]
    lines += [f"| {k} | {v * 1e3:.0f} ms |" for k, v in stages.items()]
    passes = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in case.extra["passes"].items())
    return "\n".join(lines) + (f"\n\nPasses: {passes}. LLVM IR of the step: "
                               f"{case.extra['ir_chars']:,} characters.")


def profile_model_step(name: str) -> str:
    """The GPT or ResNet-18 step (benchmarks/model_steps.py, full size) under graphc.profile:
    time per kind of kernel, then the slowest kernels."""
    from benchmarks import model_steps

    shape = model_steps.FULL[name]
    graphc.manual_seed(0)
    model = model_steps.build(graphc, name, shape)
    x, y = model_steps.batch_of(name, shape)
    step = graphc.compile(models.graphc_step(model), backend="cpu")
    report = graphc.profile(step, graphc.tensor(x), graphc.tensor(y), repeat=5)
    return kernel_kinds(report)


def kernel_kinds(report) -> str:
    """A graphc.profile report as time per kind of kernel, then the slowest kernels."""
    kinds: dict[str, list[float]] = {}
    for row in report.rows:
        kind = row.op.split("(")[0] if not row.op.startswith("fused(") else (
            "fused " + ("GEMM epilogue" if row.op.startswith(("fused(matmul", "fused(conv2d"))
                        else "elementwise/reduction"))
        kinds.setdefault(kind, []).append(row.seconds)
    total = sum(r.seconds for r in report.rows)
    lines = ["| kernel kind | count | time | share |", "|---|---|---|---|"]
    for kind, times in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {kind} | {len(times)} | {_us(sum(times))} | "
                     f"{sum(times) / total:.0%} |")
    top = "\n".join(report.table().splitlines()[:16])
    return "\n".join(lines) + f"\n\nThe slowest kernels:\n\n```\n{top}\n```"


def profile_missed(results: list[CaseResult], sizes: cases.Sizes, log) -> str:
    """A markdown section per case that missed its target."""
    sections = ["## Profiles of the missed targets"]
    for case in results:
        if case.met is not False:
            continue
        log(f"profiling {case.name} ...")
        if case.name.startswith(("mlp_", "lenet5_")):
            name, batch = case.name.split("_b")
            body = profile_train_step(name, int(batch), sizes)
        elif case.name == "elementwise_chain":
            body = profile_elementwise(sizes)
        elif case.name.startswith("sgemm_"):
            body = profile_sgemm(int(case.name.split("_")[1]))
        elif case.name == "conv2d":
            body = profile_conv(sizes)
        elif case.name.startswith(("gpt_", "resnet18_")):
            body = profile_model_step(case.name.split("_")[0])
        elif case.name.startswith(("lstm_", "vae_", "dcgan_", "mobilenet_")):
            from benchmarks.family_steps import profile_family_step

            body = profile_family_step(case.name.split("_")[0])
        else:
            body = profile_compile(case)
        figure = f"graphc {case.ratio:.2f} s" if case.anchor is None else \
            f"graphc/{case.anchor} {case.ratio:.2f}x"
        sections.append(f"### {case.description} ({figure}, target {case.target_text})"
                        f"\n\n{body}")
    if len(sections) == 1:
        sections.append("Every target was met.")
    return "\n\n".join(sections) + "\n"
