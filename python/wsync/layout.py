"""Params, boxes, targets, model configs and the layout builders of wsync_layout.h.

Plain Python values (dataclasses) on this side; each builder calls the C builder and copies its
result, so the rules (FSDP's ceil split, vLLM's fused QKV and gate_up, vocab padding, FP8 block
checks) are the library's own.

    cfg = ModelConfig.load("config.json")
    shards = cfg.fsdp_shards(rank=1, world=4)         # [ShardSpec(param, box), ...]
    targets = cfg.tp_targets(tp_rank=0, tp_size=2)    # [Target(name, dtype, shape, pieces)]
"""
from __future__ import annotations

import ctypes as C
import enum
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

from . import _cdefs as D
from ._cdefs import (DType, ExpertPlacement, ModelType, QuantScheme, RouterScore, TopkMethod,
                      WSYNC_MAX_DIMS, WSYNC_MODEL_MAX_MLP_ONLY, WSYNC_REPLICATE)
from ._library import lib
from .errors import InvalidArgumentError, raise_status
from .tensors import dtype_of

__all__ = ["Param", "Box", "Piece", "Quant", "Target", "ShardSpec", "ModelConfig",
           "shard_box", "shards", "replicated", "column_parallel", "row_parallel",
           "merged_column", "qkv", "vocab_parallel", "local_experts", "WSYNC_REPLICATE"]


def _check(st: int, what: str) -> None:
    if st != 0:
        raise_status(st, what)


def _dims(values: Sequence[int], what: str) -> Tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if not 1 <= len(out) <= WSYNC_MAX_DIMS:
        raise InvalidArgumentError(f"{what}: {len(out)} dims, wsync takes 1 to "
                                   f"{WSYNC_MAX_DIMS}", None)
    return out


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One logical tensor of the model: checkpoint name, dtype as the senders hold it, global
    shape."""
    name: str
    dtype: DType
    shape: Tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtype_of(self.dtype))
        object.__setattr__(self, "shape", _dims(self.shape, f"param '{self.name}'"))

    def _c(self, keep: list) -> D.wsync_param_t:
        name = self.name.encode()
        keep.append(name)
        p = D.wsync_param_t(name, int(self.dtype), len(self.shape))
        for i, s in enumerate(self.shape):
            p.shape[i] = s
        return p

    @classmethod
    def _from_c(cls, p: D.wsync_param_t) -> "Param":
        return cls(p.name.decode(), DType(p.dtype), tuple(p.shape[:p.ndim]))


@dataclass(frozen=True)
class Box:
    """A rectangular region: start[d] .. start[d] + len[d] along each dim."""
    start: Tuple[int, ...]
    len: Tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "start", tuple(int(v) for v in self.start))
        object.__setattr__(self, "len", tuple(int(v) for v in self.len))
        if len(self.start) != len(self.len):
            raise InvalidArgumentError(f"box start {self.start} and len {self.len} differ in "
                                       "dims", None)

    @classmethod
    def whole(cls, shape: Sequence[int]) -> "Box":
        return cls((0,) * len(shape), tuple(shape))

    @property
    def empty(self) -> bool:
        return any(n == 0 for n in self.len)

    def _c(self) -> D.wsync_box_t:
        b = D.wsync_box_t()
        for i, (s, n) in enumerate(zip(self.start, self.len)):
            b.start[i], b.len[i] = s, n
        return b

    @classmethod
    def _from_c(cls, b: D.wsync_box_t, ndim: int) -> "Box":
        return cls(tuple(b.start[:ndim]), tuple(b.len[:ndim]))


@dataclass(frozen=True)
class ShardSpec:
    """What a sender rank holds of one param (a layout's answer; the memory comes later)."""
    param: Param
    box: Box


@dataclass(frozen=True)
class Piece:
    """Box `src` of `param` lands at `dst_start` of a target."""
    param: Param
    src: Box
    dst_start: Tuple[int, ...]

    def _c(self, keep: list) -> D.wsync_piece_t:
        pc = D.wsync_piece_t(self.param._c(keep), self.src._c())
        for i, v in enumerate(self.dst_start):
            pc.dst_start[i] = int(v)
        return pc

    @classmethod
    def _from_c(cls, pc: D.wsync_piece_t, target_ndim: int) -> "Piece":
        p = Param._from_c(pc.param)
        return cls(p, Box._from_c(pc.src, len(p.shape)), tuple(pc.dst_start[:target_ndim]))


_QUANT_NAMES = {"none": QuantScheme.NONE, "fp8-tensor": QuantScheme.TENSOR,
                "fp8-channel": QuantScheme.CHANNEL, "fp8-block": QuantScheme.BLOCK,
                "tensor": QuantScheme.TENSOR, "channel": QuantScheme.CHANNEL,
                "block": QuantScheme.BLOCK}


@dataclass(frozen=True)
class Quant:
    """How an FP8 target is made from its pieces (wsync_quant_t without the scales pointer,
    which the receiver supplies). block sizes 0 mean 128; eps <= 0 means 1e-4."""
    scheme: QuantScheme = QuantScheme.NONE
    block_rows: int = 0
    block_cols: int = 0
    eps: float = 0.0
    ue8m0: bool = False
    no_saturate: bool = False

    @classmethod
    def of(cls, value: Any, block: Any = None) -> "Quant":
        """From a Quant, a QuantScheme, or "none" / "fp8-block" / "fp8-tensor" / "fp8-channel";
        block: an int or (rows, cols) for block scaling."""
        if isinstance(value, Quant):
            q = value
        elif value is None:
            q = cls()
        elif isinstance(value, str):
            if value.lower() not in _QUANT_NAMES:
                raise InvalidArgumentError(f"unknown quantization {value!r}: use one of "
                                           + ", ".join(sorted(_QUANT_NAMES)), None)
            q = cls(_QUANT_NAMES[value.lower()])
        else:
            q = cls(QuantScheme(value))
        if block is not None:
            br, bc = (block, block) if isinstance(block, int) else tuple(block)
            q = Quant(q.scheme, int(br), int(bc), q.eps, q.ue8m0, q.no_saturate)
        return q

    def _c(self, scales: int = 0) -> D.wsync_quant_t:
        return D.wsync_quant_t(int(self.scheme), self.block_rows, self.block_cols, self.eps,
                               int(self.ue8m0), int(self.no_saturate),
                               C.cast(C.c_void_p(scales), C.POINTER(C.c_float)) if scales
                               else None, D.Mem.HOST)

    @classmethod
    def _from_c(cls, q: D.wsync_quant_t) -> "Quant":
        return cls(QuantScheme(q.scheme), q.block_rows, q.block_cols, q.eps, bool(q.ue8m0),
                   bool(q.no_saturate))


@dataclass(frozen=True)
class Target:
    """A destination buffer of a receiver: name, dtype, shape, the pieces that fill it, and its
    quantization (FP8 targets). Bytes no piece covers are zeroed once at setup."""
    name: str
    dtype: DType
    shape: Tuple[int, ...]
    pieces: Tuple[Piece, ...] = ()
    quant: Quant = field(default_factory=Quant)

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtype_of(self.dtype))
        object.__setattr__(self, "shape", _dims(self.shape, f"target '{self.name}'"))
        object.__setattr__(self, "pieces", tuple(self.pieces))

    @property
    def quantized(self) -> bool:
        return self.dtype in (DType.F8E4M3FN, DType.F8E5M2) and \
            self.quant.scheme != QuantScheme.NONE

    @property
    def nbytes(self) -> int:
        """Bytes of the target's buffer (wsync_target_bytes)."""
        keep: list = []
        return int(lib().wsync_target_bytes(C.byref(self._c(keep))))

    @property
    def scale_count(self) -> int:
        """fp32 scales the target needs (wsync_target_scale_count); 0 unless quantized."""
        if not self.quantized:
            return 0
        keep: list = []
        return int(lib().wsync_target_scale_count(C.byref(self._c(keep))))

    def with_(self, **changes) -> "Target":
        """A copy with some fields changed (dtype, quant, ...)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Target(**values)

    def _c(self, keep: list, data: int = 0, mem: int = 0, device: int = 0,
           scales: int = 0) -> D.wsync_target_t:
        name = self.name.encode()
        keep.append(name)
        arr = (D.wsync_piece_t * max(1, len(self.pieces)))()
        for i, pc in enumerate(self.pieces):
            arr[i] = pc._c(keep)
        keep.append(arr)
        t = D.wsync_target_t(name, int(self.dtype), len(self.shape))
        for i, s in enumerate(self.shape):
            t.shape[i] = s
        t.data = data or None
        t.mem = mem
        t.device = device
        t.pieces = C.cast(arr, C.POINTER(D.wsync_piece_t)) if self.pieces else None
        t.npieces = len(self.pieces)
        t.quant = self.quant._c(scales)
        return t

    @classmethod
    def _from_c(cls, t: D.wsync_target_t) -> "Target":
        pieces = tuple(Piece._from_c(t.pieces[i], t.ndim) for i in range(t.npieces))
        return cls(t.name.decode(), DType(t.dtype), tuple(t.shape[:t.ndim]), pieces,
                   Quant._from_c(t.quant))


# ---------------------------------------------------------------------------------------------
# Sender layouts
# ---------------------------------------------------------------------------------------------

def shard_box(param: Param, dim: int, rank: int, world: int) -> Box:
    """The box rank `rank` of `world` holds of `param` split along `dim` as FSDP / DTensor
    Shard(dim) split it (c = ceil(n / world) per rank; the last ranks may hold fewer rows or an
    empty box). dim = WSYNC_REPLICATE (-1) gives the whole param."""
    keep: list = []
    p = param._c(keep)
    b = D.wsync_box_t()
    _check(lib().wsync_layout_shard_box(C.byref(p), int(dim), int(rank), int(world),
                                        C.byref(b)), "wsync_layout_shard_box")
    return Box._from_c(b, len(param.shape))


def shards(params: Sequence[Param], dim: int, rank: int, world: int) -> List[ShardSpec]:
    """One ShardSpec per param for rank `rank` of `world`, split along `dim` (see shard_box)."""
    keep: list = []
    arr = (D.wsync_param_t * max(1, len(params)))()
    for i, p in enumerate(params):
        arr[i] = p._c(keep)
    out = C.POINTER(D.wsync_shard_t)()
    n = C.c_size_t()
    _check(lib().wsync_layout_shards(arr, len(params), int(dim), int(rank), int(world),
                                     C.byref(out), C.byref(n)), "wsync_layout_shards")
    return _take_shards(out, n.value)


def _take_shards(out, n: int) -> List[ShardSpec]:
    try:
        res = []
        for i in range(n):
            p = Param._from_c(out[i].param)
            res.append(ShardSpec(p, Box._from_c(out[i].box, len(p.shape))))
        return res
    finally:
        lib().wsync_layout_shards_free(out, n)


# ---------------------------------------------------------------------------------------------
# Receiver layouts: one target
# ---------------------------------------------------------------------------------------------

def _one_target(fn_name: str, *args) -> Target:
    t = D.wsync_target_t()
    _check(getattr(lib(), fn_name)(*args, C.byref(t)), fn_name)
    try:
        return Target._from_c(t)
    finally:
        lib().wsync_layout_target_free(C.byref(t))


def replicated(param: Param) -> Target:
    """Every rank holds the whole param (norms, a row-parallel layer's bias)."""
    keep: list = []
    return _one_target("wsync_layout_replicated", C.byref(param._c(keep)))


def column_parallel(param: Param, tp_rank: int, tp_size: int) -> Target:
    """Rows [r*N/T, (r+1)*N/T) of an output-split weight or bias."""
    keep: list = []
    return _one_target("wsync_layout_column_parallel", C.byref(param._c(keep)), tp_rank, tp_size)


def row_parallel(param: Param, tp_rank: int, tp_size: int) -> Target:
    """Columns [r*N/T, (r+1)*N/T) of every row of a 2-D input-split weight."""
    keep: list = []
    return _one_target("wsync_layout_row_parallel", C.byref(param._c(keep)), tp_rank, tp_size)


def merged_column(name: str, parts: Sequence[Param], tp_rank: int, tp_size: int) -> Target:
    """vLLM's MergedColumnParallelLinear: each part split by rows, the slices stacked."""
    keep: list = []
    arr = (D.wsync_param_t * max(1, len(parts)))()
    for i, p in enumerate(parts):
        arr[i] = p._c(keep)
    return _one_target("wsync_layout_merged_column", name.encode(), arr, len(parts), tp_rank,
                       tp_size)


def qkv(name: str, q: Param, k: Param, v: Param, num_heads: int, num_kv_heads: int,
        tp_rank: int, tp_size: int) -> Target:
    """vLLM's QKVParallelLinear (kv heads replicated when fewer than tp_size)."""
    keep: list = []
    return _one_target("wsync_layout_qkv", name.encode(), C.byref(q._c(keep)),
                       C.byref(k._c(keep)), C.byref(v._c(keep)), num_heads, num_kv_heads,
                       tp_rank, tp_size)


def vocab_parallel(param: Param, tp_rank: int, tp_size: int, vocab_pad: int = 0) -> Target:
    """vLLM's VocabParallelEmbedding / ParallelLMHead, vocab padded to a multiple of vocab_pad
    (0: 64); padding rows are zeroed."""
    keep: list = []
    return _one_target("wsync_layout_vocab_parallel", C.byref(param._c(keep)), vocab_pad,
                       tp_rank, tp_size)


# ---------------------------------------------------------------------------------------------
# Model config
# ---------------------------------------------------------------------------------------------

@dataclass
class ModelConfig:
    """A decoder of the Llama family (wsync_model_config_t), read from a HF config.json by the
    library's own parser (defaults as transformers fills them): Llama, Qwen2, Qwen3, and the
    mixture-of-experts families Qwen3-MoE and DeepSeek-V2/V3 (MLA). The MoE and MLA fields are 0
    for the families that lack them."""
    model_type: ModelType
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    dtype: Optional[DType]   # the checkpoint's dtype; None if absent or not bf16/f16/f32
    # mixture of experts (qwen3_moe, deepseek_v2/v3); num_experts 0 for a dense model
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 0
    mlp_only_layers: Tuple[int, ...] = ()
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 0
    n_group: int = 0
    topk_group: int = 0
    routed_scaling_factor: float = 0.0
    scoring_func: RouterScore = RouterScore.SOFTMAX
    topk_method: TopkMethod = TopkMethod.GREEDY
    router_bias: bool = False
    # multi-head latent attention (deepseek); kv_lora_rank 0 for GQA models
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False

    _BOOLS = ("tie_word_embeddings", "attention_bias", "o_proj_bias", "mlp_bias", "qk_norm",
              "norm_topk_prob", "router_bias", "rope_interleave")

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "ModelConfig":
        """Read a config.json (or a model directory holding one). ConfigError or WsyncIOError
        with the library's message (path, field, value)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        c = D.wsync_model_config_t()
        _check(lib().wsync_model_config_load(path.encode(), C.byref(c)),
               "wsync_model_config_load")
        return cls._from_c(c)

    @classmethod
    def parse(cls, config: Union[str, bytes, Mapping[str, Any]]) -> "ModelConfig":
        """Parse config.json text (str or bytes) or an already-parsed dict."""
        if isinstance(config, Mapping):
            config = json.dumps(config)
        data = config.encode() if isinstance(config, str) else bytes(config)
        c = D.wsync_model_config_t()
        _check(lib().wsync_model_config_parse(data, len(data), C.byref(c)),
               "wsync_model_config_parse")
        return cls._from_c(c)

    @classmethod
    def of(cls, value: Any) -> "ModelConfig":
        """A ModelConfig from a ModelConfig, a path (file or directory), JSON text or a dict."""
        if isinstance(value, ModelConfig):
            return value
        if isinstance(value, Mapping):
            return cls.parse(value)
        if isinstance(value, bytes):
            return cls.parse(value)
        if isinstance(value, str) and value.lstrip().startswith("{"):
            return cls.parse(value)
        return cls.load(value)

    @classmethod
    def _from_c(cls, c: D.wsync_model_config_t) -> "ModelConfig":
        values = {}
        for f in fields(cls):
            v = getattr(c, f.name)
            if f.name == "model_type":
                v = ModelType(v)
            elif f.name == "dtype":
                v = DType(v) if v else None
            elif f.name == "scoring_func":
                v = RouterScore(v)
            elif f.name == "topk_method":
                v = TopkMethod(v)
            elif f.name == "mlp_only_layers":
                v = tuple(int(x) for x in v[:max(0, min(c.nmlp_only_layers,
                                                          WSYNC_MODEL_MAX_MLP_ONLY))])
            elif f.name in cls._BOOLS:
                v = bool(v)
            values[f.name] = v
        return cls(**values)

    def is_moe_layer(self, layer: int) -> bool:
        """True when the layer's MLP has routed experts (wsync_model_layer_is_moe)."""
        return bool(lib().wsync_model_layer_is_moe(C.byref(self._c()), int(layer)))

    def _c(self) -> D.wsync_model_config_t:
        c = D.wsync_model_config_t()
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "dtype":
                v = 0 if v is None else int(dtype_of(v))
            elif f.name == "mlp_only_layers":
                if len(v) > WSYNC_MODEL_MAX_MLP_ONLY:
                    raise InvalidArgumentError(f"mlp_only_layers: {len(v)} entries, at most "
                                               f"{WSYNC_MODEL_MAX_MLP_ONLY}", None)
                for i, x in enumerate(v):
                    c.mlp_only_layers[i] = int(x)
                c.nmlp_only_layers = len(v)
                continue
            setattr(c, f.name, int(v) if isinstance(v, (bool, enum.IntEnum)) else v)
        return c

    def check(self) -> None:
        """ConfigError naming the field unless the config is consistent."""
        _check(lib().wsync_model_config_check(C.byref(self._c())), "wsync_model_config_check")

    def params(self, dtype: Any = None) -> List[Param]:
        """The checkpoint params in HF order (names and global shapes); dtype None: the
        config's, or bf16."""
        c = self._c()
        out = C.POINTER(D.wsync_param_t)()
        n = C.c_size_t()
        _check(lib().wsync_model_params(C.byref(c), _dt(dtype), C.byref(out), C.byref(n)),
               "wsync_model_params")
        try:
            return [Param._from_c(out[i]) for i in range(n.value)]
        finally:
            lib().wsync_model_params_free(out, n.value)

    def fsdp_shards(self, rank: int, world: int, dtype: Any = None) -> List[ShardSpec]:
        """The FSDP (dim-0) box of every param for rank `rank` of `world`, empty boxes
        included (every rank gets the same list)."""
        c = self._c()
        out = C.POINTER(D.wsync_shard_t)()
        n = C.c_size_t()
        _check(lib().wsync_layout_fsdp_shards(C.byref(c), _dt(dtype), int(rank), int(world),
                                              C.byref(out), C.byref(n)),
               "wsync_layout_fsdp_shards")
        return _take_shards(out, n.value)

    def tp_targets(self, tp_rank: int, tp_size: int, *, quant: Any = None, block: Any = None,
                   dtype: Any = None, param_dtype: Any = None, quant_dtype: Any = None,
                   vocab_pad: int = 0, eps: float = 0.0, ue8m0: bool = False,
                   no_saturate: bool = False, ep_size: int = 0, ep_rank: int = 0,
                   expert_placement: Any = ExpertPlacement.LINEAR) -> List[Target]:
        """Every target of TP rank tp_rank of tp_size as vLLM lays the model out (fused
        qkv_proj and gate_up_proj, row-parallel o_proj and down_proj, vocab-parallel
        embeddings with padding, replicated norms; for MoE models the router, FusedMoE's
        w13_weight / w2_weight as their [E_local * 2 * I_p, Hd] / [E_local * Hd, I_p]
        matrices, shared experts; for DeepSeek MLA's projections). quant "fp8-block"
        (block=128 or (r, c)), "fp8-tensor" or "fp8-channel" makes the linear weights FP8
        targets. ep_size > 1: expert parallelism (vLLM enable_expert_parallel), this worker
        being ep_rank = dp_rank * tp_size + tp_rank, experts placed "linear" or "round_robin".
        ConfigError, naming the target and the numbers, when vLLM would refuse the model at this
        size."""
        q = Quant.of(quant, block)
        q = Quant(q.scheme, q.block_rows, q.block_cols, eps or q.eps, ue8m0 or q.ue8m0,
                  no_saturate or q.no_saturate)
        opts = D.tp_options_init()
        opts.param_dtype = _dt(param_dtype)
        opts.dtype = _dt(dtype)
        opts.quant_dtype = _dt(quant_dtype)
        opts.quant = q._c()
        opts.vocab_pad = int(vocab_pad)
        opts.ep_size = int(ep_size)
        opts.ep_rank = int(ep_rank)
        opts.expert_placement = int(_placement(expert_placement))
        c = self._c()
        out = C.POINTER(D.wsync_target_t)()
        n = C.c_size_t()
        _check(lib().wsync_layout_tp_targets(C.byref(c), int(tp_rank), int(tp_size),
                                             C.byref(opts), C.byref(out), C.byref(n)),
               "wsync_layout_tp_targets")
        try:
            return [Target._from_c(out[i]) for i in range(n.value)]
        finally:
            lib().wsync_layout_targets_free(out, n.value)


def _dt(value: Any) -> int:
    return 0 if value is None else int(dtype_of(value))


def _placement(value: Any) -> ExpertPlacement:
    if isinstance(value, str):
        try:
            return ExpertPlacement[value.upper()]
        except KeyError:
            raise InvalidArgumentError(f"expert placement {value!r}: linear or round_robin",
                                       None) from None
    return ExpertPlacement(value)


def local_experts(num_experts: int, ep_rank: int, ep_size: int,
                  placement: Any = ExpertPlacement.LINEAR) -> List[int]:
    """The global indices of the experts EP rank ep_rank of ep_size holds, in local order, as
    vLLM's determine_expert_map places them ("linear": a contiguous range, the first
    E % EP ranks one more; "round_robin": ep_rank, ep_rank + ep_size, ...)."""
    n = int(num_experts)
    size = int(ep_size)
    buf = (C.c_int64 * max(1, -(-n // max(size, 1))))()
    got = C.c_int64()
    _check(lib().wsync_layout_local_experts(n, int(ep_rank), size,
                                            int(_placement(placement)), buf, C.byref(got)),
           "wsync_layout_local_experts")
    return [int(buf[i]) for i in range(got.value)]


# ---------------------------------------------------------------------------------------------
# Sender layouts of MoE trainers (issue 16)
# ---------------------------------------------------------------------------------------------

def fused_params(config: Any, dtype: Any = None) -> List[Param]:
    """The params as a transformers 5.x model holds them in memory (its state_dict()): as
    ModelConfig.params(), each MoE layer's per-expert params replaced by
    "model.layers.L.mlp.experts.gate_up_proj" [E, 2I, Hd] and "...mlp.experts.down_proj"
    [E, Hd, I]. Sender.add_shard / add_state_dict unfuse shards of these."""
    c = ModelConfig.of(config)._c()
    out = C.POINTER(D.wsync_param_t)()
    n = C.c_size_t()
    _check(lib().wsync_model_fused_params(C.byref(c), _dt(dtype), C.byref(out), C.byref(n)),
           "wsync_model_fused_params")
    try:
        return [Param._from_c(out[i]) for i in range(n.value)]
    finally:
        lib().wsync_model_params_free(out, n.value)


def ep_shards(config: Any, rank: int, world: int, dense_dim: int = 0,
              dtype: Any = None) -> List[ShardSpec]:
    """Expert-parallel trainer boxes of every checkpoint param for rank `rank` of `world`:
    routed experts whole on the rank that owns them (linear placement, E % world == 0, else
    ConfigError), empty boxes elsewhere; the other params split along dense_dim (0: FSDP,
    WSYNC_REPLICATE: whole on every rank)."""
    c = ModelConfig.of(config)._c()
    out = C.POINTER(D.wsync_shard_t)()
    n = C.c_size_t()
    _check(lib().wsync_layout_ep_shards(C.byref(c), _dt(dtype), int(rank), int(world),
                                        int(dense_dim), C.byref(out), C.byref(n)),
           "wsync_layout_ep_shards")
    return _take_shards(out, n.value)
