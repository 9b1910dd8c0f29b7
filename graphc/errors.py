"""The one error hierarchy of graphc.

Every error graphc raises on purpose is a `GraphcError`. The kinds also derive from the
builtin exception PyTorch raises in the same situation (RuntimeError for shape and autograd
errors, TypeError/ValueError for bad arguments), so code written for PyTorch that catches those
keeps working. A message says what failed, where (op and user source line), what was expected
and what came, and what to do.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class GraphcError(Exception):
    """Base of every error graphc raises on purpose."""


class ShapeError(GraphcError, RuntimeError):
    """Shapes that do not fit an op (broadcasting, matmul inner dims, reshape sizes...)."""


class DTypeError(GraphcError, RuntimeError):
    """A dtype an op does not accept (e.g. a float index, an integer tensor requiring grad)."""


class ArgumentError(GraphcError, ValueError):
    """A bad non-tensor argument: an axis out of range, a negative stride, an unknown mode."""


class IndexOutOfRangeError(ArgumentError, IndexError):
    """An index past the end of a dimension or a class target out of range (IndexError)."""


class InputCheckError(GraphcError, AssertionError):
    """An input PyTorch refuses with AssertionError (nn.MultiheadAttention's shape checks)."""


class AutogradError(GraphcError, RuntimeError):
    """Misuse of autograd: saved tensors changed in place, backward twice, wrong grad count."""


class TraceError(GraphcError, RuntimeError):
    """Something a trace cannot record: data-dependent control flow, an escape to numpy."""


_traced_location: ContextVar[str | None] = ContextVar("graphc_traced_location", default=None)


@contextmanager
def traced_location(loc: str | None):
    """While a graph node runs (the interpreter), errors name the line it was traced from."""
    token = _traced_location.set(loc)
    try:
        yield
    finally:
        _traced_location.reset(token)


def user_source_location() -> str | None:
    """`file:line` of the innermost stack frame outside the graphc package and outside the
    interpreter's own machinery (`<frozen runpy>`), if any; inside `traced_location(loc)`,
    that node's `loc`."""
    traced = _traced_location.get()
    if traced:
        return traced
    frame = sys._getframe(1)
    while frame is not None:
        raw = frame.f_code.co_filename
        user = _user_file.get(raw, False)
        if user is False:  # first sight of this file: the tracer asks per recorded op
            filename = os.path.abspath(raw)
            user = _user_file[raw] = None if filename.startswith(_PACKAGE_DIR + os.sep) \
                or raw.startswith("<frozen") else os.path.basename(filename)
        if user is not None:
            return f"{user}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_user_file: dict[str, str | None] = {}  # co_filename -> its basename when a user's, else None


def where(op_name: str) -> str:
    """Prefix for error messages: the op and, when known, the user's source line."""
    loc = user_source_location()
    return f"{op_name} at {loc}" if loc else op_name
