"""Views of CUDA keys and objects (docs/views.md, section 1): zero-copy
views add no device memory (the server's cuda:0 used_bytes and
cuMemGetInfo, through torch.cuda.mem_get_info, stay where they were), the
shards of all ranks reassemble the tensor in another process, and a
materialized (contiguous) column shard equals torch's, copied once on the
server's GPU; a module copied in part comes back whole.
Skipped without a CUDA device."""
import collections
import os
import subprocess
import sys
import textwrap
import unittest

import st_fixture
from st_fixture import ServerTestCase

st_fixture.add_package_path()

MIB = 1 << 20


class GpuViewsTest(ServerTestCase):
    SERVER_OPTIONS = {"default_device": "socket"}
    ENDPOINTS = {
        "g.lua": """
return st.endpoint { name = "grid_cuda", device = "cuda", cache = true,
  build = function() return { m = st.arange { 4096 * 64, dtype = "float32" }:view { 4096, 64 } } end }
""",
        "m.lua": """
return st.endpoint { name = "module_cuda", device = "cuda", cache = true,
  build = function() return st.module {
    q = st.arange { 64 * 32, dtype = "float32" }:view { 64, 32 },
    b = st.arange { 32, dtype = "float32" } } end }
""",
    }

    DELETE_KEYS = True

    def setUp(self):
        super().setUp()
        import torch
        import sharedtensor as st
        self.torch, self.st = torch, st
        self.sd = collections.OrderedDict()
        w = st.empty((4099, 512), device="cuda:0")     # 8 MiB, rows that do not divide by 4
        w.copy_(torch.randn(4099, 512, device="cuda:0"))
        self.sd["w"] = w
        torch.cuda.synchronize()
        self.c.put("gw", self.sd)

    def used(self):
        return self.c.info()["memory"]["cuda:0"]["used_bytes"]

    def test_zero_copy_views_add_no_device_memory(self):
        torch = self.torch
        w = self.sd["w"]
        self.c.get("gw", view="w:narrow(0,0,1)")          # the arena mapped once
        torch.cuda.synchronize()
        used, (free, _) = self.used(), torch.cuda.mem_get_info()
        views = [self.c.get("gw", view="w:shard(0,%d,4)" % r)["w"] for r in range(4)]
        views += [self.c.get("gw", view="w:shard(1,1,2)|transpose(0,1)")["w"]]
        torch.cuda.synchronize()
        self.assertEqual(self.used(), used)
        self.assertLess(free - torch.cuda.mem_get_info()[0], 2 * MIB)
        for r, part in enumerate(torch.tensor_split(w, 4)):
            self.assertTrue(torch.equal(views[r], part))
        self.assertTrue(torch.equal(views[4], torch.tensor_split(w, 2, dim=1)[1].t()))

    def test_shards_reassemble_in_another_process(self):
        prog = textwrap.dedent("""
            import sys, torch, sharedtensor as st
            c = st.Client(path=%r)
            w = c.get("gw")["w"]
            for dim, world in ((0, 4), (0, 7), (1, 3)):
                parts = [c.get("gw", view="w:shard(%%d,%%d,%%d)" %% (dim, r, world))["w"]
                         for r in range(world)]
                assert parts[0].is_cuda
                assert torch.equal(torch.cat(parts, dim=dim), w), (dim, world)
            print("ok")
        """ % self.srv.socket)
        envv = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                           env=envv, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_contiguous_shard_is_copied_once_on_the_gpu(self):
        torch = self.torch
        spec = "w:shard(1,1,3)|contiguous"
        used = self.used()
        a = self.c.get("gw", view=spec)["w"]
        want = torch.tensor_split(self.sd["w"], 3, dim=1)[1]
        self.assertTrue(a.is_cuda and a.is_contiguous())
        self.assertTrue(torch.equal(a, want))
        grew = self.used() - used
        self.assertGreaterEqual(grew, want.numel() * 4)
        b = self.c.get("gw", view=spec)["w"]
        self.assertEqual(b.data_ptr(), a.data_ptr())    # the same copy
        self.assertEqual(self.used() - used, grew)
        # An object's column shard, copied by the worker's gather kernel.
        h = self.c.call("grid_cuda", view="m:shard(1,0,2)|contiguous")
        m = torch.arange(4096 * 64, dtype=torch.float32, device="cuda:0").reshape(4096, 64)
        self.assertTrue(torch.equal(h.value["m"], m[:, :32]))
        self.c.invalidate_all("grid_cuda")

    def test_a_module_copied_in_part_comes_back_whole(self):
        # A module's tensors share one arena: the copy takes them all.
        torch = self.torch
        got = self.c.call("module_cuda", view="q:transpose(0,1)|contiguous").value
        q = torch.arange(64 * 32, dtype=torch.float32, device="cuda:0").reshape(64, 32)
        b = torch.arange(32, dtype=torch.float32, device="cuda:0")
        self.assertTrue(got["q"].is_cuda and got["q"].is_contiguous())
        self.assertTrue(torch.equal(got["q"], q.t()))
        self.assertTrue(torch.equal(got["b"], b))
        self.c.invalidate_all("module_cuda")


if __name__ == "__main__":
    unittest.main()
