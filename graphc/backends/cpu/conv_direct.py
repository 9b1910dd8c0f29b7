"""conv_direct: convolutions lowered as direct loops, without im2col or a GEMM.

Called first by graphc.backends.cpu.conv's three convolution lowerings; each returns False
when its node does not take a direct path (conv then uses im2col + GEMM).
"""

from __future__ import annotations


def conv2d(lw, node, g, x, w, out) -> bool:
    return False


def conv2d_input_grad(lw, node, g) -> bool:
    return False


def conv2d_weight_grad(lw, node, g) -> bool:
    return False
