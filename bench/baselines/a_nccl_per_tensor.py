#!/usr/bin/env python3
"""Baseline (a): per-tensor NCCL, then a vLLM-style load (the torchrl / vLLM RLHF-example method).

For every checkpoint tensor, in order, one at a time:
  1. the trainer unshards it: all_gather_into_tensor over the FSDP ranks (FSDP2-style dim-0
     shards; skipped with one trainer);
  2. trainer rank 0 broadcasts the full tensor to every inference rank (dist.broadcast over a
     group of trainer rank 0 and the inference ranks; into torch.empty of the full shape, as the
     vLLM RLHF example's update_weight does). Colocated, every inference rank is a trainer rank
     that already holds the full tensor after step 1, so there is no broadcast;
  3. each inference rank loads the full tensor into its fused tensor-parallel weights the way
     vLLM's weight_loader does (qkv_proj, gate_up_proj, row/column parallel, vocab parallel).
Time per version = the slowest rank's, from a barrier to its last load done (CUDA synchronized).

Mixture-of-experts shapes (tiny-moe, qwen3-30b-a3b) are the peers' "all-gather each param and
let the engine slice": every per-expert tensor is gathered (and, disaggregated, broadcast) whole
like any other, and each inference rank keeps its slice in vLLM's FusedMoE w13/w2 weights: with
--ep its own whole experts (linear placement over the TP ranks of the replica, every other
expert's tensor dropped unread), without it a 1/TP slice of every expert.

Launch (one process per GPU; NCCL_NVLS_ENABLE=0 is set unless already set):
  python3 -m torch.distributed.run --nproc-per-node 4 bench/baselines/a_nccl_per_tensor.py \\
      --model-shape qwen3-8b --scenario colocated
Ranks: colocated 0-3 train (FSDP-4) and infer (TP-4); fanout rank 0 trains (full weights),
1-3 are TP-1 replicas (1..R with --replicas R); disaggregated 0-1 train (FSDP-2), 2-3 infer
(TP-2); on 2 GPUs colocated2 is FSDP-2 -> TP-2 (or EP-2) and disaggregated1 FSDP-1 (rank 0) ->
TP-1 (rank 1). --model-shape and --scenario take comma-separated lists: every pair runs in
turn in the same launch. Prints one JSON object per run (wsync-bench --json's keys; see README.md) on
rank 0's stdout, the last one last.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def make_parser():
    p = common.parser(__doc__)
    common.add_common_args(p)
    return p


def run(torch, g, args):
    """One run in the launch's process group g; see common.launch."""
    dist = g.dist
    rank, dev = g.rank, g.dev
    sc = common.scenario_of(args)
    S, T, R, coloc = sc["senders"], sc["tp"], sc["replicas"], sc["colocated"]
    if coloc and S != T * R:
        sys.exit("colocated needs as many trainer ranks as inference ranks")
    ep = bool(getattr(args, "ep", False))
    if ep and not common.is_moe(args.model_shape):
        sys.exit("--ep: shape %s has no experts" % args.model_shape)

    trainers = list(range(S))
    infer = list(range(S)) if coloc else list(range(S, S + T * R))
    is_tr, is_inf = rank in trainers, rank in infer
    tgroup = g.sub(trainers) if S > 1 else None
    branks = [trainers[0]] + [r for r in infer if r != trainers[0]]
    bgroup = None if coloc else g.sub(branks)

    specs = common.param_specs(args.model_shape)
    model_bytes = sum(common.numel(s) * 2 for _, s in specs)
    common.log(rank, "%s %s: %d params, %.2f GB, trainers %s, inference %s (%s %d x %d)"
               % (args.model_shape, args.scenario, len(specs), model_bytes / 1e9, trainers, infer,
                  "EP" if ep else "TP", T, R))

    # trainer state: FSDP shards (or full tensors with one trainer)
    held = {}
    if is_tr:
        for i, (n, shp) in enumerate(specs):
            full = common.gen_full(torch, i, shp, args.seed, dev)
            held[n] = common.fsdp_shard(torch, full, rank, S) if S > 1 else full
            del full
    engine = None
    if is_inf:
        tp_rank = infer.index(rank) % T
        engine = common.FusedTP(torch, args.model_shape, T, tp_rank, dev, ep=ep)
    recv_bytes = engine.nbytes() if engine else 0
    torch.cuda.synchronize()
    dist.barrier()

    me = infer[0]  # the rank whose stages are timed with CUDA events
    times, stage_rows = [], []
    for v in range(args.warmup + args.iters):
        ev = {"gather": [], "broadcast": [], "load": []}

        def mark(stage):
            if rank == me:
                e = torch.cuda.Event(enable_timing=True)
                e.record()
                ev[stage].append(e)

        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i, (n, shp) in enumerate(specs):
            full = None
            if is_tr:
                if S > 1:
                    sh = held[n]
                    mark("gather")
                    out = torch.empty((S * sh.shape[0],) + tuple(sh.shape[1:]), dtype=sh.dtype, device=dev)
                    dist.all_gather_into_tensor(out, sh, group=tgroup)
                    full = out[: shp[0]]
                    mark("gather")
                else:
                    full = held[n]
            if not coloc and rank in branks:
                mark("broadcast")
                if rank == trainers[0]:
                    buf = full if full.is_contiguous() else full.contiguous()
                else:
                    buf = torch.empty(shp, dtype=torch.bfloat16, device=dev)
                dist.broadcast(buf, src=trainers[0], group=bgroup)
                full = buf
                mark("broadcast")
            if is_inf:
                mark("load")
                engine.load(n, full)
                mark("load")
        torch.cuda.synchronize()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        st = {}
        if rank == me:
            for k, es in ev.items():
                st[k + "_s"] = sum(es[j].elapsed_time(es[j + 1]) for j in range(0, len(es), 2)) / 1e3
        if v >= args.warmup:
            times.append(dt.item())
            stage_rows.append(st)
        common.log(rank, "version %d: %.3f ms" % (v, dt.item() * 1e3))

    # stages as the timed rank saw them, sent to rank 0
    st = torch.zeros(3, dtype=torch.float64, device=dev)
    if rank == me and stage_rows:
        for j, k in enumerate(("gather_s", "broadcast_s", "load_s")):
            st[j] = common.median([r.get(k, 0.0) for r in stage_rows])
    dist.all_reduce(st)  # only `me` contributes
    bad = []
    if is_inf and not args.no_verify:
        bad = engine.verify(common.verify_names(args.model_shape), specs, args.seed, dev)
    nbad = torch.tensor([len(bad)], device=dev)
    dist.all_reduce(nbad)
    recv = torch.tensor([recv_bytes], dtype=torch.float64, device=dev)
    dist.all_reduce(recv, op=dist.ReduceOp.MAX)
    if bad:
        print("rank %d: loaded tensors differ from their source: %s" % (rank, ", ".join(bad)),
              file=sys.stderr, flush=True)
    r = None
    if rank == 0:
        steps = (["all_gather"] if S > 1 else []) + ([] if coloc else ["broadcast"]) + ["load"]
        r = common.result(torch, args, "a", "torch-nccl-per-tensor", steps, times, model_bytes,
                          int(recv.item()), len(infer), len(specs),
                          extra=dict(stages_timed_on_rank=me, gather_s=st[0].item(),
                                     broadcast_s=st[1].item(), load_s=st[2].item(),
                                     verified=None if args.no_verify else nbad.item() == 0))
    return r, int(nbad.item())


def main():
    args = make_parser().parse_args()
    return common.launch([(run, a) for a in common.expand(args)])


if __name__ == "__main__":
    sys.exit(main())
