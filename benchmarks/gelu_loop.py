"""The GPT's GELU epilogue as one loop alone: gelu(x) and its derivative, instructions and time.

    python -m benchmarks.gelu_loop                      # 61 interleaved rounds, host CPU
    python -m benchmarks.gelu_loop --cpu znver3 --asm-only   # count another target's loop
    python -m benchmarks.gelu_loop --against HEAD~1     # also mathlib.py as of a revision

The loop computes what linear1's fused epilogue computes for each element of h, in float32:
gelu(h) (mathlib's `gelu`) and the derivative the backward reads, `(erf(h * 0.70710677) + 1)
* 0.5 + h * (exp(h * h * -0.5) * 0.39894228)` (as graphc's scalar ops render it, so LLVM's CSE
shares gelu's exp and erf terms with it), over 512K floats (one layer's [16, 64, 512]), the
loop marked `"prefer-vector-width"="512"` as scalars.WIDE_VECTOR_FUNCTIONS marks it.
Variants, each lowered as itself (llvmlite at O3 for the host, or `--cpu`):
- "own erf": the derivative's erf evaluates its own polynomials (`mathlib.ERF_AFTER_GELU`
  off: float32's degree-15 one on [1, 3.92]), as the eighth session left it;
- "erf from gelu": it takes gelu's (the default);
- with `--against REV`, "REV": mathlib.py as git revision REV has it (erf from gelu), so a
  change to mathlib is timed in one process against the code before it.
It prints the instructions of each variant's vector loop body (the assembly's block with the
most registers of the widest kind), then each variant's median CPU time over interleaved
rounds, and how far apart their derivatives are (erf's values differ within its bound; gelu's
are the same bits) (docs/performance.md, "GPT's GELU, ninth session").
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import re
from collections import Counter

VARIANTS = ("own erf", "erf from gelu")
ELEMENTS = 16 * 64 * 512


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=61, help="interleaved rounds (61)")
    parser.add_argument("--cpu", help="LLVM CPU name to generate for (default: the host)")
    parser.add_argument("--asm-only", action="store_true",
                        help="count instructions only (for a --cpu this host cannot run)")
    parser.add_argument("--against", metavar="REV",
                        help="also time mathlib.py as git revision REV has it")
    args = parser.parse_args(argv)
    import numpy as np

    from benchmarks.harness import interleaved_process_times

    variants = VARIANTS + ((args.against,) if args.against else ())
    kernels = {}
    for name in variants:
        with _variant(name):
            kernels[name], counts = _compile(args.cpu)
        total = sum(counts.values())
        top = ", ".join(f"{op} {n}" for op, n in counts.most_common(6))
        print(f"{name}: {total} instructions in the vector loop ({top})")
    if args.asm_only:
        return
    x = (np.random.default_rng(0).standard_normal(ELEMENTS) * 1.5).astype(np.float32)
    outs = {name: (np.empty_like(x), np.empty_like(x)) for name in variants}

    def call(name):
        gelu, derivative = outs[name]
        kernels[name](x.ctypes.data, gelu.ctypes.data, derivative.ctypes.data, x.size)

    times = interleaved_process_times(
        {name: (lambda n=name: call(n)) for name in variants}, args.rounds, 0.02)
    for name in variants:
        print(f"{name}: {np.median(times[name]) * 1e6:.0f} us per {ELEMENTS} elements "
              f"(median of {args.rounds})")
    (gelu_a, derivative_a), (gelu_b, derivative_b) = (outs[name] for name in VARIANTS)
    apart = np.abs(derivative_a.astype(np.float64) - derivative_b) / np.spacing(derivative_a)
    print(f"gelu same bits: {np.array_equal(gelu_a.view(np.int32), gelu_b.view(np.int32))}; "
          f"derivatives at most {apart.max():.2f} ulp apart")
    if args.against:
        gelu_r, derivative_r = outs[args.against]
        for label, ours, theirs in (("gelu", gelu_b, gelu_r),
                                    ("derivative", derivative_b, derivative_r)):
            with np.errstate(all="ignore"):
                ulps = np.abs(ours.astype(np.float64) - theirs) / np.spacing(np.abs(theirs))
            print(f"{label} against {args.against}: at most {np.nanmax(ulps):.2f} ulp apart")
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


@contextlib.contextmanager
def _variant(name: str):
    from graphc.backends.cpu import mathlib

    if name not in VARIANTS:  # a git revision's mathlib.py in mathlib's place
        import graphc.backends.cpu as cpu

        cpu.mathlib = mathlib_at(name)
        try:
            yield
        finally:
            cpu.mathlib = mathlib
        return
    after_gelu = mathlib.ERF_AFTER_GELU
    mathlib.ERF_AFTER_GELU = name == "erf from gelu"
    try:
        yield
    finally:
        mathlib.ERF_AFTER_GELU = after_gelu


def mathlib_at(revision: str):
    """graphc/backends/cpu/mathlib.py as git `revision` has it, as a module of its own."""
    import subprocess
    import types

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(["git", "show", f"{revision}:graphc/backends/cpu/mathlib.py"],
                            cwd=root, capture_output=True, text=True)
    if source.returncode:
        raise SystemExit(f"gelu_loop --against: no mathlib.py at {revision!r} "
                         f"({source.stderr.strip()}); give a revision of this repository")
    module = types.ModuleType(f"mathlib_at_{revision}")
    exec(compile(source.stdout, f"mathlib.py@{revision}", "exec"), module.__dict__)
    return module


_ENGINES = []  # each engine (with its target machine: an engine owns it) lives to the end


def _compile(cpu: str | None):
    """(ctypes function `void(float* x, float* gelu, float* derivative, i64 n)`, Counter of the
    vector loop's instructions by mnemonic)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    features = llvm.get_host_cpu_features().flatten() if cpu is None else ""
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=cpu or llvm.get_host_cpu_name(), features=features, opt=3, codemodel="jitdefault")
    module = llvm.parse_assembly(_loop_ir(llvm.get_process_triple()))
    module.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = tuning.slp_vectorization = True
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)
    blocks = re.split(r"\n(?=\.LBB\d+_\d+:)", machine.emit_assembly(module))
    widest = next(reg for reg in ("%zmm", "%ymm", "%xmm") if any(reg in t for t in blocks))
    loop = max(blocks, key=lambda text: text.count(widest))  # the vector loop, not its tail
    counts = Counter(line.split()[0] for line in loop.splitlines()
                     if line.startswith("\t") and line.strip()[0] not in ".#")
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    _ENGINES.append((engine, machine))
    signature = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int64)
    return signature(engine.get_function_address("gelu_loop")), counts


def _loop_ir(triple: str) -> str:
    from llvmlite import ir

    from graphc.backends.cpu import mathlib

    f32, i64, ptr = ir.FloatType(), ir.IntType(64), ir.PointerType()
    module = ir.Module(name="gelu_loop")
    module.triple = triple
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, i64]), "gelu_loop")
    for arg in fn.args[:3]:
        arg.add_attribute("noalias")
    src, gelu_out, derivative_out, n = fn.args
    entry, loop, done = (fn.append_basic_block(s) for s in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    x = b.load(b.gep(src, [i], source_etype=f32), typ=f32)

    def const(value: float):
        return ir.Constant(f32, value)

    gelu = mathlib.emit(b, "gelu", [x])
    erf = mathlib.emit(b, "erf", [b.fmul(x, const(math.sqrt(0.5)))])
    exp = mathlib.emit(b, "exp", [b.fmul(b.fmul(x, x), const(-0.5))])
    cdf = b.fmul(b.fadd(erf, const(1.0)), const(0.5))
    derivative = b.fadd(cdf, b.fmul(x, b.fmul(exp, const(1.0 / math.sqrt(2.0 * math.pi)))))
    b.store(gelu, b.gep(gelu_out, [i], source_etype=f32))
    b.store(derivative, b.gep(derivative_out, [i], source_etype=f32))
    following = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(following, loop)
    b.cbranch(b.icmp_signed("<", following, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    text = re.sub(r'(define void @"gelu_loop"\([^)]*\))', r"\1 #0", str(module))
    return text + '\nattributes #0 = { "prefer-vector-width"="512" }\n'


if __name__ == "__main__":
    main()
