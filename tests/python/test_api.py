"""The Python API in one process: model configs and layouts against the checkpoint and the
ceil rule written out here, DTensor placements, dtypes, what memory is accepted, a whole
sender-receiver round in two threads (FP8 scales, shadow-mode buffer swap, progress, stats),
errors as exceptions with the library's text, lifetimes, finding the library, and an offline
pip install."""
from __future__ import annotations

import array
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

import wsync
import wsync_testlib as tl
from wsync.tensors import dtensor_box, region_of, sub_region


def ceil_box(n: int, rank: int, world: int):
    c = -(-n // world)
    lo = min(rank * c, n)
    return lo, max(0, min(n, (rank + 1) * c) - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConfigAndLayouts(unittest.TestCase):
    def test_config_load_and_parse(self):
        raw = tl.CONFIG.read_text()
        a = wsync.ModelConfig.load(tl.CONFIG)
        self.assertEqual(wsync.ModelConfig.load(tl.MODEL_DIR), a)
        self.assertEqual(wsync.ModelConfig.parse(raw), a)
        self.assertEqual(wsync.ModelConfig.parse(raw.encode()), a)
        self.assertEqual(wsync.ModelConfig.of(__import__("json").loads(raw)), a)
        self.assertEqual((a.model_type, a.hidden_size, a.num_hidden_layers, a.num_attention_heads,
                          a.num_key_value_heads, a.head_dim, a.intermediate_size, a.vocab_size),
                         (wsync.ModelType.QWEN3, 128, 2, 4, 2, 32, 384, 384))
        self.assertTrue(a.qk_norm)
        self.assertFalse(a.tie_word_embeddings)
        self.assertEqual(a.rope_theta, 1e6)
        self.assertEqual(a.dtype, wsync.DType.BF16)
        a.check()

    def test_config_errors_carry_the_library_text(self):
        with self.assertRaises(wsync.ConfigError) as cm:
            wsync.ModelConfig.parse('{"model_type": "qwen3"}')
        self.assertIn("hidden_size", cm.exception.message)
        self.assertEqual(cm.exception.status_name, "WSYNC_ERR_CONFIG")
        self.assertTrue(str(cm.exception).startswith("WSYNC_ERR_CONFIG: invalid model "
                                                     "configuration"))
        with self.assertRaises(wsync.ConfigError) as cm:
            wsync.ModelConfig.parse('{"model_type": ')
        self.assertIn("line 1", cm.exception.message)
        with self.assertRaises(wsync.WsyncIOError) as cm:
            wsync.ModelConfig.load("/nonexistent/config.json")
        self.assertIn("/nonexistent/config.json", str(cm.exception))
        bad = wsync.ModelConfig.load(tl.CONFIG)
        bad.num_key_value_heads = 3
        with self.assertRaises(wsync.ConfigError) as cm:
            bad.check()
        self.assertIn("num_key_value_heads", cm.exception.message)

    def test_params_are_the_checkpoint(self):
        tensors = tl.read_safetensors(tl.CKPT)
        params = wsync.ModelConfig.load(tl.CONFIG).params()
        self.assertEqual({p.name: p.shape for p in params},
                         {n: shape for n, (dt, shape, raw) in tensors.items()})
        self.assertTrue(all(p.dtype == wsync.DType.BF16 for p in params))
        self.assertTrue(all(p.dtype == wsync.DType.F32 for p in
                            wsync.ModelConfig.load(tl.CONFIG).params("f32")))

    def test_fsdp_shards_follow_the_ceil_rule(self):
        cfg = wsync.ModelConfig.load(tl.CONFIG)
        for world in (1, 2, 3, 5):
            for rank in range(world):
                specs = cfg.fsdp_shards(rank, world)
                self.assertEqual(len(specs), 25)
                for sp in specs:
                    lo, n = ceil_box(sp.param.shape[0], rank, world)
                    self.assertEqual(sp.box.start, (lo,) + (0,) * (len(sp.param.shape) - 1))
                    self.assertEqual(sp.box.len, (n,) + sp.param.shape[1:])

    def test_shard_box_and_dtensor_placements_agree(self):
        for n in (1, 2, 5, 7, 10, 384):
            for world in (1, 2, 3, 4, 8):
                for rank in range(world):
                    for dim in (0, 1):
                        shape = (n, 3) if dim == 0 else (3, n)
                        p = wsync.Param("p", "bf16", shape)
                        box = wsync.shard_box(p, dim, rank, world)
                        lo, ln = ceil_box(n, rank, world)
                        self.assertEqual((box.start[dim], box.len[dim]), (lo, ln))
                        local_shape = list(shape)
                        local_shape[dim] = ln
                        local = tl.FakeTensor(bytearray(2 * 3 * ln), "torch.bfloat16",
                                              local_shape)
                        for d in (dim, dim - 2):   # Shard(1) and Shard(-1) are the same
                            dt = tl.FakeDTensor(local, shape, tl.Shard(d),
                                                tl.FakeMesh(world, rank))
                            self.assertEqual(dtensor_box(dt), (shape, box.start, box.len))
        local = tl.FakeTensor(bytearray(8), "torch.bfloat16", (2, 2))
        rep = tl.FakeDTensor(local, (2, 2), tl.Replicate(), tl.FakeMesh(4, 3))
        self.assertEqual(dtensor_box(rep), ((2, 2), (0, 0), (2, 2)))
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            dtensor_box(tl.FakeDTensor(local, (2, 2), tl.Partial(), tl.FakeMesh(2, 0)))
        self.assertIn("Partial", str(cm.exception))
        two_d = tl.FakeDTensor(local, (2, 2), tl.Shard(0), tl.FakeMesh(2, 0))
        two_d.placements = (tl.Shard(0), tl.Shard(1))
        two_d.device_mesh.shape = (2, 2)
        with self.assertRaises(wsync.InvalidArgumentError):
            dtensor_box(two_d)
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            wsync.shard_box(wsync.Param("p", "bf16", (4, 4)), 0, 5, 2)
        self.assertIn("rank 5 of 2", cm.exception.message)
        self.assertIsInstance(cm.exception, ValueError)

    def test_tp_targets(self):
        cfg = wsync.ModelConfig.load(tl.CONFIG)
        model = tl.Model()
        for r in range(2):
            ts = cfg.tp_targets(r, 2)
            self.assertEqual([t.name for t in ts], model.target_names())
            for t in ts:
                self.assertEqual(t.nbytes, len(model.reference(t.name, r, 2, 0)), t.name)
                self.assertFalse(t.quantized)
        fp8 = {t.name: t for t in cfg.tp_targets(0, 2, quant="fp8-block", block=32)}
        qkv = fp8["model.layers.0.self_attn.qkv_proj.weight"]
        self.assertEqual((qkv.dtype, qkv.quant.scheme, qkv.quant.block_rows), (
            wsync.DType.F8E4M3FN, wsync.QuantScheme.BLOCK, 32))
        self.assertEqual(qkv.scale_count, (128 // 32) * (128 // 32))
        self.assertFalse(fp8["model.norm.weight"].quantized)
        with self.assertRaises(wsync.ConfigError) as cm:
            cfg.tp_targets(0, 2, quant="fp8-block")
        self.assertIn("model.layers.0.self_attn.q_proj.weight", cm.exception.message)
        self.assertIn("128", cm.exception.message)
        with self.assertRaises(wsync.InvalidArgumentError):
            cfg.tp_targets(0, 2, quant="int4")

    def test_single_target_builders(self):
        w = wsync.Param("w", "bf16", (8, 6))
        t = wsync.column_parallel(w, 1, 2)
        self.assertEqual((t.name, t.shape), ("w", (4, 6)))
        self.assertEqual(t.pieces[0].src, wsync.Box((4, 0), (4, 6)))
        t = wsync.row_parallel(w, 1, 2)
        self.assertEqual((t.shape, t.pieces[0].src), ((8, 3), wsync.Box((0, 3), (8, 3))))
        t = wsync.replicated(w)
        self.assertEqual(t.pieces[0].src, wsync.Box.whole((8, 6)))
        t = wsync.merged_column("gu", [w, wsync.Param("u", "bf16", (4, 6))], 1, 2)
        self.assertEqual(t.shape, (6, 6))
        self.assertEqual([(p.param.name, p.src.start, p.dst_start) for p in t.pieces],
                         [("w", (4, 0), (0, 0)), ("u", (2, 0), (4, 0))])
        q, k = wsync.Param("q", "bf16", (8, 4)), wsync.Param("k", "bf16", (4, 4))
        v = wsync.Param("v", "bf16", (4, 4))
        t = wsync.qkv("qkv", q, k, v, 4, 2, 1, 2)
        self.assertEqual(t.shape, (8, 4))
        self.assertEqual([(p.param.name, p.src.start[0], p.src.len[0], p.dst_start[0])
                          for p in t.pieces], [("q", 4, 4, 0), ("k", 2, 2, 4), ("v", 2, 2, 6)])
        e = wsync.Param("e", "bf16", (100, 4))
        t = wsync.vocab_parallel(e, 1, 2, vocab_pad=64)
        self.assertEqual(t.shape, (64, 4))
        self.assertEqual(t.pieces[0].src, wsync.Box((64, 0), (36, 4)))
        with self.assertRaises(wsync.ConfigError):
            wsync.column_parallel(wsync.Param("odd", "bf16", (7, 2)), 0, 2)


class Memory(unittest.TestCase):
    def test_dtypes(self):
        D = wsync.DType
        for v, want in (("torch.bfloat16", D.BF16), ("bfloat16", D.BF16), ("bf16", D.BF16),
                        ("BF16", D.BF16), (D.F32, D.F32), (3, D.F32), ("float32", D.F32),
                        ("torch.float8_e4m3fn", D.F8E4M3FN), ("F8_E5M2", D.F8E5M2),
                        ("uint8", D.U8), ("torch.half", D.F16)):
            self.assertEqual(wsync.dtype_of(v), want, v)
        for bad in ("int4", 99, "torch.int64"):
            with self.assertRaises(wsync.InvalidArgumentError):
                wsync.dtype_of(bad)

    def test_regions(self):
        ba = bytearray(range(48))
        ht = wsync.HostTensor(ba, "bf16", (4, 6))
        self.assertEqual((ht.shape, ht.numel(), ht.element_size()), ((4, 6), 24, 2))
        r = region_of(ht)
        self.assertEqual((r.nbytes, r.shape, r.dtype), (48, (4, 6), wsync.DType.BF16))
        # rows 1..3 of the whole tensor are one range; columns are not
        sub = sub_region(r, (4, 6), (1, 0), (2, 6), "x")
        self.assertEqual((sub.address - r.address, sub.nbytes), (12, 24))
        with self.assertRaises(wsync.InvalidArgumentError):
            sub_region(r, (4, 6), (0, 0), (4, 3), "x")
        # read-only memory is fine to send from, not to land in
        ro = region_of(b"\x00" * 8, dtype="f32")
        self.assertEqual(ro.shape, (2,))
        with self.assertRaises(wsync.InvalidArgumentError):
            region_of(b"\x00" * 8, dtype="f32", writable=True)
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            region_of(bytearray(8))
        self.assertIn("dtype", str(cm.exception))
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            region_of(memoryview(bytearray(16))[::2], dtype="u8")
        self.assertIn("contiguous", str(cm.exception))
        with self.assertRaises(wsync.InvalidArgumentError):
            region_of(bytearray(10), dtype="f32")
        with self.assertRaises(wsync.InvalidArgumentError):
            region_of(tl.FakeTensor(bytearray(8), "torch.float32", (2,), contiguous=False))
        with self.assertRaises(wsync.InvalidArgumentError):
            region_of(tl.FakeTensor(bytearray(8), "torch.float32", (2,)), dtype="bf16")
        with self.assertRaises(wsync.InvalidArgumentError):
            region_of(object())
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            region_of(wsync.HostTensor(b"\x00" * 8, "f32"), writable=True)
        self.assertIn("read-only", str(cm.exception))
        a = array.array("f", [1.0, 2.0])
        self.assertEqual(region_of(a, dtype="f32").nbytes, 8)
        cuda = region_of(tl.FakeTensor(None, "torch.float32", (2,), tl.FakeDevice("cuda", 3),
                                       address=0x1000))
        self.assertEqual((cuda.mem, cuda.device, cuda.address), (wsync.Mem.CUDA, 3, 0x1000))
        # a held export pins a bytearray's memory
        r2 = region_of(ba, dtype="u8")
        with self.assertRaises(BufferError):
            ba.append(1)
        r2.release()
        del r, sub, ht
        ba.append(1)


def _f32_bits(x: float) -> bytes:
    return struct.pack("<f", x)


class Group(unittest.TestCase):
    def test_round_in_two_threads(self):
        """Sender and receiver in one process: rows of an f32 param, a bf16 param from a tensor
        look-alike, an FP8 (per-tensor) target with its scale; shadow-mode swap between
        versions; progress; stats; errors after close."""
        w = array.array("f", [float(i) - 20.0 for i in range(48)])          # [8, 6] f32
        b = bytearray(2 * 10)                                               # [10] bf16
        ctx = wsync.Context()
        s = wsync.Sender("127.0.0.1:0", rank=0, world=1, receivers=1, timeout_ms=tl.TIMEOUT_MS,
                         context=ctx)
        wspec = s.add_shard("w", wsync.HostTensor(w, "f32", (8, 6)))
        self.assertEqual(wspec.box, wsync.Box.whole((8, 6)))
        s.add_shard(wsync.Param("b", "bf16", (10,)),
                    tl.FakeTensor(b, "torch.bfloat16", (10,)))
        self.assertEqual(s.coordinator.split(":")[0], "127.0.0.1")
        go, errors = threading.Event(), []

        def trainer():
            try:
                s.setup()
                for v in (1, 2):
                    if v == 2:
                        go.wait(30)
                    for i in range(48):
                        w[i] = (float(i) - 20.0) * v
                    b[:] = struct.pack("<10H", *[0x3F80 + v] * 10)
                    s.push(v)
            except BaseException as e:      # reported by the main thread
                errors.append(e)

        progress = []
        rv = wsync.Receiver(s.coordinator, rank=0, receivers=1, timeout_ms=tl.TIMEOUT_MS,
                            context=ctx, progress=lambda *a: progress.append(a))
        wp = wsync.Param("w", "f32", (8, 6))
        rows = rv.add_target(wsync.Target("w.rows", "f32", (4, 6),
                                          [wsync.Piece(wp, wsync.Box((2, 0), (4, 6)), (0, 0))]))
        mine = bytearray(20)
        self.assertIs(rv.add_target(wsync.replicated(wsync.Param("b", "bf16", (10,))), mine),
                      mine)
        q = wsync.Target("w.fp8", "f8e4m3fn", (8, 6), [wsync.Piece(wp, wsync.Box.whole((8, 6)),
                                                                   (0, 0))],
                         wsync.Quant.of("fp8-tensor"))
        self.assertEqual(q.scale_count, 1)
        codes = rv.add_target(q)
        self.assertEqual(sorted(rv.buffers), ["b", "w.fp8", "w.fp8_scale", "w.rows"])
        t = threading.Thread(target=trainer)
        t.start()
        try:
            self.assertEqual(rv.wait(), 1)
            self.assertEqual(rows.tolist(), [[float(i) - 20.0 for i in range(r * 6, r * 6 + 6)]
                                             for r in range(2, 6)])
            self.assertEqual(bytes(mine), struct.pack("<10H", *[0x3F81] * 10))
            scale = rv.buffers["w.fp8_scale"]
            self.assertEqual(_f32_bits(scale[0]), _f32_bits(27.0 / 448.0))   # amax 27 / 448
            self.assertEqual(codes[7, 5], 0x7E)              # 27 / s = 448, E4M3FN's max
            self.assertEqual(codes[0, 0], 0xFA)              # -20 / s = -331.9 -> -320
            self.assertTrue(progress and progress[-1][0] == 1 and progress[-1][1] ==
                            progress[-1][2])
            self.assertIsNone(rv.poll(0))            # version 2 has not begun
            self.assertEqual((rv.version, rv.torn, rv.scheme), (1, False, "ipc"))
            # shadow mode: version 2 lands in a spare buffer; the old one keeps version 1
            spare = bytearray(4 * 24)
            rv.set_target_data("w.rows", spare)
            self.assertIs(rv.buffers["w.rows"], spare)
            with self.assertRaises(wsync.InvalidArgumentError):
                rv.set_target_data("w.rows", bytearray(8))
            with self.assertRaises(wsync.NotFoundError) as cm:
                rv.set_target_data("nope", bytearray(8))
            self.assertIn("nope", cm.exception.message)
            go.set()
            self.assertEqual(rv.wait(), 2)
            got = array.array("f")
            got.frombytes(spare)
            self.assertEqual(got.tolist(), [2.0 * (i - 20.0) for i in range(12, 36)])
            self.assertEqual(rows.tolist()[0][0], -8.0)        # version 1, untouched
        except BaseException:
            rv.close()            # the trainer's push then fails at once instead of timing out
            raise
        finally:
            go.set()
            t.join(60)
        self.assertEqual(errors, [])
        st = s.stats
        self.assertEqual(st.version, 2)
        self.assertGreater(st.bytes_delivered, 0)
        self.assertEqual(s.scheme, "ipc")
        self.assertIn("ipc", s.explain)
        # a buffer the receiver holds cannot be resized under it; once closed, it can
        with self.assertRaises(BufferError):
            mine.append(0)
        with self.assertRaises(wsync.StateError):
            ctx.close()                               # still used
        rv.close()
        rv.close()
        mine.append(0)
        with self.assertRaises(wsync.StateError):
            rv.wait()
        self.assertEqual(rows.tolist()[0][0], -8.0)    # owned buffers stay readable
        s.close()
        with self.assertRaises(wsync.StateError):
            s.push(3)
        ctx.close()

    def test_cuda_memory_is_passed_on_and_checked_by_the_library(self):
        # a torch-like CUDA tensor reaches the library as WSYNC_MEM_CUDA on device.index ...
        fake = tl.FakeTensor(None, "torch.bfloat16", (4,), tl.FakeDevice("cuda", 1),
                             address=0x10000)
        r = wsync.tensors.region_of(fake)
        self.assertEqual((r.mem, r.device, r.address, r.nbytes, r.dtype),
                         (wsync.Mem.CUDA, 1, 0x10000, 8, wsync.DType.BF16))
        r = wsync.tensors.region_of(tl.FakeTensor(None, "torch.float32", (2,),
                                                  tl.FakeDevice("cuda", None), address=0x10000))
        self.assertEqual((r.mem, r.device), (wsync.Mem.CUDA, 0))
        # ... which refuses it here (CI: no GPU, or a build without CUDA; an address that is
        # no device memory where there is one), with its text naming the param
        with wsync.Sender("127.0.0.1:0", rank=0, world=1, receivers=1,
                          timeout_ms=tl.TIMEOUT_MS) as s:
            with self.assertRaises((wsync.UnsupportedError, wsync.InvalidArgumentError)) as cm:
                s.add_shard("w", fake)
            e = cm.exception
            self.assertIn(e.status_name, ("WSYNC_ERR_UNSUPPORTED", "WSYNC_ERR_INVALID"))
            self.assertIn("'w'", e.message)
            self.assertIn("CUDA", e.message)
            self.assertEqual(s.shards, [])
            with wsync.Receiver(s.coordinator, rank=0, receivers=1,
                                timeout_ms=tl.TIMEOUT_MS) as rv:
                t = wsync.replicated(wsync.Param("w", "bf16", (4,)))
                with self.assertRaises((wsync.UnsupportedError,
                                        wsync.InvalidArgumentError)) as cm:
                    rv.add_target(t, fake)
                self.assertIn("'w'", cm.exception.message)
                self.assertIn("CUDA", cm.exception.message)
                self.assertEqual(rv.targets, {})

    def test_sender_argument_errors(self):
        with wsync.Sender("127.0.0.1:0", rank=0, world=2, receivers=1,
                          timeout_ms=tl.TIMEOUT_MS) as s:
            with self.assertRaises(wsync.InvalidArgumentError) as cm:
                s.add_state_dict({"extra.weight": wsync.HostTensor(bytearray(8), "bf16")},
                                 config=tl.CONFIG)
            self.assertIn("extra.weight", str(cm.exception))
            with self.assertRaises(wsync.InvalidArgumentError) as cm:
                s.add_shard("w", wsync.HostTensor(bytearray(10), "bf16"), ((0,), (3,)),
                            global_shape=(8,))
            self.assertIn("neither", str(cm.exception))
            with self.assertRaises(wsync.InvalidArgumentError):
                s.add_state_dict({}, layout="tp")
            # rank 1 of 2, FSDP rows of a whole [5, 2] f32 tensor: rows 3..4, read in place
            whole = array.array("f", range(10))
            (spec,) = s.add_state_dict({"w": wsync.HostTensor(whole, "f32", (5, 2))}, "fsdp",
                                       rank=1)
            self.assertEqual(spec.box, wsync.Box((3, 0), (2, 2)))

    def test_timeout_is_a_timeout_error(self):
        port = free_port()
        with self.assertRaises(wsync.WsyncTimeoutError) as cm:
            wsync.Receiver(f"127.0.0.1:{port}", rank=0, receivers=1, timeout_ms=300)
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertIn(str(port), cm.exception.message)
        self.assertEqual(cm.exception.status, wsync.Status.ERR_TIMEOUT)


class Packaging(unittest.TestCase):
    def run_py(self, code: str, env: dict, cwd: str = None):
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=120)

    def test_library_not_found_says_where_it_looked(self):
        env = tl.child_env()
        env["WSYNC_LIBRARY"] = "/nonexistent/libwsync.so"
        p = self.run_py("import wsync; print(wsync.DType.BF16.name); wsync.library_path()", env)
        self.assertEqual(p.stdout.strip(), "BF16")          # importing needs no library
        self.assertIn("LibraryNotFoundError", p.stderr)
        self.assertIn("WSYNC_LIBRARY=/nonexistent/libwsync.so", p.stderr)
        # without WSYNC_LIBRARY, from a copy outside any checkout, every place is listed
        with tempfile.TemporaryDirectory() as d:
            shutil.copytree(tl.REPO / "python" / "wsync", Path(d) / "wsync",
                            ignore=shutil.ignore_patterns("__pycache__", "libwsync.so*"))
            env.pop("WSYNC_LIBRARY")
            env["PYTHONPATH"] = d
            env["LD_LIBRARY_PATH"] = ""
            p = self.run_py("import wsync; wsync.library_path()", env, cwd=d)
            if p.returncode == 0:
                self.skipTest("a libwsync is installed on a standard path here")
            for where in ("$WSYNC_LIBRARY: not set", "next to the package: " + d,
                          "the build tree: none", "the dynamic loader's search",
                          "/usr/local/lib/libwsync.so"):
                self.assertIn(where, p.stderr)

    def test_pip_install_offline(self):
        if subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode != 0:
            self.skipTest("pip is not available")
        if subprocess.run([sys.executable, "-c", "import setuptools"],
                          capture_output=True).returncode != 0:
            self.skipTest("setuptools is not installed (offline builds use the installed one)")
        with tempfile.TemporaryDirectory() as d:
            src, target = Path(d) / "src", Path(d) / "site"
            shutil.copytree(tl.REPO / "python", src,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
            env = tl.child_env()
            p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                                "--no-index", "--no-deps", "--target", str(target), str(src)],
                               env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            env["PYTHONPATH"] = str(target)
            p = self.run_py("import wsync; print(wsync.__file__); print(wsync.library_path()); "
                            "print(wsync.__version__)", env, cwd=d)
            self.assertEqual(p.returncode, 0, p.stderr)
            lines = p.stdout.split()
            self.assertTrue(lines[0].startswith(str(target)), lines)
            self.assertEqual(lines[1], os.environ["WSYNC_LIBRARY"])
            self.assertEqual(lines[2], "0.1.0")


if __name__ == "__main__":
    unittest.main(verbosity=2)
