"""The layering of graphc: import-linter's contracts (pyproject.toml), what `import graphc` loads.

Dependencies point one way: tools and testing, then jit, the front end, backends, passes, ir,
ops and the base modules (ARCHITECTURE.md). `lint-imports` checks every import of the package
against the contracts in pyproject.toml's `[tool.importlinter]`; a broken contract fails here
with import-linter's report, which names each offending import and its line. The few
imports that break a contract today are listed there under `ignore_imports`, each with why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = shutil.which("lint-imports")
needs_import_linter = pytest.mark.skipif(
    LINT_IMPORTS is None, reason="lint-imports is not installed (pip install -e '.[test]')")


def _lint_imports(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LINT_IMPORTS, "--no-cache", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@needs_import_linter
def test_every_import_linter_contract_is_kept():
    done = _lint_imports()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@needs_import_linter
def test_a_broken_contract_fails(tmp_path):
    """The check above can fail: an upward import (ir imports ops) breaks this contract."""
    config = tmp_path / "upward.toml"
    config.write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_package = "graphc"

        [[tool.importlinter.contracts]]
        name = "ops above ir (wrong on purpose)"
        type = "layers"
        layers = ["graphc.ops", "graphc.ir"]
        """))
    done = _lint_imports("--config", str(config))
    assert done.returncode != 0
    assert "graphc.ir is not allowed to import graphc.ops" in done.stdout


# what `import graphc` must not load: the native backends and their libraries (llvmlite, the
# CUDA runtime, MPI), and the optional packages only a tool or an interop path needs
NOT_LOADED = ("llvmlite", "mpi4py", "graphc.backends.cpu", "graphc.backends.cuda", "torch",
              "sklearn", "matplotlib", "tqdm", "graphc.tools", "graphc.testing")


def test_importing_graphc_loads_no_backend_library():
    code = textwrap.dedent(f"""\
        import sys
        import graphc
        x = graphc.tensor([1.0, 2.0], requires_grad=True)
        (x * 3).sum().backward()
        prefixes = {NOT_LOADED!r}
        print(sorted(m for m in sys.modules
                     if any(m == p or m.startswith(p + ".") for p in prefixes)))
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing graphc loaded {done.stdout.strip()}"
