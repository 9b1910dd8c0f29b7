"""graphc.backends.cuda: the CUDA backend (`graphc.compile(fn, backend="cuda")`).

Layers, each importing only those below it:
- `rt`: the ctypes binding of runtime/csrc/include/graphc_rt.h (the only ctypes module) and
  library discovery (`GRAPHC_CUDA=emu` selects the CPU emulation library);
- `build`: `build_runtime(kind)` (make) and the `graphc build-runtime` command;
- `cudagen`: CUDA C for generated kernels (fused elementwise groups, reductions, movement,
  indexing, random ops);
- `compile`: one source per graph compiled (`nvcc -ptx`, or g++ against the emulation
  header, precompiled once per cache folder by `emu_pch`) with an on-disk cache;
- `lowering`: each scheduled node -> a runtime library call or a generated kernel, with
  every address fixed at compile time (the launch list);
- `executable`: `CudaExecutable(graph, options)`, one device arena, copies only at its
  boundaries.

Importing `graphc` never imports this package (graphc/backends/__init__.py does on first use
of the backend), and importing this package loads no library.
"""
