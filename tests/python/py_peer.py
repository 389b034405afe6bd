"""A Python rank of a test group (run by the tests as a subprocess).

    py_peer.py sender   --coordinator ADDR --rank i --senders N --receivers R --versions V
                        --mode full|dtensor|local [--expect-error TEXT]
    py_peer.py receiver --coordinator ADDR --rank r --tp T --versions V
                        [--buffers none|given] [--bad-param NAME] [--expect-error TEXT]

Senders hold FSDP shards of HF Qwen3-tiny in one of three ways, all described in one
add_state_dict call:
  full     every tensor whole (HostTensor over a bytearray): the sender reads its rows in place;
  dtensor  DTensor look-alikes holding only the rank's rows, Shard(0) over a 1-D mesh;
  local    HostTensors holding only the rank's rows, global shapes from the model config.
Rank 0 prints "coordinator HOST:PORT" once it listens.

Receivers describe TP rank r with one add_engine_targets call, with buffers the receiver
allocates (none) or a mix of bytearrays, HostTensors and tensor look-alikes the caller owns
(given), and compare every target with wsync_testlib's reference after every version.

With --expect-error TEXT the group must fail with MismatchError (status WSYNC_ERR_MISMATCH)
whose message contains TEXT. Exit status 0 when everything went as expected.
"""
from __future__ import annotations

import argparse
import sys
import traceback

import wsync
import wsync_testlib as tl

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("CHECK failed: " + msg, file=sys.stderr)


def expect_mismatch(e: BaseException, text: str, who: str) -> None:
    check(isinstance(e, wsync.MismatchError),
          f"{who}: raised {type(e).__name__}: {e}; expected MismatchError")
    if isinstance(e, wsync.WsyncError):
        check(e.status_name == "WSYNC_ERR_MISMATCH", f"{who}: status {e.status_name}")
        check(text in e.message, f"{who}: message {e.message!r} lacks {text!r}")
        check(text in str(e) and "WSYNC_ERR_MISMATCH" in str(e), f"{who}: str(e) = {e}")
    print(f"{who} saw: {type(e).__name__}: {e}", file=sys.stderr)


def sender(a) -> None:
    who = f"py_sender {a.rank}"
    tensors = tl.read_safetensors(tl.CKPT)
    cfg = wsync.ModelConfig.load(tl.CONFIG)
    expected = {s.param.name: s for s in cfg.fsdp_shards(a.rank, a.senders)}
    mem = {}          # name -> (bytearray, first element of the bytearray in the param)
    sd = {}
    for name, (dt, shape, raw) in tensors.items():
        assert dt == "BF16"
        cols = shape[1] if len(shape) == 2 else 1
        if a.mode == "full":
            buf = bytearray(raw)
            mem[name] = (buf, 0)
            sd[name] = wsync.HostTensor(buf, "bf16", shape)
            continue
        # the rank's rows, by the ceil rule written out here
        n = shape[0]
        c = -(-n // a.senders)
        lo, hi = min(a.rank * c, n), min(n, (a.rank + 1) * c)
        buf = bytearray(raw[lo * cols * 2:hi * cols * 2])
        mem[name] = (buf, lo * cols)
        local_shape = (hi - lo,) + tuple(shape[1:])
        if a.mode == "dtensor":
            local = tl.FakeTensor(buf, "torch.bfloat16", local_shape)
            sd[name] = tl.FakeDTensor(local, shape, tl.Shard(0), tl.FakeMesh(a.senders, a.rank))
        else:
            sd[name] = wsync.HostTensor(buf, "bf16", local_shape)

    with wsync.Sender(a.coordinator, rank=a.rank, world=a.senders, receivers=a.receivers,
                      scheme="ipc", timeout_ms=tl.TIMEOUT_MS, heartbeat_ms=200) as s:
        if a.rank == 0:
            print(f"coordinator {s.coordinator}", flush=True)
        if a.mode == "local":
            described = s.add_state_dict(sd, "fsdp", config=tl.CONFIG)
        else:
            described = s.add_state_dict(sd, "fsdp")
        check(len(described) == len(tensors), f"{who}: {len(described)} shards described")
        for spec in described:
            want = expected[spec.param.name]
            check(spec == want, f"{who}: described {spec}, the library's FSDP layout says {want}")
        check([sp.param.name for sp in s.shards] == list(tensors), f"{who}: shard order")
        if a.expect_error:
            try:
                s.setup()
                s.push(1)
                check(False, f"{who}: setup and push succeeded; expected a MismatchError")
            except wsync.WsyncError as e:
                expect_mismatch(e, a.expect_error, who)
            return
        s.setup()
        check(s.scheme == "ipc", f"{who}: scheme {s.scheme}")
        for v in range(1, a.versions + 1):
            for spec in described:
                name = spec.param.name
                buf, first = mem[name]
                shape = spec.param.shape
                cols = shape[1] if len(shape) == 2 else 1
                e0 = spec.box.start[0] * cols
                e1 = e0 + spec.box.len[0] * cols
                raw = tensors[name][2]
                new = tl.version_u16(tl.u16(raw[2 * e0:2 * e1]), v).tobytes()
                buf[2 * (e0 - first):2 * (e1 - first)] = new     # in place: same length
            s.push(v)
            st = s.stats
            check(st.version == v, f"{who}: stats {st}")
        print(f"{who}: pushed {a.versions} versions ({a.mode})", file=sys.stderr)


def receiver(a) -> None:
    who = f"py_receiver {a.rank}"
    model = tl.Model()
    cfg = wsync.ModelConfig.load(tl.CONFIG)
    targets = {t.name: t for t in cfg.tp_targets(a.rank, a.tp)}
    given = {}
    poison = {}
    if a.buffers == "given":
        # a mix of what an engine may hold; every third target is left to the receiver
        for i, (name, t) in enumerate(targets.items()):
            kind = i % 3
            if kind == 0:
                buf = bytearray(b"\xab" * t.nbytes)
                given[name] = buf
            elif kind == 1:
                buf = bytearray(b"\xab" * t.nbytes)
                given[name] = wsync.HostTensor(buf, "bf16", t.shape, writable=True)
            else:
                continue
            poison[name] = buf
    with wsync.Receiver(a.coordinator, rank=a.rank, receivers=a.tp, timeout_ms=tl.TIMEOUT_MS,
                        heartbeat_ms=200) as rv:
        bufs = rv.add_engine_targets(tl.CONFIG, a.rank, a.tp,
                                     buffers=given if a.buffers == "given" else None)
        check(sorted(rv.targets) == sorted(model.target_names()),
              f"{who}: targets {sorted(rv.targets)}")
        for name, obj in given.items():
            check(bufs[name] is obj, f"{who}: buffers[{name}] is not the buffer given")

        def raw(name):
            b = bufs[name]
            return bytes(b.buffer) if isinstance(b, wsync.HostTensor) else bytes(b)

        if a.bad_param:
            ir = model.I // a.tp
            p = wsync.Param(a.bad_param, "bf16", (model.I, model.Hd))
            bad = wsync.Target("unknown.param.slice", "bf16", (ir, model.Hd),
                               [wsync.Piece(p, wsync.Box((a.rank * ir, 0), (ir, model.Hd)),
                                            (0, 0))])
            rv.add_target(bad)
        if a.expect_error:
            try:
                v = rv.wait()
                check(False, f"{who}: wait returned version {v}; expected a MismatchError")
            except wsync.WsyncError as e:
                expect_mismatch(e, a.expect_error, who)
            check(rv.version == 0, f"{who}: version {rv.version} after the failure")
            for name in rv.targets:
                want = b"\xab" if name in poison else b"\x00"
                got = raw(name)
                check(got == want * len(got), f"{who}: target {name} was written although "
                      "the group failed")
            return
        for v in range(1, a.versions + 1):
            got = rv.wait()
            check(got == v, f"{who}: got version {got}, expected {v}")
            check(not rv.torn and rv.version == v, f"{who}: torn {rv.torn}, version "
                  f"{rv.version}")
            bad = 0
            for name in rv.targets:
                ref = model.reference(name, a.rank, a.tp, v)
                if raw(name) != ref and bad < 3:
                    bad += 1
                    b = raw(name)
                    k = next(i for i in range(0, min(len(b), len(ref)), 2)
                             if b[i:i + 2] != ref[i:i + 2]) if len(b) == len(ref) else -1
                    check(False, f"{who} version {v}: {name} differs from the reference "
                          f"(first at byte {k} of {len(ref)}; {len(b)} bytes)")
        check(rv.scheme == "ipc", f"{who}: scheme {rv.scheme}")
        print(f"{who}: {a.versions} versions, {len(rv.targets)} targets equal to the reference "
              f"(buffers {a.buffers})", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["sender", "receiver"])
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--mode", choices=["full", "dtensor", "local"], default="full")
    ap.add_argument("--buffers", choices=["none", "given"], default="none")
    ap.add_argument("--bad-param")
    ap.add_argument("--expect-error")
    a = ap.parse_args()
    try:
        sender(a) if a.role == "sender" else receiver(a)
    except BaseException:
        traceback.print_exc()
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
