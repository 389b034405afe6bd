#!/usr/bin/env python3
"""Several runs of the baselines (a), (b), (c) in one launch, one after the other.

A torch.distributed.run start (processes, torch import, NCCL) costs 10-20 s, more than most
runs; here every run shares one process group, its NCCL communicators and (b)'s engine
processes. Each run is parsed by its method's own command line, so it takes what that script
takes and writes the JSON that script writes.

  python3 -m torch.distributed.run --standalone --nproc-per-node 4 bench/baselines/suite.py \\
      --runs a:colocated:qwen3-8b,b:colocated:qwen3-8b,a:fanout:qwen3-8b:2,c:fanout:4G \\
      --iters 3 --warmup 1 --json-out runs.jsonl

RUN is METHOD:SCENARIO:WHAT[:REPLICAS][:ep]: METHOD a, b or c; SCENARIO colocated, fanout,
disaggregated, or on 2 GPUs colocated2 and disaggregated1; WHAT a model shape (for c: broadcast
that model's bytes) or, for c only, a buffer size such as 4G; REPLICAS the fanout's replica
count (default 3); ep, for a MoE shape, gives the inference ranks whole experts (--ep), e.g.
a:colocated2:qwen3-30b-a3b:ep. Runs go in the order
given, so put the ones that matter most first: a run that fails ends the launch.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import a_nccl_per_tensor  # noqa: E402
import b_ipc_bucket  # noqa: E402
import c_nccl_broadcast  # noqa: E402
import common  # noqa: E402

METHODS = {"a": a_nccl_per_tensor, "b": b_ipc_bucket, "c": c_nccl_broadcast}


def parse_run(text, common_argv):
    """'a:fanout:qwen3-8b:2' -> (run function, its Namespace), through the method's parser."""
    f = text.split(":")
    ep = "ep" in f[3:]
    if ep:
        f = f[:3] + [x for x in f[3:] if x != "ep"]
    if len(f) not in (3, 4) or f[0] not in METHODS:
        raise SystemExit("--runs: %r is not METHOD:SCENARIO:WHAT[:REPLICAS][:ep] with METHOD a, "
                         "b or c" % text)
    mod = METHODS[f[0]]
    argv = ["--scenario", f[1]] + common_argv
    if f[2] in common.SHAPES:
        argv += ["--model-shape", f[2]] + (["--model-bytes"] if f[0] == "c" else [])
    elif f[0] == "c":
        argv += ["--bytes", f[2]]
    else:
        raise SystemExit("--runs: %r: %r is not a model shape (%s)"
                         % (text, f[2], ", ".join(sorted(common.SHAPES))))
    if len(f) == 4:
        argv += ["--replicas", f[3]]
    if ep:
        argv.append("--ep")
    parser = mod.make_parser()
    parser.prog = "suite.py, run %s" % text   # errors name the run, not a command line
    args = parser.parse_args(argv)
    return mod.run, common.expand(args)[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True,
                   help="comma-separated METHOD:SCENARIO:WHAT[:REPLICAS][:ep]")
    p.add_argument("--iters", default="5", help="timed versions of every run (default 5)")
    p.add_argument("--warmup", default="1", help="untimed versions first (default 1)")
    p.add_argument("--json-out", metavar="PATH", help="one JSON line per run (emptied first)")
    p.add_argument("--no-verify", action="store_true", help="as in each script")
    args = p.parse_args()
    common_argv = ["--iters", args.iters, "--warmup", args.warmup]
    if args.json_out:
        common_argv += ["--json-out", args.json_out]
    if args.no_verify:
        common_argv.append("--no-verify")
    runs = [parse_run(t, common_argv) for t in args.runs.split(",") if t]
    return common.launch(runs)


if __name__ == "__main__":
    sys.exit(main())
