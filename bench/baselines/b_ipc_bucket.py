#!/usr/bin/env python3
"""Baseline (b): the verl / checkpoint-engine colocated method, bucketed CUDA IPC.

Colocated FSDP-N -> TP-N: on each GPU a trainer process (launched by torch.distributed.run, one
per GPU, NCCL among the trainers) and an engine process (spawned by its trainer with
torch.multiprocessing, on the same GPU). At setup the trainer allocates one CUDA buffer
(--bucket-mib, 2 GiB by default) and hands it to its engine once through a torch.multiprocessing
pipe (a CUDA IPC handle, opened once). Each version, bucket by bucket:
  1. trainer: for each tensor of the bucket, all_gather_into_tensor of its FSDP2-style shards
     straight into its place in the buffer (full tensors packed back to back, 256-byte aligned);
     torch.cuda.synchronize; send the bucket's table (name, offset, shape) to the engine;
  2. engine: for each tensor, view it in the shared buffer and load it into its fused TP weights
     as vLLM's weight_loader does (narrow, copy into qkv_proj / gate_up_proj / row / vocab
     parallel); torch.cuda.synchronize; answer, and the trainer fills the buffer again.
Time per version = the slowest trainer's, from a barrier to its engine's last answer.

Launch (NCCL_NVLS_ENABLE=0 is set unless already set):
  python3 -m torch.distributed.run --nproc-per-node 4 bench/baselines/b_ipc_bucket.py \\
      --model-shape qwen3-8b
Only the colocated scenario exists for this method. --model-shape takes a comma-separated list:
each shape runs in turn in the same launch, with the same engine processes and buffer. Prints
one JSON object per run (wsync-bench --json's keys; see README.md) on rank 0's stdout.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ALIGN = 256


def plan_buckets(specs, world, bucket_bytes):
    """[[(name, index, shape, offset, slot_bytes)]]: tensors in order, each in a slot big enough
    for its padded all-gather (world x ceil(rows / world) rows), 256-byte aligned."""
    buckets, cur, off = [], [], 0
    for i, (n, shp) in enumerate(specs):
        rows = shp[0]
        per_row = common.numel(shp) // rows
        slot = world * (-(-rows // world)) * per_row * 2
        slot = -(-slot // ALIGN) * ALIGN
        if slot > bucket_bytes:
            raise SystemExit("%s needs %d bytes, above the %d-byte bucket (raise --bucket-mib)"
                             % (n, slot, bucket_bytes))
        if off + slot > bucket_bytes:
            buckets.append(cur)
            cur, off = [], 0
        cur.append((n, i, shp, off, slot))
        off += slot
    if cur:
        buckets.append(cur)
    return buckets


def engine_main(conn, local, verify):
    """The inference engine's process: the shared buffer (opened once), fused TP weights of the
    model its trainer names (a new model frees the last), loads on request."""
    import torch
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    buf = conn.recv()  # the CUDA buffer, by IPC handle, once
    eng, shape_name, seed = None, None, 0
    while True:
        msg = conn.recv()
        if msg[0] == "model":
            _, shape_name, tp, tp_rank, seed = msg
            eng = None
            torch.cuda.empty_cache()
            eng = common.FusedTP(torch, shape_name, tp, tp_rank, dev)
            conn.send(("ready", eng.nbytes()))
        elif msg[0] == "bucket":
            t0 = time.perf_counter()
            for name, off, shp in msg[1]:
                n = common.numel(shp)
                full = buf[off: off + 2 * n].view(torch.bfloat16).view(shp)
                eng.load(name, full)
            torch.cuda.synchronize()
            conn.send(("done", time.perf_counter() - t0))
        elif msg[0] == "verify":
            specs = common.param_specs(shape_name)
            bad = eng.verify(common.verify_names(shape_name), specs, seed, dev) if verify else []
            conn.send(("verified", bad))
        else:
            break
    eng = None
    del buf
    conn.close()


def make_parser():
    p = common.parser(__doc__)
    common.add_common_args(p, scenarios=["colocated"])
    p.add_argument("--bucket-mib", type=int, default=2048, help="shared buffer size (default 2048)")
    return p


def engine_of(torch, g, args):
    """This rank's engine process and the buffer it shares, started by the launch's first run of
    (b) and kept for the next ones (a spawned process takes seconds to import torch)."""
    e = g.state.get("b")
    bucket_bytes = args.bucket_mib << 20
    if e is not None and e["bucket_bytes"] == bucket_bytes:
        return e
    if e is not None:
        close(g)
    import torch.multiprocessing as tmp
    buf = torch.empty(bucket_bytes, dtype=torch.uint8, device=g.dev)
    ctx = tmp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=engine_main, args=(child, g.local, not args.no_verify), daemon=True)
    proc.start()
    conn.send(buf)
    e = dict(proc=proc, conn=conn, buf=buf, bucket_bytes=bucket_bytes)
    g.state["b"] = e
    if close not in g.at_end:
        g.at_end.append(close)
    return e


def close(g):
    e = g.state.pop("b", None)
    if e is not None:
        e["conn"].send(("end",))
        e["proc"].join(timeout=60)


def run(torch, g, args):
    """One run in the launch's process group g; see common.launch."""
    dist = g.dist
    rank, dev = g.rank, g.dev
    sc = common.scenario_of(args)
    world, tp = sc["senders"], sc["tp"]
    if g.world != world:
        sys.exit("colocated needs %d ranks (launch with --nproc-per-node %d), got %d"
                 % (world, world, g.world))

    specs = common.param_specs(args.model_shape)
    model_bytes = sum(common.numel(s) * 2 for _, s in specs)
    e = engine_of(torch, g, args)
    buf, conn = e["buf"], e["conn"]
    buckets = plan_buckets(specs, world, e["bucket_bytes"])
    common.log(rank, "%s colocated FSDP-%d -> TP-%d: %d params, %.2f GB, %d buckets of %d MiB"
               % (args.model_shape, world, tp, len(specs), model_bytes / 1e9, len(buckets), args.bucket_mib))

    shards = {}
    for i, (n, shp) in enumerate(specs):
        full = common.gen_full(torch, i, shp, args.seed, dev)
        shards[n] = common.fsdp_shard(torch, full, rank, world)
        del full
    torch.cuda.synchronize()
    conn.send(("model", args.model_shape, tp, rank, args.seed))
    tag, recv_bytes = conn.recv()
    assert tag == "ready"
    dist.barrier()

    times, gather_rows, load_rows, wait_rows = [], [], [], []
    for v in range(args.warmup + args.iters):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g_s = l_s = w_s = 0.0
        for b in buckets:
            tg = time.perf_counter()
            table = []
            for n, i, shp, off, slot in b:
                sh = shards[n]
                out = buf[off: off + 2 * world * sh.numel()].view(torch.bfloat16).view(
                    (world * sh.shape[0],) + tuple(sh.shape[1:]))
                dist.all_gather_into_tensor(out, sh)
                table.append((n, off, shp))
            torch.cuda.synchronize()
            tw = time.perf_counter()
            g_s += tw - tg
            conn.send(("bucket", table))
            tag, eng_s = conn.recv()
            assert tag == "done"
            l_s += eng_s
            w_s += time.perf_counter() - tw
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if v >= args.warmup:
            times.append(dt.item())
            gather_rows.append(g_s)
            load_rows.append(l_s)
            wait_rows.append(w_s)
        common.log(rank, "version %d: %.3f ms" % (v, dt.item() * 1e3))

    conn.send(("verify",))
    tag, bad = conn.recv()
    if bad:
        print("rank %d: loaded tensors differ from their source: %s" % (rank, ", ".join(bad)),
              file=sys.stderr, flush=True)
    nbad = torch.tensor([len(bad)], device=dev)
    dist.all_reduce(nbad)
    r = None
    if rank == 0:
        r = common.result(torch, args, "b", "torch-ipc-bucket", ["all_gather_into_bucket", "ipc_handoff", "load"],
                          times, model_bytes, recv_bytes, world, len(specs),
                          extra=dict(bucket_bytes=e["bucket_bytes"], buckets=len(buckets),
                                     gather_s=common.median(gather_rows),
                                     engine_load_s=common.median(load_rows),
                                     handoff_and_load_s=common.median(wait_rows),
                                     stages_timed_on_rank=0,
                                     verified=None if args.no_verify else nbad.item() == 0))
    return r, int(nbad.item())


def main():
    args = make_parser().parse_args()
    return common.launch([(run, a) for a in common.expand(args)])


if __name__ == "__main__":
    sys.exit(main())
