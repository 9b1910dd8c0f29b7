"""Every docstring example in the graphc package runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import graphc

MODULES = sorted(m.name for m in pkgutil.walk_packages(graphc.__path__, "graphc.")
                 if not m.name.endswith("__main__"))


# optional extras: their modules' examples run where the extra is installed
EXTRAS = {"graphc.onnx": ("onnx", "[onnx]"), "graphc.distributed": ("mpi4py", "[distributed]")}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    for prefix, (package, extra) in EXTRAS.items():
        if name.startswith(prefix):
            pytest.importorskip(package, reason=f"{name} needs the {extra} extra")
    module = importlib.import_module(name)
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(module, optionflags=flags, verbose=False,
                             extraglobs={"graphc": graphc})
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
