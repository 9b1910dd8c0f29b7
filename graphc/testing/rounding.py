"""The rounding criterion for rewrites that reassociate float arithmetic.

A compiled kernel may sum in another order than eager numpy (a fused reduction, a GEMM with
transpose flags instead of a materialised transpose, a batch folded into one GEMM), so its
float32 result need not equal eager graphc's bit for bit. Neither is the right answer; a
float64 run of the same computation is the yardstick. `assert_rounding_within(got, eager,
reference)` passes when the compiled result is no further from the reference than `factor`
times eager graphc's distance (default 2), plus a floor of a few units in the last place of
the values' magnitude, for computations eager happens to round exactly.

>>> import numpy as np
>>> ref = np.array([1.0, 2.0]) / 3
>>> eager = ref.astype(np.float32)
>>> assert_rounding_within(eager, eager, ref)
>>> assert_rounding_within(eager + np.float32(1e-3), eager, ref)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
AssertionError: compiled result is 0.001 from the float64 reference; eager graphc is ...
"""

from __future__ import annotations

import numpy as np

__all__ = ["assert_rounding_within", "rounding_distance"]


def rounding_distance(values, reference) -> float:
    """The largest absolute difference between `values` and a float64 `reference`."""
    values = np.asarray(values, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if values.shape != reference.shape:
        raise AssertionError(f"shape {values.shape} against the reference's {reference.shape}")
    return float(np.abs(values - reference).max()) if values.size else 0.0


def assert_rounding_within(got, eager, reference, factor: float = 2.0, ulps: float = 4.0):
    """Compiled `got` is within `factor` x eager's distance from `reference` (+ `ulps` of the
    magnitude in got's dtype); raises AssertionError naming both distances."""
    got = np.asarray(got)
    error = rounding_distance(got, reference)
    eager_error = rounding_distance(eager, reference)
    scale = float(np.abs(np.asarray(reference, dtype=np.float64)).max()) if got.size else 0.0
    eps = np.finfo(got.dtype).eps if np.issubdtype(got.dtype, np.floating) else 0.0
    floor = ulps * eps * max(scale, 1.0)
    if not error <= factor * eager_error + floor:
        raise AssertionError(
            f"compiled result is {error:.3g} from the float64 reference; eager graphc is "
            f"{eager_error:.3g} from it (allowed: {factor:g} x that + {floor:.3g})")
