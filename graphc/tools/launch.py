"""`graphc launch -n N script.py [args...]`: run a script on N ranks with the installed MPI.

It runs `mpiexec -n N <this python> script.py args...` with the mpiexec of the MPI that
mpi4py was installed with (the `mpich` wheel puts it next to the interpreter), so the ranks
use the same Python and MPI. `mpirun -n N python script.py` works as well. When a rank
fails, MPI stops the others; `graphc launch` then says so in one line and exits with the
failing code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

__all__ = ["add_parser", "find_mpiexec", "launch"]


def find_mpiexec() -> str | None:
    """The mpiexec beside this interpreter (pip's mpich), else the first on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun")


def launch(ranks: int, script: str, args: list[str]) -> int:
    if ranks < 1:
        print(f"graphc launch: -n must be at least 1, got {ranks}", file=sys.stderr)
        return 2
    if not os.path.isfile(script):
        print(f"graphc launch: {script}: no such file", file=sys.stderr)
        return 2
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("graphc launch: no mpiexec found; install the MPI extra: pip install "
              "'graphc[distributed]'", file=sys.stderr)
        return 2
    command = [mpiexec, "-n", str(ranks), sys.executable, script, *args]
    code = subprocess.call(command)
    if code:
        print(f"graphc launch: the job on {ranks} ranks failed (exit code {code}); MPI stopped "
              "the other ranks; the failing rank's error is above", file=sys.stderr)
    return code


def add_parser(sub) -> None:
    """The `launch` subcommand of the graphc command line."""
    parser = sub.add_parser("launch", help="run a script on N MPI ranks (data-parallel "
                                           "training)")
    parser.add_argument("-n", "--nproc", type=int, default=2, help="number of ranks")
    parser.add_argument("script")
    parser.add_argument("args", nargs="...", help="arguments for the script")
    parser.set_defaults(run=lambda a: launch(a.nproc, a.script, a.args))
