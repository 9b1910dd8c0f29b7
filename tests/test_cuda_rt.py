"""The ctypes table of graphc.backends.cuda.rt against runtime/csrc/include/graphc_rt.h.

The header is the source of truth: every `gc_` prototype, enum and struct is parsed from it
and the binding must match exactly (names and order, argument names and ctypes types, return
types, enum values, struct fields). A few direct calls then run on the emulation library
(built once per session by tests/cuda_support.py).
"""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np
import pytest

from graphc.backends.cuda import rt

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime",
                      "csrc", "include", "graphc_rt.h")


def _header_text() -> str:
    with open(HEADER) as f:
        text = f.read()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _parse_prototypes(text: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, return type, [(argument type, argument name)]) of every gc_ function."""
    out = []
    pattern = r"^\s*((?:const\s+)?[A-Za-z_][\w]*\s*\**)\s*(gc_\w+)\s*\(([^)]*)\)\s*;"
    for ret, name, args in re.findall(pattern, text, flags=re.M):
        params = []
        for arg in args.split(","):
            arg = " ".join(arg.split())
            if not arg or arg == "void":
                continue
            m = re.fullmatch(r"(.*?)(\w+)(\[\d+\])?", arg)
            ctype, pname, array = m.group(1).strip(), m.group(2), m.group(3)
            params.append((ctype + (" *" if array else ""), pname))
        out.append((name, " ".join(ret.split()), params))
    return out


def _parse_enums(text: str) -> dict[str, dict[str, int]]:
    enums = {}
    for body, name in re.findall(r"typedef enum \w+\s*\{(.*?)\}\s*(\w+);", text, flags=re.S):
        enums[name] = {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", body)}
    return enums


def _parse_structs(text: str) -> dict[str, list[tuple[str, str]]]:
    structs = {}
    for body, name in re.findall(r"typedef struct \w+\s*\{(.*?)\}\s*(\w+);", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            ctype, names = decl.split(" ", 1)
            fields += [(ctype, n.strip()) for n in names.split(",")]
        structs[name] = fields
    return structs


ENUM_NAMES = ("gc_status", "gc_conv2d_pass", "gc_reduction", "gc_reduce_op")
SCALARS = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
           "double": ctypes.c_double, **{e: ctypes.c_int32 for e in ENUM_NAMES}}
HANDLES = ("gc_stream", "gc_event", "gc_module", "gc_function", "gc_graph")


def _expected_ctype(ctype: str):
    """The ctypes type the module docstring's mapping gives a C type."""
    ctype = ctype.replace(" *", "*").replace("* ", "*").strip()
    if ctype in SCALARS:
        return SCALARS[ctype]
    if ctype == "const char*":
        return ctypes.c_char_p
    if ctype == "char*":
        return ctypes.POINTER(ctypes.c_char)
    base = ctype.removeprefix("const ").rstrip("*")
    if base in rt.STRUCTS and ctype.count("*") == 1:
        return ctypes.POINTER(rt.STRUCTS[base])
    if ctype.endswith("*") or ctype in HANDLES:
        return ctypes.c_void_p
    raise AssertionError(f"no ctypes mapping for C type {ctype!r}")


def test_every_prototype_matches_the_table():
    prototypes = _parse_prototypes(_header_text())
    assert len(prototypes) >= 50, "the header parser found too few prototypes"
    table = {name: (ret, args) for name, ret, args in rt.SIGNATURES}
    assert [p[0] for p in prototypes] == [s[0] for s in rt.SIGNATURES]
    for name, ret, params in prototypes:
        restype, args = table[name]
        assert (ret == "gc_status") == (name not in rt.NOT_STATUS), name
        assert restype is _expected_ctype(ret), (name, ret, restype)
        assert [a for a, _ in args] == [p for _, p in params], name
        for (_, ctype_py), (ctype, pname) in zip(args, params):
            assert ctype_py is _expected_ctype(ctype), (name, pname, ctype, ctype_py)


def test_enums_and_constants_match():
    text = _header_text()
    assert _parse_enums(text) == rt.ENUMS
    assert int(re.search(r"#define GC_ABI_VERSION (\d+)", text).group(1)) == rt.ABI_VERSION
    assert re.search(r'#define GC_EMU_ENTRY_SUFFIX "(\w+)"', text).group(1) == \
        rt.GC_EMU_ENTRY_SUFFIX


def test_structs_match_field_by_field():
    structs = _parse_structs(_header_text())
    assert set(structs) == set(rt.STRUCTS)
    for name, fields in structs.items():
        ours = rt.STRUCTS[name]._fields_
        assert [n for n, _ in ours] == [n for _, n in fields], name
        assert [t for _, t in ours] == [SCALARS[c] for c, _ in fields], name


def test_unknown_graphc_cuda_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GRAPHC_CUDA", "tpu")
    with pytest.raises(rt.GraphcError, match="GRAPHC_CUDA='tpu' is not understood"):
        rt.requested_kind()


# ---- direct calls on the emulation library ---------------------------------------------------
@pytest.fixture(scope="module")
def emu():
    try:
        from tests.cuda_support import runtime_library
    except ImportError:
        pytest.skip("tests/cuda_support.py (which builds the emulation library) is missing")
    return rt.Runtime(runtime_library("emu"))


def test_malloc_copy_and_checked_errors(emu):
    assert emu.kind == "emulation" and emu.gc_abi_version() == rt.ABI_VERSION
    ptr = ctypes.c_void_p()
    emu.gc_malloc(ctypes.byref(ptr), 64)
    try:
        src = np.arange(16, dtype=np.float32)
        dst = np.zeros(16, np.float32)
        emu.gc_memcpy_h2d(ptr, src.ctypes.data, 64, None)
        emu.gc_fill_f32(ptr.value + 32, 7.0, 8, None)
        emu.gc_memcpy_d2h(dst.ctypes.data, ptr, 64, None)
        emu.gc_device_synchronize()
        np.testing.assert_array_equal(dst, np.r_[src[:8], np.full(8, 7, np.float32)])
    finally:
        emu.gc_free(ptr)
    with pytest.raises(rt.CudaInvalidArgumentError, match="gc_malloc failed with "
                       "GC_ERROR_INVALID_ARGUMENT: .+"):
        emu.gc_malloc(ctypes.byref(ptr), -1)


def test_gemm_on_emulation(emu):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    c = np.empty((2, 4), np.float32)
    ptrs = [ctypes.c_void_p() for _ in range(3)]
    for p, x in zip(ptrs, (a, b, c)):
        emu.gc_malloc(ctypes.byref(p), x.nbytes)
    try:
        emu.gc_memcpy_h2d(ptrs[0], a.ctypes.data, a.nbytes, None)
        emu.gc_memcpy_h2d(ptrs[1], b.ctypes.data, b.nbytes, None)
        emu.gc_gemm_f32(0, 0, 2, 4, 3, 1.0, ptrs[0], 3, ptrs[1], 4, 0.0, ptrs[2], 4, None)
        emu.gc_memcpy_d2h(c.ctypes.data, ptrs[2], c.nbytes, None)
        emu.gc_device_synchronize()
    finally:
        for p in ptrs:
            emu.gc_free(p)
    np.testing.assert_allclose(c, a @ b, rtol=1e-6)


# ---- deployment: what the CUDA build ships and checks (issue 18, item 7) -------------------
def test_the_library_ships_sass_for_sm80_and_sm90_plus_ptx():
    makefile = os.path.join(os.path.dirname(os.path.dirname(HEADER)), "Makefile")
    with open(makefile) as f:
        gencode = re.search(r"^GENCODE := (.*)$", f.read(), flags=re.M).group(1)
    assert "arch=compute_80,code=sm_80" in gencode
    assert "arch=compute_90,code=[sm_90,compute_90]" in gencode


class _FakeDevice:
    """A runtime of kind "cuda" reporting compute capability `major`.`minor`."""

    kind = "cuda"

    def __init__(self, major: int, minor: int) -> None:
        self.major, self.minor = major, minor

    def gc_device_properties(self, device, name, capacity, major, minor, memory, sms):
        major._obj.value, minor._obj.value = self.major, self.minor


def test_generated_kernels_are_a_fatbin_of_sass_and_ptx_cached_per_arch(monkeypatch):
    from graphc.backends.cuda import compile as cuda_compile

    monkeypatch.setattr(cuda_compile.shutil, "which", lambda name: f"/usr/bin/{name}")
    command = cuda_compile._cuda_command("k.cu", "k.fatbin", "sm_90")
    assert command[:2] == ["nvcc", "-fatbin"]
    assert "-gencode=arch=compute_90,code=[sm_90,compute_90]" in command
    h100, a100 = _FakeDevice(9, 0), _FakeDevice(8, 0)
    assert cuda_compile._toolchain(h100)[1:3] == ("sm_90", ".fatbin")
    source = "extern \"C\" __global__ void k() {}"
    keys = {cuda_compile.cache_key(device, source) for device in (h100, a100, _FakeDevice(9, 0))}
    assert len(keys) == 2  # one entry per source and architecture


def test_a_driver_older_than_the_toolkit_is_a_clear_error():
    assert rt.driver_problem(13000, 13000, "lib.so") is None
    assert rt.driver_problem(12020, 12080, "lib.so") is None  # minor-version compatibility
    assert rt.driver_problem(0, 0, "emu.so") is None  # the emulation
    message = rt.driver_problem(12020, 13000, "libgraphc_rt.so")
    assert "driver supports CUDA 12.2" in message and "built with CUDA 13.0" in message
    assert "R580 or newer" in message and "GRAPHC_CUDA=emu" in message
    assert "no NVIDIA driver" in rt.driver_problem(0, 12080, "lib.so")


def test_transfer_counters_and_pinned_memory(emu):
    emu.gc_transfer_bytes_reset()
    pinned, device = ctypes.c_void_p(), ctypes.c_void_p()
    emu.gc_host_alloc(ctypes.byref(pinned), 64)
    emu.gc_malloc(ctypes.byref(device), 64)
    try:
        emu.gc_memcpy_h2d(device, pinned, 64, None)
        emu.gc_memcpy_d2h(pinned, device, 16, None)
        h2d, d2h = ctypes.c_int64(), ctypes.c_int64()
        emu.gc_transfer_bytes(ctypes.byref(h2d), ctypes.byref(d2h))
        assert (h2d.value, d2h.value) == (64, 16)
    finally:
        emu.gc_free(device)
        emu.gc_host_free(pinned)
    rt.check_driver(emu)  # the emulation: nothing to check
    with pytest.raises(rt.CudaNotSupportedError, match="records no CUDA graph"):
        emu.gc_graph_begin_capture(None)
