"""Every docstring example in the graphc package runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import graphc

MODULES = sorted(m.name for m in pkgutil.walk_packages(graphc.__path__, "graphc.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    result = doctest.testmod(module, optionflags=flags, verbose=False,
                             extraglobs={"graphc": graphc})
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
