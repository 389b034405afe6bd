#!/usr/bin/env python3
"""Example inference rank in Python: receiver `rank` of `receivers`, laid out as TP rank
rank % tp of a vLLM engine of TP size `tp`, filling torch tensors (bf16, on the CPU) when
PyTorch is installed, else buffers the receiver allocates (memoryviews of bf16 bit patterns).

    python3 receiver.py --coordinator HOST:PORT --rank R --receivers N [--tp T]
                        [--versions K] [--config config.json] [--check]

It waits for versions until version K and prints a checksum of its buffers after each one.
With --check it also compares every element with the weights examples/c/trainer writes (the same
hash as examples/c/example_weights.h), and exits 1 on the first version that differs. Without
--config the model is the trainer's small built-in Qwen3 shape.

Needs the wsync package (python/ in the checkout: PYTHONPATH=python, or pip install ./python)
and libwsync.so (WSYNC_LIBRARY=path, or an installed one)."""
import argparse
import itertools
import sys

try:
    import wsync
except ImportError as e:
    sys.exit(f"receiver.py: cannot import wsync ({e}); set PYTHONPATH=<checkout>/python or "
             "pip install <checkout>/python")

try:
    import torch
except ImportError:
    torch = None   # buffers allocated by the receiver instead

# examples/c/example_weights.h's example_builtin_config, as an HF config.json
BUILTIN_CONFIG = {
    "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "vocab_size": 200, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": False, "dtype": "bfloat16",
}

M64 = (1 << 64) - 1


def name_hash(name: str) -> int:
    """FNV-1a of the param name (example_name_hash)."""
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def value(nh: int, index: int, version: int) -> int:
    """bf16 bit pattern of element `index` of a param at `version` (example_value)."""
    h = nh ^ ((index * 0x9E3779B97F4A7C15) & M64) ^ ((version * 0xC2B2AE3D27D4EB4F) & M64)
    h ^= h >> 31
    h = (h * 0xBF58476D1CE4E5B9) & M64
    h ^= h >> 29
    return 0x3F80 | (h & 0x7F) | (((h >> 7) & 1) << 15)


def offset(at, shape) -> int:
    """Row-major offset of point `at` in a tensor of `shape`."""
    off = 0
    for a, n in zip(at, shape):
        off = off * n + a
    return off


def bits(buffer) -> list:
    """The buffer's bf16 elements as unsigned 16-bit integers, flat, row-major."""
    if torch is not None and isinstance(buffer, torch.Tensor):
        return [x & 0xFFFF for x in buffer.view(torch.int16).flatten().tolist()]
    return memoryview(buffer).cast("B").cast("H").tolist()


def count_wrong(target, flat, version: int) -> int:
    """Elements of the target that differ from the trainer's weights of `version`."""
    wrong = 0
    for piece in target.pieces:
        nh = name_hash(piece.param.name)
        ranges = [range(n) for n in piece.src.len]
        for i in itertools.product(*ranges):   # the piece's box, point by point
            src = [s + k for s, k in zip(piece.src.start, i)]
            dst = [s + k for s, k in zip(piece.dst_start, i)]
            got = flat[offset(dst, target.shape)]
            want = value(nh, offset(src, piece.param.shape), version)
            if got != want:
                if wrong == 0:
                    print(f"receiver: version {version}: {target.name} element "
                          f"{offset(dst, target.shape)} (of param {piece.param.name}) is "
                          f"{got:#06x}, expected {want:#06x}", file=sys.stderr)
                wrong += 1
    return wrong


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", default="127.0.0.1:29600")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--receivers", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--config", help="config.json (default: the built-in small shape)")
    ap.add_argument("--check", action="store_true",
                    help="compare with examples/c/trainer's weights; exit 1 on a difference")
    args = ap.parse_args()

    config = wsync.ModelConfig.of(args.config if args.config else BUILTIN_CONFIG)
    tp_rank = args.rank % args.tp
    buffers = None
    if torch is not None:
        # the engine's own parameters would go here; CPU tensors in this example
        buffers = {t.name: torch.zeros(t.shape, dtype=torch.bfloat16)
                   for t in config.tp_targets(tp_rank, args.tp)}

    with wsync.Receiver(args.coordinator, rank=args.rank, receivers=args.receivers) as rv:
        weights = rv.add_engine_targets(config, tp_rank=tp_rank, tp_size=args.tp,
                                        buffers=buffers)
        version = 0
        while version < args.versions:
            version = rv.wait()   # weights[name] now hold exactly this version
            wrong, checksum = 0, 0xCBF29CE484222325
            for name, target in rv.targets.items():
                flat = bits(weights[name])
                if args.check:
                    wrong += count_wrong(target, flat, version)
                for x in flat:   # FNV-1a over the bytes, little-endian, as worker.c prints it
                    checksum = ((checksum ^ (x & 0xFF)) * 0x100000001B3) & M64
                    checksum = ((checksum ^ (x >> 8)) * 0x100000001B3) & M64
            state = ("WRONG" if wrong else "every element right") if args.check else "unchecked"
            print(f"receiver {args.rank} (tp {tp_rank}/{args.tp}, "
                  f"{'torch' if torch is not None else 'host buffers'}): version {version}, "
                  f"{len(rv.targets)} targets, checksum {checksum:016x}, {state}", flush=True)
            if wrong:
                print(f"receiver {args.rank}: version {version}: {wrong} elements differ",
                      file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
