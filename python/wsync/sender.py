"""The trainer side: wsync_sender_t."""
from __future__ import annotations

import ctypes as C
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _cdefs as D
from ._cdefs import WSYNC_REPLICATE
from ._library import lib
from .context import Context
from .errors import InvalidArgumentError, StateError, raise_status
from .layout import Box, ModelConfig, Param, ShardSpec, fused_params, shard_box
from .tensors import (Region, dtensor_box, dtype_name, dtype_size, is_dtensor,
                      is_fused_experts, region_of, sub_region)

__all__ = ["Sender", "PushStats"]


@dataclass(frozen=True)
class PushStats:
    """Figures of the last successful push (wsync_push_stats_t)."""
    version: int
    bytes_packed: int       # bytes this sender staged into buckets
    bytes_delivered: int    # bytes copied into all receivers' targets, from this sender
    buckets: int
    seconds: float          # push call to every receiver committed
    # delta versions (0 when the group's delta mode is off): bytes put on the wire
    bytes_wire: int = 0     # bytes_encoded + bytes_plain
    bytes_encoded: int = 0  # encoded delta streams
    bytes_plain: int = 0    # chunks that went plain
    base_version: int = 0   # the version the deltas were encoded against; 0: full


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    try:
        return int(v) if v not in (None, "") else default
    except ValueError:
        return default


def _opt(value: Optional[str]) -> Optional[bytes]:
    return None if value is None else str(value).encode()


class Sender:
    """A trainer rank: describes the shards it holds and pushes versions of them.

        with wsync.Sender("10.0.0.1:29600", rank=i, world=N, receivers=R) as s:
            s.add_state_dict(model.state_dict())     # FSDP: DTensor shards, boxes from placement
            for step in ...:
                train_step()
                s.push(step)                         # returns when every receiver committed

    Sender rank 0 hosts the coordinator on `coordinator` ("host:port"; port 0 picks a free one:
    read it back from .coordinator). Arguments left None come from the WSYNC_* variables, then
    the library's defaults (timeout 60 s, 256 MiB buckets, scheme auto). `snapshot` and
    `keep_versions` concern the store scheme (copy each version so the trainer may step on at
    once; how many versions readers may fetch). `copy_shards` makes each push copy the shards
    into memory of wsync's (their bytes once more, host or device like them) before push_begin
    returns, so that the trainer may write them at once (see push_begin). `delta` ("off", "on",
    "auto") is this sender's say in the group's delta mode (docs/delta.md: receivers that hold
    the previous version get only the changed elements); `delta_baseline` ("device" or "host")
    is where CUDA shards' baseline (their previous values) is kept; `delta_cutoff` (a fraction
    in (0, 1]) the encoded size, against a chunk's plain bytes, past which the chunk travels
    plain (None: the default per memory kind, docs/delta.md). `fp8_wire` (rank 0's counts) lets
    senders quantize the chunks of FP8 targets and send codes and scales (docs/fp8_wire.md): 0
    never, 1 where it pays, 2 wherever allowed (None: WSYNC_FP8_WIRE, else 1).

    Memory given to add_shard / add_state_dict is read in place at every push: keep updating it
    in place (optimizer steps do), and do not free or reallocate it while the sender is open; the
    sender keeps a reference to every object (and holds buffer exports) until close().
    A push blocks the calling thread (not the interpreter: the GIL is released), up to the
    timeout. One thread at a time per sender (a lock enforces it)."""

    def __init__(self, coordinator: Optional[str] = None, rank: Optional[int] = None,
                 world: Optional[int] = None, receivers: Optional[int] = None, *,
                 scheme: Optional[str] = None, bucket_bytes: Optional[int] = None,
                 timeout_ms: Optional[int] = None, heartbeat_ms: Optional[int] = None,
                 snapshot: Optional[bool] = None, keep_versions: Optional[int] = None,
                 copy_shards: Optional[bool] = None, delta: Optional[str] = None,
                 delta_baseline: Optional[str] = None, delta_cutoff: Optional[float] = None,
                 fp8_wire: Optional[int] = None, context: Optional[Context] = None,
                 log_level: Any = None):
        self._handle = None
        self._regions: List[Region] = []
        self._shards: List[ShardSpec] = []
        self._lock = threading.RLock()
        self._own_ctx = context is None
        self._ctx = Context(log_level) if context is None else context
        p = D.sender_params_init()
        p.coordinator = _opt(coordinator)
        if rank is not None:
            p.rank = int(rank)
        if world is not None:
            p.nranks = int(world)
        if receivers is not None:
            p.nreceivers = int(receivers)
        p.scheme = _opt(scheme)
        if bucket_bytes is not None:
            p.bucket_bytes = int(bucket_bytes)
        if timeout_ms is not None:
            p.timeout_ms = int(timeout_ms)
        if heartbeat_ms is not None:
            p.heartbeat_ms = int(heartbeat_ms)
        if snapshot is not None:
            p.snapshot = int(bool(snapshot))
        if keep_versions is not None:
            p.keep_versions = int(keep_versions)
        if copy_shards is not None:
            p.copy_shards = int(bool(copy_shards))
        p.delta = _opt(delta)
        p.delta_baseline = _opt(delta_baseline)
        if delta_cutoff is not None:
            p.delta_cutoff = float(delta_cutoff)
        if fp8_wire is not None:
            p.fp8_wire = int(fp8_wire)
        self.rank = int(rank) if rank is not None else _env_int("WSYNC_SENDER_RANK", 0)
        self.world = int(world) if world is not None else _env_int("WSYNC_SENDERS", 1)
        ctx = self._ctx._acquire()
        h = C.c_void_p()
        try:
            st = lib().wsync_sender_create(ctx, C.byref(p), C.byref(h))
            if st != 0:
                raise_status(st, "wsync_sender_create")
        except BaseException:
            self._ctx._release()
            if self._own_ctx:
                self._ctx.close()
            raise
        self._handle = h.value

    # -- lifetime ---------------------------------------------------------------------------

    def _h(self) -> int:
        if self._handle is None:
            raise StateError("the sender is closed", None)
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Leave the group and free the sender (then its memory references and, if it made
        one, its context). Closing twice is a no-op."""
        with self._lock:
            h, self._handle = self._handle, None
            if h is None:
                return
            lib().wsync_sender_free(h)
            for r in self._regions:
                r.release()
            self._regions = []
            self._ctx._release()
            if self._own_ctx:
                self._ctx.close()

    def __enter__(self) -> "Sender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None) is not None:
                self.close()
        except Exception:
            pass

    # -- describing shards ------------------------------------------------------------------

    @property
    def shards(self) -> List[ShardSpec]:
        """What this sender described to the library, in order (a fused expert tensor as the
        per-expert boxes it holds)."""
        return list(self._shards)

    def add_shard(self, param: Union[str, Param], tensor: Any, box: Any = None, *,
                  global_shape: Optional[Sequence[int]] = None, dtype: Any = None) -> ShardSpec:
        """Describe one shard: box `box` of param `param` lives in `tensor`.

        param: a Param, or the checkpoint name (then the global shape is `global_shape`, else
        the tensor's own shape, and the dtype is the tensor's).
        tensor: a torch tensor (cpu, or cuda: WSYNC_MEM_CUDA on device.index; one CUDA device
        per sender; synchronize the GPU work writing it before each push), a DTensor (its local shard, the box from its placement: leave box None), a
        HostTensor, or a buffer-protocol object (then dtype=... says its dtype).
        box: a Box or (start, len); None is the whole param. The tensor holds either exactly the
        box (the rank's local shard) or the whole param (then the box must be one contiguous
        range of it, e.g. FSDP rows, and the sender reads that range in place).
        A fused expert tensor of HF transformers 5.x ("model.layers.L.mlp.experts.gate_up_proj"
        [E, 2I, Hd], gate rows first, or "...mlp.experts.down_proj" [E, Hd, I]), whole, a box of
        it or a DTensor shard of it, is described as the boxes of the per-expert checkpoint params
        it holds ("...mlp.experts.{e}.gate_proj.weight" and so on), read in place; .shards then
        lists those, and the ShardSpec returned is the fused one.
        Returns the ShardSpec described. Errors: InvalidArgumentError (names the param and what
        is wrong), UnsupportedError for CUDA memory when libwsync was built without CUDA or sees no
        GPU (or on a second CUDA device), StateError after setup/first push."""
        name = param.name if isinstance(param, Param) else str(param)
        what = f"param '{name}'"
        if is_dtensor(tensor):
            if box is not None:
                raise InvalidArgumentError(f"{what}: a DTensor's box comes from its placement; "
                                           "leave box None", None)
            gshape, start, length = dtensor_box(tensor)
            local = tensor.to_local()
            region = region_of(local, dtype=dtype, what=what)
            if tuple(region.shape) != tuple(length):
                region.release()
                raise InvalidArgumentError(
                    f"{what}: the DTensor's local tensor is {list(region.shape)}, but its "
                    f"placement gives a box of {list(length)} (start {list(start)})", None)
            pdtype = region.dtype
            if isinstance(param, Param):
                self._check_param(param, gshape, pdtype)
            p = param if isinstance(param, Param) else Param(name, pdtype, gshape)
            return self._add(p, Box(start, length), region)
        if dtype is None and isinstance(param, Param):
            dtype = param.dtype
        region = region_of(tensor, dtype=dtype, what=what)
        try:
            if isinstance(param, Param):
                p = param
                if region.dtype != p.dtype:
                    raise InvalidArgumentError(f"{what} is {dtype_name(p.dtype)}, the tensor "
                                               f"{dtype_name(region.dtype)}", None)
            else:
                gshape = tuple(global_shape) if global_shape is not None else region.shape
                p = Param(name, region.dtype, gshape)
            b = self._box(box, p)
            return self._add(p, b, self._place(region, p, b, what))
        except BaseException:
            region.release()
            raise

    def add_state_dict(self, state_dict: Mapping[str, Any], layout: Union[str, int] = "fsdp",
                       rank: Optional[int] = None, world: Optional[int] = None, *,
                       config: Any = None, tp: Any = None, ep: Any = None,
                       etp: Any = None) -> List[ShardSpec]:
        """Describe every entry of a state dict (name -> tensor) in one call.

        DTensor values (FSDP2's state dict) are described by their placement: the local shard
        and its box. Other values are split by `layout` for rank `rank` of `world` (default:
        this sender's rank and number of senders), with wsync_layout_shard_box's rule:
        "fsdp" (dim 0, c = ceil(rows / world) rows per rank), an int d (Shard(d)), or
        "replicated" (every rank describes the whole param; the plan reads each byte from one
        of them). Such a value is the whole param (the rank then sends its rows of it, read in
        place) — or, when `config` (a ModelConfig, config.json path, JSON text or dict) gives
        the global shapes, either the whole param or the rank's local shard. Fused expert
        tensors (mlp.experts.gate_up_proj / down_proj, as a transformers 5.x model holds them)
        are accepted under their state-dict names and unfused as add_shard says.
        Raw buffers must be wrapped: wsync.HostTensor(buffer, dtype, shape).
        layout="megatron": a Megatron-Core rank's state dict, tp/ep/etp its (rank, size) pairs
        and config required (wsync.megatron.add_megatron_state_dict; docs/megatron_layouts.md).
        Returns the ShardSpecs described, in state-dict order."""
        if layout == "megatron":
            from .megatron import add_megatron_state_dict
            return add_megatron_state_dict(self, state_dict, config, tp, ep, etp)
        if layout == "fsdp":
            dim = 0
        elif layout == "replicated":
            dim = WSYNC_REPLICATE
        elif isinstance(layout, int) and not isinstance(layout, bool):
            dim = layout
        else:
            raise InvalidArgumentError(f"unknown layout {layout!r}: use \"fsdp\", "
                                       "\"replicated\" or a dim (int)", None)
        rank = self.rank if rank is None else int(rank)
        world = self.world if world is None else int(world)
        shapes: Optional[Dict[str, tuple]] = None
        if config is not None:
            cfg = ModelConfig.of(config)
            shapes = {p.name: p.shape for p in cfg.params()}
            if cfg.num_experts > 0:   # a trainer's state dict names the fused expert tensors
                shapes.update((p.name, p.shape) for p in fused_params(cfg))
        out = []
        for name, value in state_dict.items():
            if is_dtensor(value):
                out.append(self.add_shard(name, value))
                continue
            what = f"param '{name}'"
            region = region_of(value, what=what)
            try:
                if shapes is not None:
                    if name not in shapes:
                        raise InvalidArgumentError(
                            f"{what} is in the state dict but not in the model config's params "
                            "(filter the state dict, or leave config out)", None)
                    gshape = shapes[name]
                else:
                    gshape = region.shape
                p = Param(name, region.dtype, gshape)
                b = shard_box(p, dim, rank, world)
                out.append(self._add(p, b, self._place(region, p, b, what)))
            except BaseException:
                region.release()
                raise
        return out

    @staticmethod
    def _check_param(p: Param, gshape, dtype) -> None:
        if tuple(p.shape) != tuple(gshape) or p.dtype != dtype:
            raise InvalidArgumentError(
                f"param '{p.name}' is {list(p.shape)} {dtype_name(p.dtype)}, the DTensor "
                f"{list(gshape)} {dtype_name(dtype)}", None)

    @staticmethod
    def _box(box: Any, p: Param) -> Box:
        if box is None:
            return Box.whole(p.shape)
        if isinstance(box, Box):
            return box
        start, length = box
        return Box(start, length)

    @staticmethod
    def _place(region: Region, p: Param, b: Box, what: str) -> Region:
        """The region of box b: the tensor is the box itself, or the whole param."""
        esize = dtype_size(p.dtype)
        box_bytes = math.prod(b.len) * esize
        whole_bytes = math.prod(p.shape) * esize
        if region.nbytes == box_bytes:
            return region
        if region.nbytes == whole_bytes:
            return sub_region(region, p.shape, b.start, b.len, what)
        raise InvalidArgumentError(
            f"{what}: the tensor has {region.nbytes} bytes ({list(region.shape)}), neither the "
            f"box {list(b.len)} at {list(b.start)} ({box_bytes} bytes) nor the whole param "
            f"{list(p.shape)} ({whole_bytes} bytes) in {dtype_name(p.dtype)}", None)

    def _add(self, p: Param, b: Box, region: Region) -> ShardSpec:
        if is_fused_experts(p.name):
            return self._add_fused(p, b, region)
        keep: list = []
        sh = D.wsync_shard_t(p._c(keep), b._c(), region.address or None, int(region.mem),
                             int(region.device))
        with self._lock:
            st = lib().wsync_sender_add_shard(self._h(), C.byref(sh))
            if st != 0:
                region.release()
                raise_status(st, "wsync_sender_add_shard")
            self._regions.append(region)
            spec = ShardSpec(p, b)
            self._shards.append(spec)
        return spec

    def _add_fused(self, p: Param, b: Box, region: Region) -> ShardSpec:
        """A box of HF transformers 5.x's fused experts ("...mlp.experts.gate_up_proj"
        [E, 2I, Hd], "...mlp.experts.down_proj" [E, Hd, I]) goes to the library as the boxes of
        the per-expert checkpoint params it holds (wsync_layout_unfuse_experts), each read in
        place from the fused memory."""
        keep: list = []
        sh = D.wsync_shard_t(p._c(keep), b._c(), region.address or None, int(region.mem),
                             int(region.device))
        out = C.POINTER(D.wsync_shard_t)()
        n = C.c_size_t()
        with self._lock:
            h = self._h()
            st = lib().wsync_layout_unfuse_experts(C.byref(sh), C.byref(out), C.byref(n))
            if st != 0:
                region.release()
                raise_status(st, "wsync_layout_unfuse_experts")
            added = 0
            try:
                for i in range(n.value):
                    st = lib().wsync_sender_add_shard(h, C.byref(out[i]))
                    if st != 0:
                        raise_status(st, "wsync_sender_add_shard")
                    ep = Param._from_c(out[i].param)
                    self._shards.append(ShardSpec(ep, Box._from_c(out[i].box, len(ep.shape))))
                    added += 1
            finally:
                lib().wsync_layout_shards_free(out, n.value)
                if added:
                    self._regions.append(region)   # the library reads it from now on
                else:
                    region.release()
        return ShardSpec(p, b)

    # -- running ------------------------------------------------------------------------------

    def _call(self, fn, *args) -> None:
        with self._lock:
            st = fn(self._h(), *args)
            if st != 0:
                raise_status(st, fn.__name__)

    def setup(self) -> None:
        """Complete the group's setup now (otherwise the first push does): send the
        descriptions, wait for every receiver's, get the plan and the scheme. Collective over
        the senders. A description mismatch raises MismatchError naming the param, here, on
        every participant."""
        self._call(lib().wsync_sender_setup)

    def push(self, version: int) -> None:
        """Push `version` (greater than every version pushed before) of the shards; returns
        when every receiver committed it (store scheme: once every sender published it).
        Collective over the senders. Do not modify shard memory until it returns (with
        copy_shards: until its copy was taken, at its start). PeerLostError names a lost peer;
        after any error the group is over (close, and form a new one). Same as push_begin then
        push_wait()."""
        self._call(lib().wsync_sender_push, C.c_uint64(int(version)))

    def push_begin(self, version: int) -> None:
        """Start pushing `version` on a thread of wsync's and return; push_wait ends it. The
        trainer may write its shards again: with copy_shards, as soon as this returned (the
        version is the shards' bytes as they were when it was called; for CUDA tensors,
        synchronize the work writing them first); without, only once push_wait returned the
        version or raised. Until push_wait reaped the push, only push_wait and push_done may be
        called (StateError from push_begin, push, setup, add_shard, stats; close aborts the
        push). InvalidArgumentError for a version not above the last pushed."""
        self._call(lib().wsync_sender_push_begin, C.c_uint64(int(version)))

    def push_wait(self, timeout_ms: Optional[int] = None) -> Optional[int]:
        """Wait up to timeout_ms (None: until the push ends, its own deadlines bound it; 0: just
        look) for the push push_begin started. Returns its version once every receiver committed
        it (store: every sender published), or None when it had not ended in time (it goes on:
        wait again). Raises what push would have raised (PeerLostError naming the peer, ...);
        StateError when no push is in flight."""
        v = C.c_uint64()
        t = -1 if timeout_ms is None else max(0, int(timeout_ms))
        with self._lock:
            st = lib().wsync_sender_push_wait(self._h(), t, C.byref(v))
            if st == D.Status.ERR_TIMEOUT:
                return None
            if st != 0:
                raise_status(st, "wsync_sender_push_wait")
        return int(v.value)

    @property
    def push_done(self) -> bool:
        """Whether the push in flight has ended (push_wait would return at once). StateError
        when no push is in flight."""
        done = C.c_int()
        self._call(lib().wsync_sender_push_test, C.byref(done))
        return bool(done.value)

    @property
    def stats(self) -> PushStats:
        """Figures of the last successful push."""
        s = D.wsync_push_stats_t()
        self._call(lib().wsync_sender_stats, C.byref(s))
        return PushStats(s.version, s.bytes_packed, s.bytes_delivered, s.buckets, s.seconds,
                         s.bytes_wire, s.bytes_encoded, s.bytes_plain, s.base_version)

    @property
    def scheme(self) -> Optional[str]:
        """The group's scheme ("ipc"), or None before setup."""
        with self._lock:
            v = lib().wsync_sender_scheme(self._h())
        return v.decode() if v else None

    @property
    def explain(self) -> Optional[str]:
        """Why the scheme was chosen and why each other one was refused (after setup)."""
        with self._lock:
            v = lib().wsync_sender_explain(self._h())
        return v.decode("utf-8", "replace") if v else None

    @property
    def coordinator(self) -> Optional[str]:
        """"host:port" the coordinator listens on (rank 0 only; None for other ranks)."""
        with self._lock:
            v = lib().wsync_sender_coordinator(self._h())
        return v.decode() if v else None

    @property
    def context(self) -> Context:
        return self._ctx
