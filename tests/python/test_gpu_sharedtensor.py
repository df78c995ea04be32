"""sharedtensor on CUDA tensors: torch (versioned capsules), CuPy and JAX,
and CUDA tensor arguments (sharedtensor.empty(..., device="cuda") memory
that endpoints write in place).

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
    "scale.lua": st_fixture.EP_SCALE,
    "scale_cuda.lua": """
return st.endpoint { name = "scale_cuda",
  params = { x = st.tensor_param { dtype = "float32", device = "cuda" }, k = 2.5 },
  build = function(a) return a.x:mul_(a.k) end }
""",
    "echo.lua": st_fixture.EP_ECHO,
    "geometry.lua": st_fixture.EP_GEOMETRY,
    "keyed.lua": """
return st.endpoint { name = "keyed", device = "cuda", cache = true,
  params = { x = st.required }, build = function(a) return 1 end }
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


class GpuTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS
    SERVER_OPTIONS = {"default_device": "socket"}

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


def counting(shape, dtype=torch.float32, device="cuda"):
    """sharedtensor.empty memory on `device` holding 0, 1, 2, ..., written
    by this process's current stream (not synchronized here: the package
    must do it before it sends the tensor)."""
    t = st.empty(shape, dtype=dtype, device=device)
    n = 1
    for d in shape:
        n *= d
    t.copy_(torch.arange(n, dtype=torch.float64, device=t.device).view(*shape))
    return t


class GpuTensorArgumentTest(st_fixture.ServerTestCase):
    """CUDA tensors passed to endpoints: exported VMM memory from
    sharedtensor.empty(..., device="cuda")."""

    ENDPOINTS = ENDPOINTS
    SERVER_OPTIONS = {"default_device": "socket"}

    def test_empty_on_cuda(self):
        for device in ("cuda", "cuda:0", torch.device("cuda", 0), 0):
            with self.subTest(device=str(device)):
                t = st.empty((2, 3), device=device)
                self.assertEqual((t.device.type, t.device.index), ("cuda", 0))
                self.assertEqual((tuple(t.shape), t.stride(), t.dtype),
                                 ((2, 3), (3, 1), torch.float32))
                self.assertEqual(t.cpu().tolist(), [[0.0] * 3] * 2)
        z = st.zeros(4, dtype=torch.bfloat16, device="cuda")
        self.assertEqual(z.dtype, torch.bfloat16)
        like = st.empty_like(torch.ones(3, 2, device="cuda").t())
        self.assertEqual((like.device.type, tuple(like.shape), like.stride()),
                         ("cuda", (2, 3), (3, 1)))
        s = st.empty(3, device="cuda", framework=None)
        self.assertEqual(s.device, "cuda:0")
        x = torch.from_dlpack(s)
        self.assertEqual(x.data_ptr(), s.data_ptr)
        with self.assertRaises(st.InvalidArgumentError):
            st.empty(2, device="cuda:%d" % torch.cuda.device_count())

    def test_scale_writes_into_the_callers_tensor(self):
        t = counting((2, 3))
        r = self.c.call("scale_cuda", x=t, k=3.0)
        # the server synchronized its stream before replying: no sync needed
        self.assertEqual(t.cpu().tolist(), [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]])
        self.assertEqual((r.device.type, r.device.index), ("cuda", 0))
        self.assertEqual(r.cpu().tolist(), t.cpu().tolist())
        r[0, 0] = 42.0
        torch.cuda.synchronize()
        self.assertEqual(t[0, 0].item(), 42.0)
        self.c.call("scale", x=t)            # k = 2.5, an endpoint that takes any device
        self.assertEqual(t[1, 2].item(), 37.5)

    def test_writes_of_every_stream_are_seen(self):
        # Work still queued when call() is made must be done before the
        # server reads (it reads as soon as the request arrives): the
        # package synchronizes the tensor's device first, every stream of
        # it. A spin kernel holds each stream for about 0.1 s, far longer
        # than a request takes; without the synchronization the endpoint
        # would scale zeros and the fill would land afterwards.
        spin = getattr(torch.cuda, "_sleep", None)
        if spin is None:
            self.skipTest("this torch has no torch.cuda._sleep")
        self.c.call("scale_cuda", x=st.zeros(1, device="cuda"))   # the server's CUDA is up
        side = torch.cuda.Stream()
        small = st.empty(4, device="cuda")
        with torch.cuda.stream(side):         # a stream other than the current one
            spin(1 << 28)
            small.fill_(3.0)
        self.c.call("scale_cuda", x=small, k=2.0)
        self.assertEqual(small.cpu().tolist(), [6.0] * 4)
        big = st.empty(1 << 20, device="cuda")
        spin(1 << 28)                          # the current stream
        big.fill_(2.0)
        self.c.call("scale_cuda", x=big, k=0.5)
        self.assertEqual((big.min().item(), big.max().item()), (1.0, 1.0))

    def test_echo_returns_the_same_memory(self):
        t = counting((4,))
        e = self.c.call("echo", value=t)
        self.assertEqual(e.device.type, "cuda")
        self.assertEqual(e.cpu().tolist(), [0.0, 1.0, 2.0, 3.0])
        e[2] = -7.0
        torch.cuda.synchronize()
        self.assertEqual(t[2].item(), -7.0)

    def test_views_pass_as_they_are(self):
        base = counting((4, 6))
        v = base[1:3].t()                    # shape (6, 2), strides (1, 6), offset 6
        g = self.c.call("geometry", x=v)
        self.assertEqual((g["shape"], g["stride"], g["first"]), ([6, 2], [1, 6], 6.0))
        self.assertEqual((g["dtype"], g["device"]), ("float32", "cuda:0"))
        self.c.call("scale_cuda", x=base[3, ::2], k=-1.0)
        want = [-i if i >= 18 and i % 2 == 0 else i for i in range(24)]
        self.assertEqual(base.flatten().cpu().tolist(), [float(w) for w in want])
        e = self.c.call("echo", value=base.view(-1)[5:9])   # a storage offset of 5
        self.assertEqual(e.cpu().tolist(), [5.0, 6.0, 7.0, 8.0])

    def test_submit_carries_tensor_arguments(self):
        t = counting((3,))
        tid = self.c.submit("scale_cuda", x=t, k=-1.0)
        self.assertEqual(self.c.wait(tid, timeout=30)["status"], "completed")
        self.c.result(tid)
        self.assertEqual(t.cpu().tolist(), [0.0, -1.0, -2.0])

    def test_refused_tensor_arguments(self):
        foreign = torch.arange(3, dtype=torch.float32, device="cuda")
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("scale_cuda", x=foreign)
        self.assertIn("this cuda:0 tensor's memory was not allocated by sharedtensor",
                      str(cm.exception))
        self.assertIn("sharedtensor.empty_like(t).copy_(t)", str(cm.exception))
        copy = st.empty_like(foreign).copy_(foreign)
        self.c.call("scale_cuda", x=copy, k=2.0)
        self.assertEqual(copy.cpu().tolist(), [0.0, 2.0, 4.0])
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("scale_cuda", x=counting((3,), device="cpu"))
        self.assertIn("argument 'x' is on cpu; the endpoint wants cuda", str(cm.exception))
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("scale_cuda", x=st.zeros(3, dtype=torch.float64, device="cuda"))
        self.assertIn("argument 'x' has dtype float64; the endpoint wants float32",
                      str(cm.exception))
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("keyed", x=copy)
        self.assertIn("cannot be part of a key", str(cm.exception))
        self.assertGreater(self.c.ping(), 0)


if __name__ == "__main__":
    unittest.main()
