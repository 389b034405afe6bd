"""ctypes mirror of the C API: include/wsync/wsync.h and the headers it includes
(wsync_fp8.h, wsync_layout.h, wsync_plan.h).

Everything the Python package knows about the C ABI lives in this one module: the enums, the
structs (field for field, in header order) and the prototype of every public function. Change it
together with the headers; tests/python/test_abi.py compiles a C program that prints the real
sizes, offsets, enum values and initializer values and compares them with what this module
declares, so a drift fails a test rather than corrupting memory.

This module does not load the library; see wsync._library.
"""
from __future__ import annotations

import ctypes as C
import enum

# ---------------------------------------------------------------------------------------------
# wsync.h: version, status
# ---------------------------------------------------------------------------------------------

WSYNC_VERSION_MAJOR = 0
WSYNC_VERSION_MINOR = 1
WSYNC_VERSION_PATCH = 0

#: WSYNC_STATUS_MAP: (name without the WSYNC_ prefix, code, text), in header order.
STATUS_MAP = (
    ("OK", 0, "success"),
    ("ERR_INVALID", -1, "invalid argument"),
    ("ERR_NOMEM", -2, "out of memory"),
    ("ERR_TIMEOUT", -3, "deadline passed"),
    ("ERR_PEER_LOST", -4, "a peer was lost"),
    ("ERR_PROTOCOL", -5, "malformed or unexpected message"),
    ("ERR_MISMATCH", -6, "descriptions of senders and receivers do not match"),
    ("ERR_UNSUPPORTED", -7, "operation not supported"),
    ("ERR_STATE", -8, "call not valid in the object's current state"),
    ("ERR_IO", -9, "system call failed"),
    ("ERR_ABORTED", -10, "the group was aborted"),
    ("ERR_NOT_FOUND", -11, "not found"),
    ("ERR_RANGE", -12, "value out of range"),
    ("ERR_NONFINITE", -13, "non-finite value (NaN or Inf) in a source"),
    ("ERR_CONFIG", -14, "invalid model configuration"),
    ("ERR_DEVICE", -15, "device (CUDA) error"),
    ("ERR_TRANSPORT", -16, "transport error"),
    ("ERR_INTEGRITY", -17, "data failed its integrity check"),
    ("ERR_INTERNAL", -18, "internal error"),
)

Status = enum.IntEnum("Status", [(name, code) for name, code, _ in STATUS_MAP])
Status.__doc__ = "wsync_status_t: 0 is OK, errors are negative (names without the WSYNC_ prefix)."

c_status = C.c_int   # wsync_status_t
c_enum = C.c_int     # every enum of the headers fits an int (gcc/clang: 4 bytes)


class DType(enum.IntEnum):
    """wsync_dtype_t."""
    BF16 = 1
    F16 = 2
    F32 = 3
    F8E4M3FN = 4
    F8E5M2 = 5
    U8 = 6


#: wsync_dtype_size / wsync_dtype_name / the aliases wsync_dtype_parse accepts (core/dtype.c).
DTYPE_INFO = {
    DType.BF16: (2, "bf16", ("bfloat16", "BF16")),
    DType.F16: (2, "f16", ("float16", "F16", "half")),
    DType.F32: (4, "f32", ("float32", "F32", "float")),
    DType.F8E4M3FN: (1, "f8e4m3fn", ("float8_e4m3fn", "F8_E4M3", "e4m3")),
    DType.F8E5M2: (1, "f8e5m2", ("float8_e5m2", "F8_E5M2", "e5m2")),
    DType.U8: (1, "u8", ("uint8", "U8")),
}


class Mem(enum.IntEnum):
    """wsync_mem_t."""
    HOST = 0
    CUDA = 1


WSYNC_MAX_DIMS = 4


class QuantScheme(enum.IntEnum):
    """wsync_quant_scheme_t."""
    NONE = 0
    TENSOR = 1
    CHANNEL = 2
    BLOCK = 3


class LogLevel(enum.IntEnum):
    """wsync_log_level_t."""
    UNSET = -1
    ERROR = 0
    WARN = 1
    INFO = 2
    DEBUG = 3


class ModelType(enum.IntEnum):
    """wsync_model_type_t (wsync_layout.h)."""
    LLAMA = 1
    QWEN2 = 2
    QWEN3 = 3
    QWEN3_MOE = 4
    DEEPSEEK_V2 = 5
    DEEPSEEK_V3 = 6


class RouterScore(enum.IntEnum):
    """wsync_router_score_t (wsync_layout.h)."""
    SOFTMAX = 0
    SIGMOID = 1


class TopkMethod(enum.IntEnum):
    """wsync_topk_method_t (wsync_layout.h)."""
    GREEDY = 0
    GROUP_LIMITED = 1
    NOAUX_TC = 2


class ExpertPlacement(enum.IntEnum):
    """wsync_expert_placement_t (wsync_layout.h)."""
    LINEAR = 0
    ROUND_ROBIN = 1


class WireForm(enum.IntEnum):
    """wsync_wire_form_t (wsync_plan.h): how a target's bytes travel."""
    PLAIN = 0
    FP8 = 1
    CUT_CELLS = 2
    SHARED = 3
    PER_TENSOR = 4
    OFF = 5
    UNCOVERED = 6
    NFORMS = 7


WSYNC_REPLICATE = -1
WSYNC_MODEL_MAX_MLP_ONLY = 256

Dims = C.c_int64 * WSYNC_MAX_DIMS


class _Struct(C.Structure):
    """A struct of the headers; `_c_name_` is its C typedef name."""
    _c_name_ = ""

    def __repr__(self) -> str:
        fields = ", ".join(f"{f[0]}={getattr(self, f[0])!r}" for f in self._fields_)
        return f"{self._c_name_}({fields})"


class wsync_param_t(_Struct):
    _c_name_ = "wsync_param_t"
    _fields_ = [
        ("name", C.c_char_p),
        ("dtype", c_enum),
        ("ndim", C.c_int),
        ("shape", Dims),
    ]


class wsync_box_t(_Struct):
    _c_name_ = "wsync_box_t"
    _fields_ = [
        ("start", Dims),
        ("len", Dims),
    ]


class wsync_shard_t(_Struct):
    _c_name_ = "wsync_shard_t"
    _fields_ = [
        ("param", wsync_param_t),
        ("box", wsync_box_t),
        ("data", C.c_void_p),
        ("mem", c_enum),
        ("device", C.c_int),
    ]


class wsync_piece_t(_Struct):
    _c_name_ = "wsync_piece_t"
    _fields_ = [
        ("param", wsync_param_t),
        ("src", wsync_box_t),
        ("dst_start", Dims),
    ]


class wsync_quant_t(_Struct):
    _c_name_ = "wsync_quant_t"
    _fields_ = [
        ("scheme", c_enum),
        ("block_rows", C.c_int),
        ("block_cols", C.c_int),
        ("eps", C.c_float),
        ("ue8m0", C.c_int),
        ("no_saturate", C.c_int),
        ("scales", C.POINTER(C.c_float)),
        ("scales_mem", c_enum),
    ]


class wsync_target_t(_Struct):
    _c_name_ = "wsync_target_t"
    _fields_ = [
        ("name", C.c_char_p),
        ("dtype", c_enum),
        ("ndim", C.c_int),
        ("shape", Dims),
        ("data", C.c_void_p),
        ("mem", c_enum),
        ("device", C.c_int),
        ("pieces", C.POINTER(wsync_piece_t)),
        ("npieces", C.c_int),
        ("quant", wsync_quant_t),
    ]


class wsync_ctx_params_t(_Struct):
    _c_name_ = "wsync_ctx_params_t"
    _fields_ = [
        ("log_level", c_enum),
        ("verify", C.c_int),
    ]


class wsync_component_info_t(_Struct):
    _c_name_ = "wsync_component_info_t"
    _fields_ = [
        ("name", C.c_char_p),
        ("compiled", C.c_int),
        ("available", C.c_int),
        ("reason", C.c_char_p),
        ("caps", C.c_char_p),
    ]


class wsync_sender_params_t(_Struct):
    _c_name_ = "wsync_sender_params_t"
    _fields_ = [
        ("coordinator", C.c_char_p),
        ("rank", C.c_int),
        ("nranks", C.c_int),
        ("nreceivers", C.c_int),
        ("scheme", C.c_char_p),
        ("bucket_bytes", C.c_size_t),
        ("timeout_ms", C.c_int),
        ("heartbeat_ms", C.c_int),
        ("snapshot", C.c_int),
        ("keep_versions", C.c_int),
        ("copy_shards", C.c_int),
        ("delta", C.c_char_p),
        ("delta_baseline", C.c_char_p),
        ("delta_cutoff", C.c_double),
        ("fp8_wire", C.c_int),
    ]


class wsync_push_stats_t(_Struct):
    _c_name_ = "wsync_push_stats_t"
    _fields_ = [
        ("version", C.c_uint64),
        ("bytes_packed", C.c_uint64),
        ("bytes_delivered", C.c_uint64),
        ("buckets", C.c_uint64),
        ("seconds", C.c_double),
        ("bytes_wire", C.c_uint64),
        ("bytes_encoded", C.c_uint64),
        ("bytes_plain", C.c_uint64),
        ("base_version", C.c_uint64),
    ]


#: void (*wsync_progress_fn)(void *arg, uint64_t version, uint64_t bytes_done, uint64_t bytes_total)
wsync_progress_fn = C.CFUNCTYPE(None, C.c_void_p, C.c_uint64, C.c_uint64, C.c_uint64)


#: int (*wsync_version_fn)(void *arg, uint64_t version)
wsync_version_fn = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_uint64)


class wsync_receiver_params_t(_Struct):
    _c_name_ = "wsync_receiver_params_t"
    _fields_ = [
        ("coordinator", C.c_char_p),
        ("rank", C.c_int),
        ("nreceivers", C.c_int),
        ("timeout_ms", C.c_int),
        ("heartbeat_ms", C.c_int),
        ("progress", wsync_progress_fn),
        ("progress_arg", C.c_void_p),
        ("on_version", wsync_version_fn),
        ("on_version_arg", C.c_void_p),
        ("delta", C.c_char_p),
    ]


# ---------------------------------------------------------------------------------------------
# wsync_layout.h
# ---------------------------------------------------------------------------------------------

class wsync_model_config_t(_Struct):
    _c_name_ = "wsync_model_config_t"
    _fields_ = [
        ("model_type", c_enum),
        ("hidden_size", C.c_int64),
        ("num_hidden_layers", C.c_int64),
        ("num_attention_heads", C.c_int64),
        ("num_key_value_heads", C.c_int64),
        ("head_dim", C.c_int64),
        ("intermediate_size", C.c_int64),
        ("vocab_size", C.c_int64),
        ("max_position_embeddings", C.c_int64),
        ("tie_word_embeddings", C.c_int),
        ("attention_bias", C.c_int),
        ("o_proj_bias", C.c_int),
        ("mlp_bias", C.c_int),
        ("qk_norm", C.c_int),
        ("rms_norm_eps", C.c_double),
        ("rope_theta", C.c_double),
        ("dtype", c_enum),
        ("num_experts", C.c_int64),
        ("num_experts_per_tok", C.c_int64),
        ("moe_intermediate_size", C.c_int64),
        ("norm_topk_prob", C.c_int),
        ("decoder_sparse_step", C.c_int64),
        ("nmlp_only_layers", C.c_int),
        ("mlp_only_layers", C.c_int32 * WSYNC_MODEL_MAX_MLP_ONLY),
        ("n_shared_experts", C.c_int64),
        ("first_k_dense_replace", C.c_int64),
        ("moe_layer_freq", C.c_int64),
        ("n_group", C.c_int64),
        ("topk_group", C.c_int64),
        ("routed_scaling_factor", C.c_double),
        ("scoring_func", c_enum),
        ("topk_method", c_enum),
        ("router_bias", C.c_int),
        ("q_lora_rank", C.c_int64),
        ("kv_lora_rank", C.c_int64),
        ("qk_nope_head_dim", C.c_int64),
        ("qk_rope_head_dim", C.c_int64),
        ("v_head_dim", C.c_int64),
        ("rope_interleave", C.c_int),
    ]


class wsync_tp_options_t(_Struct):
    _c_name_ = "wsync_tp_options_t"
    _fields_ = [
        ("param_dtype", c_enum),
        ("dtype", c_enum),
        ("quant_dtype", c_enum),
        ("quant", wsync_quant_t),
        ("vocab_pad", C.c_int64),
        ("ep_size", C.c_int),
        ("ep_rank", C.c_int),
        ("expert_placement", c_enum),
    ]


# ---------------------------------------------------------------------------------------------
# wsync_plan.h
# ---------------------------------------------------------------------------------------------

class wsync_plan_summary_t(_Struct):
    _c_name_ = "wsync_plan_summary_t"
    _fields_ = [
        ("nsenders", C.c_int),
        ("nreceivers", C.c_int),
        ("bucket_bytes", C.c_uint64),
        ("pair_bytes", C.POINTER(C.c_uint64)),
        ("bytes_per_receiver", C.POINTER(C.c_uint64)),
        ("bytes_landed_per_receiver", C.POINTER(C.c_uint64)),
        ("bytes_per_sender", C.POINTER(C.c_uint64)),
        ("staged_bytes_per_sender", C.POINTER(C.c_uint64)),
        ("buckets_per_sender", C.POINTER(C.c_uint64)),
        ("total_bytes", C.c_uint64),
        ("total_landed_bytes", C.c_uint64),
        ("total_staged_bytes", C.c_uint64),
        ("nchunks", C.c_uint64),
        ("nsegments", C.c_uint64),
        ("fingerprint", C.c_uint64),
        ("wire_bytes", C.c_uint64),
        ("wire_checked", C.c_int),
        ("wire_check_seconds", C.c_double),
        ("fp8_wire", C.c_int),
        ("fp8_wire_bytes", C.c_uint64),
        ("form_bytes", C.c_uint64 * WireForm.NFORMS),
        ("form_param_bytes", C.c_uint64 * WireForm.NFORMS),
        ("total_param_bytes", C.c_uint64),
        ("ntargets", C.c_size_t),
        ("target_form", C.POINTER(C.c_int32)),
        ("target_bytes", C.POINTER(C.c_uint64)),
        ("target_param_bytes", C.POINTER(C.c_uint64)),
    ]


STRUCTS = (
    wsync_param_t, wsync_box_t, wsync_shard_t, wsync_piece_t, wsync_quant_t, wsync_target_t,
    wsync_ctx_params_t, wsync_component_info_t, wsync_sender_params_t, wsync_push_stats_t,
    wsync_receiver_params_t, wsync_model_config_t, wsync_tp_options_t, wsync_plan_summary_t,
)

ENUMS = {
    "wsync_status_t": {f"WSYNC_{n}": c for n, c, _ in STATUS_MAP},
    "wsync_dtype_t": {f"WSYNC_DTYPE_{m.name}": int(m) for m in DType},
    "wsync_mem_t": {f"WSYNC_MEM_{m.name}": int(m) for m in Mem},
    "wsync_quant_scheme_t": {f"WSYNC_QUANT_{m.name}": int(m) for m in QuantScheme},
    "wsync_log_level_t": {f"WSYNC_LOG_{m.name}": int(m) for m in LogLevel},
    "wsync_model_type_t": {f"WSYNC_MODEL_{m.name}": int(m) for m in ModelType},
    "wsync_router_score_t": {f"WSYNC_ROUTER_{m.name}": int(m) for m in RouterScore},
    "wsync_topk_method_t": {f"WSYNC_TOPK_{m.name}": int(m) for m in TopkMethod},
    "wsync_expert_placement_t": {f"WSYNC_EXPERT_{m.name}": int(m) for m in ExpertPlacement},
    "wsync_wire_form_t": {f"WSYNC_WIRE_{m.name}": int(m) for m in WireForm},
}

MACROS = {
    "WSYNC_VERSION_MAJOR": WSYNC_VERSION_MAJOR,
    "WSYNC_VERSION_MINOR": WSYNC_VERSION_MINOR,
    "WSYNC_VERSION_PATCH": WSYNC_VERSION_PATCH,
    "WSYNC_MAX_DIMS": WSYNC_MAX_DIMS,
    "WSYNC_REPLICATE": WSYNC_REPLICATE,
    "WSYNC_MODEL_MAX_MLP_ONLY": WSYNC_MODEL_MAX_MLP_ONLY,
}


# ---------------------------------------------------------------------------------------------
# The *_INIT macros
# ---------------------------------------------------------------------------------------------

def ctx_params_init() -> wsync_ctx_params_t:
    """WSYNC_CTX_PARAMS_INIT: {WSYNC_LOG_UNSET, -1}."""
    return wsync_ctx_params_t(LogLevel.UNSET, -1)


def sender_params_init() -> wsync_sender_params_t:
    """WSYNC_SENDER_PARAMS_INIT: {NULL, -1, 0, 0, NULL, 0, 0, 0, -1, 0, -1, NULL, NULL, 0.0, -1}."""
    return wsync_sender_params_t(None, -1, 0, 0, None, 0, 0, 0, -1, 0, -1, None, None, 0.0, -1)


def receiver_params_init() -> wsync_receiver_params_t:
    """WSYNC_RECEIVER_PARAMS_INIT: {NULL, -1, 0, 0, 0, NULL, NULL, NULL, NULL, NULL}."""
    return wsync_receiver_params_t(None, -1, 0, 0, 0, wsync_progress_fn(), None,
                                   wsync_version_fn(), None, None)


def tp_options_init() -> wsync_tp_options_t:
    """WSYNC_TP_OPTIONS_INIT."""
    return wsync_tp_options_t(0, 0, 0, wsync_quant_t(QuantScheme.NONE, 0, 0, 0.0, 0, 0, None,
                                                     Mem.HOST), 0, 0, 0, 0)


#: What the initializers hold, flattened to "struct.field" -> number (pointers as 0), in the form
#: the ABI test's C program prints them.
def init_values() -> dict:
    out = {}
    for obj in (ctx_params_init(), sender_params_init(), receiver_params_init(),
                tp_options_init()):
        out.update(_flatten(obj, obj._c_name_))
    return out


def _flatten(obj, prefix: str) -> dict:
    out = {}
    for name, ctype in obj._fields_:
        value = getattr(obj, name)
        key = f"{prefix}.{name}"
        if isinstance(value, _Struct):
            out.update(_flatten(value, key))
        elif isinstance(value, (int, float)):
            out[key] = value
        elif value is None or isinstance(value, bytes):
            out[key] = 0 if not value else 1
        else:   # pointers and function pointers: NULL or not
            out[key] = 1 if C.cast(value, C.c_void_p).value else 0
    return out


def struct_layout() -> dict:
    """{typedef name: {"size": n, "align": n, "fields": {field: [offset, size]}}} of every
    mirrored struct, nested structs' fields included as "outer.inner"."""
    out = {}
    for cls in STRUCTS:
        fields = {}
        _fields_of(cls, "", 0, fields)
        out[cls._c_name_] = {"size": C.sizeof(cls), "align": C.alignment(cls), "fields": fields}
    return out


def _fields_of(cls, prefix: str, base: int, out: dict) -> None:
    for name, ctype in cls._fields_:
        desc = getattr(cls, name)
        key = prefix + name
        out[key] = [base + desc.offset, desc.size]
        if isinstance(ctype, type) and issubclass(ctype, _Struct):
            _fields_of(ctype, key + ".", base + desc.offset, out)


# ---------------------------------------------------------------------------------------------
# Prototypes: name -> (restype, argtypes), in header order.
# ---------------------------------------------------------------------------------------------

_P = C.c_void_p      # opaque handles: wsync_ctx_t *, wsync_sender_t *, wsync_receiver_t *
_PP = C.POINTER(C.c_void_p)
_S = C.c_size_t

PROTOTYPES = {
    # wsync.h: status
    "wsync_status_str": (C.c_char_p, [c_status]),
    "wsync_status_name": (C.c_char_p, [c_status]),
    "wsync_last_error": (C.c_char_p, []),
    # basic types
    "wsync_dtype_size": (_S, [c_enum]),
    "wsync_dtype_name": (C.c_char_p, [c_enum]),
    "wsync_dtype_parse": (c_status, [C.c_char_p, C.POINTER(c_enum)]),
    # context
    "wsync_ctx_create": (c_status, [C.POINTER(wsync_ctx_params_t), _PP]),
    "wsync_ctx_free": (None, [_P]),
    "wsync_mem_alloc": (c_status, [_P, _S, _PP]),
    "wsync_mem_free": (None, [_P, _P]),
    "wsync_transport_count": (C.c_int, [_P]),
    "wsync_transport_info": (c_status, [_P, C.c_int, C.POINTER(wsync_component_info_t)]),
    "wsync_scheme_count": (C.c_int, [_P]),
    "wsync_scheme_info": (c_status, [_P, C.c_int, C.POINTER(wsync_component_info_t)]),
    "wsync_ctx_explain": (c_status, [_P, c_enum, C.c_int, C.c_int, C.c_char_p, _S]),
    # sender
    "wsync_sender_create": (c_status, [_P, C.POINTER(wsync_sender_params_t), _PP]),
    "wsync_sender_free": (None, [_P]),
    "wsync_sender_add_shard": (c_status, [_P, C.POINTER(wsync_shard_t)]),
    "wsync_sender_setup": (c_status, [_P]),
    "wsync_sender_push": (c_status, [_P, C.c_uint64]),
    "wsync_sender_scheme": (C.c_char_p, [_P]),
    "wsync_sender_explain": (C.c_char_p, [_P]),
    "wsync_sender_coordinator": (C.c_char_p, [_P]),
    "wsync_sender_stats": (c_status, [_P, C.POINTER(wsync_push_stats_t)]),
    "wsync_sender_push_begin": (c_status, [_P, C.c_uint64]),
    "wsync_sender_push_wait": (c_status, [_P, C.c_int, C.POINTER(C.c_uint64)]),
    "wsync_sender_push_test": (c_status, [_P, C.POINTER(C.c_int)]),
    # receiver
    "wsync_receiver_create": (c_status, [_P, C.POINTER(wsync_receiver_params_t), _PP]),
    "wsync_receiver_free": (None, [_P]),
    "wsync_receiver_add_target": (c_status, [_P, C.POINTER(wsync_target_t)]),
    "wsync_receiver_set_target_data": (c_status, [_P, C.c_char_p, C.c_void_p,
                                                  C.POINTER(C.c_float)]),
    "wsync_receiver_wait": (c_status, [_P, C.c_int, C.POINTER(C.c_uint64)]),
    "wsync_receiver_fetch": (c_status, [_P, C.c_uint64, C.c_int, C.POINTER(C.c_uint64)]),
    "wsync_receiver_version": (C.c_uint64, [_P]),
    "wsync_receiver_torn": (C.c_int, [_P]),
    "wsync_receiver_scheme": (C.c_char_p, [_P]),
    # wsync_fp8.h
    "wsync_fp8_from_f32": (c_status, [C.POINTER(C.c_float), _S, c_enum, C.c_int,
                                      C.POINTER(C.c_uint8)]),
    "wsync_fp8_to_f32": (c_status, [C.POINTER(C.c_uint8), _S, c_enum, C.POINTER(C.c_float)]),
    "wsync_quant_scales_shape": (c_status, [C.POINTER(wsync_quant_t), C.c_int64, C.c_int64,
                                            C.POINTER(C.c_int64), C.POINTER(C.c_int64)]),
    # wsync_layout.h: model config
    "wsync_model_type_name": (C.c_char_p, [c_enum]),
    "wsync_model_config_parse": (c_status, [C.c_char_p, _S, C.POINTER(wsync_model_config_t)]),
    "wsync_model_config_load": (c_status, [C.c_char_p, C.POINTER(wsync_model_config_t)]),
    "wsync_model_config_check": (c_status, [C.POINTER(wsync_model_config_t)]),
    "wsync_model_params": (c_status, [C.POINTER(wsync_model_config_t), c_enum,
                                      C.POINTER(C.POINTER(wsync_param_t)), C.POINTER(_S)]),
    "wsync_model_params_free": (None, [C.POINTER(wsync_param_t), _S]),
    "wsync_model_layer_is_moe": (C.c_int, [C.POINTER(wsync_model_config_t), C.c_int64]),
    "wsync_model_fused_params": (c_status, [C.POINTER(wsync_model_config_t), c_enum,
                                            C.POINTER(C.POINTER(wsync_param_t)), C.POINTER(_S)]),
    # sender layouts
    "wsync_layout_shard_box": (c_status, [C.POINTER(wsync_param_t), C.c_int, C.c_int, C.c_int,
                                          C.POINTER(wsync_box_t)]),
    "wsync_layout_shards": (c_status, [C.POINTER(wsync_param_t), _S, C.c_int, C.c_int, C.c_int,
                                       C.POINTER(C.POINTER(wsync_shard_t)), C.POINTER(_S)]),
    "wsync_layout_fsdp_shards": (c_status, [C.POINTER(wsync_model_config_t), c_enum, C.c_int,
                                            C.c_int, C.POINTER(C.POINTER(wsync_shard_t)),
                                            C.POINTER(_S)]),
    "wsync_layout_shards_free": (None, [C.POINTER(wsync_shard_t), _S]),
    "wsync_layout_ep_shards": (c_status, [C.POINTER(wsync_model_config_t), c_enum, C.c_int,
                                          C.c_int, C.c_int, C.POINTER(C.POINTER(wsync_shard_t)),
                                          C.POINTER(_S)]),
    "wsync_layout_unfuse_experts": (c_status, [C.POINTER(wsync_shard_t),
                                               C.POINTER(C.POINTER(wsync_shard_t)),
                                               C.POINTER(_S)]),
    # MoE receiver layouts
    "wsync_layout_local_experts": (c_status, [C.c_int64, C.c_int, C.c_int, c_enum,
                                              C.POINTER(C.c_int64), C.POINTER(C.c_int64)]),
    "wsync_layout_moe_w13": (c_status, [C.c_char_p, C.POINTER(wsync_param_t),
                                        C.POINTER(wsync_param_t), C.c_int64, C.c_int, C.c_int,
                                        C.POINTER(wsync_target_t)]),
    "wsync_layout_moe_w2": (c_status, [C.c_char_p, C.POINTER(wsync_param_t), C.c_int64, C.c_int,
                                       C.c_int, C.POINTER(wsync_target_t)]),
    # receiver layouts: one target
    "wsync_layout_replicated": (c_status, [C.POINTER(wsync_param_t), C.POINTER(wsync_target_t)]),
    "wsync_layout_column_parallel": (c_status, [C.POINTER(wsync_param_t), C.c_int, C.c_int,
                                                C.POINTER(wsync_target_t)]),
    "wsync_layout_row_parallel": (c_status, [C.POINTER(wsync_param_t), C.c_int, C.c_int,
                                             C.POINTER(wsync_target_t)]),
    "wsync_layout_merged_column": (c_status, [C.c_char_p, C.POINTER(wsync_param_t), C.c_int,
                                              C.c_int, C.c_int, C.POINTER(wsync_target_t)]),
    "wsync_layout_qkv": (c_status, [C.c_char_p, C.POINTER(wsync_param_t),
                                    C.POINTER(wsync_param_t), C.POINTER(wsync_param_t),
                                    C.c_int64, C.c_int64, C.c_int, C.c_int,
                                    C.POINTER(wsync_target_t)]),
    "wsync_layout_vocab_parallel": (c_status, [C.POINTER(wsync_param_t), C.c_int64, C.c_int,
                                               C.c_int, C.POINTER(wsync_target_t)]),
    "wsync_layout_target_free": (None, [C.POINTER(wsync_target_t)]),
    "wsync_target_bytes": (_S, [C.POINTER(wsync_target_t)]),
    "wsync_target_scale_count": (_S, [C.POINTER(wsync_target_t)]),
    # receiver layouts: a whole model
    "wsync_layout_tp_targets": (c_status, [C.POINTER(wsync_model_config_t), C.c_int, C.c_int,
                                           C.POINTER(wsync_tp_options_t),
                                           C.POINTER(C.POINTER(wsync_target_t)), C.POINTER(_S)]),
    "wsync_layout_targets_free": (None, [C.POINTER(wsync_target_t), _S]),
    # wsync_plan.h
    "wsync_plan_summarize": (c_status, [C.POINTER(wsync_shard_t), C.POINTER(C.c_int), _S,
                                        C.POINTER(wsync_target_t), C.POINTER(C.c_int), _S,
                                        C.c_int, C.c_int, _S,
                                        C.POINTER(C.POINTER(wsync_plan_summary_t))]),
    "wsync_plan_summarize_wire": (c_status, [C.POINTER(wsync_shard_t), C.POINTER(C.c_int), _S,
                                             C.POINTER(wsync_target_t), C.POINTER(C.c_int), _S,
                                             C.c_int, C.c_int, _S, C.c_int,
                                             C.POINTER(C.POINTER(wsync_plan_summary_t))]),
    "wsync_plan_summary_free": (None, [C.POINTER(wsync_plan_summary_t)]),
    # Megatron-Core sender layouts (reshard/layout_megatron.c)
    "wsync_layout_megatron_tensors": (c_status, [C.POINTER(wsync_model_config_t), c_enum, C.c_int,
                                                 C.c_int, C.c_int, C.c_int, C.c_int, C.c_int,
                                                 C.c_int64, C.POINTER(C.POINTER(wsync_target_t)),
                                                 C.POINTER(_S)]),
    "wsync_layout_tensor_shards": (c_status, [C.POINTER(wsync_target_t), C.c_void_p, c_enum,
                                              C.c_int, C.POINTER(C.POINTER(wsync_shard_t)),
                                              C.POINTER(_S)]),
}
