"""Megatron-Core senders (layout="megatron"): two TP-2 trainer ranks whose state dicts hold
Megatron's tensors (built here from the HF params by Megatron's rules: linear_qkv interleaved per
query group, linear_fc1 = [gate chunk; up chunk], dim-1 chunks of linear_proj / linear_fc2, a
vocabulary padded to 512 rows and chunked) push the tiny Qwen3 into two TP-2 vLLM receivers;
every target byte must equal the HF params' slice the target's pieces name."""
from __future__ import annotations

import array
import threading
import unittest

import wsync
import wsync_testlib as tl

CONFIG = tl.TESTDATA / "hf_qwen3_tiny" / "config.json"
MOE_CONFIG = tl.TESTDATA / "hf_qwen3_moe_tiny" / "config.json"
T = 2


def hf_params(cfg):
    """name -> (shape, flat u16 list of bf16 words), distinct finite values per param."""
    out = {}
    for p, prm in enumerate(cfg.params()):
        n = 1
        for s in prm.shape:
            n *= s
        out[prm.name] = (tuple(prm.shape), [(p * 977 + i * 13) % 0x7f00 for i in range(n)])
    return out


def rows(hf, name, r0, n):
    shape, flat = hf[name]
    c = 1 if len(shape) == 1 else shape[1]
    return flat[r0 * c:(r0 + n) * c]


def megatron_state(cfg, hf, r):
    """Rank r's Megatron-Core state dict as flat u16 lists, by Megatron's rules."""
    H, G, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    Hd, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    sd = {}
    Vp = -(-V // (128 * T)) * 128 * T
    for mname, hname in (("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
                         ("output_layer.weight", "lm_head.weight")):
        full = hf[hname][1] + [0] * ((Vp - V) * Hd)
        sd[mname] = ((Vp // T, Hd), full[r * (Vp // T) * Hd:(r + 1) * (Vp // T) * Hd])
    for ln in range(cfg.num_hidden_layers):
        p, m = f"model.layers.{ln}.", f"decoder.layers.{ln}."
        sd[m + "self_attention.linear_qkv.layer_norm_weight"] = (
            (Hd,), hf[p + "input_layernorm.weight"][1])
        fused = []
        for g in range(G):
            fused += rows(hf, p + "self_attn.q_proj.weight", g * (H // G) * D, (H // G) * D)
            fused += rows(hf, p + "self_attn.k_proj.weight", g * D, D)
            fused += rows(hf, p + "self_attn.v_proj.weight", g * D, D)
        nr = G * (H // G + 2) * D // T
        sd[m + "self_attention.linear_qkv.weight"] = ((nr, Hd),
                                                      fused[r * nr * Hd:(r + 1) * nr * Hd])
        sd[m + "self_attention.q_layernorm.weight"] = ((D,), hf[p + "self_attn.q_norm.weight"][1])
        sd[m + "self_attention.k_layernorm.weight"] = ((D,), hf[p + "self_attn.k_norm.weight"][1])
        for mn, hn, n in (("self_attention.linear_proj.weight", "self_attn.o_proj.weight", H * D),
                          ("mlp.linear_fc2.weight", "mlp.down_proj.weight", I)):
            src = hf[p + hn][1]
            c = n // T
            sd[m + mn] = ((Hd, c),
                          [src[i * n + r * c + j] for i in range(Hd) for j in range(c)])
        sd[m + "mlp.linear_fc1.layer_norm_weight"] = (
            (Hd,), hf[p + "post_attention_layernorm.weight"][1])
        sd[m + "mlp.linear_fc1.weight"] = (
            (2 * I // T, Hd), rows(hf, p + "mlp.gate_proj.weight", r * I // T, I // T) +
            rows(hf, p + "mlp.up_proj.weight", r * I // T, I // T))
        sd[m + "mlp.linear_fc1._extra_state"] = None
    # a DDP-wrapped model names its params "module.module.<name>"
    sd = {("module.module." + k if k.startswith("decoder.layers.1.") else k): v
          for k, v in sd.items()}
    sd["decoder.final_layernorm.weight"] = ((Hd,), hf["model.norm.weight"][1])
    return sd


def expected_target(t, hf):
    """A target's bytes from its pieces and the HF params (2-D or 1-D)."""
    tc = 1 if len(t.shape) == 1 else t.shape[1]
    out = [0] * (t.shape[0] * tc)
    for pc in t.pieces:
        shape, flat = hf[pc.param.name]
        c = 1 if len(shape) == 1 else shape[1]
        nc = 1 if len(shape) == 1 else pc.src.len[1]
        c0 = 0 if len(shape) == 1 else pc.src.start[1]
        d1 = 0 if len(t.shape) == 1 else pc.dst_start[1]
        for i in range(pc.src.len[0]):
            for j in range(nc):
                out[(pc.dst_start[0] + i) * tc + d1 + j] = flat[(pc.src.start[0] + i) * c + c0 + j]
    return array.array("H", out).tobytes()


class MegatronSenders(unittest.TestCase):
    def test_tp2_megatron_to_tp2_vllm(self):
        cfg = wsync.ModelConfig.load(CONFIG)
        hf = hf_params(cfg)
        s0 = wsync.Sender("127.0.0.1:0", rank=0, world=T, receivers=T, timeout_ms=tl.TIMEOUT_MS)
        s1 = wsync.Sender(s0.coordinator, rank=1, world=T, receivers=T, timeout_ms=tl.TIMEOUT_MS)
        senders = [s0, s1]
        keep = []
        for r, s in enumerate(senders):
            sd = {}
            for name, v in megatron_state(cfg, hf, r).items():
                if v is None:
                    sd[name] = None   # skipped by name (._extra_state)
                    continue
                buf = array.array("H", v[1])
                keep.append(buf)
                sd[name] = wsync.HostTensor(buf, "bf16", v[0])
            specs = s.add_state_dict(sd, layout="megatron", config=CONFIG, tp=(r, T))
            self.assertTrue(any(sp.param.name == "model.layers.1.self_attn.k_proj.weight"
                                for sp in specs))
        rvs, bufs = [], []
        for r in range(T):
            rv = wsync.Receiver(s0.coordinator, rank=r, receivers=T, timeout_ms=tl.TIMEOUT_MS)
            tb = {}
            for t in cfg.tp_targets(r, T):
                tb[t.name] = (t, bytearray(t.nbytes))
                rv.add_target(t, tb[t.name][1])
            rvs.append(rv)
            bufs.append(tb)
        errors = []

        def push(s):
            try:
                s.push(1)
            except BaseException as e:   # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=push, args=(s,)) for s in senders]
        for t in threads:
            t.start()
        got = {}

        def wait(r, rv):
            try:
                got[r] = rv.wait()
            except BaseException as e:   # noqa: BLE001 - reported below
                errors.append(e)
        waits = [threading.Thread(target=wait, args=(r, rv)) for r, rv in enumerate(rvs)]
        for t in waits:
            t.start()
        try:
            for t in waits:
                t.join(60)
            self.assertEqual(errors, [])
            for r in range(T):
                self.assertEqual(got.get(r), 1)
                for name, (t, b) in bufs[r].items():
                    self.assertTrue(bytes(b) == expected_target(t, hf), f"rank {r}: {name}")
        finally:
            if errors or any(t.is_alive() for t in threads):
                for rv in rvs:
                    rv.close()
            for t in threads:
                t.join(60)
        self.assertEqual(errors, [])
        for rv in rvs:
            rv.close()
        s1.close()
        s0.close()

    def test_moe_experts_over_ep_and_etp(self):
        # EP rank 1 of 2 holds experts 4..7 as weight0..3; ETP rank 1 of 2 their rows [32, 64)
        ts = {t.name: t for t in wsync.megatron_tensors(MOE_CONFIG, tp=(0, 2), ep=(1, 2),
                                                        etp=(1, 2))}
        fc1 = ts["decoder.layers.1.mlp.experts.linear_fc1.weight2"]
        self.assertEqual(fc1.shape, (64, 128))
        self.assertEqual([(pc.param.name, pc.src.start, pc.src.len, pc.dst_start)
                          for pc in fc1.pieces],
                         [("model.layers.1.mlp.experts.6.gate_proj.weight", (32, 0), (32, 128),
                           (0, 0)),
                          ("model.layers.1.mlp.experts.6.up_proj.weight", (32, 0), (32, 128),
                           (32, 0))])
        fc2 = ts["decoder.layers.1.mlp.experts.linear_fc2.weight3"]
        self.assertEqual(fc2.shape, (128, 32))
        self.assertEqual([(pc.param.name, pc.src.start, pc.src.len) for pc in fc2.pieces],
                         [("model.layers.1.mlp.experts.7.down_proj.weight", (0, 32), (128, 32))])
        self.assertNotIn("decoder.layers.1.mlp.experts.linear_fc1.weight4", ts)
        with self.assertRaises(wsync.ConfigError) as cm:
            wsync.megatron_tensors(MOE_CONFIG, ep=(0, 3))
        self.assertIn("E = 8 is not a multiple of ep_size EP = 3", cm.exception.message)

    def test_unknown_name_is_refused(self):
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            wsync.megatron_shards({"decoder.layers.9.mlp.linear_fc1.weight":
                                   wsync.HostTensor(array.array("H", [0]), "bf16", (1,))},
                                  CONFIG, tp=(0, 2))
        self.assertIn("decoder.layers.9.mlp.linear_fc1.weight", cm.exception.message)
        with self.assertRaises(wsync.ConfigError):
            wsync.megatron_tensors(CONFIG, tp=(0, 4))   # 2 query groups over 4 ranks


if __name__ == "__main__":
    unittest.main()
