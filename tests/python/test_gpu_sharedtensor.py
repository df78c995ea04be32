"""sharedtensor on CUDA tensors: torch (versioned capsules), CuPy and JAX.

run_tests.py skips (77) without torch or a CUDA device; CuPy and JAX tests
skip one by one when their package is missing.
"""
import os
import subprocess
import sys
import textwrap
import unittest

import st_fixture

st_fixture.add_package_path()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import torch  # noqa: E402

import sharedtensor as st  # noqa: E402
from sharedtensor import tensor as st_tensor  # noqa: E402

try:
    import cupy
except ImportError:
    cupy = None
try:
    import jax
    import jax.dlpack
except ImportError:
    jax = None

ENDPOINTS = {
    "arange.lua": """
return st.endpoint { name = "arange", device = "cuda", params = { n = 6, dtype = "float32" },
  build = function(a) return st.arange { a.n, dtype = a.dtype } end }
""",
    "cached.lua": """
return st.endpoint { name = "cached", device = "cuda", cache = true, params = { n = 8 },
  build = function(a) return st.arange { a.n, dtype = "float32" } end }
""",
    "linear.lua": """
return st.endpoint { name = "linear", device = "cuda", managed = true,
  params = { input_dim = 32, output_dim = 8 },
  build = function(a)
    return st.module({ { "weight", st.randn { a.output_dim, a.input_dim, seed = 1 } },
                       { "bias", st.arange { a.output_dim, dtype = "float32" } } })
  end }
""",
}


class GpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = st_fixture.Server(ENDPOINTS, default_device="socket")

    @classmethod
    def tearDownClass(cls):
        status = cls.srv.stop()
        log = cls.srv.log()
        cls.srv.cleanup()
        if status != 0:
            raise AssertionError("stserver exited with %s; log:\n%s" % (status, log))

    def setUp(self):
        self.c = st.Client(path=self.srv.socket)

    def tearDown(self):
        self.c.close()

    def test_torch_on_device(self):
        t = self.c.call("arange", n=6)
        self.assertEqual(t.device.type, "cuda")
        self.assertEqual(t.device.index, 0)
        self.assertEqual(t.cpu().tolist(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        self.assertTrue(st_tensor._torch_state["versioned"])   # torch >= 2.1 took 1.x
        s = self.c.call("arange", n=6, as_torch=False)
        self.assertEqual(s.device, "cuda:0")
        self.assertEqual(torch.from_dlpack(s).data_ptr(), s.data_ptr)
        for name in ("bfloat16", "float16", "int64", "bool", "float8_e4m3fn", "float8_e5m2"):
            with self.subTest(dtype=name):
                if not hasattr(torch, name):
                    self.skipTest("torch lacks " + name)
                x = self.c.call("arange", n=4, dtype=name)
                self.assertEqual(x.dtype, getattr(torch, name))
                want = [0.0, 1.0, 1.0, 1.0] if name == "bool" else [0.0, 1.0, 2.0, 3.0]
                self.assertEqual(x.float().cpu().tolist(), want)

    def test_forward_on_shared_weights(self):
        with self.c.call("linear") as h:
            layer = st.load_into(torch.nn.Linear(32, 8).cuda(), h.value)
            self.assertEqual(layer.weight.data_ptr(), h.value["weight"].data_ptr())
            x = torch.randn(4, 32, device="cuda")
            y = layer(x)
            want = x @ h.value["weight"].t() + h.value["bias"]
            self.assertTrue(torch.allclose(y, want, atol=1e-5))

    def test_zero_copy_between_results(self):
        self.c.invalidate_all("cached")
        a = self.c.call("cached").value
        b = self.c.call("cached", as_torch=False).value
        self.assertEqual(a.data_ptr(), b.data_ptr)
        a[2] = 99.0
        torch.cuda.synchronize()
        self.assertEqual(torch.from_dlpack(b)[2].item(), 99.0)
        if cupy is not None:
            self.assertEqual(float(cupy.from_dlpack(b)[2]), 99.0)

    @unittest.skipIf(cupy is None, "cupy is not installed")
    def test_cupy(self):
        s = self.c.call("arange", n=5, as_torch=False)
        x = cupy.from_dlpack(s)
        self.assertEqual(x.data.ptr, s.data_ptr)
        self.assertEqual(cupy.asnumpy(x).tolist(), [0.0, 1.0, 2.0, 3.0, 4.0])
        y = cupy.from_dlpack(s.__dlpack__(max_version=(1, 0)))   # raw versioned capsule
        self.assertEqual(float(y.sum()), 10.0)

    @unittest.skipIf(jax is None, "jax is not installed")
    def test_jax(self):
        s = self.c.call("arange", n=5, as_torch=False)
        try:
            x = jax.dlpack.from_dlpack(s)
        except TypeError:
            import jax.numpy as jnp
            x = jnp.from_dlpack(s)
        self.assertEqual([float(v) for v in x.tolist()], [0.0, 1.0, 2.0, 3.0, 4.0])
        self.assertEqual(x.devices().pop().platform, "gpu")

    def test_capsules_free_their_mapping(self):
        code = textwrap.dedent("""
            import gc, sys
            sys.path.insert(0, %r)
            import torch, sharedtensor as st
            from sharedtensor import _lib
            c = st.Client(path=%r, framework=None)
            t = c.call("arange", n=4)
            caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]
            x = torch.from_dlpack(t)
            del caps, t
            gc.collect()
            assert _lib.open_cache_stats()[0] == 1
            del x
            gc.collect()
            assert _lib.open_cache_stats()[0] == 0, _lib.open_cache_stats()
            keep = c.call("arange", n=2).__dlpack__()
            print("ok")
        """) % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"), self.srv.socket)
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode().strip(), "ok")


if __name__ == "__main__":
    unittest.main()
