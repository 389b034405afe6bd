"""The inference side: wsync_receiver_t."""
from __future__ import annotations

import ctypes as C
import operator
import threading
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional

from . import _cdefs as D
from ._cdefs import DType
from ._library import lib
from .context import Context
from .errors import InvalidArgumentError, StateError, WsyncTimeoutError, raise_status
from .layout import ModelConfig, Target
from .tensors import Region, dtype_name, region_of, view_format

__all__ = ["Receiver", "scale_name"]


def scale_name(target_name: str) -> str:
    """Key of an FP8 target's scales in Receiver.buffers / add_engine_targets(buffers=...):
    "<target name>_scale" ("model.layers.0.mlp.down_proj.weight_scale", vLLM's name)."""
    return target_name + "_scale"


def _owned(nbytes: int, fmt: str, shape) -> memoryview:
    """Zeroed host memory the receiver owns, as a typed memoryview of `shape`."""
    mv = memoryview(bytearray(nbytes))
    try:
        return mv.cast(fmt, list(shape))
    except (TypeError, ValueError):   # shapes with a 0 dim, formats cast refuses
        return mv


class Receiver:
    """An inference rank: describes the buffers it wants filled (its targets) and receives
    versions into them.

        with wsync.Receiver("10.0.0.1:29600", rank=r, receivers=R) as rv:
            rv.add_engine_targets("config.json", tp_rank=r, tp_size=R)   # host buffers
            while True:
                version = rv.wait()          # the targets now hold exactly this version
                serve(rv.buffers)

    Arguments left None come from WSYNC_* variables, then the library's defaults. Buffers the
    receiver allocates are zero-filled bytearrays, exposed as typed memoryviews in .buffers
    (bf16 as "H" bit patterns, f16 "e", f32 "f", FP8 and u8 "B"); FP8 targets' fp32 scales are
    in .buffers[scale_name(name)] too. Buffers passed in (torch tensors, HostTensors, writable
    buffer-protocol objects) are referenced until close() or set_target_data(). wait() blocks
    the calling thread (the GIL is released) up to its timeout. One thread at a time per
    receiver (a lock enforces it).

    on_version(version) is the per-version hook: called inside wait()/fetch() once a version is
    whole in the buffers and before the receiver commits it (so the senders' push returns only
    after it); re-derive here what the engine computes from its weights. Return None or 0; a
    non-zero int (one past a C int counts as -1), an exception or any other result (a
    TypeError) fails the version on this receiver (wait raises AbortedError, chained to the
    exception) and the group with it; the buffers then count as torn.

    delta ("off", "on", "auto") is this receiver's say in the group's delta mode
    (docs/delta.md): while its buffers hold the previous version intact, a version brings only
    the changed elements; after set_target_data, a failed version, or at the start, the next
    version comes in full."""

    def __init__(self, coordinator: Optional[str] = None, rank: Optional[int] = None,
                 receivers: Optional[int] = None, *, timeout_ms: Optional[int] = None,
                 heartbeat_ms: Optional[int] = None,
                 progress: Optional[Callable[[int, int, int], None]] = None,
                 on_version: Optional[Callable[[int], Any]] = None,
                 delta: Optional[str] = None,
                 context: Optional[Context] = None, log_level: Any = None):
        self._handle = None
        self._lock = threading.RLock()   # progress callbacks may read properties
        self._regions: Dict[str, Region] = {}
        self._scale_regions: Dict[str, Region] = {}
        self.targets: Dict[str, Target] = {}
        self.buffers: Dict[str, Any] = {}
        self._progress_error: Optional[BaseException] = None
        self._hook_error: Optional[BaseException] = None
        self._own_ctx = context is None
        self._ctx = Context(log_level) if context is None else context
        p = D.receiver_params_init()
        if coordinator is not None:
            p.coordinator = str(coordinator).encode()
        if rank is not None:
            p.rank = int(rank)
        if receivers is not None:
            p.nreceivers = int(receivers)
        if timeout_ms is not None:
            p.timeout_ms = int(timeout_ms)
        if heartbeat_ms is not None:
            p.heartbeat_ms = int(heartbeat_ms)
        if delta is not None:
            p.delta = str(delta).encode()
        self._progress_cb = None
        if progress is not None:
            me = weakref.ref(self)   # no cycle: the receiver is freed when its last user goes

            def on_progress(arg, version, done, total, _user=progress):
                rv = me()
                if rv is None or rv._progress_error is not None:
                    return
                try:
                    _user(version, done, total)
                except BaseException as e:   # raised again when wait returns
                    rv._progress_error = e
            self._progress_cb = D.wsync_progress_fn(on_progress)
            p.progress = self._progress_cb
        self._version_cb = None   # referenced while the C receiver may call it
        if on_version is not None:
            me_v = weakref.ref(self)

            def on_version_c(arg, version, _user=on_version):
                rv = me_v()
                try:
                    r = _user(int(version))
                    # None (a function that returns nothing) is success; ints as the C hook's.
                    # Converted here, inside the try: an exception escaping a ctypes callback
                    # is only printed, and a C int would wrap (2**32 reads as 0, success).
                    if r is None:
                        return 0
                    try:
                        code = operator.index(r)
                    except TypeError:
                        raise TypeError(f"on_version returned {r!r}: it must return None, 0 "
                                        "or a non-zero int") from None
                    return code if -2 ** 31 <= code < 2 ** 31 else -1
                except BaseException as e:   # the version fails; wait raises AbortedError from e
                    if rv is not None:
                        rv._hook_error = e
                    return -1
            self._version_cb = D.wsync_version_fn(on_version_c)
            p.on_version = self._version_cb
        ctx = self._ctx._acquire()
        h = C.c_void_p()
        try:
            st = lib().wsync_receiver_create(ctx, C.byref(p), C.byref(h))
            if st != 0:
                raise_status(st, "wsync_receiver_create")
        except BaseException:
            self._ctx._release()
            if self._own_ctx:
                self._ctx.close()
            raise
        self._handle = h.value

    # -- lifetime ---------------------------------------------------------------------------

    def _h(self) -> int:
        if self._handle is None:
            raise StateError("the receiver is closed", None)
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Leave the group and free the receiver. The buffers it allocated stay readable
        (they are ordinary Python objects now). Closing twice is a no-op."""
        with self._lock:
            h, self._handle = self._handle, None
            if h is None:
                return
            lib().wsync_receiver_free(h)
            for r in list(self._regions.values()) + list(self._scale_regions.values()):
                r.release()
            self._regions = {}
            self._scale_regions = {}
            self._ctx._release()
            if self._own_ctx:
                self._ctx.close()

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None) is not None:
                self.close()
        except Exception:
            pass

    # -- describing targets -------------------------------------------------------------------

    def _buffer_region(self, t: Target, buffer: Any, what: str) -> Region:
        r = region_of(buffer, dtype=t.dtype, writable=True, what=what)
        if r.dtype != t.dtype:
            r.release()
            raise InvalidArgumentError(f"{what} is {dtype_name(t.dtype)}, the buffer "
                                       f"{dtype_name(r.dtype)}", None)
        if r.nbytes != t.nbytes:
            r.release()
            raise InvalidArgumentError(f"{what} needs {t.nbytes} bytes ({list(t.shape)} "
                                       f"{dtype_name(t.dtype)}), the buffer has {r.nbytes}",
                                       None)
        return r

    def _scales_region(self, t: Target, scales: Any, what: str) -> Region:
        n = t.scale_count
        r = region_of(scales, dtype=DType.F32, writable=True, what=what + " scales")
        if r.dtype != DType.F32 or r.nbytes != 4 * n:
            r.release()
            raise InvalidArgumentError(f"{what} needs {n} float32 scales ({4 * n} bytes), the "
                                       f"scales buffer has {r.nbytes} bytes of "
                                       f"{dtype_name(r.dtype)}", None)
        return r

    def add_target(self, target: Target, buffer: Any = None, scales: Any = None) -> Any:
        """Describe one destination buffer. buffer None: the receiver allocates host memory
        (a typed memoryview, returned and kept in .buffers[target.name]). For a quantized FP8
        target, `scales` (float32, target.scale_count of them) likewise. Returns the buffer.
        InvalidArgumentError for a buffer of the wrong size or dtype; UnsupportedError for CUDA
        memory when libwsync was built without CUDA or sees no GPU; StateError after the first
        wait. A torch CUDA tensor is landed on its device (device.index) in place."""
        what = f"target '{target.name}'"
        if buffer is None:
            buffer = _owned(target.nbytes, view_format(target.dtype), target.shape)
        region = self._buffer_region(target, buffer, what)
        sregion = None
        try:
            if target.quantized:
                if scales is None:
                    scales = _owned(4 * target.scale_count, "f", (target.scale_count,))
                sregion = self._scales_region(target, scales, what)
            elif scales is not None:
                raise InvalidArgumentError(f"{what} is not a quantized FP8 target; it takes no "
                                           "scales", None)
            keep: list = []
            ct = target._c(keep, region.address, int(region.mem), region.device,
                           sregion.address if sregion else 0)
            if sregion is not None:
                ct.quant.scales_mem = int(sregion.mem)     # host or CUDA scales
            with self._lock:
                st = lib().wsync_receiver_add_target(self._h(), C.byref(ct))
                if st != 0:
                    raise_status(st, "wsync_receiver_add_target")
                self._regions[target.name] = region
                self.targets[target.name] = target
                self.buffers[target.name] = buffer
                if sregion is not None:
                    self._scale_regions[target.name] = sregion
                    self.buffers[scale_name(target.name)] = scales
        except BaseException:
            region.release()
            if sregion is not None:
                sregion.release()
            raise
        return buffer

    def add_engine_targets(self, config: Any, tp_rank: int, tp_size: int,
                           buffers: Optional[Mapping[str, Any]] = None,
                           **tp_options: Any) -> Dict[str, Any]:
        """Describe every target of a vLLM-style TP rank in one call.

        config: a ModelConfig, a config.json path (or model directory), JSON text or a dict.
        buffers: name -> buffer for the targets (and "<name>_scale" -> float32 buffer for FP8
        targets' scales) the engine already has; targets it does not name get host memory the
        receiver allocates. None: allocate every one. A name that is no target is an error.
        tp_options: as ModelConfig.tp_targets (quant="fp8-block", block=..., vocab_pad=...,
        dtype=..., param_dtype=...).
        Returns .buffers: name -> buffer, scales included."""
        cfg = ModelConfig.of(config)
        targets = cfg.tp_targets(tp_rank, tp_size, **tp_options)
        given = dict(buffers or {})
        known = set()
        for t in targets:
            known.add(t.name)
            if t.quantized:
                known.add(scale_name(t.name))
        unknown = sorted(set(given) - known)
        if unknown:
            raise InvalidArgumentError(
                f"buffers name {len(unknown)} unknown targets: {', '.join(unknown[:5])}"
                f"{' ...' if len(unknown) > 5 else ''} (TP rank {tp_rank} of {tp_size} has "
                f"{len(targets)} targets, e.g. '{targets[0].name}')", None)
        for t in targets:
            self.add_target(t, given.get(t.name), given.get(scale_name(t.name)))
        return self.buffers

    def set_target_data(self, name: str, buffer: Any, scales: Any = None) -> None:
        """Point target `name` at another buffer (same size and dtype) — and an FP8 target at
        other scales (None keeps the current ones) — for the next versions; only between waits.
        This is shadow mode (land in a spare buffer, swap at commit) and sleep/wake. The old
        buffer is let go; the new one is kept (and shown in .buffers)."""
        t = self.targets.get(name)
        if t is None:
            # let the library say it, with its text (it looks the name up before the buffer,
            # which it then never touches)
            probe = C.create_string_buffer(1)
            with self._lock:
                st = lib().wsync_receiver_set_target_data(self._h(), name.encode(),
                                                          C.addressof(probe), None)
                raise_status(st if st != 0 else D.Status.ERR_NOT_FOUND,
                             "wsync_receiver_set_target_data")
        what = f"target '{name}'"
        region = self._buffer_region(t, buffer, what)
        sregion = None
        try:
            if scales is not None:
                if not t.quantized:
                    raise InvalidArgumentError(f"{what} is not a quantized FP8 target; it "
                                               "takes no scales", None)
                sregion = self._scales_region(t, scales, what)
            sp = C.cast(C.c_void_p(sregion.address), C.POINTER(C.c_float)) if sregion else None
            with self._lock:
                st = lib().wsync_receiver_set_target_data(self._h(), name.encode(),
                                                          region.address, sp)
                if st != 0:
                    raise_status(st, "wsync_receiver_set_target_data")
                self._regions.pop(name).release()
                self._regions[name] = region
                self.buffers[name] = buffer
                if sregion is not None:
                    self._scale_regions.pop(name).release()
                    self._scale_regions[name] = sregion
                    self.buffers[scale_name(name)] = scales
        except BaseException:
            if self._regions.get(name) is not region:
                region.release()
            if sregion is not None and self._scale_regions.get(name) is not sregion:
                sregion.release()
            raise

    # -- receiving ------------------------------------------------------------------------------

    def wait(self, timeout_ms: Optional[int] = None) -> int:
        """Wait up to timeout_ms (None: the receiver's timeout; 0: just look) for the next
        version to begin, receive it into the targets and commit it; return its number.
        WsyncTimeoutError when no version began (the targets are untouched). PeerLostError,
        AbortedError, MismatchError (naming the param) when the group failed; a version that did
        not complete is never reported (.torn says whether the targets hold part of one)."""
        v = C.c_uint64()
        t = -1 if timeout_ms is None else int(timeout_ms)
        with self._lock:
            self._progress_error = None
            self._hook_error = None
            st = lib().wsync_receiver_wait(self._h(), t, C.byref(v))
            if st != 0:
                self._raise_with_hook(st, "wsync_receiver_wait")
            err, self._progress_error = self._progress_error, None
        if err is not None:
            raise err
        return int(v.value)

    def fetch(self, version: int = 0, timeout_ms: Optional[int] = None) -> int:
        """Land version `version` (0: the newest one newer than what the targets hold), waiting
        up to timeout_ms (None: the receiver's timeout) for it to be published; return the
        version landed. `store` scheme only (elsewhere versions are pushed: use wait).
        NotFoundError when the version was evicted or never published (the message says which
        the store keeps); WsyncTimeoutError when it did not appear in time."""
        got = C.c_uint64()
        t = -1 if timeout_ms is None else int(timeout_ms)
        with self._lock:
            self._hook_error = None
            st = lib().wsync_receiver_fetch(self._h(), C.c_uint64(int(version)), t, C.byref(got))
            if st != 0:
                self._raise_with_hook(st, "wsync_receiver_fetch")
        return int(got.value)

    def _raise_with_hook(self, st: int, what: str) -> None:
        """raise_status, chained to the exception the on_version hook raised, if it did."""
        err, self._hook_error = self._hook_error, None
        if err is None:
            raise_status(st, what)
        try:
            raise_status(st, what)
        except Exception as e:
            raise e from err

    def poll(self, timeout_ms: int = 0) -> Optional[int]:
        """wait(), but None instead of WsyncTimeoutError when no version began."""
        try:
            return self.wait(timeout_ms)
        except WsyncTimeoutError:
            return None

    @property
    def version(self) -> int:
        """The last committed version (0 if none)."""
        with self._lock:
            return int(lib().wsync_receiver_version(self._h()))

    @property
    def torn(self) -> bool:
        """True when a version began landing in the targets and did not complete."""
        with self._lock:
            return bool(lib().wsync_receiver_torn(self._h()))

    @property
    def scheme(self) -> Optional[str]:
        """The group's scheme ("ipc"), or None before setup."""
        with self._lock:
            v = lib().wsync_receiver_scheme(self._h())
        return v.decode() if v else None

    @property
    def context(self) -> Context:
        return self._ctx

    def target_names(self) -> List[str]:
        return list(self.targets)
