"""benchmarks/lenet_kernels.py: its "before" settings name module attributes that exist (a
renamed switch would leave the A/B comparing the code with itself), and the kernel table
runs, its two variants' outputs equal."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("llvmlite", reason="the CPU backend generates code with llvmlite")

from benchmarks import lenet_kernels  # noqa: E402


def test_variant_settings_exist():
    for name, settings in lenet_kernels.VARIANTS.items():
        for module, attr in settings:
            assert hasattr(importlib.import_module(module), attr), (name, module, attr)


def test_kernel_table_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lenet_kernels, "POOLS", ((2, 3, 8, 8),))
    lenet_kernels._kernels(1, str(tmp_path))
    out = capsys.readouterr().out
    assert out.count("outputs equal") == 2 and "DIFFER" not in out


def test_rounds_must_be_positive():
    with pytest.raises(SystemExit):
        lenet_kernels.main(["--rounds", "0"])
