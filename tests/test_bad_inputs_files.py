"""The bad-input catalogue, files: IR text and `.npz` inputs from someone else.

Part of the catalogue described in `tests/test_bad_inputs.py`. What a hostile or damaged file
may do, here: nothing but a clear error. IR text never imports a module (a `function` line
names a Function class that the user's code already registered); the parser answers any text
with a Graph or a ParseError that gives line and column, what was expected, what came and what
to do, within limits on nesting and number sizes, and stops at the first error without
reading the rest; the verifier answers any parsed graph with the graph or a VerifyError; and
`graphc run` reports any bad `.gir` or `.npz` in one line with exit code 2. The random side
of the same promise is `tests/test_ir_fuzz.py`.
"""

from __future__ import annotations

import sys
import zipfile

import numpy as np
import pytest

import graphc
from graphc.autograd import Function
from graphc.ir import ParseError, VerifyError, format_graph, parse, verify
from graphc.ir.parser import MAX_DEPTH, MAX_NUMBER_CHARS
from graphc.jit.tracer import trace_call
from graphc.passes.autodiff import derive_backward
from graphc.tools.cli import main

_GOOD = "graph @f(%x: f32[3]) -> (f32[3]) {\n  %0: f32[3] = relu(%x)\n  return (%0)\n}"


class Triple(Function):
    """A module-level Function: registered when this file is imported."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3


def _function_text(class_path: str) -> str:
    graph = trace_call(lambda x: Triple.apply(x), (graphc.ones(2),)).graph
    text = format_graph(graph)
    return text.replace(f'class="{__name__}:Triple"', f'class="{class_path}"')


# ---- IR text imports nothing -------------------------------------------------------------------
def test_a_function_line_naming_an_unimported_module_is_a_parse_error_and_runs_nothing(
        tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    (tmp_path / "planted_fn_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('top-level code ran')\n"
        "from graphc.autograd import Function\n"
        "class Evil(Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x * 3\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        return g\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = _function_text("planted_fn_module:Evil")
    with pytest.raises(ParseError) as err:
        derive_backward(parse(text))
    message = str(err.value)
    column = text.splitlines()[3].index("class=") + 1
    assert message.startswith(f"line 4, column {column}: function line: ")
    assert "planted_fn_module:Evil is not registered (IR text never imports code)" in message
    assert "import the module that defines it (planted_fn_module) before" in message
    assert "planted_fn_module" not in sys.modules and not marker.exists()


def test_run_and_viz_keep_an_unregistered_function_line_as_a_name_and_import_nothing(
        capsys, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "planted_run_module.py").write_text("raise SystemExit('imported')\n")
    gir = tmp_path / "f.gir"
    gir.write_text(_function_text("planted_run_module:Evil") + "\n")
    npz = tmp_path / "f.npz"
    np.savez(npz, x=np.ones(2, np.float32))
    assert main(["run", str(gir), "--inputs", str(npz)]) == 0
    assert "(2,) float32  min=3 max=3 mean=3" in capsys.readouterr().out
    assert "planted_run_module" not in sys.modules
    graph = parse(gir.read_text(), require_registered=False)
    with pytest.raises(graphc.GraphcError, match=r"planted_run_module:Evil is not registered"):
        derive_backward(graph)  # differentiating needs the class: still nothing imported
    assert "planted_run_module" not in sys.modules


def test_a_function_line_naming_a_registered_class_parses_and_differentiates():
    text = _function_text(f"{__name__}:Triple")
    graph = verify(parse(text))
    assert format_graph(graph) == text
    (region,) = graph.meta["functions"]
    assert region.function_class() is Triple  # from the registry, not imported
    joint = derive_backward(graph, seeds="ones")
    assert "function Triple" in format_graph(joint)


def test_a_function_line_naming_a_stdlib_callable_is_refused_without_importing():
    with pytest.raises(ParseError, match=r"os:system is not registered.*import the module"):
        parse(_function_text("os:system"))


@pytest.mark.parametrize("attrs, expected", [
    ("nodes=99", "nodes=99: expected a count from 0 to 2 (the nodes above the line); fix"),
    ("nodes=2, nodes=2", "attribute 'nodes' given twice: expected each attribute once; remove"),
    ("nodes=2, ctx._saved=(%x,)", "'ctx._saved' names what ctx keeps for itself: expected "
                                  "ctx.NAME for an attribute the Function set; remove"),
    ("nodes=2, run=\"os.system\"", "unknown attribute 'run': expected one of class, nodes, "
                                   "saved, non_differentiable, dirty, materialize_grads or "
                                   "ctx.NAME; remove that attribute"),
    ("nodes=2, dirty=(-1,)", "dirty=(-1,): expected a tuple of output indices; write"),
])
def test_function_line_attributes_are_checked_when_parsed(attrs, expected):
    text = _function_text(f"{__name__}:Triple")
    line = next(s for s in text.splitlines() if "function Triple" in s)
    bad = line.replace("nodes=2", attrs)
    with pytest.raises(ParseError) as err:
        parse(text.replace(line, bad))
    assert str(err.value).startswith("line 4, column ") and expected in str(err.value)


# ---- the parser: only ParseError, with line and column -----------------------------------------
@pytest.mark.parametrize("text, expected", [
    # was IndexError: a value at the very end looked one token past the end
    ("graph @f(%x: f32[3]) -> (f32[3]) {\n  %y",
     "line 2, column 5: expected ':', got end of input; "),
    # was RecursionError
    (_GOOD.replace("relu(", "relu[a=" + "(" * 100000 + "](", 1),
     f"line 2, column {23 + MAX_DEPTH}: tuples nested more than {MAX_DEPTH} deep: expected at "
     f"most {MAX_DEPTH} levels (the parser's limit); flatten the literal"),
    # was JSONDecodeError
    (_GOOD.replace("relu(", 'relu[mode="\\q"](', 1),
     "line 2, column 26: expected a JSON string literal, got '\"\\\\q\"' (Invalid \\escape"),
    # was ValueError (int() of more than 4300 digits)
    (_GOOD.replace("f32[3] = relu", "f32[" + "9" * 5000 + "] = relu"),
     f"line 2, column 11: a number of 5000 characters: expected at most {MAX_NUMBER_CHARS} "
     "(the parser's limit); use a smaller number"),
    (_GOOD.replace("relu(", "relu[a=" + "1" * 5000 + "](", 1),
     "line 2, column 23: a number of 5000 characters: expected at most"),
    (_GOOD.replace("f32[3] = relu", "f32[9223372036854775808] = relu"),
     "line 2, column 11: a dimension of 19 digits: expected at most 2**63-1 (the parser's "
     "limit); use a smaller dimension"),
    (_GOOD.replace("f32[3] = relu", "f32[٣] = relu"),  # unicode digits are no dimension
     "line 2, column 11: unexpected character '٣'"),
    (_GOOD.replace("relu(", 'relu[mode="a\n"](', 1),
     "line 2, column 26: unterminated string: expected a closing '\"' on the same line"),
    (_GOOD.replace("f32[3])", "float32[3])", 1),  # numpy's names are not IR dtypes
     "line 1, column 14: expected a dtype (f32, f64, i64, bool), got 'float32'"),
    (_GOOD.replace("relu(", "relu[a=1, a=2](", 1),
     "line 2, column 26: attribute 'a' given twice: expected each attribute once; remove one "
     "of the two"),
    (_GOOD.encode().replace(b"relu", b"rel\xff"),
     "line 2, column 19: expected UTF-8 text, got the byte 0xff; save the file as UTF-8"),
    (b"", "line 1, column 1: expected 'graph', got end of input; "),
], ids=["value-at-end", "deep-nesting", "bad-escape", "5000-digit-dim", "5000-digit-attr",
        "dim-over-int64", "unicode-digit", "newline-in-string", "numpy-dtype-name",
        "duplicate-attr", "not-utf8", "empty"])
def test_malformed_ir_text_is_only_ever_a_parse_error(text, expected):
    with pytest.raises(ParseError) as err:
        parse(text)
    assert str(err.value).startswith(expected)


def test_the_first_error_is_reported_without_reading_the_rest():
    # Tokenising the whole text first (the old parser) reported the '$' on the last line.
    body = "".join(f"  %{i}: f32[3] = relu(%{i - 1})\n" for i in range(1, 20000))
    text = "graph @f(%x f32[3]) -> (f32[3]) {\n  %0: f32[3] = relu(%x)\n" + body + "$"
    with pytest.raises(ParseError, match=r"^line 1, column 13: expected ':', got 'f32\[3\]'"):
        parse(text)


def test_a_graph_that_parses_but_breaks_an_op_rule_is_a_verify_error():
    # was UnicodeEncodeError from numpy: `full`'s shape rule read a dtype name with a lone
    # surrogate (a JSON escape in the text)
    text = _GOOD.replace("%0: f32[3] = relu(%x)",
                         '%0: f32[] = full[shape=(), value=1.0, dtype="\\udcbd"]()')
    text = text.replace("(f32[3]) {", "(f32[]) {")
    with pytest.raises(VerifyError, match=r"full at unknown location: the op's shape rule "
                                          r"rejects the attributes: UnicodeEncodeError"):
        verify(parse(text))


# ---- graphc run: one line, exit code 2 -------------------------------------------------------
def _run_case(tmp_path):
    gir = tmp_path / "f.gir"
    gir.write_text(_GOOD + "\n")
    npz = tmp_path / "f.npz"
    np.savez(npz, x=np.ones(3, np.float32))
    return gir, npz


def _one_line_exit_2(capsys, *argv) -> str:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert "Traceback" not in err
    return err


def test_run_on_good_files_works(capsys, tmp_path):
    gir, npz = _run_case(tmp_path)
    assert main(["run", str(gir), "--inputs", str(npz)]) == 0
    assert "(3,) float32  min=1 max=1 mean=1" in capsys.readouterr().out


def test_run_refuses_an_npz_with_object_arrays_in_one_line(capsys, tmp_path):
    gir, npz = _run_case(tmp_path)
    np.savez(npz, x=np.array([{"a": 1}, None], dtype=object))
    err = _one_line_exit_2(capsys, "run", gir, "--inputs", npz)
    assert "f.npz: entry 'x' cannot be read as a plain array (ValueError: Object arrays " \
           "cannot be loaded when allow_pickle=False)" in err
    assert "holding numeric arrays only" in err


def test_run_refuses_an_npz_that_is_not_a_zip_in_one_line(capsys, tmp_path):
    gir, npz = _run_case(tmp_path)
    npz.write_bytes(b"\x80\x04this is a pickle, not a zip")
    err = _one_line_exit_2(capsys, "run", gir, "--inputs", npz)
    assert "f.npz: expected an .npz archive of arrays, but it cannot be read" in err


def test_run_refuses_a_truncated_npz_and_a_bare_npy(capsys, tmp_path):
    gir, npz = _run_case(tmp_path)
    npz.write_bytes(npz.read_bytes()[:60])
    assert "f.npz: expected an .npz archive" in _one_line_exit_2(
        capsys, "run", gir, "--inputs", npz)
    np.save(tmp_path / "x.npy", np.ones(3, np.float32))
    assert "got a single .npy array" in _one_line_exit_2(
        capsys, "run", gir, "--inputs", tmp_path / "x.npy")


def test_run_refuses_a_damaged_npz_entry(capsys, tmp_path):
    gir, npz = _run_case(tmp_path)
    with zipfile.ZipFile(npz, "w") as archive:
        archive.writestr("x.npy", b"\x93NUMPY garbage")
    err = _one_line_exit_2(capsys, "run", gir, "--inputs", npz)
    assert "f.npz: entry 'x' cannot be read as a plain array" in err


@pytest.mark.parametrize("content", [
    _GOOD.encode().replace(b"relu", b"rel\xff"),
    _GOOD.replace("f32[3] = relu", "f32[" + "9" * 5000 + "] = relu").encode(),
    _GOOD.replace("relu(", "relu[a=" + "(" * 100000 + "](", 1).encode(),
], ids=["not-utf8", "5000-digit-dim", "deep-nesting"])
def test_run_and_viz_report_a_bad_gir_in_one_line(capsys, tmp_path, content):
    gir, npz = _run_case(tmp_path)
    gir.write_bytes(content)
    err = _one_line_exit_2(capsys, "run", gir, "--inputs", npz)
    assert err.startswith(f"graphc run: error: {gir}: line ")
    err = _one_line_exit_2(capsys, "viz", gir)
    assert err.startswith(f"graphc viz: error: {gir}: line ")
