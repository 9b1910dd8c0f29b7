"""Dict version tags: one comparison per dict for the guards of `graphc.compile`.

CPython 3.11 gives every dict a version tag (PEP 509, `PyDictObject.ma_version_tag`): a
64-bit number from one global counter, set when the dict is made and set to the counter's
next value by every change of its keys or values (a value replaced by the very same object
is no change). A dict whose tag is what it was has the same keys, in the same order, and the
same values. So instead of comparing every key and value of the dicts a guard reads
(graphc.jit.guards, ~25 ns a key), `DictVersions` compares their tags, all of them in one
numpy gather (`view[indices]`, ~0.4 us for 70 dicts): a guard's unchanged dicts cost one
comparison of a few hundred bytes.

The tag is not part of Python's API: it is read at a fixed offset (after `ob_refcnt`,
`ob_type` and `ma_used`). PEP 699 deprecated it in 3.12 and 3.13 dropped it, so `AVAILABLE`
is true only on CPython 3.11, and only after `_probe` has seen, on dicts of its own, `ma_used`
where it should be and a new tag after every kind of change the guards must see. Elsewhere
the guards keep comparing keys and values (`AVAILABLE` false: the same checks as before).

Which containers a tag stands for (`tagged_dict`): a plain dict or a defaultdict (their keys
and values are the dict's); an empty OrderedDict (an insertion is a dict change; a non-empty
one can be reordered by `move_to_end` without one); a class's `vars()`, a mappingproxy, by
the class dict under it (`type.__setattr__` writes that dict). Anything else keeps its key
and value comparison.

The tags are read when the guard is first tried, not when it is built, so a `DictVersions`
starts with no tags: its first `matches` is false and the guard then compares keys and values
against what it recorded at the trace (`confirm`), and keeps the tags read just before that
comparison where it holds. A dict that changed and changed back (a key set to a new equal
object and then to the recorded one) costs one such comparison and is trusted again after it.
The guard holds every dict it tags, so no address read here is reused while it lives.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import types
from collections import OrderedDict, defaultdict
from typing import Callable

import numpy as np

_USED_OFFSET = 16  # PyObject_HEAD (ob_refcnt, ob_type), then Py_ssize_t ma_used
_TAG_OFFSET = 24  # then uint64_t ma_version_tag
_WORD = 8


def _tag(d: dict) -> int:
    return ctypes.c_uint64.from_address(id(d) + _TAG_OFFSET).value


def _probe(version: tuple = sys.version_info[:2]) -> bool:
    """Whether this interpreter's dicts have the 3.11 layout and change their tag on every
    change the guards must notice: seen on dicts made here, never assumed. `version`: the
    Python version (major, minor) this is."""
    if sys.implementation.name != "cpython" or version != (3, 11):
        return False
    if ctypes.sizeof(ctypes.c_void_p) != _WORD or ctypes.sizeof(ctypes.c_ssize_t) != _WORD:
        return False
    for size in (0, 1, 5):
        d = dict.fromkeys(range(size))
        if ctypes.c_ssize_t.from_address(id(d) + _USED_OFFSET).value != size:
            return False

    class Probe:
        pass

    probe = Probe()
    probe.a = 1
    d: dict = {"a": 1}
    changes: list[Callable[[], object]] = [
        lambda: d.__setitem__("b", 2), lambda: d.__setitem__("b", 3),
        lambda: d.__delitem__("a"), lambda: d.update(c=4), lambda: d.setdefault("e", 5),
        lambda: d.pop("c"), lambda: d.popitem(), lambda: d.clear(),
        lambda: d.__setitem__("a", 1),
    ]
    tags = [_tag(d)]
    for change in changes:
        change()
        tags.append(_tag(d))
    attrs = vars(probe)
    for i in range(12):  # enough stores for the interpreter to specialise STORE_ATTR
        probe.a = [i]
        tags.append(_tag(attrs))
    delattr(probe, "a")
    tags.append(_tag(attrs))
    klass = vars(Probe)
    under = class_dict(klass)
    if under is None:
        return False
    Probe.x = 1
    tags.append(_tag(under))
    # one global counter: every change gives a tag above every earlier one
    return all(a < b for a, b in zip(tags, tags[1:]))


def class_dict(proxy: types.MappingProxyType) -> dict | None:
    """The dict a mappingproxy shows (a class's `vars()`), or None."""
    referents = gc.get_referents(proxy)
    if len(referents) == 1 and type(referents[0]) is dict:
        return referents[0]
    return None


AVAILABLE = _probe()


def tagged_dict(container, empty: bool) -> dict | None:
    """The dict whose tag stands for `container`'s keys and values (see the module
    docstring), or None where no tag does or tags are not `AVAILABLE`. `empty`: the guard
    checks only that the container is empty."""
    if not AVAILABLE:
        return None
    kind = type(container)
    if kind is dict or kind is defaultdict or (kind is OrderedDict and empty):
        return container
    if kind is types.MappingProxyType:
        return class_dict(container)
    return None


class DictVersions:
    """The version tags of some dicts, read in one gather (see the module docstring):
    `matches()` is true when none of them changed since the tags were last kept."""

    __slots__ = ("dicts", "view", "indices", "expected")

    def __init__(self, dicts: list[dict]) -> None:
        if not AVAILABLE:
            raise RuntimeError("graphc.jit.dict_versions: dict version tags need CPython 3.11 "
                               "(AVAILABLE is false here); use the guards' key and value "
                               "comparison instead")
        self.dicts = tuple(dicts)  # held: no address read here is reused while we live
        addresses = [id(d) + _TAG_OFFSET for d in self.dicts]
        base = min(addresses)
        count = (max(addresses) - base) // _WORD + 1
        # one array over the span of memory between the first and the last tag, read at the
        # tags' positions only
        span = (ctypes.c_uint64 * count).from_address(base)
        self.view = np.frombuffer(span, dtype=np.uint64)
        self.view.flags.writeable = False
        self.indices = np.array([(a - base) // _WORD for a in addresses], dtype=np.intp)
        self.expected = b""  # no tags kept yet: the first `matches` is false

    def read(self) -> bytes:
        return self.view[self.indices].tobytes()

    def matches(self) -> bool:
        return self.view[self.indices].tobytes() == self.expected

    def confirm(self, check: Callable[[], bool]) -> bool:
        """`check()` (the full comparison of the dicts against what the guard recorded);
        where it holds, the tags read just before it are kept, so the next `matches` is
        true while nothing changes."""
        now = self.read()
        if check():
            self.expected = now
            return True
        return False


__all__ = ["AVAILABLE", "DictVersions", "class_dict", "tagged_dict"]
