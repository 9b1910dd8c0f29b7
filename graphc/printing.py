"""PyTorch-like `repr` of tensors: `tensor([1., 2.], requires_grad=True)`.

Floats print as PyTorch prints them: integral values as `1.`, others with four decimals, and
scientific notation when magnitudes span more than the fixed format shows well.
"""

from __future__ import annotations

import numpy as np

_DEFAULT_DTYPES = ("float32", "int64", "bool")


def _float_formatter(data: np.ndarray):
    finite = data[np.isfinite(data)]
    if finite.size == 0:
        return "{:.4f}".format
    absmax = float(np.abs(finite).max())
    nonzero = np.abs(finite[finite != 0])
    absmin = float(nonzero.min()) if nonzero.size else 0.0
    if np.all(finite == np.round(finite)) and absmax < 1e8:
        return _integral_float
    if absmax >= 1e8 or (absmin and absmin < 1e-4) or (absmin and absmax / absmin > 1e3):
        return "{:.4e}".format
    return "{:.4f}".format


def _integral_float(v: float) -> str:
    if not np.isfinite(v):
        return str(v)
    return f"{int(v)}."


def _format_array(data: np.ndarray) -> str:
    if data.dtype == np.bool_:
        fmt = {"bool": lambda v: "True" if v else "False"}
    elif np.issubdtype(data.dtype, np.floating):
        f = _float_formatter(data)
        fmt = {"float_kind": lambda v: "nan" if np.isnan(v) else ("inf" if v == np.inf else (
            "-inf" if v == -np.inf else f(v)))}
    else:
        fmt = None
    return np.array2string(data, separator=", ", formatter=fmt, prefix="tensor(",
                           threshold=1000, edgeitems=3, max_line_width=80)


def tensor_repr(t) -> str:
    body = _format_array(t._data)
    extras = []
    if t.numel() == 0 and t.ndim != 1:
        extras.append(f"size={tuple(t.shape)}")
    if t.dtype.name not in _DEFAULT_DTYPES:
        extras.append(f"dtype=graphc.{t.dtype.name}")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"
