"""wsync_ctx_t: one per process is enough; senders and receivers make their own if not given
one."""
from __future__ import annotations

import ctypes as C
import threading
from dataclasses import dataclass
from typing import Any, List, Optional

from . import _cdefs as D
from ._cdefs import LogLevel, Mem
from ._library import lib
from .errors import StateError, raise_status

__all__ = ["Context", "ComponentInfo"]

_LEVELS = {"error": LogLevel.ERROR, "warn": LogLevel.WARN, "info": LogLevel.INFO,
           "debug": LogLevel.DEBUG}


def log_level_of(value: Any) -> int:
    if value is None:
        return LogLevel.UNSET
    if isinstance(value, str):
        try:
            return _LEVELS[value.lower()]
        except KeyError:
            from .errors import InvalidArgumentError
            raise InvalidArgumentError(f"unknown log level {value!r}: use one of "
                                       + ", ".join(_LEVELS), None) from None
    return LogLevel(value)


@dataclass(frozen=True)
class ComponentInfo:
    """A transport or scheme as the library sees it (wsync_component_info_t)."""
    name: str
    compiled: bool
    available: bool
    reason: str
    caps: str


def _s(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


class Context:
    """A wsync context (wsync_ctx_t): reads WSYNC_* variables; transports are probed on first
    need (a Sender's or Receiver's scheme, or transports() and the other info calls).

    ``with Context(log_level="info") as ctx: ...``. ``verify=True`` checksums every chunk of
    every version (WSYNC_VERIFY; None: from the environment). Must outlive every Sender and
    Receiver made with it: close() refuses (StateError) while any is open. Thread-safe."""

    def __init__(self, log_level: Any = None, verify: Optional[bool] = None):
        params = D.ctx_params_init()
        params.log_level = log_level_of(log_level)
        if verify is not None:
            params.verify = 1 if verify else 0
        h = C.c_void_p()
        st = lib().wsync_ctx_create(C.byref(params), C.byref(h))
        if st != 0:
            raise_status(st, "wsync_ctx_create")
        self._handle = h.value
        self._lock = threading.Lock()
        self._users = 0

    @property
    def handle(self) -> int:
        """The wsync_ctx_t * (an int) for code that calls the C API itself."""
        if self._handle is None:
            raise StateError("the context is closed", None)
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _acquire(self) -> int:
        with self._lock:
            h = self.handle
            self._users += 1
            return h

    def _release(self) -> None:
        with self._lock:
            self._users -= 1

    def transports(self) -> List[ComponentInfo]:
        """Every transport (shm, tcp, cuda_ipc, nccl, ucx, ofi): compiled, available, why."""
        return self._infos(lib().wsync_transport_count, lib().wsync_transport_info)

    def schemes(self) -> List[ComponentInfo]:
        """Every scheme (ipc, nccl, store)."""
        return self._infos(lib().wsync_scheme_count, lib().wsync_scheme_info)

    def _infos(self, count, info) -> List[ComponentInfo]:
        out = []
        for i in range(count(self.handle)):
            ci = D.wsync_component_info_t()
            st = info(self.handle, i, C.byref(ci))
            if st != 0:
                raise_status(st)
            out.append(ComponentInfo(_s(ci.name), bool(ci.compiled), bool(ci.available),
                                     _s(ci.reason), _s(ci.caps)))
        return out

    def explain(self, mem: Any = "host", senders: int = 1, receivers: int = 1) -> str:
        """Which scheme a group of this size on this machine would get, and why each other one
        is refused. UnsupportedError when none could serve (its message holds the lines)."""
        m = Mem[mem.upper()] if isinstance(mem, str) else Mem(mem)
        buf = C.create_string_buffer(8192)
        st = lib().wsync_ctx_explain(self.handle, int(m), int(senders), int(receivers), buf,
                                     len(buf))
        if st != 0:
            raise_status(st, "wsync_ctx_explain")
        return buf.value.decode("utf-8", "replace")

    def close(self) -> None:
        """Free the context. StateError while a Sender or Receiver made with it is open.
        Closing twice is a no-op."""
        with self._lock:
            if self._handle is None:
                return
            if self._users:
                raise StateError(f"the context still has {self._users} open senders or "
                                 "receivers: close them first", None)
            h, self._handle = self._handle, None
        lib().wsync_ctx_free(h)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None) is not None and not self._users:
                self.close()
        except Exception:
            pass
