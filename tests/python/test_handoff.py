"""Hand-offs from Python (sharedtensor.handoff) against a real stserver:
the example (examples/handoff/handoff.py: a producer and two consumer
processes checking every request) with a small request count, and the
module's own calls: tickets, views, the timeout when every chunk waits,
a stale ticket refused."""
import os
import subprocess
import sys
import unittest

import st_fixture
from st_fixture import ServerTestCase, env

st_fixture.add_package_path()

import torch  # noqa: E402

from sharedtensor import errors  # noqa: E402
from sharedtensor.handoff import Handoff  # noqa: E402


class HandoffTest(ServerTestCase):
    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 1024 * 1024 },"}

    def test_the_example_runs_and_memory_comes_back(self):
        script = os.path.join(env("ST_SOURCE_DIR"), "examples", "handoff", "handoff.py")
        out = subprocess.run([sys.executable, script, self.srv.socket, "--requests", "60",
                              "--mib", "0.25", "--chunks", "3"],
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("60 requests of 0.2 MiB to 2 consumers on cpu through 3 chunks",
                      out.stdout)
        self.assertRegex(out.stdout, r"latency \(acquire to last ack\): p50 [\d.]+ us, "
                                     r"p99 [\d.]+ us")
        self.assertIn("checksums: 0 of 120 requests wrong", out.stdout)
        self.assertIn("server memory before: 0 bytes used", out.stdout)
        self.assertIn("server memory after:  0 bytes used", out.stdout)
        self.assertTrue(out.stdout.rstrip().endswith("ok"), out.stdout)

    def test_tickets_views_and_refusals(self):
        import sharedtensor
        p = Handoff.create(self.c, "py", chunk_bytes=4096, chunks=1, consumers=1)
        with sharedtensor.Client(path=self.srv.socket) as c2, Handoff.open(c2, "py") as q:
            self.assertEqual((q.slot, q.chunks, q.chunk_bytes, q.device), (0, 1, 4096, "cpu"))
            x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
            t = p.put(x)
            self.assertEqual((t.shape, t.dtype, t.nbytes), ((3, 4), "float32", 48))
            self.assertEqual(p.pending(t.chunk), (t.seq, 1))
            with self.assertRaises(errors.BY_NAME["TIMEOUT"]) as e:
                p.acquire(timeout=0.05)
            self.assertIn("no chunk became free within 50 ms", str(e.exception))
            y = q.read(t)
            self.assertTrue(torch.equal(x, y))
            q.ack(t)
            with self.assertRaises(errors.BY_NAME["INVALID_ARGUMENT"]):
                q.ack(t)                            # twice
            t2 = p.put(x + 1)
            with self.assertRaises(errors.BY_NAME["STALE_HANDLE"]):
                q.read(t)                           # recycled since
            self.assertTrue(torch.equal(q.read(t2), x + 1))
            q.ack(t2)
            # the listing: both slots' view of one hand-off
            (e,) = [e for e in self.c.handoffs() if e["name"] == "py"]
            self.assertEqual((e["chunks"], e["chunk_bytes"], e["consumers"], e["open"]),
                             (1, 4096, 1, 1))
            self.assertEqual((e["producer"], e["pending"], e["followers"], e["mirror"]),
                             (True, 0, [], None))
            # consumers=/device= choose a peer's mirror; here they are refused
            with self.assertRaises(errors.BY_NAME["INVALID_ARGUMENT"]) as e:
                Handoff.open(c2, "py", consumers=2)
            self.assertIn("are for a peer's hand-off", str(e.exception))
        p.close()

    def test_a_publish_before_the_consumers_open_waits_for_them(self):
        import sharedtensor
        p = Handoff.create(self.c, "early", chunk_bytes=4096, chunks=2, consumers=2)
        x = torch.arange(8, dtype=torch.float32)
        t = p.put(x)                                    # nobody opened yet
        with sharedtensor.Client(path=self.srv.socket) as c1, \
                sharedtensor.Client(path=self.srv.socket) as c2, \
                Handoff.open(c1, "early") as a, Handoff.open(c2, "early") as b:
            self.assertEqual(p.pending(t.chunk), (t.seq, 3))   # the opens kept both bits
            for q in (a, b):
                self.assertTrue(torch.equal(q.read(t), x))
                q.ack(t)
            self.assertEqual(p.pending(t.chunk)[1], 0)
            t2 = p.put(x + 1)                           # mid-stream: both count
            self.assertEqual(p.pending(t2.chunk), (t2.seq, 3))
            for q in (a, b):
                q.ack(t2)
        p.close()


if __name__ == "__main__":
    unittest.main()
