"""Shared parts of the PyTorch baselines (bench/baselines/*.py): model shapes, the vLLM-style
fused tensor-parallel layout and its weight loader, FSDP-style dim-0 shards, timing, the JSON
result (the keys of wsync-bench --json, plus the baseline's own), and the launch that runs
several of them in one process group (a torch.distributed.run start costs 10-20 s).

Runs on the lent GPU machines (PyTorch with NCCL); never in CI. torch is imported lazily so that
every script answers --help without it.
"""

import argparse
import copy
import gc
import itertools
import json
import os
import sys
import time

# NVLink SHARP (multicast) stays off on the lent machines (../shared/DEVICE.md).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

# The published configs (config.json of Qwen/Qwen3-0.6B, -8B, -32B), as bench/bench_model.c has
# them: hidden, layers, heads, kv heads, head_dim, intermediate, vocab, tied embeddings.
SHAPES = {
    "tiny": dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=128, inter=512, vocab=1024, tie=False),
    "qwen3-0.6b": dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, inter=3072, vocab=151936, tie=True),
    "qwen3-8b": dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, inter=12288, vocab=151936, tie=False),
    "qwen3-32b": dict(hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128, inter=25600, vocab=151936, tie=False),
    # Mixture of experts (Qwen3-MoE: every layer's MLP is `experts` routed experts of width
    # moe_inter and a router mlp.gate [experts, hidden]), as bench_model.c's tiny-moe and
    # Qwen/Qwen3-30B-A3B's config.json
    "tiny-moe": dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=128, inter=512, vocab=1024, tie=False,
                     experts=8, moe_inter=512),
    "qwen3-30b-a3b": dict(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, inter=6144, vocab=151936,
                          tie=False, experts=128, moe_inter=768),
}

# Scenarios of issue 9: senders (FSDP degree), TP degree, replicas, colocated.
SCENARIOS = {
    "colocated": dict(senders=4, tp=4, replicas=1, colocated=True),
    "fanout": dict(senders=1, tp=1, replicas=3, colocated=False),
    "disaggregated": dict(senders=2, tp=2, replicas=1, colocated=False),
    # the same on a 2-GPU machine: FSDP-2 -> TP-2 (or EP-2) on GPUs 0, 1; FSDP-1 (GPU 0) ->
    # TP-1 (GPU 1)
    "colocated2": dict(senders=2, tp=2, replicas=1, colocated=True),
    "disaggregated1": dict(senders=1, tp=1, replicas=1, colocated=False),
}

VOCAB_PAD = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


def choice_list(choices):
    """An argparse type: one of `choices`, or several separated by commas."""
    def parse(text):
        items = [t for t in text.split(",") if t]
        bad = [t for t in items if t not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError("%r: expected one or more of %s, comma-separated"
                                             % (text, ", ".join(sorted(choices))))
        return items
    return parse


def add_common_args(p, scenarios=None):
    p.add_argument("--model-shape", default="qwen3-8b", type=choice_list(SHAPES),
                   help="synthetic weights of this shape (default qwen3-8b); several, "
                        "comma-separated, run one after the other in one launch")
    p.add_argument("--scenario", default="colocated", type=choice_list(scenarios or SCENARIOS),
                   help="colocated: FSDP-4 -> TP-4 on the same 4 GPUs; fanout: 1 trainer GPU -> 3 "
                        "TP-1 replicas; disaggregated: FSDP-2 (GPUs 0, 1) -> TP-2 (GPUs 2, 3); "
                        "several, comma-separated, run in one launch (every shape x scenario)")
    p.add_argument("--replicas", type=int, default=None,
                   help="fanout only: TP-1 replicas on ranks 1..R (default 3); ranks beyond "
                        "them stay idle")
    p.add_argument("--iters", type=int, default=5, help="timed versions (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed versions first (default 1)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the synthetic weights")
    p.add_argument("--json-out", metavar="PATH",
                   help="also write the JSON results to PATH, one line per run (emptied first)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip checking a few loaded tensors against their regenerated values")
    p.add_argument("--ep", action="store_true",
                   help="MoE shapes: the inference ranks of a replica hold whole experts (vLLM's "
                        "enable_expert_parallel, EP = TP, linear placement) instead of every "
                        "expert split by TP; attention stays split by TP")


def expand(args):
    """One Namespace per (model shape, scenario) of a parsed command line."""
    out = []
    for shape, scenario in itertools.product(args.model_shape, args.scenario):
        a = copy.copy(args)
        a.model_shape, a.scenario = shape, scenario
        out.append(a)
    return out


def scenario_of(args):
    """The run's senders, tp, replicas, colocated: its scenario, with --replicas for fanout."""
    sc = dict(SCENARIOS[args.scenario])
    if args.scenario == "fanout" and getattr(args, "replicas", None):
        sc["replicas"] = args.replicas
    return sc


def ranks_needed(args):
    sc = scenario_of(args)
    return sc["senders"] if sc["colocated"] else sc["senders"] + sc["tp"] * sc["replicas"]


def param_specs(shape_name):
    """[(name, shape)] of a Qwen3 model in the Hugging Face naming, in checkpoint order."""
    s = SHAPES[shape_name]
    h, hd, nh, kv, it = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["inter"]
    out = [("model.embed_tokens.weight", (s["vocab"], h))]
    for i in range(s["layers"]):
        p = "model.layers.%d." % i
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (nh * hd, h)),
            (p + "self_attn.k_proj.weight", (kv * hd, h)),
            (p + "self_attn.v_proj.weight", (kv * hd, h)),
            (p + "self_attn.o_proj.weight", (h, nh * hd)),
            (p + "self_attn.q_norm.weight", (hd,)),
            (p + "self_attn.k_norm.weight", (hd,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
        if is_moe(shape_name):
            # one tensor per expert, as save_pretrained writes a Qwen3-MoE checkpoint
            mi = s["moe_inter"]
            out.append((p + "mlp.gate.weight", (s["experts"], h)))
            for e in range(s["experts"]):
                q = p + "mlp.experts.%d." % e
                out += [(q + "gate_proj.weight", (mi, h)), (q + "up_proj.weight", (mi, h)),
                        (q + "down_proj.weight", (h, mi))]
            continue
        out += [
            (p + "mlp.gate_proj.weight", (it, h)),
            (p + "mlp.up_proj.weight", (it, h)),
            (p + "mlp.down_proj.weight", (h, it)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not s["tie"]:
        out.append(("lm_head.weight", (s["vocab"], h)))
    return out


def is_moe(shape_name):
    return SHAPES[shape_name].get("experts", 0) > 0


def local_experts(num_experts, ep_rank, ep_size):
    """The global experts EP rank ep_rank of ep_size holds, in local order: vLLM's
    determine_expert_map with linear placement (a contiguous range; the first E % EP ranks hold
    one more each)."""
    base, extra = divmod(num_experts, ep_size)
    start = ep_rank * base + min(ep_rank, extra)
    return list(range(start, start + base + (1 if ep_rank < extra else 0)))


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def gen_full(torch, idx, shape, seed, device):
    """Param idx's full tensor: bf16 N(0, 0.02^2), never zeros, the same on every rank."""
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1000003 + idx)
    t = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)
    return t.mul_(0.02)


def fsdp_shard(torch, full, rank, world):
    """FSDP2-style shard: rows [rank * sr, (rank + 1) * sr) of dim 0, sr = ceil(rows / world),
    zero-padded to sr rows so that all_gather_into_tensor takes equal pieces."""
    rows = full.shape[0]
    sr = -(-rows // world)
    shard = torch.zeros((sr,) + tuple(full.shape[1:]), dtype=full.dtype, device=full.device)
    lo = min(rank * sr, rows)
    hi = min(lo + sr, rows)
    if hi > lo:
        shard[: hi - lo].copy_(full[lo:hi])
    return shard


class FusedTP:
    """One inference rank's weights in vLLM's fused tensor-parallel layout, and vLLM's way of
    loading a full checkpoint tensor into it (weight_loader: narrow the full tensor to the rank's
    part, copy it into its place):
      qkv_proj = [q rows of the rank's heads; k rows; v rows] (KV heads replicated when kv < tp),
      gate_up_proj = [gate rows; up rows] (column parallel), o_proj and down_proj row parallel
      (the rank's columns), embed_tokens and lm_head vocab parallel (vocab padded to a multiple of 64),
      norms replicated."""

    def __init__(self, torch, shape_name, tp, tp_rank, device, ep=False):
        s = SHAPES[shape_name]
        self.torch = torch
        h, hd, nh, kv, it = s["hidden"], s["head_dim"], s["heads"], s["kv_heads"], s["inter"]
        assert nh % tp == 0 and it % tp == 0, "heads and intermediate must split over tp"
        qp = nh // tp
        if kv >= tp:
            assert kv % tp == 0
            kvp, kv0 = kv // tp, tp_rank * (kv // tp)
        else:
            assert tp % kv == 0
            kvp, kv0 = 1, tp_rank // (tp // kv)
        ip = it // tp
        vpad = -(-s["vocab"] // VOCAB_PAD) * VOCAB_PAD
        vp = -(-vpad // tp)
        v0 = tp_rank * vp
        vn = max(0, min(s["vocab"] - v0, vp))
        bf = torch.bfloat16
        self.params = {}
        self.loads = {}  # full-tensor name -> [(dst view, dim, start, length)]

        def new(name, shp):
            t = torch.empty(shp, dtype=bf, device=device)
            self.params[name] = t
            return t

        emb = new("model.embed_tokens.weight", (vp, h))
        if vn < vp:
            emb[vn:].zero_()
        self.loads["model.embed_tokens.weight"] = [(emb[:vn], 0, v0, vn)]
        for i in range(s["layers"]):
            p = "model.layers.%d." % i
            qkv = new(p + "self_attn.qkv_proj.weight", ((qp + 2 * kvp) * hd, h))
            self.loads[p + "self_attn.q_proj.weight"] = [(qkv[: qp * hd], 0, tp_rank * qp * hd, qp * hd)]
            self.loads[p + "self_attn.k_proj.weight"] = [(qkv[qp * hd:(qp + kvp) * hd], 0, kv0 * hd, kvp * hd)]
            self.loads[p + "self_attn.v_proj.weight"] = [(qkv[(qp + kvp) * hd:], 0, kv0 * hd, kvp * hd)]
            o = new(p + "self_attn.o_proj.weight", (h, qp * hd))
            self.loads[p + "self_attn.o_proj.weight"] = [(o, 1, tp_rank * qp * hd, qp * hd)]
            if s.get("experts", 0) > 0:
                self._moe_layer(p, s, tp, tp_rank, ep, new)
            else:
                gu = new(p + "mlp.gate_up_proj.weight", (2 * ip, h))
                self.loads[p + "mlp.gate_proj.weight"] = [(gu[:ip], 0, tp_rank * ip, ip)]
                self.loads[p + "mlp.up_proj.weight"] = [(gu[ip:], 0, tp_rank * ip, ip)]
                d = new(p + "mlp.down_proj.weight", (h, ip))
                self.loads[p + "mlp.down_proj.weight"] = [(d, 1, tp_rank * ip, ip)]
            for n, ln in (("input_layernorm.weight", h), ("post_attention_layernorm.weight", h),
                          ("self_attn.q_norm.weight", hd), ("self_attn.k_norm.weight", hd)):
                t = new(p + n, (ln,))
                self.loads[p + n] = [(t, 0, 0, ln)]
        t = new("model.norm.weight", (h,))
        self.loads["model.norm.weight"] = [(t, 0, 0, h)]
        if not s["tie"]:
            lm = new("lm_head.weight", (vp, h))
            if vn < vp:
                lm[vn:].zero_()
            self.loads["lm_head.weight"] = [(lm[:vn], 0, v0, vn)]

    def _moe_layer(self, p, s, tp, tp_rank, ep, new):
        """vLLM's FusedMoE weights of one layer and its weight_loader's rules: the router
        mlp.gate replicated; w13 [E_local, 2 I_p, Hd] (expert j's gate rows, then its up rows)
        and w2 [E_local, Hd, I_p]. Without ep every rank holds every expert, I_p = I / tp (gate
        and up narrowed on dim 0, down on dim 1, by tp_rank); with ep the rank holds whole
        experts (I_p = I) and a tensor of any other expert is dropped, unread."""
        h, e_all, mi = s["hidden"], s["experts"], s["moe_inter"]
        router = new(p + "mlp.gate.weight", (e_all, h))
        self.loads[p + "mlp.gate.weight"] = [(router, 0, 0, e_all)]
        if ep:
            mine, ip, r0 = local_experts(e_all, tp_rank, tp), mi, 0
        else:
            assert mi % tp == 0, "moe_intermediate_size must split over tp"
            mine, ip = list(range(e_all)), mi // tp
            r0 = tp_rank * ip
        w13 = new(p + "mlp.experts.w13_weight", (len(mine), 2 * ip, h))
        w2 = new(p + "mlp.experts.w2_weight", (len(mine), h, ip))
        local = {e: j for j, e in enumerate(mine)}
        for e in range(e_all):
            q = p + "mlp.experts.%d." % e
            j = local.get(e)
            if j is None:
                for n in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
                    self.loads[q + n] = []
                continue
            self.loads[q + "gate_proj.weight"] = [(w13[j, :ip], 0, r0, ip)]
            self.loads[q + "up_proj.weight"] = [(w13[j, ip:], 0, r0, ip)]
            self.loads[q + "down_proj.weight"] = [(w2[j], 1, r0, ip)]

    def load(self, name, full):
        """vLLM's weight_loader step for one full checkpoint tensor."""
        for dst, dim, start, length in self.loads[name]:
            if length > 0:
                dst.copy_(full.narrow(dim, start, length))

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.params.values())

    def verify(self, names, specs, seed, device):
        """Regenerate a few full tensors and compare the rank's parts; returns the names that differ."""
        idx = {n: i for i, (n, _) in enumerate(specs)}
        shp = dict(specs)
        bad = []
        for n in names:
            if n not in self.loads:
                continue
            full = gen_full(self.torch, idx[n], shp[n], seed, device)
            for dst, dim, start, length in self.loads[n]:
                if length > 0 and not self.torch.equal(dst, full.narrow(dim, start, length)):
                    bad.append(n)
        return bad


def verify_names(shape_name):
    s = SHAPES[shape_name]
    last = s["layers"] - 1
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.%d.self_attn.o_proj.weight" % last,
             "model.norm.weight"]
    if is_moe(shape_name):
        # the first and last expert (on the first and last EP rank), the router
        e = s["experts"] - 1
        names += ["model.layers.0.mlp.experts.0.gate_proj.weight",
                  "model.layers.0.mlp.experts.0.up_proj.weight",
                  "model.layers.%d.mlp.experts.%d.up_proj.weight" % (last, e),
                  "model.layers.%d.mlp.experts.%d.down_proj.weight" % (last, e),
                  "model.layers.%d.mlp.gate.weight" % last]
    else:
        names += ["model.layers.%d.mlp.up_proj.weight" % last,
                  "model.layers.%d.mlp.down_proj.weight" % last]
    if not s["tie"]:
        names.append("lm_head.weight")
    return names


def median(v):
    v = sorted(v)
    n = len(v)
    if n == 0:
        return 0.0
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def device_info(torch):
    nccl = None
    try:
        nv = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in nv) if isinstance(nv, tuple) else str(nv)
    except Exception:  # noqa: BLE001 - only informative
        pass
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, nccl=nccl,
                gpus=torch.cuda.device_count())


def result(torch, args, method, scheme, steps, times, model_bytes, recv_bytes, receivers, nparams,
           extra=None):
    """The JSON object: wsync-bench --json's keys (scheme, mem, receivers, bytes, params, dtype,
    iters, warmup, seconds, seconds_min/max, gbps_per_receiver(_min/_max), times) and the
    baseline's own (method, steps, model_shape, scenario, senders, tp, replicas, colocated,
    bytes_per_receiver, gbps_model, device...)."""
    sc = scenario_of(args)
    med = median(times)
    tmin = min(times) if times else 0.0
    tmax = max(times) if times else 0.0
    r = dict(
        scheme=scheme, baseline=True, method=method, steps=steps, mem="cuda",
        model_shape=args.model_shape, scenario=args.scenario,
        senders=sc.get("senders"), tp=sc.get("tp"), replicas=sc.get("replicas"),
        colocated=sc.get("colocated"), ep=sc.get("tp") if getattr(args, "ep", False) else 1,
        experts=SHAPES[args.model_shape].get("experts", 0) if args.model_shape in SHAPES else 0,
        receivers=receivers, bytes=model_bytes,
        bytes_per_receiver=recv_bytes, params=nparams, dtype="bf16", iters=args.iters,
        warmup=args.warmup, seconds=med, seconds_min=tmin, seconds_max=tmax,
        gbps_per_receiver=recv_bytes / med / 1e9 if med > 0 else 0.0,
        gbps_per_receiver_min=recv_bytes / tmax / 1e9 if tmax > 0 else 0.0,
        gbps_per_receiver_max=recv_bytes / tmin / 1e9 if tmin > 0 else 0.0,
        gbps_model=model_bytes / med / 1e9 if med > 0 else 0.0,
        times=times, date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), run=run_name(method, args),
        nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"))
    r.update(device_info(torch))
    if extra:
        r.update(extra)
    return r


def run_name(method, args):
    """a-qwen3-8b-fanout, c-bytes4G-fanout-r2 ...: names a run in logs and in the merged array."""
    # (c) without --model-bytes broadcasts a buffer of --bytes, not a model
    if getattr(args, "model_bytes", True):
        what = args.model_shape
    else:
        what = "bytes" + (args.bytes or "4G")
    name = "%s-%s-%s" % (method, what, args.scenario)
    if args.scenario == "fanout" and getattr(args, "replicas", None):
        name += "-r%d" % args.replicas
    if getattr(args, "ep", False):
        name += "-ep"
    return name


def emit(args, r):
    text = json.dumps(r, sort_keys=False)
    print(text, flush=True)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(text + "\n")


def need_torch():
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except ImportError as e:
        sys.exit("this baseline needs PyTorch with CUDA and NCCL (%s); run it on a lent GPU machine" % e)
    import torch
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    return torch


def log(rank, msg):
    if rank == 0:
        print("[rank 0] " + msg, file=sys.stderr, flush=True)


def parser(doc):
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


class Group:
    """This launch's NCCL process group: rank, world, GPU, the subgroups made so far (NCCL
    communicators are slow to make, so each set of ranks gets one, reused by later runs), state
    that a method keeps across runs (b: its engine processes) and what to close at the end."""

    def __init__(self, torch):
        import torch.distributed as dist
        self.dist = dist
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        torch.cuda.set_device(self.local)
        self.dev = torch.device("cuda", self.local)
        dist.init_process_group("nccl", device_id=self.dev)
        self.state = {}
        self.at_end = []
        self._subs = {}

    def sub(self, ranks):
        """The group of `ranks` (None: the whole world). Every rank must ask for the same
        groups in the same order, members or not, as torch.distributed.new_group requires."""
        ranks = tuple(ranks)
        if ranks == tuple(range(self.world)):
            return None
        if ranks not in self._subs:
            self._subs[ranks] = self.dist.new_group(list(ranks))
        return self._subs[ranks]


def launch(runs):
    """Runs [(fn, args)] one after the other in one process group; fn(torch, group, args)
    returns (the JSON object on rank 0 or None, the number of wrong tensors). Every rank runs
    the same list, so a rank that a run does not use still joins its collectives. Returns the
    exit status: 1 if any run loaded a wrong tensor."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    short = [(a.scenario, ranks_needed(a)) for _, a in runs if ranks_needed(a) > world]
    if short:
        sys.exit("%d ranks launched; %s (launch with --nproc-per-node 4)"
                 % (world, ", ".join("%s needs %d" % s for s in short)))
    torch = need_torch()
    g = Group(torch)
    if g.rank == 0:
        for path in {a.json_out for _, a in runs if a.json_out}:
            open(path, "w").close()
    bad = 0
    for fn, args in runs:
        r, nbad = fn(torch, g, args)
        if g.rank == 0:
            emit(args, r)
        bad += nbad
        # the run's tensors are gone with its frame: give their memory back before the next
        gc.collect()
        torch.cuda.empty_cache()
        g.dist.barrier()
    for close in g.at_end:
        close(g)
    g.dist.barrier()
    g.dist.destroy_process_group()
    return 1 if bad else 0
