"""wsync: weight synchronization from RL trainers to inference workers (Python bindings).

Pure Python over libwsync through ctypes; the library is found through $WSYNC_LIBRARY, next to
the package, in a build tree, or on the standard library paths (see wsync._library). PyTorch is
never imported: torch tensors (and DTensors) are used through their attributes.

Trainer rank i of N (rank 0 hosts the coordinator)::

    import wsync
    with wsync.Sender("10.0.0.1:29600", rank=i, world=N, receivers=R) as s:
        s.add_state_dict(model.state_dict())          # FSDP2 DTensors: local shards + boxes
        for step in range(steps):
            train_step()
            s.push(step + 1)                          # returns when every receiver committed

Inference worker, TP rank r of T::

    with wsync.Receiver("10.0.0.1:29600", rank=r, receivers=R) as rv:
        bufs = rv.add_engine_targets("model/config.json", tp_rank=r, tp_size=T)
        while True:
            version = rv.wait()                       # bufs hold exactly this version

Errors are exceptions (WsyncError subclasses, one per status: MismatchError, PeerLostError,
WsyncTimeoutError, ...) carrying the library's message and the status name.
"""
from ._cdefs import (DType, LogLevel, Mem, ModelType, QuantScheme, Status, WSYNC_MAX_DIMS,
                     WSYNC_REPLICATE, WSYNC_VERSION_MAJOR, WSYNC_VERSION_MINOR,
                     WSYNC_VERSION_PATCH)
from ._library import LibraryNotFoundError, library_path
from .context import ComponentInfo, Context
from .errors import (AbortedError, ConfigError, DeviceError, IntegrityError, InternalError,
                     InvalidArgumentError, MismatchError, NonFiniteError, NotFoundError,
                     OutOfMemoryError, PeerLostError, ProtocolError, RangeError, StateError,
                     TransportError, UnsupportedError, WsyncError, WsyncIOError,
                     WsyncTimeoutError)
from .layout import (Box, ModelConfig, Param, Piece, Quant, ShardSpec, Target, column_parallel,
                     merged_column, qkv, replicated, row_parallel, shard_box, shards,
                     vocab_parallel)
from .receiver import Receiver, scale_name
from .megatron import add_megatron_state_dict, megatron_shards, megatron_tensors
from .sender import PushStats, Sender
from .tensors import HostTensor, dtype_name, dtype_of, dtype_size

__version__ = f"{WSYNC_VERSION_MAJOR}.{WSYNC_VERSION_MINOR}.{WSYNC_VERSION_PATCH}"

__all__ = [
    "Sender", "Receiver", "Context", "PushStats", "ComponentInfo", "scale_name",
    "ModelConfig", "Param", "Box", "Piece", "Quant", "Target", "ShardSpec",
    "shard_box", "shards", "replicated", "column_parallel", "row_parallel", "merged_column",
    "qkv", "vocab_parallel", "megatron_tensors", "megatron_shards", "add_megatron_state_dict",
    "HostTensor", "dtype_of", "dtype_size", "dtype_name",
    "DType", "Mem", "QuantScheme", "LogLevel", "ModelType", "Status", "WSYNC_MAX_DIMS",
    "WSYNC_REPLICATE",
    "WsyncError", "InvalidArgumentError", "OutOfMemoryError", "WsyncTimeoutError",
    "PeerLostError", "ProtocolError", "MismatchError", "UnsupportedError", "StateError",
    "WsyncIOError", "AbortedError", "NotFoundError", "RangeError", "NonFiniteError",
    "ConfigError", "DeviceError", "TransportError", "IntegrityError", "InternalError",
    "LibraryNotFoundError", "library_path", "__version__",
]
