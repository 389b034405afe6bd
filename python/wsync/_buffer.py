"""Holding a buffer-protocol export from Python through ctypes.

`Export(obj, writable)` calls PyObject_GetBuffer on obj and keeps the export until release():
while it is held, the exporter cannot move or resize its memory (a bytearray refuses to grow,
an mmap refuses to close), so the address handed to the library stays valid. Works for read-only
exporters (bytes, read-only memoryviews, mmaps opened read-only) as well, which
ctypes' from_buffer cannot do.
"""
from __future__ import annotations

import ctypes as C

_Py_ssize_t = C.c_ssize_t


class Py_buffer(C.Structure):
    # Include/pybuffer.h (part of the stable ABI since 3.11, unchanged since 3.3)
    _fields_ = [
        ("buf", C.c_void_p),
        ("obj", C.c_void_p),
        ("len", _Py_ssize_t),
        ("itemsize", _Py_ssize_t),
        ("readonly", C.c_int),
        ("ndim", C.c_int),
        ("format", C.c_char_p),
        ("shape", C.POINTER(_Py_ssize_t)),
        ("strides", C.POINTER(_Py_ssize_t)),
        ("suboffsets", C.POINTER(_Py_ssize_t)),
        ("internal", C.c_void_p),
    ]


PyBUF_WRITABLE = 0x0001
PyBUF_FORMAT = 0x0004
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND
PyBUF_RECORDS_RO = PyBUF_STRIDES | PyBUF_FORMAT

_api = C.pythonapi
_api.PyObject_GetBuffer.argtypes = [C.py_object, C.POINTER(Py_buffer), C.c_int]
_api.PyObject_GetBuffer.restype = C.c_int
_api.PyBuffer_Release.argtypes = [C.POINTER(Py_buffer)]
_api.PyBuffer_Release.restype = None
_api.PyBuffer_IsContiguous.argtypes = [C.POINTER(Py_buffer), C.c_char]
_api.PyBuffer_IsContiguous.restype = C.c_int


def is_buffer(obj) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


class Export:
    """A held buffer export: .address, .nbytes, .readonly, .itemsize, .format, .shape."""

    def __init__(self, obj, writable: bool = False):
        self._view = Py_buffer()
        flags = PyBUF_RECORDS_RO | (PyBUF_WRITABLE if writable else 0)
        # raises the exporter's own exception (BufferError, TypeError) on failure
        _api.PyObject_GetBuffer(obj, C.byref(self._view), flags)
        self._held = True
        v = self._view
        try:
            if not _api.PyBuffer_IsContiguous(C.byref(v), b"C"):
                raise ValueError("the buffer is not C-contiguous: pass a contiguous one")
        except BaseException:
            self.release()
            raise
        self.address = v.buf or 0
        self.nbytes = int(v.len)
        self.readonly = bool(v.readonly)
        self.itemsize = int(v.itemsize)
        self.format = (v.format or b"B").decode("ascii", "replace")
        self.shape = tuple(v.shape[i] for i in range(v.ndim)) if v.shape else (self.nbytes,)
        self.obj = obj

    def release(self) -> None:
        if getattr(self, "_held", False):
            self._held = False
            _api.PyBuffer_Release(C.byref(self._view))
            self.obj = None

    def __del__(self):
        self.release()
