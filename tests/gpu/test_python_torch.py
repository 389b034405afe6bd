#!/usr/bin/env python3
"""Issue 8, GPU half: a PyTorch trainer pushes three versions into wsync-engine through the
Python bindings, and the engine's greedy output matches.

    python3 tests/gpu/test_python_torch.py [--build DIR] [--json FILE] [--scheme S]
                                           [--mode local|dtensor]

* The engine: `wsync-engine --model hf_qwen3_tiny --device cuda --tp 2 --gpu-offset 2
  --sync 127.0.0.1:PORT --versions 3 --json` (TP ranks on GPUs 2 and 3, each a wsync receiver
  landing straight into its CUDA weights).
* The trainer: 2 processes (this file, run with --trainer R) on GPUs 0 and 1, each holding the
  FSDP dim-0 shard of every param (rows [R*c, min(n, (R+1)*c)), c = ceil(n / 2)) as a torch
  bf16 CUDA tensor, described with one `Sender.add_state_dict(sd, layout="fsdp", rank=R,
  world=2, config=...)` call (--mode dtensor: DTensors over a 1-D mesh, Shard(0), boxes from
  the placement). For version k (1, 2, 3) it rewrites its shards in place on the GPU with
      w_k = bf16(f32(f64(w) * (1 + (k-1)/8) + (k-1)/1024))        (version 1 = the checkpoint)
  and pushes k.
* The expectation: for each k, `wsync-engine --tp 2 --device cuda --gpu-offset 2` (no --sync)
  on a model.safetensors written here with the same rule in the standard library (the same
  roundings: f64 multiply, f64 add, f64 -> f32 -> bf16 to nearest even); version 1 must also
  give reference.json's greedy tokens. Passes when the engine reports versions 1, 2, 3 and its
  tokens for each equal the expected ones (logits_sha equality is reported, not required).

Standard library + torch. The package is imported from the source tree (python/), libwsync from
$WSYNC_LIBRARY, else BUILD/lib/libwsync.so (tests/gpu/pack.sh's carry), else BUILD/libwsync.so.
The model: $WSYNC_TESTDATA/hf_qwen3_tiny, else ../shared/testdata, shared/testdata,
BUILD/testdata. Exit status 0 pass, 1 fail, 77 skipped (no torch with CUDA, fewer than 4 GPUs,
no CUDA engine or library).
"""
from __future__ import annotations

import argparse
import array
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NAME = "test_python_torch"
WORLD = 2            # trainer ranks, GPUs 0 and 1
TP = 2               # engine ranks, GPUs 2 and 3
GPU_OFFSET = 2
VERSIONS = 3
ENGINE_TIMEOUT_S = 60

assert sys.byteorder == "little", "bf16 bits are read as little-endian uint16"


def log(msg: str) -> None:
    print(f"[{NAME} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# safetensors (standard library) and the version rule
# ---------------------------------------------------------------------------------------------

def read_safetensors(path: Path):
    """(header dict without __metadata__, metadata, data area bytes)."""
    data = Path(path).read_bytes()
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + hlen])
    meta = header.pop("__metadata__", None)
    return header, meta, data[8 + hlen:]


def write_safetensors(path: Path, tensors: dict, meta) -> None:
    """tensors: name -> (dtype string, shape, bytes), written in the given order."""
    header = {}
    if meta is not None:
        header["__metadata__"] = meta
    off = 0
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, (_, _, raw) in tensors.items():
            f.write(raw)


def rule(k: int):
    """(a, b) of version k: w * a + b."""
    return 1.0 + (k - 1) / 8.0, (k - 1) / 1024.0


def version_bf16(raw: bytes, k: int) -> bytes:
    """The version-k rule on bf16 bytes, standard library: f64 math, f64 -> f32 (array 'f'),
    f32 -> bf16 to nearest even."""
    if k == 1:
        return raw
    a, b = rule(k)
    words = array.array("H")
    words.frombytes(raw)
    wide = array.array("I", (w << 16 for w in words))
    f = array.array("f")
    f.frombytes(wide.tobytes())
    y = array.array("f", (x * a + b for x in f))
    bits = array.array("I")
    bits.frombytes(y.tobytes())
    return array.array("H", (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
                             for u in bits)).tobytes()


# ---------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------

def find_model(build: Path):
    cands = []
    if os.environ.get("WSYNC_TESTDATA"):
        cands.append(Path(os.environ["WSYNC_TESTDATA"]))
    cands += [Path("../shared/testdata"), Path("shared/testdata"), REPO.parent / "shared" /
              "testdata", build / "testdata"]
    for c in cands:
        d = c / "hf_qwen3_tiny"
        if (d / "model.safetensors").is_file() and (d / "config.json").is_file():
            return d.resolve()
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


# ---------------------------------------------------------------------------------------------
# the trainer rank (a subprocess of this file)
# ---------------------------------------------------------------------------------------------

def trainer(a) -> int:
    import torch                      # first, as a user's trainer does
    sys.path.insert(0, str(REPO / "python"))
    import wsync

    rank = a.trainer
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    who = f"trainer {rank}"
    header, _, data = read_safetensors(Path(a.model) / "model.safetensors")
    config = str(Path(a.model) / "config.json")
    mesh = None
    if a.mode == "dtensor":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.dist_port}",
                                rank=rank, world_size=WORLD, device_id=dev)
        mesh = init_device_mesh("cuda", (WORLD,))
    sd, base = {}, {}
    for name, t in header.items():
        assert t["dtype"] == "BF16", f"{name}: {t['dtype']}"
        shape = tuple(t["shape"])
        b, e = t["data_offsets"]
        full = torch.frombuffer(bytearray(data[b:e]), dtype=torch.bfloat16).reshape(shape)
        n = shape[0]
        c = -(-n // WORLD)
        lo, hi = min(rank * c, n), min(n, (rank + 1) * c)
        local = full[lo:hi].contiguous().to(dev)          # only this rank's rows on the GPU
        base[name] = local.clone()
        if mesh is not None:
            sd[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                          shape=torch.Size(shape),
                                          stride=full.stride())
        else:
            sd[name] = local
    local_of = {n: (v.to_local() if mesh is not None else v) for n, v in sd.items()}
    result = {"rank": rank, "device": str(dev), "mode": a.mode, "pushes": []}
    with wsync.Sender(a.coordinator, rank=rank, world=WORLD, receivers=TP,
                      scheme=None if a.scheme == "auto" else a.scheme,
                      timeout_ms=ENGINE_TIMEOUT_S * 1000) as s:
        if mesh is not None:
            specs = s.add_state_dict(sd, layout="fsdp")
        else:
            specs = s.add_state_dict(sd, layout="fsdp", rank=rank, world=WORLD, config=config)
        assert len(specs) == len(header), f"{who}: {len(specs)} shards described"
        # what the package handed the library: CUDA memory of this device, in place
        for r in s._regions:
            assert int(r.mem) == int(wsync.Mem.CUDA) and r.device == rank, \
                f"{who}: a region is mem {r.mem} device {r.device}"
        t0 = time.perf_counter()
        s.setup()
        result["setup_seconds"] = time.perf_counter() - t0
        result["scheme"] = s.scheme
        log(f"{who}: {len(specs)} shards on {dev} ({a.mode}), scheme {s.scheme} "
            f"(setup {result['setup_seconds']:.2f} s)")
        if rank == 0 and s.explain:
            print(s.explain, flush=True)
        for k in range(1, VERSIONS + 1):
            ka, kb = rule(k)
            with torch.no_grad():
                for name, t in local_of.items():
                    x = base[name].double()
                    x.mul_(ka)
                    x.add_(kb)
                    t.copy_(x.float().to(torch.bfloat16))      # in place: the sender reads it
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            s.push(k)
            dt = time.perf_counter() - t0
            st = s.stats
            result["pushes"].append({"version": k, "seconds": dt,
                                     "bytes_packed": st.bytes_packed,
                                     "bytes_delivered": st.bytes_delivered})
            log(f"{who}: pushed version {k} in {dt * 1e3:.1f} ms ({st.bytes_packed} bytes "
                f"packed, {st.bytes_delivered} delivered)")
    if mesh is not None:
        import torch.distributed as dist
        dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# the test
# ---------------------------------------------------------------------------------------------

def last_json(text: str):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get("WSYNC_GPU_BUILD", "build-gpu"))
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--scheme", default="auto", help="auto (default), ipc or nccl")
    ap.add_argument("--mode", default="local", choices=("local", "dtensor"),
                    help="trainer shards: plain local tensors + config (default) or DTensors")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--trainer", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--dist-port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trainer is not None:
        return trainer(a)

    out = {"test": NAME, "pass": False, "skipped": None, "scheme_asked": a.scheme,
           "mode": a.mode}

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
    except ImportError as e:
        return finish(77, f"no torch ({e})")
    if not torch.cuda.is_available():
        return finish(77, "torch sees no CUDA device")
    ngpu = torch.cuda.device_count()
    out["gpus"] = ngpu
    if ngpu < WORLD + TP:
        return finish(77, f"{ngpu} GPU(s); the test needs {WORLD + TP}")
    build = Path(a.build).resolve()
    engine = build / "bin" / "wsync-engine"
    if not os.access(engine, os.X_OK):
        return finish(77, f"no {engine}")
    libpath = find_library(build)
    if libpath is None:
        return finish(77, f"no libwsync under {build}/lib or {build} (and no $WSYNC_LIBRARY)")
    model = find_model(build)
    if model is None:
        return finish(77, "no hf_qwen3_tiny under $WSYNC_TESTDATA, ../shared/testdata, "
                          f"shared/testdata or {build}/testdata")
    ref = json.loads((model / "reference.json").read_text())
    prompt, greedy = ref["input_ids"], ref["greedy_12"]
    log(f"torch {torch.__version__}, {ngpu} GPUs; engine {engine}; libwsync {libpath}; "
        f"model {model}")
    env = dict(os.environ)
    env["WSYNC_LIBRARY"] = str(libpath)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    ids = ",".join(str(i) for i in prompt)
    common = ["--prompt-ids", ids, "--max-new", str(len(greedy)), "--tp", str(TP),
              "--device", "cuda", "--gpu-offset", str(GPU_OFFSET), "--json"]
    tmp = Path(tempfile.mkdtemp(prefix="wsync-pytorch."))
    procs = []
    try:
        # the expected weights of each version, written with the standard library
        header, meta, data = read_safetensors(model / "model.safetensors")
        t0 = time.perf_counter()
        dirs = {}
        for k in range(1, VERSIONS + 1):
            d = tmp / f"v{k}"
            d.mkdir()
            shutil.copy(model / "config.json", d / "config.json")
            tensors = {}
            for name, t in header.items():
                b, e = t["data_offsets"]
                tensors[name] = (t["dtype"], t["shape"], version_bf16(data[b:e], k))
            write_safetensors(d / "model.safetensors", tensors, meta)
            dirs[k] = d
        log(f"wrote versions 1..{VERSIONS} of the checkpoint in {time.perf_counter() - t0:.1f} s")

        # the group: engine receivers on GPUs 2, 3; trainer ranks on GPUs 0, 1
        port = free_port()
        addr = f"127.0.0.1:{port}"
        dist_port = free_port()
        logs = {}

        def start(name, cmd):
            f = open(tmp / f"{name}.log", "w+")
            logs[name] = f
            log(f"start {name}: {' '.join(cmd)}")
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            procs.append((name, p))
            return p

        start("engine", [str(engine), "--model", str(model), "--sync", addr, "--versions",
                         str(VERSIONS), "--timeout", str(ENGINE_TIMEOUT_S)] + common)
        for r in range(WORLD):
            start(f"trainer{r}", [sys.executable, str(Path(__file__).resolve()),
                                  "--trainer", str(r), "--coordinator", addr,
                                  "--model", str(model), "--scheme", a.scheme, "--mode",
                                  a.mode, "--dist-port", str(dist_port)])
        # the expected outputs, at the same time (GPUs 2, 3 as well)
        for k in range(1, VERSIONS + 1):
            start(f"expected_v{k}", [str(engine), "--model", str(dirs[k])] + common)

        deadline = time.monotonic() + ENGINE_TIMEOUT_S * 2
        rcs = {}
        for name, p in procs:
            try:
                rcs[name] = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs[name] = p.wait()
                log(f"{name}: killed after the deadline")
        texts = {}
        for name, f in logs.items():
            f.seek(0)
            texts[name] = f.read()
            f.close()
        for name, _ in procs:
            print(f"---- {name} (rc {rcs[name]}), last lines:")
            print("\n".join(texts[name].splitlines()[-15:]))
        out["rc"] = rcs

        # trainer results
        out["trainers"] = []
        for r in range(WORLD):
            res = None
            for line in texts[f"trainer{r}"].splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[7:])
            out["trainers"].append(res)
        if out["trainers"][0]:
            out["scheme"] = out["trainers"][0].get("scheme")

        # expected tokens
        expected = {}
        for k in range(1, VERSIONS + 1):
            j = last_json(texts[f"expected_v{k}"])
            if rcs[f"expected_v{k}"] != 0 or j is None:
                return finish(1, f"the engine run on the version-{k} file failed (rc "
                                 f"{rcs[f'expected_v{k}']}); see its log above")
            expected[k] = j
        got = last_json(texts["engine"])
        bad = [n for n, rc in rcs.items() if rc != 0]
        if bad:
            return finish(1, "failed: " + ", ".join(f"{n} (rc {rcs[n]})" for n in bad))
        if got is None or "generations" not in got:
            return finish(1, "the synced engine printed no JSON with generations")
        gens = {g["version"]: g for g in got["generations"]}
        rows, ok = [], True
        if expected[1]["tokens"] != greedy:
            ok = False
            log(f"version 1 from the file gave {expected[1]['tokens']}, reference.json "
                f"{greedy}")
        for k in range(1, VERSIONS + 1):
            g = gens.get(k)
            row = {"version": k, "expected": expected[k]["tokens"],
                   "tokens": g["tokens"] if g else None,
                   "logits_sha": g["logits_sha"] if g else None,
                   "expected_logits_sha": expected[k]["logits_sha"]}
            row["match"] = g is not None and g["tokens"] == expected[k]["tokens"]
            row["sha_match"] = g is not None and g["logits_sha"] == expected[k]["logits_sha"]
            ok = ok and row["match"]
            rows.append(row)
        if sorted(gens) != list(range(1, VERSIONS + 1)):
            ok = False
            log(f"the engine reported versions {sorted(gens)}")
        out["versions"] = rows
        out["reference_json_match"] = expected[1]["tokens"] == greedy
        out["distinct_outputs"] = len({tuple(r["expected"]) for r in rows})
        print()
        print(f"{'version':<8} {'result':<7} {'sha':<6} tokens (synced engine | from file)")
        for r in rows:
            print(f"{r['version']:<8} {'pass' if r['match'] else 'FAIL':<7} "
                  f"{'same' if r['sha_match'] else 'diff':<6} {r['tokens']} | {r['expected']}")
        for r, t in enumerate(out["trainers"]):
            if t:
                print(f"trainer {r}: scheme {t.get('scheme')}, setup {t['setup_seconds']:.2f} s,"
                      " push ms " + ", ".join(f"{p['seconds'] * 1e3:.1f}" for p in t["pushes"]))
        print(f"version 1 vs reference.json greedy: "
              f"{'match' if out['reference_json_match'] else 'DIFFER'}; "
              f"{out['distinct_outputs']} distinct outputs over {VERSIONS} versions")
        out["pass"] = ok
        print(f"{NAME}: {'PASS' if ok else 'FAIL'}")
        return finish(0 if ok else 1, None if ok else "tokens differ (table above)")
    except Exception as e:   # noqa: BLE001 (report anything as a failure, with the JSON)
        import traceback
        traceback.print_exc()
        return finish(1, f"{type(e).__name__}: {e}")
    finally:
        for name, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
