"""Fuzz the IR parser with mutated `.gir` files: any text gives a Graph, a ParseError or, for
a graph that parses, a Graph or a VerifyError from `verify`; never another exception.

The seeds are real printed graphs: every `.gir` fixture of the test suite, and a traced graph
with a `function` line (a custom autograd.Function region) and an in-place update. Each case
applies one to three mutations, chosen by a numpy Generator seeded from the test id and the
case number, so a failure names the case and reruns alone (`_case(seed, i)`):
byte flips, truncations, duplicated, deleted and swapped lines, a number made huge, a
deeply nested tuple, random unicode, tokens of the grammar in random places, and spliced
pieces of other seeds. `CASES` cases per run, in a few seconds.
"""

from __future__ import annotations

import pathlib
import time
import zlib

import numpy as np
import pytest

import graphc
from graphc.autograd import Function
from graphc.ir import Graph, ParseError, VerifyError, format_graph, parse, verify
from graphc.jit.tracer import trace_call

CASES = 2400
FIXTURES = pathlib.Path(__file__).parent / "fixtures"

_GRAMMAR_TOKENS = [
    "(", ")", "[", "]", "{", "}", ",", ":", "=", "->", "<-", "#", "%", "@", '"', "\\",
    "%0", "%x", "@g", "f32", "i64", "bool", "f64[", "function", "return", "graph", "opaque",
    "nodes=", 'class="', "ctx.", "inf", "-inf", "nan", "none", "true", "1e999", "-0", "0.",
    "\n", "\t", "\r", " ", "\x00", "\\u", '"\\q"', "ctx._saved=1",
]
_UNICODE = ["é", "∞", "٣", "²", "\u200b", "\ud800", "\U0001f600", "\ufeff", "Ω", "\u2028"]


class Scale(Function):
    """A registered Function, so that a seed graph carries a `function` line."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        ctx.save_for_backward(x)
        return x * alpha

    @staticmethod
    def backward(ctx, g):
        return g * ctx.alpha, None


def _traced_seed() -> str:
    def f(x, w):
        y = Scale.apply(x.exp(), 1.5)
        w.add_(y.sum())
        return (y @ w.reshape(3, 1)).relu()

    graph = trace_call(f, (graphc.ones(2, 3), graphc.ones(3))).graph
    return format_graph(graph)


def _seeds() -> list[str]:
    texts = [p.read_text() for p in sorted(FIXTURES.rglob("*.gir"))]
    return texts + [_traced_seed()]


# ---- mutations: text -> text (bytes for the byte-level ones) --------------------------------
def _flip_bytes(rng, data: bytes, _seeds) -> bytes:
    data = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        if data:
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
    return bytes(data)


def _truncate(rng, data: bytes, _seeds) -> bytes:
    return data[:int(rng.integers(len(data) + 1))]


def _lines_op(rng, data: bytes, _seeds) -> bytes:
    lines = data.split(b"\n")
    i, j = (int(k) for k in rng.integers(len(lines), size=2))
    op = int(rng.integers(3))
    if op == 0:
        lines.insert(j, lines[i])  # duplicate
    elif op == 1 and len(lines) > 1:
        del lines[i]  # delete
    else:
        lines[i], lines[j] = lines[j], lines[i]  # swap
    return b"\n".join(lines)


def _huge_number(rng, data: bytes, _seeds) -> bytes:
    digits = [k for k, c in enumerate(data) if 48 <= c <= 57]
    if not digits:
        return data
    k = digits[int(rng.integers(len(digits)))]
    huge = [b"9" * int(rng.choice([20, 65, 400, 5000])), b"1e999999", b"-" + b"7" * 5000,
            b"18446744073709551616", b"9223372036854775808", b"0" * 300 + b"1",
            b"1." + b"5" * 5000][int(rng.integers(7))]
    return data[:k] + huge + data[k + 1:]


def _deep_nesting(rng, data: bytes, _seeds) -> bytes:
    depth = int(rng.choice([30, 63, 64, 65, 200, 5000, 100000]))
    nested = b"(" * depth + b"1" + b",)" * int(rng.integers(depth + 1))
    k = data.find(b"[")
    k = k if k >= 0 and rng.random() < 0.8 else int(rng.integers(len(data) + 1))
    if rng.random() < 0.5:  # as an attribute value
        return data[:k + 1] + b"a=" + nested + b", " + data[k + 1:]
    return data[:k] + nested + data[k:]


def _unicode(rng, data: bytes, _seeds) -> bytes:
    text = data.decode("utf-8", "replace")
    for _ in range(int(rng.integers(1, 4))):
        k = int(rng.integers(len(text) + 1))
        text = text[:k] + str(rng.choice(_UNICODE)) + text[k:]
    return text.encode("utf-8", "surrogatepass")


def _grammar_tokens(rng, data: bytes, _seeds) -> bytes:
    text = data.decode("utf-8", "replace")
    for _ in range(int(rng.integers(1, 4))):
        k = int(rng.integers(len(text) + 1))
        cut = int(rng.integers(3)) if rng.random() < 0.5 else 0
        text = text[:k] + str(rng.choice(_GRAMMAR_TOKENS)) + text[k + cut:]
    return text.encode("utf-8", "surrogatepass")


def _splice(rng, data: bytes, seeds) -> bytes:
    other = seeds[int(rng.integers(len(seeds)))].encode()
    a, b = sorted(int(k) for k in rng.integers(len(other) + 1, size=2))
    k = int(rng.integers(len(data) + 1))
    return data[:k] + other[a:b] + data[k:]


MUTATIONS = [_flip_bytes, _truncate, _lines_op, _huge_number, _deep_nesting, _unicode,
             _grammar_tokens, _splice]


def _case(seed: int, i: int, seeds: list[str]) -> bytes:
    rng = np.random.default_rng([seed, i])
    data = seeds[i % len(seeds)].encode()
    for _ in range(int(rng.integers(1, 4))):
        data = MUTATIONS[int(rng.integers(len(MUTATIONS)))](rng, data, seeds)
    return data


def _outcome(data: bytes, as_bytes: bool) -> str:
    """'graph', 'parse' or 'verify'; any other exception propagates. The text goes to `parse`
    as bytes, or as a str in which undecodable bytes are lone surrogates."""
    text = data if as_bytes else data.decode("utf-8", "surrogateescape")
    try:
        graph = parse(text)
    except ParseError as err:
        message = str(err)
        assert message.startswith("line "), message
        return "parse"
    assert isinstance(graph, Graph)
    try:
        verify(graph)
    except VerifyError:
        return "verify"
    return "graph"


def test_seeds_round_trip():
    for text in _seeds():
        graph = parse(text)
        assert format_graph(parse(format_graph(graph))) == format_graph(graph)


def test_mutated_gir_files_give_a_graph_a_parse_error_or_a_verify_error(request):
    seed = zlib.crc32(request.node.nodeid.encode())
    seeds = _seeds()
    counts = {"graph": 0, "parse": 0, "verify": 0}
    start = time.perf_counter()
    for i in range(CASES):
        data = _case(seed, i, seeds)
        try:
            counts[_outcome(data, as_bytes=i % 2 == 0)] += 1
        except Exception as err:  # report the case so that it reruns alone
            pytest.fail(f"case {i} (seed {seed}): {type(err).__name__}: {err}\n"
                        f"text: {data[:2000]!r}")
    elapsed = time.perf_counter() - start
    assert sum(counts.values()) == CASES >= 2000
    assert counts["parse"] > CASES // 2 and counts["graph"] + counts["verify"] > 50, counts
    assert elapsed < 60, f"{CASES} cases took {elapsed:.1f} s"
