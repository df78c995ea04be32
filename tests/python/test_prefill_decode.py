"""The prefill/decode example (examples/prefill_decode/run.sh) with its one
command on the CPU: three processes (publish, prefill, decode) share the
model's read-only weights and a paged KV cache through published keys and
a buffer, and decode's tokens equal those of the same model run in one
process. test_gpu_prefill_decode.py runs it on CUDA."""
import os
import re
import subprocess
import sys
import unittest

from st_fixture import env


def run_example(test, device):
    script = os.path.join(env("ST_SOURCE_DIR"), "examples", "prefill_decode", "run.sh")
    e = dict(os.environ, ST_PYTHON=sys.executable, ST_BUILD_DIR=env("ST_BUILD_DIR"))
    out = subprocess.run(["sh", script, device], capture_output=True, text=True, timeout=240,
                         env=e)
    text = out.stdout + out.stderr
    test.assertEqual(out.returncode, 0, text)
    test.assertIn("read-only) and prefill_decode/kv v1", out.stdout)
    test.assertRegex(out.stdout, r"prefill: 19 prompt tokens into blocks \[[\d, ]+\], first token \d+, "
                                 r"published as write 1")
    tokens = re.search(r"decode: 24 tokens: ([\d ]+)", out.stdout)
    test.assertTrue(tokens, text)
    test.assertEqual(len(tokens.group(1).split()), 24)
    test.assertIn("tokens match the single-process run", out.stdout)
    test.assertIn("memory on %s" % device, out.stdout)
    return out.stdout


class PrefillDecodeTest(unittest.TestCase):
    def test_the_example_on_the_cpu(self):
        run_example(self, "cpu")


if __name__ == "__main__":
    unittest.main()
