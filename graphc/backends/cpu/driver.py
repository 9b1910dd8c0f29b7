"""driver: the Lowerer's last step, the module's entry point `@run` and the copies out.

Part of the top layer of the CPU code generator (values <- scalars <- kernels <- codegen):
`DriverLowering` is a base of graphc.backends.cpu.codegen's `Lowerer`, which sets the
attributes it reads (`graph`, `plan`, `runtime`; `locs` and `calls` as its other bases).
- `outputs`: after the schedule, copies each graph output not computed straight into its
  output array, and each update value not written into its input, to `outputs[k]` (fresh
  contiguous arrays the executable allocates);
- `driver`: `i32 @run(ptr inputs, ptr outputs, ptr arena)` (a sizes table after them for a
  symbolic graph: graphc.backends.cpu.runtime_sizes; a timestamps array last when
  profiling: graphc.tools.profile) calls every kernel in order with its regions' pointers
  (an input, an output, the arena, or a shared-memory window: collective_shm), and returns
  the first nonzero status a kernel returns (its error: `Lowered.errors[status - 1]`).
"""

from __future__ import annotations

from llvmlite import ir

from graphc.backends.cpu import collective_shm
from graphc.backends.cpu.elementwise import ElementwiseLowering
from graphc.backends.cpu.values import I8, I32, I64, PTR, contiguous, i64, size
from graphc.ir.graph import Graph
from graphc.passes.plan import MemoryPlan

__all__ = ["DriverLowering"]


class DriverLowering(ElementwiseLowering):
    """The copies out and the driver function (see the module docstring); a base of
    codegen's `Lowerer`, which sets `graph`, `plan` and `runtime`."""

    graph: Graph  # the planned graph being lowered
    plan: MemoryPlan  # its buffers' places (graph.meta["memory_plan"])
    runtime: object  # a runtime_sizes.Layout (sizes read per call), or None: sizes are ints

    # ---- the driver ----------------------------------------------------------------------
    def outputs(self) -> None:
        """Copy graph outputs and the update values left in the arena to `outputs[k]`."""
        k = 0
        for v in self.graph.outputs:
            target = contiguous("output", k, 0, v.type)
            if self.locs[v] != target:  # else computed there directly
                self.copy(self.locs[v], target, "output")
            k += 1
        for _, v in self.graph.updates:
            if v.name not in self.plan.in_input:
                self.copy(self.locs[v], contiguous("output", k, 0, v.type), "update")
                k += 1

    def driver(self, profile: bool = False) -> None:
        """`i32 run(ptr inputs, ptr outputs, ptr arena)`: every kernel in schedule order.
        With sizes known per call (graphc.backends.cpu.runtime_sizes), a fourth argument is
        the call's sizes table, stored in `graphc.dims` for the kernels. With `profile`, the
        driver takes one more argument, an i64 array of len(calls) + 1
        slots, and stores CLOCK_MONOTONIC nanoseconds before each kernel and after the last
        (graphc.tools.profile reads them)."""
        sized = self.runtime is not None
        params = [PTR, PTR, PTR] + ([PTR] if sized else []) + ([PTR] if profile else [])
        fn = ir.Function(self.module, ir.FunctionType(I32, params), "run")
        inputs, outputs, arena = fn.args[:3]
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        if sized:  # the call's sizes table, for the kernels (Codegen.emit_size)
            self.driver_fn, self.dims_arg = fn, fn.args[3]
            if self._dims is not None:
                b.store(self.dims_arg, self._dims)
        bases: dict[tuple, ir.Value] = {}
        stamp = self._stamper(b, fn.args[-1]) if profile else None

        def base(kind: str, index: int):
            if (kind, index) not in bases:
                if kind == "arena":
                    bases[(kind, index)] = arena
                elif kind == "window":  # a shared-memory window's data (collective_shm)
                    bases[(kind, index)] = collective_shm.window_data(self, b, index)
                else:
                    table = inputs if kind == "input" else outputs
                    slot = b.gep(table, [i64(index)], source_etype=PTR)
                    bases[(kind, index)] = b.load(slot, typ=PTR)
            return bases[(kind, index)]

        for k, kernel in enumerate(self.calls):
            args = []
            for loc in kernel.args:
                p = base(loc.base, loc.index)
                args.append(p if type(loc.offset) is int and loc.offset == 0 else
                            b.gep(p, [size(b, loc.offset)], source_etype=I8))
            if stamp is not None:
                stamp(k)
            r = b.call(self.module.get_global(kernel.name), args)
            if kernel.status:
                with b.if_then(b.icmp_signed("!=", r, ir.Constant(I32, 0)), likely=False):
                    b.ret(r)
        if stamp is not None:
            stamp(len(self.calls))
        b.ret(ir.Constant(I32, 0))

    def _stamper(self, b: ir.IRBuilder, stamps: ir.Value):
        """stamp(k): stamps[k] = CLOCK_MONOTONIC in nanoseconds (clock_gettime)."""
        timespec = ir.LiteralStructType([I64, I64])
        clock = self.declare("clock_gettime", ir.FunctionType(I32, [I32, PTR]))
        slot = b.alloca(timespec)

        def stamp(k: int) -> None:
            b.call(clock, [ir.Constant(I32, 1), slot])  # CLOCK_MONOTONIC
            sec = b.load(b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, 0)],
                               source_etype=timespec), typ=I64)
            nsec = b.load(b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, 1)],
                                source_etype=timespec), typ=I64)
            now = b.add(b.mul(sec, i64(1_000_000_000)), nsec)
            b.store(now, b.gep(stamps, [i64(k)], source_etype=I64))

        return stamp
