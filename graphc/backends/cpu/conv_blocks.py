"""conv_blocks: a convolution kernel's images, one by one or in blocks of one GEMM.

The im2col lowerings (graphc.backends.cpu.conv) and the Winograd kernels
(graphc.backends.cpu.conv_winograd) walk a batch of images in blocks:

- `images_per_block`: how many images one im2col GEMM covers. An image with fewer than
  THIN_COLUMNS output positions makes a thin GEMM that runs at half of BLAS's speed, so such
  images go in blocks of about BLOCK_COLUMNS columns (the block's columns side by side).
- `over_blocks`: the block loop of a serial kernel: whole blocks, then the partial last one,
  so every GEMM has constant sizes (a batch known per call: its whole blocks, then the rest
  image by image);
- `tile_blocks`: how many images a Winograd-family kernel's block holds (its GEMMs sum a
  block's tiles: BLOCK_TILES wanted, twice as many for wide layers), and the block sizes
  its GEMMs must serve;
- `walk_blocks`: that loop, or in a range kernel split over the cores its share's blocks
  (graphc.backends.cpu.conv_threads, `over_units`); `block_images`: the images of a block.
"""

from __future__ import annotations

from contextlib import contextmanager

from llvmlite import ir

from graphc.backends.cpu import conv_threads
from graphc.backends.cpu.conv_im2col import Geometry
from graphc.backends.cpu.values import i64, loop, size

__all__ = ["BLOCK_COLUMNS", "THIN_COLUMNS", "block_images", "images_per_block", "over_blocks",
           "tile_blocks", "walk_blocks"]

# Images per GEMM: one image's GEMM with fewer than THIN_COLUMNS output positions (columns)
# runs at half of BLAS's speed (ResNet's 4x4 layer: [512 x 4608] @ [4608 x 16] at 62 GFLOP/s,
# 105 as one GEMM over blocks of 32 images, 1-thread CPU time), so such images go in blocks of
# BLOCK_COLUMNS columns, at the price of copying the block's result (or gradient) between
# the GEMM's layout and NCHW. At 64 columns and more that copy costs what the GEMM gains.
THIN_COLUMNS = 64
BLOCK_COLUMNS = 512


def images_per_block(g: Geometry) -> int:
    """How many images one GEMM covers (see BLOCK_COLUMNS)."""
    if g.p >= THIN_COLUMNS or g.n <= 1:
        return 1
    per_block = -(-BLOCK_COLUMNS // g.p)
    if type(g.n) is not int:  # a batch known per call: over_blocks takes its whole blocks
        return per_block
    return min(g.n, per_block)


def tile_blocks(n, tiles: int, want: int) -> tuple[int, set[int]]:
    """(images a block, the block sizes a kernel meets) for `n` images of `tiles` tiles, a
    block of at least `want` tiles: whole images, at most the batch where it is known; the
    sizes are a whole block and the partial last one (1 too where the batch is known per
    call: over_blocks then takes the rest image by image)."""
    nb = max(1, -(-want // tiles))
    nb = nb if type(n) is not int else min(n, nb)
    return nb, {nb} | ({n % nb} - {0} if type(n) is int else {1})


def over_blocks(b, n: int, nb: int, body) -> None:
    """body(b, first image, images) for each block of `nb` images, then the partial last
    block (its size a constant too, so every GEMM has constant sizes). A batch known per
    call (graphc.backends.cpu.runtime_sizes): its whole blocks, then the rest image by image
    (constant sizes still)."""
    if type(n) is not int:
        count = size(b, n)
        full = b.udiv(count, i64(nb))
        with loop(b, 0, full, "block") as k:
            body(b, b.mul(k, i64(nb)), nb)
        if nb > 1:
            with loop(b, b.mul(full, i64(nb)), count, "rest") as k:
                body(b, k, 1)
        return
    full, tail = divmod(n, nb)
    if full == 1:
        body(b, 0, nb)
    elif full:
        with loop(b, 0, full, "block") as k:
            body(b, b.mul(k, i64(nb)), nb)
    if tail:
        body(b, full * nb, tail)


@contextmanager
def block_images(b, count: int):
    """The images j of a block (no loop for a block of one image)."""
    if count == 1:
        yield 0
    else:
        with loop(b, 0, count, "img") as j:
            yield j


def walk_blocks(b, kb, g: Geometry, nb: int, split, control: int, block) -> ir.Value | int:
    """block(b, n0, count) over the kernel's blocks: all of them (`over_blocks`), or, in a
    range kernel (`split`), those of its share (`conv_threads.over_units`). Returns the
    first image this kernel's call walks (0, or the share's first)."""
    if split is None:
        over_blocks(b, g.n, nb, block)
        return 0
    lo, hi = conv_threads.unit_range(b, kb, control)
    conv_threads.over_units(b, g.n, nb, lo, hi, block)
    return b.mul(lo, i64(nb))
