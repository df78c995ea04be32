"""The weight-update example on CUDA (examples/weight_update/run.sh cuda):
the live key is VMM memory every rollout maps; updates are device copies
fenced before the version moves. Skipped without a CUDA device."""
import unittest

from test_weight_update import run_example


class GpuWeightUpdateTest(unittest.TestCase):
    def test_the_example_on_cuda(self):
        run_example(self, "cuda")


if __name__ == "__main__":
    unittest.main()
