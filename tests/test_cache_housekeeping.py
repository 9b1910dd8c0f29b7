"""The disk cache's housekeeping: a size limit with least-recently-used eviction, counts of
hits and misses kept in the cache folder across processes, and `graphc cache info`."""

import os
import subprocess
import sys

import pytest

from graphc import config
from graphc.backends.cache import DiskCache
from graphc.errors import ArgumentError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(root))
    return root


def _aged(cache: DiskCache, key: str, when: float) -> None:
    os.utime(cache.path(key), (when, when))


def test_a_full_cache_evicts_the_least_recently_used_entries(cache_root):
    cache = DiskCache("house-lru", ".bin", max_bytes=3 * 1100)
    for k, key in enumerate("abc"):
        assert cache.write(key, bytes(1000))
        _aged(cache, key, 1_000_000 + k)  # a, then b, then c
    assert cache.read("a") == bytes(1000)  # a is used again: b is now the oldest
    assert cache.write("d", bytes(1000))
    left = sorted(p.name for p in (cache_root / "house-lru").iterdir())
    assert left == ["a.bin", "c.bin", "d.bin"]
    assert cache.stats["evicted"] == 1 and cache.counters()["evicted"] == 1


def test_the_entry_just_written_stays_even_when_alone_it_is_too_big(cache_root):
    cache = DiskCache("house-big", ".bin", max_bytes=10)
    cache.write("small", b"x")
    cache.write("big", bytes(5000))
    assert [p.name for p in (cache_root / "house-big").iterdir()] == ["big.bin"]
    assert cache.read("big") == bytes(5000)


def test_the_limit_comes_from_the_environment(cache_root, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_MAX_BYTES", "2K")
    assert DiskCache("house-env", ".bin").max_bytes == 2048
    monkeypatch.setenv("GRAPHC_CACHE_MAX_BYTES", "1G")
    assert config.cache_max_bytes() == 1 << 30
    monkeypatch.setenv("GRAPHC_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ArgumentError, match="GRAPHC_CACHE_MAX_BYTES.*'lots'"):
        config.cache_max_bytes()
    monkeypatch.delenv("GRAPHC_CACHE_MAX_BYTES")
    assert config.cache_max_bytes() == config.CACHE_MAX_BYTES


def test_other_users_entries_are_neither_counted_nor_evicted(cache_root):
    cache = DiskCache("house-trust", ".bin", max_bytes=100)
    cache.write("mine", bytes(80))
    foreign = cache_root / "house-trust" / "planted.bin"
    foreign.write_bytes(bytes(500))
    foreign.chmod(0o666)  # writable by others: not trusted, so never touched
    cache.write("new", bytes(80))
    assert foreign.exists() and not (cache_root / "house-trust" / "mine.bin").exists()


_COUNTER = """
import sys
from graphc.backends.cache import DiskCache
cache = DiskCache("house-count", ".bin")
for _ in range(int(sys.argv[1])):
    cache.count("hits")
    cache.count("misses")
"""


def test_counts_add_up_across_concurrent_processes(cache_root):
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", _COUNTER, "150"], env=env)
             for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    info = DiskCache("house-count", ".bin").info()
    assert info["total"] == {"hits": 450, "misses": 450, "evicted": 0}
    assert info["hit_rate"] == pytest.approx(0.5)


def test_clear_resets_the_counts(cache_root):
    cache = DiskCache("house-clear", ".bin")
    cache.write("a", b"1")
    cache.count("misses")
    assert cache.read("a") == b"1"
    cache.count("hits")
    assert cache.info()["total"]["hits"] == 1
    assert cache.clear() == 1
    info = cache.info()
    assert info["entries"] == 0 and info["total"]["hits"] == 0 and info["hit_rate"] is None


def test_a_planted_link_in_place_of_the_counts_is_not_followed(cache_root, tmp_path):
    from graphc.backends.cache import CacheWarning

    cache = DiskCache("house-link", ".bin")
    cache.write("a", b"1")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, cache.stats_path)
    with pytest.warns(CacheWarning, match="symbolic link"):
        cache.count("hits")
    assert victim.read_bytes() == b"precious" and cache.stats["hits"] == 1


def test_cache_info_reports_entries_bytes_and_hit_rate(cache_root, capsys):
    pytest.importorskip("llvmlite", reason="the CPU backend's cache needs llvmlite")
    from graphc.backends.cpu import llvm
    from graphc.tools.cli import main as cli

    text = "define i32 @seven() {\n  ret i32 7\n}\n"
    assert not llvm.compile_module(text, "seven").from_cache
    for _ in range(3):
        assert llvm.compile_module(text, "seven").from_cache
    assert cli(["cache", "info"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith(llvm.OBJECT_CACHE.name))
    assert "entries: 1" in line and "hit rate: 75.0% (3 hits, 1 misses, 0 evicted)" in line
