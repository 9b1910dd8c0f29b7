"""build: `build_runtime(kind)` builds graphc's CUDA runtime library; `graphc build-runtime`.

`build_runtime("emu")` runs `make -C runtime/csrc emu` (-> runtime/build/libgraphc_rt_emu.so,
the CPU emulation), `build_runtime("cuda")` runs `make -C runtime/csrc cuda` (->
runtime/build/libgraphc_rt.so, needs nvcc). `main(argv)` is the CLI command
`graphc build-runtime [--emu|--cuda|--all]` (graphc/tools/cli.py imports it lazily).

Invariants: builds of one process are serialised (a lock), so concurrent first uses build
once; a failed build raises `RuntimeBuildError` with the command and the tail of its output,
never leaves the caller with a half-built library it believes in (make writes the target
last); nothing here loads the library.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading

from graphc.errors import GraphcError

KINDS = ("emu", "cuda")
_OUTPUT_TAIL = 4000  # characters of make's output kept in an error


class RuntimeBuildError(GraphcError, RuntimeError):
    """`make` for the runtime library failed or could not run."""


def runtime_dir() -> str:
    """The `runtime/` folder of the graphc checkout (next to the graphc package)."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(os.path.dirname(package), "runtime")


def source_dir() -> str:
    return os.path.join(runtime_dir(), "csrc")


def build_dir() -> str:
    return os.path.join(runtime_dir(), "build")


def emu_header() -> str:
    """runtime/csrc/emu/gc_emu.h: the header generated kernels are compiled against."""
    return os.path.join(source_dir(), "emu", "gc_emu.h")


_build_lock = threading.Lock()


def build_runtime(kind: str) -> str:
    """Run `make -C runtime/csrc <kind>`; return the library's path (see module docstring)."""
    if kind not in KINDS:
        raise RuntimeBuildError(f"build_runtime: unknown kind {kind!r}; expected one of "
                                f"{', '.join(KINDS)}")
    if not os.path.isfile(os.path.join(source_dir(), "Makefile")):
        raise RuntimeBuildError(f"build_runtime: no Makefile in {source_dir()}; the runtime "
                                "sources are missing from this checkout")
    if shutil.which("make") is None:
        raise RuntimeBuildError("build_runtime: `make` is not on PATH; install make (and g++"
                                f"{' and nvcc' if kind == 'cuda' else ''}) to build the runtime")
    if kind == "cuda" and shutil.which("nvcc") is None:
        raise RuntimeBuildError("build_runtime: nvcc is not on PATH; install the CUDA toolkit "
                                "to build libgraphc_rt.so, or use the emulation "
                                "(GRAPHC_CUDA=emu, `graphc build-runtime --emu`)")
    command = ["make", "-C", source_dir(), kind]
    with _build_lock:
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as error:
            raise RuntimeBuildError(f"build_runtime: cannot run {' '.join(command)}: "
                                    f"{error}") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-_OUTPUT_TAIL:]
        raise RuntimeBuildError(f"build_runtime: `{' '.join(command)}` failed with status "
                                f"{done.returncode}:\n{output}")
    from graphc.backends.cuda.rt import library_path

    path = library_path(kind)
    if not os.path.isfile(path):
        raise RuntimeBuildError(f"build_runtime: `{' '.join(command)}` succeeded but made no "
                                f"{path}")
    return path


def main(argv: list[str] | None = None) -> int:
    """`graphc build-runtime [--emu|--cuda|--all]` (default: --emu, plus --cuda when nvcc is
    on PATH). Prints each library built; returns 0, or 1 after printing why a build failed."""
    parser = argparse.ArgumentParser(prog="graphc build-runtime",
                                     description="Build graphc's CUDA runtime library.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--emu", action="store_true", help="the CPU emulation library only")
    group.add_argument("--cuda", action="store_true", help="the CUDA library only (nvcc)")
    group.add_argument("--all", action="store_true", help="both libraries")
    args = parser.parse_args(argv)
    if args.emu:
        kinds = ["emu"]
    elif args.cuda:
        kinds = ["cuda"]
    elif args.all:
        kinds = list(KINDS)
    else:
        kinds = ["emu"] + (["cuda"] if shutil.which("nvcc") else [])
    for kind in kinds:
        try:
            path = build_runtime(kind)
        except RuntimeBuildError as error:
            print(f"graphc build-runtime: {error}", file=sys.stderr)
            return 1
        print(f"built {path}")
    return 0


__all__ = ["KINDS", "RuntimeBuildError", "build_dir", "build_runtime", "emu_header", "main",
           "runtime_dir", "source_dir"]
