"""DistributedDataParallel(gradient_as_bucket_view=True) on 2 MPI ranks, eager and compiled
(cpu, through the node's shared-memory window): the same parameters, losses, `.grad`s and
state_dict as the default, bit for bit; `.grad`s that are views of the bucket memory and
that the next step overwrites; zero_grad in both forms; gradients accumulated over steps;
views copied out of the window when the group is destroyed. Each case runs
tests/distributed/bucket_view.py under `graphc launch -n 2`; the pass's handling of the
attribute is tested on IR text here, on one process."""

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
WORKER = os.path.join(ROOT, "tests", "distributed", "bucket_view.py")


def test_view_and_plain_all_reduces_make_separate_buckets():
    g = bucket_allreduce(parse('''graph @g(%a: f32[4], %b: f32[4], %c: f32[4])
                                               -> (f32[4], f32[4], f32[4]) {
      %0: f32[4] = all_reduce[op="avg", bucket_view=true](%a)   # m.py:1
      %1: f32[4] = all_reduce[op="avg"](%b)                     # m.py:2
      %2: f32[4] = all_reduce[op="avg", bucket_view=true](%c)   # m.py:3
      return (%0, %1, %2)
    }'''))
    verify(g)
    starts = [n for n in g.nodes if n.op == "all_reduce_start"]
    assert [([v.name for v in n.inputs], n.attrs.get("bucket_view")) for n in starts] == [
        (["a", "c"], True), (["b"], None)], format_graph(g)
    text = format_graph(g)
    assert format_graph(parse(text)) == text


pytest.importorskip("mpi4py", reason="the distributed extra (mpi4py, mpich) is not installed")

from graphc.tools.launch import find_mpiexec  # noqa: E402

needs_mpi = pytest.mark.skipif(find_mpiexec() is None,
                               reason="no mpiexec next to the interpreter or on PATH")


def _launch(mode: str, *extra: str):
    return subprocess.run([sys.executable, "-m", "graphc.tools.cli", "launch", "-n", "2",
                           WORKER, mode, *extra], capture_output=True, text=True, timeout=400,
                          cwd=ROOT)


@needs_mpi
def test_bucket_views_give_the_default_values_and_are_overwritten_by_the_next_step():
    """MLP and LeNet, SGD and Adam, compiled and eager: bit for bit the default's values;
    every `.grad` lies in the bucket memory (the window, compiled: each wait fused with its
    update averages in place) and a `.grad` kept from one step changes with the next."""
    done = _launch("values")
    assert done.returncode == 0, done.stderr
    assert "OK values: 8 view steps equal the default ones bit for bit" in done.stdout, \
        done.stdout
    assert "; 16 fused in-place waits" in done.stdout, done.stdout


@needs_mpi
def test_zero_grad_zeroes_the_views_in_place_or_drops_them():
    done = _launch("zero_grad")
    assert done.returncode == 0, done.stderr
    assert "OK zero_grad: set_to_none=False zeroes the views in place" in done.stdout, \
        done.stdout


@needs_mpi
def test_gradients_accumulated_over_steps_equal_the_default():
    done = _launch("accumulate")
    assert done.returncode == 0, done.stderr
    assert "OK accumulate" in done.stdout, done.stdout


@needs_mpi
def test_views_are_copied_out_of_the_window_when_the_group_is_destroyed():
    done = _launch("outlive")
    assert done.returncode == 0, done.stderr
    assert "OK outlive" in done.stdout, done.stdout


@needs_mpi
def test_buckets_of_several_gradients_and_two_models_keep_their_views():
    done = _launch("shared")
    assert done.returncode == 0, done.stderr
    assert "OK shared" in done.stdout, done.stdout


@needs_mpi
def test_without_the_window_the_keyword_changes_no_value():
    done = _launch("values-mpi")
    assert done.returncode == 0, done.stderr
    assert "OK values-mpi" in done.stdout, done.stdout


@needs_mpi
def test_ranks_whose_window_regions_differ_fail_instead_of_summing_other_bytes():
    """The view regions' offsets are part of each bucket's digest: a rank that reserved
    other offsets is reported at the first meeting, and the job ends."""
    started = time.monotonic()
    done = _launch("misplaced", "30")
    assert done.returncode != 0 and time.monotonic() - started < 120, done.returncode
    assert "the ranks are about to run different collectives" in done.stderr, done.stderr
    assert "not detected" not in done.stdout
