"""CudaExecutable: a planned graph run as a fixed launch list over one device allocation.

`CudaExecutable(graph, options)` plans the graph if it has no `memory_plan` yet, lowers it
(graphc.backends.cuda.lowering: generated kernels and library calls, every address fixed),
compiles and loads the generated source (graphc.backends.cuda.compile, cached on disk),
allocates ONE device buffer of `lowered.device_bytes` ([plan arena | inputs | scratch]) and
binds every launch and call to absolute addresses and to the executable's own stream (never
the legacy NULL stream). The contract of graphc.backends holds: `run(*arrays)` returns the
outputs, then one value per update, an update being the updated input's own array.

Host traffic (graphc.backends.residency states the protocol):
- *State* (inputs the graph updates in place: parameters, buffers, optimizer state) stays on
  the device. After a call the updated input's host array is marked out of date instead of
  copied back; the next call finds its own mark and uploads nothing. A read of the tensor on
  the host fetches the value (and the next call uploads it again, since the host may write);
  another cuda executable reading it (a compiled evaluation) copies it device to device.
- *True inputs* (the batch) go host -> pinned staging -> device on the stream.
- *Outputs*: 0-d outputs (a loss) are copied back; the others, from the second call on, are
  kept on the device in a buffer of their own (a pool per output) and their host arrays are
  marked, so `.grad`s nobody reads never cross; they leave the arena in batched copies
  (`_copy_batch`: one launch per 32). The first call copies everything back (the
  compiled call may read first-call outputs directly: lazily created optimizer state).
  GRAPHC_CHECK_NANS turns all of this off (the check reads every value on the host).
- Every output is a new host array each call, and every update value is its target's own
  array or a new one (`fresh_results`, unless the plan put a value in another input's slot),
  so the compiled call skips its overlap checks (graphc.jit.compiler, graphc.jit.call_plan).
- *A steady call* (a training loop's: every state input the array the last call marked in its
  own slot) is found in one pass (`residency.slots_of`); it looks at the true inputs alone and
  leaves the state's marks as they are. A state mark that goes (a fetch, a forget) moves a
  count (`_unmarks`), read before that pass and again under the lock: a moved count sends the
  call back to the per-input checks, so a host write from another thread meanwhile is
  uploaded.
- A plain `run()` (not a graphc.compile'd call: `residency.in_raw_reads()` is false) keeps
  the contract of graphc.backends to the letter: every input is uploaded, every update and
  output copied back.
- The launch list runs directly on the first call and as a CUDA graph captured on the second
  and replayed after (the emulation refuses capture and keeps running the list directly).
- *Asynchronous calls*: from the second compiled call on (no NaN check, no GRAPHC_CUDA_SYNC),
  a call returns once its work is queued, as PyTorch's CUDA ops do: every output, the 0-d
  loss too, stays on the device until read, so the host runs the caller's Python (and the
  next call's guards) while the device works. The next call, a read of any value this
  executable holds, another executable taking one of them, a replay and close() first wait for
  the call in flight (`_wait`); an index error its kernels recorded (the error words, copied
  to pinned memory at the end of the call) is raised there, naming the failed call's error.

Faults: launches are asynchronous, so a kernel fault surfaces at a later call; the error then
says so and names GRAPHC_CUDA_SYNC=1, under which every step is followed by a stream
synchronisation and a fault names its kernel, the graph node and the user source line. A
sticky error (CudaDeviceLostError: the context is unusable) resets the device
(`gc_device_reset`); every executable of the process then rebuilds its device state on its
next call; values only the device held are lost (the error says how many), their host arrays
keep the values they had before (their last fetch or upload), and the next call uploads them
again. If the reset fails, every later call of every executable raises CudaDeviceLostError
naming the first fault, without touching the device.

Invariants: calls on one executable are serialised by a lock (they share the device buffer);
fetches take the same lock (and drop the mark under it); a call also holds the locks of the
executables it takes values from, all acquired in one order for the process (by id); at
most one call is in flight (`_in_flight`), and nothing reads or rewrites its pinned staging
before `_wait`; the device buffer, stream, graph, pools and module live as long as the
executable (freed by `close()`, which first fetches every value still marked).
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import threading
import weakref

import numpy as np

from graphc import config
from graphc.backends import residency
from graphc.backends.common import planned
from graphc.backends.cuda import rt as rtmod
from graphc.backends.cuda.compile import load_module
from graphc.backends.cuda.cudagen import BLOCK
from graphc.backends.cuda.lowering import Addr, Call, Launch, lower
from graphc.errors import ArgumentError, IndexOutOfRangeError
from graphc.ir.graph import Graph
from graphc.ir.printer import format_node
from graphc.ir.verifier import verify

_ALIGN = 256
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_live: weakref.WeakSet = weakref.WeakSet()  # every executable: a device reset concerns all
# set when a sticky error could not be recovered from (the reset failed): the first fault's
# message, which every later call of every executable names instead of touching the device
_unusable: str | None = None


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class CudaExecutable:
    """Executable of the "cuda" backend (see graphc.backends for the contract)."""

    backend = "cuda"

    def __init__(self, graph: Graph, options: dict | None = None) -> None:
        self.graph = verify(graph)
        self.rt = rtmod.runtime_library()
        self.memory_plan = plan = planned(graph)
        self.lowered = low = lower(graph)
        self._in_types = [(v.type.shape, np.dtype(v.type.dtype.np)) for v in graph.inputs]
        index = {v.name: i for i, v in enumerate(graph.inputs)}
        n_out = len(graph.outputs)
        results = list(graph.outputs) + [v for _, v in graph.updates]
        # (offset of the value, type, input array it is written into or None, output?)
        self._layout = []
        for k, (v, layout) in enumerate(zip(results, low.result_layouts)):
            target = None
            if k >= n_out and v.name in plan.in_input:
                target = index[plan.in_input[v.name]]
            self._layout.append((layout.offset, v.type, target, k < n_out))
        # state: input index -> offset of its update's value, when that value can be kept in
        # the input's own slot (computed there, or copied there on the device after a call)
        slots = {low.input_offsets[i]: i for i in range(len(graph.inputs))}
        self._state: dict[int, int] = {}
        for (target, _), (offset, *_rest) in zip(graph.updates, self._layout[n_out:]):
            i = index[target.name]
            if slots.get(offset, i) == i:
                self._state[i] = offset
        self._true_inputs = [i for i in range(len(graph.inputs)) if i not in self._state]
        # what `residency.slots_of` reads when every state input's own slot holds its value,
        # as a steady call's last call left them (`run`)
        self._steady_slots = [i if i in self._state else None for i in range(len(graph.inputs))]
        self._shapes = [shape for shape, _ in self._in_types]
        self._dtypes = [dtype for _, dtype in self._in_types]
        self._update_input = {n_out + u: index[target.name]
                              for u, (target, _) in enumerate(graph.updates)}
        # every output is a new array each call and every update value its own target's
        # array or a new one, unless a value lies in another input's slot: then the compiled
        # call needs no overlap checks (graphc.jit.compiler, call_plan)
        self.fresh_results = all(layout[2] in (None, self._update_input[k])
                                 for k, layout in enumerate(self._layout) if not layout[3])
        self._lock = threading.RLock()
        # counts the marks of state slots that went (a fetch, a forget): a call that found
        # its state marked compares it under its lock to know the marks are still there
        self._unmarks = 0
        self._calls = 0
        self._holders: dict[int, weakref.ref] = {}  # state input -> the array its slot holds
        self._lost: str | None = None
        self._base = None
        self._setup()
        _live.add(self)

    # ---- device state -----------------------------------------------------------------------
    def _setup(self) -> None:
        """Allocate and bind everything on the device (again after a device reset)."""
        rt, low = self.rt, self.lowered
        self.module = load_module(rt, low.source, self.graph.name or "graph") \
            if low.kernels else None
        stream = ctypes.c_void_p()
        rt.gc_stream_create(ctypes.byref(stream))
        self._stream = stream
        self._base = ctypes.c_void_p()
        rt.gc_malloc(ctypes.byref(self._base), max(low.device_bytes, 256))
        base = self._base.value
        self._steps = [self._bind(step, base) for step in low.steps]
        self._input_ptrs = [base + o for o in low.input_offsets]
        self._errors_ptr = base + low.errors_offset
        # pinned staging: the true inputs, then the 0-d outputs and the error words
        sizes = [_align(self.graph.inputs[i].type.nbytes) for i in self._true_inputs]
        self._staging_bytes = sum(sizes) + _align(8 * max(len(low.errors), 1)) + sum(
            _align(t.nbytes) for _, t, _, out in self._layout if out)
        self._staging = ctypes.c_void_p()
        rt.gc_host_alloc(ctypes.byref(self._staging), max(self._staging_bytes, 256))
        self._errors_staged = self._staging.value + sum(sizes)
        self._in_flight = False  # a call returned before its device work finished
        self._pools: dict[int, list[int]] = {}  # output index -> free device buffers
        self._graph_exec = None
        self._capture = "untried"  # "untried" | "captured" | "refused"
        self._holders = {}
        self._lost = None

    def _bind(self, step, base: int):
        def resolve(a):
            return ctypes.c_void_p(base + a.offset) if isinstance(a, Addr) else a

        if isinstance(step, Launch):
            fn = self.module.function(step.function)
            values = [ctypes.c_void_p(base + a.offset) for a in step.args]
            args = (ctypes.c_void_p * max(len(values), 1))(
                *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
            grid = (ctypes.c_int64 * 3)(-(-step.threads // (BLOCK * step.items)), 1, 1)
            block = (ctypes.c_int64 * 3)(BLOCK, 1, 1)
            return (self.rt.gc_launch, (fn, grid, block, 0, args, self._stream), (values,),
                    step.function)
        assert isinstance(step, Call)
        args = tuple(resolve(a) for a in step.args)
        if args and args[-1] is None:  # the ABI's stream argument, always last
            args = args[:-1] + (self._stream,)
        return getattr(self.rt, step.function), args, step.keep, step.function

    # ---- calls ------------------------------------------------------------------------------
    def run(self, *arrays: np.ndarray) -> list[np.ndarray]:
        g = self.graph
        if len(arrays) != len(self._in_types):
            raise ArgumentError(f"graph @{g.name} takes {len(self._in_types)} inputs, got "
                                f"{len(arrays)}")
        bound = list(map(np.asarray, arrays))
        if list(map(_SHAPE, bound)) != self._shapes or list(map(_DTYPE, bound)) != self._dtypes:
            for i, (a, (shape, dtype)) in enumerate(zip(bound, self._in_types)):
                if a.shape != shape or a.dtype != dtype:
                    raise ArgumentError(f"graph @{g.name}: input %{g.inputs[i].name} expects "
                                        f"{g.inputs[i].type}, got {a.dtype}{list(a.shape)}")
        # values stay on the device only for a compiled call (it reads results through
        # tensors, which fetch) and without the NaN check (it reads every value on the host)
        eager = config.check_nans() or not residency.in_raw_reads()
        # a steady call: every state input is the array the last call marked in its own slot
        # (read before the marks: `_call` finds the marks still there, under the lock, when
        # no state mark went since)
        unmarks = self._unmarks
        steady = not eager and residency.slots_of(self, bound) == self._steady_slots
        # fetch every out-of-date array but those whose value is in their own slot here (an
        # output of this executable's last call read back as an input is fetched too) and
        # those another executable holds (copied device to device: `_take`), whose owners'
        # locks the call takes with its own
        looked_at = [bound[i] for i in self._true_inputs] if steady else bound
        marks = [residency.marked_by(a) for a in looked_at]
        owners = {found[0] for found in marks
                  if found is not None and self.takes_device_value(found[0])}
        if steady:
            residency.fresh_all([a for a, found in zip(looked_at, marks)
                                 if found is None or found[0] not in owners])
        else:
            residency.fresh_all([a for i, (a, found) in enumerate(zip(bound, marks))
                                 if not (found == (self, i) and i in self._state
                                         or found is not None and found[0] in owners)])
        with self._locks_with_owners(owners) if owners else self._lock:
            if _unusable is not None:
                raise rtmod.CudaDeviceLostError(
                    f"graph @{g.name}: the CUDA context has been unusable since an earlier "
                    f"fault and could not be reset; restart the process (the first fault: "
                    f"{_unusable})", "gc_device_reset", rtmod.STATUS["GC_ERROR_DEVICE_LOST"])
            if self._lost is not None:
                self._setup()
            try:
                outs, errors = self._call(arrays, bound, eager,
                                          steady and self._unmarks == unmarks)
            except rtmod.CudaRuntimeError as error:
                raise self._failed(error) from None
            self._calls += 1
        for k in np.flatnonzero(errors):
            raise IndexOutOfRangeError(f"cuda backend: graph @{g.name} failed: "
                                       f"{self.lowered.errors[k]}")
        return outs

    def _locks_with_owners(self, owners: set) -> contextlib.ExitStack:
        """This executable's lock and those of `owners`, the executables whose device values
        it will take (`_take`), acquired in one order for the process (by id): two executables
        each taking the other's values from two threads would otherwise each hold its own lock
        and wait for the other's."""
        stack = contextlib.ExitStack()
        for owner in sorted(owners | {self}, key=id):
            stack.enter_context(owner._lock)
        return stack

    def _call(self, arrays: tuple, bound: list, eager: bool, steady: bool):
        """The call under the lock(s). `steady`: every state input is marked in its own slot
        (`run` found it so, and no state mark went since): only the true inputs are looked
        at, and the state's marks are kept as they are."""
        rt, stream = self.rt, self._stream
        self._wait()  # the staging, the pools and the error words are free again
        if len(set(map(id, bound))) == len(bound):
            shared = ()
        else:
            seen: set[int] = set()
            shared = {id(a) for a in bound if id(a) in seen or seen.add(id(a))}  # passed twice
        staged = self._staging.value
        for i in self._true_inputs if steady else range(len(bound)):
            a = bound[i]
            ptr = self._input_ptrs[i]
            if i in self._state:
                if not eager and residency.marked_by(a) == (self, i):
                    continue  # its slot holds the current value
                self._vacate(i)
                if self._take(a, ptr):
                    continue
                if a.nbytes:  # rare (a first call, a host write): straight from the array
                    a = np.ascontiguousarray(a)
                    rt.gc_memcpy_h2d(ptr, a.ctypes.data, a.nbytes, stream)
                continue
            if a.nbytes and not self._take(a, ptr):
                view = np.frombuffer((ctypes.c_char * a.nbytes).from_address(staged), a.dtype)
                np.copyto(view.reshape(a.shape), a)
                rt.gc_memcpy_h2d(ptr, staged, a.nbytes, stream)
            staged += _align(a.nbytes)
        self._execute()
        n_errors = len(self.lowered.errors)
        errors = np.zeros(n_errors, np.int64)
        lazy = not eager and self._calls > 0
        asynchronous = lazy and not config.cuda_sync()
        staged = self._errors_staged + _align(8 * max(n_errors, 1))  # then the 0-d outputs
        outs, staged_outs, marks = [], [], []
        kept = []  # outputs kept on the device: copied out of the arena in one batch
        moves = []  # state values into their slots: after every copy out (one may read a slot)
        base = self._base.value
        for k, (offset, t, target, is_output) in enumerate(self._layout):
            ptr = base + offset
            if is_output:
                out = np.empty(t.shape, t.dtype.np)
                if lazy and (t.shape or asynchronous) and out.nbytes:  # on the device until read
                    buffer = self._pool_take(k, out.nbytes)
                    kept.append((buffer, ptr, out.nbytes))
                    marks.append((out, ("out", k, buffer)))
                elif out.nbytes:
                    rt.gc_memcpy_d2h(staged, ptr, out.nbytes, stream)
                    staged_outs.append((out, staged))
                    staged += _align(out.nbytes)
                outs.append(out)
                continue
            i = self._update_input[k]
            a = bound[i]
            if not eager and i in self._state and id(a) not in shared and \
                    isinstance(arrays[i], np.ndarray) and a.flags.writeable and \
                    a.flags.c_contiguous:  # stays on the device: the slot gets the value
                if offset != self.lowered.input_offsets[i] and t.nbytes:
                    moves.append((self._input_ptrs[i], ptr, t.nbytes))
                if not steady:  # (a steady call's state is marked in its slot already)
                    marks.append((a, i))
                outs.append(a)
                continue
            if target is not None and isinstance(arrays[target], np.ndarray) and \
                    arrays[target].flags.writeable and arrays[target].flags.c_contiguous:
                out = arrays[target]
            else:
                out = np.empty(t.shape, t.dtype.np)
            if out.nbytes:
                rt.gc_memcpy_d2h(out.ctypes.data, ptr, out.nbytes, stream)
            outs.append(out)
        self._copy_batch(kept)
        self._copy_batch(moves)
        if n_errors and asynchronous:  # read by the next _wait
            rt.gc_memcpy_d2h(self._errors_staged, self._errors_ptr, 8 * n_errors, stream)
        elif n_errors:
            rt.gc_memcpy_d2h(errors.ctypes.data, self._errors_ptr, 8 * n_errors, stream)
        # the marks while the device works: nothing reads a mark's value before the lock,
        # held until this call returns, lets a fetch in (every copy is ordered on the stream)
        for out, slot in marks:
            if not isinstance(slot, tuple):
                self._holders[slot] = weakref.ref(out)
            residency.mark(out, self, slot)
        if asynchronous:
            self._in_flight = True
            return outs, errors
        rt.gc_stream_synchronize(stream)
        for out, at in staged_outs:
            view = np.frombuffer((ctypes.c_char * out.nbytes).from_address(at), out.dtype)
            np.copyto(out, view.reshape(out.shape))
        return outs, errors

    def _copy_batch(self, copies: list) -> None:
        """Device-to-device copies (dst, src, bytes), none writing what another reads, on the
        stream: one runtime call (gc_memcpy_d2d_batch: one launch for up to 32 copies)
        instead of a copy each (a ResNet-18 step keeps 63 outputs on the device)."""
        if len(copies) == 1:
            self.rt.gc_memcpy_d2d(*copies[0], self._stream)
        elif copies:
            n = len(copies)
            dst, src, nbytes = zip(*copies)
            self.rt.gc_memcpy_d2d_batch((ctypes.c_void_p * n)(*dst), (ctypes.c_void_p * n)(*src),
                                        (ctypes.c_int64 * n)(*nbytes), n, self._stream)

    def _wait(self) -> None:
        """Wait for the call in flight, if any (under the lock), and raise the index error its
        kernels recorded: the asynchronous call's failure, reported at the first wait after
        it (the next call, a read of a value, close())."""
        if not self._in_flight:
            return
        self.rt.gc_stream_synchronize(self._stream)
        self._in_flight = False
        n_errors = len(self.lowered.errors)
        if not n_errors:
            return
        words = np.frombuffer((ctypes.c_char * (8 * n_errors)).from_address(
            self._errors_staged), np.int64)
        for k in np.flatnonzero(words):
            raise IndexOutOfRangeError(
                f"cuda backend: graph @{self.graph.name} failed in an earlier call: "
                f"{self.lowered.errors[k]} (a compiled call returns before its device work "
                "ends, as PyTorch's CUDA ops do, so a failure shows at the next call or read "
                "of a result; GRAPHC_CUDA_SYNC=1 makes every call wait and fail itself)")

    def replay(self, count: int = 1) -> None:
        """Run the launch list `count` more times on the device values the last call left
        (no transfers, no input checks) and wait for the last: what a benchmark times to
        measure the kernels alone. For timing, not for results: the copies a call makes after
        its launch list (updates not computed in their inputs' slots) are not replayed, so a
        graph that updates its inputs leaves them as no sequence of calls would."""
        with self._lock:
            self._check_replayable("replay", count)
            try:
                self._wait()
                for _ in range(count):
                    self._execute()
                self.rt.gc_stream_synchronize(self._stream)
            except rtmod.CudaRuntimeError as error:
                raise self._failed(error) from None

    def _check_replayable(self, what: str, count: int) -> None:
        """Raise unless `count` >= 1 and a call left device values to run on (under the
        lock)."""
        if count < 1:
            raise ArgumentError(f"{what}: the count must be at least 1, got {count}")
        if self._calls == 0 or self._lost is not None:
            raise ArgumentError(f"graph @{self.graph.name}: {what} needs the device values of "
                                "a call; call run() first")

    def step_times(self, repeat: int = 5) -> list[float]:
        """Seconds each step of the launch list takes on the device: the median over `repeat`
        runs on the device values the last call left, from events recorded between steps.
        The list runs directly (not as the captured graph), so a step shorter than its launch
        shows the launch's time: the sum is an upper bound on a replay's time."""
        with self._lock:
            self._check_replayable("step_times", repeat)
            rt, stream = self.rt, self._stream
            try:
                self._wait()
            except rtmod.CudaRuntimeError as error:
                raise self._failed(error) from None
            events = [ctypes.c_void_p() for _ in range(len(self._steps) + 1)]
            samples = []
            try:
                for event in events:
                    rt.gc_event_create(ctypes.byref(event))
                for _ in range(repeat):
                    rt.gc_event_record(events[0], stream)
                    for k, (fn, args, _, _) in enumerate(self._steps):
                        fn(*args)
                        rt.gc_event_record(events[k + 1], stream)
                    rt.gc_event_synchronize(events[-1])
                    ms, row = ctypes.c_float(), []
                    for start, end in zip(events, events[1:]):
                        rt.gc_event_elapsed_ms(ctypes.byref(ms), start, end)
                        row.append(ms.value / 1e3)
                    samples.append(row)
            except rtmod.CudaRuntimeError as error:
                raise self._failed(error) from None
            finally:
                for event in events:
                    if event.value:
                        rt.gc_event_destroy(event)
        return [float(t) for t in np.median(np.array(samples), axis=0)]

    def takes_device_value(self, owner) -> bool:
        """Whether a value `owner` keeps on the device is copied from there (device to
        device) rather than fetched to the host and uploaded: another executable of this
        runtime (a compiled evaluation reading the parameters a training step holds)."""
        return isinstance(owner, CudaExecutable) and owner is not self and owner.rt is self.rt

    def _take(self, a: np.ndarray, dst: int) -> bool:
        """Copy `a`'s current value from the executable that holds it into `dst`, device to
        device; False (after fetching `a`, if it was out of date) when none can."""
        found = residency.marked_by(a)
        if found is None or not self.takes_device_value(found[0]):
            return False
        owner, slot = found
        if not owner._lock.acquire(blocking=False):  # it is running: never wait on it here
            residency.fresh_all([a])
            return False
        try:
            if residency.marked_by(a) != found or owner._lost is not None:
                residency.fresh_all([a])
                return False
            owner._wait()  # its call in flight computes the value
            src = slot[2] if isinstance(slot, tuple) else owner._input_ptrs[slot]
            if a.nbytes:  # done before the owner may run again and overwrite its slot
                self.rt.gc_memcpy_d2d(dst, src, a.nbytes, self._stream)
                self.rt.gc_stream_synchronize(self._stream)
            return True
        finally:
            owner._lock.release()

    def _vacate(self, i: int) -> None:
        """Before slot i is overwritten: fetch the array whose value only it holds."""
        ref = self._holders.pop(i, None)
        held = ref() if ref is not None else None
        if held is not None and residency.marked_by(held) == (self, i):
            residency.fresh_all([held])

    def _execute(self) -> None:
        """The error words are cleared and the steps run: as a CUDA graph once captured,
        step by step (synchronising after each) under GRAPHC_CUDA_SYNC=1, else directly."""
        rt, stream = self.rt, self._stream
        sync = config.cuda_sync()
        if self._graph_exec is not None and not sync:
            rt.gc_graph_launch(self._graph_exec, stream)
            return
        if self._capture == "untried" and self._calls > 0 and not sync:
            try:
                rt.gc_graph_begin_capture(stream)
            except rtmod.CudaNotSupportedError:
                self._capture = "refused"  # the emulation: the list runs directly
            else:
                self._capture_steps()
                if self._graph_exec is not None:
                    rt.gc_graph_launch(self._graph_exec, stream)
                    return
        self._run_steps(sync)

    def _capture_steps(self) -> None:
        rt, stream = self.rt, self._stream
        graph = ctypes.c_void_p()
        try:
            self._run_steps(False)
        except rtmod.CudaRuntimeError:
            try:
                rt.gc_graph_end_capture(ctypes.byref(graph), stream)
            except rtmod.CudaRuntimeError:
                pass
            self._capture = "refused"  # nothing ran: the caller runs the list directly
            return
        try:
            rt.gc_graph_end_capture(ctypes.byref(graph), stream)
        except rtmod.CudaRuntimeError:
            self._capture = "refused"
            return
        self._graph_exec, self._capture = graph, "captured"

    def _run_steps(self, sync: bool) -> None:
        rt, stream = self.rt, self._stream
        n_errors = len(self.lowered.errors)
        if n_errors:
            rt.gc_memset(self._errors_ptr, 0, 8 * n_errors, stream)
        for k, (fn, args, _, _) in enumerate(self._steps):
            try:
                fn(*args)
                if sync:
                    rt.gc_stream_synchronize(stream)
            except rtmod.CudaRuntimeError as error:
                error.step = k
                raise

    # ---- failures ---------------------------------------------------------------------------
    def _failed(self, error: rtmod.CudaRuntimeError) -> rtmod.CudaRuntimeError:
        """The error to raise for a failed call, after recovering from a sticky error."""
        if not isinstance(error, rtmod.CudaDeviceLostError):
            try:
                self.rt.gc_device_synchronize()  # a fault still in flight shows here
            except rtmod.CudaDeviceLostError as lost:
                error = lost
            except rtmod.CudaRuntimeError:
                pass
        step = getattr(error, "step", None)
        where = f"graph @{self.graph.name}"
        if step is not None:
            where += f", {self.describe_step(step)}"
        if config.cuda_sync() or step is None and not isinstance(
                error, rtmod.CudaDeviceLostError):
            hint = ""
        else:
            hint = (" (launches are asynchronous: the step named may not be the one at fault;"
                    " rerun with GRAPHC_CUDA_SYNC=1 to synchronise after every launch and name "
                    "the kernel that faults)")
        if isinstance(error, rtmod.CudaDeviceLostError):
            hint += "; " + _reset_device(self.rt, str(error))
        new = type(error)(f"{where}: {error}{hint}", error.function, error.status)
        new.step = step
        return new

    def describe_step(self, k: int) -> str:
        """'kernel k3_add (node `%7: f32[4] = add(%5, %6)  # model.py:12`)' for step k."""
        function = self._steps[k][3]
        what = "kernel" if isinstance(self.lowered.steps[k], Launch) else "library call"
        node = self.node_of_step(k)
        if node is None:
            return f"{what} {function} (copying the results out)"
        more = len(self.lowered.step_nodes[k]) - 1
        return f"{what} {function} (node `{format_node(node).strip()}`" + \
            (f" and {more} more)" if more else ")")

    def gemm_providers(self) -> list[str]:
        """What runs each GEMM call of the launch list, in launch order: 'gc_gemm_f32 33x45x70:
        graphc SIMT tile kernel, 3-stage cp.async pipeline (cuBLAS not found ...)', or
        'cuBLAS from libcublas.so.13' where the runtime hands the product to cuBLAS (the
        runtime's gc_gemm_provider; GRAPHC_CUDA_LIBS=0 forces graphc's kernels)."""
        found = []
        for step in self.lowered.steps:
            if isinstance(step, Call) and step.function.startswith("gc_gemm_"):
                m, n, k = (int(v) for v in step.args[2:5])
                tf32 = int(step.function == "gc_gemm_tf32_f32")
                found.append(f"{step.function} {m}x{n}x{k}: "
                             f"{self.rt.gc_gemm_provider(tf32, m, n, k)}")
        return found

    def conv_providers(self) -> list[str]:
        """What runs each convolution call of the launch list, in launch order:
        'gc_conv2d_fwd_f32 [32,64,56,56] -> 64 3x3: cuDNN 91900 from libcudnn.so.9, forward
        algorithm 1, ...', or graphc's kernels and why cuDNN does not (the runtime's
        gc_conv2d_provider; GRAPHC_CUDA_LIBS=0 forces graphc's kernels)."""
        passes = {"gc_conv2d_fwd_f32": "GC_CONV2D_FWD_IMPLICIT",
                  "gc_conv2d_bwd_data_f32": "GC_CONV2D_BWD_DATA",
                  "gc_conv2d_bwd_filter_f32": "GC_CONV2D_BWD_FILTER"}
        found = []
        for step in self.lowered.steps:
            if isinstance(step, Call) and step.function in passes:
                desc = step.keep[0]
                text = self.rt.gc_conv2d_provider(ctypes.byref(desc),
                                                  rtmod.CONV2D_PASS[passes[step.function]])
                found.append(f"{step.function} [{desc.n},{desc.c_in},{desc.h},{desc.w}] -> "
                             f"{desc.c_out} {desc.kh}x{desc.kw}: {text}")
        return found

    def node_of_step(self, k: int):
        """The (first) graph node step k computes (None: the result copies after the
        schedule); a merged launch serves several (`lowered.step_nodes`)."""
        nodes = self.lowered.step_nodes[k]
        return nodes[0] if nodes else None

    # ---- the residency owner protocol (graphc.backends.residency) ---------------------------
    def fetch(self, slot, array: np.ndarray) -> None:
        """Write the device value of `slot` into `array` (a read of a marked host array) and
        drop its mark, under the lock: a call cannot run between the copy and the drop, and
        a second reader of the same array, waiting here, finds it fetched and copies nothing
        (the output's buffer may be another call's by then)."""
        with self._lock:
            if residency.marked_by(array) != (self, slot):
                return  # fetched meanwhile by another thread (or marked by another owner)
            if self._lost is not None:  # the value went with the device (the reset said so)
                residency.fetched(array, self, slot)
                self._unmarks += not isinstance(slot, tuple)
                return
            ptr = slot[2] if isinstance(slot, tuple) else self._input_ptrs[slot]
            try:
                self._wait()
                if array.nbytes:
                    self.rt.gc_memcpy_d2h(array.ctypes.data, ptr, array.nbytes, self._stream)
                    self.rt.gc_stream_synchronize(self._stream)
            except rtmod.CudaRuntimeError as error:
                raise self._failed(error) from None
            # only now: a failed fetch leaves the mark, and the slot must still know its
            # holder, which a call with another array there fetches first
            residency.fetched(array, self, slot)
            if isinstance(slot, tuple):
                self._pool_give(slot)
            else:
                self._unmarks += 1
                self._holders.pop(slot, None)

    def forget(self, slot) -> None:
        """The host array of `slot` died or was re-marked: its device buffer is free. No lock:
        a collection may call this from any thread, holding any lock (list.append is atomic)."""
        if isinstance(slot, tuple):
            self._pool_give(slot)
        else:  # after the mark went: a call that read it before sees this count move
            self._unmarks += 1

    def _pool_take(self, k: int, nbytes: int) -> int:
        free = self._pools.setdefault(k, [])
        if free:
            return free.pop()
        ptr = ctypes.c_void_p()
        self.rt.gc_malloc(ctypes.byref(ptr), nbytes)
        return ptr.value

    def _pool_give(self, slot: tuple) -> None:
        if self._lost is None and self._base is not None:
            self._pools.setdefault(slot[1], []).append(slot[2])

    # ---- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Fetch every value still marked, then free the device state; an index error the
        call in flight recorded is raised after that (every value is readable then)."""
        if getattr(self, "_base", None) is None:
            return
        failed = None  # the call in flight's index error: raised once every value is fetched
        with self._lock:
            if self._lost is None:
                try:
                    self._wait()
                except IndexOutOfRangeError as error:
                    failed = error
        try:
            residency.unmark_owner(self)
        finally:
            with self._lock:
                if self._in_flight and self._lost is None:
                    self._in_flight = False
                    self.rt.gc_stream_synchronize(self._stream)  # before its memory goes
                base, self._base = self._base, None
                if self._lost is None:
                    self._free(base)
        if failed is not None:
            raise failed

    def _free(self, base) -> None:
        rt = self.rt
        if self._graph_exec is not None:
            rt.gc_graph_destroy(self._graph_exec)
        for free in self._pools.values():
            for ptr in free:
                rt.gc_free(ptr)
        self._pools = {}
        rt.gc_host_free(self._staging)
        rt.gc_stream_destroy(self._stream)
        if base is not None and base.value:
            rt.gc_free(base)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _reset_device(rt: rtmod.Runtime, why: str) -> str:
    """Recreate the context after a sticky error: every executable rebuilds its device state
    on its next call, and the values only the device held are gone (their host arrays keep
    their last host values, as the message says). Returns what happened."""
    lost = 0
    for exe in list(_live):
        exe._lost = why
        lost += residency.count_marks(exe)
        residency.unmark_owner(exe, fetch=False)
    values = (f"the current values of {lost} tensors (state or outputs kept on the device) "
              "were lost with it: they hold their values from before (their last read or "
              "upload)") if lost else "no value held only on the device was lost"
    try:
        rt.gc_device_reset()
    except rtmod.CudaRuntimeError as error:
        global _unusable
        _unusable = why
        return (f"the device could not be reset ({error}); the CUDA context stays unusable: "
                f"restart the process; {values}")
    return (f"the device was reset and every compiled call rebuilds its device state on its "
            f"next call; {values}")


__all__ = ["CudaExecutable"]
