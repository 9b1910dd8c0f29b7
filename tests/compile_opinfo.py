"""Compile-and-compare over the OpInfo table: every entry's samples traced, compiled on a
backend and compared with the interpreter and the float64 reference, forward and gradients.

Backend-neutral helpers, so a backend's test file is a few lines (tests/test_cpu_opinfo.py):
- `cases()` yields one `Case` per (OpInfo entry, sample); `case.key` is `"<entry>/<k>"`
  (k: the sample's position), `case.id` adds the sample's description. Samples come from a
  numpy Generator seeded by the entry's name, so a case is the same in every run.
- `check_case(case, backend)` calls `graphc.testing.assert_compiled_matches` on the sample
  with `grads` on for differentiable entries, or, for a case in `EXPECTED_ERRORS`, checks
  that tracing or compiling refuses it with the stated error. Each ndarray argument (also
  inside list/tuple arguments: `cat`'s tensors, index tuples) becomes a tensor; the others
  are constants of the traced function. Floating tensors get gradients, except those a
  sample leaves out of a non-empty `grad_args` (batch_norm's running statistics): these
  become buffers of a small Module the traced method belongs to, so they are state the
  harness snapshots and converts to float64, not differentiated inputs. (An explicit empty
  `grad_args` only says finite differences disagree, e.g. at a padding row: the analytic
  gradients are still compared.) Tolerances are the harness's defaults, widened to the
  entry's own `rtol`/`atol` where those are larger.
- `EXPECTED_ERRORS[backend]` (the "any" key: every backend): case key -> (error class,
  message regex, why). Refusals are checked, not skipped: when a backend learns the op, the
  check fails and the entry is to be removed.
- `coverage_gaps(backend)`: registry ops no checked case of the backend names in its entry's
  `registry_ops` (tests/test_ops.py checks that every registry op is named by some entry).
"""

from __future__ import annotations

import types
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import graphc
from graphc import nn
from graphc.errors import TraceError
from graphc.ops.registry import REGISTRY
from graphc.testing import assert_compiled_matches
from tests.opinfo import OP_INFOS, OpInfo, Sample

__all__ = ["Case", "EXPECTED_ERRORS", "cases", "check_case", "coverage_gaps"]

_MASK = ("a boolean mask's result shape depends on the mask's values, which a trace does "
         "not have (graphc refuses it with TraceError, by design)")
_INT_GEMM = "the cpu backend's matmul is BLAS (float32/float64): int64 matmul is not lowered"

# backend ("any": all) -> {case key: (error class, message regex, why)}
EXPECTED_ERRORS: dict[str, dict[str, tuple[type, str, str]]] = {
    "any": {
        "getitem/12": (TraceError, "boolean mask", _MASK),
        "getitem/13": (TraceError, "boolean mask", _MASK),
        "getitem/14": (TraceError, "boolean mask", _MASK),
        "setitem/5": (TraceError, "boolean mask", _MASK),
    },
    "cpu": {
        "matmul/11": (NotImplementedError, "matmul of int64", _INT_GEMM),
        "dot/1": (NotImplementedError, "matmul of int64", _INT_GEMM),
    },
}


@dataclass(frozen=True)
class Case:
    """One sample of one OpInfo entry."""

    info: OpInfo
    index: int
    sample: Sample

    @property
    def key(self) -> str:
        return f"{self.info.name}/{self.index}"

    @property
    def id(self) -> str:
        desc = "".join(c if c.isalnum() or c in "._=" else "-" for c in self.sample.desc)
        return self.key + (f"-{desc}" if desc else "")


def cases():
    """Every (entry, sample) of the OpInfo table, in table order."""
    for info in OP_INFOS:
        rng = np.random.default_rng(zlib.crc32(f"{info.name}/compile".encode()))
        for k, sample in enumerate(info.samples(rng)):
            yield Case(info, k, sample)


def expected_error(case: Case, backend: str) -> tuple[type, str, str] | None:
    return EXPECTED_ERRORS["any"].get(case.key) or \
        EXPECTED_ERRORS.get(backend, {}).get(case.key)


class _Held(nn.Module):
    """The floating arguments of a sample that get no gradient, as buffers."""

    def __init__(self, tensors: list) -> None:
        super().__init__()
        for k, t in enumerate(tensors):
            self.register_buffer(f"arg{k}", t)


def case_function(case: Case):
    """(fn(*inputs), inputs) computing the case's op on its sample (see the docstring)."""
    info, sample = case.info, case.sample
    kwargs = dict(sample.kwargs)
    grad_args = sample.grad_args if info.differentiable and sample.grad_args else None
    inputs, held, template = [], [], []

    def place(k: int, a):
        t = graphc.tensor(a)
        if grad_args is not None and t.is_floating_point() and k not in grad_args:
            held.append(t)
            return ("held", len(held) - 1)
        inputs.append(t)
        return ("input", len(inputs) - 1)

    for k, a in enumerate(sample.args):
        if isinstance(a, np.ndarray):
            template.append(place(k, a))
        elif isinstance(a, (list, tuple)) and any(isinstance(v, np.ndarray) for v in a):
            template.append(("seq", type(a), [place(k, v) if isinstance(v, np.ndarray)
                                              else ("const", v) for v in a]))
        else:
            template.append(("const", a))

    def value(slot, tensors, module):
        kind = slot[0]
        if kind == "input":
            return tensors[slot[1]]
        if kind == "held":
            return getattr(module, f"arg{slot[1]}")
        if kind == "seq":
            return slot[1](value(s, tensors, module) for s in slot[2])
        return slot[1]

    def op(module, *tensors):
        return info.op(*(value(s, tensors, module) for s in template), **kwargs)

    op.__name__ = "".join(c if c.isalnum() else "_" for c in info.name)
    return types.MethodType(op, _Held(held)), inputs


def check_case(case: Case, backend: str) -> None:
    """Compile the case on `backend` and compare it (or check its expected refusal)."""
    fn, inputs = case_function(case)
    expected = expected_error(case, backend)
    if expected is not None:
        error, match, _ = expected
        with pytest.raises(error, match=match):
            assert_compiled_matches(fn, *inputs, backends=(backend,), grads=False)
        return
    assert_compiled_matches(fn, *inputs, backends=(backend,), grads=case.info.differentiable,
                            rtol=max(case.info.rtol, 1e-4), atol=max(case.info.atol, 1e-5))


def coverage_gaps(backend: str) -> list[str]:
    """Registry ops that no case checked on `backend` exercises (by its entry's
    `registry_ops`)."""
    from tests.opinfo import COVERAGE_EXEMPT

    covered = {op for case in cases() if expected_error(case, backend) is None
               for op in case.info.registry_ops}
    return sorted(set(REGISTRY) - covered - set(COVERAGE_EXEMPT))
