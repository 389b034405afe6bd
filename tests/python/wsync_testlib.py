"""Helpers of the Python tests (standard library only): paths from the environment ctest sets,
a safetensors reader, the test's rule for version v of a weight, the reference TP layout of HF
Qwen3-tiny written out from RESHARD_SPEC's formulas, fake torch objects, and a process group
that never leaves processes behind.

Version v of a bf16 weight w (tests/python/c_peer.h has the same rule in C):
    w_v = bf16(float32(w * (1 + v/8) + v/1024)), computed in float64, rounded to nearest even.
"""
from __future__ import annotations

import array
import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def env_path(name: str, default: Path) -> Path:
    v = os.environ.get(name)
    return Path(v) if v else default


TESTDATA = env_path("WSYNC_TESTDATA", REPO.parent / "shared" / "testdata")
BIN_DIR = env_path("WSYNC_BIN_DIR", REPO / "build" / "tests")
MODEL_DIR = TESTDATA / "hf_qwen3_tiny"
CKPT = MODEL_DIR / "model.safetensors"
CONFIG = MODEL_DIR / "config.json"
BAD_PARAM = "model.layers.2.mlp.gate_proj.weight"   # the model has layers 0 and 1
TIMEOUT_MS = 20000
GROUP_TIMEOUT_S = 120

assert sys.byteorder == "little", "the tests read bf16 bits as little-endian uint16"


# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header, the data area
# ---------------------------------------------------------------------------------------------

def read_safetensors(path: Path) -> dict:
    """name -> (dtype, shape, bytes) of every tensor."""
    data = Path(path).read_bytes()
    (hlen,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], tuple(t["shape"]), data[base + b:base + e])
    return out


def u16(raw: bytes) -> array.array:
    a = array.array("H")
    a.frombytes(raw)
    return a


def version_u16(words: array.array, v: int) -> array.array:
    """The version-v rule applied to bf16 bit patterns."""
    wide = array.array("I", (w << 16 for w in words))
    f = array.array("f")
    f.frombytes(wide.tobytes())
    a, b = 1.0 + v / 8.0, v / 1024.0
    y = array.array("f", (x * a + b for x in f))        # float64 math, rounded to float32
    bits = array.array("I")
    bits.frombytes(y.tobytes())
    return array.array("H", (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF for u in bits))


# ---------------------------------------------------------------------------------------------
# Reference TP targets (RESHARD_SPEC; the layout code under test is not used)
# ---------------------------------------------------------------------------------------------

class Model:
    def __init__(self):
        self.tensors = read_safetensors(CKPT)
        cfg = json.loads(CONFIG.read_text())
        self.layers = cfg["num_hidden_layers"]
        self.H = cfg["num_attention_heads"]
        self.K = cfg["num_key_value_heads"]
        q = self.tensors["model.layers.0.self_attn.q_proj.weight"][1]
        self.D = q[0] // self.H
        self.Hd = q[1]
        self.I = self.tensors["model.layers.0.mlp.gate_proj.weight"][1][0]
        self.V = self.tensors["model.embed_tokens.weight"][1][0]
        self._versioned = {}

    def versioned(self, v: int) -> dict:
        """name -> (shape, array('H')) of version v of every tensor."""
        if v not in self._versioned:
            self._versioned = {v: {n: (shape, version_u16(u16(raw), v))
                                   for n, (dt, shape, raw) in self.tensors.items()}}
        return self._versioned[v]

    def target_names(self) -> list:
        per_layer = ["input_layernorm.weight", "self_attn.qkv_proj.weight",
                     "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                     "self_attn.k_norm.weight", "post_attention_layernorm.weight",
                     "mlp.gate_up_proj.weight", "mlp.down_proj.weight"]
        names = ["model.embed_tokens.weight"]
        for i in range(self.layers):
            names += [f"model.layers.{i}.{s}" for s in per_layer]
        return names + ["model.norm.weight", "lm_head.weight"]

    def reference(self, name: str, r: int, T: int, v: int) -> bytes:
        """Bytes of target `name` on TP rank r of T for version v."""
        t = self.versioned(v)

        def rows(pname, r0, n):
            shape, a = t[pname]
            cols = shape[1] if len(shape) == 2 else 1
            return a[r0 * cols:(r0 + n) * cols].tobytes()

        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            vp = -(-self.V // 64) * 64
            vr = vp // T
            lo, hi = r * vr, min(self.V, (r + 1) * vr)
            real = rows(name, lo, max(0, hi - lo))
            return real + bytes(2 * self.Hd * vr - len(real))
        if name == "model.norm.weight" or name.endswith("norm.weight"):
            return t[name][1].tobytes()
        layer, sfx = name[len("model.layers."):].split(".", 1)
        p = f"model.layers.{layer}."
        if sfx == "self_attn.qkv_proj.weight":
            hr = self.H // T
            kn = self.K // T if self.K >= T else 1
            kr = r if self.K >= T else r // (T // self.K)
            return (rows(p + "self_attn.q_proj.weight", r * hr * self.D, hr * self.D) +
                    rows(p + "self_attn.k_proj.weight", kr * kn * self.D, kn * self.D) +
                    rows(p + "self_attn.v_proj.weight", kr * kn * self.D, kn * self.D))
        if sfx == "mlp.gate_up_proj.weight":
            ir = self.I // T
            return (rows(p + "mlp.gate_proj.weight", r * ir, ir) +
                    rows(p + "mlp.up_proj.weight", r * ir, ir))
        if sfx in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            shape, a = t[name]
            inr = shape[1] // T
            out = array.array("H")
            for i in range(shape[0]):
                out.extend(a[i * shape[1] + r * inr:i * shape[1] + (r + 1) * inr])
            return out.tobytes()
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# Fake torch objects: the attributes wsync reads, nothing more (torch is not installed here)
# ---------------------------------------------------------------------------------------------

def address_of(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else 0


class FakeDevice:
    def __init__(self, type_: str = "cpu", index=None):
        self.type, self.index = type_, index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


class FakeTensor:
    """A torch.Tensor look-alike over a bytearray (or a bare address for fake CUDA memory)."""

    def __init__(self, buf, dtype: str, shape, device: FakeDevice = None, contiguous=True,
                 address: int = None):
        self.buf = buf
        self.dtype = dtype                    # str(torch.bfloat16) == "torch.bfloat16"
        self.shape = tuple(shape)
        self.device = device or FakeDevice()
        self._contiguous = contiguous
        self._address = address

    def data_ptr(self) -> int:
        return self._address if self._address is not None else address_of(self.buf)

    def is_contiguous(self) -> bool:
        return self._contiguous

    def element_size(self) -> int:
        return {"torch.bfloat16": 2, "torch.float32": 4, "torch.uint8": 1,
                "torch.float8_e4m3fn": 1, "torch.float16": 2}[self.dtype]

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class Shard:
    def __init__(self, dim):
        self.dim = dim

    def is_shard(self):
        return True

    def is_replicate(self):
        return False

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate:
    def is_shard(self):
        return False

    def is_replicate(self):
        return True


class Partial:
    def is_shard(self):
        return False

    def is_replicate(self):
        return False


class FakeMesh:
    def __init__(self, size: int, coordinate: int):
        self.shape = (size,)
        self._coord = coordinate

    def size(self):
        return self.shape[0]

    def get_coordinate(self):
        return [self._coord]


class FakeDTensor:
    """A DTensor look-alike: global shape, placements over a 1-D mesh, a local tensor."""

    def __init__(self, local, global_shape, placement, mesh: FakeMesh):
        self._local = local
        self.shape = tuple(global_shape)
        self.placements = (placement,)
        self.device_mesh = mesh
        self.dtype = local.dtype

    def to_local(self):
        return self._local


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class Group:
    """Processes of one test group; every one is killed (its own process group) on exit, so
    nothing is left behind whatever fails. Output goes to files, shown on failure."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="wsync-pytest-")
        self.procs = []   # (name, Popen, out path, err path)

    def start(self, name: str, argv: list) -> subprocess.Popen:
        out = Path(self.dir.name) / f"{name}.out"
        err = Path(self.dir.name) / f"{name}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            p = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                                 env=child_env(), start_new_session=True)
        self.procs.append((name, p, out, err))
        return p

    def coordinator(self, name: str, timeout: float = 30.0) -> str:
        """The "coordinator HOST:PORT" line a rank-0 sender prints."""
        for n, p, out, err in self.procs:
            if n == name:
                break
        else:
            raise KeyError(name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in out.read_text(errors="replace").splitlines():
                if line.startswith("coordinator "):
                    return line.split()[1]
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode} before listening:\n"
                                     + self.output(name))
            time.sleep(0.02)
        raise AssertionError(f"{name} did not print its coordinator in {timeout} s")

    def output(self, name: str) -> str:
        for n, p, out, err in self.procs:
            if n == name:
                return (out.read_text(errors="replace") + err.read_text(errors="replace"))
        return ""

    def wait(self, timeout: float = GROUP_TIMEOUT_S) -> dict:
        """name -> exit code (None: killed at the deadline)."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, p, _, _ in self.procs:
            try:
                codes[name] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        self.kill()
        return codes

    def report(self, codes: dict) -> str:
        return "\n".join(f"--- {n} (exit {codes.get(n)}):\n{self.output(n)}"
                         for n, _, _, _ in self.procs)

    def kill(self) -> None:
        for _, p, _, _ in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.dir.cleanup()


def python_peer(*args) -> list:
    return [sys.executable, str(HERE / "py_peer.py"), *[str(a) for a in args]]


def c_program(name: str, *args) -> list:
    exe = BIN_DIR / name
    if not exe.is_file():
        raise AssertionError(f"{exe} not found: build the tests (WSYNC_BIN_DIR={BIN_DIR})")
    return [str(exe), *[str(a) for a in args]]
