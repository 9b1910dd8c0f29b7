"""Bad inputs: impossible sizes. An arena that cannot be allocated is a graphc error naming
the bytes requested and the node (op and source line) of the largest buffer, raised before
any code is compiled; nothing is left half-built."""

import pytest

pytest.importorskip("llvmlite")

from graphc.backends.cpu.executable import ArenaAllocationError, CpuExecutable  # noqa: E402
from graphc.errors import GraphcError  # noqa: E402
from graphc.ir import parse  # noqa: E402

HUGE = 1 << 20  # a 2**20 x 2**20 float32 intermediate: 4 TiB


def test_an_impossible_arena_names_the_bytes_and_the_node(monkeypatch):
    from graphc.backends.cpu import llvm

    def never(*args, **kwargs):
        raise AssertionError("compiled before the arena was known to fit")

    monkeypatch.setattr(llvm, "compile_module", never)
    graph = parse(f"""graph @big(%x: f32[{HUGE},{HUGE}]) -> (f32[]) {{
  %0: f32[{HUGE},{HUGE}] = exp(%x)  # model.py:12
  %1: f32[{HUGE},{HUGE}] = exp(%0)  # model.py:13
  %2: f32[] = reduce_sum[axes=(0, 1), keepdim=false](%1)  # model.py:14
  return (%2)
}}""")
    with pytest.raises(ArenaAllocationError) as err:
        CpuExecutable(graph)
    message = str(err.value)
    assert "graph @big needs an arena of 4,398,046,511,1" in message  # one buffer, +scratch
    assert "largest buffer is %0 (4,398,046,511,104 bytes)" in message
    assert "made by exp at model.py:1" in message and "smaller batch" in message
    assert isinstance(err.value, (GraphcError, MemoryError))
