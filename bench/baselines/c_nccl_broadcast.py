#!/usr/bin/env python3
"""Baseline (c): one raw ncclBroadcast of a large buffer (the engine's ceiling).

dist.broadcast of one --bytes buffer (default 4 GiB of bf16) from rank 0 to every other rank of
the launch; the time of each broadcast is the slowest rank's, from a barrier to its completion
(CUDA synchronized). With --scenario, the ranks of a weight sync: fanout (1 -> 3, or 1 -> R
with --replicas R), disaggregated (rank 0 -> ranks 2, 3, a group without rank 1), colocated
(0 -> 1, 2, 3: the broadcast every GPU would need for a full replica); with --model-bytes, the
model's bytes. Lists of shapes and scenarios run in turn in one launch, as for (a).

Launch (NCCL_NVLS_ENABLE=0 is set unless already set):
  python3 -m torch.distributed.run --nproc-per-node 4 bench/baselines/c_nccl_broadcast.py
Prints one JSON object per run (wsync-bench --json's keys; see README.md) on rank 0's stdout.
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CHECK_CHUNK = 1 << 28   # elements summed at once by the check (2 GiB as int64)


def parse_bytes(s):
    """4G, 512M, 1.5GiB, 4096 -> bytes"""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgKMG]?)(?:i?[bB])?\s*", s)
    if m is None:
        raise SystemExit("--bytes %r: a size such as 4G, 512M or 1048576" % s)
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()])


def make_parser():
    p = common.parser(__doc__)
    common.add_common_args(p)
    p.add_argument("--bytes", default=None,
                   help="buffer size (e.g. 4G, 512M; default 4G, or the model's bytes with "
                        "--model-bytes)")
    p.add_argument("--model-bytes", action="store_true",
                   help="broadcast the --model-shape's bf16 bytes instead of --bytes")
    return p


def members_of(args, world):
    """The broadcast's ranks, rank 0 first (see the doc above)."""
    sc = common.scenario_of(args)
    if args.scenario == "disaggregated" and world >= 4:
        return [0, 2, 3]
    if args.scenario == "fanout":
        return list(range(1 + sc["replicas"]))
    return list(range(world))


def run(torch, g, args):
    """One run in the launch's process group g; see common.launch."""
    dist = g.dist
    rank, dev = g.rank, g.dev
    members = members_of(args, g.world)
    group = g.sub(members)
    if args.model_bytes:
        nbytes = sum(common.numel(s) * 2 for _, s in common.param_specs(args.model_shape))
    else:
        nbytes = parse_bytes(args.bytes or "4G")
    nbytes = nbytes // 2 * 2
    buf = None
    if rank in members:
        buf = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
        if rank == 0:
            buf.normal_(0, 0.02)
    common.log(rank, "broadcast of %.3f GB from rank 0 to %s" % (nbytes / 1e9, members[1:]))
    torch.cuda.synchronize()

    times = []
    for v in range(args.warmup + args.iters):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if buf is not None:
            dist.broadcast(buf, src=0, group=group)
        torch.cuda.synchronize()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if v >= args.warmup:
            times.append(dt.item())
        common.log(rank, "broadcast %d: %.3f ms, %.1f GB/s" % (v, dt.item() * 1e3, nbytes / dt.item() / 1e9))
    ok = True
    if not args.no_verify and buf is not None:
        # rank 0's values, regenerated nowhere: compare an exact checksum instead, a chunk at a
        # time (a float copy of a qwen3-32b-sized buffer would not fit beside it)
        bits = buf.view(torch.int16)
        cs = torch.zeros(1, dtype=torch.int64, device=dev)
        for i in range(0, bits.numel(), CHECK_CHUNK):
            cs += bits[i:i + CHECK_CHUNK].to(torch.int64).sum()
        ref = cs.clone()
        dist.broadcast(ref, src=0, group=group)
        ok = bool(torch.equal(cs, ref))
    okt = torch.tensor([0 if ok else 1], device=dev)
    dist.all_reduce(okt)
    r = None
    if rank == 0:
        r = common.result(torch, args, "c", "nccl-broadcast", ["broadcast"], times, nbytes, nbytes,
                          len(members) - 1, 1,
                          extra=dict(members=members, buffer_bytes=nbytes,
                                     verified=None if args.no_verify else okt.item() == 0))
        # one buffer, not a model: the model fields say what it stands for
        if not args.model_bytes:
            r["model_shape"] = None
    return r, int(okt.item())


def main():
    args = make_parser().parse_args()
    return common.launch([(run, a) for a in common.expand(args)])


if __name__ == "__main__":
    sys.exit(main())
