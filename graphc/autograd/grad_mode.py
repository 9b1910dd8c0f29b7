"""Grad mode: whether ops record autograd history (thread-local, as in PyTorch).

`no_grad`, `enable_grad` and `set_grad_enabled` work as context managers and decorators.
"""

from __future__ import annotations

import functools
import threading

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


def _set(enabled: bool) -> None:
    _state.enabled = bool(enabled)


class _GradModeContext:
    """Base: sets grad mode on entry, restores the previous mode on exit; also a decorator."""

    _mode = True

    def __enter__(self):
        self._prev = is_grad_enabled()
        _set(self._mode)
        return self

    def __exit__(self, *exc) -> None:
        _set(self._prev)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):  # noqa: N801 (PyTorch's name)
    """Disable autograd recording inside the block: results do not require grad."""

    _mode = False


class enable_grad(_GradModeContext):  # noqa: N801
    """Enable autograd recording inside the block (e.g. inside a no_grad region)."""

    _mode = True


class set_grad_enabled:  # noqa: N801
    """Set grad mode to `mode`; as a context manager the previous mode comes back on exit."""

    def __init__(self, mode: bool) -> None:
        self._prev = is_grad_enabled()
        self._mode = bool(mode)
        _set(self._mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        _set(self._prev)
