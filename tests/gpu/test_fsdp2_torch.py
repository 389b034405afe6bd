#!/usr/bin/env python3
"""Issue 20, point 1: FSDP2 as it is. HF transformers' Qwen3 and Qwen3-MoE, wrapped by
torch.distributed.fsdp.fully_shard on 2 GPUs, train (AdamW, lr 1e-5, one step per version) and
push each version with `Sender.add_state_dict(model.state_dict())` (no layout argument) into
wsync-engine TP-2; after each version the engine's greedy tokens must equal those of HF
transformers running the trainer's own full weights.

    python3 tests/gpu/test_fsdp2_torch.py [--build DIR] [--json FILE]
                                          [--cases qwen3:1d,qwen3_moe:1d,qwen3_moe:hsdp]

* Cases: MODEL:MESH with MODEL qwen3 (hf_qwen3_tiny) or qwen3_moe (hf_qwen3_moe_tiny, whose
  experts transformers 5.x holds fused: mlp.experts.gate_up_proj / down_proj, DTensor Shard(0)
  over experts, unfused by the Sender) and MESH 1d (fully_shard over a 1-D mesh of 2: Shard(0),
  ceil(n/2) rows per rank) or hsdp (a 2-D mesh (replicate 2, shard 1): (Replicate(), Shard(0)),
  both trainer ranks replicas describing the same boxes).
* The trainer: 2 processes (this file with --trainer R), one per GPU (0, 1), NCCL process group;
  `from_pretrained(dtype=bf16)`, fully_shard on every decoder layer and the root; per version k
  (1, 2, 3): one LM-loss step on fixed random tokens (each rank its own), AdamW lr 1e-5, then
  push k (the sender is set up once, after the first step: FSDP2's lazy init may move the
  sharded storage before it). Then the test, not wsync, gathers the full weights
  (DTensor.full_tensor() of every state-dict value) and rank 0 loads them into a float32 HF
  model of the same config (a float32 forward over the bf16 weights, as reference.json was
  made) and takes 12 greedy tokens, one full forward per token.
* The engine: `wsync-engine --sync ... --versions 3 --device cuda --tp 2` on GPUs 2, 3 when 4
  exist, else on the trainer's GPUs 0, 1 (the engine shares them).
* Passes when for every case and version the engine's tokens equal the trainer's HF tokens.
  Reported besides: how many elements each version changed (bf16 weights move by few ulps at
  lr 1e-5), and whether the tokens differ from reference.json's.

Standard library + torch + transformers. libwsync from $WSYNC_LIBRARY, else BUILD/lib/libwsync.so,
else BUILD/libwsync.so; models under $WSYNC_TESTDATA, ../shared/testdata, shared/testdata or
BUILD/testdata. Exit 0 pass, 1 fail, 77 skipped (no torch with CUDA or transformers, fewer than 2
GPUs, no engine or library).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NAME = "test_fsdp2_torch"
WORLD = 2             # trainer ranks, GPUs 0 and 1
TP = 2                # engine ranks
VERSIONS = 3
TIMEOUT_S = 120
MODELS = {"qwen3": "hf_qwen3_tiny", "qwen3_moe": "hf_qwen3_moe_tiny"}
MESHES = ("1d", "hsdp")


def log(msg: str) -> None:
    print(f"[{NAME} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def find_testdata(build: Path):
    cands = []
    if os.environ.get("WSYNC_TESTDATA"):
        cands.append(Path(os.environ["WSYNC_TESTDATA"]))
    cands += [Path("../shared/testdata"), Path("shared/testdata"),
              REPO.parent / "shared" / "testdata", build / "testdata"]
    for c in cands:
        if all((c / m / "model.safetensors").is_file() for m in MODELS.values()):
            return c.resolve()
    return None


def find_library(build: Path):
    if os.environ.get("WSYNC_LIBRARY"):
        return Path(os.environ["WSYNC_LIBRARY"])
    for c in (build / "lib" / "libwsync.so", build / "libwsync.so"):
        if c.exists():
            return c.resolve()
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_json(text: str):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


# ---------------------------------------------------------------------------------------------
# the trainer rank (a subprocess of this file)
# ---------------------------------------------------------------------------------------------

def trainer(a) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import AutoConfig, AutoModelForCausalLM
    sys.path.insert(0, str(REPO / "python"))
    import wsync

    rank = a.trainer
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    who = f"trainer {rank}"
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.dist_port}", rank=rank,
                            world_size=WORLD, device_id=dev)
    if a.mesh == "1d":
        mesh = init_device_mesh("cuda", (WORLD,))
    else:
        mesh = init_device_mesh("cuda", (WORLD, 1), mesh_dim_names=("replicate", "shard"))
    ref = json.loads((Path(a.model) / "reference.json").read_text())
    prompt = ref["input_ids"]
    n_new = len(ref["greedy_12"])

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to(dev)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    cfg = AutoConfig.from_pretrained(a.model)
    gen = torch.Generator().manual_seed(1234 + rank)
    batch = torch.randint(0, cfg.vocab_size, (2, 24), generator=gen).to(dev)
    checker = None
    if rank == 0:   # the float32 model the full weights are loaded into
        checker = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(dev)
        checker.eval()
    result = {"rank": rank, "mesh": a.mesh, "model": Path(a.model).name, "versions": []}
    prev = None
    sender = None
    try:
        for k in range(1, VERSIONS + 1):
            model.train()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sd = model.state_dict()
            if sender is None:
                sender = wsync.Sender(a.coordinator, rank=rank, world=WORLD, receivers=TP,
                                      timeout_ms=TIMEOUT_S * 1000)
                kinds = sorted({type(v).__name__ for v in sd.values()})
                placements = sorted({str(tuple(v.placements)) for v in sd.values()
                                     if isinstance(v, DTensor)})
                specs = sender.add_state_dict(sd)                 # no layout argument
                sender.setup()
                result.update(state_dict_kinds=kinds, placements=placements,
                              described=len(sender.shards), state_dict_entries=len(specs),
                              scheme=sender.scheme)
                log(f"{who}: state dict of {len(sd)} entries ({kinds}, {placements}), "
                    f"{len(sender.shards)} shards described, scheme {sender.scheme}")
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            sender.push(k)
            dt = time.perf_counter() - t0
            # the trainer's own full weights, gathered here (collective on every rank)
            full = {n: (v.full_tensor() if isinstance(v, DTensor) else v).detach()
                    for n, v in sd.items()}
            row = {"version": k, "loss": float(loss), "push_seconds": dt}
            if prev is not None:
                row["changed_elements"] = int(sum(int((full[n] != prev[n]).sum()) for n in full))
            prev = {n: t.clone() for n, t in full.items()}
            if checker is not None:
                missing, unexpected = checker.load_state_dict(
                    {n: t.float() for n, t in full.items()}, strict=False)
                if missing or unexpected:
                    raise RuntimeError(f"float32 model: missing {missing}, unexpected "
                                       f"{unexpected}")
                ids = torch.tensor([prompt], device=dev)
                with torch.no_grad():
                    for _ in range(n_new):
                        logits = checker(input_ids=ids).logits[0, -1]
                        ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
                row["tokens"] = ids[0, len(prompt):].tolist()
            result["versions"].append(row)
            log(f"{who}: version {k}: loss {float(loss):.4f}, pushed in {dt * 1e3:.1f} ms"
                + (f", HF tokens {row['tokens']}" if "tokens" in row else ""))
    finally:
        if sender is not None:
            sender.close()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# the test
# ---------------------------------------------------------------------------------------------

def run_case(case, model_dir: Path, engine: Path, env, gpu_offset: int, tmp: Path):
    """One model and mesh: engine + 2 trainers; a result dict with pass."""
    _, mesh = case.split(":")
    ref = json.loads((model_dir / "reference.json").read_text())
    prompt, greedy = ref["input_ids"], ref["greedy_12"]
    addr = f"127.0.0.1:{free_port()}"
    dist_port = free_port()
    out = {"case": case, "model": model_dir.name, "mesh": mesh, "pass": False}
    procs, logs = [], {}
    try:
        def start(name, cmd):
            f = open(tmp / f"{case.replace(':', '_')}.{name}.log", "w+")
            logs[name] = f
            log(f"start {name}: {' '.join(cmd)}")
            procs.append((name, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                                 env=env, cwd=REPO)))
        start("engine", [str(engine), "--model", str(model_dir), "--sync", addr, "--versions",
                         str(VERSIONS), "--timeout", str(TIMEOUT_S), "--prompt-ids",
                         ",".join(str(i) for i in prompt), "--max-new", str(len(greedy)),
                         "--tp", str(TP), "--device", "cuda", "--gpu-offset", str(gpu_offset),
                         "--json"])
        for r in range(WORLD):
            start(f"trainer{r}", [sys.executable, str(Path(__file__).resolve()), "--trainer",
                                  str(r), "--coordinator", addr, "--model", str(model_dir),
                                  "--mesh", mesh, "--dist-port", str(dist_port)])
        deadline = time.monotonic() + TIMEOUT_S * 2
        rcs = {}
        for name, p in procs:
            try:
                rcs[name] = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs[name] = p.wait()
                log(f"{case} {name}: killed after the deadline")
        texts = {}
        for name, f in logs.items():
            f.seek(0)
            texts[name] = f.read()
        for name, _ in procs:
            print(f"---- {case} {name} (rc {rcs[name]}), last lines:")
            print("\n".join(texts[name].splitlines()[-15:]))
        out["rc"] = rcs
        res = None
        for line in texts["trainer0"].splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
        out["trainer"] = res
        bad = [n for n, rc in rcs.items() if rc != 0]
        if bad:
            out["error"] = "failed: " + ", ".join(f"{n} (rc {rcs[n]})" for n in bad)
            return out
        got = last_json(texts["engine"])
        if got is None or "generations" not in got or res is None:
            out["error"] = "no engine JSON with generations, or no trainer RESULT"
            return out
        gens = {g["version"]: g for g in got["generations"]}
        rows, ok = [], sorted(gens) == list(range(1, VERSIONS + 1))
        for v in res["versions"]:
            g = gens.get(v["version"])
            row = {"version": v["version"], "hf_tokens": v["tokens"],
                   "engine_tokens": g["tokens"] if g else None,
                   "changed_elements": v.get("changed_elements"),
                   "differs_from_reference_json": v["tokens"] != greedy}
            row["match"] = g is not None and g["tokens"] == v["tokens"]
            ok = ok and row["match"]
            rows.append(row)
        out["versions"] = rows
        out["pass"] = ok
        if not ok:
            out["error"] = "engine tokens differ from HF transformers' (table above)"
        return out
    finally:
        for name, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("WSYNC_GPU_BUILD", "build-gpu"))
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--cases", default="qwen3:1d,qwen3_moe:1d,qwen3_moe:hsdp")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--trainer", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mesh", choices=MESHES, help=argparse.SUPPRESS)
    ap.add_argument("--dist-port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trainer is not None:
        return trainer(a)

    out = {"test": NAME, "pass": False, "skipped": None, "cases": []}

    def finish(rc: int, why: str = None) -> int:
        if rc == 77:
            out["skipped"] = why
            log(f"skipped: {why}")
        elif why:
            out["error"] = why
            log(f"FAIL: {why}")
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
        return rc

    try:
        import torch
        import transformers
    except ImportError as e:
        return finish(77, f"no torch or transformers ({e})")
    if not torch.cuda.is_available():
        return finish(77, "torch sees no CUDA device")
    ngpu = torch.cuda.device_count()
    out["gpus"] = ngpu
    if ngpu < WORLD:
        return finish(77, f"{ngpu} GPU(s); the test needs {WORLD}")
    build = Path(a.build).resolve()
    engine = build / "bin" / "wsync-engine"
    if not os.access(engine, os.X_OK):
        return finish(77, f"no {engine}")
    libpath = find_library(build)
    if libpath is None:
        return finish(77, f"no libwsync under {build} (and no $WSYNC_LIBRARY)")
    testdata = find_testdata(build)
    if testdata is None:
        return finish(77, "no hf_qwen3_tiny and hf_qwen3_moe_tiny under $WSYNC_TESTDATA, "
                          f"../shared/testdata, shared/testdata or {build}/testdata")
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        m, _, mesh = c.partition(":")
        if m not in MODELS or mesh not in MESHES:
            return finish(1, f"case {c!r}: MODEL:MESH with MODEL in {list(MODELS)}, MESH in "
                             f"{list(MESHES)}")
    gpu_offset = WORLD if ngpu >= WORLD + TP else 0
    out["engine_gpus"] = [gpu_offset, gpu_offset + 1]
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {ngpu} GPUs "
        f"(trainer 0, 1; engine {gpu_offset}, {gpu_offset + 1}); libwsync {libpath}")
    env = dict(os.environ)
    env["WSYNC_LIBRARY"] = str(libpath)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    tmp = Path(tempfile.mkdtemp(prefix="wsync-fsdp2."))
    try:
        for c in cases:
            t0 = time.monotonic()
            r = run_case(c, testdata / MODELS[c.split(":")[0]], engine, env, gpu_offset, tmp)
            r["seconds"] = round(time.monotonic() - t0, 1)
            out["cases"].append(r)
            if r.get("error"):
                log(f"{c}: {r['error']}")
        print()
        print(f"{'case':<16} {'version':<8} {'result':<7} {'changed':>8}  tokens (engine | HF)")
        for r in out["cases"]:
            for v in r.get("versions", []):
                print(f"{r['case']:<16} {v['version']:<8} {'pass' if v['match'] else 'FAIL':<7} "
                      f"{str(v['changed_elements']):>8}  {v['engine_tokens']} | "
                      f"{v['hf_tokens']}")
            if not r.get("versions"):
                print(f"{r['case']:<16} -        FAIL    {r.get('error')}")
        ok = bool(out["cases"]) and all(r["pass"] for r in out["cases"])
        out["pass"] = ok
        print(f"{NAME}: {'PASS' if ok else 'FAIL'}")
        return finish(0 if ok else 1, None if ok else "a case failed (table above)")
    except Exception as e:   # noqa: BLE001 (report anything as a failure, with the JSON)
        import traceback
        traceback.print_exc()
        return finish(1, f"{type(e).__name__}: {e}")
    finally:
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
