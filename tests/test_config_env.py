"""graphc.config reads its environment variables at use: a variable set, changed or removed
while the process runs (monkeypatch.setenv, os.environ) is seen by the next read, also by
`check_nans`, which reads the dict behind os.environ (no KeyError raised when unset) and falls
back to `os.environ.get` where that dict is missing."""

from __future__ import annotations

import os

import pytest

from graphc import config


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), (" 0", True), ("0", False),
                                       ("", False)])
def test_check_nans_follows_the_value_set_at_run_time(monkeypatch, value, on):
    monkeypatch.delenv("GRAPHC_CHECK_NANS", raising=False)
    assert config.check_nans() is False
    monkeypatch.setenv("GRAPHC_CHECK_NANS", value)
    assert config.check_nans() is on
    os.environ["GRAPHC_CHECK_NANS"] = "1"
    assert config.check_nans() is True
    del os.environ["GRAPHC_CHECK_NANS"]
    assert config.check_nans() is False


def test_check_nans_without_the_dict_behind_os_environ(monkeypatch):
    """Another Python's os.environ (no `_data` dict): `os.environ.get` decides."""
    monkeypatch.setattr(os, "environ", {"GRAPHC_CHECK_NANS": "1"})
    assert config.check_nans() is True
    os.environ["GRAPHC_CHECK_NANS"] = "0"
    assert config.check_nans() is False
    del os.environ["GRAPHC_CHECK_NANS"]
    assert config.check_nans() is False


def test_check_nans_sees_a_replaced_os_environ(monkeypatch):
    monkeypatch.delenv("GRAPHC_CHECK_NANS", raising=False)
    replaced = os._Environ(dict(os.environ._data), os.environ.encodekey,
                           os.environ.decodekey, os.environ.encodevalue,
                           os.environ.decodevalue)
    monkeypatch.setattr(os, "environ", replaced)
    assert config.check_nans() is False
    replaced["GRAPHC_CHECK_NANS"] = "1"
    assert config.check_nans() is True
