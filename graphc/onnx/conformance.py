"""ONNX's backend node tests through graphc.onnx.backend, in memory.

`run_node_tests()` collects the node test cases the installed onnx package generates
(`onnx.backend.test.case.node.collect_testcases`: a model and input/output data sets per
case), runs each through `GraphcBackend`, and compares as ONNX's test runner does (the same
dtype, then `assert_allclose` with the case's rtol and atol). Each case ends as one `Outcome`:
- `passed`;
- `refused`: the import raised UnsupportedOnnxOp (the op, or a form of it, is not mapped) or
  the case uses value types graphc has no tensor for (sequences, optionals, strings);
- `failed`: the outputs differ; `error`: any other exception (a bug to look at).

`python -m graphc.onnx.conformance` prints the counts and the refusals by op (docs/onnx.md
lists them, `--markdown` as a table); `--every N` runs a deterministic 1-in-N subset
(`subset`), `--op` the cases of one op type. `run_light_model` (`--light [--compile cpu]`)
runs the real architectures of onnx's test data ("light" models: random weights) against
onnxruntime on every node output, and compiled against eager.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import warnings
from dataclasses import dataclass

import numpy as np


@dataclass
class Outcome:
    """How one node test case ended: status is passed, refused, failed or error."""

    name: str
    op_type: str
    status: str
    detail: str = ""


def collect_cases() -> list:
    """The node test cases of the installed onnx package (generated in memory, ~20 s)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    seen, unique = set(), []
    for case in cases:  # collect_testcases keeps a module-level list: repeated calls append
        if case.name not in seen:
            seen.add(case.name)
            unique.append(case)
    return unique


def subset(cases: list, every: int) -> list:
    """A deterministic 1-in-`every` sample of cases, chosen by a hash of the name."""
    def keep(case) -> bool:
        digest = hashlib.sha256(case.name.encode()).digest()
        return digest[0] % every == 0

    return [c for c in cases if keep(c)]


def _op_type(case) -> str:
    return case.model.graph.node[0].op_type if case.model.graph.node else "?"


def _plain(values) -> bool:
    return all(isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype.kind in "fiub"
               and np.asarray(v).dtype != np.uint64 for v in values)


def _kinds(values) -> str:
    """What graphc has no tensor for among `values`: sequences, optionals, dtypes."""
    found = set()
    for v in values:
        if isinstance(v, list):
            found.add("sequence")
        elif v is None:
            found.add("optional")
        elif not _plain([v]):
            array = np.asarray(v)
            if array.dtype.kind == "O" and array.size:  # ml_dtypes values, or strings
                first = array.flat[0]
                if isinstance(first, (str, bytes)):
                    found.add("string")
                elif hasattr(first, "data_type"):  # a TensorProto of a type numpy lacks
                    from onnx import helper

                    found.add(helper.tensor_dtype_to_string(first.data_type).split(".")[-1])
                else:
                    found.add(type(first).__name__)
            else:
                found.add("string" if array.dtype.kind in "OSU" else str(array.dtype))
    return ", ".join(sorted(found))


def run_case(case) -> Outcome:
    """Run one node test case through the graphc backend."""
    from graphc.errors import GraphcError
    from graphc.onnx.backend import GraphcBackend
    from graphc.onnx.importer import UnsupportedOnnxOp

    op = _op_type(case)
    for inputs, expected in case.data_sets:
        if not (_plain(inputs) and _plain(expected)):
            return Outcome(case.name, op, "refused", "values graphc has no tensor for: "
                           + _kinds([*inputs, *expected]))
        try:
            with np.errstate(all="ignore"):
                rep = GraphcBackend.prepare(case.model)
                outputs = rep.run(inputs)
        except UnsupportedOnnxOp as err:
            return Outcome(case.name, err.op_type, "refused", str(err))
        except (GraphcError, TypeError, ValueError, IndexError, KeyError,
                NotImplementedError, ZeroDivisionError, OverflowError, RuntimeError) as err:
            return Outcome(case.name, op, "error", f"{type(err).__name__}: {err}"[:300])
        if len(outputs) != len(expected):
            return Outcome(case.name, op, "failed", "number of outputs")
        for ref, out in zip(map(np.asarray, expected), outputs):
            if ref.dtype != out.dtype or ref.shape != out.shape:
                return Outcome(case.name, op, "failed",
                               f"{out.dtype}{out.shape} for {ref.dtype}{ref.shape}")
            try:
                np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.atol)
            except AssertionError as err:
                return Outcome(case.name, op, "failed", str(err).strip().splitlines()[0][:200])
    return Outcome(case.name, op, "passed")


MODEL_SUITES = ("simple", "pytorch-converted", "pytorch-operator")


def collect_model_cases(suites=MODEL_SUITES) -> list:
    """The small model tests stored in onnx's test data (a model.onnx and test_data_set_N
    folders of input_K.pb / output_K.pb per case), as node-test-like cases."""
    import glob
    import os
    import types

    import onnx
    from onnx import numpy_helper

    def read(path):
        proto = onnx.TensorProto()
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
        return numpy_helper.to_array(proto)

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    cases = []
    for suite in suites:
        for folder in sorted(glob.glob(os.path.join(root, suite, "test_*"))):
            data_sets = []
            for ds in sorted(glob.glob(os.path.join(folder, "test_data_set_*"))):
                inputs = [read(p) for p in sorted(glob.glob(os.path.join(ds, "input_*.pb")))]
                outputs = [read(p) for p in sorted(glob.glob(os.path.join(ds, "output_*.pb")))]
                data_sets.append((inputs, outputs))
            model = onnx.load(os.path.join(folder, "model.onnx"))
            cases.append(types.SimpleNamespace(
                name=f"{suite}/{os.path.basename(folder)}", model=model, data_sets=data_sets,
                rtol=1e-3, atol=1e-7))
    return cases


def run_node_tests(cases: list | None = None) -> list[Outcome]:
    """Run `cases` (default: every collected node test case); one Outcome per case."""
    return [run_case(c) for c in (collect_cases() if cases is None else cases)]


def summary(outcomes: list[Outcome]) -> str:
    """Counts by status, then the refused and failing cases grouped by op type."""
    counts = collections.Counter(o.status for o in outcomes)
    lines = [f"{len(outcomes)} cases: " + ", ".join(f"{counts[s]} {s}" for s in
                                                    ("passed", "refused", "failed", "error"))]
    for status in ("refused", "failed", "error"):
        by_op = collections.defaultdict(list)
        for o in outcomes:
            if o.status == status:
                by_op[o.op_type].append(o)
        if by_op:
            lines.append(f"\n{status} by op:")
        for op in sorted(by_op):
            first = by_op[op][0]
            lines.append(f"  {op} ({len(by_op[op])}): {first.detail[:160]}")
    return "\n".join(lines)


LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


@dataclass
class LightResult:
    """One light model: the worst relative difference from onnxruntime over every node output
    (eager), and, when compiled, the compiled logits' relative difference from eager."""

    name: str
    values: int
    worst_eager: float
    worst_value: str
    compiled: float | None = None


def _light_path(name: str) -> str:
    import os

    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        f"light_{name}.onnx")


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / (np.abs(want).max() + 1e-6)) if want.size else 0.0


def run_light_model(name: str, backend: str | None = None, seed: int = 0) -> LightResult:
    """Run onnx's light model `name` (random weights, real architecture) on a random input:
    every node output of graphc.onnx.load's eager run against onnxruntime's; with `backend`,
    also the logits (the model cut before its final Softmax) compiled against eager."""
    import onnx
    import onnxruntime
    from onnx import helper, shape_inference

    from graphc.autograd.grad_mode import no_grad
    from graphc.creation import tensor
    from graphc.onnx.importer import load

    model = onnx.load(_light_path(name))
    inits = {i.name for i in model.graph.initializer}
    graph_input = next(i for i in model.graph.input if i.name not in inits)
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    typed = {v.name: v for v in shape_inference.infer_shapes(probe).graph.value_info}
    names = [o for n in probe.graph.node for o in n.output if o in typed]
    del probe.graph.output[:]
    probe.graph.output.extend(typed[n] for n in names)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
    want = session.run(None, {graph_input.name: x})
    with no_grad():
        got = load(probe)(tensor(x))
    worst, where = max((_relative(g.numpy(), w), n) for g, w, n in zip(got, want, names))
    result = LightResult(name, len(names), worst, where)
    if backend is not None:
        from graphc.jit import compile as graphc_compile

        last = model.graph.node[-1]
        if last.op_type == "Softmax":  # random weights saturate it: compare the logits
            model.graph.node.pop()
            del model.graph.output[:]
            model.graph.output.append(helper.make_empty_tensor_value_info(last.input[0]))
        module = load(model)
        with no_grad():
            eager = module(tensor(x)).numpy()
            compiled = graphc_compile(module, backend=backend)(tensor(x)).numpy()
        result.compiled = _relative(compiled, eager)
    return result


def _reason(detail: str) -> str:
    """The why of a refusal, without the op/opset/node preamble."""
    why = detail.split("is not supported by graphc", 1)[-1].lstrip(": ")
    return why.replace("|", "/") or "no graphc mapping for this op"


def markdown(outcomes: list[Outcome]) -> str:
    """The refusals as a Markdown table: op, cases refused, the reason(s) (docs/onnx.md)."""
    by_op = collections.defaultdict(list)
    for o in outcomes:
        if o.status == "refused":
            by_op[o.op_type].append(_reason(o.detail))
    lines = ["| op | refused | why |", "|---|---:|---|"]
    for op in sorted(by_op):
        reasons = collections.Counter(by_op[op])
        why = "; ".join(r for r, _ in reasons.most_common(3))
        lines.append(f"| {op} | {len(by_op[op])} | {why} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command line: run the node tests and print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="run 1 case in EVERY (default all)")
    parser.add_argument("--op", default=None, help="only cases of this op type")
    parser.add_argument("--markdown", action="store_true", help="the refusals as a table")
    parser.add_argument("--light", action="store_true", help="onnx's light models instead")
    parser.add_argument("--models", action="store_true",
                        help="the small model tests of onnx's test data instead")
    parser.add_argument("--compile", default=None, help="with --light: compile on BACKEND too")
    args = parser.parse_args(argv)
    if args.light:
        for name in LIGHT_MODELS:
            r = run_light_model(name, args.compile)
            compiled = "" if r.compiled is None else f", compiled {r.compiled:.1e}"
            print(f"{name}: {r.values} values, worst relative difference from onnxruntime "
                  f"{r.worst_eager:.1e} ({r.worst_value}){compiled}")
        return
    cases = collect_model_cases() if args.models else collect_cases()
    if args.op:
        cases = [c for c in cases if _op_type(c) == args.op]
    if args.every > 1:
        cases = subset(cases, args.every)
    outcomes = run_node_tests(cases)
    print(markdown(outcomes) if args.markdown else summary(outcomes))


if __name__ == "__main__":
    main()
