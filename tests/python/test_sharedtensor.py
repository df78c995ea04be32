"""sharedtensor (python/) against a real stserver, on CPU tensors: results,
and tensor arguments (sharedtensor.empty memory that endpoints write in
place).

Runs under Debian's python3 with torch 1.13 and numpy 1.24, which know only
legacy DLPack capsules; run_tests.py skips (77) without them.
"""
import builtins
import gc
import os
import subprocess
import sys
import textwrap
import unittest

import st_fixture

st_fixture.add_package_path()

try:
    import numpy as np
    import torch
except ImportError:  # run_tests.py skips first; this keeps plain unittest honest
    np = torch = None

import sharedtensor as st  # noqa: E402

ENDPOINTS = {
    "arange.lua": """
return st.endpoint { name = "arange", params = { n = 6, dtype = "float32" },
  build = function(a) return st.arange { a.n, dtype = a.dtype } end }
""",
    "filled.lua": """
return st.endpoint { name = "filled", params = { n = 4, dtype = "bool", value = true },
  build = function(a) return st.full { a.n, dtype = a.dtype, value = a.value } end }
""",
    "cached.lua": """
return st.endpoint { name = "cached", cache = true, params = { n = 8 },
  build = function(a) return st.arange { a.n, dtype = "float32" } end }
""",
    "managed.lua": """
return st.endpoint { name = "managed", managed = true, params = { n = 4 },
  build = function(a) return st.ones { a.n } end }
""",
    "linear.lua": """
return st.endpoint { name = "linear", managed = true, cache = true,
  params = { input_dim = 16, output_dim = 4 },
  build = function(a)
    return st.module({ { "weight", st.randn { a.output_dim, a.input_dim, seed = 0 } },
                       { "bias", st.arange { a.output_dim, dtype = "float32" } } },
                     { arch = "linear" })
  end }
""",
    "ordered.lua": """
return st.endpoint { name = "ordered", params = {},
  build = function(a)
    return st.module({ { "z", st.zeros { 2 } }, { "a", st.ones { 3 } },
                       { "m.0.w", st.arange { 4, dtype = "float32" } } })
  end }
""",
    "nested.lua": """
return st.endpoint { name = "nested", params = { s = "hi" },
  build = function(a)
    local t = st.arange { 12, dtype = "float32" }:view { 3, 4 }
    return { s = a.s, n = 7, f = 2.5, yes = true, list = { 1, "two", false },
             t = t, strided = t:slice(1, 0, 4, 2),
             inner = { mod = st.module({ { "w", st.ones { 2 } } }) } }
  end }
""",
    "fail.lua": """
return st.endpoint { name = "fail", params = {},
  build = function(a) error("boom") end }
""",
    "scale.lua": st_fixture.EP_SCALE,
    "echo.lua": st_fixture.EP_ECHO,
    "sum64.lua": """
return st.endpoint { name = "sum64",
  params = { x = st.tensor_param { dtype = "float64", device = "cpu" } },
  build = function(a)
    local function sum(v)
      if type(v) == "number" then return v end
      local s = 0
      for _, x in ipairs(v) do s = s + sum(x) end
      return s
    end
    return sum(a.x:tolist())
  end }
""",
    "geometry.lua": st_fixture.EP_GEOMETRY,
    "keyed.lua": """
return st.endpoint { name = "keyed", cache = true, params = { x = st.required },
  build = function(a) return 1 end }
""",
    "slow.lua": """
return st.endpoint { name = "slow", execution = "task", params = { n = 3 },
  build = function(a) st.progress(1.0, "done"); return st.arange { a.n } end }
""",
}

# Every dtype the server knows that torch 1.13 knows as well.
TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                "float32", "float64"]


@unittest.skipIf(torch is None, "torch and numpy are needed")
class SharedTensorTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def test_ping_info_endpoints(self):
        self.assertGreater(self.c.ping(), 0)
        info = self.c.info()
        self.assertIsInstance(info, dict)
        self.assertEqual(self.c.server_pid, self.srv.proc.pid)
        names = repr(self.c.endpoints())
        for name in ("arange", "linear", "cached"):
            self.assertIn(name, names)
        metrics = self.c.metrics()
        self.assertIsInstance(metrics, str)
        self.assertIn("# TYPE sharedtensor_requests_total counter", metrics)
        self.assertRegex(metrics, r'sharedtensor_requests_total\{method="ping",outcome="ok"\} [1-9]')

    def test_torch_values(self):
        t = self.c.call("arange", n=6)
        self.assertIsInstance(t, torch.Tensor)
        self.assertEqual(t.dtype, torch.float32)
        self.assertEqual(t.tolist(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        self.assertEqual(t.device.type, "cpu")

    def test_numpy_values(self):
        t = self.c.call("arange", n=5, dtype="int32", as_torch=False)
        self.assertIsInstance(t, st.SharedTensor)
        self.assertEqual((t.dtype, t.shape, t.device), ("int32", (5,), "cpu"))
        a = np.from_dlpack(t)
        self.assertEqual(a.dtype, np.int32)
        self.assertEqual(a.tolist(), [0, 1, 2, 3, 4])
        self.assertEqual(a.ctypes.data, t.data_ptr)   # no copy

    def test_every_torch_dtype(self):
        for name in TORCH_DTYPES:
            with self.subTest(dtype=name):
                if name == "bool":
                    t = self.c.call("filled", n=4, dtype="bool", value=True)
                    self.assertEqual(t.tolist(), [True] * 4)
                    f = self.c.call("filled", n=3, dtype="bool", value=False)
                    self.assertEqual(f.tolist(), [False] * 3)
                else:
                    t = self.c.call("arange", n=5, dtype=name)
                    self.assertEqual([float(x) for x in t.tolist()], [0, 1, 2, 3, 4])
                self.assertEqual(t.dtype, getattr(torch, name))

    def test_float8(self):
        for name in ("float8_e4m3fn", "float8_e5m2"):
            with self.subTest(dtype=name):
                t = self.c.call("arange", n=4, dtype=name)
                if hasattr(torch, name):   # torch >= 2.1
                    self.assertEqual(t.float().tolist(), [0.0, 1.0, 2.0, 3.0])
                else:                      # an older torch: the DLPack producer
                    self.assertIsInstance(t, st.SharedTensor)
                    self.assertEqual((t.dtype, t.shape), (name, (4,)))

    def test_zero_copy_through_the_cache(self):
        self.c.invalidate_all("cached")
        h1 = self.c.call("cached", n=8)
        h2 = self.c.call("cached", n=8)
        self.assertIsInstance(h1, st.Handle)
        self.assertEqual(h1.object_id, h2.object_id)
        self.assertTrue(h2.cached)
        t1, t2 = h1.value, h2.value
        self.assertEqual(t1.data_ptr(), t2.data_ptr())
        # numpy 1.24 maps DLPack tensors read-only: write through torch,
        # read through numpy, on two results of the same object.
        t1[3] = 42.0
        other = self.c.call("cached", n=8, as_torch=False).value
        self.assertEqual(np.from_dlpack(other)[3], 42.0)
        self.assertEqual(t2[3].item(), 42.0)
        # a second connection maps the same memory too
        with st.Client(path=self.srv.socket) as c2:
            self.assertEqual(c2.call("cached", n=8).value[3].item(), 42.0)
        self.assertTrue(self.c.invalidate("cached", n=8))
        fresh = self.c.call("cached", n=8).value
        self.assertEqual(fresh[3].item(), 3.0)

    def test_module_order_and_metadata(self):
        m = self.c.call("ordered")
        self.assertIsInstance(m, st.Module)
        self.assertEqual(list(m.keys()), ["z", "a", "m.0.w"])
        self.assertEqual(m["a"].tolist(), [1.0, 1.0, 1.0])
        self.assertEqual(m["m.0.w"].tolist(), [0.0, 1.0, 2.0, 3.0])
        with self.c.call("linear") as h:
            self.assertEqual(list(h.value.keys()), ["weight", "bias"])
            self.assertEqual(h.value.metadata, {"arch": "linear"})

    def test_nested_values(self):
        v = self.c.call("nested", s="hey")
        self.assertEqual((v["s"], v["n"], v["f"], v["yes"]), ("hey", 7, 2.5, True))
        self.assertEqual(v["list"], [1, "two", False])
        self.assertEqual(v["t"].shape, (3, 4))
        self.assertEqual(v["strided"].stride(), (4, 2))
        self.assertEqual(v["strided"].tolist(), [[0, 2], [4, 6], [8, 10]])
        mod = v["inner"]["mod"]
        self.assertEqual(list(mod.keys()), ["w"])

    def test_load_into_forward(self):
        with self.c.call("linear", input_dim=16, output_dim=4) as h:
            state = h.value
            layer = st.load_into(torch.nn.Linear(16, 4), state)
            self.assertEqual(layer.weight.data_ptr(), state["weight"].data_ptr())
            self.assertEqual(layer.bias.data_ptr(), state["bias"].data_ptr())
            x = torch.ones(2, 16)
            y = layer(x)
            want = x @ state["weight"].t() + state["bias"]
            self.assertTrue(torch.allclose(y, want))
            self.assertEqual(y.shape, (2, 4))
            with self.assertRaises(KeyError):
                st.load_into(torch.nn.Linear(16, 4), {"weight": state["weight"]})

    def test_handle_releases_its_lease(self):
        with self.c.call("managed", n=4) as h:
            self.assertTrue(h.managed)
            self.assertTrue(h.lease)
            self.assertEqual(h.refcount, 1)
            oid = h.object_id
            self.assertEqual(self.c.object_info(oid)["refcount"], 1)
            t = h.value
        self.assertTrue(h.released)
        # the lease is gone, and with it the (uncached) object ...
        with self.assertRaises(st.StaleHandleError):
            self.c.object_info(oid)
        self.assertEqual(self.c.release(oid)["released"], False)
        # ... while the mapping lives on in the tensor
        self.assertEqual(t.tolist(), [1.0] * 4)
        h2 = self.c.call("managed", n=2)
        r = h2.release()
        self.assertEqual((r["released"], r["refcount"]), (True, 0))
        self.assertIsNone(h2.release())
        # wait=False: not waited for, done before the next request
        h3 = self.c.call("managed", n=3)
        self.assertIsNone(self.c.release(h3.object_id, wait=False))
        with self.assertRaises(st.StaleHandleError):
            self.c.object_info(h3.object_id)

    def test_tasks(self):
        tid = self.c.submit("slow", n=4)
        info = self.c.wait(tid, timeout=10)
        self.assertEqual(info["status"], "completed")
        self.assertEqual(self.c.result(tid).tolist(), [0, 1, 2, 3])
        self.assertEqual(self.c.cancel(tid)["status"], "completed")
        page = self.c.tasks(limit=1)
        self.assertEqual([t["id"] for t in page], [tid])
        self.assertTrue(all(t["id"] < tid for t in self.c.tasks(before=tid)))
        with self.assertRaises(st.InvalidArgumentError):
            self.c.tasks(limit=1001)

    def test_errors(self):
        cases = [
            (lambda: self.c.call("fail"), st.EndpointError, "ENDPOINT"),
            (lambda: self.c.call("nope"), st.UnknownEndpointError, "UNKNOWN_ENDPOINT"),
            (lambda: self.c.call("arange", n="x"), st.InvalidArgumentError, "INVALID_ARGUMENT"),
            (lambda: self.c.object_info(987654), st.StaleHandleError, "STALE_HANDLE"),
            (lambda: st.Client(path=self.srv.dir + "/none.sock"), st.IoError, "IO"),
        ]
        for fn, cls, name in cases:
            with self.subTest(name=name):
                with self.assertRaises(cls) as cm:
                    fn()
                self.assertIsInstance(cm.exception, st.Error)
                self.assertEqual(cm.exception.name, name)
                self.assertEqual(cm.exception.code, cls.code)
        with self.assertRaises(st.EndpointError) as cm:
            self.c.call("fail")
        self.assertIn("boom", str(cm.exception))
        self.assertIn("fail.lua", str(cm.exception))
        self.assertGreater(self.c.ping(), 0)   # still usable after errors
        # three are built-in exceptions too
        self.assertTrue(issubclass(st.TimeoutError, builtins.TimeoutError))
        self.assertTrue(issubclass(st.IoError, ConnectionError))
        self.assertTrue(issubclass(st.AuthError, PermissionError))
        with self.assertRaises(OSError):
            st.Client(path=self.srv.dir + "/none.sock")

    def test_results_outlive_the_client(self):
        c = st.Client(path=self.srv.socket)
        t = c.call("arange", n=3)
        c.close()
        del c
        gc.collect()
        self.assertEqual(t.tolist(), [0.0, 1.0, 2.0])
        closed = st.Client(path=self.srv.socket)
        closed.close()
        with self.assertRaises(ValueError):
            closed.ping()
        with self.assertRaises(ValueError):
            closed.call("arange", n=3)
        with self.assertRaises(ValueError):
            closed.call("arange")

    def test_capsules_free_their_mapping(self):
        # Unconsumed capsules (legacy and versioned), consumed ones and one
        # alive at exit: each mapping is given back, the interpreter exits 0.
        code = textwrap.dedent("""
            import gc, sys
            sys.path.insert(0, %r)
            import numpy, torch, sharedtensor as st
            from sharedtensor import _lib
            c = st.Client(path=%r, framework=None)
            t = c.call("arange", n=4)
            caps = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0)), t.__dlpack__()]
            assert _lib.open_cache_stats()[0] == 1
            del caps, t
            gc.collect()
            assert _lib.open_cache_stats()[0] == 0, _lib.open_cache_stats()
            t = c.call("arange", n=4)
            a = numpy.from_dlpack(t)
            x = torch.from_dlpack(t.__dlpack__())
            del t
            gc.collect()
            assert _lib.open_cache_stats()[0] == 1
            del a
            gc.collect()
            assert _lib.open_cache_stats()[0] == 1
            del x
            gc.collect()
            assert _lib.open_cache_stats()[0] == 0, _lib.open_cache_stats()
            keep = c.call("arange", n=2).__dlpack__()
            c.close()
            print("ok")
        """) % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"), self.srv.socket)
        p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(p.stdout.decode().strip(), "ok")


def own_allocations():
    """Descriptors of sharedtensor.empty allocations open in this process
    (each allocation keeps its memfd until its last user is freed)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "st-tensor-arg" in os.readlink("/proc/self/fd/" + fd)
        except OSError:
            pass
    return n


def counting(shape, dtype=None):
    """sharedtensor.empty memory holding 0, 1, 2, ... (a torch tensor)."""
    t = st.empty(shape, dtype=dtype or torch.float32)
    n = 1
    for s in shape:
        n *= s
    t.copy_(torch.arange(n, dtype=torch.float64).view(*shape))
    return t


@unittest.skipIf(torch is None, "torch and numpy are needed")
class TensorArgumentTest(st_fixture.ServerTestCase):
    """Tensors passed to endpoints: memory from sharedtensor.empty/zeros."""

    ENDPOINTS = ENDPOINTS

    def test_empty_and_zeros(self):
        t = st.empty((2, 3))
        self.assertIsInstance(t, torch.Tensor)
        self.assertEqual((t.dtype, tuple(t.shape), t.stride()), (torch.float32, (2, 3), (3, 1)))
        self.assertEqual(t.device.type, "cpu")
        self.assertEqual(t.tolist(), [[0.0] * 3] * 2)   # zero-filled, always
        z = st.zeros(4, dtype=torch.int64)
        self.assertEqual((z.dtype, z.tolist()), (torch.int64, [0, 0, 0, 0]))
        for name in TORCH_DTYPES:
            with self.subTest(dtype=name):
                x = st.zeros([3], dtype=getattr(torch, name))
                self.assertEqual(x.dtype, getattr(torch, name))
                self.assertEqual(st.zeros(2, dtype=name).dtype, getattr(torch, name))
        a = st.zeros((2, 2), dtype=np.int32, framework="numpy")
        self.assertIsInstance(a, np.ndarray)
        self.assertEqual((a.dtype, a.shape), (np.int32, (2, 2)))
        self.assertTrue(a.flags.writeable)
        a[1, 1] = 7
        self.assertEqual(a.tolist(), [[0, 0], [0, 7]])
        s = st.zeros(3, dtype="bfloat16", framework=None)
        self.assertIsInstance(s, st.SharedTensor)
        self.assertEqual((s.dtype, s.shape, s.device), ("bfloat16", (3,), "cpu"))
        like = st.empty_like(t.t())   # contiguous, whatever the source's strides
        self.assertEqual((tuple(like.shape), like.stride(), like.dtype), ((3, 2), (2, 1),
                                                                         torch.float32))
        self.assertIsInstance(st.zeros_like(a), np.ndarray)
        self.assertEqual(st.empty_like(a, dtype=np.float64).dtype, np.float64)

    def test_malformed_allocations(self):
        with self.assertRaises(TypeError):
            st.empty(3, dtype=torch.complex64)
        with self.assertRaises(TypeError):
            st.empty("3")
        with self.assertRaises(ValueError):
            st.empty((2, -1))
        with self.assertRaises(ValueError):
            st.empty(2, framework="jax")
        with self.assertRaises(ValueError):
            st.empty(2, device="cuda", framework="numpy")
        with self.assertRaises(st.InvalidArgumentError) as cm:
            st.empty(2, device="gpu")
        self.assertIn("cuda:N", str(cm.exception))
        if not torch.cuda.is_available():
            with self.assertRaises(st.CapabilityError):
                st.empty(2, device="cuda")

    def test_scale_writes_into_the_callers_tensor(self):
        t = counting((2, 3))
        r = self.c.call("scale", x=t, k=3.0)
        self.assertEqual(t.tolist(), [[0.0, 3.0, 6.0], [9.0, 12.0, 15.0]])
        # the reply is the same memory, mapped again
        self.assertIsInstance(r, torch.Tensor)
        self.assertEqual(r.tolist(), t.tolist())
        r[0, 0] = 42.0
        self.assertEqual(t[0, 0].item(), 42.0)
        self.c.call("scale", x=t)            # k defaults to 2.5
        self.assertEqual(t[1, 2].item(), 37.5)
        i = st.zeros(3, dtype=torch.int32)
        i.copy_(torch.tensor([1, 2, 3]))
        self.c.call("scale", x=i, k=2)       # an integer k, an int32 tensor
        self.assertEqual(i.tolist(), [2, 4, 6])

    def test_passed_again_without_its_descriptor(self):
        """The server keeps an allocation passed before (its argument cache):
        passed again, no descriptor goes, and the endpoint reads what the
        caller wrote since; once freed, the next request drops it there."""
        t = counting((4,))
        info = self.c.info()
        received, arenas = info["counters"]["fds_received"], info["arenas"]["count"]
        self.c.call("scale", x=t, k=2.0)
        t[0] = 5.0
        self.c.call("scale", x=t, k=2.0)
        self.assertEqual(t.tolist(), [10.0, 4.0, 8.0, 12.0])
        info = self.c.info()
        self.assertEqual(info["counters"]["fds_received"], received + 1)
        self.assertEqual(info["arenas"]["count"], arenas + 1)
        del t
        gc.collect()
        self.c.ping()                        # carries the forget
        self.assertEqual(self.c.info()["arenas"]["count"], arenas)

    def test_echo_returns_the_same_memory(self):
        t = counting((4,))
        e = self.c.call("echo", value=t)
        self.assertEqual(e.tolist(), [0.0, 1.0, 2.0, 3.0])
        e[2] = -7.0
        self.assertEqual(t[2].item(), -7.0)
        t[3] = 11.0
        self.assertEqual(e[3].item(), 11.0)

    def test_views_pass_as_they_are(self):
        base = counting((4, 6))
        v = base[1:3].t()                    # shape (6, 2), strides (1, 6), offset 6
        self.assertEqual((v.stride(), v.storage_offset()), ((1, 6), 6))
        g = self.c.call("geometry", x=v)
        self.assertEqual((g["shape"], g["stride"], g["first"]), ([6, 2], [1, 6], 6.0))
        self.assertEqual((g["dtype"], g["device"]), ("float32", "cpu"))
        # every other element of row 3, negated in place; nothing else moves
        self.c.call("scale", x=base[3, ::2], k=-1.0)
        want = [-i if i >= 18 and i % 2 == 0 else i for i in range(24)]
        self.assertEqual(base.flatten().tolist(), [float(w) for w in want])
        e = self.c.call("echo", value=v)
        self.assertEqual((tuple(e.shape), e.stride()), ((6, 2), (1, 6)))
        self.assertEqual(e[0, 1].item(), 12.0)
        flat = base.view(-1)[5:9]            # a storage offset of 5
        self.assertEqual(self.c.call("echo", value=flat).tolist(), [5.0, 6.0, 7.0, 8.0])

    def test_numpy_and_shared_tensor_arguments(self):
        a = st.zeros((2, 3), dtype=np.float64, framework="numpy")
        a[:] = np.arange(6).reshape(2, 3)
        self.assertEqual(self.c.call("sum64", x=a), 15.0)
        self.assertEqual(self.c.call("sum64", x=a.T), 15.0)      # transposed
        self.c.call("scale", x=a[:, 1], k=10)                   # byte strides 24
        self.assertEqual(a.tolist(), [[0, 10, 2], [3, 40, 5]])
        s = st.zeros(3, framework=None)
        torch.from_dlpack(s).copy_(torch.tensor([1.0, 2.0, 3.0]))
        self.c.call("scale", x=s, k=2.0)
        self.assertEqual(torch.from_dlpack(s).tolist(), [2.0, 4.0, 6.0])

    def test_submit_carries_tensor_arguments(self):
        t = counting((3,))
        tid = self.c.submit("scale", x=t, k=-1.0)
        self.assertEqual(self.c.wait(tid, timeout=10)["status"], "completed")
        self.c.result(tid)
        self.assertEqual(t.tolist(), [0.0, -1.0, -2.0])

    def test_refused_tensor_arguments(self):
        route = "allocate it with sharedtensor.empty(...) or copy it: " \
                "sharedtensor.empty_like(t).copy_(t)"
        foreign = torch.arange(3, dtype=torch.float32)
        for what, x in (("torch", foreign), ("result", self.c.call("arange", n=3))):
            with self.subTest(memory=what):
                with self.assertRaises(st.InvalidArgumentError) as cm:
                    self.c.call("scale", x=x)
                self.assertIn("argument 'x'", str(cm.exception))
                self.assertIn(route, str(cm.exception))
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("scale", x=np.ones(3, dtype=np.float32))
        self.assertIn("b = sharedtensor.empty_like(a); b[...] = a", str(cm.exception))
        # the documented way out
        copy = st.empty_like(foreign).copy_(foreign)
        self.c.call("scale", x=copy, k=2.0)
        self.assertEqual(copy.tolist(), [0.0, 2.0, 4.0])
        self.assertEqual(foreign.tolist(), [0.0, 1.0, 2.0])
        # the endpoint's declaration and its cache
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("sum64", x=st.zeros(4))
        self.assertIn("argument 'x' has dtype float32; the endpoint wants float64",
                      str(cm.exception))
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.call("keyed", x=copy)
        self.assertIn("cannot be part of a key", str(cm.exception))
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.invalidate("keyed", x=copy)
        self.assertIn("tensor arguments go only to call, submit and put", str(cm.exception))
        # what cannot be described at all
        with self.assertRaises(TypeError) as cm:
            self.c.call("echo", value=[copy])
        self.assertIn("keyword argument of its own", str(cm.exception))
        with self.assertRaises(TypeError):
            self.c.call("echo", value=torch.zeros(2, dtype=torch.complex64))
        with self.assertRaises(TypeError):
            self.c.call("echo", value=torch.zeros(2).to_sparse())
        self.assertGreater(self.c.ping(), 0)   # the connection is fine

    def test_torch_multiprocessing_queue_is_named(self):
        # A queue's pickler moves the tensor into torch's shared memory.
        x = st.empty((3,))
        q = torch.multiprocessing.get_context("fork").SimpleQueue()
        q.put(x)
        y = q.get()
        for t in (x, y):
            with self.assertRaises(st.InvalidArgumentError) as cm:
                self.c.call("scale", x=t)
            self.assertIn("torch.multiprocessing", str(cm.exception))
            self.assertIn("torch's own shared memory", str(cm.exception))

    def test_allocations_are_given_back(self):
        gc.collect()
        before = own_allocations()
        t = counting((8,))
        a = st.zeros(4, framework="numpy")
        view = a[1:]
        self.assertEqual(own_allocations(), before + 2)
        r = self.c.call("scale", x=t[2:], k=2.0)
        self.c.call("scale", x=view, k=2.0)
        del t, a
        gc.collect()
        # `view` holds its allocation; `r` is a window of t's allocation
        # (the reply named the argument: docs/protocol.md, "Tensor
        # arguments"), which it keeps
        self.assertEqual(own_allocations(), before + 2)
        self.assertEqual(r.tolist(), [4.0, 6.0, 8.0, 10.0, 12.0, 14.0])
        self.assertEqual(view.tolist(), [0.0, 0.0, 0.0])
        del r, view
        gc.collect()
        self.assertEqual(own_allocations(), before)


if __name__ == "__main__":
    unittest.main()
