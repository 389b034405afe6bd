"""A MoE trainer's state dict names HF transformers 5.x's fused expert tensors
(mlp.experts.gate_up_proj [E, 2I, Hd], gate rows first; mlp.experts.down_proj [E, Hd, I]); the
Sender takes them whole, as FSDP rows or as DTensor Shard(1) shards, and the receiver's
per-expert targets get exactly the slices of the fused tensors taken here by index arithmetic.
Also the fused param list and expert-parallel boxes of the tiny Qwen3-MoE config."""
from __future__ import annotations

import array
import threading
import unittest

import wsync
import wsync_testlib as tl
from wsync.layout import ep_shards, fused_params

E, I, HD = 4, 3, 5
L = "model.layers.0.mlp.experts."
GU, DN = L + "gate_up_proj", L + "down_proj"
MOE_CONFIG = tl.TESTDATA / "hf_qwen3_moe_tiny" / "config.json"


def gate_up_value(v, e, j, k):
    return float(v * 100000 + e * 1000 + j * 10 + k)


def down_value(v, e, j, k):
    return -float(v * 100000 + e * 1000 + j * 10 + k)


def fused(v):
    """The whole fused tensors of version v, row-major flat lists."""
    gu = [gate_up_value(v, e, j, k) for e in range(E) for j in range(2 * I) for k in range(HD)]
    dn = [down_value(v, e, j, k) for e in range(E) for j in range(HD) for k in range(I)]
    return gu, dn


def expected(v):
    """Per-expert tensors of version v, from the fused layout's definition."""
    out = {}
    for e in range(E):
        out[f"{L}{e}.gate_proj.weight"] = [gate_up_value(v, e, i, k) for i in range(I)
                                           for k in range(HD)]
        out[f"{L}{e}.up_proj.weight"] = [gate_up_value(v, e, I + i, k) for i in range(I)
                                         for k in range(HD)]
        out[f"{L}{e}.down_proj.weight"] = [down_value(v, e, j, k) for j in range(HD)
                                           for k in range(I)]
    return out


def shard1(flat, shape, rank, world):
    """Rank's local shard of a row-major [a, b, c] tensor split along dim 1 (ceil rule)."""
    a, b, c = shape
    ch = -(-b // world)
    lo, hi = min(rank * ch, b), min(b, (rank + 1) * ch)
    return [flat[(x * b + j) * c + k] for x in range(a) for j in range(lo, hi) for k in range(c)], \
        hi - lo


class FusedExperts(unittest.TestCase):
    def run_group(self, describe):
        """Two senders (threads) describe the fused tensors with describe(sender, rank, bufs);
        one receiver holds every per-expert param whole; two versions are checked."""
        bufs = [{"gu": array.array("f"), "dn": array.array("f")} for _ in range(2)]
        s0 = wsync.Sender("127.0.0.1:0", rank=0, world=2, receivers=1, timeout_ms=tl.TIMEOUT_MS)
        s1 = wsync.Sender(s0.coordinator, rank=1, world=2, receivers=1, timeout_ms=tl.TIMEOUT_MS)
        senders = [s0, s1]
        errors = []
        for r, s in enumerate(senders):
            describe(s, r, bufs[r], 1)
        rv = wsync.Receiver(s0.coordinator, rank=0, receivers=1, timeout_ms=tl.TIMEOUT_MS)
        targets = {}
        for name, vals in expected(1).items():
            shape = (HD, I) if name.endswith("down_proj.weight") else (I, HD)
            targets[name] = bytearray(4 * len(vals))
            rv.add_target(wsync.replicated(wsync.Param(name, "f32", shape)), targets[name])

        def push(r, s):
            try:
                for v in (1, 2):
                    if v == 2:
                        describe(None, r, bufs[r], 2)   # the optimizer step, in place
                    s.push(v)
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=push, args=(r, s)) for r, s in enumerate(senders)]
        for t in threads:
            t.start()
        try:
            for v in (1, 2):
                self.assertEqual(rv.wait(), v)
                for name, want in expected(v).items():
                    got = array.array("f")
                    got.frombytes(bytes(targets[name]))
                    self.assertEqual(got.tolist(), want, f"version {v}: {name}")
        finally:
            if errors or any(t.is_alive() for t in threads):
                rv.close()
            for t in threads:
                t.join(60)
        self.assertEqual(errors, [])
        specs = [s.shards for s in senders]
        rv.close()
        s1.close()
        s0.close()
        return specs

    def test_fsdp_rows_of_whole_fused_tensors(self):
        def describe(s, r, b, v):
            gu, dn = fused(v)
            if s is None:
                b["gu"][:] = array.array("f", gu)
                b["dn"][:] = array.array("f", dn)
                return
            b["gu"].extend(gu)
            b["dn"].extend(dn)
            got = s.add_state_dict({GU: wsync.HostTensor(b["gu"], "f32", (E, 2 * I, HD)),
                                    DN: wsync.HostTensor(b["dn"], "f32", (E, HD, I))}, "fsdp")
            # the fused boxes (experts [2r, 2r + 2)) are what add_state_dict returns
            self.assertEqual([sp.box for sp in got],
                             [wsync.Box((2 * r, 0, 0), (2, 2 * I, HD)),
                              wsync.Box((2 * r, 0, 0), (2, HD, I))])
        specs = self.run_group(describe)
        for r in range(2):
            self.assertEqual([sp.param.name for sp in specs[r]],
                             [f"{L}{e}.{p}" for e in (2 * r, 2 * r + 1)
                              for p in ("gate_proj.weight", "up_proj.weight")] +
                             [f"{L}{e}.down_proj.weight" for e in (2 * r, 2 * r + 1)])
            self.assertTrue(all(sp.box.start == (0, 0) for sp in specs[r]))

    def test_dtensor_shard1_of_fused_tensors(self):
        # Shard(1) over 2 ranks: gate_up rows [0, 3) = the gate halves on rank 0, [3, 6) the up
        # halves on rank 1; down_proj's Hd rows [0, 3) and [3, 5)
        def describe(s, r, b, v):
            gu, dn = fused(v)
            gl, _ = shard1(gu, (E, 2 * I, HD), r, 2)
            dl, _ = shard1(dn, (E, HD, I), r, 2)
            if s is None:
                b["gu"][:] = array.array("f", gl)
                b["dn"][:] = array.array("f", dl)
                return
            b["gu"].extend(gl)
            b["dn"].extend(dl)
            mesh = tl.FakeMesh(2, r)
            _, n_gu = shard1(gu, (E, 2 * I, HD), r, 2)
            _, n_dn = shard1(dn, (E, HD, I), r, 2)
            s.add_shard(GU, tl.FakeDTensor(wsync.HostTensor(b["gu"], "f32", (E, n_gu, HD)),
                                           (E, 2 * I, HD), tl.Shard(1), mesh))
            s.add_shard(DN, tl.FakeDTensor(wsync.HostTensor(b["dn"], "f32", (E, n_dn, I)),
                                           (E, HD, I), tl.Shard(1), mesh))
        specs = self.run_group(describe)
        self.assertEqual([sp.param.name for sp in specs[0]][:2],
                         [f"{L}0.gate_proj.weight", f"{L}1.gate_proj.weight"])
        self.assertEqual([sp.param.name for sp in specs[1]][:2],
                         [f"{L}0.up_proj.weight", f"{L}1.up_proj.weight"])
        self.assertEqual(specs[1][-1].box, wsync.Box((3, 0), (2, I)))

    def test_odd_gate_up_is_refused(self):
        with wsync.Sender("127.0.0.1:0", rank=0, world=1, receivers=1,
                          timeout_ms=tl.TIMEOUT_MS) as s:
            with self.assertRaises(wsync.InvalidArgumentError) as cm:
                s.add_shard(GU, wsync.HostTensor(array.array("f", [0.0] * 15), "f32",
                                                 (1, 3, 5)))
            self.assertIn(GU, cm.exception.message)
            self.assertEqual(s.shards, [])


class Layouts(unittest.TestCase):
    def test_fused_params_and_ep_shards(self):
        cfg = wsync.ModelConfig.load(MOE_CONFIG)
        names = {p.name: p.shape for p in fused_params(cfg)}
        per_expert = [p for p in cfg.params() if ".mlp.experts." in p.name]
        self.assertEqual(len(per_expert), cfg.num_hidden_layers * cfg.num_experts * 3)
        for layer in range(cfg.num_hidden_layers):
            pre = f"model.layers.{layer}.mlp.experts."
            self.assertEqual(names[pre + "gate_up_proj"],
                             (cfg.num_experts, 2 * cfg.moe_intermediate_size, cfg.hidden_size))
            self.assertEqual(names[pre + "down_proj"],
                             (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size))
        self.assertFalse(any(p.name in names for p in per_expert))
        shards = ep_shards(cfg, 1, 2)
        for sp in shards:
            if ".mlp.experts." in sp.param.name:
                e = int(sp.param.name.split(".mlp.experts.")[1].split(".")[0])
                self.assertEqual(sp.box.empty, e < cfg.num_experts // 2, sp.param.name)
        with self.assertRaises(wsync.ConfigError) as cm:
            ep_shards(cfg, 0, 3)
        self.assertIn("3 expert-parallel ranks", cm.exception.message)


if __name__ == "__main__":
    unittest.main()
