"""graphc.passes.fuse_waits on IR text, in one process: a one-gradient wait becomes the first
instruction of the elementwise update that reads it, and only then; the merged node prints,
parses and verifies, interprets to the values of the two nodes it replaced, and keeps its
order among the effectful nodes in the plan."""

import numpy as np
import pytest

from graphc.ir import parse
from graphc.ir.interpreter import run
from graphc.ir.printer import format_graph
from graphc.ir.verifier import verify
from graphc.ops import collective
from graphc.passes.fuse_waits import fuse_waits, wait_bucket
from graphc.passes.plan import check_plan, plan_buffers

# an SGD-momentum step's tail after bucket_allreduce: two one-gradient buckets
MOMENTUM = ('(("full", (), (("shape", ()), ("value", 0.9), ("dtype", "float32"))), '
            '("mul", (0, 3), ()), ("add", (4, 1), ()), '
            '("full", (), (("shape", ()), ("value", -0.1), ("dtype", "float32"))), '
            '("mul", (5, 6), ()), ("add", (2, 7), ()))')
STEP = f'''graph @g(%a: f32[4,3], %c: f32[5], %m: f32[4,3], %w: f32[4,3], %v: f32[5])
                                                                        -> (f32[4,3]) {{
  %b0: f32[12] = all_reduce_start[op="avg"](%a)                         # m.py:1
  %b1: f32[5] = all_reduce_start[op="avg"](%c)                          # m.py:2
  %0: f32[4,3] = all_reduce_wait[op="avg", shapes=((4, 3),)](%b0)       # m.py:3
  %1: f32[4,3], %2: f32[4,3] = fused[body={MOMENTUM}, outputs=(5, 8)](%m, %0, %w)
  %3: f32[5] = all_reduce_wait[op="avg", shapes=((5,),)](%b1)           # m.py:5
  %4: f32[5] = sub(%v, %3)                                              # m.py:6
  %m <- %1
  %w <- %2
  %v <- %4
  return (%0)
}}'''


class _TwoEqualRanks:
    """A communicator whose 'other rank' holds the same data (a sum doubles it)."""

    world_size, rank = 2, 0

    def allreduce(self, array, op):
        array *= 2 if op in ("sum", "avg") else 1

    def agree(self, what, signature):
        pass

    def native(self):
        return None


@pytest.fixture
def two_ranks():
    previous = collective.set_communicator(_TwoEqualRanks())
    yield
    collective.set_communicator(previous)


def test_each_one_gradient_wait_joins_its_update():
    g = fuse_waits(parse(STEP))
    verify(g)
    ops = [n.op for n in g.nodes]
    assert ops == ["all_reduce_start", "all_reduce_start", "fused", "fused"], ops
    first, second = g.nodes[2], g.nodes[3]
    assert first.attrs["body"][0] == ("all_reduce_wait", (0,),
                                      (("op", "avg"), ("shapes", ((4, 3),))))
    # the bucket first, then the update's other inputs; the gradient stays an output (returned)
    assert [v.name for v in first.inputs] == ["b0", "m", "w"]
    assert first.attrs["body"][2] == ("mul", (1, 4), ())  # %m, 0.9: refs moved by the bucket
    assert first.attrs["body"][3] == ("add", (5, 3), ())  # the gradient: the wait's result
    assert [v.name for v in first.outputs] == ["1", "2", "0"]
    assert [v.name for v in second.outputs] == ["4"]  # %3 is read by nothing else: dropped
    assert [wait_bucket(n).name for n in g.nodes[2:]] == ["b0", "b1"]
    text = format_graph(g)
    assert format_graph(parse(text)) == text


SUB = "%4: f32[5] = sub(%v, %3)"
READ_TWICE = (SUB, SUB + "\n  %9: f32[5] = neg(%3)"), ("%v <- %4", "%v <- %4\n  %c <- %9")
BY_A_REDUCTION = (
    (SUB, "%4: f32[] = reduce_sum[axes=(0,), keepdim=false](%3)"), ("%v <- %4", ""),
    ("-> (f32[4,3])", "-> (f32[4,3], f32[])"), ("return (%0)", "return (%0, %4)"))


@pytest.mark.parametrize("edits", [READ_TWICE, BY_A_REDUCTION], ids=["read-twice", "reduced"])
def test_a_wait_read_twice_or_by_a_reduction_stays(edits):
    text = STEP
    for old, new in edits:
        text = text.replace(old, new)
    g = fuse_waits(parse(text))
    verify(g)
    assert [n.op for n in g.nodes].count("all_reduce_wait") == 1  # the second one stays


def test_a_bucket_of_several_gradients_stays():
    text = '''graph @g(%a: f32[4], %c: f32[4], %w: f32[4]) -> (f32[4]) {
      %b: f32[8] = all_reduce_start[op="avg"](%a, %c)
      %0: f32[4], %1: f32[4] = all_reduce_wait[op="avg", shapes=((4,), (4,))](%b)
      %2: f32[4] = sub(%w, %0)
      %w <- %2
      return (%1)
    }'''
    assert [n.op for n in fuse_waits(parse(text)).nodes] == ["all_reduce_start",
                                                              "all_reduce_wait", "sub"]


def test_the_merged_nodes_compute_what_the_waits_and_updates_did(two_ranks):
    rng = np.random.default_rng(17)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (5,), (4, 3),
                                                                   (4, 3), (5,))]
    before = run(parse(STEP), *inputs)
    after = run(fuse_waits(parse(STEP)), *inputs)
    assert len(before) == len(after) == 4
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(after[0], inputs[0])  # two equal ranks: the average


def test_the_plan_keeps_merged_waits_in_order_and_updates_in_place():
    g = plan_buffers(fuse_waits(parse(STEP)))
    plan = g.meta["memory_plan"]
    check_plan(g, plan)
    order = [n for n in plan.schedule if n.op != "all_reduce_start"]
    assert [wait_bucket(n).name for n in order] == ["b0", "b1"]
    assert {"1", "2", "4"} <= set(plan.in_input), plan.in_input  # m, w, v updated in place
