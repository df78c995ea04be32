"""The prefill/decode example (examples/prefill_decode/run.sh) with its one
command on the CPU: three processes (publish, prefill, decode) share the
model's read-only weights and a paged KV cache through published keys and
a buffer, and decode's tokens equal those of the same model run in one
process; and with --two-servers, decode behind a second server: the KV
blocks through a hand-off across servers, the weights through a pull (UCX
over TCP on loopback). test_gpu_prefill_decode.py runs it on CUDA."""
import re
import unittest

import st_fixture


def run_example(test, device):
    out, text = st_fixture.run_example(test, "prefill_decode", device)
    test.assertIn("read-only) and prefill_decode/kv v1", out)
    test.assertRegex(out, r"prefill: 19 prompt tokens into blocks \[[\d, ]+\], first token \d+, "
                          r"published as write 1")
    tokens = re.search(r"decode: 24 tokens: ([\d ]+)", out)
    test.assertTrue(tokens, text)
    test.assertEqual(len(tokens.group(1).split()), 24)
    test.assertIn("tokens match the single-process run", out)
    test.assertIn("memory on %s" % device, out)


def run_two_servers(test, device):
    out, text = st_fixture.run_example(test, "prefill_decode", "--two-servers", device)
    test.assertIn("decode's server: pulled prefill_decode/weights v1 from prefill", out)
    blocks = re.search(r"prefill: 19 prompt tokens into blocks (\[[\d, ]+\]), first token \d+, "
                       r"sent as 3 chunks of 8\.0 KiB", out)
    test.assertTrue(blocks, text)
    test.assertIn("decode: blocks %s of the prompt from prefill's hand-off through this "
                  "server's mirror" % blocks.group(1), out)
    tokens = re.search(r"decode: 24 tokens: ([\d ]+)", out)
    test.assertTrue(tokens, text)
    test.assertEqual(len(tokens.group(1).split()), 24)
    test.assertIn("tokens match the single-process run", out)


class PrefillDecodeTest(unittest.TestCase):
    def test_the_example_on_the_cpu(self):
        run_example(self, "cpu")

    def test_decode_behind_a_second_server(self):
        run_two_servers(self, "cpu")


if __name__ == "__main__":
    unittest.main()
