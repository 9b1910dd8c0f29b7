"""llvm_worker: LLVM IR text -> optimised object code, in this process or in a worker process.

`object_code(ir_text, name, level)` parses and verifies the text in a private LLVM context,
runs the new pass manager's O`level` pipeline (loop and SLP vectorisation, unrolling) for
the host CPU and its features, and returns the ELF object. graphc.backends.cpu.llvm calls it
in the compiling process, and, for a large module split into parts, in worker processes that
run this file as a script (`python -P llvm_worker.py`): it imports llvmlite and the standard
library only, so a worker starts in a fraction of a second and never imports graphc nor the
user's main module (multiprocessing's spawn and forkserver would re-run a script that has no
`if __name__ == "__main__"` guard).

Worker protocol (`serve`), over stdin/stdout: a request is a header `<III` (level, name
bytes, text bytes) then the name and the text (UTF-8); the answer is `<BQ` (0 = object code,
1 = error message) then that many bytes. A level is the pipeline's O level, plus
`FAST_CODEGEN` for LLVM's fast instruction selection (code generation at -O0) instead of
-O3: for loop-free code such as the CPU backend's driver (a straight line of kernel calls,
hundreds of kilobytes on a large step), where -O3 code generation costs 4x and buys nothing.
EOF on stdin ends the worker, so a worker never outlives its parent's pipe.

Invariants: each call makes its own target machine and context and frees both (module
first, PERF_NOTES: an engine owns its target machine; this one is never given to an
engine); an IR error raises `IRError` with LLVM's message (no graphc import here: the
caller turns it into its LLVMCompileError).
"""

from __future__ import annotations

import os
import struct
import sys

import llvmlite.binding as llvm

REQUEST = struct.Struct("<III")
ANSWER = struct.Struct("<BQ")
FAST_CODEGEN = 16  # added to a level: code generation at -O0 (see the module docstring)
_ready = False


class IRError(ValueError):
    """LLVM rejected the module text (its message, without llvmlite's prefix)."""


def initialize() -> None:
    global _ready
    if not _ready:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()
        _ready = True


def target_machine(opt: int = 3) -> llvm.TargetMachine:
    """A new target machine for the host (jitdefault = the large code model on x86-64:
    MCJIT may place sections and the symbols they call more than 2 GiB apart)."""
    initialize()
    return llvm.Target.from_triple(llvm.get_process_triple()).create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=opt, codemodel="jitdefault", jit=True)


def verify(ir_text: str) -> None:
    """IRError unless `ir_text` parses and verifies (in a private context, freed after)."""
    initialize()
    context = llvm.create_context()
    try:
        module = llvm.parse_assembly(ir_text, context=context)
        try:
            module.verify()
        finally:
            module.close()
    except RuntimeError as error:
        raise IRError(str(error).replace("LLVM IR parsing error\n", "").strip()) from None
    finally:
        context.close()


def with_optimized(ir_text: str, name: str, level: int, use):
    """Parse, verify and optimise `ir_text` at O`level` (with `FAST_CODEGEN`: a target
    machine generating code at -O0) in a private context, return `use(module, tm)`, then
    free the module and its context (module first)."""
    tm = target_machine(0 if level & FAST_CODEGEN else 3)
    level &= ~FAST_CODEGEN
    context = llvm.create_context()
    module = None
    try:
        try:
            module = llvm.parse_assembly(ir_text, context=context)
            module.verify()
        except RuntimeError as error:
            raise IRError(str(error).replace("LLVM IR parsing error\n", "").strip()) from None
        module.name = name
        module.triple = tm.triple
        module.data_layout = str(tm.target_data)
        tuning = llvm.create_pipeline_tuning_options(speed_level=level)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        tuning.loop_unrolling = True
        builder = llvm.create_pass_builder(tm, tuning)
        builder.getModulePassManager().run(module, builder)
        return use(module, tm)
    finally:
        if module is not None:
            module.close()
        context.close()


def _emit(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> bytes:
    return tm.emit_object(module)


def object_code(ir_text: str, name: str, level: int = 3) -> bytes:
    """The optimised object code of `ir_text` (IRError when LLVM rejects it)."""
    return with_optimized(ir_text, name, level, _emit)


def _read(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def serve(inp=None, out=None) -> None:
    """Answer requests (see the module docstring) until EOF."""
    inp = inp or sys.stdin.buffer
    out = out or sys.stdout.buffer
    while True:
        header = _read(inp, REQUEST.size)
        if header is None:
            return
        level, name_len, text_len = REQUEST.unpack(header)
        name, text = _read(inp, name_len), _read(inp, text_len)
        if name is None or text is None:
            return
        try:
            status, payload = 0, object_code(text.decode(), name.decode(), level)
        except Exception as error:  # noqa: BLE001 (every failure goes back to the parent)
            status, payload = 1, f"{type(error).__name__}: {error}".encode()
        out.write(ANSWER.pack(status, len(payload)) + payload)
        out.flush()


def main() -> None:
    """The worker process: answers on a duplicate of stdout, and anything else written to
    stdout (by LLVM or a print) goes to stderr instead of into the answers."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
