"""Python senders, C receivers: FSDP-2 of HF Qwen3-tiny described from Python (whole tensors in
bytearrays, DTensor look-alikes, local shards with the config's shapes) and received by two C
processes in vLLM's TP-2 layout over ipc; every target of every version must equal the C
program's own reference. And the failure a user meets first: a C receiver asking for a param no
sender holds fails, on the C side and as MismatchError naming the param on the Python side."""
from __future__ import annotations

import unittest

import wsync_testlib as tl


def run_group(test: unittest.TestCase, senders, receivers, versions: int) -> None:
    """senders: modes of the Python senders, rank order; receivers: extra args per C receiver."""
    with tl.Group() as g:
        n = len(senders)
        common = ["--senders", n, "--receivers", len(receivers), "--versions", versions]
        extra = lambda mode: ["--mode", mode] + common   # noqa: E731
        g.start("py_sender_0", tl.python_peer("sender", "--coordinator", "127.0.0.1:0",
                                              "--rank", 0, *extra(senders[0][0]),
                                              *senders[0][1:]))
        addr = g.coordinator("py_sender_0")
        for i in range(1, n):
            g.start(f"py_sender_{i}", tl.python_peer("sender", "--coordinator", addr, "--rank", i,
                                                     *extra(senders[i][0]), *senders[i][1:]))
        for r, args in enumerate(receivers):
            g.start(f"c_receiver_{r}", tl.c_program("c_receiver", "--coordinator", addr,
                                                    "--rank", r, "--tp", len(receivers),
                                                    "--receivers", len(receivers),
                                                    "--versions", versions, *args))
        codes = g.wait()
        report = g.report(codes)
        print(report)
        test.assertTrue(all(c == 0 for c in codes.values()), f"exit codes {codes}\n{report}")


class PySenderCReceiver(unittest.TestCase):
    def test_fsdp2_to_tp2_whole_tensors_and_dtensors(self):
        run_group(self, [("full",), ("dtensor",)], [[], []], versions=3)

    def test_fsdp2_to_tp2_local_shards_with_config(self):
        run_group(self, [("local",), ("full",)], [[], []], versions=1)

    def test_unknown_param_is_a_mismatch_everywhere(self):
        e = ["--expect-error", tl.BAD_PARAM]
        run_group(self, [("full", *e), ("local", *e)],
                  [e, ["--bad-param", tl.BAD_PARAM, *e]], versions=1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
