"""Client.get_into (docs/views.md, section 2) against a real stserver, CPU
tensors, the publisher in a process of its own (the CUDA variant is
test_gpu_into.py):

  - a key's state dict lands in the reader's own tensors, equal, by name;
    the version asked for is the one copied and returned;
  - an nn.Module's parameters and buffers are loaded by name, in place
    (their storage stays the module's);
  - every difference (missing, extra, shape, dtype) is listed and nothing
    is copied: the destinations are unchanged after a refused call;
  - dtype_cast=True casts in the copy;
  - a second get_into maps nothing new (the kept source is reused);
  - a cached object's result (a Handle) is copied from too.
"""
import collections
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402  (run_tests.py skips without torch)

import sharedtensor as st  # noqa: E402
from sharedtensor import _lib  # noqa: E402
from test_keys import in_child  # noqa: E402

ENDPOINTS = {
    "w.lua": """
return st.endpoint { name = "weights", cache = true,
  build = function() return { w = st.arange { 6 }:to("float32"):reshape { 2, 3 } } end }
""",
}

# The publisher's model: what a child process builds (seed 0) and puts.
MODEL = """
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
m[1].running_mean.fill_(0.5)
"""


def model(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    if seed == 0:
        m[1].running_mean.fill_(0.5)
    return m


def open_cache_stats():
    import ctypes
    mapped, reused = ctypes.c_size_t(), ctypes.c_uint64()
    _lib.lib.st_open_cache_stats(ctypes.byref(mapped), ctypes.byref(reused))
    return mapped.value, reused.value


class GetIntoTest(st_fixture.KeysTestCase):
    ENDPOINTS = ENDPOINTS

    def publish(self, code):
        rc, out = in_child(self.srv.socket, code)
        self.assertEqual(rc, 0, out)

    def publish_steps(self, key, steps, version=1):
        """Puts steps 1..steps as versions version, version + 1, ..."""
        self.publish("""
for step in range(1, %d):
    sd = {"w": st.empty((4, 8)), "b": st.empty((8,)), "n": st.empty((3,), dtype="int32")}
    sd["w"].copy_(torch.arange(32, dtype=torch.float32).reshape(4, 8) * step)
    sd["b"].fill_(step)
    sd["n"].copy_(torch.arange(3, dtype=torch.int32) + step)
    sd["step"] = step
    assert c.put(%r, sd) == step + %d
""" % (steps + 1, key, version - 1))

    def dests(self):
        return collections.OrderedDict(
            [("n", torch.full((3,), -1, dtype=torch.int32)),
             ("w", torch.full((4, 8), -1.0)), ("b", torch.full((8,), -1.0))])

    def assertHolds(self, d, step):
        self.assertTrue(torch.equal(d["w"], torch.arange(32.0).reshape(4, 8) * step))
        self.assertTrue(torch.equal(d["b"], torch.full((8,), float(step))))
        self.assertTrue(torch.equal(d["n"], torch.arange(3, dtype=torch.int32) + step))

    def assertUntouched(self, d):
        for name, t in self.dests().items():
            self.assertTrue(torch.equal(d[name], t), name)

    def test_a_key_lands_in_the_readers_tensors(self):
        self.publish_steps("m/a", 2)
        d = self.dests()
        ptrs = {k: t.data_ptr() for k, t in d.items()}
        self.assertEqual(self.c.get_into("m/a", d), 2)
        self.assertHolds(d, 2)
        self.assertEqual(self.c.get_into("m/a", d, version=1), 1)
        self.assertHolds(d, 1)
        self.assertEqual({k: t.data_ptr() for k, t in d.items()}, ptrs)
        # a non-contiguous destination is fine in Python
        wt = torch.full((8, 4), -1.0).t()
        d["w"] = wt
        self.c.get_into("m/a", d)
        self.assertTrue(torch.equal(wt, torch.arange(32.0).reshape(4, 8) * 2))

    def test_a_tensor_parallel_rank_loads_its_shard(self):
        self.publish_steps("m/tp", 1)
        full = torch.arange(32.0).reshape(4, 8)
        for rank in range(2):
            d = {"w": torch.full((2, 8), -1.0), "b": torch.full((4,), -1.0),
                 "n": torch.zeros(3, dtype=torch.int32)}
            view = "w:shard(0,%d,2);b:shard(0,%d,2)" % (rank, rank)
            self.assertEqual(self.c.get_into("m/tp", d, view=view), 1)
            self.assertTrue(torch.equal(d["w"], full[2 * rank:2 * rank + 2]))
            self.assertTrue(torch.equal(d["b"], torch.ones(4)))
        with self.assertRaises(st.InvalidArgumentError) as e:
            self.c.get_into("m/tp", {"w": torch.zeros(4, 8)}, view="w:shard(0,0,2)")
        self.assertIn("[2, 8]", str(e.exception))

    def test_a_modules_parameters_and_buffers_load_by_name(self):
        self.publish(MODEL + "assert c.put('m/model', m) == 1\n")
        mine, want = model(1), model(0)
        ptrs = [p.data_ptr() for p in mine.parameters()]
        self.assertFalse(torch.equal(mine[0].weight, want[0].weight))
        self.assertEqual(self.c.get_into("m/model", mine), 1)
        for (name, got), (_, w) in zip(mine.state_dict().items(), want.state_dict().items()):
            self.assertTrue(torch.equal(got, w), name)
        self.assertEqual([p.data_ptr() for p in mine.parameters()], ptrs)
        self.assertTrue(mine[0].weight.requires_grad)   # still the module's parameter
        # the module computes with what was published
        x = torch.randn(2, 8)
        mine.eval(), want.eval()
        self.assertTrue(torch.equal(mine(x), want(x)))

    def refused(self, d, *parts, **kw):
        """get_into of m/c into d must fail naming every one of parts."""
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.get_into("m/c", d, **kw)
        for p in parts:
            self.assertIn(p, str(cm.exception))

    def test_every_difference_is_listed_and_nothing_is_copied(self):
        self.publish_steps("m/c", 1)
        d = self.dests()
        d["v"] = d.pop("b")
        self.refused(d, "get_into 'm/c' version 1: 2 differences, nothing copied",
                     "missing 'v' (the source has no such tensor)",
                     "extra 'b' (no destination of that name)")
        d["b"] = d.pop("v")
        self.assertUntouched(d)
        d["w"] = torch.full((8, 4), -1.0)
        d["n"] = torch.full((3,), -1.0)
        self.refused(d, "2 differences",
                     "'n': dtype float32 here, int32 in the source (dtype_cast=True casts)",
                     "'w': shape [8, 4] here, [4, 8] in the source")
        self.assertTrue(torch.equal(d["w"], torch.full((8, 4), -1.0)))
        self.assertTrue(torch.equal(d["b"], torch.full((8,), -1.0)))
        # a cast does not excuse a shape
        self.refused(d, "1 difference, nothing copied: 'w': shape", dtype_cast=True)
        self.assertTrue(torch.equal(d["b"], torch.full((8,), -1.0)))
        with self.assertRaises(st.NotFoundError):
            self.c.get_into("m/none", self.dests())
        with self.assertRaises(TypeError):
            self.c.get_into("m/c", [torch.zeros(3)])

    def test_dtype_cast_casts_in_the_copy(self):
        self.publish_steps("m/d", 1)
        d = {"w": torch.zeros((4, 8), dtype=torch.float64),
             "b": torch.zeros((8,), dtype=torch.bfloat16),
             "n": torch.zeros((3,), dtype=torch.float32)}
        self.assertEqual(self.c.get_into("m/d", d, dtype_cast=True), 1)
        self.assertTrue(torch.equal(d["w"], torch.arange(32, dtype=torch.float64).reshape(4, 8)))
        self.assertTrue(torch.equal(d["b"], torch.ones(8, dtype=torch.bfloat16)))
        self.assertTrue(torch.equal(d["n"], torch.arange(3, dtype=torch.float32) + 1))

    def test_a_second_get_into_maps_nothing_new(self):
        self.publish_steps("m/e", 1)
        d = self.dests()
        before = open_cache_stats()
        self.c.get_into("m/e", d)
        first = open_cache_stats()
        self.assertEqual(first[0], before[0] + 3)   # three arenas, kept mapped
        for _ in range(4):
            d = self.dests()
            self.assertEqual(self.c.get_into("m/e", d), 1)
            self.assertHolds(d, 1)
        again = open_cache_stats()
        self.assertEqual(again[0], first[0])
        # each was a `same` reply: no descriptor came to be looked up
        self.assertEqual(again[1], first[1])
        # a new version comes in full, and is what gets copied
        self.publish_steps("m/e", 2, version=2)   # 2 holds step 1, 3 step 2
        d = self.dests()
        self.assertEqual(self.c.get_into("m/e", d), 3)
        self.assertHolds(d, 2)
        self.assertEqual(open_cache_stats()[0], first[0])   # version 1 let go
        # the kept version asked by number is `same` too; another comes in full
        d = self.dests()
        self.assertEqual(self.c.get_into("m/e", d, version=3), 3)
        self.assertHolds(d, 2)
        self.assertEqual(open_cache_stats()[1], first[1])
        self.assertEqual(self.c.get_into("m/e", d, version=2), 2)
        self.assertHolds(d, 1)

    def test_the_same_dict_changed_is_checked_again(self):
        # A dict loaded twice is copied by its prepared addresses; a tensor
        # replaced, resized or transposed in it since must be seen.
        self.publish_steps("m/g", 1)
        d = self.dests()
        self.c.get_into("m/g", d)
        self.c.get_into("m/g", d)
        self.assertHolds(d, 1)
        old = d["w"]
        d["w"] = torch.full((4, 8), -1.0)           # another address
        self.assertEqual(self.c.get_into("m/g", d), 1)
        self.assertHolds(d, 1)
        old.fill_(-2.0)
        self.c.get_into("m/g", d)
        self.assertTrue(torch.equal(old, torch.full((4, 8), -2.0)))   # not written
        d["w"].resize_(2, 8)                        # the same address, another shape
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.c.get_into("m/g", d)
        self.assertIn("'w': shape [2, 8] here, [4, 8] in the source", str(cm.exception))
        d["w"] = torch.full((8, 4), -1.0).t()       # non-contiguous: the general path
        self.c.get_into("m/g", d)
        self.assertHolds(d, 1)
        d["extra"] = torch.zeros(1)                 # a name more
        with self.assertRaises(st.InvalidArgumentError):
            self.c.get_into("m/g", d)

    def test_a_cached_objects_result_is_copied_from(self):
        h = self.c.call_readonly("weights")
        d = {"w": torch.zeros(2, 3)}
        self.assertIsNone(self.c.get_into(h, d))
        self.assertTrue(torch.equal(d["w"], torch.arange(6.0).reshape(2, 3)))
        with self.assertRaises(ValueError):
            self.c.get_into(h, d, version=1)
        h.release()
        # and from a StateDict a get returned: its version
        self.publish_steps("m/f", 1)
        sd = self.c.get("m/f", readonly=True)
        d = self.dests()
        self.assertEqual(self.c.get_into(sd, d), 1)
        self.assertHolds(d, 1)


if __name__ == "__main__":
    unittest.main()
