"""Finding and loading libwsync.

Search order (the first that loads wins):
  1. $WSYNC_LIBRARY: the path of the library, or a directory holding it. When set, nothing else
     is tried: a wrong value is an error, not a reason to pick up some other build.
  2. Next to the installed package: wsync/libwsync.so, wsync/lib/libwsync.so, then the lib
     directories of the Python prefix (sys.prefix/lib, lib64), where `cmake --install build
     --prefix $VIRTUAL_ENV` puts it.
  3. The build tree, when the package is imported from a checkout (<repo>/python/wsync):
     <repo>/build/libwsync.so, then any other <repo>/build*/libwsync.so, newest first.
  4. The standard library paths: the dynamic loader's own search (LD_LIBRARY_PATH, the ld.so
     cache, /lib, /usr/lib) for libwsync.so.0 and libwsync.so, then /usr/local/lib and
     /opt/wsync/lib.

A failure raises LibraryNotFoundError listing every place looked at and why each failed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path

from . import _cdefs

__all__ = ["LibraryNotFoundError", "lib", "library_path"]

_NAMES = ("libwsync.so", "libwsync.so.0")


class LibraryNotFoundError(ImportError):
    """libwsync could not be found or loaded; the message lists where the package looked."""


_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    """(description, path or soname) in search order, without $WSYNC_LIBRARY."""
    pkg = Path(__file__).resolve().parent
    out = []
    for d in (pkg, pkg / "lib"):
        for n in _NAMES:
            out.append((f"next to the package: {d / n}", str(d / n)))
    prefixes = []
    for p in (sys.prefix, sys.exec_prefix):
        if p not in prefixes:
            prefixes.append(p)
    for p in prefixes:
        for sub in ("lib", "lib64"):
            out.append((f"the Python prefix: {Path(p) / sub / 'libwsync.so'}",
                        str(Path(p) / sub / "libwsync.so")))
    repo = pkg.parent.parent
    if (repo / "include" / "wsync" / "wsync.h").is_file():
        builds = [repo / "build"]
        others = [b for b in repo.glob("build*") if b.is_dir() and b.name != "build"]
        others.sort(key=lambda b: (b / "libwsync.so").stat().st_mtime
                    if (b / "libwsync.so").exists() else 0.0, reverse=True)
        for b in builds + others:
            out.append((f"the build tree: {b / 'libwsync.so'}", str(b / "libwsync.so")))
    else:
        out.append((f"the build tree: none ({repo} is not a wsync checkout)", None))
    for n in ("libwsync.so.0", "libwsync.so"):
        out.append((f"the dynamic loader's search (LD_LIBRARY_PATH, ld.so cache): {n}", n))
    found = ctypes.util.find_library("wsync")
    if found:
        out.append((f"ctypes.util.find_library: {found}", found))
    for d in ("/usr/local/lib", "/usr/local/lib64", "/opt/wsync/lib", "/opt/wsync/lib64"):
        out.append((f"a standard path: {d}/libwsync.so", f"{d}/libwsync.so"))
    return out


def _try(path: str):
    if os.sep in path and not os.path.exists(path):
        return None, "no such file"
    try:
        return ctypes.CDLL(path), None
    except OSError as e:
        return None, str(e)


def _declare(handle) -> None:
    for name, (restype, argtypes) in _cdefs.PROTOTYPES.items():
        fn = getattr(handle, name)   # AttributeError: the library lacks a public function
        fn.restype = restype
        fn.argtypes = argtypes


def _canary(handle) -> None:
    """Cheap run-time check that the structs the library reads and writes have the layout this
    package declares (the full check is tests/python/test_abi.py)."""
    t = _cdefs.wsync_target_t()
    t.dtype = _cdefs.DType.F32
    t.ndim = 2
    t.shape[0], t.shape[1] = 3, 5
    t.quant.scheme = _cdefs.QuantScheme.BLOCK
    t.quant.block_rows, t.quant.block_cols = 2, 4
    p = _cdefs.wsync_param_t(b"canary", _cdefs.DType.BF16, 2)
    p.shape[0], p.shape[1] = 10, 7
    box = _cdefs.wsync_box_t()
    st = handle.wsync_layout_shard_box(ctypes.byref(p), 0, 2, 3, ctypes.byref(box))
    got = (handle.wsync_target_bytes(ctypes.byref(t)), handle.wsync_target_scale_count(
        ctypes.byref(t)), st, tuple(box.start[:2]), tuple(box.len[:2]))
    want = (60, 4, 0, (8, 0), (2, 7))
    if got != want:
        raise LibraryNotFoundError(
            f"the library at {_path} does not agree with this package's struct layouts "
            f"(canary gave {got}, expected {want}): rebuild the package and the library from "
            "one checkout")


def lib():
    """The loaded library (a ctypes.CDLL with every prototype declared). Loads it on first use;
    thread-safe."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("WSYNC_LIBRARY")
        if env:
            p = Path(env)
            paths = [p / n for n in _NAMES] if p.is_dir() else [p]
            for q in paths:
                handle, why = _try(str(q))
                if handle is not None:
                    return _finish(handle, str(q))
                tried.append(f"$WSYNC_LIBRARY: {q}: {why}")
            raise LibraryNotFoundError(
                "libwsync could not be loaded from WSYNC_LIBRARY=" + env + ":\n  " +
                "\n  ".join(tried))
        for desc, path in _candidates():
            if path is None:
                tried.append(desc)
                continue
            handle, why = _try(path)
            if handle is not None:
                return _finish(handle, path)
            tried.append(f"{desc}: {why}")
        raise LibraryNotFoundError(
            "libwsync not found. Build it (cmake -B build -S . && cmake --build build) and set "
            "WSYNC_LIBRARY to build/libwsync.so, or install it. Looked at:\n  " +
            "\n  ".join(["$WSYNC_LIBRARY: not set"] + tried))


def _finish(handle, path: str):
    global _lib, _path
    _path = path
    try:
        _declare(handle)
    except AttributeError as e:
        raise LibraryNotFoundError(f"{path} is not a libwsync this package can use: {e}") from None
    _canary(handle)
    _lib = handle
    return handle


def library_path() -> str:
    """Path (or soname) the library was loaded from; loads it if needed."""
    lib()
    return _path
