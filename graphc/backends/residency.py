"""residency: host arrays whose current value lives on a device, fetched when Python reads them.

A backend that keeps values on its device across calls (the cuda executable keeps parameters,
buffers and optimizer state there, and returns large outputs such as `.grad`s without copying
them) leaves the host array that stands for such a value out of date and *marks* it here:
`mark(array, owner, slot)`. The mark is the promise that `owner.fetch(slot, array)` writes the
current value into `array`; the mark stays while it does, and the owner drops it (`fetched`)
under its own lock once the value is written, so a call of the owner never finds an array
unmarked whose value is still on its way. Nothing reads a marked array without fetching it
first:

- `Tensor._data` (graphc/tensor.py), the one attribute through which graphc code reaches a
  tensor's array, calls `fresh(array)` while any mark exists: eager ops, conversions (numpy(),
  item(), DLPack, printing, pickling), optimizers, state_dict, comparisons all go through it;
- a compiled call binds arrays *without* fetching (`raw_reads()`, entered by graphc.jit's
  compiled callable), because an executable that owns a mark reads its own device copy; before
  any executable runs, `fresh_all(arrays, keep=executable)` fetches the marks of every other
  owner (another backend, another executable, the NaN check's private copies).

Fetching removes the mark: the host copy is then the authority, since Python may write it
through the array it got, and the owner uploads it again on its next call. So reading a
parameter between steps costs one copy each way for that parameter; not reading it costs
nothing. What is *not* covered: an array taken out of a tensor before a compiled call (an
`a = t.numpy()` kept across steps) is a view of the host copy and does not follow later
calls; take it again after the call (as with PyTorch's `t.cpu().numpy()`, a snapshot).

Invariants: a mark holds its array weakly (an array that dies takes its mark with it, and the
owner's `forget(slot)` is told); marks are found by the array and by the memory it views (a view
of a marked array, made before or after the mark, fetches it); one lock guards the tables, and
an owner's fetch takes the owner's own lock, so a fetch from another thread waits for a run
in progress; every mark that goes reaches its owner first as a `fetch` (the owner's own
`fetched` drops it) or after as a `forget` (died, re-marked elsewhere, unmarked unfetched),
so an owner can count its marks that went (`slots_of` then tells it in one pass which of its
marks a call's arrays still carry). Importing this module loads no backend.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["count_marks", "fetched", "fresh", "fresh_all", "in_raw_reads", "mark", "marked_by",
           "raw_reads", "slots_of", "stale", "unmark_owner"]


@dataclass
class _Mark:
    ref: weakref.ref  # the host array
    owner: Any  # .fetch(slot, array) and .forget(slot)
    slot: Any
    memory: int  # id of the object that owns the array's memory (the array itself, or base)


# id(array) -> its mark; read without the lock on the hot path (`if stale:`)
stale: dict[int, _Mark] = {}
_by_memory: dict[int, set[int]] = {}  # id(memory owner) -> ids of marked arrays over it
_lock = threading.RLock()
_raw = threading.local()


def _memory_of(array) -> int:
    base = getattr(array, "base", None)
    return id(array) if base is None else id(base)


def mark(array, owner, slot) -> None:
    """Mark `array` out of date: `owner.fetch(slot, array)` writes its current value."""
    key = id(array)

    def dead(_ref, key=key) -> None:  # the array was collected: nothing to fetch into
        with _lock:
            found = _drop(key)
        if found is not None:
            found.owner.forget(found.slot)

    with _lock:
        old = _drop(key)
        entry = _Mark(weakref.ref(array, dead), owner, slot, _memory_of(array))
        stale[key] = entry
        _by_memory.setdefault(entry.memory, set()).add(key)
    if old is not None and (old.owner is not owner or old.slot != slot):
        old.owner.forget(old.slot)


def _drop(key: int) -> _Mark | None:
    entry = stale.pop(key, None)
    if entry is not None:
        peers = _by_memory.get(entry.memory)
        if peers is not None:
            peers.discard(key)
            if not peers:
                del _by_memory[entry.memory]
    return entry


def marked_by(array) -> tuple[Any, Any] | None:
    """(owner, slot) of `array`'s own mark, or None; fetches nothing."""
    entry = stale.get(id(array))
    if entry is None or entry.ref() is not array:
        return None
    return entry.owner, entry.slot


def slots_of(owner, arrays) -> list:
    """Per array of `arrays`, the slot of its own mark where `owner` made it, else None
    (unmarked, or another owner's: `marked_by` tells which); fetches nothing. One pass, for
    an owner that checks whether every array is still where its last call left it."""
    get = stale.get
    slots = []
    for array in arrays:
        entry = get(id(array))
        slots.append(entry.slot if entry is not None and entry.owner is owner
                     and entry.ref() is array else None)
    return slots


def _fetch(key: int) -> None:
    """Have the owner write the value of mark `key` into its array. The mark stays while the
    owner fetches (it drops it, `fetched`, under its own lock once the value is written): a
    call of the owner that runs meanwhile still finds its slot authoritative (it must not
    upload the out-of-date host array), and a second reader finds the mark and waits for the
    owner instead of reading the array before the value is in it."""
    for _ in range(3):  # again only where another owner marked the array meanwhile
        with _lock:
            entry = stale.get(key)
        if entry is None:
            return
        array = entry.ref()
        if array is None:
            with _lock:
                if stale.get(key) is not entry:
                    continue
                _drop(key)
            entry.owner.forget(entry.slot)
            return
        entry.owner.fetch(entry.slot, array)
        with _lock:
            now = stale.get(key)
            if now is entry:  # an owner that does not drop its marks itself
                _drop(key)
                return
        if now is None or (now.owner, now.slot) == (entry.owner, entry.slot):
            return  # fetched, or marked again by a later call of the same owner: current


def fetched(array, owner, slot) -> None:
    """The owner wrote its value of `slot` into `array` (under its own lock, inside
    `owner.fetch`): the host copy is the authority again, unless a call marked it anew."""
    with _lock:
        entry = stale.get(id(array))
        if entry is not None and entry.ref() is array and entry.owner is owner and \
                entry.slot == slot:
            _drop(id(array))


def fresh(array) -> None:
    """Fetch `array` (and every marked array sharing its memory) if out of date; the hook of
    every host read and write. Does nothing inside `raw_reads()`."""
    if not stale or getattr(_raw, "depth", 0):
        return
    key = id(array)
    if key in stale:
        _fetch(key)
    memory = _memory_of(array)
    peers = _by_memory.get(memory)
    if peers:
        for other in list(peers):
            _fetch(other)


def fresh_all(arrays: Iterable, keep: Any = None) -> None:
    """Fetch every out-of-date array among `arrays` (and views of their memory), except those
    marked by `keep` (an executable about to read its own device copies) or by an owner
    `keep.takes_device_value(owner)` accepts (it copies the value device to device)."""
    if not stale:
        return
    takes = getattr(keep, "takes_device_value", None)
    get = stale.get  # one lookup an array (a training step passes ~190, most of them kept)
    for array in arrays:
        if array is None:
            continue
        entry = get(id(array))
        if entry is None:  # not marked itself: fresh() would fetch only views of its memory
            if not _by_memory.get(_memory_of(array)):
                continue
        elif keep is not None and entry.ref() is array and (
                entry.owner is keep or takes is not None and takes(entry.owner)):
            continue
        depth = getattr(_raw, "depth", 0)
        _raw.depth = 0
        try:
            fresh(array)
        finally:
            _raw.depth = depth


def unmark_owner(owner, fetch: bool = True) -> None:
    """Remove every mark of `owner`, fetching each array first unless `fetch` is false (the
    device values were lost: the arrays keep their last host values)."""
    with _lock:
        keys = [k for k, e in stale.items() if e.owner is owner]
    for key in keys:
        if fetch:
            _fetch(key)
        else:
            with _lock:
                entry = _drop(key)
            if entry is not None:
                owner.forget(entry.slot)


def count_marks(owner) -> int:
    """How many arrays `owner` has marked."""
    with _lock:
        return sum(entry.owner is owner for entry in stale.values())


def in_raw_reads() -> bool:
    """Whether this thread is inside `raw_reads()`: a compiled call, which reads results
    only through the tensors it wraps them in, so an executable may leave them marked."""
    return getattr(_raw, "depth", 0) > 0


@contextlib.contextmanager
def raw_reads():
    """Within the block, this thread's reads of `Tensor._data` do not fetch: for code that
    hands arrays to an executable (which fetches what it does not own: `fresh_all`) or only
    looks at their shapes and identities (graphc.jit's compiled call). It also tells an
    executable that its caller wraps the results in tensors (`in_raw_reads`): only then does
    it leave updated inputs and outputs on its device; a plain `run()` gets host values."""
    _raw.depth = getattr(_raw, "depth", 0) + 1
    try:
        yield
    finally:
        _raw.depth -= 1
