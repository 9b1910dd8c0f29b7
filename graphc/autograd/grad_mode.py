"""Grad mode: whether ops record autograd history (thread-local, as in PyTorch).

`no_grad`, `enable_grad` and `set_grad_enabled` work as context managers and decorators.
"""

from __future__ import annotations

import functools
import threading


class _GradModeState(threading.local):
    """This thread's grad mode; on by default. (A class default rather than
    `getattr(local, "enabled", True)`: a missing attribute costs an AttributeError on every
    read, about 0.3 us, and eager dispatch reads the mode once per op.)"""

    enabled = True


state = _GradModeState()  # read directly by graphc.dispatch's eager path


def is_grad_enabled() -> bool:
    return state.enabled


def _set(enabled: bool) -> None:
    state.enabled = bool(enabled)


class _GradModeContext:
    """Base: sets grad mode on entry, restores the previous mode on exit; also a decorator.

    Entering and leaving read and write `state` in place, with no helper calls: a compiled
    call under `with graphc.no_grad():` runs this right after its native run, on caches that
    run filled, where each Python frame is a miss (docs/performance.md, "SGEMM 256")."""

    __slots__ = ("_prev",)
    _mode = True

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return object.__new__(cls)
        if not callable(orig_func):
            raise TypeError(f"{cls.__name__}() takes no arguments (got {orig_func!r})")
        return cls()(orig_func)  # used as a bare decorator: @no_grad

    def __enter__(self):
        self._prev = state.enabled
        state.enabled = self._mode
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        state.enabled = self._prev

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradModeContext):
    """Disable autograd recording inside the block: results do not require grad."""

    __slots__ = ()
    _mode = False


class enable_grad(_GradModeContext):
    """Enable autograd recording inside the block (e.g. inside a no_grad region)."""

    __slots__ = ()
    _mode = True


class set_grad_enabled:
    """Set grad mode to `mode`; as a context manager the previous mode comes back on exit."""

    def __init__(self, mode: bool) -> None:
        self._prev = is_grad_enabled()
        self._mode = bool(mode)
        _set(self._mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        _set(self._prev)

    def __call__(self, fn):
        """As a decorator the mode applies inside `fn` only (and is undone here at once)."""
        _set(self._prev)
        mode = self._mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper


class inference_mode(_GradModeContext):
    """PyTorch's inference_mode: here the same as `no_grad` (or a no-op with mode=False)."""

    __slots__ = ("_enabled",)

    def __new__(cls, mode=True):
        if callable(mode):
            return cls()(mode)
        return object.__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        self._enabled = bool(mode)

    def __enter__(self):
        self._prev = is_grad_enabled()
        if self._enabled:
            _set(False)
        return self

    def __call__(self, fn):
        enabled = self._enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(enabled):
                return fn(*args, **kwargs)

        return wrapper


def is_inference_mode_enabled() -> bool:
    return not is_grad_enabled()


class detect_anomaly:
    """Accepted for PyTorch compatibility; graphc's errors already name the failing node."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def set_detect_anomaly(mode: bool, check_nan: bool = True) -> None:
    """Accepted for PyTorch compatibility (see detect_anomaly)."""
