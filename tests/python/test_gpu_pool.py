"""Fresh CUDA results (regions of the connection's result pool) dropped as
torch tensors while kernels on torch's default stream still read them
(docs/pool.md, section 2, "Deferred CUDA frees"): the server must not
hand a region out again, and write it, before those kernels ran.

  - the default stream held by a host function ahead of `y = x * 2`,
    `del x`, and at once a call whose result holds other values: the new
    result is not in x's bytes while the read is pending, and y is old
    x * 2;
  - 2,000 fresh results dropped at random with kernels pending on them:
    every y is checked;
  - a process that exits with frees still waiting on their events (the
    interpreter's normal exit, and os._exit) exits cleanly, and the
    server's pool bytes on the device go back.

run_tests.py skips (77) without torch or a CUDA device.
"""
import ctypes
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402

ENDPOINTS = {
    "full.lua": """
return st.endpoint { name = "full", device = "cuda", params = { n = 262144, v = 0.5 },
  build = function(a) return st.full { a.n, value = a.v, dtype = "float32" } end }
""",
}

N = 262144          # 1 MiB of float32
SMALL = 4096        # 16 KiB

_cycles_per_s = None


def cycles(seconds):
    """torch.cuda._sleep cycles that take about `seconds` on this GPU."""
    global _cycles_per_s
    if _cycles_per_s is None:
        n = 20_000_000
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(n)
        end.record()
        end.synchronize()
        _cycles_per_s = n / max(start.elapsed_time(end) / 1000.0, 1e-6)
    return max(int(_cycles_per_s * seconds), 1)


def pool_bytes(c):
    return c.info()["memory"]["cuda:0"]["pool_bytes"]


def wait_pool_bytes(c, want, timeout=10.0):
    end = time.monotonic() + timeout
    while pool_bytes(c) != want and time.monotonic() < end:
        time.sleep(0.01)
    return pool_bytes(c)


class HostGate:
    """A host function on the legacy default stream (cuLaunchHostFunc)
    that holds the stream until open() (at most 30 s)."""

    _fn_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def __init__(self):
        self._event = threading.Event()
        self._fn = self._fn_type(lambda _: self._event.wait(30))   # kept alive here
        self._cuda = ctypes.CDLL("libcuda.so.1")

    def launch(self):
        CU_STREAM_LEGACY = ctypes.c_void_p(1)
        rc = self._cuda.cuLaunchHostFunc(CU_STREAM_LEGACY, self._fn, None)
        if rc != 0:
            raise RuntimeError("cuLaunchHostFunc: CUresult %d" % rc)

    def open(self):
        self._event.set()

class GpuPoolTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS
    SERVER_OPTIONS = {"default_device": "socket",
                      "config": "pool = { cuda_slab_bytes = 8388608 },"}

    def test_a_dropped_result_waits_for_the_kernel_that_reads_it(self):
        x = self.c.call("full", n=N, v=1.0)
        self.assertEqual(x.device.type, "cuda")
        self.assertGreater(pool_bytes(self.c), 0)   # x is a region of the pool
        lo, hi = x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()
        # y, the event and the kernel exist first: an allocation by
        # torch's caching allocator, and the lazy loading of a kernel at
        # its first launch, may wait for the default stream.
        y = torch.empty_like(x)
        read = torch.cuda.Event()
        torch.mul(x, 2, out=y)
        read.record()
        torch.cuda.synchronize()
        # The default stream waits on a gate (a host function), then reads
        # x. The GPU itself stays idle, so the server's kernels run at
        # once: a region given back too early is overwritten before the
        # read (a long kernel here instead would keep the GPU busy and
        # the server's fill would queue behind it).
        gate = HostGate()
        gate.launch()
        torch.mul(x, 2, out=y)
        read.record()
        try:
            del x   # the last reference: torch's deleter, the read still queued
            z = self.c.call("full", n=N, v=7.0)
            self.assertFalse(read.query())
            zlo = z.data_ptr()
            zhi = zlo + z.numel() * z.element_size()
            self.assertTrue(zhi <= lo or hi <= zlo,
                            "the new result took the bytes a pending kernel reads")
        finally:
            gate.open()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(y, torch.full((N,), 2.0, device="cuda")),
                        "the kernel read bytes the next result had overwritten")
        self.assertTrue(torch.equal(z, torch.full((N,), 7.0, device="cuda")))

    def test_random_drops_with_pending_kernels(self):
        rng = random.Random(20240612)
        pause = cycles(0.002)
        live, ys = [], []
        for i in range(2000):
            v = float(i + 1)
            x = self.c.call("full", n=SMALL, v=v)
            if rng.random() < 0.1:
                torch.cuda._sleep(pause)   # keeps the reads below pending
            ys.append((x * 2, v))
            live.append(x)
            del x
            while live and (len(live) > 24 or rng.random() < 0.5):
                live.pop(rng.randrange(len(live)))   # drops the last reference
        live.clear()
        torch.cuda.synchronize()
        bad = [v for y, v in ys if not bool((y == 2 * v).all())]
        self.assertEqual(bad, [], "%d of %d reads saw another result's bytes"
                         % (len(bad), len(ys)))

    def exit_with_frees_pending(self, how):
        code = textwrap.dedent("""
            import os, sys
            sys.path.insert(0, %r)
            import torch, sharedtensor as st
            c = st.Client(path=%r)
            xs = [c.call("full", n=%d, v=float(i)) for i in range(8)]
            torch.cuda.synchronize()
            torch.cuda._sleep(%d)
            ys = [x * 2 for x in xs]
            del xs   # eight frees wait for the sleep
            print("ok", flush=True)
            if %r == "_exit":
                os._exit(0)
        """) % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"), self.srv.socket, N,
                cycles(0.5), how)
        before = pool_bytes(self.c)
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode().strip(), "ok")
        self.assertEqual(wait_pool_bytes(self.c, before), before)

    def test_exit_with_frees_pending(self):
        self.exit_with_frees_pending("exit")

    def test_os_exit_with_frees_pending(self):
        self.exit_with_frees_pending("_exit")


if __name__ == "__main__":
    unittest.main()
