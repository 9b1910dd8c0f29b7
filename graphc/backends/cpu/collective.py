"""collective: graph collectives lowered to MPI calls made by the generated code itself.

`all_reduce(x, op)` becomes a copy of x into its output (unless the plan put them in one
place) and a status kernel calling `MPI_Allreduce(MPI_IN_PLACE, out, count, datatype, op,
comm)`, with the handles of the job's MPI baked in as constants (graphc.ops.collective's
`NativeMpi`, from the communicator graphc.distributed installed); "avg" then scales by
1 / world size in the same kernel. No Python runs between the kernels of a DDP step.
A failed MPI call ends the step with an error naming the node. An MPI whose ABI graphc does
not know (not MPICH's 32-bit handles) is refused with the reason: compile such a step with
backend="interp", which calls MPI through mpi4py.
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.common import contiguous_strides
from graphc.backends.cpu import llvm
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import F64, I32, I64, PTR, i64, loop, unsupported
from graphc.ir.graph import Node
from graphc.ir.printer import format_node
from graphc.ops import collective

_MPI_INT_MAX = 2**31 - 1  # MPI counts are C ints


def lower_all_reduce(lw, node: Node) -> None:
    native = collective.communicator("all_reduce").native()
    if native is None:
        raise unsupported(node, "all_reduce: this MPI's ABI is not MPICH's (32-bit handles), "
                                "which graphc's generated code calls; compile the step with "
                                "backend=\"interp\", which calls MPI through mpi4py")
    x, out = node.inputs[0], node.outputs[0]
    dt, op = x.type.dtype, node.attrs["op"]
    if dt.name not in native.datatypes:
        raise unsupported(node, f"all_reduce of {dt.name} (float32, float64 and int64 are "
                                "lowered)")
    count = x.type.numel
    if count > _MPI_INT_MAX:
        raise unsupported(node, f"all_reduce of {count:,} elements (MPI counts are C ints)")
    src, dst = lw.locs[x], lw.locs[out]
    if dst.strides != contiguous_strides(out.type.shape, dt.itemsize):
        raise unsupported(node, "all_reduce into a strided output")
    if count == 0:
        return
    if src != dst:
        lw.copy(src, dst, "all_reduce")
    llvm.register_symbol("MPI_Allreduce", native.allreduce)
    kb = KernelBuilder(lw, lw.name("all_reduce"), (1,))
    kb.kernel.status = True
    o = kb.operand(dst, (0,))
    lw.errors.append(f"all_reduce: MPI_Allreduce failed in node {format_node(node)}"
                     f"{' at ' + node.loc if node.loc else ''}")
    status = len(lw.errors)
    b = kb.begin()
    mpi = lw.declare("MPI_Allreduce", ir.FunctionType(I32, [PTR, PTR, I32, I32, I32, I32]))
    buffer = kb.pointer(b, o, i64(0))
    handles = [native.datatypes[dt.name], native.ops["sum" if op == "avg" else op], native.comm]
    code = b.call(mpi, [b.inttoptr(ir.Constant(I64, native.in_place), PTR), buffer,
                        ir.Constant(I32, count)] + [ir.Constant(I32, h) for h in handles])
    with b.if_then(b.icmp_signed("!=", code, ir.Constant(I32, 0)), likely=False):
        b.ret(ir.Constant(I32, status))
    if op == "avg" and native.world_size > 1:
        scale = ir.Constant(F64, 1.0 / native.world_size)
        element = ir.DoubleType() if dt.name == "float64" else ir.FloatType()
        factor = scale if dt.name == "float64" else b.fptrunc(scale, element)
        with loop(b, 0, count, "k") as k:
            p = b.gep(buffer, [k], source_etype=element)
            b.store(b.fmul(b.load(p, typ=element), factor), p)
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


COLLECTIVE_LOWERINGS = {"all_reduce": lower_all_reduce}
