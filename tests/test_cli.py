"""The `graphc` command line and `graphc.dump`: every subcommand through `graphc.tools.cli.main`,
its error paths (one line on stderr, exit code 2), and the IR examples of docs/ir.md.

`viz`, `run` and `check` stand on graphc.ir.export, graphc.testing.repro and graphc.testing: the
plumbing is tested with small stand-ins put in sys.modules, and end to end where the real
modules exist (skipped, with the reason, where they do not).
"""

from __future__ import annotations

import doctest
import io
import re
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest

import graphc
import graphc.nn as nn
from graphc.errors import ArgumentError, GraphcError
from graphc.ir import format_graph, parse, run, verify
from graphc.jit.dump import dump, ir_text
from graphc.tools.cli import main, summarize

DOCS = Path(__file__).resolve().parent.parent / "docs"

BUILDERS = '''
import graphc
import graphc.nn as nn
import graphc.nn as nn


def mlp():
    graphc.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return model, (graphc.randn(2, 4),)


def scale_sum(x, y):
    return (x * y).sum(dim=1)


def fn():
    return scale_sum, (graphc.ones(2, 3), graphc.full((2, 3), 2.0))


def single_tensor():
    return graphc.exp, graphc.ones(2, 3)


def model_only():
    return nn.ReLU()


def not_callable():
    return 3, (graphc.ones(2),)


def bad_inputs():
    return scale_sum, 7


def raises():
    raise ValueError("no data here")


def data_dependent():
    def f(x):
        if x.sum() > 0:
            return x
        return -x
    return f, (graphc.ones(2),)


NOT_A_FUNCTION = 5
'''


@pytest.fixture
def builders(tmp_path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(BUILDERS)
    return path


def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _error_line(capsys, *argv) -> str:
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2, (out, err)
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    return err


def _stub(monkeypatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(__import__("sys").modules, name, module)
    return module


# ---- graphc ops ------------------------------------------------------------------------------
def test_ops_lists_the_registry(capsys):
    rc, out, _ = _cli(capsys, "ops")
    assert rc == 0 and "matmul" in out and "contraction" in out


# ---- graphc dump -----------------------------------------------------------------------------
def test_dump_prints_ir_of_a_module_that_parses_and_runs(capsys, builders):
    rc, out, err = _cli(capsys, "dump", f"{builders}:mlp")
    assert rc == 0 and err == ""
    g = verify(parse(out))
    assert g.name == "Sequential"
    assert [v.name for v in g.inputs] == ["input", "0.weight", "0.bias", "2.weight", "2.bias"]
    assert [n.op for n in g.nodes].count("matmul") == 2
    assert g.outputs[0].type.shape == (2, 3)
    # nodes from graphc's own layers: no user line exists, so none is printed (not main's)
    assert all(n.loc is None for n in g.nodes)


def test_dump_out_writes_name_gir(capsys, builders, tmp_path):
    out_dir = tmp_path / "dumps"
    rc, out, _ = _cli(capsys, "dump", f"{builders}:fn", "--out", out_dir)
    path = out_dir / "scale_sum.gir"
    assert rc == 0 and out.strip() == f"wrote {path}"
    g = verify(parse(path.read_text()))
    assert [n.op for n in g.nodes] == ["mul", "reduce_sum"]
    assert g.nodes[0].loc == "models.py:14"  # the user's line, as the comment says
    (result,) = run(g, np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32))
    np.testing.assert_array_equal(result, [6.0, 6.0])


def test_dump_accepts_one_tensor_as_the_inputs(capsys, builders):
    rc, out, _ = _cli(capsys, "dump", f"{builders}:single_tensor")
    assert rc == 0 and parse(out).inputs[0].type.shape == (2, 3)


@pytest.mark.parametrize("target, expected", [
    ("{dir}/missing.py:mlp", "missing.py: no such file"),
    ("{path}", "expected FILE.py:builder"),
    ("{path}:nope", "has no function 'nope' (it defines: bad_inputs, data_dependent, fn,"),
    ("{path}:NOT_A_FUNCTION", "is a int, not a function"),
    ("{path}:model_only", "must return (model_or_fn, example_inputs), got a ReLU"),
    ("{path}:not_callable", "returned a int as the model"),
    ("{path}:bad_inputs", "returned a int as example inputs: expected a tuple of tensors"),
    ("{path}:raises", "raises() raised ValueError: no data here"),
    ("{path}:data_dependent", "failed: TraceError:"),
])
def test_dump_bad_builders_give_one_line_and_exit_2(capsys, builders, target, expected):
    target = target.format(path=builders, dir=builders.parent)
    err = _error_line(capsys, "dump", target)
    assert err.startswith("graphc dump: error: ")
    assert expected in err


def test_dump_a_module_that_fails_to_import(capsys, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import graphc\nx = 1 / 0\n")
    err = _error_line(capsys, "dump", f"{path}:build")
    assert "broken.py failed: ZeroDivisionError: division by zero" in err


def test_builder_file_can_import_its_neighbours(capsys, tmp_path):
    (tmp_path / "helpers_for_cli.py").write_text("def double(x):\n    return x * 2\n")
    path = tmp_path / "uses_helper.py"
    path.write_text("import graphc\nfrom helpers_for_cli import double\n\n"
                    "def build():\n    return double, (graphc.ones(3),)\n")
    rc, out, _ = _cli(capsys, "dump", f"{path}:build")
    assert rc == 0 and [n.op for n in parse(out).nodes] == ["full", "mul"]


def test_argparse_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["dump"])
    assert info.value.code == 2
    assert "FILE.py:builder" in capsys.readouterr().err


# ---- graphc.dump -----------------------------------------------------------------------------
def _f(x):
    return (x + 1).relu()


def test_dump_function_graph_and_compiled(capsys, tmp_path):
    x = graphc.ones(2)
    assert dump(_f, x) is None
    text = capsys.readouterr().out
    g = parse(text)
    assert [n.op for n in g.nodes] == ["full", "add", "relu"]
    assert ir_text(_f, x) + "\n" == text
    dump(g)
    assert capsys.readouterr().out == text

    compiled = graphc.compile(_f, backend="interp")
    with pytest.raises(GraphcError, match="not been called yet"):
        dump(compiled)
    compiled(x)
    assert ir_text(compiled) + "\n" == text
    assert parse(ir_text(compiled, graphc.ones(5))).inputs[0].type.shape == (5,)
    assert parse(ir_text(compiled)).inputs[0].type.shape == (2,)  # the cache is left alone
    assert len(compiled.graphs) == 1

    path = tmp_path / "f.gir"
    dump(_f, x, file=path)
    buffer = io.StringIO()
    dump(compiled, file=buffer)
    assert path.read_text() == buffer.getvalue() == text
    assert capsys.readouterr().out == ""


def test_dump_refuses_what_it_cannot_print():
    with pytest.raises(ArgumentError, match="needs example inputs"):
        dump(_f)
    with pytest.raises(ArgumentError, match="takes no example inputs"):
        dump(graphc.trace(_f, graphc.ones(2)), graphc.ones(2))
    with pytest.raises(ArgumentError, match="got int"):
        dump(3)


# ---- graphc viz ------------------------------------------------------------------------------
def _fake_render_svg(graph, path):
    Path(path).write_text(f"<svg><!-- {graph.name}: {len(graph.nodes)} nodes --></svg>")


def test_viz_plumbing_from_builder_and_gir(capsys, monkeypatch, builders, tmp_path):
    _stub(monkeypatch, "graphc.ir.export", render_svg=_fake_render_svg)
    out_svg = tmp_path / "mlp.svg"
    rc, out, _ = _cli(capsys, "viz", f"{builders}:mlp", "-o", out_svg)
    assert rc == 0 and out.strip() == f"wrote {out_svg}"
    assert out_svg.read_text() == "<svg><!-- Sequential: 7 nodes --></svg>"

    gir = tmp_path / "g.gir"
    dump(_f, graphc.ones(2), file=gir)
    rc, out, _ = _cli(capsys, "viz", gir)  # default output: next to the .gir
    assert rc == 0 and (tmp_path / "g.svg").read_text() == "<svg><!-- _f: 3 nodes --></svg>"


def test_viz_renders_a_real_svg(capsys, builders, tmp_path):
    out_svg = tmp_path / "mlp.svg"
    rc, _, err = _cli(capsys, "viz", f"{builders}:mlp", "-o", out_svg)
    assert rc == 0, err
    assert "<svg" in out_svg.read_text()


def test_viz_memory_draws_the_planned_buffers(capsys, builders, tmp_path):
    out_png = tmp_path / "mlp.memory.png"
    rc, out, err = _cli(capsys, "viz", "--memory", f"{builders}:mlp", "-o", out_png)
    assert rc == 0, err
    assert "plan_buffers @" in out and f"wrote {out_png}" in out
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_viz_missing_tool_or_bad_gir_exit_2(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "graphc.ir.export", None)
    gir = tmp_path / "g.gir"
    dump(_f, graphc.ones(2), file=gir)
    err = _error_line(capsys, "viz", gir)
    assert "graphc viz needs graphc.ir.export.render_svg" in err
    bad = tmp_path / "bad.gir"
    bad.write_text("graph @g(%x: f32[2]) -> (f32[2]) {\n  %0: f32[2] = exp(%y)\n"
                   "  return (%0)\n}\n")
    err = _error_line(capsys, "viz", bad)
    assert "bad.gir: line 2, column 20: %y is used before it is defined" in err


# ---- graphc run ------------------------------------------------------------------------------
def _write_case(tmp_path) -> tuple[Path, Path]:
    """A .gir with in-place updates (BatchNorm's running stats) and its inputs as .npz."""
    bn = nn.BatchNorm1d(3)
    x = graphc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    before = {"input": x.numpy().copy()}
    before |= {k: t.numpy().copy() for k, t in bn.state_dict().items()}
    with graphc.no_grad():
        g = graphc.trace(lambda input: bn(input).sum(dim=1), x)
    gir = tmp_path / "bn.gir"
    gir.write_text(format_graph(g) + "\n")
    npz = tmp_path / "bn.npz"
    np.savez(npz, **{v.name: before[v.name.removeprefix("bn.")] for v in g.inputs})
    return gir, npz


def _interp_repro(gir_path, npz_path, backend):
    g = parse(Path(gir_path).read_text())
    with np.load(npz_path) as data:
        return run(g, *(data[v.name] for v in g.inputs))


def test_run_plumbing_prints_and_saves_outputs(capsys, monkeypatch, tmp_path):
    calls = []

    def run_repro(gir_path, npz_path, backend):
        calls.append(backend)
        return _interp_repro(gir_path, npz_path, backend)

    _stub(monkeypatch, "graphc.testing.repro", run_repro=run_repro)
    gir, npz = _write_case(tmp_path)
    out_npz = tmp_path / "out.npz"
    rc, out, _ = _cli(capsys, "run", gir, "--inputs", npz, "--out", out_npz)
    assert rc == 0 and calls == ["interp"]
    lines = out.splitlines()
    assert lines[0].startswith("out0")
    assert "(2,) float32  min=-2.99999 max=2.99999 mean=0" in lines[0]
    assert [line.split()[0] for line in lines[1:4]] == [
        "update.bn.num_batches_tracked", "update.bn.running_mean", "update.bn.running_var"]
    assert "() int64  min=1 max=1 mean=1" in lines[1]
    assert lines[-1] == f"wrote {out_npz}"
    with np.load(out_npz) as saved:
        np.testing.assert_allclose(saved["update.bn.running_mean"], [0.15, 0.25, 0.35])


def test_run_bad_inputs_exit_2(capsys, monkeypatch, tmp_path):
    _stub(monkeypatch, "graphc.testing.repro", run_repro=_interp_repro)
    gir, npz = _write_case(tmp_path)
    err = _error_line(capsys, "run", tmp_path / "nope.gir", "--inputs", npz)
    assert "nope.gir: no such file" in err
    err = _error_line(capsys, "run", gir, "--inputs", tmp_path / "nope.npz")
    assert "nope.npz: no such file" in err
    bad = tmp_path / "bad.gir"
    bad.write_text("graph @g(%x: f32[2]) -> (f32[2]) {\n  %0: f32[2] = exp[(%x)\n}\n")
    err = _error_line(capsys, "run", bad, "--inputs", npz)
    assert "bad.gir: line 2, column 20: expected a name, got '('" in err
    wrong = tmp_path / "wrong.gir"
    wrong.write_text("graph @g(%x: f32[2]) -> (f32[3]) {\n  %0: f32[3] = exp(%x)\n"
                     "  return (%0)\n}\n")
    err = _error_line(capsys, "run", wrong, "--inputs", npz)
    assert "wrong.gir: exp at unknown location: output types ['f32[3]'] differ" in err


def test_run_with_the_real_repro_runner(capsys, tmp_path):
    gir, npz = _write_case(tmp_path)
    rc, out, err = _cli(capsys, "run", gir, "--inputs", npz, "--backend", "interp")
    assert rc == 0, err
    assert "(2,) float32" in out.splitlines()[0]


def test_summarize_describes_values():
    assert summarize(np.array([1.0, np.nan, np.inf, 3.0])) == "min=1 max=3 mean=2 nan=1 inf=1"
    assert summarize(np.array([True, False, True])) == "true=2/3"
    assert summarize(np.zeros((0, 3))) == "empty"
    assert summarize(np.array(7, np.int64)) == "min=7 max=7 mean=7"


# ---- graphc check ----------------------------------------------------------------------------
def test_check_plumbing_ok_and_mismatch(capsys, monkeypatch, builders):
    seen = []

    def agrees(fn, *inputs, backends, grads):
        seen.append((fn.__name__, len(inputs), backends, grads))

    _stub(monkeypatch, "graphc.testing", assert_compiled_matches=agrees)
    rc, out, _ = _cli(capsys, "check", f"{builders}:fn", "--backends", "interp, cpu")
    assert rc == 0 and out.strip() == f"OK {builders}:fn (interp, cpu)"
    assert seen == [("scale_sum", 2, ("interp", "cpu"), True)]

    def disagrees(fn, *inputs, backends, grads):
        raise AssertionError("backend cpu: first divergent node %1 = reduce_sum(%0) "
                             "# models.py:14\nrepro written to /tmp/repro.gir")

    _stub(monkeypatch, "graphc.testing", assert_compiled_matches=disagrees)
    rc, out, _ = _cli(capsys, "check", f"{builders}:fn", "--no-grads")
    assert rc == 1
    assert out.splitlines()[0] == f"MISMATCH {builders}:fn (interp)"
    assert "first divergent node %1 = reduce_sum(%0)" in out


def test_check_errors_exit_2(capsys, monkeypatch, builders):
    monkeypatch.setitem(__import__("sys").modules, "graphc.testing", None)
    err = _error_line(capsys, "check", f"{builders}:fn")
    assert "graphc check needs graphc.testing.assert_compiled_matches" in err
    err = _error_line(capsys, "check", f"{builders}:fn", "--backends", ",")
    assert "name at least one backend" in err
    err = _error_line(capsys, "check", f"{builders}:missing")
    assert "has no function 'missing'" in err


def test_check_with_the_real_harness(capsys, builders):
    rc, out, err = _cli(capsys, "check", f"{builders}:fn")
    assert rc == 0, out + err
    assert out.startswith("OK")


# ---- the docs --------------------------------------------------------------------------------
def _fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def test_ir_doc_examples_parse_verify_and_round_trip():
    blocks = _fenced((DOCS / "ir.md").read_text(), "gir")
    assert len(blocks) >= 4, "docs/ir.md should show its grammar with ```gir examples"
    for block in blocks:
        g = verify(parse(block))
        assert parse(format_graph(g)) == g


@pytest.mark.parametrize("name", ["ir.md", "tracing.md", "getting-started.md"])
def test_doc_examples_run(name):
    """The `>>>` examples of the docs run and print what they say (fences stripped)."""
    text = (DOCS / name).read_text()
    text = "\n".join("" if line.startswith("```") else line for line in text.splitlines())
    parser = doctest.DocTestParser()
    test = parser.get_doctest(textwrap.dedent(text), {"graphc": graphc}, name, name, 0)
    assert test.examples, f"docs/{name} has no >>> examples"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} example(s) in docs/{name} failed"


# ---- check -> repro -> run, with a deliberately broken backend -----------------------------
class _OffByOneMul:
    """A test-only backend whose `mul` lowering adds 1: the harness must catch it."""

    def __init__(self, graph):
        from graphc.ir.interpreter import Interpreter

        class Broken(Interpreter):
            def run_node(self, node, args):
                results = super().run_node(node, args)
                return [r + 1 for r in results] if node.op == "mul" else results

        self.graph, self.memory_plan = graph, None
        self._interp = Broken(graph)

    def run(self, *arrays):
        return self._interp.run(*arrays)


def test_check_catches_a_broken_backend_and_run_reproduces_it(capsys, monkeypatch, builders,
                                                              tmp_path):
    from graphc import backends

    monkeypatch.setitem(backends.BACKENDS, "offbyone", lambda graph, options: _OffByOneMul(graph))
    rc, out, _ = _cli(capsys, "check", f"{builders}:fn", "--backends", "offbyone", "--no-grads",
                      "--repro-dir", tmp_path / "repros")
    assert rc == 1
    assert out.startswith(f"MISMATCH {builders}:fn (offbyone)")
    assert "mul(%x, %y)" in out and "models.py:14" in out
    gir = re.search(r"(\S+\.gir)", out).group(1)
    assert gir.startswith(str(tmp_path / "repros"))
    npz = re.search(r"(\S+\.npz)", out).group(1)
    rc, good, _ = _cli(capsys, "run", gir, "--inputs", npz)
    assert rc == 0 and "min=2 max=2 mean=2" in good  # 1 * 2 on the interpreter
    rc, bad, _ = _cli(capsys, "run", gir, "--inputs", npz, "--backend", "offbyone")
    assert rc == 0 and "min=3 max=3 mean=3" in bad  # the backend's bug, reproduced


def test_cache_info_and_clear(capsys, monkeypatch, tmp_path):
    pytest.importorskip("llvmlite", reason="the CPU backend's cache needs llvmlite")
    from graphc.backends.cpu.llvm import compile_module

    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path))
    compile_module("define i32 @seven() {\n  ret i32 7\n}\n", "seven")
    rc, out, _ = _cli(capsys, "cache", "info")
    assert rc == 0 and str(tmp_path) in out and "entries: 1" in out
    rc, out, _ = _cli(capsys, "cache", "clear")
    assert rc == 0 and out.strip() == "removed 1 entries"
    rc, out, _ = _cli(capsys, "cache", "info")
    assert "entries: 0" in out
