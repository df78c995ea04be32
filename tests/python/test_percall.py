"""The per-call shortcuts of sharedtensor keep the semantics of a fresh
conversion, against a real stserver (CPU tensors):

  - reused torch tensors (an object converted again in this process) are
    the live tensors of that same object, never those of an object
    released, invalidated or replaced, and the reuse cache keeps nothing
    alive;
  - kept arenas (mappings left mapped after their last result) are served
    again only for the same allocation, hold what the bound allows and
    no more, and go when the bound is lowered;
  - values read whole through st_result_marshal equal the node-by-node
    conversion, including what marshal cannot carry (invalid UTF-8).
"""
import gc
import os
import math
import unittest
from unittest import mock
import weakref

import st_fixture

st_fixture.add_package_path()

torch = st_fixture.optional_import("torch")

import sharedtensor as st  # noqa: E402
from sharedtensor import _lib, client as _client, convert as _cv  # noqa: E402
from sharedtensor.args import Args  # noqa: E402

ENDPOINTS = {
    "e.lua": """
return {
  st.endpoint { name = "cached", cache = true, params = { n = 8, v = 1 },
    build = function(a) return st.full { a.n, value = a.v } end },
  st.endpoint { name = "mod", cache = true, managed = true, params = { v = 1 },
    build = function(a)
      return st.module({ { "w", st.full { 3, value = a.v } }, { "b", st.zeros { 2 } } },
                       { arch = "m", v = a.v })
    end },
  st.endpoint { name = "fresh", params = { v = 0, n = 4 },
    build = function(a) return st.full { a.n, value = a.v } end },
  st.endpoint { name = "echo", params = { value = st.required },
    build = function(a) return a.value end },
  st.endpoint { name = "bad_utf8", params = {},
    build = function(a) return { s = "ok\\255\\254", t = st.arange { 2, dtype = "float32" } } end },
  st.endpoint { name = "mixed", params = {},
    build = function(a)
      local t = st.arange { 6, dtype = "float32" }
      return { one = "one", list = { 1, t }, big = 2^53, neg = -2^40,
               inner = { m = st.module({ { "x", t } }) } }
    end },
}
""",
}


@unittest.skipIf(torch is None, "torch is needed")
class ReuseTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def setUp(self):
        super().setUp()
        self.c.invalidate_all("cached")
        self.c.invalidate_all("mod")

    def test_a_live_object_gives_the_same_tensors(self):
        h1 = self.c.call("cached", n=8, v=2)
        h2 = self.c.call("cached", n=8, v=2)
        self.assertEqual(h1.object_id, h2.object_id)
        self.assertIs(h2.value, h1.value)
        self.assertEqual(h2.value.tolist(), [2.0] * 8)
        # another object of the same endpoint is another conversion
        h3 = self.c.call("cached", n=8, v=3)
        self.assertIsNot(h3.value, h1.value)
        self.assertEqual(h3.value.tolist(), [3.0] * 8)

    def test_a_module_is_a_new_dict_of_the_same_tensors(self):
        with self.c.call("mod", v=5) as h1, self.c.call("mod", v=5) as h2:
            self.assertIsNot(h1.value, h2.value)
            self.assertEqual(list(h2.value), ["w", "b"])
            self.assertIs(h2.value["w"], h1.value["w"])
            self.assertEqual(h2.value.metadata, {"arch": "m", "v": 5})
            # changing one result's dict does not change the next
            del h1.value["w"]
            h1.value.metadata["arch"] = "changed"
            with self.c.call("mod", v=5) as h3:
                self.assertEqual(list(h3.value), ["w", "b"])
                self.assertEqual(h3.value.metadata["arch"], "m")
                self.assertEqual(h3.value["w"].tolist(), [5.0] * 3)

    def test_a_replaced_object_is_not_served_stale(self):
        h1 = self.c.call("cached", n=4, v=1)
        h1.value.fill_(7.0)          # the object's memory, written
        self.assertTrue(self.c.invalidate("cached", n=4, v=1))
        h2 = self.c.call("cached", n=4, v=1)       # a new build: a new object
        self.assertNotEqual(h2.object_id, h1.object_id)
        self.assertIsNot(h2.value, h1.value)
        self.assertEqual(h2.value.tolist(), [1.0] * 4)
        self.assertEqual(h1.value.tolist(), [7.0] * 4)

    def test_a_released_and_destroyed_object_is_not_served_stale(self):
        with self.c.call("mod", v=9) as h1:
            w1 = h1.value["w"]
        self.c.invalidate_all("mod")      # no lease, not cached: destroyed
        with self.c.call("mod", v=9) as h2:
            self.assertNotEqual(h2.object_id, h1.object_id)
            self.assertIsNot(h2.value["w"], w1)
            self.assertNotEqual(h2.value["w"].data_ptr(), 0)

    def test_the_cache_keeps_nothing_alive(self):
        st.keep_results(0, 0)   # kept results (below) off
        h = self.c.call("cached", n=8, v=4)
        ref = weakref.ref(h.value)
        key = (h.server_id.encode(), h.object_id)
        self.assertIn(key, _cv._reuse)
        mapped = _lib.open_cache_stats()[0]
        del h
        gc.collect()
        self.assertIsNone(ref())
        self.assertEqual(_lib.open_cache_stats()[0], mapped - 1)
        self.assertNotIn(key, _cv._reuse)
        # and called again, a new conversion with the object's values
        h = self.c.call("cached", n=8, v=4)
        self.assertEqual(h.value.tolist(), [4.0] * 8)

    def test_shared_tensors_are_not_remembered(self):
        h1 = self.c.call("cached", n=8, v=6, as_torch=False)
        h2 = self.c.call("cached", n=8, v=6)
        self.assertIsInstance(h1.value, st.SharedTensor)
        self.assertIsInstance(h2.value, torch.Tensor)
        self.assertEqual(h2.value.data_ptr(), h1.value.data_ptr)


@unittest.skipIf(torch is None, "torch is needed")
class KeptResultsTest(st_fixture.ServerTestCase):
    """Dropped results of cached objects kept within keep_results'
    bound (docs/python.md, "Kept results")."""
    ENDPOINTS = ENDPOINTS

    def setUp(self):
        super().setUp()
        self.c.invalidate_all("cached")
        self.c.invalidate_all("mod")

    def dropped(self, **args):
        """A weak reference to the value of a cached call, dropped."""
        h = self.c.call("cached", **args)
        ref = weakref.ref(h.value)
        del h
        gc.collect()
        return ref

    def test_dropped_and_called_again_gives_the_same_tensor(self):
        ref = self.dropped(n=8, v=3)
        self.assertIsNotNone(ref())
        self.assertEqual(st.kept_results()[0], 1)
        free = mock.Mock(wraps=_lib.lib.st_result_free)
        with mock.patch.object(_lib.lib, "st_result_free", free):
            h = self.c.call("cached", n=8, v=3)
        self.assertIs(h.value, ref())
        self.assertEqual(free.call_count, 0)   # a `same` reply, lent
        self.assertEqual(h.value.tolist(), [3.0] * 8)

    def test_the_count_bound_keeps_the_most_recent(self):
        st.keep_results(2, 1 << 30)
        refs = [self.dropped(n=8, v=v) for v in range(4)]
        gc.collect()
        self.assertEqual(st.kept_results()[0], 2)
        self.assertEqual([r() is not None for r in refs], [False, False, True, True])
        # used again, the oldest kept one becomes the most recent
        self.c.call("cached", n=8, v=2)
        self.dropped(n=8, v=0)
        self.assertEqual([r() is not None for r in refs], [False, False, True, False])

    def test_the_byte_bound_admits_no_larger_object(self):
        h = self.c.call("cached", n=8, v=1)
        nbytes = h.bytes
        del h
        st.keep_results(8, nbytes - 1)
        self.assertEqual(st.kept_results(), (0, 0))
        self.assertIsNone(self.dropped(n=8, v=1)())
        st.keep_results(8, 2 * nbytes)
        self.dropped(n=8, v=1)
        self.dropped(n=8, v=2)
        ref = self.dropped(n=8, v=3)
        self.assertEqual(st.kept_results(), (2, 2 * nbytes))
        self.assertIsNotNone(ref())

    def test_managed_results_are_never_kept(self):
        with self.c.call("mod", v=4) as h:
            ref = weakref.ref(h.value["w"])
        del h
        gc.collect()
        self.assertIsNone(ref())
        self.assertEqual(st.kept_results(), (0, 0))

    def test_turning_it_off_lets_them_go_now(self):
        ref = self.dropped(n=8, v=5)
        self.assertEqual(st.keep_results(0, 0), (8, 256 << 20))
        gc.collect()
        self.assertIsNone(ref())
        self.assertEqual(st.kept_results(), (0, 0))
        with self.assertRaises(ValueError):
            st.keep_results(-1, 0)

    def test_a_replaced_object_is_not_served_from_the_kept_one(self):
        ref = self.dropped(n=4, v=6)
        ref().fill_(9.0)                 # the object's memory, written
        self.assertTrue(self.c.invalidate("cached", n=4, v=6))
        h = self.c.call("cached", n=4, v=6)
        self.assertIsNot(h.value, ref())
        self.assertEqual(h.value.tolist(), [6.0] * 4)

    def test_another_connection_reuses_it_and_then_costs_one_crossing(self):
        ref = self.dropped(n=8, v=7)
        other = st.Client(path=self.srv.socket)
        try:
            h = other.call("cached", n=8, v=7)    # a full reply: reused tensors
            self.assertIs(h.value, ref())
            free = mock.Mock(wraps=_lib.lib.st_result_free)
            with mock.patch.object(_lib.lib, "st_result_free", free):
                for _ in range(5):
                    self.assertIs(other.call("cached", n=8, v=7).value, ref())
            self.assertEqual(free.call_count, 0)
        finally:
            other.close()


@unittest.skipIf(torch is None, "torch is needed")
class KeptArenaTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    # Kept arenas are arenas of their own: a client with the result pool
    # off receives fresh results that way (pooled regions are never kept).
    def setUp(self):
        os.environ["ST_CLIENT_POOL"] = "0"
        super().setUp()
        st.keep_results(0, 0)   # dropped results reach the kept arenas

    def tearDown(self):
        os.environ.pop("ST_CLIENT_POOL", None)
        _lib.keep_arenas(16, 256 << 20)
        super().tearDown()

    def test_the_bound_is_enforced(self):
        _lib.keep_arenas(0, 0)
        self.assertEqual(_lib.kept_arenas(), (0, 0))
        _lib.keep_arenas(2, 1 << 30)
        # plain results never come back: none is kept
        for v in range(5):
            self.assertEqual(self.c.call("fresh", v=v).tolist(), [float(v)] * 4)
            gc.collect()
        self.assertEqual(_lib.kept_arenas(), (0, 0))
        # objects' arenas are kept, at most two
        self.c.invalidate_all("cached")
        for v in range(5):
            h = self.c.call("cached", n=8, v=v)
            self.assertEqual(h.value.tolist(), [float(v)] * 8)
            del h
            gc.collect()
        n, b = _lib.kept_arenas()
        self.assertEqual(n, 2)
        self.assertGreater(b, 0)
        # a bound in bytes below one arena keeps none
        _lib.keep_arenas(16, b // 2 - 1)
        self.assertEqual(_lib.kept_arenas(), (0, 0))
        h = self.c.call("cached", n=8, v=1)
        del h
        gc.collect()
        self.assertEqual(_lib.kept_arenas(), (0, 0))

    def test_only_the_same_allocation_is_served_again(self):
        _lib.keep_arenas(0, 0)
        _lib.keep_arenas(16, 1 << 30)
        # fresh results: each its own allocation, each with its own values
        for v in range(20):
            t = self.c.call("fresh", v=v, n=16)
            self.assertEqual(t.tolist(), [float(v)] * 16)
            del t
            gc.collect()
        # a cached object dropped and called again: its kept mapping
        self.c.invalidate_all("cached")
        h = self.c.call("cached", n=8, v=2)
        h.value.fill_(11.0)
        del h
        gc.collect()
        _, reused0 = _lib.open_cache_stats()
        h = self.c.call("cached", n=8, v=2)
        self.assertEqual(_lib.open_cache_stats()[1], reused0 + 1)
        self.assertEqual(h.value.tolist(), [11.0] * 8)
        # replaced by a new object: a new allocation, not the kept one
        ptr = h.value.data_ptr()
        del h
        gc.collect()
        self.assertTrue(self.c.invalidate("cached", n=8, v=2))
        h = self.c.call("cached", n=8, v=2)
        self.assertEqual(h.value.tolist(), [2.0] * 8)
        self.assertNotEqual(h.value.data_ptr(), ptr)


@unittest.skipIf(torch is None, "torch is needed")
class MarshalTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def slow(self, name, **args):
        """The node-by-node conversion of the same reply."""
        out = _client._VOIDP()
        with Args(args) as a:
            self.c._do(_lib.lib.st_client_call, name.encode(), a.ptr, _client._byref(out))
        return st_fixture.slow_value(out.value)

    def test_plain_values_equal_the_slow_conversion(self):
        values = [None, True, False, 0, -1, 2 ** 31, -2 ** 31 - 1, 2 ** 62, -2 ** 63,
                  2 ** 63 - 1, 1.5, float("inf"), -0.0, "", "h\u00e9llo \U0001f600", "a\x00b",
                  b"\x00\xff", [1, [2, [3, None]]], {"k": {"j": [1.25, "x"]}}]
        for v in values:
            with self.subTest(value=v):
                got = self.c.call("echo", value=v)
                want = self.slow("echo", value=v)
                self.assertEqual(got, want)
                self.assertEqual(type(got), type(want))
        nan = self.c.call("echo", value=float("nan"))
        self.assertTrue(math.isnan(nan))

    def test_large_values_equal_the_slow_conversion(self):
        # Past the marshal writer's first 4 KiB and its doublings: strings
        # that straddle a boundary, many small nodes, one long string.
        values = [["x" * n for n in range(0, 300, 7)],
                  {"k%d" % i: [i, -i * 1e9, "v" * (i % 13)] for i in range(500)},
                  "\u00e9" * 9000]
        for v in values:
            with self.subTest(size=len(str(v))):
                got = self.c.call("echo", value=v)
                self.assertEqual(got, self.slow("echo", value=v))
                self.assertEqual(got, v)

    def test_a_repeated_map_key_is_one_string(self):
        # st_result_marshal writes a key once and refers back to it after:
        # marshal.loads makes (and hashes) one str for every map that
        # repeats it.
        v = self.c.call("echo", value=[{"alpha": 1, "beta": 2}, {"beta": 3, "alpha": 4}])
        self.assertEqual(v, [{"alpha": 1, "beta": 2}, {"beta": 3, "alpha": 4}])
        first = {k: k for k in v[0]}   # Lua tables keep no key order
        for k in v[1]:
            self.assertIs(k, first[k])
        info = self.c.info()
        firsts = [next(iter(m)) for m in info["methods"].values()]
        self.assertGreater(len(firsts), 1)
        for k in firsts:
            self.assertIs(k, firsts[0])
        # Keys past the writer's 256 references, and long ones, are
        # written whole: the same values either way.
        many = {"k%d" % i: {"k%d" % i: i} for i in range(600)}
        many["x" * 100] = {"x" * 100: 1}
        self.assertEqual(self.c.call("echo", value=many), many)

    def test_a_module_value_in_a_map_keeps_its_short_names(self):
        v = self.c.call("mixed")
        again = self.c.call("mixed")
        for m in (v["inner"]["m"], again["inner"]["m"]):
            self.assertIsInstance(m, st.Module)
            self.assertEqual(list(m), ["x"])
            self.assertEqual(m.metadata, {})

    def test_invalid_utf8_falls_back_with_replacement(self):
        v = self.c.call("bad_utf8")
        self.assertEqual(v["s"], "ok\ufffd\ufffd")
        self.assertEqual(v["t"].tolist(), [0.0, 1.0])
        self.assertEqual(v["s"], self.slow("bad_utf8")["s"])

    def test_tensors_in_nested_values(self):
        v = self.c.call("mixed")
        w = self.slow("mixed")
        self.assertEqual(sorted(v), sorted(w))
        self.assertEqual(v["big"], 2 ** 53)
        self.assertEqual(type(v["big"]), type(w["big"]))
        self.assertEqual(v["neg"], -2 ** 40)
        self.assertEqual(v["one"], "one")
        self.assertEqual(v["list"][0], 1)
        self.assertEqual(v["list"][1].tolist(), list(map(float, range(6))))
        self.assertIsInstance(v["inner"]["m"], st.Module)
        self.assertEqual(list(v["inner"]["m"]), list(w["inner"]["m"]))
        self.assertEqual(v["inner"]["m"]["x"].tolist(), w["inner"]["m"]["x"].tolist())


if __name__ == "__main__":
    unittest.main()
