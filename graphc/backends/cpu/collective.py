"""collective: graph collectives lowered to MPI calls made by the generated code itself.

`all_reduce(x, op)` becomes a copy of x into its output (unless the plan put them in one
place) and a status kernel calling `MPI_Allreduce(MPI_IN_PLACE, out, count, datatype, op,
comm)`, with the handles of the job's MPI baked in as constants (graphc.ops.collective's
`NativeMpi`, from the communicator graphc.distributed installed); "avg" then scales by
1 / world size in the same kernel. No Python runs between the kernels of a DDP step.
A failed MPI call ends the step with an error naming the node. An MPI whose ABI graphc does
not know (not MPICH's 32-bit handles) is refused with the reason: compile such a step with
backend="interp", which calls MPI through mpi4py.

A bucket (graphc.passes.bucket) whose ranks all share this machine is reduced through the
node's shared-memory window instead, by graphc.backends.cpu.collective_shm (no MPI call);
the rest of this docstring is the MPI path, for the others.

A bucket on the MPI path is two kernels that the schedule keeps apart:
`all_reduce_start(x1, ..., xk)` copies each xi (any strides: graphc.backends.cpu.bucket_pack)
into its slot of the flat buffer, then `MPI_Iallreduce(MPI_IN_PLACE, buffer, ...)` stores
its request in 8 bytes of backend scratch (one slot per bucket); `all_reduce_wait(b)` tests
that request until it completes, then ("avg") scales by 1 / world size, and copies only if
the plan did not put its result in b's place. Reading b keeps the buffer live until the
wait, so the plan never lends its memory to another value while MPI may still write it.
"""

from __future__ import annotations

import weakref

from llvmlite import ir

from graphc.backends.common import contiguous_strides
from graphc.backends.cpu import collective_shm, llvm
from graphc.backends.cpu.bucket_pack import pack
from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import F64, I32, I64, PTR, Loc, i64, loop, unsupported
from graphc.ir.graph import Node, Value
from graphc.ir.printer import format_node
from graphc.ops import collective
from graphc.types import TensorType, int64

_MPI_INT_MAX = 2**31 - 1  # MPI counts are C ints


def _native(node: Node, needs: str = "allreduce"):  # needs: the NativeMpi entry used
    native = collective.communicator(node.op).native()
    if native is None or not getattr(native, needs):
        raise unsupported(node, f"{node.op}: this MPI's ABI is not MPICH's (32-bit handles), "
                                "which graphc's generated code calls; compile the step with "
                                "backend=\"interp\", which calls MPI through mpi4py")
    out = node.outputs[0]
    if out.type.dtype.name not in native.datatypes:
        raise unsupported(node, f"{node.op} of {out.type.dtype.name} (float32, float64 and "
                                "int64 are lowered)")
    if out.type.numel > _MPI_INT_MAX:
        raise unsupported(node, f"{node.op} of {out.type.numel:,} elements (MPI counts are C "
                                "ints)")
    return native


def _status(lw, node: Node, call: str) -> int:
    """The driver status that reports a failed `call` in `node`."""
    lw.errors.append(f"{node.op}: {call} failed in node {format_node(node)}")
    return len(lw.errors)


def _scale(b, buffer, count: int, dt, world_size: int) -> None:
    """buffer[:count] *= 1 / world_size ("avg" after the sum)."""
    scale = ir.Constant(F64, 1.0 / world_size)
    element = ir.DoubleType() if dt.name == "float64" else ir.FloatType()
    factor = scale if dt.name == "float64" else b.fptrunc(scale, element)
    with loop(b, 0, count, "k") as k:
        p = b.gep(buffer, [k], source_etype=element)
        b.store(b.fmul(b.load(p, typ=element), factor), p)


def lower_all_reduce(lw, node: Node) -> None:
    native = _native(node)
    x, out = node.inputs[0], node.outputs[0]
    dt, op = x.type.dtype, node.attrs["op"]
    count = x.type.numel
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
    status = _status(lw, node, "MPI_Allreduce")
    b = kb.begin()
    mpi = lw.declare("MPI_Allreduce", ir.FunctionType(I32, [PTR, PTR, I32, I32, I32, I32]))
    buffer = kb.pointer(b, o, i64(0))
    handles = [native.datatypes[dt.name], native.ops["sum" if op == "avg" else op], native.comm]
    code = b.call(mpi, [b.inttoptr(ir.Constant(I64, native.in_place), PTR), buffer,
                        ir.Constant(I32, count)] + [ir.Constant(I32, h) for h in handles])
    with b.if_then(b.icmp_signed("!=", code, ir.Constant(I32, 0)), likely=False):
        b.ret(ir.Constant(I32, status))
    if op == "avg" and native.world_size > 1:
        _scale(b, buffer, count, dt, native.world_size)
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


_REQUESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # lowerer -> {name: Loc}


def _request(lw, bucket) -> Loc:
    """Where the MPI_Request (an int in MPICH) of the bucket value `bucket` lives: 8 bytes of
    backend scratch past the plan's arena, one slot per bucket (not a module global, which a
    module split or a kernel dedupe could copy or merge)."""
    slots = _REQUESTS.setdefault(lw, {})
    if bucket.name not in slots:
        slots[bucket.name] = lw.scratch_loc(TensorType((1,), int64))
    return slots[bucket.name]


def lower_all_reduce_start(lw, node: Node) -> None:
    out = node.outputs[0]
    dt, op, count = out.type.dtype, node.attrs["op"], out.type.numel
    dst = lw.locs[out]
    if dst.strides != contiguous_strides(out.type.shape, dt.itemsize):
        raise unsupported(node, "all_reduce_start into a strided buffer")
    if collective_shm.usable(lw, node):
        collective_shm.lower_start(lw, node)
        return
    native = _native(node, "iallreduce")
    at = 0
    for x in node.inputs:  # pack: each input into its slot of the flat buffer
        n = x.type.numel
        slot = Loc(dst.base, dst.index, dst.offset + at * dt.itemsize,
                   contiguous_strides(x.type.shape, dt.itemsize), x.type)
        src = lw.locs[x]
        if n and src != slot:
            pack(lw, src, slot)
        at += n
    llvm.register_symbol("MPI_Iallreduce", native.iallreduce)
    kb = KernelBuilder(lw, lw.name("all_reduce_start"), (1,))
    kb.kernel.status = True
    o = kb.operand(dst, (0,))
    r = kb.operand(_request(lw, out), (0,))
    status = _status(lw, node, "MPI_Iallreduce")
    b = kb.begin()
    mpi = lw.declare("MPI_Iallreduce",
                     ir.FunctionType(I32, [PTR, PTR, I32, I32, I32, I32, PTR]))
    handles = [native.datatypes[dt.name], native.ops["sum" if op == "avg" else op], native.comm]
    code = b.call(mpi, [b.inttoptr(ir.Constant(I64, native.in_place), PTR),
                        kb.pointer(b, o, i64(0)), ir.Constant(I32, count)]
                  + [ir.Constant(I32, h) for h in handles] + [kb.pointer(b, r, i64(0))])
    with b.if_then(b.icmp_signed("!=", code, ir.Constant(I32, 0)), likely=False):
        b.ret(ir.Constant(I32, status))
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)


_MPI_STATUS_IGNORE = 1  # MPICH's (MPI_Status *)1
_CLOCK_MONOTONIC = 1
_SPINS = 100  # MPI_Test calls before the wait starts yielding the core and checking the clock


def _libc(name: str) -> int:
    import ctypes

    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


def lower_all_reduce_wait(lw, node: Node) -> None:
    """MPI_Test in a loop: spinning first, then yielding the core between tests (ranks share
    cores with each other and with other work), and failing the step past the group's
    timeout with an error naming the node, instead of waiting forever for a dead rank."""
    if collective_shm.usable(lw, node):
        collective_shm.lower_wait(lw, node)
        return
    native = _native(node, "test")
    bucket = node.inputs[0]
    dt, op, count = bucket.type.dtype, node.attrs["op"], bucket.type.numel
    src = lw.locs[bucket]
    for name, address in (("MPI_Test", native.test), ("sched_yield", _libc("sched_yield")),
                          ("clock_gettime", _libc("clock_gettime"))):
        llvm.register_symbol(name, address)
    kb = KernelBuilder(lw, lw.name("all_reduce_wait"), (1,))
    kb.kernel.status = True
    o = kb.operand(src, (0,))
    r = kb.operand(_request(lw, bucket), (0,))
    failed = _status(lw, node, "MPI_Test")
    lw.errors.append(f"{node.op}: waited {native.timeout:g} s for the other ranks (a rank has "
                     f"died or is stuck) in node {format_node(node)}")
    late = len(lw.errors)
    b = kb.begin()
    test = lw.declare("MPI_Test", ir.FunctionType(I32, [PTR, PTR, PTR]))
    yield_ = lw.declare("sched_yield", ir.FunctionType(I32, []))
    clock = lw.declare("clock_gettime", ir.FunctionType(I32, [I32, PTR]))
    flag = b.alloca(I32, name="flag")
    timespec = b.alloca(ir.ArrayType(I64, 2), name="ts")
    deadline = b.alloca(I64, name="deadline")
    b.store(ir.Constant(I64, 0), deadline)

    def now_ns(b):
        b.call(clock, [ir.Constant(I32, _CLOCK_MONOTONIC), timespec])
        sec = b.load(b.gep(timespec, [i64(0), i64(0)], source_etype=ir.ArrayType(I64, 2)),
                     typ=I64)
        nsec = b.load(b.gep(timespec, [i64(0), i64(1)], source_etype=ir.ArrayType(I64, 2)),
                      typ=I64)
        return b.add(b.mul(sec, i64(10**9)), nsec)

    entry = b.block
    head, check, slow, following, done = (b.append_basic_block(n) for n in
                                          ("test", "check", "slow", "next", "done"))
    b.branch(head)
    b.position_at_end(head)
    spins = b.phi(I64, name="spins")
    spins.add_incoming(i64(0), entry)
    code = b.call(test, [kb.pointer(b, r, i64(0)), flag,
                         b.inttoptr(ir.Constant(I64, _MPI_STATUS_IGNORE), PTR)])
    with b.if_then(b.icmp_signed("!=", code, ir.Constant(I32, 0)), likely=False):
        b.ret(ir.Constant(I32, failed))
    b.cbranch(b.icmp_signed("!=", b.load(flag, typ=I32), ir.Constant(I32, 0)), done, check)
    b.position_at_end(check)
    b.cbranch(b.icmp_signed("<", spins, i64(_SPINS)), following, slow)
    b.position_at_end(slow)  # yield the core; the first time here, set the deadline
    b.call(yield_, [])
    t = now_ns(b)
    with b.if_then(b.icmp_signed("==", b.load(deadline, typ=I64), i64(0))):
        b.store(b.add(t, i64(int(native.timeout * 1e9))), deadline)
    with b.if_then(b.icmp_signed(">", t, b.load(deadline, typ=I64)), likely=False):
        b.ret(ir.Constant(I32, late))
    b.branch(following)
    b.position_at_end(following)
    spins.add_incoming(b.add(spins, i64(1)), following)
    b.branch(head)
    b.position_at_end(done)
    if op == "avg" and native.world_size > 1:
        _scale(b, kb.pointer(b, o, i64(0)), count, dt, native.world_size)
    b.ret(ir.Constant(I32, 0))
    lw.calls.append(kb.kernel)
    for piece, out in zip(bucket_pieces(src, node), node.outputs):
        if lw.locs[out] != piece:  # not the bucket's own memory (the plan's in-place case)
            lw.copy(piece, lw.locs[out], "all_reduce_wait")


def lower_fused_wait(lw, node: Node, body) -> None:
    """A fused node whose body starts with a bucket's wait (graphc.passes.fuse_waits): on
    the window, the sum over the ranks' windows and the update in one loop
    (collective_shm.lower_fused_wait); otherwise the wait into the gradient's place (its
    output, or scratch), then the update reading it, as the two nodes were."""
    wait = _wait_of(lw, node, body)
    if collective_shm.usable(lw, wait) and collective_shm.fusable(lw, wait):
        return collective_shm.lower_fused_wait(lw, node, body, wait)
    lower_all_reduce_wait(lw, wait)
    lw.elementwise(node, body, 1, {body.n: lw.locs[wait.outputs[0]]})


def _wait_of(lw, node: Node, body) -> Node:
    """Instruction 0 of `node`'s body as a node of its own (its result the node's output
    where the node returns it, else a value in backend scratch), for the wait's lowerings
    and error messages."""
    instruction = body.instrs[0]
    result = next((v for ref, v in zip(body.outputs, node.outputs) if ref == body.n), None)
    if result is None:
        t = body.types[body.n]
        result = Value(f"{node.outputs[0].name}.reduced", t)
        lw.locs.locs[result] = lw.scratch_loc(t)
    return Node("all_reduce_wait", [node.inputs[a] for a in instruction.args],
                dict(instruction.attrs), [result], node.loc)


def bucket_pieces(src: Loc, node: Node) -> list[Loc]:
    """Where each output of the wait `node` lies in the bucket at `src` (contiguous, one
    after the other; the flat buffer itself for a wait without `shapes`)."""
    pieces, at = [], src.offset
    for out in node.outputs:
        t = out.type
        pieces.append(Loc(src.base, src.index, at, contiguous_strides(t.shape, t.dtype.itemsize),
                          t))
        at += t.nbytes
    return pieces


COLLECTIVE_LOWERINGS = {"all_reduce": lower_all_reduce,
                        "all_reduce_start": lower_all_reduce_start,
                        "all_reduce_wait": lower_all_reduce_wait}
