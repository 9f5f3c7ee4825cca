"""pyquant/_lib.py mirrors include/quantgemm.h one to one (STYLE.md item 6).

The header is parsed (comments stripped) and compared with the bindings: every QG_API
function in header order with its parameter and result types, every enum with its
members and numbers, every args struct with its fields in order and their types, the
version macros. Where a C compiler is available, sizeof/offsetof of every struct field
is compiled from the header and compared with ctypes. Skipped only when the header is
not in the tree (an installed package tested without its sources)."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pyquant import _lib

HEADER = Path(__file__).resolve().parents[1] / "include" / "quantgemm.h"
pytestmark = pytest.mark.skipif(not HEADER.exists(), reason=f"{HEADER} not in this tree")

ENUM_CLASSES = {
    "qg_status": _lib.Status, "qg_backend": _lib.Backend, "qg_dtype": _lib.DType,
    "qg_format": _lib.Format, "qg_activation": _lib.Activation,
    "qg_gate_up_layout": _lib.GateUpLayout, "qg_copy_kind": _lib.CopyKind,
    "qg_w4a16_layout": _lib.W4A16Layout, "qg_mxfp4_layout": _lib.MXFP4Layout,
    "qg_gguf_layout": _lib.GGUFLayout,
}
SCALARS = {
    "int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t, "float": ctypes.c_float, "qg_stream": ctypes.c_void_p,
}


def _source() -> str:
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return text


def _functions():
    """[(name, return type, [param types])] in header order."""
    out = []
    for m in re.finditer(r"QG_API\s+([^;()]+?)\s*\b(qg_\w+)\s*\(([^)]*)\)\s*;", _source()):
        ret, name, params = m.group(1).strip(), m.group(2), m.group(3).strip()
        types = []
        if params and params != "void":
            for p in params.split(","):
                p = " ".join(p.split())
                pm = re.match(r"(.*?)(\w+)$", p)
                types.append(" ".join(pm.group(1).replace("*", " * ").split()))
        out.append((name, " ".join(ret.replace("*", " * ").split()), types))
    return out


def _enums():
    return [(m.group(3), [(a, int(b)) for a, b in re.findall(r"(QG_\w+)\s*=\s*(\d+)", m.group(2))])
            for m in re.finditer(r"typedef\s+enum\s+(\w+)\s*(?:QG_ENUM_BASE\s*)?\{(.*?)\}\s*(\w+)\s*;", _source(), re.S)]


def _structs():
    """[(name, [(field, type)])] for every typedef struct with a body."""
    out = []
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", _source(), re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.replace("*", " * ").split())
            if not decl:
                continue
            dm = re.match(r"(.*?)\s*(\w+(?:\s*,\s*\w+)*)$", decl)
            head = dm.group(1).split()
            # "int64_t m, n, k" -> type int64_t; the regex leaves the first name in head
            names = [n.strip() for n in dm.group(2).split(",")]
            typ = " ".join(head)
            fields += [(n, typ) for n in names]
        out.append((m.group(3), fields))
    return out


def _expected_ctype(ctype: str, role: str):
    """What a C type is bound as: 'exact' ctypes type, or 'pointer' (any pointer type)."""
    t = ctype.replace("const ", "").strip()
    if t.endswith("*"):
        return "pointer", t[:-1].strip()
    if t in ENUM_CLASSES:
        return "exact", ctypes.c_int
    if t in SCALARS:
        return "exact", SCALARS[t]
    raise AssertionError(f"{role}: C type {ctype!r} has no mapping in this test")


def _is_pointer_type(ct) -> bool:
    return ct in (ctypes.c_void_p, ctypes.c_char_p) or (
        isinstance(ct, type) and issubclass(ct, ctypes._Pointer))


def _pointee_ok(ct, pointee: str) -> bool:
    """A POINTER(x) binding must point at the right thing; void*/char* accept any pointee."""
    if ct in (ctypes.c_void_p,):
        return True
    if ct is ctypes.c_char_p:
        return pointee == "char"
    target = ct._type_
    p = pointee.replace("const ", "").strip()
    if p.endswith("*"):  # pointer to pointer (qg_context**, qg_event**)
        return target is ctypes.c_void_p
    if p in ENUM_CLASSES:
        return issubclass(target, ctypes.c_int) and ctypes.sizeof(target) == 4
    if p in SCALARS:
        return ctypes.sizeof(target) == ctypes.sizeof(SCALARS[p]) and target._type_ == SCALARS[p]._type_
    if hasattr(_lib, p):
        return target is getattr(_lib, p)
    if p in ("qg_context", "qg_event"):
        return target is ctypes.c_void_p
    return False


def _check_type(ct, ctype: str, role: str) -> None:
    kind, want = _expected_ctype(ctype, role)
    if kind == "pointer":
        assert _is_pointer_type(ct), f"{role}: C {ctype!r} bound as non-pointer {ct}"
        assert _pointee_ok(ct, want), f"{role}: C {ctype!r} bound as {ct}"
    else:
        assert ctypes.sizeof(ct) == ctypes.sizeof(want) and ct._type_ == want._type_, \
            f"{role}: C {ctype!r} bound as {ct}, expected {want}"


def test_every_function_is_bound_in_header_order():
    header = _functions()
    assert header, "no QG_API function parsed from the header"
    src = Path(_lib.__file__).read_text()
    bound = re.findall(r'_fn\(\s*"(qg_\w+)"', src)
    assert bound == [n for n, _, _ in header], (
        "bindings differ from the header (order or names):\n"
        f"header: {[n for n, _, _ in header]}\n_lib:   {bound}")
    # the C declaration is quoted in a comment between the previous binding and this one
    prev = 0
    for name, _, _ in header:
        at = re.search(rf'_fn\(\s*"{name}"', src).start()
        assert re.search(rf"#\s*QG_API[^\n]*\b{name}\(", src[prev:at]), \
            f"{name}: its C declaration is not quoted above the binding"
        prev = at


@pytest.mark.skipif(not _lib.library_loaded(), reason="library not loaded: argtypes are unset")
def test_function_signatures_match():
    for name, ret, params in _functions():
        f = getattr(_lib, name)
        assert f.argtypes is not None and len(f.argtypes) == len(params), \
            f"{name}: {len(params)} parameters in the header, argtypes {f.argtypes}"
        for i, (ct, ctype) in enumerate(zip(f.argtypes, params)):
            _check_type(ct, ctype, f"{name} parameter {i}")
        if ret == "qg_status":
            assert f.restype is _lib.qg_status, f"{name}: restype {f.restype}, expected qg_status"
            assert f.errcheck is _lib._check, f"{name}: qg_status result not routed through _check"
        elif ret == "const char *":
            assert f.restype is ctypes.c_char_p, f"{name}: restype {f.restype}"
        else:
            _check_type(f.restype, ret, f"{name} result")


def test_enums_match():
    enums = _enums()
    assert {n for n, _ in enums} == set(ENUM_CLASSES), [n for n, _ in enums]
    for name, members in enums:
        cls = ENUM_CLASSES[name]
        assert [(m.name, m.value) for m in cls] == members, f"{name}: {list(cls)} vs header {members}"


def test_structs_match_field_by_field():
    structs = _structs()
    assert structs, "no struct parsed from the header"
    for name, fields in structs:
        cls = getattr(_lib, name)
        got = [f[0] for f in cls._fields_]
        assert got == [f for f, _ in fields], f"{name}: fields {got} vs header {[f for f, _ in fields]}"
        for (fname, ctype), (_, ct) in zip(fields, cls._fields_):
            _check_type(ct, ctype, f"{name}.{fname}")
        assert fields[0] == ("size", "size_t"), f"{name} must start with size_t size"
        assert cls().size == ctypes.sizeof(cls), f"{name}(): size not preset to sizeof"


def test_version_macros_match():
    src = _source()
    for macro in ("QG_VERSION_MAJOR", "QG_VERSION_MINOR", "QG_VERSION_PATCH", "QG_FORMAT_VERSION"):
        m = re.search(rf"#define\s+{macro}\s+(\d+)", src)
        assert m and int(m.group(1)) == getattr(_lib, macro), f"{macro}: header {m and m.group(1)}"
    import pyquant
    assert pyquant.__version__.split(".")[:2] == [str(_lib.QG_VERSION_MAJOR), str(_lib.QG_VERSION_MINOR)]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to measure the C layout")
def test_struct_layout_matches_the_compiler(tmp_path):
    structs = _structs()
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{HEADER}"', "int main(void) {"]
    for name, fields in structs:
        lines.append(f'  printf("{name} sizeof %zu\\n", sizeof({name}));')
        for f, _ in fields:
            lines.append(f'  printf("{name} {f} %zu %zu\\n", offsetof({name}, {f}), '
                         f'sizeof((({name}*)0)->{f}));')
    lines.append("  return 0; }")
    c = tmp_path / "layout.c"
    c.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c99", "-Wall", "-o", str(exe), str(c)], check=True,
                   capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    for line in filter(None, out):
        parts = line.split()
        cls = getattr(_lib, parts[0])
        if parts[1] == "sizeof":
            assert ctypes.sizeof(cls) == int(parts[2]), f"sizeof({parts[0]}): C {parts[2]}, ctypes {ctypes.sizeof(cls)}"
        else:
            field = getattr(cls, parts[1])
            assert (field.offset, field.size) == (int(parts[2]), int(parts[3])), \
                f"{parts[0]}.{parts[1]}: C offset/size {parts[2]}/{parts[3]}, ctypes {field.offset}/{field.size}"
