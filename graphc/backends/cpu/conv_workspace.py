"""conv_workspace: the scratch region every convolution kernel of a module shares.

A convolution kernel's temporaries (im2col columns, a block's result or gathered gradients,
Winograd's transformed tiles, padded planes) live in the backend scratch, in one region per
lowered module (`reserve_workspace`). The kernels run one after another and keep nothing
there between calls, so the region is the largest kernel's need, not the sum of them.
`workspace` lays one kernel's temporaries out in it; a kernel split over the cores takes one
copy per share instead (graphc.backends.cpu.conv_threads, `plan_split`, which reserves its
need here too).
"""

from __future__ import annotations

import math
import weakref

from graphc.backends.cpu.values import Loc, contiguous
from graphc.types import TensorType

__all__ = ["reserve_workspace", "workspace"]

_WORKSPACES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lowerer -> [at, n]


def reserve_workspace(lw, need: int) -> int:
    """The scratch offset of the module's convolution workspace, grown to `need` bytes:
    every convolution kernel of the module shares it (they run one after another and keep
    nothing there between calls), so the scratch is the largest need, not the sum."""
    ws = _WORKSPACES.get(lw)
    if ws is None or ws[1] < need:
        if ws is not None and ws[0] + ws[1] == lw.scratch:  # still the last: grow in place
            lw.scratch = ws[0]
        ws = [lw.add_scratch(need), need]
        _WORKSPACES[lw] = ws
    return ws[0]


def workspace(lw, dt, *shapes) -> list[Loc]:
    """Contiguous temporaries for one convolution kernel, in the module's shared convolution
    workspace (`reserve_workspace`; a kernel split over the cores takes one copy per thread:
    graphc.backends.cpu.conv_threads)."""
    sizes = [-(-math.prod(s) * dt.itemsize // 64) * 64 for s in shapes]
    locs, at = [], lw.arena_end + reserve_workspace(lw, sum(sizes))
    for shape, n in zip(shapes, sizes):
        locs.append(contiguous("arena", 0, at, TensorType(tuple(shape), dt)))
        at += n
    return locs
