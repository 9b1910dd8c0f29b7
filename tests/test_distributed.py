"""graphc.distributed on 2 MPI ranks: collectives, DDP equivalent to one process at twice
the batch, shape mismatches reported, and a failing or vanishing rank ends the job quickly.
Each case runs tests/distributed/worker.py under `graphc launch -n 2`."""

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("mpi4py", reason="the distributed extra (mpi4py, mpich) is not installed")

from graphc.tools.launch import find_mpiexec  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "distributed", "worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if find_mpiexec() is None:
    pytest.skip("no mpiexec next to the interpreter or on PATH", allow_module_level=True)


def _launch(mode: str, *extra: str, env=None):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "graphc.tools.cli", "launch", "-n", "2",
                           WORKER, mode, *extra], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env={**os.environ, **(env or {})})
    return done, time.monotonic() - started


def test_collectives_give_torch_distributed_results():
    done, _ = _launch("collectives")
    assert done.returncode == 0, done.stderr
    assert "OK collectives" in done.stdout


def test_ddp_on_two_ranks_equals_one_process_at_twice_the_batch():
    """MLP and LeNet-5-style nets, SGD (momentum) and Adam, 10 steps, DistributedSampler."""
    done, _ = _launch("equivalence")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("parameters") == 4, done.stdout


def test_compiled_ddp_steps_carry_the_allreduce_and_equal_one_process():
    """The same, compiled: interp (MPI through mpi4py) and cpu (MPI_Allreduce called by the
    generated code), one graph per step on cpu, the averaging a node of it."""
    done, _ = _launch("compiled")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("/cpu parameters") == 4 and done.stdout.count("/interp") == 4


def test_bucket_view_ddp_steps_equal_one_process():
    """The same with gradient_as_bucket_view=True, eager and compiled on cpu (the window's
    in-place average): within 1e-6 of one process at twice the batch."""
    done, _ = _launch("views")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("/eager/view parameters") == 4, done.stdout
    assert done.stdout.count("/cpu/view parameters") == 4, done.stdout


def test_mismatched_shapes_are_reported_before_data_moves():
    done, _ = _launch("mismatch")
    assert done.returncode == 0, done.stderr
    assert "OK mismatch reported" in done.stdout


def test_a_rank_that_raises_ends_the_job_with_its_error():
    done, seconds = _launch("raise", "30")
    assert done.returncode != 0 and seconds < 60
    # the failing rank's error comes first, before the traceback MPI's abort may cut short
    assert "rank 1 raised ValueError: rank 1 fails mid-step" in done.stderr, done.stderr
    assert "graphc launch: the job on 2 ranks failed" in done.stderr


def test_a_rank_that_dies_ends_the_job_within_bounds():
    done, seconds = _launch("exit", "30", env={"GRAPHC_TEST_EXIT": "3"})
    # the code is the dead rank's (3), or the signal MPI stopped the other with (9)
    assert done.returncode in (3, 9) and seconds < 60
    assert f"graphc launch: the job on 2 ranks failed (exit code {done.returncode})" \
        in done.stderr


def test_the_ddp_example_trains_on_two_ranks():
    """examples/ddp_digits.py, compiled: the digits CNN learns on 2 ranks."""
    example = os.path.join(ROOT, "examples", "ddp_digits.py")
    done = subprocess.run([sys.executable, "-m", "graphc.tools.cli", "launch", "-n", "2",
                           example, "--epochs", "2", "--compile"], capture_output=True,
                          text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("epoch 2:") and float(last.split()[-1].rstrip("%")) > 50.0
