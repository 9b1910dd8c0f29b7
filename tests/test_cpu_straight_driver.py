"""A large loop-free function (the CPU backend's driver: one call per kernel) is compiled as
a part of its own at O1 with fast code generation (graphc.backends.cpu.llvm
.straight_functions, llvm_worker.FAST_CODEGEN); kernels with loops keep the full pipeline.
Behaviour only: the time saved is a benchmark (benchmarks/model_compile.py)."""

import ctypes

import pytest

pytest.importorskip("llvmlite")

from graphc.backends.cpu import llvm, llvm_worker, module_text, workers  # noqa: E402

# out[0] = sum of i for i < n, in a loop
LOOP = '''define void @"k_loop"(ptr %".1", i64 %".2") noinline nounwind
{
entry:
  br label %"head"
head:
  %"i" = phi i64 [0, %"entry"], [%"i.next", %"head"]
  %"acc" = phi i64 [0, %"entry"], [%"acc.next", %"head"]
  %"acc.next" = add i64 %"acc", %"i"
  %"i.next" = add i64 %"i", 1
  %"more" = icmp slt i64 %"i.next", %".2"
  br i1 %"more", label %"head", label %"done"
done:
  store i64 %"acc.next", ptr %".1"
  ret void
}
'''
# out[1] += 1, called many times in a row by the driver
STEP = '''define void @"k_step"(ptr %".1") noinline nounwind
{
entry:
  %".2" = getelementptr i64, ptr %".1", i64 1
  %".3" = load i64, ptr %".2"
  %".4" = add i64 %".3", 1
  store i64 %".4", ptr %".2"
  ret void
}
'''


def _driver(calls: int) -> str:
    """run(ptr out): k_loop(out, 10), then `calls` calls of k_step, each status-checked the
    way the backend's driver checks a kernel (a forward branch per call)."""
    body = ['  call void @"k_loop"(ptr %".1", i64 10)\n  br label %"c0"\n']
    for k in range(calls):
        body.append(f'c{k}:\n  call void @"k_step"(ptr %".1")\n'
                    f'  %"s{k}" = icmp eq i64 {k}, -1\n'
                    f'  br i1 %"s{k}", label %"fail", label %"c{k + 1}"\n')
    body.append(f'c{calls}:\n  ret i32 0\nfail:\n  ret i32 1\n')
    return 'define i32 @"run"(ptr %".1")\n{\nentry:\n' + "".join(body) + "}\n"


def test_loop_free_tells_a_loop_from_forward_branches():
    symbols = module_text.parse(LOOP + STEP + _driver(3)).symbols
    assert not module_text.loop_free(symbols["k_loop"])  # branches back to %head
    assert module_text.loop_free(symbols["k_step"]) and module_text.loop_free(symbols["run"])
    switch = module_text.parse('define i32 @"f"(i32 %".1")\n{\nentry:\n'
                               '  switch i32 %".1", label %"a" [i32 0, label %"b"]\n'
                               'a:\n  ret i32 1\nb:\n  ret i32 2\n}\n').symbols["f"]
    assert not module_text.loop_free(switch)  # not analysed: treated as possibly looping


def test_split_gives_a_named_function_a_part_of_its_own():
    module = module_text.parse(LOOP + STEP + _driver(3))
    parts = module_text.split(module, 2, alone=("run",))
    assert len(parts) == 2
    defined = [[line.split("@")[1].split("(")[0] for line in part.splitlines()
                if line.startswith("define")] for part in parts]
    assert defined == [['"run"'], ['"k_loop"', '"k_step"']]
    assert 'declare void @"k_step"' in parts[0]


def test_a_large_driver_is_compiled_apart_and_runs(monkeypatch):
    text = LOOP + STEP + _driver(400)
    module = module_text.parse(text)
    assert len(module.symbols["run"].text) >= llvm.STRAIGHT_MIN_CHARS
    assert llvm.straight_functions(module) == ("run",)
    levels = []
    real = workers.split_compile

    def record(parts, name, level, n_workers, local=None):
        levels.append(level)
        return real(parts, name, level, n_workers, local)

    monkeypatch.setattr(workers, "split_compile", record)
    monkeypatch.setattr(workers, "processes", lambda: 1)  # no workers: parts in this process
    library = llvm.compile_module(text, "straight", use_cache=False)
    assert library.parts == 2
    assert levels == [[1 | llvm_worker.FAST_CODEGEN, llvm.pipeline_level(text)]]
    out = (ctypes.c_int64 * 2)()
    assert library.ctypes_function("run", ctypes.c_int32, [ctypes.c_void_p])(out) == 0
    assert list(out) == [45, 400]


def test_a_small_or_looping_function_is_not_split_off():
    assert llvm.straight_functions(module_text.parse(LOOP + STEP + _driver(3))) == ()
    pad = "".join(f'  %"pad{k}" = add i64 %"i", {k}\n' for k in range(1000))
    looping = LOOP.replace('"i.next" = add', pad + '  %"i.next" = add', 1)
    symbol = module_text.parse(looping).symbols["k_loop"]
    assert len(symbol.text) >= llvm.STRAIGHT_MIN_CHARS
    assert llvm.straight_functions(module_text.parse(looping)) == ()
