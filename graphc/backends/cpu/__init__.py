"""The CPU backend: one LLVM module per graph, compiled with llvmlite.

Layers, bottom-up (one module each, one owner each):
- `llvm.py`: llvmlite set-up (host target machine with its CPU features, the O2 pipeline),
  `compile_module(llvm_ir_text, name) -> Library` (JIT-compiled object code and function
  addresses), and the on-disk object-code cache keyed by the IR hash, CPU name and
  features, llvmlite/LLVM and graphc versions, written atomically.
- `mathlib.py`: vectorisable polynomial approximations of exp, log, tanh, sigmoid, erf,
  sin, cos (and friends), emitted as LLVM IR with an `llvmlite.ir.IRBuilder`, accurate to a
  few ulp over their whole domain, inf/nan/denormals included.
- `values.py` (where values live, loops), `scalars.py` (scalar ops in LLVM IR), `kernels.py`
  (loops over a domain, fused bodies), `codegen.py` (lowering of a planned graph: the
  Lowerer, its dispatch and op tables; its kernels from `elementwise.py` (fused elementwise
  nodes, copies, movement), `reductions.py` (reductions, softmax), `gemm.py` (GEMM through a
  BLAS resolved once at load) and `driver.py`), `conv.py` (conv2d and its two gradients: the
  dispatch to the conv_* paths, im2col + GEMM; its shared pieces in `image_kernels.py`,
  `conv_im2col.py`, `conv_blocks.py`, `conv_workspace.py`), `pool.py` (max/avg pooling and
  their gradients, batch_norm), `philox.py` (the eager random stream as IR) with
  `random_ops.py` (uniform, normal, dropout, bernoulli kernels), `index_ops.py` (gathers,
  scatters, embedding, pad, flip, argmax/argmin, randint, randperm; indices checked before
  use), and `executable.py` (one LLVM module with one driver function that runs the schedule
  over the planned arena: a call is one native call); the backend is
  `graphc.compile(..., backend="cpu")`. Every registry op is lowered; refused cases (int64
  matmul, nll_loss over more than 2 dims) get a clear error naming the node.
Importing `graphc` never imports this package (it loads llvmlite).
"""
