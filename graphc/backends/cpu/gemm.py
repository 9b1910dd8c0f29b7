"""gemm: the Lowerer's matrix products (matmul alone and as a GEMM epilogue's anchor).

Part of the top layer of the CPU code generator (values <- scalars <- kernels <- codegen):
`GemmLowering` is a base of graphc.backends.cpu.codegen's `Lowerer`, which also provides
`scratch_loc` (backend scratch in the arena). `gemm(node, a, b, c, addends)` computes
c = a @ b for 1-D, 2-D and batched operands (batch dims broadcast), float32 and float64,
deciding in order:
- a c whose strides are b^T @ a^T's: the transposed product, operands read through swapped
  strides; a strided c (rows ldc apart: graphc.passes.gemm_output_layout) goes to the BLAS;
- a batch that folds into the rows of one product (graphc.backends.cpu.gemm_layout), or
  that folds once A is copied contiguous; operands no BLAS layout reads are copied into
  scratch first;
- thin float32 products (m or n <= 16), small blocks with b read transposed (attention's
  heads), medium ones (n <= 512, b copied panel-major first: graphc.backends.cpu.
  gemm_panels; any n and k, from 32 rows, where the BLAS leaves the host's AVX-512 unused:
  small_gemm.large_products, a read transposed then copied row-major first: small_gemm.
  copies_a) and weight gradients in generated kernels (graphc.backends.cpu.small_gemm)
  that may also add a fused body's bias and residual (graphc.backends.cpu.gemm_addends), or
  run a fused body's whole elementwise epilogue after each row chunk's product
  (`gemm_with_epilogue`, graphc.backends.cpu.gemm_epilogue); a batch of them, or of a medium
  product's row chunks, or of a weight gradient's column chunks or chunks of k (partial
  products merged in order after: graphc.backends.cpu.gemm_k_chunks), forks over the cores;
- a single row or column through the BLAS GEMV (`_gemv`), else the BLAS GEMM
  (cblas_sgemm / cblas_dgemm, declared by `blas_function`), which threads itself.
"""

from __future__ import annotations

import math

from llvmlite import ir

from graphc.backends.cpu import gemm_epilogue, gemm_k_chunks, kernels, small_gemm
from graphc.backends.cpu.elementwise import ElementwiseLowering
from graphc.backends.cpu.gemm_layout import (
    fold_after_packing,
    folded_rows,
    gemm_layout,
    strided_output,
    transposed,
)
from graphc.backends.cpu.kernels import Body, KernelBuilder
from graphc.backends.cpu.values import (
    I32,
    I64,
    PTR,
    REG,
    CpuLoweringError,
    Loc,
    broadcast_strides,
    collapse,
    contiguous_strides,
    size,
    unsupported,
)
from graphc.ir.graph import Node
from graphc.ops.shapes import broadcast_shapes
from graphc.types import TensorType, float32, float64

__all__ = ["GemmLowering"]


class GemmLowering(ElementwiseLowering):
    """Matrix products through the BLAS or generated kernels (see the module docstring); a
    base of codegen's `Lowerer`, whose `scratch_loc` holds the operands copied for a layout."""

    def shared_scratch_loc(self, t: TensorType) -> Loc:
        """Backend scratch for `t` that every node asking for the same type shares: for data
        written and read by one node's kernels alone (a medium product's b panels), as the
        driver runs the kernels one after another. One region per type, not one per node,
        stays in cache from node to node (the GPT step's 50 b copies wrote 4.7 MB of fresh
        scratch a step, 15 us for each 64 KB, where a warm copy takes 3.5)."""
        shared = self.__dict__.setdefault("shared_scratch", {})
        if t not in shared:
            shared[t] = self.scratch_loc(t)
        return shared[t]

    # ---- matmul through BLAS -------------------------------------------------------------
    def lower_matmul(self, node: Node) -> None:
        a, b = node.inputs
        self.gemm(node, self.locs[a], self.locs[b], self.locs[node.outputs[0]])

    def epilogue_gemm(self, node: Node, a: Loc, b: Loc, c: Loc, attrs: dict) -> None:
        """A fused body's matmul anchor: c = a @ b, read by the epilogue."""
        self.gemm(node, a, b, c)

    def gemm_with_epilogue(self, node: Node, body: Body, a: Loc, b: Loc, c: Loc) -> bool:
        """A fused body's matmul anchor, c = a @ b: True where its elementwise epilogue ran
        in the GEMM's kernel too, row chunk by row chunk (gemm_epilogue); else the product
        alone, the epilogue left to its own kernel."""
        return self.gemm(node, a, b, c, epilogue=gemm_epilogue.plan(self, body, c, a, b))

    def gemm(self, node: Node, a: Loc, b: Loc, c: Loc, addends: tuple = (),
             epilogue: gemm_epilogue.ChunkEpilogue | None = None) -> bool:
        """c = a @ b; True where `addends` (gemm_addends) were added in its kernel too, or
        `epilogue` ran in it (a product in row chunks; else the product alone)."""
        dt = a.type.dtype
        if dt not in (float32, float64):
            raise unsupported(node, f"matmul of {dt.name} (BLAS has float32/float64 only)")
        item = dt.itemsize
        sa = [s // item for s in a.strides]
        sb = [s // item for s in b.strides]
        sa_shape, sb_shape = list(a.type.shape), list(b.type.shape)
        if len(sa_shape) == 1:
            sa_shape, sa = [1] + sa_shape, [0] + sa
        if len(sb_shape) == 1:
            sb_shape, sb = sb_shape + [1], sb + [0]
        m, k = sa_shape[-2:]
        n = sb_shape[-1]
        batch = broadcast_shapes("matmul", tuple(sa_shape[:-2]), tuple(sb_shape[:-2]))
        c_shape = batch + (m, n)
        strided = strided_output(c, c_shape)
        if strided == "transposed":  # c^T = b^T @ a^T, each read through swapped strides
            return self.gemm(node, transposed(b, sb_shape, sb), transposed(a, sa_shape, sa),
                             transposed(c, c_shape, [s // item for s in c.strides]))
        if not strided:
            c = Loc(c.base, c.index, c.offset, contiguous_strides(c_shape, item),
                    TensorType(c_shape, dt))
        sc = [s // item for s in c.strides]
        if m * n == 0:
            return
        if k == 0:
            return self.fill(c, 0.0, "gemm_zero")
        rows = None if strided else folded_rows(batch, sa_shape, sa, sb_shape, sb)
        if rows is not None:  # one GEMM over the whole batch: (batch*m, k) @ (k, n)
            a2 = Loc(a.base, a.index, a.offset, (sa[-2] * item, item), TensorType((rows, k), dt))
            b2 = Loc(b.base, b.index, b.offset, (sb[-2] * item, sb[-1] * item),
                     TensorType((k, n), dt))
            c2 = Loc(c.base, c.index, c.offset, contiguous_strides((rows, n), item),
                     TensorType((rows, n), dt))
            return self.gemm(node, a2, b2, c2, addends, epilogue)
        if not strided and fold_after_packing(batch, sa_shape, sa, sb_shape, sb):  # A copied
            packed = self.scratch_loc(TensorType(tuple(sa_shape), dt))
            self.copy(Loc(a.base, a.index, a.offset, tuple(s * item for s in sa),
                          packed.type), packed, "gemm_pack")
            return self.gemm(node, packed, b, c)
        lay_a = gemm_layout(m, k, sa[-2], sa[-1])
        if lay_a is None:  # no BLAS layout reads it: a contiguous copy in scratch
            a, sa = self._contiguous_copy(a, sa_shape, sa)
            lay_a = gemm_layout(m, k, sa[-2], sa[-1])
        lay_b = gemm_layout(k, n, sb[-2], sb[-1])
        if lay_b is None:
            b, sb = self._contiguous_copy(b, sb_shape, sb)
            lay_b = gemm_layout(k, n, sb[-2], sb[-1])
        if not strided and not batch and \
                small_gemm.copies_a(self, dt, m, n, k, sa, lay_b):  # a^T row-major first
            a, sa = self._contiguous_copy(a, sa_shape, sa)
            lay_a = gemm_layout(m, k, sa[-2], sa[-1])
        # a strided c (rows ldc apart: graphc.passes.gemm_output_layout) takes the BLAS GEMM
        small = None if strided else \
            small_gemm.operands(self, dt, m, n, k, sa, b, sb, sb_shape, lay_b)
        c_batch_strides = None  # c's batch strides where not contiguous chunks of m * n
        columns = None
        chunks = None
        merged = None  # (c, partials' count) where k's chunks are summed into scratch first
        if small is not None:  # a thin product: a generated kernel instead of the BLAS
            small, b, sb = small
            small, addends = small_gemm.with_addends(small, () if batch else addends)
            chunks = small_gemm.row_chunks(small) if not batch else None
            splits = small_gemm.k_chunks(small) if not batch else None
            columns = small_gemm.column_chunks(small) if not batch else None
            if chunks is not None:  # many rows: a batch of row chunks the cores share
                batch, small = (chunks[0],), chunks[1]
                m, sa_shape, sa = small.m, [chunks[0], small.m, k], [small.m * sa[-2]] + sa[-2:]
            elif splits is not None:  # a weight gradient: chunks of k, merged in order after
                (count, small), k = splits, splits[1].k
                batch, sa_shape, sa = (count,), [count, m, k], [k * sa[-1]] + sa[-2:]
                sb_shape, sb = [count, k, n], [k * sb[-2]] + sb[-2:]
                merged = (c, count)
                c = self.shared_scratch_loc(TensorType((count, m, n), dt))
            elif columns is not None:  # a weight gradient: chunks of c's columns, a shared
                batch, small = (columns[0],), columns[1]
                n, sb_shape, sb = small.n, [columns[0], k, small.n], [small.n * sb[-1]] + sb[-2:]
                c_batch_strides = (small.n,)
        if chunks is None or small.addends or strided or small.k_outer:  # its own kernel
            epilogue = None
        gemv = None if small or strided else self._gemv(m, n, k, sa, sb, lay_a, lay_b)
        fn = small_gemm.function(self, small) if small else \
            self.blas_function(dt, "gemv" if gemv else "gemm")
        ldc = sc[-2] if strided else n
        kb = KernelBuilder(self, self.name("small_gemm" if small else "gemv" if gemv else
                                           "gemm"), batch,
                           ("gemm", fn.name, m, n, k, lay_a, lay_b, gemv, ldc,
                            epilogue and epilogue.recipe()))
        ka = kb.operand(a, broadcast_strides(tuple(sa_shape[:-2]), tuple(sa[:-2]), batch))
        kb_ = kb.operand(b, broadcast_strides(tuple(sb_shape[:-2]), tuple(sb[:-2]), batch))
        kc = kb.operand(c, tuple(sc[:-2]) if strided else c_batch_strides or
                        tuple(contiguous_strides(batch, m * n)))
        small_args = [ka, kb_, kc] + [kb.operand(loc, kb.operands[kc].strides if kind == "full"
                                                 else (0,) * len(batch))
                                      for kind, loc in (addends if small else ())]
        epilogue_operands = epilogue and epilogue.operands(kb, kc, m)
        # a loop of generated products (attention's heads, row or column chunks) forks over
        # the cores where its multiply-adds are worth it (kernels.gemm_work: 2 x 128 x 64
        # outputs of 784 products each are, as many elementwise outputs are not), a count
        # known per call (a symbolic batch of heads) weighed the same at each call; a BLAS
        # call threads itself
        heads = math.prod(batch)
        bld = kb.begin(parallel=bool(small) and (type(heads) is not int or heads > 1),
                       work=kernels.gemm_work(heads, m, n, k) if small else None)
        if bld is None:
            self.calls.append(kb.kernel)
            if merged is not None:
                gemm_k_chunks.merge(self, c, *merged, small.lanes)
            return bool(small and small.addends) or epilogue is not None
        iT = I64 if self.blas.ilp64 else I32
        fty = REG[dt.name]

        def blas_int(bb, x):  # a BLAS integer argument (sizes may be known per call)
            v = size(bb, x)
            return v if iT is I64 else bb.trunc(v, I32)

        def leaf_gemv(bb, offsets):
            trans, rows, cols, mat, ld, vec, inc = gemv
            bb.call(fn, [ir.Constant(I32, 101), ir.Constant(I32, trans), blas_int(bb, rows),
                         blas_int(bb, cols), ir.Constant(fty, 1.0),
                         kb.pointer(bb, mat, offsets[mat]), blas_int(bb, ld),
                         kb.pointer(bb, vec, offsets[vec]), blas_int(bb, inc),
                         ir.Constant(fty, 0.0), kb.pointer(bb, kc, offsets[kc]),
                         ir.Constant(iT, 1)])

        if gemv:  # operand names to operand ids
            gemv = gemv[:3] + ((ka if gemv[3] == "a" else kb_), gemv[4],
                               (ka if gemv[5] == "a" else kb_), gemv[6])

        def leaf(bb, offsets):
            if small:
                bb.call(fn, [kb.pointer(bb, x, offsets[x]) for x in small_args]
                        + small_gemm.size_arguments(bb, small, offsets[ka]))  # per call
                if epilogue:  # the chunk's rows through the fused body, still in cache
                    epilogue.emit(self, kb, bb, epilogue_operands, offsets, m, n)
                return
            if gemv:
                return leaf_gemv(bb, offsets)
            bb.call(fn, [ir.Constant(I32, 101), ir.Constant(I32, lay_a[0]),
                         ir.Constant(I32, lay_b[0]), blas_int(bb, m), blas_int(bb, n),
                         blas_int(bb, k), ir.Constant(fty, 1.0),
                         kb.pointer(bb, ka, offsets[ka]), blas_int(bb, lay_a[1]),
                         kb.pointer(bb, kb_, offsets[kb_]), blas_int(bb, lay_b[1]),
                         ir.Constant(fty, 0.0), kb.pointer(bb, kc, offsets[kc]),
                         blas_int(bb, ldc)])

        kb.nest(bld, *collapse(batch, [x.strides for x in kb.operands]), leaf)
        self.calls.append(kb.finish(bld))
        if merged is not None:
            gemm_k_chunks.merge(self, c, *merged, small.lanes)
        return bool(small and small.addends) or epilogue is not None

    def _contiguous_copy(self, x: Loc, shape: list, strides: list) -> tuple[Loc, list]:
        """(x, read through element `strides`, copied contiguous into scratch; the copy's
        element strides)."""
        dt = x.type.dtype
        t = TensorType(tuple(shape), dt)
        copy = self.scratch_loc(t)
        self.copy(Loc(x.base, x.index, x.offset, tuple(s * dt.itemsize for s in strides), t),
                  copy, "gemm_pack")
        return copy, [s // dt.itemsize for s in copy.strides]

    def _gemv(self, m, n, k, sa, sb, lay_a, lay_b):
        """A single-row or single-column product as one GEMV (OpenBLAS's GEMM is slow at
        M = 1): (transpose flag, rows, cols, matrix, ld, vector, increment), or None."""
        if self.blas is None or not self.blas.sgemv or k == 1:
            return None
        if m == 1 and sa[-1] > 0:  # c[0, :] = B^T a
            trans = 112 if lay_b[0] == 111 else 111
            rows, cols = (k, n) if lay_b[0] == 111 else (n, k)
            return (trans, rows, cols, "b", lay_b[1], "a", sa[-1])
        if n == 1 and sb[-2] > 0:  # c[:, 0] = A b
            rows, cols = (m, k) if lay_a[0] == 111 else (k, m)
            return (lay_a[0], rows, cols, "a", lay_a[1], "b", sb[-2])
        return None

    def blas_function(self, dt, routine: str = "gemm") -> ir.Function:
        if self.blas is None:
            raise CpuLoweringError("cpu backend: matmul needs a BLAS and none was found")
        iT = I64 if self.blas.ilp64 else I32
        fty = REG[dt.name]
        if routine == "gemv":
            args = [I32, I32, iT, iT, fty, PTR, iT, PTR, iT, fty, PTR, iT]
        else:
            args = [I32, I32, I32, iT, iT, iT, fty, PTR, iT, PTR, iT, fty, PTR, iT]
        return self.declare(self.blas.symbol(dt.name, routine),
                            ir.FunctionType(ir.VoidType(), args))
