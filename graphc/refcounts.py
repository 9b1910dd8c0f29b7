"""Whether this interpreter's reference counts can tell that nothing else holds an object.

Two places decide from `sys.getrefcount` that only graphc's own references hold an array:
a compiled call reuses a large output array the caller has dropped (graphc.backends.cpu.
executable and its steady call), and the eager engine adopts a gradient as `.grad` without a
copy (graphc.autograd.graph). The counts they expect are CPython's with the GIL up to 3.13,
where a local variable and getrefcount's own argument each count one. CPython 3.14 loads
locals as borrowed references (one fewer), and a free-threaded build counts differently;
there an expected count could take an array the user still holds for a free one, and graphc
would write into memory the user sees. So the count is measured once, at import, on the
pattern the checks use (an object held by a container and a local); where it is not what
they expect, `COUNTS_ARE_EXACT` is False and nothing is reused or adopted: each call makes
fresh outputs, and gradients are copied. Slower, never wrong.
"""

from __future__ import annotations

import sys
import sysconfig

__all__ = ["COUNTS_ARE_EXACT", "counts_are_exact"]


def counts_are_exact() -> bool:
    """Measures the pattern: an object in a list and in a local reads 3 (the list, the local,
    getrefcount's argument) where the reuse checks' expectations hold."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return False
    holder = [bytearray(1)]
    value = holder[0]
    return sys.getrefcount(value) == 3


COUNTS_ARE_EXACT = counts_are_exact()
