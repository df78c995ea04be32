"""The hand-off example on CUDA memory (examples/handoff/handoff.py
--device cuda): a producer and two consumer processes, 200 requests of
4 MiB through 4 chunks of one VMM allocation, every tensor checked; the
server's cuda:0 budget is back afterwards and the device's free memory
within one 2 MiB granule of where it was. Skipped without a CUDA device."""
import os
import re
import subprocess
import sys
import unittest

import st_fixture
from st_fixture import ServerTestCase, env

st_fixture.add_package_path()


class GpuHandoffTest(ServerTestCase):
    SERVER_OPTIONS = {"default_device": "socket"}

    def test_the_example_on_cuda(self):
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
        self.assertLessEqual(abs(int(before.group(2)) - int(after.group(2))), 2 << 20,
                             out.stdout)


if __name__ == "__main__":
    unittest.main()
