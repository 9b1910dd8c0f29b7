"""Parse the IR text form back into a Graph: `parse(format_graph(g)) == g`.

The grammar (whitespace between tokens is free; `#` starts the node's source location):

    graph   := 'graph' '@' NAME '(' [param {',' param}] ')' '->' '(' [type {',' type}] ')'
               '{' {node | function} {update} 'return' '(' [value {',' value}] ')' '}'
    function := 'function' NAME '[' NAME '=' item {',' NAME '=' item} ']'
                '(' [item {',' item}] ')' '->' '(' [item {',' item}] ')'
    item    := value | literal | 'opaque' '(' STRING ')' | '(' [item {',' item} [',']] ')'
    update  := value '<-' value                        (an in-place write to a graph input)
    param   := value ':' type
    type    := DTYPE '[' [INT {',' INT}] ']'          DTYPE: f32 f64 i64 bool
    node    := value ':' type {',' value ':' type} '=' OP [attrs] '(' [value {',' value}] ')'
    attrs   := '[' NAME '=' literal {',' NAME '=' literal} ']'
    literal := INT | FLOAT | STRING | true | false | none | inf | -inf | nan | NAME
               | '(' [literal {',' literal} [',']] ')'

A `function` line (a custom autograd.Function's region, see graphc.ir.printer) becomes a
`FunctionRegion` in `graph.meta["functions"]`, positioned after the nodes parsed before it.
Errors name the line and column and what was expected.
"""

from __future__ import annotations

import json
import re
from typing import Any

from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import MISSING, FunctionRegion, Opaque
from graphc.types import TensorType, as_dtype


class ParseError(GraphcError, ValueError):
    """Malformed IR text; the message gives line and column."""


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+)
  | (?P<nl>\n)
  | (?P<comment>\#[^\n]*)
  | (?P<value>%[A-Za-z0-9_.]+)
  | (?P<gname>@[A-Za-z0-9_.]+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+|inf\b))
  | (?P<arrow>->)
  | (?P<larrow><-)
  | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[()\[\]{}:,=])
""", re.VERBOSE)


class _Token:
    __slots__ = ("kind", "text", "line", "col")

    def __init__(self, kind: str, text: str, line: int, col: int) -> None:
        self.kind, self.text, self.line, self.col = kind, text, line, col

    def __repr__(self) -> str:
        return repr(self.text) if self.kind != "eof" else "end of input"


def _tokenize(text: str) -> list[_Token]:
    tokens, pos, line, line_start = [], 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"line {line}, column {pos - line_start + 1}: unexpected "
                             f"character {text[pos]!r}")
        kind = m.lastgroup
        if kind == "nl":
            tokens.append(_Token("nl", "\n", line, pos - line_start + 1))
            line, line_start = line + 1, m.end()
        elif kind != "ws":
            tokens.append(_Token(kind, m.group(), line, pos - line_start + 1))
        pos = m.end()
    tokens.append(_Token("eof", "", line, pos - line_start + 1))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0
        self.values: dict[str, Value] = {}

    # ---- token helpers ---------------------------------------------------------------------
    def peek(self, skip_newlines: bool = True) -> _Token:
        while skip_newlines and self.tokens[self.pos].kind in ("nl", "comment"):
            self.pos += 1
        return self.tokens[self.pos]

    def fail(self, tok: _Token, expected: str):
        raise ParseError(f"line {tok.line}, column {tok.col}: expected {expected}, got {tok!r}")

    def take(self, kind: str | None = None, text: str | None = None) -> _Token:
        tok = self.peek()
        if (kind and tok.kind != kind) or (text and tok.text != text):
            self.fail(tok, repr(text) if text else kind)
        self.pos += 1
        return tok

    def accept(self, text: str) -> bool:
        if self.peek().text == text:
            self.pos += 1
            return True
        return False

    def comma_list(self, close: str, item) -> list:
        out = []
        if self.accept(close):
            return out
        while True:
            out.append(item())
            if self.accept(close):
                return out
            self.take("punct", ",")

    # ---- grammar ---------------------------------------------------------------------------
    def graph(self) -> Graph:
        self.take("name", "graph")
        name = self.take("gname").text[1:]
        self.take("punct", "(")
        inputs = self.comma_list(")", self.param)
        self.take("arrow")
        self.take("punct", "(")
        result_types = self.comma_list(")", self.type)
        self.take("punct", "{")
        nodes, updates, regions = [], [], []
        while self.peek().text != "return":
            if self.tokens[self.pos + 1].kind == "larrow" and self.peek().kind == "value":
                updates.append(self.update())
            elif self.peek().text == "function":
                regions.append(self.function(len(nodes)))
            else:
                nodes.append(self.node())
        self.take("name", "return")
        self.take("punct", "(")
        outputs = self.comma_list(")", self.use)
        self.take("punct", "}")
        if self.peek().kind != "eof":
            self.fail(self.peek(), "end of input after the graph")
        got = [v.type for v in outputs]
        if got != result_types:
            raise ParseError(f"graph @{name}: return types {[str(t) for t in got]} differ from "
                             f"the declared {[str(t) for t in result_types]}")
        graph = Graph(name, inputs, nodes, outputs, updates)
        if regions:
            graph.meta["functions"] = regions
        return graph

    def function(self, end: int) -> FunctionRegion:
        start = self.take("name", "function")
        self.take("name")  # the class's short name, for people; `class` is the definition
        self.take("punct", "[")
        attrs = dict(self.comma_list("]", self.function_attr))
        if not isinstance(attrs.get("class"), str) or not isinstance(attrs.get("nodes"), int):
            raise ParseError(f"line {start.line}, column {start.col}: a function line needs "
                             'class="module:qualname" and nodes=<count> attributes')
        self.take("punct", "(")
        args = tuple(self.comma_list(")", self.item))
        self.take("arrow")
        self.take("punct", "(")
        outputs = tuple(self.comma_list(")", self.item))
        loc = None
        tok = self.tokens[self.pos]
        if tok.kind == "comment":
            loc = tok.text[1:].strip() or None
            self.pos += 1
        ctx = {k[len("ctx."):]: v for k, v in attrs.items() if k.startswith("ctx.")}
        return FunctionRegion(
            attrs["class"], args, outputs, end, attrs["nodes"], saved=attrs.get("saved", ()),
            ctx=ctx, non_differentiable=attrs.get("non_differentiable", ()),
            dirty=attrs.get("dirty", ()), materialize_grads=attrs.get("materialize_grads", True),
            loc=loc)

    def function_attr(self) -> tuple[str, Any]:
        key = self.take("name").text
        self.take("punct", "=")
        return key, self.item()

    def item(self) -> Any:
        """A literal that may also hold values (`%x`) and `opaque("TypeName")`."""
        tok = self.peek()
        if tok.kind == "value":
            return self.use()
        if tok.text == "opaque" and self.tokens[self.pos + 1].text == "(":
            self.pos += 2
            type_name = json.loads(self.take("string").text)
            self.take("punct", ")")
            return Opaque(type_name, MISSING)
        if tok.text != "(":
            return self.literal()
        self.pos += 1
        items = []
        while not self.accept(")"):
            items.append(self.item())
            if not self.accept(","):
                self.take("punct", ")")
                break
        return tuple(items)

    def update(self) -> tuple[Value, Value]:
        target = self.use()
        self.take("larrow")
        return target, self.use()

    def param(self) -> Value:
        return self.define()

    def define(self) -> Value:
        tok = self.take("value")
        name = tok.text[1:]
        if name in self.values:
            raise ParseError(f"line {tok.line}, column {tok.col}: %{name} is defined twice")
        self.take("punct", ":")
        v = Value(name, self.type())
        self.values[name] = v
        return v

    def use(self) -> Value:
        tok = self.take("value")
        name = tok.text[1:]
        if name not in self.values:
            raise ParseError(f"line {tok.line}, column {tok.col}: %{name} is used before it "
                             "is defined")
        return self.values[name]

    def type(self) -> TensorType:
        tok = self.take("name")
        try:
            dtype = as_dtype(tok.text)
        except TypeError:
            self.fail(tok, "a dtype (f32, f64, i64, bool)")
        self.take("punct", "[")
        dims = self.comma_list("]", self.dim)
        return TensorType(tuple(dims), dtype)

    def dim(self) -> int:
        tok = self.take("number")
        if not tok.text.isdigit():
            self.fail(tok, "a non-negative integer dimension")
        return int(tok.text)

    def node(self) -> Node:
        outputs = [self.define()]
        while self.accept(","):
            outputs.append(self.define())
        self.take("punct", "=")
        op = self.take("name").text
        attrs: dict[str, Any] = {}
        if self.accept("["):
            for key, value in self.comma_list("]", self.attr):
                attrs[key] = value
        self.take("punct", "(")
        inputs = self.comma_list(")", self.use)
        loc = None
        tok = self.tokens[self.pos]
        if tok.kind == "comment":
            loc = tok.text[1:].strip() or None
            self.pos += 1
        return Node(op, inputs, attrs, outputs, loc)

    def attr(self) -> tuple[str, Any]:
        key = self.take("name").text
        self.take("punct", "=")
        return key, self.literal()

    def literal(self) -> Any:
        tok = self.peek()
        if tok.text == "(":
            self.pos += 1
            items = []
            while not self.accept(")"):
                items.append(self.literal())
                if not self.accept(","):
                    self.take("punct", ")")
                    break
            return tuple(items)
        self.pos += 1
        if tok.kind == "number":
            text = tok.text
            if text.lstrip("-").isdigit():
                return int(text)
            return float(text)
        if tok.kind == "string":
            return json.loads(tok.text)
        if tok.kind == "name":
            return {"true": True, "false": False, "none": None, "nan": float("nan"),
                    "inf": float("inf")}.get(tok.text, tok.text)
        self.fail(tok, "a literal")


def parse(text: str) -> Graph:
    """Parse IR text into a Graph (see the module docstring for the grammar)."""
    return _Parser(text).graph()
