"""Data types and tensor types shared by every layer.

`DType` names the four element types graphc knows (float32, float64, int64, bool) and maps
them to numpy. `TensorType` is a shape plus a dtype: it is what the op registry's shape rules
compute with, what IR values carry, and what backends plan buffers from. Both are immutable and
hashable, so they can be dictionary keys and IR attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphc.symbolic import Sym


@dataclass(frozen=True, eq=False)
class DType:
    """An element type: `name` as users spell it, `short` as the IR prints it.

    The four dtypes are singletons compared by identity (fast on the dispatch path);
    unpickling returns the singleton.
    """

    name: str
    short: str
    np: type
    is_floating: bool
    itemsize: int
    rank: int  # promotion order: bool < int64 < float32 < float64

    def __repr__(self) -> str:
        return f"graphc.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


float32 = DType("float32", "f32", np.float32, True, 4, 2)
float64 = DType("float64", "f64", np.float64, True, 8, 3)
int64 = DType("int64", "i64", np.int64, False, 8, 1)
bool_ = DType("bool", "bool", np.bool_, False, 1, 0)

ALL_DTYPES = (float32, float64, int64, bool_)
_BY_NUMPY = {np.dtype(d.np): d for d in ALL_DTYPES}
_BY_NAME = {d.name: d for d in ALL_DTYPES} | {d.short: d for d in ALL_DTYPES}
# numpy types graphc accepts and converts on the way in (PyTorch would keep them; we narrow).
_NARROWED = {
    np.dtype(np.float16): float32,
    np.dtype(np.int8): int64,
    np.dtype(np.int16): int64,
    np.dtype(np.int32): int64,
    np.dtype(np.uint8): int64,
    np.dtype(np.uint16): int64,
    np.dtype(np.uint32): int64,
}


def dtype_of_numpy(dtype: np.dtype) -> DType:
    """The graphc dtype for a numpy dtype; float16 and small ints widen, others are refused."""
    dtype = np.dtype(dtype)
    if dtype in _BY_NUMPY:
        return _BY_NUMPY[dtype]
    if dtype in _NARROWED:
        return _NARROWED[dtype]
    raise TypeError(
        f"graphc has no dtype for numpy {dtype}: expected one of float32, float64, int64, bool"
    )


def as_dtype(spec) -> DType:
    """Accept a DType, its name ('float32', 'f32'), or a numpy dtype/type."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str) and spec in _BY_NAME:
        return _BY_NAME[spec]
    try:
        return dtype_of_numpy(np.dtype(spec))
    except TypeError as err:
        raise TypeError(f"not a graphc dtype: {spec!r}") from err


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op on two tensors (bool < int64 < float32 < float64)."""
    return a if a.rank >= b.rank else b


@dataclass(frozen=True)
class TensorType:
    """The type of a tensor: a shape and a dtype. A dimension is a non-negative int or a
    symbolic size (`graphc.symbolic.Sym`: `s0`, `s0*784`), known per call."""

    shape: tuple[int | Sym, ...]
    dtype: DType

    def __post_init__(self) -> None:
        shape = self.shape
        if type(shape) is not tuple:
            shape = tuple(s if type(s) is Sym else int(s) for s in shape)
            object.__setattr__(self, "shape", shape)
        # equality is structural (the same expression), never a guarded comparison: the
        # key replaces each symbolic size by its terms
        object.__setattr__(self, "_key", tuple(s.terms if type(s) is Sym else s for s in shape)
                           if any(type(s) is Sym for s in shape) else shape)

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, TensorType):
            return NotImplemented
        return self.dtype is other.dtype and self._key == other._key

    @property
    def is_symbolic(self) -> bool:
        """Whether a dimension is a symbolic size."""
        return any(type(s) is Sym for s in self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(str(s) for s in self.shape)}]"
