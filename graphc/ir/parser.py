"""Parse the IR text form back into a Graph: `parse(format_graph(g)) == g`.

The grammar (whitespace between tokens is free; `#` starts the node's source location):

    graph   := 'graph' '@' NAME '(' [param {',' param}] ')' '->' '(' [type {',' type}] ')'
               '{' {node | function} {update} 'return' '(' [value {',' value}] ')' '}'
    function := 'function' NAME '[' NAME '=' item {',' NAME '=' item} ']'
                '(' [item {',' item}] ')' '->' '(' [item {',' item}] ')'
    item    := value | literal | 'opaque' '(' STRING ')' | '(' [item {',' item} [',']] ')'
    update  := value '<-' value                        (an in-place write to a graph input)
    param   := value ':' type
    type    := DTYPE '[' [dim {',' dim}] ']'          DTYPE: f32 f64 i64 bool
    dim     := INT | SYM
    SYM     := a symbolic size, no blanks: symbols s<N> with integer coefficients, '*', '+'
               and '-' (`s0`, `s0*784`, `s0-1`, `s0*s1*2+3`); see graphc.symbolic
    node    := value ':' type {',' value ':' type} '=' OP [attrs] '(' [value {',' value}] ')'
    attrs   := '[' NAME '=' literal {',' NAME '=' literal} ']'
    literal := INT | SYM | FLOAT | STRING | true | false | none | inf | -inf | nan | NAME
               | '(' [literal {',' literal} [',']] ')'

A `function` line (a custom autograd.Function's region, see graphc.ir.printer) becomes a
`FunctionRegion` in `graph.meta["functions"]`, positioned after the nodes parsed before it.
Its `class` must name a Function class that is already registered (its module imported by
the user's code): parsing never imports anything.

Any text gives either a Graph or a `ParseError` naming the line and column, what was
expected, what came and what to do. Untrusted text cannot exhaust the parser: tuples nest at
most `MAX_DEPTH` deep, a number has at most `MAX_NUMBER_CHARS` characters, a dimension is at
most `MAX_DIM`. Tokens are read one at a time from the text (`_scan`), so an error stops the
work where it is found and memory follows the graph, not the token count.

Quick reads: a node line as graphc.ir.printer writes it (`_Parser.node`) is read by offsets,
one regular expression per part (its head, its inputs), a tuple literal in one loop
(`_quick_tuple`), and an attribute list whose text the parse has read before (fused bodies
repeat) is looked up. Each quick read accepts only text on which `_TOKEN` reads the same
tokens, and stops, consuming nothing, at anything else; the token-by-token read then goes on
from there and reports any error, so `parse(text, quick=False)` gives the same graphs and
errors (tests/test_parser_quick.py). A planned training graph (the pipeline cache's entries,
graphc.jit.pipeline_cache) parses ~4x faster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from graphc.errors import GraphcError
from graphc.ir.graph import Graph, Node, Value
from graphc.ir.printer import MISSING, FunctionRegion, Opaque, registered_function_class
from graphc.symbolic import Sym, parse_sym
from graphc.types import ALL_DTYPES, TensorType

MAX_DEPTH = 64  # nested tuples in one literal or function item
MAX_NUMBER_CHARS = 64  # characters in one number; int64, uint64 and every float repr fit
MAX_DIM = 2**63 - 1  # a dimension is an int64

_DTYPES = {d.short: d for d in ALL_DTYPES}
_NAMED_LITERALS = {"true": True, "false": False, "none": None, "nan": float("nan"),
                   "inf": float("inf")}
_REGION_KEYS = ("class", "nodes", "saved", "non_differentiable", "dirty", "materialize_grads")
# FunctionCtx's own attributes: a `ctx.` entry may not overwrite them.
_CTX_INTERNAL = ("_saved", "_dirty", "_non_differentiable", "needs_input_grad",
                 "materialize_grads", "_node_name")
_SYNTAX_HINT = "fix the text there (docs/ir.md has the grammar)"


class ParseError(GraphcError, ValueError):
    """Malformed IR text; the message gives line and column."""


# Each match is one token and the blanks before it; `bad` catches any other character, so the
# scan never skips text. Strings stay on one line. A type as the printer writes it (`f32[2,3]`,
# no blanks, short dims) is one token, for speed; any other spelling is read token by token.
_TOKEN = re.compile(r"""
    [ \t\r]*
    (?:
      (?P<nl>\n)
    | (?P<comment>\#[^\n]*)
    | (?P<value>%[A-Za-z0-9_.]+)
    | (?P<gname>@[A-Za-z0-9_.]+)
    | (?P<string>"(?:[^"\\\n]|\\[^\n])*")
    | (?P<badstring>"[^\n]*)
    | (?P<sym>-?(?:[0-9]+\*)*s[0-9]+(?:\*(?:s[0-9]+|[0-9]+))*
             (?:[+-](?:s[0-9]+|[0-9]+)(?:\*(?:s[0-9]+|[0-9]+))*)*(?![A-Za-z0-9_.]))
    | (?P<number>-?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|[0-9]+|inf\b))
    | (?P<type>(?:f32|f64|i64|bool)\[(?:[0-9]{1,19}(?:,[0-9]{1,19})*)?\])
    | (?P<arrow>->)
    | (?P<larrow><-)
    | (?P<name>[A-Za-z_][A-Za-z0-9_.]*)
    | (?P<punct>[()\[\]{}:,=])
    | (?P<eof>\Z)
    | (?P<bad>.)
    )
""", re.VERBOSE)

# A token: (kind, text, line, column, offset of its first character in the text).
Token = tuple[str, str, int, int, int]


def _scan(text: str, pos: int = 0, line: int = 1, line_start: int = 0) -> Iterator[Token]:
    """The tokens of `text` from `pos` (on line `line`, which starts at `line_start`), one at
    a time, newlines left out; ends with an `eof` token."""
    for m in _TOKEN.finditer(text, pos):
        kind = m.lastgroup
        start = m.start(kind)
        if kind == "nl":
            line, line_start = line + 1, start + 1
            continue
        col = start - line_start + 1
        if kind == "bad":
            raise ParseError(f"line {line}, column {col}: unexpected character "
                             f"{m.group(kind)!r}; IR text holds only the tokens of the "
                             f"grammar: {_SYNTAX_HINT}")
        if kind == "badstring":
            raise ParseError(f"line {line}, column {col}: unterminated string: expected a "
                             "closing '\"' on the same line; close the string")
        yield kind, m.group(kind), line, col, start
        if kind == "eof":
            return


def _show(tok: Token) -> str:
    if tok[0] == "eof":
        return "end of input"
    text = tok[1]
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


def _where(tok: Token) -> str:
    return f"line {tok[2]}, column {tok[3]}"


class _Parser:
    def __init__(self, text: str, require_registered: bool = True, quick: bool = True) -> None:
        self.require_registered = require_registered
        self.quick = quick  # False: every token one at a time (no `quick_*` reads)
        self._tokens = _scan(text)
        self._ahead: Token | None = None
        self.comment: Token | None = None  # a comment skipped by the last `advance`
        self.text = text
        self.prev: Token = ("bof", "", 1, 1, 0)  # the token the last `advance` consumed
        self.tok: Token = self._pull()  # the current token
        self.values: dict[str, Value] = {}
        self.types: dict[str, TensorType] = {}  # one-token type text -> its type
        self.literals: dict[str, Any] = {}  # number, string and name texts -> their values
        self.attr_lists: dict[str, dict] = {}  # a node's `[...]` text -> its attributes

    # ---- token helpers ---------------------------------------------------------------------
    def _pull(self) -> Token:
        if self._ahead is not None:
            tok, self._ahead = self._ahead, None
        else:
            tok = next(self._tokens)
        while tok[0] == "comment":
            self.comment = tok
            tok = next(self._tokens)
        return tok

    def advance(self) -> Token:
        """Consume the current token and return it."""
        tok = self.prev = self.tok
        self.comment = None
        if tok[0] != "eof":  # _pull, inlined: this runs once per token
            nxt = self._ahead
            if nxt is None:
                nxt = next(self._tokens)
            else:
                self._ahead = None
            while nxt[0] == "comment":
                self.comment = nxt
                nxt = next(self._tokens)
            self.tok = nxt
        return tok

    def skip_to(self, tok: Token, end: int) -> None:
        """Go on at offset `end`, as if `advance` had consumed every token from `tok` (the
        current one) up to there, all on `tok`'s line (a `quick_*` read)."""
        line, col, start = tok[2], tok[3], tok[4]
        self.prev = ("quick", self.text[start:end], line, col, start)
        self._tokens = _scan(self.text, end, line, start - col + 1)
        self._ahead = self.comment = None
        self.tok = self._pull()

    def lookahead(self) -> Token:
        """The token after the current one (comments skipped), not consumed."""
        if self._ahead is None:
            saved = self.comment
            self._ahead = self._pull()
            self.comment = saved
        return self._ahead

    def fail(self, tok: Token, expected: str, hint: str = _SYNTAX_HINT):
        raise ParseError(f"{_where(tok)}: expected {expected}, got {_show(tok)}; {hint}")

    def refuse(self, tok: Token, what: str, expected: str, hint: str):
        """A token of the right kind that is still wrong: `what` says what came."""
        raise ParseError(f"{_where(tok)}: {what}: expected {expected}; {hint}")

    def take(self, kind: str, text: str | None = None) -> Token:
        tok = self.tok
        if tok[0] != kind or (text is not None and tok[1] != text):
            self.fail(tok, repr(text) if text else _KIND_NAMES[kind])
        return self.advance()

    def accept(self, text: str) -> bool:
        if self.tok[1] == text and self.tok[0] in ("punct", "name"):
            self.advance()
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
            if self.tok[1] != "," or self.tok[0] != "punct":
                self.fail(self.tok, f"',' or {close!r}")
            self.advance()

    def trailing_comment(self) -> str | None:
        """The source location in a comment right after the token just taken, on its line."""
        comment = self.comment
        if comment is None or comment[2] != self.prev[2]:
            return None
        return comment[1][1:].strip() or None

    # ---- grammar ---------------------------------------------------------------------------
    def graph(self) -> Graph:
        self.take("name", "graph")
        name = self.take("gname")[1][1:]
        self.take("punct", "(")
        inputs = self.comma_list(")", self.define)
        self.take("arrow")
        self.take("punct", "(")
        result_types = self.comma_list(")", self.type)
        self.take("punct", "{")
        nodes, updates, regions = [], [], []
        while not (self.tok[0] == "name" and self.tok[1] == "return"):
            kind = self.tok[0]
            if kind == "value" and self.lookahead()[0] == "larrow":
                updates.append(self.update())
            elif kind == "name" and self.tok[1] == "function":
                regions.append(self.function(len(nodes)))
            elif kind == "value":
                nodes.append(self.node())
            else:
                self.fail(self.tok, "a node ('%name: type = op(...)'), a function line, an "
                                    "update ('%input <- %value') or 'return'")
        ret = self.take("name", "return")
        self.take("punct", "(")
        outputs = self.comma_list(")", self.use)
        self.take("punct", "}")
        if self.tok[0] != "eof":
            self.fail(self.tok, "end of input after the graph",
                      "remove the text after the graph's closing '}'")
        got = [v.type for v in outputs]
        if got != result_types:
            raise ParseError(f"{_where(ret)}: graph @{name}: return types "
                             f"{[str(t) for t in got]} differ from the declared "
                             f"{[str(t) for t in result_types]}; make the signature's result "
                             "types match the returned values")
        graph = Graph(name, inputs, nodes, outputs, updates)
        if regions:
            graph.meta["functions"] = regions
        return graph

    def function(self, end: int) -> FunctionRegion:
        start = self.take("name", "function")
        self.take("name")  # the class's short name, for people; `class` is the definition
        self.take("punct", "[")
        attrs, where = {}, {}
        for key, tok, value in self.comma_list("]", self.function_attr):
            if key in attrs:
                self.refuse(tok, f"attribute {key!r} given twice", "each attribute once",
                            "remove one of the two")
            attrs[key], where[key] = value, tok
        self._check_region(start, attrs, where, end)
        self.take("punct", "(")
        args = tuple(self.comma_list(")", self.argument))
        self.take("arrow")
        self.take("punct", "(")
        outputs = tuple(self.comma_list(")", self.argument))
        loc = self.trailing_comment()
        ctx = {k[len("ctx."):]: v for k, v in attrs.items() if k.startswith("ctx.")}
        return FunctionRegion(
            attrs["class"], args, outputs, end, attrs["nodes"], saved=attrs.get("saved", ()),
            ctx=ctx, non_differentiable=attrs.get("non_differentiable", ()),
            dirty=attrs.get("dirty", ()), materialize_grads=attrs.get("materialize_grads", True),
            loc=loc)

    def _check_region(self, start: Token, attrs: dict, where: dict, end: int) -> None:
        """The attributes of a `function` line: known keys, the right kinds of values, and a
        class that is registered (never imported)."""
        for key, tok in where.items():
            if key.startswith("ctx."):
                name = key[len("ctx."):]
                if not name or name in _CTX_INTERNAL or name.startswith("__"):
                    self.refuse(tok, f"{key!r} names what ctx keeps for itself",
                                "ctx.NAME for an attribute the Function set",
                                "remove that attribute")
            elif key not in _REGION_KEYS:
                self.refuse(tok, f"unknown attribute {key!r}",
                            f"one of {', '.join(_REGION_KEYS)} or ctx.NAME",
                            "remove that attribute")
        if not isinstance(attrs.get("class"), str) or type(attrs.get("nodes")) is not int:
            raise ParseError(f"{_where(start)}: a function line needs class=\"module:qualname\" "
                             "and nodes=<count> attributes; add them")
        if not 0 <= attrs["nodes"] <= end:
            self.refuse(where["nodes"], f"nodes={attrs['nodes']}",
                        f"a count from 0 to {end} (the nodes above the line)", "fix the count")
        for key in ("non_differentiable", "dirty"):
            value = attrs.get(key, ())
            if not (isinstance(value, tuple)
                    and all(type(i) is int and i >= 0 for i in value)):
                self.refuse(where[key], f"{key}={value!r}"[:80], "a tuple of output indices",
                            "write a tuple of non-negative ints")
        if not isinstance(attrs.get("saved", ()), tuple):
            self.refuse(where["saved"], "saved is no tuple", "saved=(items)", "write a tuple")
        if type(attrs.get("materialize_grads", True)) is not bool:
            self.refuse(where["materialize_grads"], "materialize_grads is no bool",
                        "materialize_grads=true or false", "write true or false")
        if not self.require_registered:
            return  # a tool that never differentiates keeps the name only
        try:
            registered_function_class(attrs["class"])
        except LookupError as err:
            raise ParseError(f"{_where(where['class'])}: function line: {err}") from None

    def function_attr(self) -> tuple[str, Token, Any]:
        tok = self.take("name")
        self.take("punct", "=")
        return tok[1], tok, self.item(0)

    def argument(self) -> Any:
        """One argument or output of a `function` line."""
        return self.item(0)

    def item(self, depth: int) -> Any:
        """A literal that may also hold values (`%x`) and `opaque("TypeName")`."""
        tok = self.tok
        if tok[0] == "value":
            return self.use()
        if tok[0] == "name" and tok[1] == "opaque" and self.lookahead()[1] == "(":
            self.advance()
            self.advance()
            type_name = self.string(self.take("string"))
            self.take("punct", ")")
            return Opaque(type_name, MISSING)
        if tok[0] != "punct" or tok[1] != "(":
            return self.literal(depth)
        return self.tuple_of(self.item, depth)

    def tuple_of(self, element, depth: int) -> tuple:
        """`(a, b, ...)` with an optional trailing comma; the current token is the '('."""
        if depth >= MAX_DEPTH:
            self.refuse(self.tok, f"tuples nested more than {MAX_DEPTH} deep",
                        f"at most {MAX_DEPTH} levels (the parser's limit)", "flatten the literal")
        self.advance()
        items = []
        while not self.accept(")"):
            items.append(element(depth + 1))
            if not self.accept(","):
                self.take("punct", ")")
                break
        return tuple(items)

    def update(self) -> tuple[Value, Value]:
        target = self.use()
        self.take("larrow")
        return target, self.use()

    def define(self) -> Value:
        tok = self.take("value")
        name = tok[1][1:]
        if name in self.values:
            raise ParseError(f"{_where(tok)}: %{name} is defined twice; rename one of them")
        self.take("punct", ":")
        v = Value(name, self.type())
        self.values[name] = v
        return v

    def use(self) -> Value:
        tok = self.take("value")
        name = tok[1][1:]
        value = self.values.get(name)
        if value is None:
            raise ParseError(f"{_where(tok)}: %{name} is used before it is defined; define it "
                             "above this line or take it as a graph input")
        return value

    def type(self) -> TensorType:
        tok = self.tok
        if tok[0] == "type":
            self.advance()
            return self.compact_type(tok)
        dtype = _DTYPES.get(tok[1]) if tok[0] == "name" else None
        if dtype is None:
            self.fail(tok, "a dtype (f32, f64, i64, bool)")
        self.advance()
        self.take("punct", "[")
        dims = self.comma_list("]", self.dim)
        return TensorType(tuple(dims), dtype)

    def compact_type(self, tok: Token) -> TensorType:
        """The TensorType of a one-token type (`f32[2,3]`); equal texts share one object."""
        ty = self.types.get(tok[1])
        if ty is None:
            short, _, dims = tok[1][:-1].partition("[")
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
            for k, value in enumerate(shape):
                if value > MAX_DIM:
                    digits = dims.split(",")
                    col = tok[3] + len(short) + 1 + sum(len(d) + 1 for d in digits[:k])
                    self.refuse((tok[0], digits[k], tok[2], col, tok[4] + col - tok[3]),
                                f"a dimension of {len(digits[k])} digits",
                                "at most 2**63-1 (the parser's limit)", "use a smaller dimension")
            ty = self.types[tok[1]] = TensorType(shape, _DTYPES[short])
        return ty

    def dim(self) -> int | Sym:
        tok = self.tok
        if tok[0] == "sym":
            return self.symbolic(tok)
        if tok[0] != "number" or not tok[1].isdigit() or not tok[1].isascii():
            self.fail(tok, "a non-negative integer dimension")
        value = self.number(tok)
        if value > MAX_DIM:
            self.refuse(tok, f"a dimension of {len(tok[1])} digits",
                        "at most 2**63-1 (the parser's limit)", "use a smaller dimension")
        return value

    def symbolic(self, tok: Token) -> int | Sym:
        """A symbolic size (`s0*784`), current token; then advance."""
        if len(tok[1]) > MAX_NUMBER_CHARS * 4:
            self.refuse(tok, f"a symbolic size of {len(tok[1])} characters",
                        f"at most {MAX_NUMBER_CHARS * 4} (the parser's limit)",
                        "simplify the expression")
        self.advance()
        try:
            return parse_sym(tok[1])
        except GraphcError as err:
            raise ParseError(f"{_where(tok)}: {err}; {_SYNTAX_HINT}") from None

    def number(self, tok: Token) -> int | float:
        """The value of a number token (current): an int, or a float; then advance."""
        text = tok[1]
        if len(text) > MAX_NUMBER_CHARS:
            self.refuse(tok, f"a number of {len(text)} characters",
                        f"at most {MAX_NUMBER_CHARS} (the parser's limit)", "use a smaller number")
        self.advance()
        if text.lstrip("-").isdigit():
            return int(text)
        return float(text)

    def string(self, tok: Token) -> str:
        try:
            return json.loads(tok[1])
        except ValueError as err:  # a bad escape such as "\q"
            raise ParseError(f"{_where(tok)}: expected a JSON string literal, got {_show(tok)} "
                             f"({err.msg} at character {err.pos}); escape a backslash as "
                             "\\\\") from None

    def node(self) -> Node:
        """A node. A node as the printer writes it is read by offsets from its first token
        (`quick_head`, `known_attributes`, `_QUICK_USES`), the token stream set after it once;
        anything else, from the first part that differs, token by token."""
        first = self.tok
        head = self.quick_head(first) if self.quick else None
        at = None  # the offset reached by the quick reads; None: read the tokens
        if head is None:
            outputs = [self.define()]
            while self.accept(","):
                outputs.append(self.define())
            self.take("punct", "=")
            op = self.take("name")[1]
        else:
            outputs, op, at = head
        attrs: dict[str, Any] = {}
        if at is not None and self.text[at] == "[":
            known, end = self.known_attributes(at)
            if known is None:
                self.skip_to(first, at)
                at = None
            else:
                attrs, at = known, end
        if at is None:
            if self.tok[1] == "[" and self.tok[0] == "punct":
                attrs = self.attributes()
            inputs = self.quick_uses()
        else:
            inputs = None
            m = _QUICK_USES.match(self.text, at)
            if m is not None:
                inputs = self.defined(m.group(1))
                if inputs is not None:
                    at = m.end()
            self.skip_to(first, at)
        if inputs is None:
            self.take("punct", "(")
            inputs = self.comma_list(")", self.use)
        loc = self.trailing_comment()
        return Node(op, inputs, attrs, outputs, loc)

    def attributes(self) -> dict[str, Any]:
        """`[name=literal, ...]`, the current token its '['. A list read token by token on
        one line is kept by its text for `known_attributes` (node attributes repeat)."""
        start = self.tok[4]
        known, end = self.known_attributes(start) if self.quick else (None, start)
        if known is not None:
            self.skip_to(self.tok, end)
            return known
        self.advance()
        attrs: dict[str, Any] = {}
        for key, tok, value in self.comma_list("]", self.attr):
            if key in attrs:
                self.refuse(tok, f"attribute {key!r} given twice", "each attribute once",
                            "remove one of the two")
            attrs[key] = value
        text = self.text[start:self.prev[4] + 1]  # through the ']' just taken
        if self.quick and "\n" not in text:
            self.attr_lists[text] = dict(attrs)
        return attrs

    def known_attributes(self, at: int) -> tuple[dict | None, int]:
        """(a copy of the attributes of the '[' at offset `at`, the offset after its ']') when
        the text through the first ']' after it was read before as a whole list, else (None,
        `at`). Such a text gives the same attributes wherever it stands: its tokens and their
        values depend on its characters alone. (A list ends at its first ']' but in a string,
        so the search never passes the list's end: the parse stays linear.)"""
        end = self.text.find("]", at) + 1
        known = self.attr_lists.get(self.text[at:end]) if end else None
        return (None, at) if known is None else (dict(known), end)

    def quick_head(self, tok: Token) -> tuple[list[Value], str, int] | None:
        """A node's outputs, op and the offset after the op, for a node whose head is as the
        printer writes it (`%0: f32[2,3], %1: i64[] = op`, then '[' or '('), read in one
        match from `tok` (the current token); or None (nothing consumed): `node` reads any
        other head token by token, and reports what is wrong (a value defined twice, a name
        `_TOKEN` reads as another kind). A type is checked as `compact_type` checks it."""
        m = _QUICK_HEAD.match(self.text, tok[4])
        if m is None:
            return None
        op = m.group(2)
        if op in _DTYPES or op == "inf" or op.startswith("inf.") or _SYMBOL_NAME.fullmatch(op):
            return None
        line, line_start = tok[2], tok[4] - tok[3] + 1
        outputs, names = [], set()
        at = tok[4]
        for part in m.group(1).split(", "):
            name, _, type_text = part.partition(": ")
            name = name[1:]
            if name in self.values or name in names:
                return None
            names.add(name)
            type_at = at + len(name) + 3
            ty = self.types.get(type_text)
            if ty is None:
                ty = self.compact_type(("type", type_text, line, type_at - line_start + 1,
                                        type_at))
            outputs.append(Value(name, ty))
            at = type_at + len(type_text) + 2
        for v in outputs:
            self.values[v.name] = v
        return outputs, op, m.end()

    def quick_uses(self) -> list[Value] | None:
        """A node's inputs as the printer writes them (`(%a, %b)`, defined values) read in one
        match from the current token, or None: `comma_list` reads anything else, and
        reports what is wrong."""
        tok = self.tok
        if tok[1] != "(" or tok[0] != "punct" or not self.quick:
            return None
        m = _QUICK_USES.match(self.text, tok[4])
        inputs = None if m is None else self.defined(m.group(1))
        if inputs is not None:
            self.skip_to(tok, m.end())
        return inputs

    def defined(self, names: str | None) -> list[Value] | None:
        """The values `%a, %b` (`_QUICK_USES`'s group) names, or None when one is not
        defined."""
        if not names:
            return []
        values = self.values
        inputs = [values.get(name) for name in names[1:].split(", %")]
        return None if None in inputs else inputs

    def quick_tuple(self, tok: Token) -> Any:
        """The tuple literal at `tok` (the current token, its '(') read in one loop
        (`_quick_tuple`), the tokens after it next; or `_NOT_QUICK`, nothing consumed."""
        found = _quick_tuple(self.text, tok[4], 0, self.literals)
        if found is None:
            return _NOT_QUICK
        self.skip_to(tok, found[1] + 1)
        return found[0]

    def attr(self) -> tuple[str, Token, Any]:
        tok = self.take("name")
        self.take("punct", "=")
        return tok[1], tok, self.literal(0)

    def literal(self, depth: int) -> Any:
        tok = self.tok
        kind = tok[0]
        if kind == "punct" and tok[1] == "(":
            if depth == 0 and self.quick:
                value = self.quick_tuple(tok)
                if value is not _NOT_QUICK:
                    return value
            return self.tuple_of(self.literal, depth)
        if kind == "number":
            return self.number(tok)
        if kind == "sym":
            return self.symbolic(tok)
        if kind == "string":
            self.advance()
            return self.string(tok)
        if kind == "name":
            self.advance()
            return _NAMED_LITERALS.get(tok[1], tok[1])
        self.fail(tok, "a literal (a number, a string, true, false, none or a tuple)")


_TYPE = r"(?:f32|f64|i64|bool)\[(?:[0-9]{1,19}(?:,[0-9]{1,19})*)?\]"  # as `_TOKEN` reads it
# A node's outputs and op as the printer writes them: `%0: f32[2,3], %1: i64[] = op`.
_QUICK_HEAD = re.compile(r"((?:%[A-Za-z0-9_.]+: {t}, )*%[A-Za-z0-9_.]+: {t}) = "
                         r"([A-Za-z_][A-Za-z0-9_.]*)(?=[\[(])".format(t=_TYPE))
# A node's inputs as the printer writes them: `(%a, %b)`, `()`.
_QUICK_USES = re.compile(r"\(((?:%[A-Za-z0-9_.]+, )*%[A-Za-z0-9_.]+)?\)")
_NOT_QUICK = object()

# The tokens of a plain tuple literal, each the same token `_TOKEN` reads there: 1 '(', ')' or
# ',', 2 a string, 3 a number, 4 a name; 5 anything else (the quick read stops). A number or
# a name must be followed right away by ',' or ')' (as printed): then `_TOKEN` reads it whole
# and as the same kind (its `sym` needs an 's', its `number` takes `inf` before the name,
# and a name that spells a symbol, `s0`, is left to the token-by-token read).
_QUICK_TOKEN = re.compile(r"""
    [ \t\r]*
    (?:
      ([(),])
    | ("(?:[^"\\\n]|\\[^\n])*")
    | (-?(?:[0-9]+(?:\.[0-9]*(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)?|inf)(?=[,)]))
    | ([A-Za-z_][A-Za-z0-9_.]*(?=[,)]))
    | (.|\n)
    )
""", re.VERBOSE)


def _quick_tuple(text: str, start: int, depth: int, known: dict) -> tuple[tuple, int] | None:
    """(the tuple literal whose '(' is at offset `start`, the offset of its ')'), read in one
    loop, or None where that loop stops: a newline, a comment, a symbolic size, a token no
    literal holds, a misplaced ',', a tuple nested too deep or anything else that is not
    plain (`_Parser.literal` then reads the tuple token by token and reports what is wrong,
    so both give the same values and the same errors). The literals of fused nodes' bodies
    are most of a planned graph's text. `known`: the values of the number, string and name
    texts read so far in this text (they repeat; a text is one kind only)."""
    outer: list[list] = []  # the unfinished tuples around the current one
    items: list = []
    want_item = True  # after '(' or ','
    for m in _QUICK_TOKEN.finditer(text, start + 1):
        kind = m.lastindex
        if kind == 1:
            mark = m.group(1)
            if mark == ",":
                if want_item:
                    return None
                want_item = True
            elif mark == ")":
                done = tuple(items)
                if not outer:
                    return done, m.end() - 1
                items = outer.pop()
                items.append(done)
                want_item = False
            elif want_item and depth + len(outer) + 1 < MAX_DEPTH:
                outer.append(items)
                items = []
            else:
                return None
            continue
        if not want_item or kind == 5:
            return None
        text_of = m.group(kind)
        value = known.get(text_of, _NOT_QUICK)
        if value is _NOT_QUICK:
            value = _QUICK_VALUES[kind](text_of)
            if value is _NOT_QUICK:
                return None
            known[text_of] = value
        items.append(value)
        want_item = False
    return None


def _quick_string(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_QUICK


def _quick_number(text: str) -> Any:
    if len(text) > MAX_NUMBER_CHARS:
        return _NOT_QUICK
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _quick_name(text: str) -> Any:
    if _SYMBOL_NAME.fullmatch(text) or text.startswith("inf."):  # `_TOKEN`: sym; inf, '.'
        return _NOT_QUICK
    return _NAMED_LITERALS.get(text, text)


_SYMBOL_NAME = re.compile(r"s[0-9]+")
# Group -> value, as `_Parser.literal` makes it.
_QUICK_VALUES = {2: _quick_string, 3: _quick_number, 4: _quick_name}


_KIND_NAMES = {
    "value": "a value (%name)", "gname": "a graph name (@name)", "string": "a string",
    "number": "a number", "sym": "a symbolic size (s0*784)", "type": "a type (f32[2,3])",
    "arrow": "'->'", "larrow": "'<-'",
    "name": "a name", "punct": "punctuation",
}


def parse(text: str | bytes, *, require_registered: bool = True, quick: bool = True) -> Graph:
    """Parse IR text into a Graph (see the module docstring for the grammar and limits).

    Bytes are read as UTF-8. Raises ParseError, with line and column, for any text that is
    not a graph; nothing else. A `function` line must name a registered Function class; with
    `require_registered=False` (tools that only run or draw the graph) an unregistered name is
    kept as a name, and differentiating the graph later says which module to import.
    `quick=False` reads every token one at a time, without the quick reads of lines as the
    printer writes them (`_Parser.node`): the same graphs and errors, slower; tests compare
    the two.
    """
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            head = bytes(text)[:err.start]
            line = head.count(b"\n") + 1
            col = err.start - (head.rfind(b"\n") + 1) + 1
            raise ParseError(f"line {line}, column {col}: expected UTF-8 text, got the byte "
                             f"{bytes(text)[err.start]:#04x}; save the file as UTF-8") from None
    if not isinstance(text, str):
        raise ParseError(f"line 1, column 1: expected IR text (str or bytes), got a "
                         f"{type(text).__name__}; pass the file's text")
    return _Parser(text, require_registered, quick).graph()
