"""Live keys of CUDA memory from Python (docs/views.md, section 3): a
CUDA module bound in another process keeps its parameters' data_ptr
across updates made on the publisher's stream, runs its forward passes
inside consistent() (which synchronizes the current stream before the
second sequence read) and never mixes two versions; the update's time
and bandwidth are printed (not asserted). Skipped without a CUDA
device."""
import os
import subprocess
import sys
import textwrap
import time
import unittest

import st_fixture
from st_fixture import ServerTestCase

st_fixture.add_package_path()


class GpuLiveTest(ServerTestCase):
    SERVER_OPTIONS = {"default_device": "socket"}

    def test_bound_cuda_module_sees_one_version_per_forward(self):
        import torch
        import sharedtensor as st
        c = st.Client(path=self.srv.socket)
        dev = "cuda:0"
        sd = {"weight": torch.zeros(1024, 1024, device=dev), "bias": torch.zeros(1024, device=dev)}
        self.assertEqual(c.put("pol", sd, live=True), 1)
        prog = textwrap.dedent("""
            import sys, torch, sharedtensor as st
            c = st.Client(path=%r)
            m = torch.nn.Linear(1024, 1024).cuda()
            b = c.bind(m, "pol")
            ptr = m.weight.data_ptr()
            x = torch.ones(1, 1024, device="cuda:0")
            print("ready", flush=True)
            b.wait_version(2, timeout=60)
            seen = set()
            while b.version < 101:
                for attempt in b.consistent(timeout=60):
                    with attempt:
                        y = m(x)
                assert bool(torch.all(y == 1025 * attempt.version)), (attempt.version, y[0, :4])
                seen.add(attempt.version)
            assert m.weight.data_ptr() == ptr
            print("ok", len(seen), flush=True)
        """) % self.srv.socket
        env = dict(os.environ, PYTHONPATH=os.path.join(os.environ["ST_SOURCE_DIR"], "python"))
        p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
        line = p.stdout.readline()
        if line.strip() != "ready":
            p.kill()
            self.fail("the reader did not start:\n" + line + p.communicate()[0])
        src = {"weight": torch.empty(1024, 1024, device=dev), "bias": torch.empty(1024, device=dev)}
        times = []
        for v in range(2, 102):
            src["weight"].fill_(float(v))
            src["bias"].fill_(float(v))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.assertEqual(c.update("pol", src), v)
            times.append(time.perf_counter() - t0)
        out = p.communicate(timeout=120)[0]
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("ok", out)
        times.sort()
        mib = (1024 * 1024 + 1024) * 4 / 2 ** 20
        print("\n   update of %.1f MiB: p50 %.1f us (%.1f GB/s)" % (
            mib, times[len(times) // 2] * 1e6, mib * 2 ** 20 / times[len(times) // 2] / 1e9))
        c.delete("pol")
        c.close()


if __name__ == "__main__":
    unittest.main()
