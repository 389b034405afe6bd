"""The asynchronous push from Python: Sender.push_begin / push_wait / push_done with
copy_shards, a slow receiver in another process (it sleeps after every bucket). The trainer
overwrites its shard with the next version's bytes as soon as push_begin returned; the receiver
must still get each version's own bytes exactly, push_wait returns the version (None while it is
not done yet), and a second push_begin while one is in flight raises StateError naming it."""
from __future__ import annotations

import subprocess
import sys
import unittest

import wsync
import wsync_testlib as tl

ROWS, COLS = 512, 1024          # bf16: 1 MiB, 16 buckets of 64 KiB
NBYTES = ROWS * COLS * 2
VERSIONS = 3
PARAM = "model.layers.0.mlp.down_proj.weight"

RECEIVER = r"""
import sys, time
import wsync
addr, versions, rows, cols, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
exec(sys.argv[6])   # pattern()
p = wsync.Param(name, "bf16", (rows, cols))
t = wsync.Target(name, "bf16", (rows, cols), (wsync.Piece(p, wsync.Box.whole((rows, cols)), (0, 0)),))
with wsync.Receiver(addr, rank=0, receivers=1, timeout_ms=10000,
                    progress=lambda v, done, total: time.sleep(0.02)) as r:
    buf = r.add_target(t)
    for v in range(1, versions + 1):
        got = r.wait(20000)
        data = bytes(memoryview(buf).cast("B"))
        want = pattern(v, rows * cols * 2)
        bad = sum(1 for a, b in zip(data, want) if a != b) if data != want else 0
        print(f"version {got}: {bad} bytes differ", flush=True)
        if got != v or bad:
            sys.exit(1)
"""

PATTERN = """
def pattern(v, n):
    base = bytes((i * 7 + 3) % 251 for i in range(251))
    rot = base[v % 251:] + base[:v % 251]
    return (rot * (n // 251 + 1))[:n]
"""
exec(PATTERN)


class AsyncPush(unittest.TestCase):
    def test_write_shards_right_after_push_begin(self):
        shard = bytearray(pattern(1, NBYTES))   # noqa: F821 (defined by exec above)
        with wsync.Sender("127.0.0.1:0", rank=0, world=1, receivers=1, scheme="ipc",
                          bucket_bytes=64 * 1024, timeout_ms=10000, copy_shards=True) as s:
            s.add_shard(wsync.Param(PARAM, "bf16", (ROWS, COLS)),
                        wsync.HostTensor(shard, "bf16", (ROWS, COLS)))
            proc = subprocess.Popen([sys.executable, "-c", RECEIVER, s.coordinator,
                                     str(VERSIONS), str(ROWS), str(COLS), PARAM, PATTERN],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                with self.assertRaises(wsync.StateError):
                    s.push_wait(0)                     # nothing in flight
                in_flight = 0
                for v in range(1, VERSIONS + 1):
                    s.push_begin(v)
                    shard[:] = pattern(v + 1, NBYTES)  # noqa: F821 -- allowed at once
                    in_flight += not s.push_done
                    with self.assertRaises(wsync.StateError) as e:
                        s.push_begin(v + 1)
                    self.assertIn(f"the push of version {v} is in flight", str(e.exception))
                    with self.assertRaises(wsync.StateError):
                        s.stats
                    got = None
                    if v == 1:
                        self.assertIsNone(s.push_wait(0))   # the receiver is slow
                    while got is None:
                        got = s.push_wait(100)
                    self.assertEqual(got, v)
                    self.assertEqual(s.stats.version, v)
                self.assertGreater(in_flight, 0, "the pushes ended before the writes: the "
                                   "receiver was not slow enough for this test to mean anything")
                out, _ = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        print(out)
        self.assertEqual(proc.returncode, 0, out)
        for v in range(1, VERSIONS + 1):
            self.assertIn(f"version {v}: 0 bytes differ", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
