"""Convolution, pooling and batch-norm kernels are built once per distinct recipe
(graphc.backends.cpu.image_kernels.image_kernel): nodes of the same geometry, types and strides call
one kernel; another stride of an operand, another geometry or other attributes make another
kernel; and a module built with sharing computes what one built without it computes, bit for
bit, on every path (im2col + GEMM, Winograd, depthwise direct loops, pooling, batch norm)."""

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from graphc.backends import compile as compile_graph  # noqa: E402
from graphc.backends.cpu import kernels  # noqa: E402
from graphc.backends.cpu.executable import CpuExecutable  # noqa: E402
from graphc.ir import parse  # noqa: E402

CONV = "stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups={g}"
STRIDED = "stride=(2, 2), padding=(1, 1), dilation=(1, 1), groups={g}"


def conv_graph(c: int, o: int, groups: int) -> str:
    """Two convolutions of one geometry (and their input and weight gradients), one over a
    transposed view of the same images (other strides), one at stride 2 (other geometry)."""
    x, w = f"f32[2,{c},8,8]", f"f32[{o},{c // groups},3,3]"
    y, half = f"f32[2,{o},8,8]", f"f32[2,{o},4,4]"
    same, strided = CONV.format(g=groups), STRIDED.format(g=groups)
    return f"""graph @convs(%x1: {x}, %x2: {x}, %w: {w}, %gy1: {y}, %gy2: {y}) -> ({y}, {y},
        {y}, {half}, {x}, {x}, {w}, {w}) {{
      %a: {y} = conv2d[{same}](%x1, %w)
      %b: {y} = conv2d[{same}](%x2, %w)
      %t: {x} = permute[dims=(0, 1, 3, 2)](%x1)
      %c: {y} = conv2d[{same}](%t, %w)
      %d: {half} = conv2d[{strided}](%x1, %w)
      %gx1: {x} = conv2d_input_grad[{same}, input_hw=(8, 8)](%gy1, %w)
      %gx2: {x} = conv2d_input_grad[{same}, input_hw=(8, 8)](%gy2, %w)
      %gw1: {w} = conv2d_weight_grad[{same}, kernel_size=(3, 3)](%gy1, %x1)
      %gw2: {w} = conv2d_weight_grad[{same}, kernel_size=(3, 3)](%gy2, %x2)
      return (%a, %b, %c, %d, %gx1, %gx2, %gw1, %gw2)
    }}"""


POOLS = """graph @pools(%x1: f32[2,4,8,8], %x2: f32[2,4,8,8], %m: f32[4], %v: f32[4])
    -> (f32[2,4,4,4], f32[2,4,4,4], f32[2,4,4,4], f32[2,4,4,4], f32[2,4,4,4],
        f32[2,4,8,8], f32[2,4,8,8], f32[2,4,8,8]) {
  %p1: f32[2,4,4,4], %i1: i64[2,4,4,4] = max_pool2d[kernel_size=(2, 2), stride=(2, 2),
      padding=(0, 0), dilation=(1, 1), ceil_mode=false](%x1)
  %p2: f32[2,4,4,4], %i2: i64[2,4,4,4] = max_pool2d[kernel_size=(2, 2), stride=(2, 2),
      padding=(0, 0), dilation=(1, 1), ceil_mode=false](%x2)
  %q1: f32[2,4,4,4] = avg_pool2d[kernel_size=(3, 3), stride=(2, 2), padding=(1, 1),
      ceil_mode=false, count_include_pad=true, divisor_override=none](%x1)
  %q2: f32[2,4,4,4] = avg_pool2d[kernel_size=(3, 3), stride=(2, 2), padding=(1, 1),
      ceil_mode=false, count_include_pad=true, divisor_override=none](%x2)
  %q3: f32[2,4,4,4] = avg_pool2d[kernel_size=(3, 3), stride=(2, 2), padding=(1, 1),
      ceil_mode=false, count_include_pad=false, divisor_override=none](%x1)
  %n1: f32[2,4,8,8], %n1m: f32[4], %n1v: f32[4] = batch_norm[training=true, eps=1e-05](%x1,
      %m, %v, %m, %v)
  %n2: f32[2,4,8,8], %n2m: f32[4], %n2v: f32[4] = batch_norm[training=true, eps=1e-05](%x2,
      %m, %v, %m, %v)
  %n3: f32[2,4,8,8], %n3m: f32[4], %n3v: f32[4] = batch_norm[training=true, eps=0.001](%x1,
      %m, %v, %m, %v)
  return (%p1, %p2, %q1, %q2, %q3, %n1, %n2, %n3)
}"""


def _one_line(text: str) -> str:
    """The IR text with each node on one line (the parser reads a node per line)."""
    out, pending = [], ""
    for line in text.splitlines():
        pending = f"{pending} {line.strip()}" if pending else line
        if pending.count("(") == pending.count(")") and pending.count("[") == \
                pending.count("]"):
            out.append(pending)
            pending = ""
    return "\n".join(out)


def _names_by_value(ex: CpuExecutable) -> dict[str, str]:
    return {node.outputs[0].name: name
            for name, node in zip(ex.lowered.kernels, ex.lowered.kernel_nodes) if node}


def _inputs(graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.type.shape).astype(np.float32) + (1.0 if v.name == "v" else 0)
            for v in graph.inputs]


def _check_against_unshared(monkeypatch, text: str, seed: int) -> dict[str, str]:
    """The kernel names by value of the shared module, after checking that it computes what
    the unshared one and the interpreter do."""
    shared = CpuExecutable(parse(_one_line(text)))
    monkeypatch.setattr(kernels, "SHARE_KERNELS", False)
    unshared = CpuExecutable(parse(_one_line(text)))
    monkeypatch.setattr(kernels, "SHARE_KERNELS", True)
    assert len(set(unshared.lowered.kernels)) == len(unshared.lowered.kernels)
    arrays = _inputs(shared.graph, seed)
    ours = shared.run(*[a.copy() for a in arrays])
    theirs = unshared.run(*[a.copy() for a in arrays])
    reference = compile_graph(parse(_one_line(text)), "interp").run(*[a.copy() for a in arrays])
    for got, want, ref in zip(ours, theirs, reference):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    return _names_by_value(shared)


@pytest.mark.parametrize("path,c,o,groups", [("im2col", 12, 16, 1), ("winograd", 16, 16, 1),
                                             ("depthwise", 8, 8, 8), ("few_channels", 4, 16, 1)])
def test_convolutions_of_one_geometry_share_a_kernel(monkeypatch, path, c, o, groups):
    names = _check_against_unshared(monkeypatch, conv_graph(c, o, groups), seed=len(path))
    assert names["a"] == names["b"]
    assert names["gx1"] == names["gx2"]
    assert names["gw1"] == names["gw2"]
    assert len({names["a"], names["c"], names["d"]}) == 3  # other strides, other geometry
    expected = {"im2col": "conv2d", "winograd": "conv2d_winograd",
                "depthwise": "conv2d_depthwise", "few_channels": "conv2d_few_channels"}[path]
    assert names["a"].endswith("_" + expected)


def test_pooling_and_batch_norm_share_a_kernel_per_geometry_and_attributes(monkeypatch):
    names = _check_against_unshared(monkeypatch, POOLS, seed=7)
    assert names["p1"] == names["p2"]
    assert names["q1"] == names["q2"] != names["q3"]  # count_include_pad differs
    assert names["n1"] == names["n2"] != names["n3"]  # eps differs
