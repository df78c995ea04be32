"""sharedtensor (python/) against a real stserver, on CPU tensors.

Runs under Debian's python3 with torch 1.13 and numpy 1.24, which know only
legacy DLPack capsules; run_tests.py skips (77) without them.
"""
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
    "slow.lua": """
return st.endpoint { name = "slow", execution = "task", params = { n = 3 },
  build = function(a) st.progress(1.0, "done"); return st.arange { a.n } end }
""",
}

# Every dtype the server knows that torch 1.13 knows as well.
TORCH_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                "float32", "float64"]


@unittest.skipIf(torch is None, "torch and numpy are needed")
class SharedTensorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = st_fixture.Server(ENDPOINTS)

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

    def test_ping_info_endpoints(self):
        self.assertGreater(self.c.ping(), 0)
        info = self.c.info()
        self.assertIsInstance(info, dict)
        self.assertEqual(self.c.server_pid, self.srv.proc.pid)
        names = repr(self.c.endpoints())
        for name in ("arange", "linear", "cached"):
            self.assertIn(name, names)

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

    def test_tasks(self):
        tid = self.c.submit("slow", n=4)
        info = self.c.wait(tid, timeout=10)
        self.assertEqual(info["status"], "completed")
        self.assertEqual(self.c.result(tid).tolist(), [0, 1, 2, 3])
        self.assertEqual(self.c.cancel(tid)["status"], "completed")

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


if __name__ == "__main__":
    unittest.main()
