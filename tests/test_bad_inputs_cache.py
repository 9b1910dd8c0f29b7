"""Bad inputs: a cache folder and dump folder shared with others. Compiled code is loaded
from the cache and run, so graphc uses only folders and entries of this user's that no one
else can write, never follows a planted link when reading, clearing or dumping, and names
what it refused."""

import os
import stat

import pytest

pytest.importorskip("llvmlite")

from graphc.backends.cache import CacheWarning  # noqa: E402
from graphc.backends.cpu import llvm  # noqa: E402
from graphc.tools.cli import main as cli  # noqa: E402

IR = "define i32 @seven() {\n  ret i32 7\n}\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(root))
    return root


def _entry(root):
    (entry,) = (root / llvm.OBJECT_CACHE.name).glob("*.o")
    return entry


def _seven(library) -> int:
    import ctypes

    return library.ctypes_function("seven", ctypes.c_int32, [])()


def test_the_cache_is_created_private(cache):
    llvm.compile_module(IR, "seven")
    for folder in (cache, cache / llvm.OBJECT_CACHE.name):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_folder_others_can_write_is_not_used(cache):
    folder = cache / llvm.OBJECT_CACHE.name
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    with pytest.warns(CacheWarning, match=rf"not using {folder}: others may write to it"):
        library = llvm.compile_module(IR, "seven")
    assert _seven(library) == 7 and not library.from_cache
    assert list(folder.iterdir()) == []  # nothing written there either


def test_an_entry_others_can_write_is_never_loaded(cache):
    llvm.compile_module(IR, "seven")
    entry = _entry(cache)
    entry.chmod(0o666)
    with pytest.warns(CacheWarning, match="others may write to it"):
        library = llvm.compile_module(IR, "seven")
    assert not library.from_cache and entry.exists()  # not loaded, not deleted


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_an_entry_of_another_user_is_never_loaded(cache):
    llvm.compile_module(IR, "seven")
    entry = _entry(cache)
    os.chown(entry, 12345, 12345)
    with pytest.warns(CacheWarning, match="belongs to user id 12345"):
        library = llvm.compile_module(IR, "seven")
    assert not library.from_cache


def test_a_planted_link_in_place_of_an_entry_is_not_followed(cache, tmp_path):
    good = llvm.compile_module(IR, "seven")
    entry = _entry(cache)
    elsewhere = tmp_path / "elsewhere.o"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    with pytest.warns(CacheWarning, match="symbolic link"):
        library = llvm.compile_module(IR, "seven")
    assert not library.from_cache and _seven(library) == _seven(good)


def test_clear_removes_links_not_their_targets_and_refuses_a_linked_folder(cache, tmp_path,
                                                                          capsys):
    llvm.compile_module(IR, "seven")
    victim = tmp_path / "victim.o"
    victim.write_bytes(b"precious")
    (cache / llvm.OBJECT_CACHE.name / "planted.o").symlink_to(victim)
    assert cli(["cache", "clear"]) == 0
    assert victim.read_bytes() == b"precious"
    assert list((cache / llvm.OBJECT_CACHE.name).iterdir()) == []
    # the whole folder replaced by a link to somewhere else: not cleared at all
    folder = cache / llvm.OBJECT_CACHE.name
    folder.rmdir()
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    (outside / "keep.o").write_bytes(b"keep")
    folder.symlink_to(outside)
    with pytest.warns(CacheWarning, match="symbolic link"):
        assert cli(["cache", "clear"]) == 0
    assert (outside / "keep.o").read_bytes() == b"keep"
    capsys.readouterr()


def test_info_and_clear_cover_every_backend(cache, capsys):
    llvm.compile_module(IR, "seven")
    assert cli(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "llvm-objects" in out and "cuda" in out and "entries: 1" in out


def test_dumps_never_write_through_a_planted_link(tmp_path, monkeypatch):
    import graphc

    dump = tmp_path / "dump"
    dump.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (dump / "double.1.0.traced.gir").symlink_to(victim)
    monkeypatch.setenv("GRAPHC_DUMP", str(dump))
    monkeypatch.setattr("graphc.jit.retrace._dump_counts", {})

    def double(x):
        return x * 2

    graphc.compile(double, backend="interp")(graphc.ones(2))
    written = dump / "double.1.0.traced.gir"
    assert victim.read_text() == "precious"
    assert not written.is_symlink() and "graph @double" in written.read_text()
