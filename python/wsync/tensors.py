"""What the package accepts as memory, without importing torch or numpy.

* Tensor-like objects: anything with ``data_ptr()``, ``shape``, ``dtype`` and ``device`` (torch
  tensors; wsync.HostTensor). ``device.type == "cpu"`` is host memory; ``"cuda"`` maps to
  WSYNC_MEM_CUDA with ``device.index`` (None: 0), a device ordinal of this process (as
  CUDA_VISIBLE_DEVICES numbers them). A libwsync built without CUDA, or a process that sees
  no such device, refuses CUDA memory (UnsupportedError / InvalidArgumentError from the
  library, passed through). The tensor must be contiguous; CUDA work writing it must be
  finished (torch.cuda.synchronize()) before a push reads it.
* DTensors (anything with ``to_local()``, ``placements`` and ``device_mesh``): the local shard,
  and its box in the global tensor from the placements over the mesh, as torch computes it
  (dtensor_box): Shard(d) over a mesh dim of size m splits dim d with c = ceil(n / m) rows per
  rank (rank k holds [k*c, min(n, (k+1)*c))), the rule of wsync_layout_shard_box; Replicate()
  keeps the whole extent. FSDP2 (1-D mesh, Shard(0)) and HSDP (2-D, (Replicate(), Shard(0))).
* Buffer-protocol objects (memoryview, bytearray, bytes, array.array, mmap, numpy arrays) for
  host memory: the caller says the dtype (numpy arrays say it themselves) and, where it matters,
  the shape.

The objects are referenced (and buffer exports held) for as long as the library may read or
write their memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Tuple

from . import _buffer
from ._cdefs import DTYPE_INFO, DType, Mem
from .errors import InvalidArgumentError

__all__ = ["DType", "Mem", "HostTensor", "dtype_of", "dtype_size", "dtype_name",
           "is_dtensor", "dtensor_box"]

_ALIASES = {}
for _d, (_size, _name, _aliases) in DTYPE_INFO.items():
    _ALIASES[_name] = _d
    for _a in _aliases:
        _ALIASES[_a] = _d
# how torch and numpy spell them
_ALIASES.update({"torch.bfloat16": DType.BF16, "torch.float16": DType.F16,
                 "torch.half": DType.F16, "torch.float32": DType.F32,
                 "torch.float": DType.F32, "torch.float8_e4m3fn": DType.F8E4M3FN,
                 "torch.float8_e5m2": DType.F8E5M2, "torch.uint8": DType.U8})


def dtype_of(value: Any) -> DType:
    """A wsync DType from a DType, its int value, a name the library accepts ("bf16",
    "bfloat16", "BF16", "f8e4m3fn", "float8_e4m3fn", ...), a torch dtype or a numpy dtype.
    InvalidArgumentError otherwise."""
    if isinstance(value, DType):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DType(value)
        except ValueError:
            pass
    else:
        name = value if isinstance(value, str) else str(value)
        d = _ALIASES.get(name)
        if d is None and isinstance(name, str):
            d = _ALIASES.get(name.lower())
        if d is not None:
            return d
    raise InvalidArgumentError(
        f"unknown dtype {value!r}: wsync knows " + ", ".join(DTYPE_INFO[d][1] for d in DType),
        None)


def dtype_size(dtype: Any) -> int:
    return DTYPE_INFO[dtype_of(dtype)][0]


def dtype_name(dtype: Any) -> str:
    return DTYPE_INFO[dtype_of(dtype)][1]


# struct-module formats a typed memoryview of each dtype can use ('H': bf16 bit patterns)
_FORMATS = {DType.BF16: "H", DType.F16: "e", DType.F32: "f", DType.F8E4M3FN: "B",
            DType.F8E5M2: "B", DType.U8: "B"}


def view_format(dtype: Any) -> str:
    """memoryview.cast format for a dtype: "H" (bf16 bits), "e", "f" or "B" (FP8 codes, u8)."""
    return _FORMATS[dtype_of(dtype)]


class _Device:
    type = "cpu"
    index = None

    def __repr__(self):
        return "device(type='cpu')"


class HostTensor:
    """A typed, shaped view of a host buffer, for places that want a tensor (state dicts,
    receiver buffers) when the memory is a bytearray, memoryview, mmap or array.

    ``HostTensor(bytearray(2 * 384 * 128), "bf16", (384, 128))``. Holds an export of the buffer
    (so a bytearray cannot be resized under it) until the HostTensor is garbage. Offers the
    tensor interface the package uses: data_ptr(), shape, dtype, device, is_contiguous(),
    numel(), element_size(), and ``.buffer`` (a flat byte memoryview of the memory)."""

    def __init__(self, buffer: Any, dtype: Any, shape: Optional[Sequence[int]] = None, *,
                 writable: bool = False):
        self.dtype = dtype_of(dtype)
        self._export = _buffer.Export(buffer, writable=writable)
        size = DTYPE_INFO[self.dtype][0]
        if shape is None:
            if self._export.nbytes % size:
                raise InvalidArgumentError(f"a buffer of {self._export.nbytes} bytes is not a "
                                           f"whole number of {dtype_name(self.dtype)} elements",
                                           None)
            shape = (self._export.nbytes // size,)
        self.shape = tuple(int(s) for s in shape)
        need = math.prod(self.shape) * size
        if need != self._export.nbytes:
            raise InvalidArgumentError(
                f"a buffer of {self._export.nbytes} bytes cannot hold {list(self.shape)} "
                f"{dtype_name(self.dtype)} ({need} bytes)", None)
        self.device = _Device()
        self._buffer = buffer

    def data_ptr(self) -> int:
        return self._export.address

    def is_contiguous(self) -> bool:
        return True

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return DTYPE_INFO[self.dtype][0]

    @property
    def readonly(self) -> bool:
        return self._export.readonly

    @property
    def buffer(self) -> memoryview:
        """The memory as a flat memoryview of bytes."""
        return memoryview(self._buffer).cast("B")

    def __repr__(self) -> str:
        return f"HostTensor(shape={list(self.shape)}, dtype={dtype_name(self.dtype)})"


# ---------------------------------------------------------------------------------------------
# Regions: what the library gets
# ---------------------------------------------------------------------------------------------

@dataclass
class Region:
    """Memory handed to the library: address, size, kind, and what keeps it alive."""
    address: int
    nbytes: int
    shape: Tuple[int, ...]
    dtype: Optional[DType]
    mem: Mem = Mem.HOST
    device: int = 0
    owner: Any = None                     # the object whose memory this is
    exports: list = field(default_factory=list)

    def release(self) -> None:
        for e in self.exports:
            e.release()
        self.exports = []
        self.owner = None


def is_dtensor(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("to_local", "placements", "device_mesh"))


def is_tensor_like(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("data_ptr", "shape", "dtype", "device"))


def region_of(obj: Any, *, dtype: Any = None, shape: Optional[Sequence[int]] = None,
              writable: bool = False, what: str = "tensor") -> Region:
    """The memory of a tensor-like or buffer-protocol object (not a DTensor: see dtensor_box).
    `dtype`/`shape` are needed for raw buffers; for tensors they must agree if given."""
    if is_dtensor(obj):
        raise InvalidArgumentError(f"{what}: a DTensor here; pass its local tensor "
                                   "(.to_local()) with its box, or use add_shard/add_state_dict "
                                   "which do that", None)
    if is_tensor_like(obj):
        if writable and getattr(obj, "readonly", False):
            raise InvalidArgumentError(f"{what}: the tensor's memory is read-only (a HostTensor "
                                       "over bytes or a read-only buffer); wsync writes into "
                                       "it", None)
        return _tensor_region(obj, dtype, shape, what)
    if not _buffer.is_buffer(obj):
        raise InvalidArgumentError(
            f"{what}: {type(obj).__name__} is neither a tensor (data_ptr, shape, dtype, device) "
            "nor a buffer-protocol object", None)
    own = getattr(obj, "dtype", None)
    if dtype is None and own is not None:
        dtype = own
    elif dtype is not None and own is not None and dtype_of(own) != dtype_of(dtype):
        raise InvalidArgumentError(f"{what}: the buffer's dtype is {dtype_name(own)}, "
                                   f"not {dtype_name(dtype)}", None)
    if dtype is None:
        raise InvalidArgumentError(f"{what}: a raw buffer needs its dtype (dtype=..., or wrap "
                                   "it: wsync.HostTensor(buffer, dtype, shape))", None)
    d = dtype_of(dtype)
    try:
        export = _buffer.Export(obj, writable=writable)
    except BufferError as e:
        raise InvalidArgumentError(f"{what}: {'a writable' if writable else 'a'} buffer is "
                                   f"needed: {e}", None) from None
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: {e}", None) from None
    size = DTYPE_INFO[d][0]
    if shape is None:
        own_shape = getattr(obj, "shape", None)
        if own_shape is not None and not isinstance(obj, memoryview):
            shape = tuple(int(s) for s in own_shape)
        elif export.itemsize == size and isinstance(obj, memoryview):
            shape = export.shape
        else:
            shape = (export.nbytes // size,)
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) * size != export.nbytes:
        export.release()
        raise InvalidArgumentError(
            f"{what}: a buffer of {export.nbytes} bytes does not hold {list(shape)} "
            f"{dtype_name(d)} ({math.prod(shape) * size} bytes)", None)
    return Region(export.address, export.nbytes, shape, d, Mem.HOST, 0, obj, [export])


def _tensor_region(t: Any, dtype: Any, shape: Any, what: str) -> Region:
    d = dtype_of(t.dtype)
    if dtype is not None and dtype_of(dtype) != d:
        raise InvalidArgumentError(f"{what}: the tensor is {dtype_name(d)}, not "
                                   f"{dtype_name(dtype)}", None)
    tshape = tuple(int(s) for s in t.shape)
    if shape is not None and tuple(int(s) for s in shape) != tshape:
        raise InvalidArgumentError(f"{what}: the tensor's shape is {list(tshape)}, not "
                                   f"{list(shape)}", None)
    contiguous = getattr(t, "is_contiguous", None)
    if contiguous is not None and not contiguous():
        raise InvalidArgumentError(
            f"{what}: the tensor is not contiguous; wsync reads and writes memory in place, so "
            "a .contiguous() copy would not see later updates: keep the data in a contiguous "
            "tensor", None)
    dev = t.device
    kind = getattr(dev, "type", str(dev))
    if kind == "cpu":
        mem, index = Mem.HOST, 0
    elif kind == "cuda":
        mem = Mem.CUDA
        index = getattr(dev, "index", None)
        index = 0 if index is None else int(index)
    else:
        raise InvalidArgumentError(f"{what}: the tensor is on device {dev!s}; wsync takes cpu "
                                   "and cuda tensors", None)
    esize = t.element_size() if hasattr(t, "element_size") else DTYPE_INFO[d][0]
    nbytes = math.prod(tshape) * int(esize)
    return Region(int(t.data_ptr()), nbytes, tshape, d, mem, index, t, [])


def sub_region(region: Region, global_shape: Sequence[int], start: Sequence[int],
               length: Sequence[int], what: str) -> Region:
    """The part of a whole tensor's region (row-major, `global_shape`) that box (start, length)
    covers, when it is one contiguous range: every dim before the last partial one of length 1
    (FSDP rows are). Otherwise InvalidArgumentError: pass the local shard instead."""
    nd = len(global_shape)
    if any(n == 0 for n in length):
        return Region(region.address, 0, tuple(length), region.dtype, region.mem,
                      region.device, region.owner, region.exports)
    # contiguous when every dim before the last partial one has length 1
    last_partial = -1
    for d in range(nd):
        if length[d] != global_shape[d]:
            last_partial = d
    for d in range(last_partial):
        if length[d] != 1:
            raise InvalidArgumentError(
                f"{what}: box start {list(start)} len {list(length)} of a whole tensor "
                f"{list(global_shape)} is not one contiguous range; pass the rank's local "
                "shard instead", None)
    esize = region.nbytes // max(1, math.prod(global_shape))
    strides = [1] * nd
    for d in range(nd - 2, -1, -1):
        strides[d] = strides[d + 1] * global_shape[d + 1]
    offset = sum(s * st for s, st in zip(start, strides)) * esize
    nbytes = math.prod(length) * esize
    return Region(region.address + offset, nbytes, tuple(length), region.dtype, region.mem,
                  region.device, region.owner, region.exports)


def _mesh_shape(mesh: Any) -> Tuple[int, ...]:
    shape = getattr(mesh, "shape", None)
    if shape is None:
        ndim = int(getattr(mesh, "ndim", 1))
        return tuple(int(mesh.size(i)) for i in range(ndim)) if ndim > 1 else (int(mesh.size()),)
    return tuple(int(s) for s in shape)


def _mesh_coordinate(mesh: Any, ndim: int) -> Tuple[int, ...]:
    """This process's coordinate in the mesh (one index per mesh dim)."""
    coord = mesh.get_coordinate() if hasattr(mesh, "get_coordinate") else None
    if coord is None:
        if ndim == 1 and hasattr(mesh, "get_local_rank"):
            return (int(mesh.get_local_rank()),)
        raise InvalidArgumentError("DTensor: this process is not part of its device mesh", None)
    coord = tuple(int(c) for c in coord)
    if len(coord) != ndim:
        raise InvalidArgumentError(f"DTensor: the mesh coordinate {list(coord)} has "
                                   f"{len(coord)} entries for a {ndim}-D mesh", None)
    return coord


def dtensor_box(dt: Any) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]:
    """(global shape, box start, box len) of a DTensor's local shard, from its placements over
    its device mesh (1-D: FSDP2's Shard(0); 2-D: HSDP's (Replicate(), Shard(0)); any number of
    mesh dims), computed as torch's compute_local_shape_and_global_offset does: mesh dims in
    order, Replicate() leaves the box alone, Shard(d) over a mesh dim of size m at coordinate k
    splits the box's current extent n along d like torch.chunk: c = ceil(n / m) rows per rank,
    rank k holds [k*c, min(n, (k+1)*c)) of it (the last ranks fewer rows or none; an empty box
    starts at the end of the extent), which for one mesh dim is wsync_layout_shard_box's rule.
    FSDP2 pads its local storage to c rows, but to_local() is the unpadded shard: the box.
    Partial placements (reduce first) and _StridedShard (FSDP2 over a TP mesh: its rows are not
    one box) raise InvalidArgumentError. Ranks of different replica groups (HSDP) get the same
    box; the plan reads each byte from one of them."""
    gshape = tuple(int(s) for s in dt.shape)
    mesh = dt.device_mesh
    placements = tuple(dt.placements)
    mshape = _mesh_shape(mesh)
    if len(placements) != len(mshape):
        raise InvalidArgumentError(f"DTensor: {len(placements)} placements {placements} for a "
                                   f"{len(mshape)}-D mesh {list(mshape)}", None)
    coord = _mesh_coordinate(mesh, len(mshape))
    # newer torch may record a non-default order in which mesh dims split one tensor dim
    # (DTensorSpec.shard_order); the rule below is the default, mesh dims in ascending order
    spec = getattr(dt, "_spec", None)
    for entry in (getattr(spec, "shard_order", None) or ()):
        dims = tuple(int(m) for m in getattr(entry, "mesh_dims", ()))
        if list(dims) != sorted(dims):
            raise InvalidArgumentError(
                f"DTensor: tensor dim {getattr(entry, 'tensor_dim', '?')} is split over mesh "
                f"dims {list(dims)} in that order, not ascending; describe it with add_shard "
                "and explicit boxes", None)
    start = [0] * len(gshape)
    length = list(gshape)
    for i, p in enumerate(placements):
        if type(p).__name__ == "_StridedShard" or hasattr(p, "split_factor"):
            raise InvalidArgumentError(
                f"DTensor placement {p!r} on mesh dim {i}: a strided shard (FSDP2 over a "
                "tensor-parallel mesh) is not one box; describe it with add_shard and explicit "
                "boxes", None)
        is_shard = getattr(p, "is_shard", None)
        is_replicate = getattr(p, "is_replicate", None)
        if is_shard is not None and is_shard():
            d = int(p.dim)
            if d < 0:
                d += len(gshape)
            if not 0 <= d < len(gshape):
                raise InvalidArgumentError(f"DTensor placement {p!r}: dim {p.dim} of a "
                                           f"{len(gshape)}-D tensor {list(gshape)}", None)
            m, k = mshape[i], coord[i]
            if not 0 <= k < m:
                raise InvalidArgumentError(f"DTensor: coordinate {k} on mesh dim {i} of size "
                                           f"{m}", None)
            n = length[d]
            c = -(-n // m)
            lo = min(k * c, n)
            hi = min(n, (k + 1) * c)
            start[d] += lo
            length[d] = max(0, hi - lo)
        elif is_replicate is None or not is_replicate():
            raise InvalidArgumentError(f"DTensor placement {p!r} on mesh dim {i}: wsync takes "
                                       "Shard(d) or Replicate() (a Partial tensor must be "
                                       "reduced first)", None)
    return gshape, tuple(start), tuple(length)


# ---------------------------------------------------------------------------------------------
# Fused expert tensors (HF transformers 5.x MoE)
# ---------------------------------------------------------------------------------------------

_FUSED_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def is_fused_experts(name: str) -> bool:
    """True for the names under which a transformers 5.x MoE model holds its routed experts in
    memory ("model.layers.L.mlp.experts.gate_up_proj" [E, 2I, Hd] and
    "...mlp.experts.down_proj" [E, Hd, I], no .weight suffix): the sender unfuses them into the
    checkpoint's per-expert params."""
    return name.endswith(_FUSED_EXPERTS)
