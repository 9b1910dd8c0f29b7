"""image_kernels: the building blocks of the image ops' kernels (convolution and pooling).

The convolution paths (graphc.backends.cpu.conv and its conv_* siblings) and pooling and
batch normalisation (graphc.backends.cpu.pool) build their kernels by hand-addressing
elements; this module holds what they share:

- index arithmetic on i64 terms that folds the constants (`iadd`, `imul`);
- `Table`: a constant i64 table indexed at run time, folded where uniform; the geometry
  tables it holds come from `out_ranges` (per kernel tap, the output positions it reaches)
  and `window_taps` (per output position, the taps in bounds);
- strides and layout: `element_strides` (element strides of a Loc), `image_strides` (those
  of an image tensor as (n, c, h, w)), `is_contiguous`,
  `contiguous_in` (an operand copied to contiguous scratch where it is not) and
  `contiguous_out` (an output written through contiguous scratch where it is not);
- `image_kernel`: a KernelBuilder keyed by a recipe, so nodes that need the same code call
  one kernel; `called_kernel`: that kernel, or its split over the cores
  (graphc.backends.cpu.conv_threads);
- `fadd`: a float add that may reassociate (pooling's and batch_norm's sums).

Invariant: nothing here knows a convolution's or a pooling's geometry; what a kernel reads
and writes is decided by its caller and passed in as constants and tables.
"""

from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir

from graphc.backends.cpu.kernels import KernelBuilder
from graphc.backends.cpu.values import I64, Loc, contiguous_strides, i64, size

__all__ = [
    "Table",
    "called_kernel",
    "contiguous_in",
    "contiguous_out",
    "iadd",
    "image_kernel",
    "image_strides",
    "imul",
    "is_contiguous",
    "out_ranges",
]


def iadd(b, *terms) -> ir.Value:
    """Sum of i64 terms (ints, sizes known per call, or values), folding the constants."""
    k, vals = 0, []
    for t in terms:
        if isinstance(t, int):
            k += t
        else:
            vals.append(size(b, t))
    out = None
    for v in vals:
        out = v if out is None else b.add(out, v)
    if out is None:
        return i64(k)
    return b.add(out, i64(k)) if k else out


def imul(b, x, k: int):
    if isinstance(x, int):
        return x * k
    return x if k == 1 else (0 if k == 0 else b.mul(size(b, x), size(b, k)))


class Table:
    """A constant i64 table indexed at run time (folded to a constant when uniform). Its
    global is made when a kernel first indexes it at run time, so a kernel shared with an
    earlier node (`begin` returned None) leaves none behind."""

    def __init__(self, lw, values) -> None:
        self.values = [int(v) for v in values]
        self.uniform = len(set(self.values)) == 1
        self.lw = lw
        self.gv = None

    def __call__(self, b, index):
        if self.uniform:
            return self.values[0]
        if isinstance(index, int):
            return self.values[index]
        ty = ir.ArrayType(I64, len(self.values))
        if self.gv is None:
            self.gv = ir.GlobalVariable(self.lw.module, ty, name=self.lw.name("table"))
            self.gv.global_constant = True
            self.gv.linkage = "internal"
            self.gv.initializer = ir.Constant(ty, self.values)
        p = b.gep(self.gv, [i64(0), index], inbounds=True, source_etype=ty)
        return b.load(p, typ=I64)


def element_strides(loc: Loc) -> tuple[int, ...]:
    item = loc.type.dtype.itemsize
    return tuple(s // item for s in loc.strides)


def is_contiguous(loc: Loc) -> bool:
    t = loc.type
    want = contiguous_strides(t.shape, t.dtype.itemsize)
    return all(n == 1 or s == w for n, s, w in zip(t.shape, loc.strides, want))


def image_strides(loc: Loc) -> tuple[int, int, int, int]:
    """Element strides (n, c, h, w) of a batched or unbatched image tensor."""
    s = element_strides(loc)
    return (0,) + s if len(s) == 3 else s


def contiguous_in(lw, loc: Loc) -> Loc:
    """`loc`, or a contiguous copy of it in scratch."""
    if is_contiguous(loc):
        return loc
    tmp = lw.scratch_loc(loc.type)
    lw.copy(loc, tmp, "pack")
    return tmp


@contextmanager
def contiguous_out(lw, loc: Loc):
    """Yield a contiguous Loc to write; copied to `loc` afterwards when it is not one."""
    if is_contiguous(loc):
        yield loc
        return
    tmp = lw.scratch_loc(loc.type)
    yield tmp
    lw.copy(tmp, loc, "unpack")


def image_kernel(lw, name: str, locs: list[Loc], recipe: object = None):
    """A KernelBuilder whose operands are `locs` (element addressing by hand). `recipe`:
    what the kernel's code depends on besides the locs (the lowering's path and geometry);
    the locs' types and strides are added to it here, since the code addresses them by hand.
    With a recipe, `kb.begin()` returns None when the same kernel was built before (for
    another node: ResNet's repeated blocks) and `kb.kernel` is that function, to be called
    with these locs (graphc.backends.cpu.kernels, "Shared kernels"); None: never shared."""
    if recipe is not None:
        recipe = (name, recipe, tuple((loc.type, loc.strides) for loc in locs))
    kb = KernelBuilder(lw, lw.name(name), (1,), recipe)
    ids = [kb.operand(loc, (0,)) for loc in locs]
    return kb, ids


def fadd(b, x, y, reassoc=False):
    r = b.fadd(x, y)
    if reassoc:
        r.flags.extend(("reassoc", "nsz"))
    return r


def window_taps(n: int, out: int, k: int, s: int, p: int, d: int):
    """Per output position o: the range [lo, hi) of kernel taps t whose input position
    o*s - p + t*d lies in [0, n)."""
    lo, hi = [], []
    for o in range(out):
        start = o * s - p
        ts = [t for t in range(k) if 0 <= start + t * d < n]
        lo.append(ts[0] if ts else 0)
        hi.append(ts[-1] + 1 if ts else 0)
    return lo, hi


def out_ranges(n: int, out: int, k: int, s: int, p: int, d: int):
    """Per kernel tap t: the range [lo, hi) of output positions o whose input position
    o*s - p + t*d lies in [0, n)."""
    lo, hi = [], []
    for t in range(k):
        os_ = [o for o in range(out) if 0 <= o * s - p + t * d < n]
        lo.append(os_[0] if os_ else 0)
        hi.append(os_[-1] + 1 if os_ else 0)
    return lo, hi



def called_kernel(lw, kernel, split, **how):
    """The kernel the driver calls: `kernel`, or its split over the cores."""
    return kernel if split is None else split.call(lw, kernel, **how)
