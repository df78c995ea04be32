"""The weight-update example (examples/weight_update/run.sh) with its one
command on the CPU: a trainer updates a live key in place every step while
rollout processes bound to it run forward passes, each of which must have
used one version (its parameters' checksum equals the trainer's for the
version it read); and with --two-servers, the rollouts behind a second
server that follows the trainer's keys across servers (UCX over TCP on
loopback). test_gpu_weight_update.py runs it on CUDA."""
import re
import unittest

import st_fixture


def run_example(test, device):
    out, text = st_fixture.run_example(test, "weight_update", device, "3", "25")
    test.assertIn("trainer: weight_update/policy v1 live, 8 tensors, 16.0 MiB on %s; 3 rollouts"
                  % device, out)
    test.assertRegex(out, r"update: 25 versions of 16\.0 MiB in place, p50 [\d.]+ ms")
    m = re.search(r"rollouts: (\d+) forward passes on [\d/]+ versions, (\d+) checked", out)
    test.assertTrue(m, text)
    test.assertGreaterEqual(int(m.group(1)), 3)
    test.assertEqual(m.group(1), m.group(2))
    test.assertIn("every forward pass used one consistent version", out)


class WeightUpdateTest(unittest.TestCase):
    def test_the_example_on_the_cpu(self):
        run_example(self, "cpu")

    def test_the_rollouts_behind_a_second_server(self):
        out, text = st_fixture.run_example(self, "weight_update", "--two-servers", "cpu", "2",
                                           "10")
        self.assertIn("rollouts' server: follows trainer:weight_update/policy from v1", out)
        self.assertIn("rollouts' server: follows trainer:weight_update/sums from v1", out)
        self.assertRegex(out, r"update: 10 versions of 16\.0 MiB in place")
        m = re.search(r"rollouts: (\d+) forward passes on [\d/]+ versions, (\d+) checked", out)
        self.assertTrue(m, text)
        self.assertGreaterEqual(int(m.group(1)), 2)
        self.assertEqual(m.group(1), m.group(2))
        self.assertIn("every forward pass used one consistent version", out)

    def test_the_rollouts_behind_a_second_server_staged(self):
        """The trainer's server copies each version before it moves
        (peer.live_reads = "staged"): the same consistency."""
        import os
        os.environ["ST_LIVE_READS"] = "staged"
        try:
            out, text = st_fixture.run_example(self, "weight_update", "--two-servers", "cpu",
                                               "2", "10")
        finally:
            del os.environ["ST_LIVE_READS"]
        self.assertRegex(out, r"update: 10 versions of 16\.0 MiB in place")
        m = re.search(r"rollouts: (\d+) forward passes on [\d/]+ versions, (\d+) checked", out)
        self.assertTrue(m, text)
        self.assertEqual(m.group(1), m.group(2))
        self.assertIn("every forward pass used one consistent version", out)


if __name__ == "__main__":
    unittest.main()
