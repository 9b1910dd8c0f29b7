"""`finfo`, `iinfo` and the default dtype, for graphc's four dtypes.

graphc's default floating dtype is float32 and stays float32: Python floats, `zeros`,
`rand`... make float32 unless given `dtype=`. `set_default_dtype(graphc.float32)` is accepted;
any other dtype is refused with an error rather than half-honoured (a program that asks for
float64 everywhere and silently gets float32 in some places would compute wrong answers).
graphc has no float16, bfloat16 or int32: asking finfo/iinfo for them (by numpy dtype or by
name) is a TypeError naming the missing dtype, never the numbers of a nearby dtype.

>>> import graphc
>>> graphc.finfo(graphc.float32).eps
1.1920928955078125e-07
>>> graphc.iinfo(graphc.int64).max
9223372036854775807
"""

from __future__ import annotations

import numpy as np

from graphc.types import DType, as_dtype, bool_, float32, float64, int64


def _resolve(spec, function: str) -> DType:
    """A graphc DType for `spec`, refusing what graphc would only approximate (float16...)."""
    if isinstance(spec, DType):
        return spec
    try:
        numpy_dtype = np.dtype(spec)
    except TypeError:
        numpy_dtype = None
    if numpy_dtype is not None and numpy_dtype not in (np.dtype(d.np) for d in
                                                       (float32, float64, int64, bool_)):
        raise TypeError(f"{function}: graphc has no {numpy_dtype} dtype (it has float32, "
                        "float64, int64 and bool)")
    try:
        return as_dtype(spec)
    except TypeError:
        raise TypeError(f"{function}: not a graphc dtype: {spec!r} (graphc has float32, "
                        "float64, int64 and bool)") from None


class finfo:  # noqa: N801 (PyTorch's name)
    """Machine limits of a floating dtype (float32 when none is given), as torch.finfo."""

    def __init__(self, type=None):  # noqa: A002
        dtype = float32 if type is None else _resolve(type, "graphc.finfo")
        if not dtype.is_floating:
            raise TypeError("torch.finfo() requires a floating point input type. Use "
                            "torch.iinfo to handle 'torch.finfo'")
        info = np.finfo(dtype.np)
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = float(info.smallest_normal)
        self.smallest_normal = self.tiny
        self.resolution = 10.0 ** -int(info.precision)  # a Python float, as PyTorch's
        self.dtype = dtype.name

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
                f"eps={self.eps:g}, smallest_normal={self.smallest_normal:g}, "
                f"tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:  # noqa: N801
    """Limits of an integer dtype (int64), as torch.iinfo."""

    def __init__(self, type):  # noqa: A002
        dtype = _resolve(type, "graphc.iinfo")
        if dtype is bool_:
            raise TypeError("torch.bool is not supported by torch.iinfo")
        if dtype.is_floating:
            raise TypeError("torch.iinfo() requires an integer input type. Use torch.finfo to "
                            "handle 'torch.iinfo'")
        info = np.iinfo(dtype.np)
        self.bits = int(info.bits)
        self.max = int(info.max)
        self.min = int(info.min)
        self.dtype = dtype.name

    def __repr__(self) -> str:
        return f"iinfo(min={float(self.min):g}, max={float(self.max):g}, dtype={self.dtype})"


def get_default_dtype() -> DType:
    """The dtype Python floats and floating creation functions give: float32."""
    return float32


def set_default_dtype(d) -> None:
    """Accepts float32 (graphc's fixed default); refuses the others with the reason."""
    dtype = _resolve(d, "graphc.set_default_dtype")
    if not dtype.is_floating:
        raise TypeError("only floating-point types are supported as the default type")
    if dtype is not float32:
        raise NotImplementedError(
            f"graphc.set_default_dtype({dtype.name}): graphc's default dtype is float32 and "
            "cannot change; pass dtype=graphc.float64 to creation functions (graphc.tensor, "
            "zeros, rand...) or call .double() on the model instead")


PUBLIC = ("finfo", "iinfo", "get_default_dtype", "set_default_dtype")
