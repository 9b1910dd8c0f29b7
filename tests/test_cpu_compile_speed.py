"""How the CPU backend compiles quickly: identical kernels are compiled once
(graphc.backends.cpu.module_text), and a large module is compiled in parts in worker
processes (graphc.backends.cpu.workers) whose objects load into one engine. Behaviour only:
the timings are benchmarks (benchmarks/model_compile.py, benchmarks/compile_time.py)."""

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import graphc  # noqa: E402
from graphc.backends.cpu import llvm, module_text, workers  # noqa: E402

KERNEL = '''define void @"{name}.range"(ptr noalias %".1", i64 %".2", i64 %".3") noinline nounwind
{{
entry:
  %".5" = getelementptr inbounds i64, ptr @"{name}_table", i64 %".2"
  %".6" = load i64, ptr %".5"
  %".7" = add i64 %".6", {add}
  store i64 %".7", ptr %".1"
  ret void
}}
define void @"{name}"(ptr %".1") noinline nounwind
{{
entry:
  call void @"{name}.range"(ptr %".1", i64 1, i64 2)
  ret void
}}
@"{name}_table" = internal constant [3 x i64] [i64 1, i64 {entry}, i64 0]
'''


def _module(kernels) -> str:
    """A module of kernels (name, add, entry) and a driver `run(ptr out)` calling each on
    out[k]."""
    text = "".join(KERNEL.format(name=n, add=a, entry=e) for n, a, e in kernels)
    calls = "".join(f'  %"p{k}" = getelementptr i64, ptr %".1", i64 {k}\n'
                    f'  call void @"{n}"(ptr %"p{k}")\n' for k, (n, _, _) in enumerate(kernels))
    return text + f'define i32 @"run"(ptr %".1")\n{{\nentry:\n{calls}  ret i32 0\n}}\n'


def _run(library, n: int) -> list[int]:
    out = (ctypes.c_int64 * n)()
    library.ctypes_function("run", ctypes.c_int32, [ctypes.c_void_p])(out)
    return list(out)


KERNELS = [("k1_fused", 1, 10), ("k2_fused", 1, 10), ("k3_fused", 2, 10), ("k4_fused", 1, 10),
           ("k5_fused", 1, 11)]
EXPECTED = [11, 11, 12, 11, 12]


def test_identical_kernels_are_kept_once_with_their_helpers_and_tables():
    module = module_text.parse(_module(KERNELS))
    small, renames = module_text.dedupe(module)
    # k2 and k4 are k1 (with their .range and table); k3 adds 2 (its table is k1's),
    # k5 reads another table
    assert renames == {"k2_fused.range": "k1_fused.range", "k2_fused": "k1_fused",
                       "k2_fused_table": "k1_fused_table", "k3_fused_table": "k1_fused_table",
                       "k4_fused.range": "k1_fused.range", "k4_fused": "k1_fused",
                       "k4_fused_table": "k1_fused_table"}
    assert 'call void @"k1_fused"' in small.symbols["run"].text
    assert "k2_fused" not in str(small) and "k4_fused" not in str(small)
    library = llvm.compile_module(_module(KERNELS), "dedupe", use_cache=False)
    assert _run(library, 5) == EXPECTED
    assert library.address("k4_fused") == library.address("k1_fused")  # an alias


def test_text_it_cannot_read_is_compiled_as_it_is():
    text = 'define i32 @"seven"() {\n  ret i32 7\n}\nsomething odd\n'
    with pytest.raises(ValueError, match="unexpected top-level text"):
        module_text.parse(text)
    assert llvm.deduplicated(text)[1:] == (None, {})


def test_split_parts_define_every_symbol_once_and_link_into_one_program(monkeypatch):
    module, _ = module_text.dedupe(module_text.parse(_module(KERNELS)))
    parts = module_text.split(module, 3)
    assert len(parts) == 3
    defined = [line for part in parts for line in part.splitlines()
               if line.startswith("define")]
    assert len(defined) == len(set(defined)) == 7  # 3 kernels x (kernel, .range) + run
    # the internal table is copied where it is read; a kernel in another part is declared
    assert sum('_table" = internal' in part for part in parts) >= 1
    monkeypatch.setattr(workers, "PARALLEL_MIN_CHARS", 0)
    monkeypatch.setenv("GRAPHC_COMPILE_WORKERS", "2")
    monkeypatch.setattr(workers, "processes", lambda: 2)
    library = llvm.compile_module(_module(KERNELS), "split", use_cache=False)
    assert library.parts > 1 and _run(library, 5) == EXPECTED


def test_a_split_module_is_cached_as_one_entry_and_loads_from_it(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(workers, "PARALLEL_MIN_CHARS", 0)
    monkeypatch.setattr(workers, "processes", lambda: 2)
    first = llvm.compile_module(_module(KERNELS), "cached")
    second = llvm.compile_module(_module(KERNELS), "cached")
    assert not first.from_cache and second.from_cache and second.parts == first.parts > 1
    assert _run(second, 5) == EXPECTED
    assert len(list((tmp_path / llvm.OBJECT_CACHE.name).glob("*.o"))) == 1


def test_a_worker_that_dies_hands_its_part_back(monkeypatch):
    (worker,) = workers.start(1)
    worker.kill()
    worker.wait()
    monkeypatch.setattr(workers, "start", lambda n=None: [worker])
    parts = module_text.split(module_text.parse(_module(KERNELS)), 3)
    objects = workers.split_compile(parts, "dead", 3, 1)
    assert objects is not None and all(o[:4] == b"\x7fELF" for o in objects)


def test_a_part_llvm_refuses_makes_split_compile_give_up():
    good = _module(KERNELS[:1])
    assert workers.split_compile([good, "define i32 @bad( {"], "bad", 3, 1) is None


def test_a_corrupt_object_bundle_is_refused():
    code = llvm.compile_module(_module(KERNELS[:1]), "one", use_cache=False)._objects
    payload = llvm.pack_objects(code)
    assert llvm.unpack_objects(payload) == code
    for bad in (payload[:-1], b"GCPARTS1" + payload[8:12] + b"\xff" * 8, b"\x7fELF"):
        with pytest.raises(ValueError):
            llvm.unpack_objects(bad)


def test_a_model_with_repeated_layers_compiles_each_kernel_once_and_agrees(monkeypatch):
    from graphc import nn
    from graphc.backends.cpu import kernels
    from graphc.backends.cpu.executable import CpuExecutable

    graphc.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(32, 32), nn.ReLU())])
    compiled = graphc.compile(model, backend="cpu")
    x = graphc.randn(4, 32)
    out = compiled(x)
    executable = compiled.executable
    names = executable.lowered.kernels  # the six layers call the kernels built once
    assert len(set(names)) < len(names)
    monkeypatch.setattr(kernels, "SHARE_KERNELS", False)  # built per layer: merged as text
    unshared = CpuExecutable(executable.graph)
    assert len(set(unshared.lowered.kernels)) == len(unshared.lowered.kernels)
    assert len(unshared.library.aliases) > 0
    assert len(unshared.library.symbols) < len(unshared.lowered.kernels)
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-5,
                               atol=1e-5)


def test_compile_workers_setting(monkeypatch):
    from graphc import config
    from graphc.errors import ArgumentError

    monkeypatch.setenv("GRAPHC_COMPILE_WORKERS", "1")
    assert workers.processes() == 1
    monkeypatch.setenv("GRAPHC_COMPILE_WORKERS", "zero")
    with pytest.raises(ArgumentError, match="GRAPHC_COMPILE_WORKERS"):
        config.compile_workers()


def test_threads_compiling_split_modules_at_once_share_the_workers(monkeypatch):
    import threading

    monkeypatch.setattr(workers, "PARALLEL_MIN_CHARS", 0)
    monkeypatch.setattr(workers, "processes", lambda: 2)
    results = {}

    def compile_one(k: int) -> None:
        kernels = [(f"t{k}_{n}", a + k, e) for n, a, e in KERNELS]
        library = llvm.compile_module(_module(kernels), f"thread{k}", use_cache=False)
        results[k] = (library.parts, _run(library, 5))

    threads = [threading.Thread(target=compile_one, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {k: r[1] for k, r in results.items()} == {
        k: [v + k for v in EXPECTED] for k in range(3)}
    assert all(parts > 1 for parts, _ in results.values())


def test_dumps_hold_the_generated_and_the_deduplicated_text(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_DUMP", f"llvm,{tmp_path / 'dump'}")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    library = llvm.compile_module(_module(KERNELS), "dumped")
    stem = f"dumped.{library.key[:12]}"
    assert (tmp_path / "dump" / f"{stem}.ll").read_text() == _module(KERNELS)
    deduplicated = (tmp_path / "dump" / f"{stem}.dedup.ll").read_text()
    assert "k2_fused" not in deduplicated and "k1_fused" in deduplicated


def test_every_module_is_compiled_at_one_level_and_the_level_is_in_the_key():
    """One pipeline whatever the module's size (a kernel must round the same in every
    module: tests/test_cpu_kernel_rounding.py); another level is another cache entry."""
    text = _module(KERNELS)
    library = llvm.compile_module(text, "one_level", use_cache=False)
    assert library.level == llvm.OPT_LEVEL == 2
    assert llvm.pipeline_level(text) == llvm.pipeline_level(text * 100) == llvm.OPT_LEVEL
    o3 = llvm.compile_module(text, "o3", use_cache=False, level=3)
    assert o3.level == 3 and o3.key != library.key
    assert _run(o3, 5) == _run(library, 5) == EXPECTED and "define" in o3.ir


def test_variables_are_never_merged_nor_copied_into_parts():
    text = ('@"a" = internal global i64 0\n@"b" = internal global i64 0\n'
            '@"c" = internal constant i64 0\n@"d" = internal constant i64 0\n'
            'define i64 @"f"() {\n  %".1" = load i64, ptr @"a"\n  ret i64 %".1"\n}\n'
            'define i64 @"g"() {\n  %".1" = load i64, ptr @"b"\n  ret i64 %".1"\n}\n')
    module = module_text.parse(text)
    small, renames = module_text.dedupe(module)
    assert renames == {"d": "c"}  # f and g differ: they read two variables
    assert module_text.split(small, 2) == [str(small)]
