"""The prefill/decode example on CUDA (examples/prefill_decode/run.sh
cuda): the weights and the KV pool are VMM allocations both processes map,
and the tokens equal the single-process run's. Skipped without a CUDA
device."""
import unittest

from test_prefill_decode import run_example


class GpuPrefillDecodeTest(unittest.TestCase):
    def test_the_example_on_cuda(self):
        run_example(self, "cuda")


if __name__ == "__main__":
    unittest.main()
