"""PyTorch's `repr` of tensors, character for character: `tensor([1., 2.], requires_grad=True)`.

This follows `torch/_tensor_str.py` (precision 4, threshold 1000, edgeitems 3, linewidth 80):
one formatter per tensor decides, from the non-zero finite values, between integral floats
(`1.`), fixed point (`1.5000`) and scientific notation (`1.0000e+08`) and pads every element
to a common width; tensors over the threshold print their first and last three entries per
dimension. Only the sign rules, widths and line breaks PyTorch uses are reproduced here; the
formatting itself is plain Python string formatting over the numpy values.
"""

from __future__ import annotations

import math

import numpy as np

PRECISION = 4
THRESHOLD = 1000
EDGEITEMS = 3
LINEWIDTH = 80

_DEFAULT_DTYPES = ("float32", "int64", "bool")


class _Formatter:
    """Decides the notation and the common width of every element (PyTorch's _Formatter)."""

    def __init__(self, data: np.ndarray) -> None:
        self.floating = np.issubdtype(data.dtype, np.floating)
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = data.reshape(-1)
        if not self.floating:
            for value in flat.tolist():
                self.max_width = max(self.max_width, len(str(value)))
            return
        vals = flat[np.isfinite(flat) & (flat != 0)]
        if vals.size == 0:
            return
        absvals = np.abs(vals.astype(np.float64))
        lo, hi = float(absvals.min()), float(absvals.max())
        self.int_mode = bool(np.all(vals == np.ceil(vals)))
        self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
        for value in vals.tolist():
            if self.sci_mode:
                width = len(f"{value:.{PRECISION}e}")
            elif self.int_mode:
                width = len(f"{value:.0f}") + 1
            else:
                width = len(f"{value:.{PRECISION}f}")
            self.max_width = max(self.max_width, width)

    def format(self, value) -> str:
        if self.floating:
            if self.sci_mode:
                text = f"{value:{self.max_width}.{PRECISION}e}"
            elif self.int_mode:
                text = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    text += "."
            else:
                text = f"{value:.{PRECISION}f}"
        else:
            text = str(value)
        return (self.max_width - len(text)) * " " + text


def _summarized(data: np.ndarray) -> np.ndarray:
    """The entries a summarized print shows (first and last EDGEITEMS along every dim)."""
    if data.ndim == 0:
        return data
    if data.ndim == 1:
        if data.shape[0] > 2 * EDGEITEMS:
            return np.concatenate((data[:EDGEITEMS], data[-EDGEITEMS:]))
        return data
    rows = range(data.shape[0])
    if data.shape[0] > 2 * EDGEITEMS:
        rows = [*range(EDGEITEMS), *range(data.shape[0] - EDGEITEMS, data.shape[0])]
    return np.stack([_summarized(data[i]) for i in rows])


def _vector_str(data: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    per_line = max(1, math.floor((LINEWIDTH - indent) / (fmt.max_width + 2)))
    if summarize and data.shape[0] > 2 * EDGEITEMS:
        items = ([fmt.format(v) for v in data[:EDGEITEMS].tolist()] + [" ..."]
                 + [fmt.format(v) for v in data[-EDGEITEMS:].tolist()])
    else:
        items = [fmt.format(v) for v in data.tolist()]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _tensor_str(data: np.ndarray, indent: int, summarize: bool, fmt: _Formatter) -> str:
    if data.ndim == 0:
        return fmt.format(data.item())
    if data.ndim == 1:
        return _vector_str(data, indent, summarize, fmt)
    n = data.shape[0]
    if summarize and n > 2 * EDGEITEMS:
        slices = ([_tensor_str(data[i], indent + 1, summarize, fmt) for i in range(EDGEITEMS)]
                  + ["..."]
                  + [_tensor_str(data[i], indent + 1, summarize, fmt)
                     for i in range(n - EDGEITEMS, n)])
    else:
        slices = [_tensor_str(data[i], indent + 1, summarize, fmt) for i in range(n)]
    return "[" + ("," + "\n" * (data.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def array_str(data: np.ndarray, indent: int) -> str:
    """The bracketed body of a tensor's repr (without `tensor(` and the suffixes)."""
    if data.size == 0:
        return "[]"
    summarize = data.size > THRESHOLD
    fmt = _Formatter(_summarized(data) if summarize else data)
    return _tensor_str(data, indent, summarize, fmt)


def _add_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > LINEWIDTH:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(t, prefix: str = "tensor(") -> str:
    """`repr(t)` as PyTorch writes it, with `graphc.` where PyTorch writes `torch.`."""
    data = t._data
    indent = len(prefix)
    suffixes = []
    if data.size == 0:
        if data.ndim != 1:
            suffixes.append(f"size={tuple(data.shape)}")
        if t.dtype.name != "float32":
            suffixes.append(f"dtype=graphc.{t.dtype.name}")
    elif t.dtype.name not in _DEFAULT_DTYPES:
        suffixes.append(f"dtype=graphc.{t.dtype.name}")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + array_str(data, indent), suffixes, indent)
