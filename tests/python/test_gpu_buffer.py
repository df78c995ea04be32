"""Buffers of CUDA memory from Python (sharedtensor.buffer_create(device="cuda:0")):
a write of a device tensor read back by another process (a read-only
handle) and by this one, read_new across processes, write/read of host
tensors into a CUDA buffer, the GB/s of write and read next to a device
copy printed (not asserted). Skipped without a CUDA device."""
import os
import subprocess
import sys
import textwrap
import time
import unittest

import st_fixture
from st_fixture import ServerTestCase

st_fixture.add_package_path()


class GpuBufferTest(ServerTestCase):
    SERVER_OPTIONS = {"default_device": "socket"}

    def test_device_frames_between_processes(self):
        import torch
        import sharedtensor as st
        b = st.buffer_create("gpu1", (1000, 1000), "float32", device="cuda:0", slots=2,
                      path=self.srv.socket)
        self.assertEqual(b.device, "cuda:0")
        x = torch.rand(1000, 1000, device="cuda:0")
        seq = b.write(x)
        self.assertTrue(torch.equal(b.read(), x))
        out = torch.empty_like(x)
        self.assertIs(b.read(out=out), out)
        self.assertTrue(torch.equal(out, x))
        host = torch.arange(10 ** 6, dtype=torch.float32).reshape(1000, 1000)
        b.write(host)
        self.assertTrue(torch.equal(b.read().cpu(), host))
        prog = textwrap.dedent("""
            import sys, torch, sharedtensor as st
            r = st.buffer_open("gpu1", readonly=True, path=%r)
            print("ready", flush=True)
            y = r.read_new(timeout=60)
            print("sum", float(y.sum()), r.last_sequence, flush=True)
            try:
                r.write(y)
            except st.InvalidArgumentError:
                print("refused", flush=True)
            r.close()
        """ % self.srv.socket)
        envv = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=envv)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        seq = b.write(torch.ones(1000, 1000, device="cuda:0"))
        outp, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("sum 1000000.0 %d" % seq, outp)
        self.assertIn("refused", outp)
        n = 200
        for what, fn in (("copy_", lambda: out.copy_(x)), ("write", lambda: b.write(x)),
                         ("read(out=)", lambda: b.read(out=out))):
            fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            print("%-12s %6.1f GB/s" % (what, n * 4e6 / dt / 1e9), file=sys.stderr)
        b.unlink()
        b.close()


if __name__ == "__main__":
    unittest.main()
