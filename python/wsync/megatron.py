"""Megatron-Core trainers as senders (issue 20): the tensors one tensor/expert-parallel rank of a
GPTModel holds (linear_qkv interleaved per query group, linear_fc1 = [gate; up], row-parallel
linear_proj / linear_fc2, vocab-parallel embedding and output layer, TEGroupedMLP experts over EP
and ETP) described as boxes of the HF checkpoint params, through wsync_layout_megatron_tensors
and the same rule as wsync_layout_tensor_shards. Rules and sources: docs/megatron_layouts.md.

    s.add_state_dict(model.state_dict(), layout="megatron", config="config.json",
                     tp=(tp_rank, tp_size), ep=(ep_rank, ep_size), etp=(etp_rank, etp_size))
"""
from __future__ import annotations

import ctypes as C
import math
from typing import Any, List, Mapping, Tuple

from . import _cdefs as D
from ._library import lib
from .errors import InvalidArgumentError, raise_status
from .layout import Box, ModelConfig, Param, ShardSpec, Target, _dt
from .tensors import Region, dtype_size, is_dtensor, region_of, sub_region


def _ranks(value: Any, what: str) -> Tuple[int, int]:
    if value is None:
        return 0, 1
    try:
        rank, size = (int(v) for v in value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be (rank, size), not {value!r}", None) from None
    return rank, size


def megatron_tensors(config: Any, tp: Any = None, ep: Any = None, etp: Any = None, *,
                     dtype: Any = None, vocab_pad: int = 0) -> List[Target]:
    """The tensors of one Megatron-Core rank (wsync_layout_megatron_tensors), each a Target used
    as a description: Megatron state-dict name, local shape, and the pieces (box of an HF param
    at dst_start). tp, ep, etp: (rank, size) pairs, None for (0, 1). vocab_pad: Megatron's
    make_vocab_size_divisible_by (0: 128)."""
    cfg = ModelConfig.of(config)
    (tr, ts), (er, es), (xr, xs) = (_ranks(tp, "tp"), _ranks(ep, "ep"), _ranks(etp, "etp"))
    c = cfg._c()
    out = C.POINTER(D.wsync_target_t)()
    n = C.c_size_t()
    st = lib().wsync_layout_megatron_tensors(C.byref(c), _dt(dtype), tr, ts, er, es, xr, xs,
                                             int(vocab_pad), C.byref(out), C.byref(n))
    if st != 0:
        raise_status(st, "wsync_layout_megatron_tensors")
    try:
        return [Target._from_c(out[i]) for i in range(n.value)]
    finally:
        lib().wsync_layout_targets_free(out, n.value)


def megatron_shards(state_dict: Mapping[str, Any], config: Any, tp: Any = None, ep: Any = None,
                    etp: Any = None, *, vocab_pad: int = 0
                    ) -> List[Tuple[Param, Box, Region]]:
    """The HF-param shards a Megatron rank's state dict (name -> tensor, as
    model.state_dict() gives them; "._extra_state" entries are skipped, leading "module."
    prefixes of DDP wrappers stripped) holds: (param, box,
    region) with the region a contiguous range of the Megatron tensor's memory, read in place.
    Params take each tensor's own dtype. InvalidArgumentError for a name this layout does not
    have (the message names it) or a tensor whose size is not its local shape's; a tensor of a
    rank holding only vocab padding gives nothing. Regions keep their tensors alive; release them
    (Region.release) if not handed to a sender."""
    targets = {t.name: t for t in megatron_tensors(config, tp, ep, etp, vocab_pad=vocab_pad)}
    out: List[Tuple[Param, Box, Region]] = []
    try:
        for key, value in state_dict.items():
            if key.endswith("._extra_state"):
                continue
            name = key
            while name.startswith("module."):   # DDP / Float16Module wrappers
                name = name[len("module."):]
            t = targets.get(name)
            if t is None:
                raise InvalidArgumentError(
                    f"'{name}' is not a tensor of this Megatron-Core layout (tp={tp}, ep={ep}, "
                    f"etp={etp}); see docs/megatron_layouts.md for the names", None)
            if is_dtensor(value):
                raise InvalidArgumentError(f"'{name}': a DTensor is not a Megatron tensor", None)
            region = region_of(value, what=f"Megatron tensor '{name}'")
            want = math.prod(t.shape) * dtype_size(region.dtype)
            if region.nbytes != want:
                region.release()
                raise InvalidArgumentError(
                    f"'{name}': {region.nbytes} bytes ({list(region.shape)}), expected the local "
                    f"shape {list(t.shape)} ({want} bytes)", None)
            for i, pc in enumerate(t.pieces):
                sub = sub_region(region, t.shape, pc.dst_start, pc.src.len, f"'{name}'")
                if i > 0:   # the first piece's region owns the exports; releasing it frees all
                    sub = Region(sub.address, sub.nbytes, sub.shape, sub.dtype, sub.mem,
                                 sub.device, sub.owner, [])
                out.append((Param(pc.param.name, region.dtype, pc.param.shape), pc.src, sub))
            if not t.pieces:
                region.release()
    except BaseException:
        for _, _, r in out:
            r.release()
        raise
    return out


def add_megatron_state_dict(sender: Any, state_dict: Mapping[str, Any], config: Any,
                            tp: Any = None, ep: Any = None, etp: Any = None, *,
                            vocab_pad: int = 0) -> List[ShardSpec]:
    """Sender.add_state_dict(..., layout="megatron"): add every HF-param shard of
    megatron_shards to `sender`. Returns the ShardSpecs added."""
    if config is None:
        raise InvalidArgumentError("layout=\"megatron\" needs config= (the HF config.json, path "
                                   "or ModelConfig)", None)
    shards = megatron_shards(state_dict, config, tp, ep, etp, vocab_pad=vocab_pad)
    specs = []
    for k, (p, b, region) in enumerate(shards):
        try:
            specs.append(sender._add(p, b, region))
        except BaseException:
            for _, _, r in shards[k + 1:]:
                r.release()
            raise
    return specs


__all__ = ["megatron_tensors", "megatron_shards", "add_megatron_state_dict"]

