"""wsync's status codes as exceptions.

Every failing library call raises a subclass of WsyncError chosen by its status; the exception
carries the status (``.status``, a wsync.Status), its name (``.status_name``, e.g.
"WSYNC_ERR_MISMATCH") and the library's own text (``.message``, what wsync_last_error() said:
"descriptions of senders and receivers do not match: ... 'model.layers.2.mlp.gate_proj.weight'
..."). ``str(e)`` is "<status name>: <message>".

Mistakes the package catches before calling the library (a buffer of the wrong size, an unknown
dtype name) raise the same classes, with the package's own message.
"""
from __future__ import annotations

import builtins

from . import _cdefs
from ._cdefs import Status

__all__ = [
    "WsyncError", "InvalidArgumentError", "OutOfMemoryError", "WsyncTimeoutError",
    "PeerLostError", "ProtocolError", "MismatchError", "UnsupportedError", "StateError",
    "WsyncIOError", "AbortedError", "NotFoundError", "RangeError", "NonFiniteError",
    "ConfigError", "DeviceError", "TransportError", "IntegrityError", "InternalError",
    "error_class", "raise_status",
]


class WsyncError(Exception):
    """A wsync call failed. Attributes: status (wsync.Status), status_name ("WSYNC_ERR_..."),
    message (the library's text, as wsync_last_error() gave it)."""

    status = Status.ERR_INTERNAL

    def __init__(self, message: str, status: int | None = None):
        if status is not None:
            try:
                self.status = Status(status)
            except ValueError:
                self.status = status
        self.message = message
        super().__init__(message)

    @property
    def status_name(self) -> str:
        if isinstance(self.status, Status):
            return "WSYNC_" + self.status.name
        return f"WSYNC_UNKNOWN({self.status})"

    def __str__(self) -> str:
        return f"{self.status_name}: {self.message}"

    def __reduce__(self):   # picklable (multiprocessing), keeping the status
        return (_rebuild, (type(self), self.message, int(self.status)))


def _rebuild(cls, message, status):
    return cls(message, status)


def _make(name: str, status: Status, doc: str, *bases):
    cls = type(name, (WsyncError,) + bases, {"status": status, "__doc__": doc,
                                              "__module__": __name__})
    return cls


InvalidArgumentError = _make("InvalidArgumentError", Status.ERR_INVALID,
                             "WSYNC_ERR_INVALID: a bad argument (also a ValueError).",
                             ValueError)
OutOfMemoryError = _make("OutOfMemoryError", Status.ERR_NOMEM,
                         "WSYNC_ERR_NOMEM (also a MemoryError).", MemoryError)
WsyncTimeoutError = _make("WsyncTimeoutError", Status.ERR_TIMEOUT,
                          "WSYNC_ERR_TIMEOUT: a deadline passed (also the built-in "
                          "TimeoutError).", builtins.TimeoutError)
PeerLostError = _make("PeerLostError", Status.ERR_PEER_LOST,
                      "WSYNC_ERR_PEER_LOST: a peer died, stalled or disconnected; the message "
                      "names it. The group is over.")
ProtocolError = _make("ProtocolError", Status.ERR_PROTOCOL,
                      "WSYNC_ERR_PROTOCOL: a malformed or unexpected message.")
MismatchError = _make("MismatchError", Status.ERR_MISMATCH,
                      "WSYNC_ERR_MISMATCH: the senders' and receivers' descriptions do not "
                      "match (an unknown param, an uncovered box, a dtype or shape mismatch); "
                      "the message names the param.")
UnsupportedError = _make("UnsupportedError", Status.ERR_UNSUPPORTED,
                         "WSYNC_ERR_UNSUPPORTED: not supported by this build or version (CUDA "
                         "memory in a build without CUDA, for one).")
StateError = _make("StateError", Status.ERR_STATE,
                   "WSYNC_ERR_STATE: the call is not valid in the object's current state.")
WsyncIOError = _make("WsyncIOError", Status.ERR_IO, "WSYNC_ERR_IO: a system call failed.")
AbortedError = _make("AbortedError", Status.ERR_ABORTED, "WSYNC_ERR_ABORTED: the group was "
                     "aborted.")
NotFoundError = _make("NotFoundError", Status.ERR_NOT_FOUND, "WSYNC_ERR_NOT_FOUND.")
RangeError = _make("RangeError", Status.ERR_RANGE, "WSYNC_ERR_RANGE: a value out of range.")
NonFiniteError = _make("NonFiniteError", Status.ERR_NONFINITE, "WSYNC_ERR_NONFINITE: NaN or "
                       "Inf in a source.")
ConfigError = _make("ConfigError", Status.ERR_CONFIG, "WSYNC_ERR_CONFIG: an invalid model "
                    "configuration, or one the engines refuse at this size.")
DeviceError = _make("DeviceError", Status.ERR_DEVICE, "WSYNC_ERR_DEVICE: a CUDA error.")
TransportError = _make("TransportError", Status.ERR_TRANSPORT, "WSYNC_ERR_TRANSPORT.")
IntegrityError = _make("IntegrityError", Status.ERR_INTEGRITY, "WSYNC_ERR_INTEGRITY: data "
                       "failed its integrity check.")
InternalError = _make("InternalError", Status.ERR_INTERNAL, "WSYNC_ERR_INTERNAL.")

_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, OutOfMemoryError, WsyncTimeoutError, PeerLostError, ProtocolError,
    MismatchError, UnsupportedError, StateError, WsyncIOError, AbortedError, NotFoundError,
    RangeError, NonFiniteError, ConfigError, DeviceError, TransportError, IntegrityError,
    InternalError)}
assert set(_BY_STATUS) == {s for s in Status if s != Status.OK}


def error_class(status: int) -> type:
    """The WsyncError subclass for a status (WsyncError itself for a code the package does not
    know)."""
    try:
        return _BY_STATUS[Status(status)]
    except (ValueError, KeyError):
        return WsyncError


def raise_status(status: int, what: str = "") -> None:
    """Raise the exception for a failed call's status, with wsync_last_error()'s text (read on
    this thread, right after the call). `what` names the call when the library left no text."""
    from ._library import lib
    text = lib().wsync_last_error()
    message = text.decode("utf-8", "replace") if text else ""
    if not message:
        names = dict((c, t) for _, c, t in _cdefs.STATUS_MAP)
        message = names.get(status, f"status {status}") + (f" ({what})" if what else "")
    raise error_class(status)(message, status)
