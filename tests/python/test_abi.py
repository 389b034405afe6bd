"""The ctypes mirror (python/wsync/_cdefs.py) against the C headers, as the compiler sees them:
c_abi (built from tests/python/c_abi.c) prints every public struct's size, alignment and field
offsets and sizes, every enum constant and macro, and the *_INIT initializers' values; they must
equal what the package declares. Every function the headers declare must be declared by the
package with as many parameters, and the library must export it. The status and dtype tables
must agree with the library's own. A drift fails here rather than corrupting memory."""
from __future__ import annotations

import ctypes
import json
import re
import subprocess
import unittest

import wsync
import wsync_testlib as tl
from wsync import _cdefs
from wsync._library import lib

HEADERS = [tl.REPO / "include" / "wsync" / h
           for h in ("wsync.h", "wsync_fp8.h", "wsync_layout.h", "wsync_plan.h")]


def c_abi() -> dict:
    out = subprocess.run(tl.c_program("c_abi"), capture_output=True, timeout=60, check=True)
    return json.loads(out.stdout)


def compare_structs(c: dict, py: dict) -> list:
    """Differences between two {struct: {size, align, fields}} descriptions, as sentences."""
    diffs = []
    for name in sorted(set(c) | set(py)):
        if name not in py:
            diffs.append(f"{name}: in the headers, not mirrored")
            continue
        if name not in c:
            diffs.append(f"{name}: mirrored, not printed by c_abi")
            continue
        for k in ("size", "align"):
            if c[name][k] != py[name][k]:
                diffs.append(f"{name}: {k} {c[name][k]} in C, {py[name][k]} in Python")
        cf, pf = c[name]["fields"], py[name]["fields"]
        for f in sorted(set(cf) | set(pf)):
            if f not in pf:
                diffs.append(f"{name}.{f}: missing in Python")
            elif f not in cf:
                diffs.append(f"{name}.{f}: not in C")
            elif list(cf[f]) != list(pf[f]):
                diffs.append(f"{name}.{f}: [offset, size] {cf[f]} in C, {pf[f]} in Python")
        if list(cf) != [f for f in pf if f in cf]:
            diffs.append(f"{name}: field order differs")
    return diffs


def header_text(h) -> str:
    text = re.sub(r"/\*.*?\*/", " ", h.read_text(), flags=re.S)
    return re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.M | re.S)


def header_structs() -> dict:
    """typedef name -> field names in order, read from the headers' text (so that a field added
    where it changes no size or offset of the fields c_abi prints is still seen)."""
    out = {}
    for h in HEADERS:
        for m in re.finditer(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", header_text(h), re.S):
            names = []
            for decl in m.group(1).split(";"):
                decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
                if not decl:
                    continue
                parts = decl.split(",")
                names.append(re.findall(r"\w+", parts[0])[-1])
                names += [re.findall(r"\w+", q)[-1] for q in parts[1:]]
            out[m.group(2)] = names
    return out


def header_enums() -> dict:
    """typedef name -> enumerator names, from the headers' text (the status enum from the
    X-macro table)."""
    out = {}
    raw = tl.REPO.joinpath("include", "wsync", "wsync.h").read_text()
    out["wsync_status_t"] = ["WSYNC_" + n for n in re.findall(r"X\((\w+),\s*-?\d+,", raw)]
    for h in HEADERS:
        for m in re.finditer(r"typedef\s+enum\s*\{(.*?)\}\s*(\w+)\s*;", header_text(h), re.S):
            if m.group(2) == "wsync_status_t":
                continue
            out[m.group(2)] = re.findall(r"(WSYNC_\w+)\s*=", m.group(1))
    return out


def header_functions() -> dict:
    """name -> number of parameters of every function the public headers declare."""
    out = {}
    for h in HEADERS:
        text = header_text(h)
        for m in re.finditer(r"\b(wsync_[a-z0-9_]+)\s*\(([^()]*)\)\s*;", text):
            args = m.group(2).strip()
            out[m.group(1)] = 0 if args in ("", "void") else args.count(",") + 1
    return out


class Abi(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = c_abi()

    def test_structs_match_the_headers(self):
        diffs = compare_structs(self.c["structs"], _cdefs.struct_layout())
        self.assertEqual(diffs, [], "\n".join(diffs))
        self.assertEqual(len(self.c["structs"]), len(_cdefs.STRUCTS))

    def test_struct_fields_match_the_header_text(self):
        declared = header_structs()
        mirrored = {cls._c_name_: [f[0] for f in cls._fields_] for cls in _cdefs.STRUCTS}
        self.assertEqual(declared, mirrored)

    def test_enumerators_match_the_header_text(self):
        declared = header_enums()
        self.assertEqual(declared, {k: list(v) for k, v in _cdefs.ENUMS.items()})

    def test_the_comparison_catches_a_drift(self):
        # a mirror with two fields swapped, and one with a field too narrow, must be reported
        class swapped(_cdefs._Struct):
            _c_name_ = "wsync_quant_t"
            _fields_ = [(n, t) for n, t in _cdefs.wsync_quant_t._fields_]
            _fields_[1], _fields_[2] = _fields_[2], _fields_[1]
            _fields_[3] = ("eps", ctypes.c_double)
        saved = _cdefs.STRUCTS
        try:
            _cdefs.STRUCTS = tuple(swapped if s is _cdefs.wsync_quant_t else s for s in saved)
            diffs = compare_structs(self.c["structs"], _cdefs.struct_layout())
        finally:
            _cdefs.STRUCTS = saved
        self.assertTrue(any("wsync_quant_t: field order" in d for d in diffs), diffs)
        self.assertTrue(any("wsync_quant_t.eps" in d for d in diffs), diffs)
        self.assertTrue(any("wsync_quant_t: size" in d for d in diffs), diffs)

    def test_enums_and_macros(self):
        self.assertEqual(self.c["enums"], _cdefs.ENUMS)
        self.assertEqual(self.c["macros"], _cdefs.MACROS)
        for name, size in self.c["enum_sizes"].items():
            self.assertEqual(size, ctypes.sizeof(_cdefs.c_enum), name)

    def test_initializers(self):
        self.assertEqual(self.c["inits"], _cdefs.init_values())

    def test_every_function_is_declared_with_its_arity(self):
        funcs = header_functions()
        self.assertGreater(len(funcs), 50)
        self.assertEqual(sorted(set(funcs) - set(_cdefs.PROTOTYPES)), [],
                         "declared in the headers, missing from _cdefs.PROTOTYPES")
        self.assertEqual(sorted(set(_cdefs.PROTOTYPES) - set(funcs)), [],
                         "in _cdefs.PROTOTYPES, not in the headers")
        for name, n in funcs.items():
            self.assertEqual(len(_cdefs.PROTOTYPES[name][1]), n, name)
            self.assertTrue(hasattr(lib(), name), f"the library does not export {name}")

    def test_status_table_matches_the_library(self):
        L = lib()
        for name, code, text in _cdefs.STATUS_MAP:
            self.assertEqual(L.wsync_status_name(code).decode(), "WSYNC_" + name)
            self.assertEqual(L.wsync_status_str(code).decode(), text)
            if code:
                cls = wsync.errors.error_class(code)
                self.assertTrue(issubclass(cls, wsync.WsyncError))
                self.assertEqual(cls.status, code)
                self.assertEqual(cls("x", code).status_name, "WSYNC_" + name)
        self.assertEqual(L.wsync_status_name(-99).decode(), "WSYNC_UNKNOWN")

    def test_dtype_table_matches_the_library(self):
        L = lib()
        for d, (size, name, aliases) in _cdefs.DTYPE_INFO.items():
            self.assertEqual(L.wsync_dtype_size(d), size)
            self.assertEqual(L.wsync_dtype_name(d).decode(), name)
            for n in (name,) + aliases:
                out = _cdefs.c_enum()
                self.assertEqual(L.wsync_dtype_parse(n.encode(), ctypes.byref(out)), 0, n)
                self.assertEqual(out.value, d, n)
                self.assertEqual(wsync.dtype_of(n), d, n)
        self.assertEqual(L.wsync_dtype_size(0), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
