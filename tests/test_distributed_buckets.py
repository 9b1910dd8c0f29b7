"""Gradient buckets on 2 MPI ranks: bucketed DDP steps (compiled on cpu and interp, and
eager through autograd hooks) equal the unbucketed step; the compiled step's IR starts each
bucket's allreduce with backward compute before its wait; a rank that raises still ends the
job naming the rank. Each case runs tests/distributed/buckets.py under `graphc launch -n 2`;
the pass itself is also tested on IR text here, on one process."""

import os
import subprocess
import sys
import time

import pytest

from graphc.ir import parse
from graphc.ir.printer import format_graph
from graphc.ir.verifier import verify
from graphc.passes.bucket import bucket_allreduce

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "distributed", "buckets.py")

BACKWARD = '''graph @g(%a: f32[8], %w: f32[4,4], %v: f32[4,4]) -> (f32[4,4], f32[4,4]) {
  %0: f32[4,4] = mul(%w, %w)                               # m.py:1
  %1: f32[4,4] = all_reduce[op="avg", bucket_cap=0](%0)    # m.py:2
  %2: f32[4,4] = mul(%v, %v)                               # m.py:3
  %3: f32[4,4] = all_reduce[op="avg", bucket_cap=0](%2)    # m.py:4
  %4: f32[4,4] = sub(%w, %1)                               # m.py:5
  %5: f32[4,4] = sub(%v, %3)                               # m.py:6
  return (%4, %5)
}'''


def test_buckets_start_after_their_gradients_and_wait_in_start_order():
    g = bucket_allreduce(parse(BACKWARD))
    verify(g)
    ops = [n.op for n in g.nodes]
    assert ops == ["mul", "all_reduce_start", "mul", "all_reduce_start", "all_reduce_wait",
                   "sub", "all_reduce_wait", "sub"], ops
    text = format_graph(g)
    assert format_graph(parse(text)) == text  # start/wait print and parse back


def test_one_bucket_under_the_cap_and_a_reader_between_splits_buckets():
    g = bucket_allreduce(parse(BACKWARD.replace(", bucket_cap=0", "")))
    assert [n.op for n in g.nodes].count("all_reduce_start") == 1
    early = BACKWARD.replace("%2: f32[4,4] = mul(%v, %v)", "%2: f32[4,4] = mul(%v, %1)")
    g = bucket_allreduce(parse(early.replace(", bucket_cap=0", "")))
    assert [n.op for n in g.nodes].count("all_reduce_start") == 2  # %1 is read before %2


def test_a_small_last_bucket_joins_the_one_before():
    big = '''graph @g(%w: f32[262144], %b: f32[4]) -> (f32[262144], f32[4]) {
      %0: f32[262144] = all_reduce[op="avg"CAP](%w)   # m.py:1
      %1: f32[4] = all_reduce[op="avg"CAP](%b)        # m.py:2
      return (%0, %1)
    }'''
    starts = [n.op for n in bucket_allreduce(parse(big.replace("CAP", ""))).nodes]
    assert starts.count("all_reduce_start") == 1  # 1 MiB closes the first; 16 B joins it
    per_gradient = bucket_allreduce(parse(big.replace("CAP", ", bucket_cap=0"))).nodes
    assert [n.op for n in per_gradient].count("all_reduce_start") == 2


def test_random_ops_after_the_buckets_keep_their_order():
    g = bucket_allreduce(parse('''graph @g(%w: f32[4], %v: f32[4], %rng: i64[2])
                                                -> (f32[4], f32[4]) {
      %0: f32[4] = all_reduce[op="avg", bucket_cap=0](%w)   # m.py:1
      %1: f32[4] = all_reduce[op="avg", bucket_cap=0](%v)   # m.py:2
      %2: f32[4] = dropout[p=0.5](%0, %rng)                 # m.py:3
      %3: f32[4] = dropout[p=0.5](%w, %rng)                 # m.py:4
      %4: f32[4] = add(%3, %1)                              # m.py:5
      return (%2, %4)
    }'''))
    verify(g)
    dropouts = [n.inputs[0].name for n in g.nodes if n.op == "dropout"]
    assert dropouts == ["0", "w"], dropouts  # the draws come in program order


pytest.importorskip("mpi4py", reason="the distributed extra (mpi4py, mpich) is not installed")

from graphc.tools.launch import find_mpiexec  # noqa: E402

needs_mpi = pytest.mark.skipif(find_mpiexec() is None,
                               reason="no mpiexec next to the interpreter or on PATH")


def _launch(mode: str, *extra: str):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "graphc.tools.cli", "launch", "-n", "2",
                           WORKER, mode, *extra], capture_output=True, text=True,
                          timeout=400, cwd=ROOT)
    return done, time.monotonic() - started


@needs_mpi
@pytest.mark.parametrize("mode, transports, fused", [
    # both ranks on this machine: the shared-memory window, DDP's default a bucket per
    # gradient (so every step's waits are fused with their updates)
    ("equal", "window", 4),
    ("equal-mpi", "mpi", 1),  # node_window_bytes=0: MPI_Iallreduce (fused: LeNet, cap 0)
    ("equal-mixed", "mpi+window", 1),  # a 1 KiB window: the buckets that fit, the rest MPI
])
def test_bucketed_steps_equal_the_unbucketed_step(mode, transports, fused):
    """MLP and LeNet, SGD and Adam: cpu with several caps bit for bit, interp and eager
    buckets within 1e-6; buckets reduced in the node's shared memory, by MPI, or both; the
    one-gradient waits fused with their optimizer updates (graphc.passes.fuse_waits) on
    every transport."""
    done, _ = _launch(mode)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("bucketed == unbucketed") == 4, done.stdout
    assert f"{fused} of 4 steps with fused waits" in done.stdout, done.stdout
    assert f"buckets through {transports}\n" in done.stdout, done.stdout
    assert "pending" not in done.stderr, done.stderr  # every MPI request was waited for


@needs_mpi
def test_compiled_ir_has_compute_between_start_and_wait():
    done, _ = _launch("ir")
    assert done.returncode == 0, done.stderr
    assert "OK ir: 4 buckets" in done.stdout, done.stdout


@needs_mpi
def test_the_backward_writes_window_buckets_in_place():
    """Gradients with a buffer of their own are computed straight into the shared-memory
    window (no pack kernel, for the MLP's and LeNet's too); views, graph inputs and values
    the step also returns are packed; every result is the average over the ranks."""
    done, _ = _launch("direct")
    assert done.returncode == 0, done.stderr
    assert "OK direct: gradients written into the window, 3 packed" in done.stdout, done.stdout


@needs_mpi
@pytest.mark.parametrize("mode, via", [("fused", "window"), ("fused-mpi", "mpi")])
def test_waits_fused_with_their_updates_give_the_averages(mode, via):
    """A one-gradient bucket read by an elementwise node is reduced inside it
    (graphc.passes.fuse_waits), whether the step also returns the reduced value or not:
    on the window in one loop, on the MPI path the wait then the update."""
    done, _ = _launch(mode)
    assert done.returncode == 0, done.stderr
    assert f"OK fused: 2 waits fused with their updates, through the {via}" in done.stdout, \
        done.stdout


@needs_mpi
def test_a_step_compiled_for_another_window_is_refused():
    done, _ = _launch("stale")
    assert done.returncode == 0, done.stderr
    assert "OK stale: the step compiled for another window is refused" in done.stdout, \
        done.stdout


@needs_mpi
def test_eager_async_work_and_unused_parameters():
    done, _ = _launch("eager")
    assert done.returncode == 0, done.stderr
    assert "OK eager: async Work, unused parameters reported" in done.stdout, done.stdout


@needs_mpi
def test_a_rank_that_raises_between_compiled_bucketed_steps_ends_the_job():
    done, seconds = _launch("raise", "30")
    assert done.returncode != 0 and seconds < 120, (done.returncode, seconds)
    # the rank's error comes first, before the traceback MPI's abort may cut short
    assert "rank 1 raised ValueError: rank 1 fails between compiled steps" in done.stderr, \
        done.stderr
    assert "graphc launch: the job on 2 ranks failed" in done.stderr


@needs_mpi
def test_ranks_about_to_run_different_compiled_steps_are_stopped():
    """Two steps whose buckets all go through the shared-memory window: each bucket's wait
    compares the digests the ranks published with it before summing, so the rank running
    the other step is reported (as graphc.distributed's agreement reports it on the MPI
    path), and the job ends."""
    done, seconds = _launch("mismatch", "30")
    assert done.returncode != 0 and seconds < 120, (done.returncode, seconds)
    assert "the ranks are about to run different collectives (this rank, 0" in done.stderr, \
        done.stderr
