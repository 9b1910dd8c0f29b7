"""llvmlite set-up, `compile_module` and the on-disk object-code cache of the CPU backend.

`compile_module(ir_text, name)` turns LLVM IR text into a `Library` of callable native
functions: keep one copy of identical kernels (graphc.backends.cpu.module_text), parse and
verify, optimise at O2, every module alike (`pipeline_level`; loop and SLP
vectorisation on) through the new pass manager with the host CPU and its features
(graphc.backends.cpu.llvm_worker), emit object code (a large module in parts, on worker
processes: graphc.backends.cpu.workers), load the objects into one MCJIT engine. Object code
is cached on disk, so a second compile of the same text skips optimisation and code
generation and only loads the objects.

Invariants:
- One-time initialisation (native target, asm printer/parser, libgomp when present) happens
  on first use, under a lock; importing this module does not touch LLVM.
- Every `Library` owns its execution engine, and every engine owns its own target machine
  (created for it, never shared: LLVM frees the machine with the engine, and PERF_NOTES
  records that reusing one afterwards segfaults). Engines' placeholder modules live in the
  global context, which is never disposed; modules that are optimised live in a private
  context closed right after, module first.
- Native functions stay valid while their `Library` lives; `ctypes_function` ties the
  returned function to its Library, so holding the function is enough.
- Nothing unverified reaches LLVM's object loader (it crashes on bad input instead of
  reporting): a cache entry carries its length and sha256, and its ELF structure is checked
  before loading. Symbols the object needs from outside must resolve in this process
  (`register_symbol`, libgomp, libc/libm) or `compile_module` raises instead of LLVM aborting.
- Cache key = sha256 of (deduplicated IR text, O level, triple, CPU name, features,
  llvmlite, LLVM and graphc versions, entry format). An entry is a bundle of the objects of
  a module's parts (`pack_objects`), each ELF-checked before any is loaded. The cache is
  graphc.backends.cache's `DiskCache` (the one format of every backend: length and sha256
  header, one atomic rename), so readers see a whole entry or none; a bad entry is deleted
  and rebuilt. Compiles of one key in one process are
  serialised, so concurrent callers compile it once.
- Every failure graphc expects is an `LLVMCompileError` naming the module and LLVM's message.

Example:
    >>> lib = compile_module("define i64 @twice(i64 %x) {\\n  %y = add i64 %x, %x\\n"
    ...                      "  ret i64 %y\\n}\\n", "doc_example", use_cache=False)
    >>> import ctypes
    >>> lib.ctypes_function("twice", ctypes.c_int64, [ctypes.c_int64])(21)
    42
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import struct
import threading
import time
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm

from graphc import config
from graphc.backends.cache import DiskCache
from graphc.backends.cpu import llvm_worker, module_text, workers
from graphc.errors import GraphcError
from graphc.version import __version__ as _GRAPHC_VERSION

__all__ = [
    "HostTarget", "Library", "LLVMCompileError", "cache_clear", "cache_info", "compile_module",
    "host_target", "load_openmp", "register_symbol", "straight_functions",
]

_CACHE_FORMAT = "llvm-objects-v2"  # the versioned subfolder; bump when the entry format changes
# The optimisation pipeline (the new pass manager's O level), the same for every module: a
# kernel's code must not depend on the module around it, because reductions' float sums
# are `reassoc` (graphc.backends.cpu.scalars, conv_direct) and O2 and O3 unroll and
# vectorise them differently, so the same kernel rounded differently at each level (a
# conv weight gradient 1 ulp apart between a DDP step and its gradient_as_bucket_view
# twin, the latter's module 157k characters, then over the 150k from which modules were
# compiled at O2). O2: O3 cost 35-40% more LLVM time (ResNet-18: 3.3 s against 2.0 s of
# CPU) and the steps ran at the same speed (O2/O3 0.92-1.08, LeNet-5 and the MLP within
# the noise); docs/performance.md § Compile time has the measurements.
OPT_LEVEL = 2
# A loop-free function this large (the driver of a training step: one call per kernel) is
# compiled apart at O1 with fast code generation: the LSTM step's driver (378k characters)
# took 0.33 s at O2/-O3 and takes 0.09 s so.
STRAIGHT_MIN_CHARS = 20_000


class LLVMCompileError(GraphcError, RuntimeError):
    """LLVM refused a module: IR that does not parse or verify, or an unresolvable symbol."""


@dataclass(frozen=True)
class HostTarget:
    """The machine code is generated for: LLVM's triple, CPU name and feature string."""

    triple: str
    cpu: str
    features: str  # "+avx2,-avx512f,..." as LLVM spells it

    def has_feature(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")


_init_lock = threading.Lock()
_host: HostTarget | None = None
_openmp_path: str | None = None
_symbols: dict[str, int] = {}


def _initialize() -> HostTarget:
    global _host, _openmp_path
    if _host is not None:
        return _host
    with _init_lock:
        if _host is None:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            llvm.initialize_native_asmparser()
            # libgomp's team is the one pool of the process (graphc.backends.cpu.threads):
            # spin briefly after a parallel region, then sleep. libgomp reads this once,
            # when it loads; `import graphc` has set it already unless libgomp came first.
            config.set_openmp_waiting()
            _openmp_path = _load_library(ctypes.util.find_library("gomp"))
            _host = HostTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                               llvm.get_host_cpu_features().flatten())
    return _host


def _load_library(path: str | None) -> str | None:
    if not path:
        return None
    try:
        llvm.load_library_permanently(path)
    except RuntimeError:
        return None
    return path


def host_target() -> HostTarget:
    """The host CPU as LLVM sees it (e.g. `znver4` with `+avx512f`)."""
    return _initialize()


def load_openmp() -> str | None:
    """The libgomp loaded for generated code (GOMP_parallel & co.), or None if absent."""
    _initialize()
    return _openmp_path


def register_symbol(name: str, address: int) -> None:
    """Make `name` resolve to `address` in code compiled afterwards (e.g. a BLAS sgemm_
    pointer from ctypes). Registering the same name again must give the same address."""
    _initialize()
    known = _symbols.get(name)
    if known is not None and known != address:
        raise LLVMCompileError(f"register_symbol: {name!r} is already registered at "
                               f"{known:#x}; got {address:#x}")
    llvm.add_symbol(name, address)
    _symbols[name] = address


def _new_target_machine() -> llvm.TargetMachine:
    host = _initialize()
    # jitdefault = the large code model on x86-64: MCJIT may place sections and the symbols
    # they call (libgomp, BLAS) more than 2 GiB apart.
    return llvm.Target.from_triple(host.triple).create_target_machine(
        cpu=host.cpu, features=host.features, opt=3, codemodel="jitdefault", jit=True)


class Library:
    """Native code loaded from one module: its engine, its object code (one object, or one
    per part of a module compiled in parts), its symbols. `aliases` maps the name of a
    function that deduplication dropped to the one that replaced it."""

    def __init__(self, name: str, ir_text: str, objects: list[bytes], *, key: str,
                 from_cache: bool, aliases: dict[str, str] | None = None,
                 source_text: str | None = None, level: int | None = None) -> None:
        self.name = name
        self.level = OPT_LEVEL if level is None else level  # the O level it was compiled at
        self.key = key
        self.from_cache = from_cache
        self.compile_seconds = 0.0  # compile_module's wall time, loading included
        self.parts = len(objects)
        self.aliases = dict(aliases or {})
        self._ir_text = ir_text  # as compiled: deduplicated
        self.source_text = ir_text if source_text is None else source_text  # as generated
        self._objects = objects  # kept alive with the engine that loaded them
        self._optimized: tuple[str, str] | None = None
        defined, undefined = set(), set()
        for code in objects:
            names, needs = _elf_symbols(code)
            defined.update(names)
            undefined.update(needs)
        self.symbols = frozenset(defined)
        tm = _new_target_machine()
        placeholder = llvm.parse_assembly("")  # global context: never disposed
        placeholder.triple = tm.triple
        placeholder.data_layout = str(tm.target_data)
        self._engine = llvm.create_mcjit_compiler(placeholder, tm)  # owns tm from here
        # Creating the engine opened the process's symbols; check before LLVM aborts on them.
        missing = sorted(s for s in undefined - defined if not llvm.address_of_symbol(s))
        if missing:
            raise LLVMCompileError(
                f"compile_module {name!r}: the code calls {', '.join(missing)}, which this "
                f"process does not define; register_symbol(name, address) or load the "
                f"library that provides them before compiling")
        for code in objects:  # MCJIT links the parts' symbols to each other
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(code))
        self._engine.finalize_object()

    def address(self, symbol: str) -> int:
        """The address of a function or global defined by this module."""
        symbol = self.aliases.get(symbol, symbol)
        address = self._engine.get_function_address(symbol) if symbol in self.symbols else 0
        if not address:
            raise LLVMCompileError(f"module {self.name!r} defines no symbol {symbol!r}; "
                                   f"it defines {sorted(self.symbols)}")
        return address

    def ctypes_function(self, symbol: str, restype, argtypes) -> ctypes._CFuncPtr:
        """A typed ctypes callable for `symbol`; it keeps this Library (and its code) alive."""
        function = ctypes.CFUNCTYPE(restype, *argtypes)(self.address(symbol))
        function._graphc_library = self
        return function

    @property
    def ir(self) -> str:
        """The optimised LLVM IR text (recomputed on first use: a cache hit never made it)."""
        return self._optimized_texts()[0]

    @property
    def asm(self) -> str:
        """The assembly text of the optimised module."""
        return self._optimized_texts()[1]

    def _optimized_texts(self) -> tuple[str, str]:
        if self._optimized is None:
            self._optimized = _with_optimized(self._ir_text, self.name, _module_texts,
                                              self.level)
        return self._optimized

    def __repr__(self) -> str:
        origin = "cache" if self.from_cache else "compiled"
        return (f"Library({self.name!r}, {len(self.symbols)} symbols, {self.parts} "
                f"part(s), {origin} in {self.compile_seconds * 1e3:.1f} ms)")


def _module_texts(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> tuple[str, str]:
    return str(module), tm.emit_assembly(module)


def _emit_object(module: llvm.ModuleRef, tm: llvm.TargetMachine) -> bytes:
    return tm.emit_object(module)


def _with_optimized(ir_text: str, name: str, use, level: int | None = None):
    """llvm_worker.with_optimized, with LLVM's complaint as an LLVMCompileError; `use` None:
    parse and verify only."""
    _initialize()
    try:
        if use is None:
            return llvm_worker.verify(ir_text)
        return llvm_worker.with_optimized(ir_text, name, OPT_LEVEL if level is None else level,
                                          use)
    except llvm_worker.IRError as error:
        raise LLVMCompileError(
            f"compile_module {name!r}: LLVM rejected the module: {error}\n"
            f"(the IR comes from graphc's code generator: please report it with the "
            f"module text)") from None


# ---------------------------------------------------------------------------------------------
# Compilation and the cache


_OBJECTS = struct.Struct("<8sI")  # a cache entry's payload: magic, object count,
_LENGTH = struct.Struct("<Q")  # then each object's length, then the objects
_OBJECTS_MAGIC = b"GCPARTS1"


def pack_objects(objects: list[bytes]) -> bytes:
    """One payload holding the object code of every part of a module."""
    return b"".join([_OBJECTS.pack(_OBJECTS_MAGIC, len(objects))]
                    + [_LENGTH.pack(len(o)) for o in objects] + objects)


def unpack_objects(payload: bytes) -> list[bytes]:
    """The objects of a payload; ValueError unless each holds together as an ELF64 object
    (LLVM's loader crashes on bad input instead of reporting)."""
    try:
        magic, count = _OBJECTS.unpack_from(payload)
        at = _OBJECTS.size + count * _LENGTH.size
        lengths = [_LENGTH.unpack_from(payload, _OBJECTS.size + k * _LENGTH.size)[0]
                   for k in range(count)]
    except struct.error:
        raise ValueError("not a graphc object bundle") from None
    if magic != _OBJECTS_MAGIC or count < 1 or at + sum(lengths) != len(payload):
        raise ValueError("not a graphc object bundle")
    objects = []
    for length in lengths:
        objects.append(payload[at:at + length])
        at += length
    for code in objects:
        _elf_symbols(code)
    return objects


OBJECT_CACHE = DiskCache(_CACHE_FORMAT, ".o", unpack_objects)


def cache_key(ir_text: str, level: int | None = None) -> str:
    """The hex sha256 naming the cached objects of `ir_text` (deduplicated, see
    `compile_module`) at O`level` on this host and toolchain."""
    host = _initialize()
    parts = (ir_text, str(OPT_LEVEL if level is None else level), host.triple, host.cpu,
             host.features, llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
             _GRAPHC_VERSION, _CACHE_FORMAT)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def deduplicated(ir_text: str) -> tuple[str, module_text.ModuleText | None, dict[str, str]]:
    """(the text to compile, its parsed form or None, renames): functions and constants that
    are the same code under another name are kept once (graphc.backends.cpu.module_text);
    text that module_text cannot read is compiled as it is."""
    try:
        module = module_text.parse(ir_text)
    except ValueError:
        return ir_text, None, {}
    small, renames = module_text.dedupe(module)
    return (str(small) if renames else ir_text), small, renames


def pipeline_level(text: str) -> int:
    """The O level a module's (deduplicated) text is compiled at: OPT_LEVEL, whatever the
    text, so that a kernel rounds the same in every module that holds it."""
    return OPT_LEVEL


def compile_module(ir_text: str, name: str, *, use_cache: bool = True,
                   level: int | None = None) -> Library:
    """Compile LLVM IR text into a loaded `Library` (cached on disk by `cache_key`).

    The text is deduplicated first; a large module is compiled in parts over the cores
    (graphc.backends.cpu.workers), each part its own object, all loaded into one engine.
    `level`: the optimisation pipeline, by default `pipeline_level(text)`."""
    start = time.perf_counter()
    text, module, renames = deduplicated(ir_text)
    level = pipeline_level(text) if level is None else level
    key = cache_key(text, level)
    if not use_cache:
        library = Library(name, text, _objects(text, module, name, level), key=key,
                          from_cache=False, aliases=renames, source_text=ir_text, level=level)
        library.compile_seconds = time.perf_counter() - start
        return library
    with OBJECT_CACHE.lock(key):
        payload = OBJECT_CACHE.read(key)
        from_cache = payload is not None
        if payload is None:
            OBJECT_CACHE.count("misses")
            objects = _objects(text, module, name, level)
            OBJECT_CACHE.write(key, pack_objects(objects))
        else:
            OBJECT_CACHE.count("hits")
            objects = unpack_objects(payload)
        library = Library(name, text, objects, key=key, from_cache=from_cache,
                          aliases=renames, source_text=ir_text, level=level)
    library.compile_seconds = time.perf_counter() - start
    _dump(library)
    return library


def _objects(text: str, module, name: str, level: int) -> list[bytes]:
    """The object code of `text`: one object, or one per part when the module is large
    enough that compiling parts on several cores is faster (workers.split_compile). A large
    loop-free function (the driver, `straight_functions`) is a part of its own, compiled
    at O1 with fast code generation (llvm_worker.FAST_CODEGEN)."""
    processes = workers.processes()
    parallel = processes > 1 and len(text) >= workers.PARALLEL_MIN_CHARS
    straight = straight_functions(module) if module is not None else ()
    if module is not None and (parallel or straight):
        _with_optimized(text, name, None)  # LLVM's own message for bad IR, here
        n = workers.PARTS_PER_PROCESS * processes if parallel else 1 + len(straight)
        parts = module_text.split(module, n, alone=straight)
        if len(parts) > 1:
            levels = [1 | llvm_worker.FAST_CODEGEN] * len(straight) + \
                [level] * (len(parts) - len(straight))
            objects = workers.split_compile(parts, name, levels, processes - 1)
            if objects is not None:
                return objects
    return [_with_optimized(text, name, _emit_object, level)]


def straight_functions(module: module_text.ModuleText) -> tuple[str, ...]:
    """External functions of at least STRAIGHT_MIN_CHARS with no loop
    (module_text.loop_free): LLVM's optimisation and careful code generation cost most on
    them and buy nothing (a driver's calls run once per step, each a few cycles)."""
    return tuple(s.name for s in module.symbols.values()
                 if not s.internal and len(s.text) >= STRAIGHT_MIN_CHARS
                 and module_text.loop_free(s))


def _dump(library: Library) -> None:
    """GRAPHC_DUMP=llvm,asm: write `<name>.<key>.ll` (as generated), `.dedup.ll` (what was
    compiled, when deduplication changed it), `.opt.ll` (optimised) and `.s` (assembly) into
    the dump directory (see graphc.config)."""
    deduplicated = library._ir_text if library.aliases else None
    wanted = [(suffix, text) for topic, suffix, text in (
        ("llvm", ".ll", lambda: library.source_text),
        ("llvm", ".dedup.ll", lambda: deduplicated),
        ("llvm", ".opt.ll", lambda: library.ir),
        ("asm", ".s", lambda: library.asm)) if config.dumps(topic)]
    if not wanted:
        return
    directory = config.dump_dir()
    for suffix, text in wanted:
        if text() is not None:
            config.write_dump_file(directory, f"{library.name}.{library.key[:12]}{suffix}",
                                   text())


def cache_info() -> dict:
    """Where the object cache lives, its entries and bytes, and this process's hit counts."""
    return OBJECT_CACHE.info()


def cache_clear() -> int:
    """Delete every cached object (and leftover temp files); return how many entries went."""
    return OBJECT_CACHE.clear()


# ---------------------------------------------------------------------------------------------
# ELF64 reading: just enough to vet an object before LLVM's loader sees it


_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB, _SHT_NOBITS = 2, 8


def _elf_symbols(data: bytes) -> tuple[list[str], list[str]]:
    """(defined global symbols, undefined symbols) of a little-endian ELF64 relocatable
    object; ValueError if its structure does not hold together."""
    if len(data) < _ELF_HEADER.size or data[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a little-endian ELF64 object")
    header = _ELF_HEADER.unpack_from(data)
    shoff, shentsize, shnum = header[6], header[11], header[12]
    if shentsize != _SECTION.size or shoff + shnum * shentsize > len(data):
        raise ValueError("section table outside the file")
    sections = [_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    for sh in sections:
        if sh[1] != _SHT_NOBITS and sh[4] + sh[5] > len(data):
            raise ValueError("section outside the file")
    defined, undefined = [], []
    for sh in sections:
        if sh[1] != _SHT_SYMTAB:
            continue
        if sh[6] >= shnum or sh[9] != _SYMBOL.size:
            raise ValueError("bad symbol table")
        strtab = sections[sh[6]]
        names = data[strtab[4]:strtab[4] + strtab[5]]
        for offset in range(sh[4], sh[4] + sh[5], _SYMBOL.size):
            name_at, info, _, shndx, _, _ = _SYMBOL.unpack_from(data, offset)
            end = names.find(b"\0", name_at)
            if name_at and end < 0:
                raise ValueError("symbol name outside the string table")
            name = names[name_at:end].decode("ascii", "replace") if name_at else ""
            if not name or info >> 4 == 0:  # unnamed or STB_LOCAL
                continue
            if shndx == 0:
                if name != "_GLOBAL_OFFSET_TABLE_":  # provided by the JIT linker itself
                    undefined.append(name)
            else:
                defined.append(name)
    return defined, undefined
