"""Views on request (docs/views.md, section 1) from Python against a real
stserver, CPU tensors, the reader in a process of its own:

  - each view kind equals torch's operation on a copy: narrow, slice with
    a step, transpose, permute, negative dims, compositions, selectors;
  - the shards of all ranks reassemble the tensor, for a size that does
    not divide and for world > n (torch.tensor_split's rule);
  - a zero-copy view maps the publisher's memory (a later write is seen)
    and adds no bytes to the server's ledger;
  - `contiguous` materializes once: a derived object, cached, shared by a
    second request (same object, same arena); a new version drops it;
  - call(view=...) of a cached and of a plain endpoint;
  - a module some of whose tensors are copied comes back whole, every
    tensor copied (a module's tensors share one arena);
  - clear errors: a bad spec, a bound, a selector that selects nothing.
"""
import collections
import os
import subprocess
import sys
import textwrap
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402  (run_tests.py skips without torch)

import sharedtensor as st  # noqa: E402

M = "st.arange { a.rows * a.cols }:view { a.rows, a.cols }"
ENDPOINTS = {
    "c.lua": """
return st.endpoint { name = "cached_m", cache = true, params = { rows = 6, cols = 10 },
  build = function(a) return { m = %s } end }
""" % M,
    "p.lua": """
return st.endpoint { name = "plain_m", params = { rows = 6, cols = 10 },
  build = function(a) return { m = %s } end }
""" % M,
    "s.lua": """
return st.endpoint { name = "sd_module",
  build = function() return st.module {
    ["q.weight"] = st.arange { 12 }:view { 3, 4 }, ["k.weight"] = st.arange { 8 }:view { 2, 4 },
    bias = st.arange { 5 } } end }
""",
}


def publish_state():
    """l0.weight 7 x 10, l1.weight 6 x 4, l0.bias 10 (arange values)."""
    sd = collections.OrderedDict()
    for name, shape in (("l0.weight", (7, 10)), ("l1.weight", (6, 4)), ("l0.bias", (10,))):
        t = st.empty(shape)
        n = 1
        for s in shape:
            n *= s
        t.copy_(torch.arange(n, dtype=torch.float32).reshape(shape) + len(name))
        sd[name] = t
    sd["step"] = 7
    return sd


def in_child(socket, code):
    """Runs `code` in a fresh Python with `c` a Client of the server and
    `sd` the expected state dict (publish_state's values, torch's own
    memory); its return code and output."""
    prog = ("import sys\nsys.path.insert(0, %r)\nsys.path.insert(0, %r)\n"
            "import torch\nimport sharedtensor as st\nfrom test_views import publish_state\n"
            "c = st.Client(path=%r)\n"
            "sd = {k: (v.clone() if isinstance(v, torch.Tensor) else v)\n"
            "      for k, v in publish_state().items()}\n"
            % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"),
               os.path.dirname(os.path.abspath(__file__)), socket)) + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def derived(c, owner):
    return [o for o in c.objects() if o["endpoint"] == owner]


class ViewsTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS
    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 1024 * 1024 }, "}
    DELETE_KEYS = True

    def setUp(self):
        super().setUp()
        self.sd = publish_state()
        self.c.put("sd", self.sd)

    def test_each_view_kind_equals_torch_in_another_process(self):
        rc, out = in_child(self.srv.socket, """
            w, b, w1 = sd["l0.weight"], sd["l0.bias"], sd["l1.weight"]
            def one(spec, name="l0.weight"):
                v = c.get("sd", view=spec)
                assert v.version == 1 and v["step"] == 7, v
                return v[name]
            def same(got, want, what):
                assert got.shape == want.shape and got.stride() == want.stride() \\
                    and torch.equal(got, want), (what, got, want)
            same(one("l0.weight:narrow(0,1,3)"), w.narrow(0, 1, 3), "narrow")
            same(one("l0.weight:slice(1,1,9,3)"), w[:, 1:9:3], "slice step")
            same(one("l0.weight:slice(0,-3,100)"), w[-3:], "slice clamped")
            same(one("l0.weight:transpose(0,1)"), w.t(), "transpose")
            same(one("l0.weight:permute(-1,0)"), w.permute(1, 0), "permute")
            same(one("l0.weight:narrow(-1,-4,2)"), w[:, 6:8], "negative dims")
            same(one("l0.weight:shard(1,1,2)|transpose(0,1)"),
                 torch.tensor_split(w, 2, dim=1)[1].t(), "composition")
            same(one("l0.weight:transpose(0,1)|slice(0,0,10,2)|narrow(1,2,3)"),
                 w.t()[0:10:2].narrow(1, 2, 3), "three steps")
            # selectors: each tensor takes the first rule that selects it
            v = c.get("sd", view="*.weight:shard(0,1,2);l0.*:narrow(0,0,1)")
            same(v["l0.weight"], torch.tensor_split(w, 2)[1], "glob 1")
            same(v["l1.weight"], torch.tensor_split(w1, 2)[1], "glob 2")
            same(v["l0.bias"], b.narrow(0, 0, 1), "second rule")
            v = c.get("sd", view="l?.weight:narrow(0,0,1)")
            same(v["l0.bias"], b, "untouched")
            print("ok")
        """)
        self.assertEqual(rc, 0, out)
        self.assertIn("ok", out)

    def test_shards_of_all_ranks_reassemble(self):
        rc, out = in_child(self.srv.socket, """
            w = sd["l0.weight"]     # 7 rows, 10 columns
            for dim, world in ((0, 1), (0, 2), (0, 3), (0, 7), (0, 9), (1, 3), (1, 4), (-1, 12)):
                parts = [c.get("sd", view="l0.weight:shard(%d,%d,%d)" % (dim, r, world))
                         ["l0.weight"] for r in range(world)]
                want = torch.tensor_split(w, world, dim=dim)
                for r in range(world):
                    assert torch.equal(parts[r], want[r]), (dim, world, r)
                assert torch.equal(torch.cat(parts, dim=dim), w), (dim, world)
            print("ok")
        """)
        self.assertEqual(rc, 0, out)

    def used(self):
        return self.c.info()["memory"]["cpu"]["used_bytes"]

    def test_zero_copy_shares_the_publishers_memory(self):
        before = self.used()
        v = self.c.get("sd", view="l0.weight:shard(1,1,2)")["l0.weight"]
        self.assertFalse(v.is_contiguous())
        self.assertEqual(self.used(), before)        # no new bytes on the server
        self.sd["l0.weight"][3, 7] = -1.0             # the publisher writes
        self.assertEqual(v[3, 2].item(), -1.0)       # the view sees it (column 5 + 2)
        rc, out = in_child(self.srv.socket, """
            v = c.get("sd", view="l0.weight:shard(1,1,2)")["l0.weight"]
            assert v[3, 2].item() == -1.0, v
            print("ok")
        """)
        self.assertEqual(rc, 0, out)
        self.assertEqual(derived(self.c, "key:sd"), [])

    def test_contiguous_materializes_once_and_is_cached(self):
        spec = "l0.weight:shard(1,0,2)|contiguous;l0.bias:contiguous"
        before = self.used()
        v = self.c.get("sd", view=spec)
        w = v["l0.weight"]
        self.assertTrue(w.is_contiguous())
        self.assertTrue(torch.equal(w, torch.tensor_split(self.sd["l0.weight"], 2, dim=1)[0]))
        self.assertTrue(torch.equal(v["l0.bias"], self.sd["l0.bias"]))  # contiguous: no copy
        (obj,) = derived(self.c, "key:sd")
        self.assertEqual(obj["cache_key"], "v1|l0.weight:shard(1,0,2)|contiguous;"
                                           "l0.bias:contiguous")
        self.assertTrue(obj["cached"])
        grew = self.used() - before
        self.assertGreaterEqual(grew, 7 * 5 * 4)      # the copy is charged to the budget
        # A second request, from another process: the same copy.
        rc, out = in_child(self.srv.socket, """
            w = c.get("sd", view=%r)["l0.weight"]
            assert w.is_contiguous() and torch.equal(
                w, torch.tensor_split(sd["l0.weight"], 2, dim=1)[0]), w
            print("ok")
        """ % spec)
        self.assertEqual(rc, 0, out)
        again = self.c.get("sd", view=spec)["l0.weight"]
        self.assertEqual(again.data_ptr(), w.data_ptr())   # the same arena, mapped once
        (obj2,) = derived(self.c, "key:sd")
        self.assertEqual(obj2["id"], obj["id"])
        self.assertEqual(self.used() - before, grew)
        # The copy is a snapshot: a new version drops it.
        self.c.put("sd", publish_state())
        self.assertEqual(derived(self.c, "key:sd"), [])
        v2 = self.c.get("sd", view=spec)
        self.assertEqual(v2.version, 2)
        (obj3,) = derived(self.c, "key:sd")
        self.assertTrue(obj3["cache_key"].startswith("v2|"))
        self.c.delete("sd")
        self.assertEqual(derived(self.c, "key:sd"), [])

    def test_call_with_a_view(self):
        m = torch.arange(60, dtype=torch.float32).reshape(6, 10)
        for name in ("cached_m", "plain_m"):
            got = self.c.call(name, view="m:shard(0,1,4)")
            got = got.value if hasattr(got, "value") else got
            self.assertTrue(torch.equal(got["m"], torch.tensor_split(m, 4)[1]), name)
            got = self.c.call(name, view="m:transpose(0,1)|narrow(0,2,3)|contiguous")
            got = got.value if hasattr(got, "value") else got
            self.assertTrue(got["m"].is_contiguous())
            self.assertTrue(torch.equal(got["m"], m.t().narrow(0, 2, 3)), name)
        (obj,) = [o for o in self.c.objects() if o["endpoint"] == "cached_m"]
        self.assertEqual(len(derived(self.c, "object:%d" % obj["id"])), 1)
        self.assertEqual(len([o for o in self.c.objects()
                              if o["endpoint"].startswith("object:")]), 1)   # plain: not kept
        self.c.invalidate_all("cached_m")

    def test_a_module_copied_in_part_comes_back_whole(self):
        # A module's tensors share one arena: copying one copies them all
        # (a plain endpoint: its copy is cached nowhere).
        want = {"q.weight": torch.arange(12).reshape(3, 4),
                "k.weight": torch.arange(8).reshape(2, 4),
                "bias": torch.arange(5)}
        for spec, q, k in (
                ("q.weight:transpose(0,1)|contiguous", want["q.weight"].t(), want["k.weight"]),
                ("q.weight:transpose(0,1)|contiguous;k.weight:transpose(0,1)",
                 want["q.weight"].t(), want["k.weight"].t())):
            got = self.c.call("sd_module", view=spec)
            self.assertIsInstance(got, st.Module)
            self.assertEqual(list(got), list(self.c.call("sd_module")), spec)
            for name, t in (("q.weight", q), ("k.weight", k), ("bias", want["bias"])):
                self.assertTrue(got[name].is_contiguous(), (spec, name))
                self.assertTrue(torch.equal(got[name], t), (spec, name))

    def test_errors_are_clear(self):
        cases = [
            ("l0.weight:shard(0,5,4)",
             "shard(0,5,4): rank 5 is not below world 4 (tensor 'l0.weight')"),
            ("l0.weight:narrow(0,5,3)", "narrow(0,5,3): start 5 + length 3 exceeds size 7"),
            ("w:narrow(0,0,1)", "view: rule 1 ('w') selects no tensor (tensors: l0.weight,"),
            ("l0.weight:frobnicate(1)", "view: rule 1, step 1 at byte 10: unknown step"),
            ("l0.weight:permute(0)", "permute(0): expected 2 dims, got 1"),
            ("  ", "view: the spec is empty"),
        ]
        for spec, part in cases:
            with self.assertRaises(st.InvalidArgumentError, msg=spec) as e:
                self.c.get("sd", view=spec)
            self.assertIn(part, str(e.exception))
        with self.assertRaises(st.InvalidArgumentError) as e:
            self.c.call("plain_m", view="m:shard(2,0,2)")
        self.assertIn("(tensor 'm')", str(e.exception))
        with self.assertRaises(TypeError):
            self.c.get("sd", view=3)
        self.c.ping()


if __name__ == "__main__":
    unittest.main()
