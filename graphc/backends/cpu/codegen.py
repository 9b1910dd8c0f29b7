"""codegen: a planned graph lowered into one LLVM module (kernels + one driver function).

The top layer of the CPU code generator (values <- scalars <- kernels <- codegen).
`lower(graph, blas)` reads `graph.meta["memory_plan"]` and returns a `Lowered`: the LLVM IR
text of one module holding the kernels of the scheduled nodes that do work, and the driver
`i32 @run(ptr inputs, ptr outputs, ptr arena)` (plus the call's sizes table for a symbolic
graph: graphc.backends.cpu.runtime_sizes) that calls them in schedule order, then copies
the graph outputs (and the update values not computed straight into their inputs) into
`outputs[k]` (fresh contiguous arrays the executable allocates). A call of the graph is one
native call. The elementwise, reduction, copy, fill, arange and GEMM kernels are built
once per recipe and operands and called per node (graphc.backends.cpu.kernels).

This module holds the `Lowerer` (its state, the dispatch of each node to its lowering, fused
nodes, conv2d), the op tables and `lower`. The `Lowerer`'s kernels come from its bases, one
module each, all below this one:
- graphc.backends.cpu.elementwise (`ElementwiseLowering`): elementwise maps and fused
  elementwise bodies, copy, fill, and the movement and source ops;
- graphc.backends.cpu.reductions (`ReductionLowering`): reductions and softmax;
- graphc.backends.cpu.gemm (`GemmLowering`): matmul and GEMM epilogue anchors, BLAS or
  generated kernels;
- graphc.backends.cpu.driver (`DriverLowering`): the copies out and the driver `@run`.

Values live where graphc.backends.cpu.values places them (inputs, arena buffers, views into
either). The arena also holds the backend's own scratch (contiguous copies of GEMM operands
no BLAS layout can read, GEMM results an epilogue consumes) past `plan.arena_bytes`.

Lowered ops:
- elementwise (each as a lone node and inside fused bodies), by their registry `scalar`
  name: add sub mul div neg abs sign maximum minimum relu leaky_relu clamp select(where)
  eq ne lt le gt ge logical_and/or/xor/not cast pow floor_divide remainder log1p, and the
  mathlib functions exp log tanh sigmoid erf sin cos gelu sqrt rsqrt; float32, float64,
  int64 and bool, with broadcasting by strides;
- fused nodes (graphc.ops.fused): elementwise bodies with broadcast_to and constant
  full/arange, bodies ending in a reduction (reduce_sum/mean/max/min/prod over any axes,
  softmax/log_softmax over any dim), GEMM epilogues (matmul or conv2d first, elementwise after);
- reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod (any axes, keepdim or not);
  softmax, log_softmax (any dim);
- matmul (1-D, 2-D, batched with broadcast batch dims; float32/float64) through the BLAS
  cblas_sgemm/cblas_dgemm, transposed views passed as transposed operands; thin float32
  products (m or n <= 16), small blocks with b read transposed (attention's heads) and
  medium ones (n <= 128, k <= 512) in generated kernels (graphc.backends.cpu.small_gemm), a
  batch of them or of a medium product's row chunks forked over the cores:
  graphc.backends.cpu.gemm;
- movement: reshape, permute, broadcast_to, slice (views where the plan has them, copies
  otherwise), copy, concat; sources full and arange;
- nll_loss and nll_loss_backward (class-index targets, any reduction; a target out of range
  makes the call fail with a clear error instead of reading out of bounds):
  graphc.backends.cpu.losses;
- conv2d (alone or with a fused epilogue), conv2d_input_grad, conv2d_weight_grad,
  max_pool2d(_grad), avg_pool2d(_grad), batch_norm: graphc.backends.cpu.conv, .pool and
  .batch_norm;
- random ops uniform, normal, dropout, bernoulli (the eager Philox stream, seed input read
  once per call): graphc.backends.cpu.random_ops;
- take, gather, index_add, index_put, scatter_add, slice_scatter, embedding,
  embedding_backward, pad, flip, argmax, argmin, randint, randperm (indices out of range make
  the call fail with a clear error): graphc.backends.cpu.index_ops.
`LOWERINGS` (below the Lowerer) is the backend's one table from op name to lowering, and
graphc.backends.cpu.scalars.SCALAR_LOWERINGS the table of scalar ops every elementwise op
renders through (graphc.backends.common states the contract). Anything else raises
`CpuLoweringError` at compile time, naming the op and its node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphc.backends import common
from graphc.backends.cpu import attention as attention_kernels
from graphc.backends.cpu import (
    batch_norm,
    batch_norm_backward,
    collective_shm,
    conv,
    conv_channel_sums,
    gemm_addends,
    llvm,
    losses,
    pool,
    rows,
    sibling_sums,
    threads,
    values,
    window_layout,
)
from graphc.backends.cpu.collective import COLLECTIVE_LOWERINGS, lower_fused_wait
from graphc.backends.cpu.driver import DriverLowering
from graphc.backends.cpu.gemm import GemmLowering
from graphc.backends.cpu.index_ops import INDEX_LOWERINGS
from graphc.backends.cpu.kernels import Body, Kernel
from graphc.backends.cpu.random_ops import lower_random
from graphc.backends.cpu.reductions import ReductionLowering
from graphc.backends.cpu.scalars import SCALAR_LOWERINGS
from graphc.backends.cpu.values import CpuLoweringError, Loc, Locations, contiguous
from graphc.ir.graph import Graph, Node
from graphc.passes.fuse_rows import is_row_program
from graphc.passes.sibling_sums import is_sibling_sums
from graphc.types import TensorType

__all__ = ["LOWERINGS", "REFUSALS", "CpuLoweringError", "Lowered", "Lowerer", "lower"]


@dataclass
class Lowered:
    """The module text and what the executable needs to run it."""

    ir_text: str
    arena_bytes: int  # the plan's arena plus the backend's scratch
    kernels: list[str]
    errors: list[str] = field(default_factory=list)  # the driver's status k: errors[k - 1]
    kernel_nodes: list = field(default_factory=list)  # per kernel: its node (None: a copy out)
    # output slot -> a view of the node's shared-memory window to return there (gradients
    # averaged in place: window_layout.window_outputs); the driver writes no array there
    window_outputs: dict = field(default_factory=dict)


class Lowerer(ReductionLowering, GemmLowering, DriverLowering):
    """Lowers each scheduled node into kernels, in order; `calls` is the driver's program.
    The kernels of each kind are its bases' (see the module docstring); it sets the state
    they read (`graph`, `plan`, `runtime`, `locs`, `calls`, `errors`) and the arena scratch
    they share (`scratch_loc`)."""

    def __init__(self, graph: Graph, plan, blas, runtime_sizes=None) -> None:
        super().__init__(graph.name or "graph", blas, openmp=llvm.load_openmp() is not None,
                         most_threads=threads.most_threads)
        self.graph = graph
        self.plan = plan
        # runtime_sizes (graphc.backends.cpu.runtime_sizes.Layout): sizes, buffer offsets
        # and the arena's end are symbols read per call; None: all are the plan's ints
        self.runtime = runtime_sizes
        self.arena_end = plan.arena_bytes if runtime_sizes is None else runtime_sizes.arena_end
        self.locs = Locations(graph, plan, _direct_outputs(graph, plan),
                              None if runtime_sizes is None else runtime_sizes.offset)
        self.calls: list[Kernel] = []
        self.errors: list[str] = []  # status k of the driver -> errors[k - 1]

    def scratch_loc(self, t: TensorType) -> Loc:
        return contiguous("arena", 0, self.arena_end + self.add_scratch(t.nbytes), t)

    # ---- dispatch (the shared prologue: graphc.backends.common.lower_node) ---------------
    def place(self, node: Node) -> None:
        self.locs.define(node)
        collective_shm.place(self, node)  # gradients written straight into the node's window

    def lower_node(self, node: Node) -> None:
        lowering = common.find_lowering(node.op, LOWERINGS, SCALAR_LOWERINGS,
                                        Lowerer.lower_elementwise)
        if self.runtime is not None and lowering is not None and \
                lowering not in RUNTIME_SIZE_LOWERINGS:
            self.runtime.refuse(node)
        common.lower_node(self, node, lowering, CpuLoweringError)

    def fused(self, node: Node) -> None:
        body = Body(node)
        start = 0
        leaves: dict[int, int] = {}
        anchor = body.fused.anchor
        if anchor is not None and anchor.op in FUSED_ANCHOR_LOWERINGS:  # renders the node
            return FUSED_ANCHOR_LOWERINGS[anchor.op](self, node, body)
        if is_sibling_sums(body.fused):  # graphc.passes.sibling_sums: batch norm's dy sums
            return sibling_sums.lower_sibling_sums(self, node, body)
        if is_row_program(body.fused):  # graphc.passes.fuse_rows: a LayerNorm, a softmax grad
            return rows.lower_row_program(self, node, body)
        if anchor is not None:
            t = body.types[body.n]
            a, b_ = (self.locs[node.inputs[r]] for r in anchor.args)
            same = [v for v in node.outputs if v.type == t]
            c = self.locs[same[0]] if same else self.scratch_loc(t)
            addends = gemm_addends.addends(self, body, c if same else None)
            if addends:
                if self.gemm(node, a, b_, c, addends):  # else the product alone, as below
                    return  # bias and residual added in the generated kernel's stores
            elif anchor.op == "matmul":
                if self.gemm_with_epilogue(node, body, a, b_, c):  # else the product alone
                    return  # the whole epilogue run chunk by chunk in the GEMM's kernel
            else:
                EPILOGUE_ANCHOR_LOWERINGS[anchor.op](self, node, a, b_, c, anchor.attrs)
            start = 1
            leaves[body.n] = c
        if body.fused.ending is not None:
            body.check(start, len(body.instrs) - 1)
            return self.reduction(node, body, start, leaves)
        body.check(start, len(body.instrs))
        return self.elementwise(node, body, start, leaves)

    # ---- convolution (graphc.backends.cpu.conv; .pool, .batch_norm: LOWERINGS) -
    def lower_conv2d(self, node: Node) -> None:
        x, w = node.inputs
        conv.conv2d(self, node, self.locs[x], self.locs[w], self.locs[node.outputs[0]],
                    node.attrs)


# ---- the lowering table: op name -> lower(lowerer, node) -----------------------------------
LOWERINGS = {
    "fused": Lowerer.fused,
    "reduce_sum": Lowerer.lower_reduction, "reduce_mean": Lowerer.lower_reduction,
    "reduce_max": Lowerer.lower_reduction, "reduce_min": Lowerer.lower_reduction,
    "reduce_prod": Lowerer.lower_reduction, "softmax": Lowerer.lower_reduction,
    "log_softmax": Lowerer.lower_reduction,
    "matmul": Lowerer.lower_matmul,
    "conv2d": Lowerer.lower_conv2d, "conv2d_input_grad": conv.conv2d_input_grad,
    "conv2d_weight_grad": conv.conv2d_weight_grad, "max_pool2d": pool.max_pool2d,
    "max_pool2d_grad": pool.max_pool2d_grad, "avg_pool2d": pool.avg_pool2d,
    "avg_pool2d_grad": pool.avg_pool2d_grad, "batch_norm": batch_norm.batch_norm,
    "batch_norm_relu": batch_norm.batch_norm,
    "batch_norm_relu_backward": batch_norm_backward.batch_norm_relu_backward,
    "conv2d_channel_sums": conv_channel_sums.conv2d_channel_sums,
    "uniform": lower_random, "normal": lower_random, "dropout": lower_random,
    "bernoulli": lower_random,
    "copy": Lowerer.lower_copy, "reshape": Lowerer.lower_reshape,
    "permute": Lowerer.lower_view_copy, "broadcast_to": Lowerer.lower_view_copy,
    "slice": Lowerer.lower_view_copy, "concat": Lowerer.lower_concat,
    "full": Lowerer.lower_full, "arange": Lowerer.lower_arange,
    "nll_loss": losses.nll_loss, "nll_loss_backward": losses.nll_loss_backward,
    "attention": attention_kernels.attention,
    "attention_backward": attention_kernels.attention_backward,
    **INDEX_LOWERINGS,
    **COLLECTIVE_LOWERINGS,
}
# the lowerings that take sizes per call (graphc.backends.cpu.runtime_sizes): every size,
# stride and offset they emit goes through values.size; a symbolic graph with any other op
# is compiled per size instead (graphc.backends.specializing)
RUNTIME_SIZE_LOWERINGS = {
    Lowerer.fused, Lowerer.lower_elementwise, Lowerer.lower_reduction, Lowerer.lower_matmul,
    Lowerer.lower_copy, Lowerer.lower_reshape, Lowerer.lower_view_copy, Lowerer.lower_concat,
    Lowerer.lower_full, Lowerer.lower_arange, losses.nll_loss, losses.nll_loss_backward,
    *(INDEX_LOWERINGS[op] for op in ("take", "embedding", "gather", "embedding_backward",
                                     "index_add", "index_put", "scatter_add", "slice_scatter",
                                     "pad", "flip", "argmax", "argmin")),
    lower_random,
    conv.conv2d_input_grad, conv.conv2d_weight_grad, pool.max_pool2d, pool.max_pool2d_grad,
    pool.avg_pool2d, pool.avg_pool2d_grad, batch_norm.batch_norm, Lowerer.lower_conv2d,
}
# the anchors of GEMM epilogues (OpDef.epilogue_anchor): lower(lowerer, node, a, b, out,
# attrs) computes the anchor's result into `out` for the fused epilogue to read
EPILOGUE_ANCHOR_LOWERINGS = {"matmul": Lowerer.epilogue_gemm}
# anchors whose lowering renders the whole fused node: lower(lowerer, node, body) (a bucket's
# wait, whose sum the update reads from the ranks' windows: graphc.passes.fuse_waits; a
# convolution, whose epilogue runs inside its own kernel per image block: conv.fused_conv2d)
FUSED_ANCHOR_LOWERINGS = {"all_reduce_wait": lower_fused_wait, "conv2d": conv.fused_conv2d}
# registry ops this backend declines on purpose, with the reason (none today)
REFUSALS: dict[str, str] = {}


def _direct_outputs(graph: Graph, plan) -> dict[str, int]:
    """Graph outputs a node can compute straight into their output array (slot k) instead of
    the arena: made by a node, not a view, not written into an input, returned once and not
    also an update's value. Saves the copy out of the arena."""
    made = {v.name for n in graph.nodes for v in n.outputs}
    names = [v.name for v in graph.outputs]
    updated = {v.name for _, v in graph.updates}
    return {name: k for k, name in enumerate(names)
            if name in made and name not in plan.views and name not in plan.in_input
            and names.count(name) == 1 and name not in updated}


def lower(graph: Graph, blas=None, profile: bool = False,
          runtime_sizes=None) -> tuple[Lowered, Lowerer]:
    """Lower a planned graph (graph.meta["memory_plan"]) into one LLVM module. `profile`:
    the driver records a timestamp around every kernel (see Lowerer.driver).
    `runtime_sizes` (graphc.backends.cpu.runtime_sizes): a symbolic graph lowered once for
    every size, the driver taking the call's sizes table; `Lowered.arena_bytes` is then an
    expression of the table's symbols."""
    plan = graph.meta["memory_plan"]
    lw = Lowerer(graph, plan, blas, runtime_sizes)
    kernel_nodes: list = []
    with values.runtime_sizes(lw.emit_size if runtime_sizes is not None else None):
        for node in plan.schedule:
            lw.lower_node(node)
            kernel_nodes += [node] * (len(lw.calls) - len(kernel_nodes))
        lw.outputs()
        kernel_nodes += [None] * (len(lw.calls) - len(kernel_nodes))  # copies out of arena
        lw.driver(profile)
    text = str(lw.module)
    return Lowered(text, lw.arena_end + lw.scratch, [k.name for k in lw.calls],
                   lw.errors, kernel_nodes, window_layout.window_outputs(lw)), lw
