"""C senders, Python receivers: two C processes hold FSDP-2 of HF Qwen3-tiny and push three
versions; two Python receivers describe vLLM's TP-2 layout with one add_engine_targets call
each (one with buffers the receiver allocates, one with a mix of bytearrays and HostTensors it
owns) and compare every target of every version with a reference computed here from the
safetensors file. And a Python receiver asking for a param no sender holds gets MismatchError
naming the param, while the C senders get WSYNC_ERR_MISMATCH with the same name."""
from __future__ import annotations

import unittest

import wsync_testlib as tl


def run_group(test: unittest.TestCase, sender_args, receivers, versions: int) -> None:
    """sender_args: extra args of every C sender (2 of them); receivers: args per Python
    receiver."""
    with tl.Group() as g:
        common = ["--senders", 2, "--receivers", len(receivers), "--versions", versions,
                  *sender_args]
        g.start("c_sender_0", tl.c_program("c_sender", "--coordinator", "127.0.0.1:0",
                                           "--rank", 0, *common))
        addr = g.coordinator("c_sender_0")
        g.start("c_sender_1", tl.c_program("c_sender", "--coordinator", addr, "--rank", 1,
                                           *common))
        for r, args in enumerate(receivers):
            g.start(f"py_receiver_{r}", tl.python_peer("receiver", "--coordinator", addr,
                                                       "--rank", r, "--tp", len(receivers),
                                                       "--versions", versions, *args))
        codes = g.wait()
        report = g.report(codes)
        print(report)
        test.assertTrue(all(c == 0 for c in codes.values()), f"exit codes {codes}\n{report}")


class CSenderPyReceiver(unittest.TestCase):
    def test_fsdp2_to_tp2(self):
        run_group(self, [], [["--buffers", "none"], ["--buffers", "given"]], versions=3)

    def test_unknown_param_is_a_mismatch_everywhere(self):
        e = ["--expect-error", tl.BAD_PARAM]
        run_group(self, e, [["--buffers", "given", *e],
                            ["--bad-param", tl.BAD_PARAM, *e]], versions=1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
