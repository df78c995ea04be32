"""The hand-off example on CUDA memory (examples/handoff/handoff.py
--device cuda): a producer and two consumer processes, 200 requests of
4 MiB through 4 chunks of one VMM allocation, every tensor checked; the
server's cuda:0 budget is back afterwards, and once the example's
processes (and their CUDA contexts) are gone the device's free memory is
within one 2 MiB granule of where it was. Skipped without a CUDA device."""
import os
import re
import subprocess
import sys
import time
import unittest

import st_fixture
from st_fixture import ServerTestCase, env

st_fixture.add_package_path()


class GpuHandoffTest(ServerTestCase):
    SERVER_OPTIONS = {"default_device": "socket"}

    def test_the_example_on_cuda(self):
        import torch
        torch.cuda.init()
        free_before = torch.cuda.mem_get_info(0)[0]
        script = os.path.join(env("ST_SOURCE_DIR"), "examples", "handoff", "handoff.py")
        out = subprocess.run([sys.executable, script, self.srv.socket, "--device", "cuda",
                              "--requests", "200", "--chunks", "4"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("checksums: 0 of 400 requests wrong", out.stdout)
        before = re.search(r"before: (\d+) bytes used, (\d+) free", out.stdout)
        after = re.search(r"after:  (\d+) bytes used, (\d+) free", out.stdout)
        self.assertTrue(before and after, out.stdout)
        self.assertEqual(before.group(1), after.group(1))
        # The driver returns memory asynchronously after the processes exit.
        deadline = time.monotonic() + 10
        free_after = torch.cuda.mem_get_info(0)[0]
        while free_after + (2 << 20) < free_before and time.monotonic() < deadline:
            time.sleep(0.05)
            free_after = torch.cuda.mem_get_info(0)[0]
        self.assertLessEqual(free_before - free_after, 2 << 20,
                             "free %d before, %d after\n%s" % (free_before, free_after,
                                                                 out.stdout))


if __name__ == "__main__":
    unittest.main()
