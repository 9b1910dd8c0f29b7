"""graphc.backends.cpu.llvm: compile LLVM IR text, call it, and the on-disk object cache."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import uuid
import weakref

import numpy as np
import pytest

pytest.importorskip("llvmlite", reason="the CPU backend needs llvmlite")

from graphc import config  # noqa: E402
from graphc.backends.cache import pack_entry  # noqa: E402
from graphc.backends.cpu import llvm  # noqa: E402
from graphc.errors import GraphcError  # noqa: E402

ADD = """
define float @add(float %a, float %b) {
  %c = fadd float %a, %b
  ret float %c
}
"""

# y[i] += SCALE * x[i]; a plain loop that O3 must vectorise.
AXPY = """
define void @axpy(ptr noalias %x, ptr noalias %y, i64 %n) {
entry:
  %nonempty = icmp sgt i64 %n, 0
  br i1 %nonempty, label %loop, label %exit
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %vx = load float, ptr %px
  %vy = load float, ptr %py
  %ax = fmul float %vx, SCALE
  %s = fadd float %ax, %vy
  store float %s, ptr %py
  %next = add i64 %i, 1
  %more = icmp slt i64 %next, %n
  br i1 %more, label %loop, label %exit
exit:
  ret void
}
"""

AXPY_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]


def axpy_ir(scale: float = 2.5) -> str:
    return AXPY.replace("SCALE", f"{scale:.6e}")


def entry_path(ir_text: str) -> str:
    return os.path.join(llvm.cache_info()["path"], llvm.cache_key(ir_text) + ".o")


def counts() -> tuple[int, int, int]:
    info = llvm.cache_info()
    return info["hits"], info["misses"], info["corrupt"]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))


def run_axpy(lib: llvm.Library, rng, n: int = 1003) -> None:
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    expected = np.float32(2.5) * x + y
    axpy = lib.ctypes_function("axpy", None, AXPY_ARGTYPES)
    axpy(x.ctypes.data, y.ctypes.data, n)
    np.testing.assert_array_equal(y, expected)


def test_scalar_function_matches_numpy():
    add = llvm.compile_module(ADD, "add").ctypes_function(
        "add", ctypes.c_float, [ctypes.c_float, ctypes.c_float])
    assert add(1.5, 2.25) == 3.75
    a, b = np.float32(0.1), np.float32(0.7)
    assert np.float32(add(a, b)) == a + b


def test_loop_matches_numpy(rng):
    lib = llvm.compile_module(axpy_ir(), "axpy")
    run_axpy(lib, rng)  # 1003: a vector body and a remainder
    run_axpy(lib, rng, n=0)


def test_loop_is_vectorised_at_host_width():
    lib = llvm.compile_module(axpy_ir(), "axpy")
    host = llvm.host_target()
    # On AVX-512 hosts LLVM picks the vector width by its tuning for the CPU: 512-bit (zmm)
    # on AMD Zen 4, 256-bit (ymm) on Intel's AVX-512 cores (its prefer-256-bit tuning).
    registers = (("zmm", "ymm") if host.has_feature("avx512f") else
                 ("ymm",) if host.has_feature("avx") else ("xmm",))
    assert any(f"%{r}" in lib.asm for r in registers), (host.cpu, registers)
    assert "x float>" in lib.ir  # a vector type survived O3
    assert "axpy:" in lib.asm


def test_second_compile_is_a_faster_cache_hit(rng):
    ir_text = axpy_ir(3.5) + ADD
    hits, misses, _ = counts()
    cold = llvm.compile_module(ir_text, "cold")
    warm = llvm.compile_module(ir_text, "warm")
    assert (not cold.from_cache, warm.from_cache) == (True, True)
    assert counts()[:2] == (hits + 1, misses + 1)
    assert warm.compile_seconds < cold.compile_seconds
    assert warm.symbols == cold.symbols == {"axpy", "add"}
    x, y = np.ones(40, np.float32), np.zeros(40, np.float32)
    warm.ctypes_function("axpy", None, AXPY_ARGTYPES)(x.ctypes.data, y.ctypes.data, 40)
    np.testing.assert_array_equal(y, np.full(40, 3.5, np.float32))
    info = llvm.cache_info()
    assert info["entries"] == 1 and info["bytes"] > 0
    assert info["path"].startswith(config.cache_dir())


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


def _not_an_object(data: bytes) -> bytes:
    # A well-formed entry (length and checksum right) whose payload LLVM would choke on.
    payload = b"\x7fELF\x02\x01" + b"\xff" * 200
    return pack_entry(payload)


def _empty(data: bytes) -> bytes:
    return b""


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte, _not_an_object, _empty])
def test_damaged_entry_is_rebuilt(damage, rng):
    ir_text = axpy_ir()
    llvm.compile_module(ir_text, "axpy")
    path = entry_path(ir_text)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    corrupt = counts()[2]
    rebuilt = llvm.compile_module(ir_text, "axpy")
    assert not rebuilt.from_cache and counts()[2] == corrupt + 1
    run_axpy(rebuilt, rng)
    with open(path, "rb") as f:
        assert f.read() == data  # rewritten whole
    assert llvm.compile_module(ir_text, "axpy").from_cache


def test_cache_clear_empties():
    llvm.compile_module(ADD, "add")
    llvm.compile_module(axpy_ir(), "axpy")
    assert llvm.cache_info()["entries"] == 2
    assert llvm.cache_clear() == 2
    info = llvm.cache_info()
    assert (info["entries"], info["bytes"]) == (0, 0)
    assert not llvm.compile_module(ADD, "add").from_cache


def test_concurrent_compiles_of_one_key(rng):
    ir_text = axpy_ir(-1.25)
    barrier = threading.Barrier(2)
    results, errors = [], []

    def compile_it():
        barrier.wait()
        try:
            results.append(llvm.compile_module(ir_text, "shared"))
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    hits, misses, _ = counts()
    threads = [threading.Thread(target=compile_it) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 2
    assert counts()[:2] == (hits + 1, misses + 1)  # compiled once, loaded once
    assert sorted(lib.from_cache for lib in results) == [False, True]
    assert llvm.cache_info()["entries"] == 1
    for lib in results:
        x = rng.standard_normal(64).astype(np.float32)
        y = np.zeros(64, np.float32)
        lib.ctypes_function("axpy", None, AXPY_ARGTYPES)(x.ctypes.data, y.ctypes.data, 64)
        np.testing.assert_array_equal(y, np.float32(-1.25) * x)


@pytest.mark.parametrize("ir_text, llvm_says", [
    ("define float @f(float %a {\n  ret float %a\n}\n", "expected ')' at end of argument list"),
    ("define i32 @f() {\n  ret i64 0\n}\n", "value doesn't match function result type"),
])
def test_malformed_ir_names_module_and_llvm_message(ir_text, llvm_says):
    with pytest.raises(GraphcError) as info:
        llvm.compile_module(ir_text, "broken_kernel")
    assert "'broken_kernel'" in str(info.value) and llvm_says in str(info.value)
    assert llvm.cache_info()["entries"] == 0


def test_unresolved_symbol_is_an_error_then_register_symbol_resolves_it():
    # Registration is process-wide and permanent: a fresh name keeps reruns independent.
    symbol = f"graphc_test_triple_{uuid.uuid4().hex}"
    ir_text = (f"declare i64 @{symbol}(i64)\n"
               "define i64 @call_it(i64 %x) {\n"
               f"  %y = call i64 @{symbol}(i64 %x)\n  ret i64 %y\n}}\n")
    with pytest.raises(GraphcError, match=f"{symbol}.*register_symbol"):
        llvm.compile_module(ir_text, "needs_symbol")
    # _TRIPLE is module-level: the address must stay valid for the rest of the process.
    llvm.register_symbol(symbol, ctypes.cast(_TRIPLE, ctypes.c_void_p).value)
    lib = llvm.compile_module(ir_text, "needs_symbol")  # a cache hit: the object was fine
    assert lib.from_cache
    assert lib.ctypes_function("call_it", ctypes.c_int64, [ctypes.c_int64])(14) == 42


_TRIPLE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lambda x: 3 * x)


def test_openmp_runtime_resolves_when_present():
    if llvm.load_openmp() is None:
        pytest.skip("libgomp is not installed on this machine")
    ir_text = ("declare i32 @omp_get_max_threads()\n"
               "define i32 @threads() {\n"
               "  %n = call i32 @omp_get_max_threads()\n  ret i32 %n\n}\n")
    lib = llvm.compile_module(ir_text, "omp")
    assert lib.ctypes_function("threads", ctypes.c_int32, [])() >= 1


def test_function_keeps_its_library_alive_and_then_lets_it_go():
    lib = llvm.compile_module(ADD, "add")
    alive = weakref.ref(lib)
    add = lib.ctypes_function("add", ctypes.c_float, [ctypes.c_float, ctypes.c_float])
    del lib
    gc.collect()
    assert alive() is not None and add(2.0, 0.5) == 2.5
    del add
    gc.collect()
    assert alive() is None  # engine and code freed without a crash


def test_unknown_symbol_is_a_clear_error():
    lib = llvm.compile_module(ADD, "add")
    with pytest.raises(GraphcError, match="'add' defines no symbol 'sub'"):
        lib.address("sub")


def test_unwritable_cache_only_costs_speed(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(blocker))
    lib = llvm.compile_module(ADD, "add")
    assert lib.ctypes_function("add", ctypes.c_float, [ctypes.c_float] * 2)(1, 2) == 3
    assert llvm.cache_info()["entries"] == 0


def test_cache_key_depends_on_text_and_host():
    key = llvm.cache_key(ADD)
    assert key == llvm.cache_key(ADD) != llvm.cache_key(ADD + "\n")
    assert len(key) == 64


def test_cache_dir_default_honours_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("GRAPHC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.cache_dir() == str(tmp_path / "xdg" / "graphc")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.cache_dir() == str(tmp_path / "home" / ".cache" / "graphc")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "mine"))
    assert config.cache_dir() == str(tmp_path / "mine")


@pytest.mark.parametrize("setting, files", [
    ("llvm,asm,{dir}", (".ll", ".opt.ll", ".s")),
    ("asm,{dir}", (".s",)),
    ("{dir}", ()),  # a directory alone dumps the graph IR only
])
def test_graphc_dump_writes_llvm_ir_and_assembly(setting, files, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_DUMP", setting.format(dir=tmp_path / "dump"))
    lib = llvm.compile_module(axpy_ir(3.0), "axpy")
    written = sorted(p.name for p in (tmp_path / "dump").glob("*")) \
        if (tmp_path / "dump").exists() else []
    stem = f"axpy.{lib.key[:12]}"
    assert written == sorted(stem + s for s in files)
    if ".s" in files:
        assert "ymm" in (tmp_path / "dump" / f"{stem}.s").read_text()  # vectorised (AVX2+)
    if ".ll" in files:
        assert (tmp_path / "dump" / f"{stem}.ll").read_text() == axpy_ir(3.0)
        assert "<8 x float>" in (tmp_path / "dump" / f"{stem}.opt.ll").read_text()


def test_graphc_dump_topics_and_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_DUMP", "llvm")
    assert config.dumps("llvm") and not config.dumps("ir") and not config.dumps("asm")
    assert config.dump_dir() == os.path.join(os.getcwd(), "graphc-dump")
    monkeypatch.setenv("GRAPHC_DUMP", f"all,{tmp_path}")
    assert all(config.dumps(t) for t in config.DUMP_TOPICS) and config.dump_dir() == str(tmp_path)
    monkeypatch.setenv("GRAPHC_DUMP", str(tmp_path))
    assert config.dumps("ir") and not config.dumps("llvm")
    monkeypatch.delenv("GRAPHC_DUMP")
    assert config.dump_dir() is None and not config.dumps("ir")
