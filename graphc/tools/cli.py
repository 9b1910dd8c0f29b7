"""The `graphc` command line.

    graphc ops [--markdown]                         list the op registry
    graphc dump FILE.py:builder [--out DIR]         print (or save) the traced IR
    graphc viz FILE.py:builder|FILE.gir [-o OUT]    draw a graph as SVG (OUT.html: interactive)
    graphc viz --html | --explorer ...              the HTML viewer / Model Explorer JSON
    graphc profile FILE.py:builder [--trace OUT]    time every kernel of the step compiled on
                                                    cpu: a table and a Chrome/Perfetto trace
    graphc viz --memory ...                         draw its planned buffers over the schedule
    graphc run FILE.gir --inputs FILE.npz [--backend interp] [--out OUT.npz]
    graphc check FILE.py:builder [--backends interp,...] [--no-grads] [--repro-dir DIR]
    graphc cache info|clear                         the CPU backend's object-code cache
    graphc demo [--backend cpu|interp|cuda] [--epochs N] [--batch-size N] [--out DIR]
                [--seed N] [--limit N]              train a CNN on scikit-learn's digits
    graphc build-runtime [ARGS...]                  build the CUDA runtime library

A *builder* is a function in a Python file that takes no arguments and returns
`(model_or_fn, example_inputs)`, example_inputs being a tuple of tensors; `dump` and `viz`
trace `model_or_fn(*example_inputs)` under `graphc.no_grad()`.

Exit codes: 0 on success, 1 when `check` finds a mismatch or `demo` cannot run here (a
backend that cannot run, a missing package), 2 on bad input (a bad option, a missing file, no
such builder, a builder returning the wrong thing, malformed IR text, a failing trace): one
line on stderr says what and where, and what to do.

`demo` stands on graphc.tools.demo (scikit-learn and tqdm); `build-runtime` hands its arguments to
`graphc.backends.cuda.build.main`. Both are imported when the command runs.

The tools `viz`, `run` and `check` stand on `graphc.ir.export`, `graphc.testing.repro`
and `graphc.testing`, imported when the command runs, so `graphc dump` works without them.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any

import numpy as np

import graphc
from graphc.errors import GraphcError, user_source_location
from graphc.tools import launch


class UsageError(Exception):
    """Bad input from the command line: reported as one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `graphc demo: error: <what> (see graphc demo --help)`.
    Subcommand parsers inherit the class, so every command reports bad options this way."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---- loading inputs --------------------------------------------------------------------------
def _import_file(path: str):
    """Import a Python file as a fresh module; its directory is importable while it loads."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    path = os.path.abspath(path)
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"_graphc_builder_{''.join(c if c.isalnum() else '_' for c in stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be imported as a Python module (expected FILE.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's module failed: say where, not a traceback
        sys.modules.pop(name, None)
        raise UsageError(f"importing {path} failed: {type(err).__name__}: {err}") from err
    finally:
        sys.path.remove(os.path.dirname(path))
    return module


def load_builder(target: str) -> tuple[Any, tuple]:
    """`FILE.py:builder` -> (model_or_fn, example_inputs) from calling builder()."""
    path, sep, func = target.rpartition(":")
    if not sep or not path or not func:
        raise UsageError(f"{target}: expected FILE.py:builder (a file and a function in it)")
    module = _import_file(path)
    builder = getattr(module, func, None)
    if builder is None:
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise UsageError(f"{path} has no function {func!r}"
                         + (f" (it defines: {', '.join(defined)})" if defined else ""))
    if not callable(builder):
        raise UsageError(f"{path}:{func} is a {type(builder).__name__}, not a function")
    try:
        built = builder()
    except Exception as err:
        raise UsageError(f"{target}() raised {type(err).__name__}: {err}") from err
    if not (isinstance(built, (tuple, list)) and len(built) == 2):
        raise UsageError(f"{target}() must return (model_or_fn, example_inputs), got "
                         f"{_describe(built)}")
    fn, inputs = built
    if isinstance(inputs, graphc.Tensor):
        inputs = (inputs,)
    if not callable(fn):
        raise UsageError(f"{target}() returned {_describe(fn)} as the model: expected a "
                         "function or Module")
    if not isinstance(inputs, (tuple, list)):
        raise UsageError(f"{target}() returned {_describe(inputs)} as example inputs: "
                         "expected a tuple of tensors")
    return fn, tuple(inputs)


def _describe(obj) -> str:
    if isinstance(obj, (tuple, list)):
        return f"a {type(obj).__name__} of {len(obj)}"
    return f"a {type(obj).__name__}"


def _trace(target: str):
    """Trace the builder's model on its inputs under no_grad."""
    fn, inputs = load_builder(target)
    try:
        with graphc.no_grad():
            graph = graphc.trace(fn, *inputs)
    except GraphcError as err:
        raise UsageError(f"tracing {target} failed: {type(err).__name__}: {err}") from err
    # Ops applied inside graphc's own layers get the innermost frame outside the package,
    # which here is whatever started the command (the console script, runpy), not user
    # code: drop that location rather than print a misleading one.
    driver = user_source_location()
    for node in graph.nodes:
        if node.loc == driver:
            node.loc = None
    return graph


def _read_gir(path: str):
    """Parse a .gir file; any bad file (unreadable, not UTF-8, malformed) is a UsageError.
    `run` and `viz` never differentiate, so a `function` line's class need not be imported
    (it is never imported either: see graphc.ir.printer)."""
    from graphc.ir import ParseError, parse

    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise UsageError(f"{path}: cannot be read ({err.strerror or err}); check the file's "
                         "permissions") from err
    try:
        return parse(data, require_registered=False)  # bytes: non-UTF-8 has a line
    except ParseError as err:
        raise UsageError(f"{path}: {err}") from err


def _check_npz(path: str) -> None:
    """Check that `path` is an .npz archive of plain arrays, reading every entry with
    `allow_pickle=False` (an object array or pickled data would need code to load); a
    UsageError saying what is wrong and what to do otherwise."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    how = "write it with numpy.savez or graphc.testing.save_repro, holding numeric arrays only"
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as err:  # not a zip, truncated, pickled data: no traceback, exit 2
        raise UsageError(f"{path}: expected an .npz archive of arrays, but it cannot be read "
                         f"({type(err).__name__}: {err}); {how}") from err
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise UsageError(f"{path}: expected an .npz archive of arrays, got a single .npy "
                         f"array; {how}")
    with loaded as archive:
        for name in archive.files:
            try:
                archive[name]
            except Exception as err:  # an object array, a damaged entry
                raise UsageError(f"{path}: entry {name!r} cannot be read as a plain array "
                                 f"({type(err).__name__}: {err}); {how}") from err


def _verify(graph, path: str):
    from graphc.ir import VerifyError, verify

    try:
        return verify(graph)
    except VerifyError as err:
        raise UsageError(f"{path}: {err}") from err


def _tool(module: str, name: str, command: str):
    """Import `module.name` when a command needs it; a clear error where it is missing."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise UsageError(f"graphc {command} needs {module}.{name}, which this installation "
                         f"lacks ({type(err).__name__}: {err})") from err


# ---- commands --------------------------------------------------------------------------------
def cmd_dump(args) -> int:
    from graphc.ir.printer import format_graph

    graph = _trace(args.target)
    text = format_graph(graph)
    if args.out is None:
        print(text)
        return 0
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{graph.name}.gir")
    with open(path, "w") as f:
        f.write(text + "\n")
    print(f"wrote {path}")
    return 0


def cmd_viz(args) -> int:
    if args.target.endswith(".gir"):
        graph = _read_gir(args.target)
        default = os.path.splitext(args.target)[0] + ".svg"
    else:
        graph = _trace(args.target)
        default = f"{graph.name}.svg"
    if args.memory:
        return _viz_memory(graph, args.output or default.replace(".svg", ".memory.png"))
    if args.explorer:
        write = _tool("graphc.tools.model_explorer", "write_explorer_files", "viz --explorer")
        written = write(graph, args.output or default.replace(".svg", ".mx.json"))
        print(f"wrote {', '.join(written)}; open with: model-explorer {written[0]} "
              f"--node_data_paths={written[1]}")
        if args.serve:
            try:
                _tool("graphc.tools.model_explorer", "serve", "viz --serve")(written)
            except ImportError as err:
                raise UsageError(str(err)) from err
        return 0
    if args.html or (args.output or "").endswith(".html"):
        out = args.output or default.replace(".svg", ".html")
        _tool("graphc.tools.viewer", "render_html", "viz --html")(graph, out)
        print(f"wrote {out}")
        return 0
    out = args.output or default
    render_svg = _tool("graphc.ir.export", "render_svg", "viz")
    render_svg(graph, out)
    print(f"wrote {out}")
    return 0


def _viz_memory(graph, out: str) -> int:
    """Fuse and plan the graph, print the memory report, draw buffers over the schedule."""
    from graphc.passes import run_pipeline
    from graphc.passes.fuse import fuse
    from graphc.passes.plan import plan_buffers
    from graphc.tools.memory_viz import render_memory

    planned, _ = run_pipeline(graph, [fuse, plan_buffers])
    plan = planned.meta["memory_plan"]
    print(plan.report)
    render_memory(plan, out)
    print(f"wrote {out}")
    return 0


def summarize(a: np.ndarray) -> str:
    """A short description of an array's values: range and mean, NaN/inf counts."""
    a = np.asarray(a)
    if a.size == 0:
        return "empty"
    if a.dtype == np.bool_:
        return f"true={int(a.sum())}/{a.size}"
    finite = a[np.isfinite(a)] if a.dtype.kind == "f" else a
    parts = []
    if finite.size:
        parts.append(f"min={finite.min():.6g} max={finite.max():.6g} "
                     f"mean={finite.astype(np.float64).mean():.6g}")
    if a.dtype.kind == "f":
        nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        parts += [f"nan={nan}"] * bool(nan) + [f"inf={inf}"] * bool(inf)
    return " ".join(parts)


def _labelled_results(graph, results) -> list[tuple[str, np.ndarray]]:
    """(label, array) for what run_repro returned: a dict, or outputs then updated inputs."""
    if isinstance(results, dict):
        return [(str(k), np.asarray(v)) for k, v in results.items()]
    results = list(results)
    labels = [f"out{i}" for i in range(len(graph.outputs))]
    labels += [f"update.{target.name}" for target, _ in graph.updates]
    labels += [f"result{i}" for i in range(len(labels), len(results))]
    return [(label, np.asarray(r)) for label, r in zip(labels, results)]


def cmd_run(args) -> int:
    graph = _verify(_read_gir(args.gir), args.gir)
    _check_npz(args.inputs)
    run_repro = _tool("graphc.testing.repro", "run_repro", "run")
    try:
        results = run_repro(args.gir, args.inputs, args.backend)
    except GraphcError as err:
        raise UsageError(f"running {args.gir}: {type(err).__name__}: {err}") from err
    labelled = _labelled_results(graph, results)
    width = max((len(label) for label, _ in labelled), default=0)
    for label, a in labelled:
        print(f"{label.ljust(width)}  {a.shape} {a.dtype}  {summarize(a)}")
    if args.out:
        np.savez(args.out, **dict(labelled))
        print(f"wrote {args.out}")
    return 0


def cmd_check(args) -> int:
    fn, inputs = load_builder(args.target)
    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    if not backends:
        raise UsageError(f"--backends {args.backends!r}: name at least one backend")
    assert_compiled_matches = _tool("graphc.testing", "assert_compiled_matches", "check")
    options = {"repro_dir": args.repro_dir} if args.repro_dir else {}
    try:
        assert_compiled_matches(fn, *inputs, backends=backends, grads=not args.no_grads,
                                **options)
    except AssertionError as err:
        print(f"MISMATCH {args.target} ({', '.join(backends)})")
        print(err)
        return 1
    except GraphcError as err:
        raise UsageError(f"checking {args.target} failed: {type(err).__name__}: {err}") from err
    print(f"OK {args.target} ({', '.join(backends)})")
    return 0


def cmd_profile(args) -> int:
    """Compile the builder's function on cpu, time every kernel; the table and a trace."""
    fn, inputs = load_builder(args.target)
    profile_builder = _tool("graphc.tools.profile", "profile_builder", "profile")
    try:
        report = profile_builder(fn, inputs, repeat=args.repeat)
    except GraphcError as err:
        raise UsageError(f"profiling {args.target} failed: {type(err).__name__}: {err}") from err
    print(report.table(args.limit))
    trace = report.chrome_trace(args.trace or f"{report.graph_name}.trace.json")
    print(f"wrote {trace} (open it in ui.perfetto.dev or chrome://tracing)")
    if args.explorer:
        write = _tool("graphc.tools.model_explorer", "write_explorer_files", "profile")
        written = write(report.graph, args.explorer, report)
        print(f"wrote {', '.join(written)}")
    return 0


def cmd_cache(args) -> int:
    """Every backend's cache: the cpu objects and the cuda modules."""
    import graphc.backends.cpu.llvm  # noqa: F401  (each registers its caches in cache.ALL)
    import graphc.backends.cuda.compile  # noqa: F401
    from graphc.backends.cache import ALL

    if args.action == "clear":
        print(f"removed {sum(cache.clear() for cache in ALL)} entries")
        return 0
    for cache in ALL:
        info = cache.info()
        total, rate = info["total"] or {}, info["hit_rate"]
        print(f"{cache.name} ({cache.suffix}): path: {info['path']}; entries: "
              f"{info['entries']}; bytes: {info['bytes']} of {info['max_bytes']}; hit rate: "
              + (f"{rate:.1%} ({total['hits']} hits, {total['misses']} misses, "
                 f"{total['evicted']} evicted)" if rate is not None else "-"))
    return 0


def cmd_demo(args) -> int:
    from graphc.tools.demo import DemoError, options_from, run

    try:
        return run(options_from(args))
    except KeyboardInterrupt:
        print("\ngraphc demo: interrupted", file=sys.stderr)
        return 130
    except DemoError as err:
        message = " ".join(line.strip() for line in str(err).splitlines())
        print(f"graphc demo: error: {message}", file=sys.stderr)
        return err.exit_code


def cmd_build_runtime(args) -> int:
    try:
        from graphc.backends.cuda.build import main as build_main
    except ImportError as err:
        print(f"graphc build-runtime: error: this installation has no CUDA runtime builder "
              f"(graphc.backends.cuda.build: {err}); update graphc to a version that has it",
              file=sys.stderr)
        return 1
    return build_main(args.builder_args)


def cmd_ops(args) -> int:
    from graphc.ops.__main__ import print_ops

    print_ops(markdown=args.markdown)
    return 0


# ---- the parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from graphc.tools.demo import add_arguments as add_demo_arguments

    parser = _Parser(prog="graphc", description="graphc command line")
    sub = parser.add_subparsers(dest="command", required=True)

    ops = sub.add_parser("ops", help="list every op in the registry and where its rules live")
    ops.add_argument("--markdown", action="store_true", help="print a markdown table")
    ops.set_defaults(run=cmd_ops)

    cache = sub.add_parser("cache", help="show or clear the CPU backend's object-code cache "
                                         "(GRAPHC_CACHE_DIR)")
    cache.add_argument("action", choices=("info", "clear"))
    cache.set_defaults(run=cmd_cache)

    dump = sub.add_parser("dump", help="trace FILE.py:builder and print its IR")
    dump.add_argument("target", metavar="FILE.py:builder")
    dump.add_argument("--out", metavar="DIR", help="write DIR/<graph name>.gir instead")
    dump.set_defaults(run=cmd_dump)

    viz = sub.add_parser("viz", help="draw a graph (traced from a builder, or a .gir) as SVG")
    viz.add_argument("target", metavar="FILE.py:builder|FILE.gir")
    viz.add_argument("-o", "--output", metavar="OUT.svg",
                     help="where to write (default: FILE.svg for a .gir, <graph>.svg here)")
    viz.add_argument("--memory", action="store_true",
                     help="fuse and plan the graph, then draw its buffers over the schedule "
                          "(PNG or SVG by the output's extension; default <graph>.memory.png)")
    viz.add_argument("--html", action="store_true",
                     help="write the interactive HTML viewer (zoom, search, collapse; "
                          "default <graph>.html); also chosen by an -o ending in .html")
    viz.add_argument("--explorer", action="store_true",
                     help="write Google Model Explorer's JSON graph (<graph>.mx.json) and a "
                          "bytes overlay (<graph>.bytes.json)")
    viz.add_argument("--serve", action="store_true",
                     help="with --explorer: then start Model Explorer on them (needs the "
                          "explorer extra; Ctrl+C stops it)")
    viz.set_defaults(run=cmd_viz)

    prof = sub.add_parser("profile", help="compile FILE.py:builder's step on cpu and time "
                                          "every kernel: a table and a Chrome/Perfetto trace",
                          description="builder() returns (fn, inputs): fn a function (a "
                          "training step or any function of tensors, profiled with grad mode "
                          "on) or an nn.Module (its forward, under no_grad). See "
                          "docs/viewing.md.")
    prof.add_argument("target", metavar="FILE.py:builder")
    prof.add_argument("--repeat", type=int, default=20, help="timed runs (default 20)")
    prof.add_argument("--trace", metavar="OUT.json",
                      help="the Chrome/Perfetto trace (default <graph>.trace.json)")
    prof.add_argument("--limit", type=int, default=None, help="table rows (default all)")
    prof.add_argument("--explorer", metavar="OUT.mx.json",
                      help="also write the Model Explorer graph with time and bytes overlays")
    prof.set_defaults(run=cmd_profile)

    run = sub.add_parser("run", help="run a saved .gir graph on inputs from a .npz file")
    run.add_argument("gir", metavar="FILE.gir")
    run.add_argument("--inputs", required=True, metavar="FILE.npz")
    run.add_argument("--backend", default="interp")
    run.add_argument("--out", metavar="OUT.npz", help="save the outputs")
    run.set_defaults(run=cmd_run)

    launch.add_parser(sub)

    check = sub.add_parser("check", help="compare eager, interpreter and backends on a builder")
    check.add_argument("target", metavar="FILE.py:builder")
    check.add_argument("--backends", default="interp", help="comma-separated (default: interp)")
    check.add_argument("--no-grads", action="store_true", help="compare forward outputs only")
    check.add_argument("--repro-dir", metavar="DIR",
                       help="where a mismatch's repro goes (default: a fresh temporary dir)")
    check.set_defaults(run=cmd_check)

    demo = sub.add_parser("demo", help="train a small CNN on scikit-learn's digits with a "
                                       "compiled training step; writes graphc-out/demo",
                          description="Train a small CNN on scikit-learn's digits (no "
                          "download) with the whole training step compiled by graphc; print "
                          "accuracy, compile time and step times against eager graphc and "
                          "PyTorch; write the IR after each pass, an SVG of the step and a "
                          "PNG of its memory plan to --out.")
    add_demo_arguments(demo)
    demo.set_defaults(run=cmd_demo)

    # Its options (--help included) belong to the builder: main() hands them over unparsed.
    build = sub.add_parser("build-runtime", add_help=False,
                           help="build the CUDA runtime library (graphc build-runtime --help)")
    build.set_defaults(run=cmd_build_runtime)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "build-runtime":
        args.builder_args = extra
    elif extra:
        prog = f"{parser.prog} {args.command}"
        parser.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extra)} "
                       f"(see {prog} --help)\n")
    try:
        return args.run(args)
    except BrokenPipeError:  # `graphc dump ... | head`: stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except UsageError as err:
        message = " ".join(line.strip() for line in str(err).splitlines())
        print(f"graphc {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
