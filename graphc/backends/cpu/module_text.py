"""module_text: LLVM module text read as symbols, so kernels can be deduplicated and split.

The CPU code generator emits one module of hundreds of kernel functions, many of them the
same code under another name (the same layer shape twice, the forward and the backward of a
symmetric op; with sizes passed as arguments, many more). This module works on the module's
*text*, whatever the code generator writes, so it never needs to know how a kernel was made:

- `parse(text)` splits a module into its preamble (ModuleID, triple, data layout), its
  declarations, its symbols (function definitions and global variables, in order) and its
  trailer (metadata, attribute groups). Anything else is a ValueError: the caller then
  compiles the module as it is.
- `dedupe(module)` keeps one symbol of every class of symbols (functions and constants;
  never variables) whose text is the same once
  their own name and the names of the symbols they reference are replaced by their classes'
  (so `k8_fused` calling `k8_fused.omp` calling `k8_fused.range` equals `k12_fused` calling
  the `.omp`/`.range` of k12 when those are equal too); every reference to a dropped symbol
  is renamed to the kept one. It returns the smaller module and the renames.
- `split(module, n)` cuts a module into at most `n` module texts that together define every
  symbol once: external symbols are spread over the parts by size, an internal symbol
  (linkage `internal`/`private`: a constant table, a local helper) is copied into every part
  that reaches it, and a function defined in another part is declared. Object code compiled
  from the parts links into one program (graphc.backends.cpu.llvm loads all of them into one
  engine). A module whose external globals are referenced from code cannot be split (the
  declaration would need its type), nor one with an internal variable (a copy per part
  would be a variable per part): `split` returns it whole.

Invariants: the text of every symbol is kept byte for byte except for renamed references;
symbol order is the module's; `str(module)` is valid module text.

>>> m = parse('define i32 @"a"() {\\n  ret i32 7\\n}\\n'
...           'define i32 @"b"() {\\n  ret i32 7\\n}\\n'
...           'define i32 @"run"() {\\n  %".1" = call i32 @"b"()\\n  ret i32 %".1"\\n}\\n')
>>> small, renames = dedupe(m)
>>> renames
{'b': 'a'}
>>> print(small.symbols["run"].text.splitlines()[1])
  %".1" = call i32 @"a"()
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

__all__ = ["ModuleText", "Symbol", "dedupe", "loop_free", "parse", "split"]

# a global name: @"quoted" or @bare (LLVM's identifier characters)
_NAME = re.compile(r'@(?:"((?:[^"\\]|\\.)*)"|([-a-zA-Z$._][-a-zA-Z$._0-9]*))')
_LOCAL_LINKAGE = re.compile(r"\b(internal|private)\b")
_LABEL = re.compile(r'^("(?:[^"\\]|\\.)*"|[-a-zA-Z$._0-9]+):', re.MULTILINE)
_TARGET = re.compile(r'label %("(?:[^"\\]|\\.)*"|[-a-zA-Z$._0-9]+)')


@dataclass
class Symbol:
    """One function definition or global variable: its name, text, linkage, references."""

    name: str
    kind: str  # "function" or "global"
    text: str  # the whole definition, newline-terminated
    internal: bool  # internal/private linkage: local to its module, may be copied
    refs: list[str] = field(default_factory=list)  # defined symbols it names (not itself)


@dataclass
class ModuleText:
    preamble: list[str]
    declarations: list[str]
    symbols: dict[str, Symbol]
    trailer: list[str]

    def __str__(self) -> str:
        return "".join(self.preamble + self.declarations
                       + [s.text for s in self.symbols.values()] + self.trailer)


def _name(match: re.Match) -> str:
    return match.group(1) if match.group(1) is not None else match.group(2)


def parse(text: str) -> ModuleText:
    """The module's parts (see the module docstring); ValueError for a line it does not
    know how to place."""
    preamble, declarations, trailer = [], [], []
    symbols: dict[str, Symbol] = {}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("define "):
            head = line.split("@", 1)[0]
            match = _NAME.search(line)
            j = i
            while j < len(lines) and lines[j].rstrip() != "}":
                j += 1
            if match is None or j == len(lines):
                raise ValueError(f"line {i + 1}: a function definition that does not end")
            body = "".join(lines[i:j + 1])
            if not body.endswith("\n"):
                body += "\n"
            _add(symbols, Symbol(_name(match), "function", body,
                                 bool(_LOCAL_LINKAGE.search(head))))
            i = j + 1
            continue
        if line.startswith("declare "):
            declarations.append(line)
        elif line.startswith("@"):
            match = _NAME.match(line)
            rest = line[match.end():] if match else ""
            if match is None or not rest.lstrip().startswith("="):
                raise ValueError(f"line {i + 1}: not a global variable: {line[:80]!r}")
            linkage = rest.split("=", 1)[1].split(" global ")[0].split(" constant ")[0]
            _add(symbols, Symbol(_name(match), "global", line if line.endswith("\n")
                                 else line + "\n", bool(_LOCAL_LINKAGE.search(linkage))))
        elif line.startswith(("!", "attributes ")):
            trailer.append(line)
        elif not line.strip() or line.startswith((";", "target ", "source_filename")):
            (trailer if symbols else preamble).append(line)
        else:
            raise ValueError(f"line {i + 1}: unexpected top-level text: {line[:80]!r}")
        i += 1
    for symbol in symbols.values():
        seen = {symbol.name}
        for match in _NAME.finditer(symbol.text):
            name = _name(match)
            if name in symbols and name not in seen:
                seen.add(name)
                symbol.refs.append(name)
    return ModuleText(preamble, declarations, symbols, trailer)


def _add(symbols: dict[str, Symbol], symbol: Symbol) -> None:
    if symbol.name in symbols:
        raise ValueError(f"@{symbol.name} is defined twice")
    symbols[symbol.name] = symbol


def _quoted(name: str) -> str:
    return f'@"{name}"'


def _renamed(text: str, names: dict[str, str]) -> str:
    """`text` with every global name in `names` replaced by its value (written quoted)."""
    def sub(match: re.Match) -> str:
        name = _name(match)
        return names[name] if name in names else match.group(0)
    return _NAME.sub(sub, text)


def _mergeable(symbol: Symbol) -> bool:
    """Functions and constants may be merged; a variable may not (two variables with the
    same initial value are still two places to write)."""
    if symbol.kind == "function":
        return True
    value = symbol.text.split("=", 1)[1]
    return " constant " in f" {value.split('[', 1)[0]} "


def dedupe(module: ModuleText) -> tuple[ModuleText, dict[str, str]]:
    """One symbol per class of identical symbols (see the module docstring), and the
    renames {dropped name: kept name}."""
    symbols = module.symbols
    classes: dict[str, str] = {}  # name -> class digest ("" while being computed)

    def digest(name: str) -> str:
        if name in classes:
            # a cycle (recursion) is compared by name: such symbols are never merged
            return classes[name] or "@" + name
        if not _mergeable(symbols[name]):  # a variable is its own class: its name
            classes[name] = "@" + name
            return classes[name]
        classes[name] = ""
        names = {name: "@.self"}
        for ref in symbols[name].refs:
            names[ref] = "@." + digest(ref)
        text = _renamed(symbols[name].text, names)
        classes[name] = hashlib.sha256(text.encode()).hexdigest()
        return classes[name]

    kept: dict[str, str] = {}  # class -> the first symbol's name
    renames: dict[str, str] = {}
    for name in symbols:
        if not _mergeable(symbols[name]):
            continue
        first = kept.setdefault(digest(name), name)
        if first != name:
            renames[name] = first
    if not renames:
        return module, {}
    quoted = {old: _quoted(new) for old, new in renames.items()}
    out: dict[str, Symbol] = {}
    for name, symbol in symbols.items():
        if name in renames:
            continue
        touched = any(ref in renames for ref in symbol.refs)
        text = _renamed(symbol.text, quoted) if touched else symbol.text
        refs = list(dict.fromkeys(renames.get(r, r) for r in symbol.refs))
        out[name] = Symbol(name, symbol.kind, text, symbol.internal,
                           [r for r in refs if r != name])
    return ModuleText(module.preamble, module.declarations, out, module.trailer), renames


def loop_free(symbol: Symbol) -> bool:
    """Is the function one whose branches all go to blocks written after their own (so it
    has no loop: any cycle would need a branch back)? A `switch`, `indirectbr` or `callbr`
    makes it not loop-free for this check; so does anything that is not a function."""
    if symbol.kind != "function":
        return False
    seen: set[str] = set()
    for line in symbol.text.splitlines():
        label = _LABEL.match(line)
        if label is not None:
            seen.add(label.group(1).strip('"'))
            continue
        if "switch " in line or "indirectbr " in line or "callbr " in line:
            return False
        if any(target.strip('"') in seen for target in _TARGET.findall(line)):
            return False
    return True


def _declaration(symbol: Symbol) -> str:
    """`declare ...` for an external function defined in another part."""
    head = symbol.text.split("\n", 1)[0]
    return "declare " + head[len("define "):].rstrip().removesuffix("{").rstrip() + "\n"


def split(module: ModuleText, n: int, alone: tuple[str, ...] = ()) -> list[str]:
    """At most `n` module texts defining every symbol once (see the module docstring); each
    external function named in `alone` gets a part of its own, first and in that order."""
    symbols = module.symbols
    units = [s for s in symbols.values() if not s.internal]
    alone = tuple(name for name in alone if name in symbols and not symbols[name].internal)
    if n < 2 or len(units) < 2:
        return [str(module)]
    if any(s.kind == "global" and any(s.name in other.refs for other in symbols.values())
           for s in units):
        return [str(module)]
    if any(s.kind == "global" and s.internal and not _mergeable(s) for s in symbols.values()):
        return [str(module)]  # a variable copied into two parts would be two variables
    # largest first onto the lightest part (LPT scheduling), then back into module order
    shared = max(1, n - len(alone))
    loads, members = [0] * shared, [[] for _ in range(shared)]
    for s in sorted(units, key=lambda s: -len(s.text)):
        if s.name in alone:
            continue
        k = loads.index(min(loads))
        loads[k] += len(s.text)
        members[k].append(s.name)
    members = [[name] for name in alone] + members
    texts = []
    for names in members:
        if not names:
            continue
        mine = set(names)
        stack = list(names)
        while stack:  # the internal symbols they reach, copied into this part
            for ref in symbols[stack.pop()].refs:
                if symbols[ref].internal and ref not in mine:
                    mine.add(ref)
                    stack.append(ref)
        declared = [_declaration(symbols[r]) for r in dict.fromkeys(
            r for name in mine for r in symbols[name].refs) if r not in mine]
        texts.append("".join(module.preamble + module.declarations + declared
                             + [s.text for s in symbols.values() if s.name in mine]
                             + module.trailer))
    return texts
