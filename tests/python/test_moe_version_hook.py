"""Receiver(on_version=...): the per-version hook in Python, sender and receiver in two threads
of one process (ipc on host memory). The hook runs once per version with its number, sees the
new bytes in the buffers, and runs before the sender's push returns; a hook that raises fails
the version (AbortedError chained to the hook's exception, the sender's push naming the
receiver, the buffers torn, the last committed version the one before), and so does a hook
returning something that is not None or an int, or an int a C int cannot hold."""
from __future__ import annotations

import array
import threading
import time
import unittest

import wsync
import wsync_testlib as tl

N = 64


def values(v: int):
    return [float(i) * v - 3.0 for i in range(N)]


class VersionHook(unittest.TestCase):
    def run_group(self, hook_fails_at: int, fail=None):
        """fail: what the hook does at hook_fails_at (default: raise RuntimeError); it returns
        fail()."""
        w = array.array("f", [0.0] * N)
        s = wsync.Sender("127.0.0.1:0", rank=0, world=1, receivers=1, timeout_ms=tl.TIMEOUT_MS)
        s.add_shard("w", wsync.HostTensor(w, "f32", (N,)))
        seen, done, pushed, errors = [], [], [], []
        buf = bytearray(4 * N)

        def hook(version):
            got = array.array("f")
            got.frombytes(bytes(buf))
            seen.append((version, got.tolist() == values(version)))
            if version == hook_fails_at:
                if fail is not None:
                    return fail()
                raise RuntimeError("re-deriving W_UK failed")
            time.sleep(0.2)
            done.append(version)

        def trainer():
            try:
                s.setup()
                for v in (1, 2, 3):
                    w[:] = array.array("f", values(v))
                    s.push(v)
                    pushed.append((v, list(done)))   # what the hooks had finished by then
            except BaseException as e:
                errors.append(e)

        rv = wsync.Receiver(s.coordinator, rank=0, receivers=1, timeout_ms=tl.TIMEOUT_MS,
                            on_version=hook)
        rv.add_target(wsync.replicated(wsync.Param("w", "f32", (N,))), buf)
        t = threading.Thread(target=trainer)
        t.start()
        got, failure = [], None
        try:
            for _ in (1, 2, 3):
                got.append(rv.wait())
        except wsync.AbortedError as e:
            failure = e
        finally:
            t.join(60)
        state = (rv.version, rv.torn)
        rv.close()
        s.close()
        return seen, pushed, errors, got, failure, state

    def test_hook_runs_before_push_returns(self):
        seen, pushed, errors, got, failure, state = self.run_group(0)
        self.assertIsNone(failure)
        self.assertEqual(errors, [])
        self.assertEqual(got, [1, 2, 3])
        self.assertEqual(seen, [(1, True), (2, True), (3, True)])
        # each push returned only after that version's hook had finished
        self.assertEqual(pushed, [(1, [1]), (2, [1, 2]), (3, [1, 2, 3])])
        self.assertEqual(state, (3, False))

    def test_hook_exception_fails_the_version(self):
        seen, pushed, errors, got, failure, state = self.run_group(2)
        self.assertEqual(got, [1])
        self.assertIsNotNone(failure)
        self.assertIsInstance(failure.__cause__, RuntimeError)
        self.assertIn("on_version", failure.message)
        self.assertIn("version 2", failure.message)
        self.assertEqual(state, (1, True))
        self.assertEqual(seen, [(1, True), (2, True)])
        self.assertEqual(pushed, [(1, [1])])
        self.assertEqual(len(errors), 1)
        self.assertIsInstance(errors[0], wsync.WsyncError)
        self.assertIn("receiver 0", str(errors[0]))

    def check_failed_at_2(self, failure, state, seen, errors):
        self.assertIsNotNone(failure)
        self.assertIn("version 2", failure.message)
        self.assertEqual(state, (1, True))
        self.assertEqual(seen, [(1, True), (2, True)])
        self.assertEqual(len(errors), 1)

    def test_hook_result_not_an_int_fails_the_version(self):
        # a result that is neither None nor an int must not read as success
        seen, pushed, errors, got, failure, state = self.run_group(2, lambda: "done")
        self.assertEqual(got, [1])
        self.check_failed_at_2(failure, state, seen, errors)
        self.assertIsInstance(failure.__cause__, TypeError)
        self.assertIn("'done'", str(failure.__cause__))

    def test_hook_result_past_c_int_fails_the_version(self):
        # 2**32 would wrap to 0 (success) as a C int
        seen, pushed, errors, got, failure, state = self.run_group(2, lambda: 2 ** 32)
        self.assertEqual(got, [1])
        self.check_failed_at_2(failure, state, seen, errors)
        self.assertIn("returned -1", failure.message)


if __name__ == "__main__":
    unittest.main()
