"""A Winograd block's 16 transform-domain GEMMs alone: the BLAS against the generated kernel.

    python -m benchmarks.winograd_gemm                 # ResNet-18's shapes, 7 rounds
    python -m benchmarks.winograd_gemm --rounds 3 --vectors 2
    python -m benchmarks.winograd_gemm --switch ROWS_OVER_PANELS --values 0 2

For each block shape conv_winograd runs in ResNet-18's training step (CIFAR, width 64,
batch 32: forward and input gradient `M = U @ V`, weight gradient `dU^T (+)= V @ Y`, at
64, 128, 256 and 512 channels), one LLVM module holds a function that makes the block's
16 BLAS calls (graphc's resolved cblas_sgemm, as conv_winograd emits them) and the
generated function of graphc.backends.cpu.winograd_gemm; each is called through ctypes on
the same operands, in alternation, each sample >= 20 ms of this process's CPU time
(OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1), and the medians printed with the GEMMs'
GFLOP/s (2*m*n*k*16 a block) and the largest difference between the two results. Shapes
that winograd_gemm.plan leaves to the BLAS show the BLAS alone, unless `--all`;
`--vectors` and `--k-block` set the kernel's tile width and block of k (winograd_gemm.
plan's arguments; several `--k-block` values: one kernel each, all alternated).
`--switch NAME --values V ...`: one kernel per value of winograd_gemm's module constant
NAME (set while it is generated), all alternated with the BLAS, each labelled NAME=V.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import time

# (pass, channels, tiles): the transform-domain products of ResNet-18's Winograd blocks
# (the input gradient's products have the forward's form: its U is stored transposed)
CASES = (("fwd", 64, 64), ("fwd", 128, 64), ("fwd", 256, 128), ("fwd", 512, 128),
         ("gw", 64, 64), ("gw", 128, 64), ("gw", 256, 64), ("gw", 512, 64))


def spaced(n: int) -> int:
    return n + 32  # conv_winograd's distance between transform-domain matrices


def block_shape(kind: str, c: int, t: int) -> dict:
    """The block's products as conv_winograd makes them: m, n, k, a's strides, ldb, ldc,
    steps, beta."""
    if kind == "gw":  # dU^T[xi] (c x c) += V[xi] (c x t) @ Y[xi] (t x c)
        return dict(m=c, n=c, k=t, a_row=t, a_col=1, ldb=c, ldc=c, a_step=spaced(c * t),
                    b_step=spaced(c * t), c_step=spaced(c * c), beta=1.0)
    # M[xi] (c x t) = U[xi] (c x c) @ V[xi] (c x t)
    return dict(m=c, n=t, k=c, a_row=c, a_col=1, ldb=t, ldc=t, a_step=spaced(c * c),
                b_step=spaced(c * t), c_step=spaced(c * t), beta=0.0)


def build(shapes: list[dict], vectors: int | None, k_blocks: list[int | None],
          max_k: int | None = None) -> list[dict]:
    """One compiled module: per shape, {"blas": its 16 BLAS calls, "kernel": the generated
    function (with several `k_blocks`, "kernel k<K>" for each), absent where winograd_gemm.
    plan declines (`max_k` given: every shape)}."""
    from llvmlite import ir

    from graphc.backends.cpu import llvm, winograd_gemm
    from graphc.backends.cpu.blas import resolve_blas
    from graphc.backends.cpu.values import F32, I32, I64, PTR, i64

    blas = resolve_blas()
    iT = I64 if blas.ilp64 else I32
    module = ir.Module(name="winograd_gemm_bench")
    sgemm = ir.Function(module, ir.FunctionType(ir.VoidType(), [
        I32, I32, I32, iT, iT, iT, F32, PTR, iT, PTR, iT, F32, PTR, iT]), blas.symbol("float32"))
    names = []
    for i, s in enumerate(shapes):
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, F32]),
                         f"blas_{i}")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        a, bm, c, beta = fn.args
        ta, lda = (111, s["a_row"]) if s["a_col"] == 1 else (112, s["a_col"])
        for xi in range(winograd_gemm.POSITIONS):
            def at(p, step, xi=xi, b=b):
                return b.gep(p, [i64(xi * step)], inbounds=True, source_etype=F32)
            b.call(sgemm, [ir.Constant(I32, 101), ir.Constant(I32, ta), ir.Constant(I32, 111),
                           ir.Constant(iT, s["m"]), ir.Constant(iT, s["n"]),
                           ir.Constant(iT, s["k"]), ir.Constant(F32, 1.0),
                           at(a, s["a_step"]), ir.Constant(iT, lda), at(bm, s["b_step"]),
                           ir.Constant(iT, s["ldb"]), beta, at(c, s["c_step"]),
                           ir.Constant(iT, s["ldc"])])
        b.ret_void()
        found = {"blas": f"blas_{i}"}
        for k_block in k_blocks:
            g = winograd_gemm.plan(*(s[f] for f in ("m", "n", "k", "a_row", "a_col", "ldb",
                                                    "ldc", "a_step", "b_step", "c_step")),
                                   s["beta"] != 0.0, vectors=vectors, k_block=k_block,
                                   max_k=max_k)
            if g is not None:
                label = "kernel" if len(k_blocks) == 1 else f"kernel k{k_block}"
                found[label] = winograd_gemm.function(module, g).name
        names.append(found)
    library = llvm.compile_module(str(module), "winograd_gemm_bench", use_cache=False)
    argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float)
    return [{v: library.ctypes_function(n, None, argtypes) for v, n in found.items()}
            for found in names]


def switched_builds(shapes: list[dict], vectors: int | None, max_k: int | None, switch: str,
                    values: list[str]) -> list[dict]:
    """As `build`, one module per value of winograd_gemm's constant `switch` (a Python
    literal each, set while that module is generated): per shape {"blas": the first
    module's BLAS calls, "<switch>=<value>": that module's generated function}."""
    import ast

    from graphc.backends.cpu import winograd_gemm

    kept = getattr(winograd_gemm, switch)  # an unknown name fails here, before compiling
    merged: list[dict] = [{} for _ in shapes]
    for value in values:
        setattr(winograd_gemm, switch, ast.literal_eval(value))
        try:
            built = build(shapes, vectors, [None], max_k)
        finally:
            setattr(winograd_gemm, switch, kept)
        for found, new in zip(merged, built):
            found.setdefault("blas", new["blas"])
            if "kernel" in new:
                found[f"{switch}={value}"] = new["kernel"]
    return merged


def operands(s: dict, rng):
    import numpy as np

    positions = 16
    sizes = (s["a_step"], s["b_step"], s["c_step"])
    return [rng.standard_normal(positions * n).astype(np.float32) for n in sizes]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds (7)")
    parser.add_argument("--vectors", type=int, default=None, help="tile width in vectors")
    parser.add_argument("--k-block", type=int, nargs="+", default=[None],
                        help="k summed per block (several: one kernel each, alternated)")
    parser.add_argument("--all", action="store_true", help="the kernel for every shape, "
                        "also those winograd_gemm.plan leaves to the BLAS")
    parser.add_argument("--switch", help="a module constant of graphc.backends.cpu."
                        "winograd_gemm (ROWS_OVER_PANELS): one kernel per --values")
    parser.add_argument("--values", nargs="+", default=["False", "True"],
                        help="--switch's values (Python literals)")
    args = parser.parse_args(argv)
    if args.rounds < 1:  # else every figure is the median of nothing (nan)
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"
    import numpy as np

    shapes = [block_shape(*case) for case in CASES]
    max_k = 512 if args.all else None
    functions = build(shapes, args.vectors, args.k_block, max_k) if args.switch is None else \
        switched_builds(shapes, args.vectors, max_k, args.switch, args.values)
    rng = np.random.default_rng(0)
    for case, s, contenders in zip(CASES, shapes, functions):
        a, bm, c = operands(s, rng)
        pointers = (a.ctypes.data, bm.ctypes.data, c.ctypes.data, s["beta"])
        calls = {v: functools.partial(fn, *pointers) for v, fn in contenders.items()}
        errors = {v: largest_difference(s, fn, contenders["blas"], rng)
                  for v, fn in contenders.items() if v != "blas"}
        times = {v: [] for v in calls}
        for r in range(args.rounds):
            for v in (list(calls) if r % 2 else list(calls)[::-1]):
                calls[v]()
                count, start = 0, time.process_time()
                while time.process_time() - start < 0.02:
                    calls[v]()
                    count += 1
                times[v].append((time.process_time() - start) / count)
        flop = 2 * s["m"] * s["n"] * s["k"] * 16
        parts = [f"{v} {np.median(t) * 1e6:.1f} us ({flop / np.median(t) / 1e9:.0f} GFLOP/s)"
                 for v, t in times.items()]
        note = "".join(f"; max |{v} - blas| {e:.1e}" for v, e in errors.items())
        print(f"{case[0]} {case[1]} channels, {case[2]} tiles [{s['m']}x{s['k']}]@"
              f"[{s['k']}x{s['n']}]: " + "; ".join(parts) + note, flush=True)
    print("load average:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


def largest_difference(s: dict, kernel_fn, blas_fn, rng) -> float:
    """Largest difference between the two on fresh operands (c starting equal)."""
    import numpy as np

    a, bm, c = operands(s, rng)
    c2 = c.copy()
    kernel_fn(a.ctypes.data, bm.ctypes.data, c.ctypes.data, s["beta"])
    blas_fn(a.ctypes.data, bm.ctypes.data, c2.ctypes.data, s["beta"])
    return float(np.max(np.abs(c - c2)))


if __name__ == "__main__":
    main()
