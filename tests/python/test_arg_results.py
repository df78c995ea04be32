"""A call's result that is its own tensor argument (docs/protocol.md,
"Tensor arguments", `{arg: i}`; docs/python.md), against a real stserver
(CPU tensors):

  - an endpoint that returns its argument (written in place) or a window
    of it gives a torch tensor on the caller's own memory at the caller's
    own address: no second mapping; the caller's writes are the result's;
  - a result that is not the argument (a copy) is memory of its own, and
    one result may hold both;
  - the result keeps the allocation alive after the caller drops its
    tensor;
  - that torch tensor is the caller's own tensor object when the result
    is the argument itself (one that requires grad, a Parameter too), and
    a view of it (its storage, at the window's offset, not in autograd)
    for a window, with no DLPack export;
  - the description of a tensor argument kept between calls follows the
    tensor: a tensor freed and its address (and id) reused by another,
    or one whose storage or geometry changed in place, is sent as it is
    now.
"""
import gc
import unittest

import st_fixture

st_fixture.add_package_path()

try:
    import torch
except ImportError:  # run_tests.py skips first
    torch = None

import sharedtensor as st  # noqa: E402

ENDPOINTS = {
    "e.lua": """
return {
  st.endpoint { name = "scale", params = { x = st.tensor_param {}, k = 2 },
    build = function(a) return a.x:mul_(a.k) end },
  st.endpoint { name = "window", params = { x = st.tensor_param {} },
    build = function(a) return a.x:narrow(0, 2, 3) end },
  st.endpoint { name = "copy", params = { x = st.tensor_param {} },
    build = function(a) return a.x:clone() end },
  st.endpoint { name = "both", params = { x = st.tensor_param {} },
    build = function(a) return { arg = a.x, new = st.full { 2, value = 9 } } end },
  st.endpoint { name = "cols", params = { x = st.tensor_param {} },
    build = function(a) return a.x:narrow(1, 1, 2) end },
  st.endpoint { name = "flip", params = { x = st.tensor_param {} },
    build = function(a) return a.x:transpose(0, 1) end },
  st.endpoint { name = "echo", params = { x = st.tensor_param {} },
    build = function(a) return a.x end },
  st.endpoint { name = "look", params = { x = st.tensor_param {} },
    build = function(a) return { shape = a.x:shape(), values = a.x:tolist() } end },
}
""",
}


def storage_ptr(t):
    """The address of t's storage (untyped_storage where torch has it)."""
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def counting(n):
    t = st.empty(n, dtype=torch.float32)
    t.copy_(torch.arange(n, dtype=torch.float32))
    return t


class ArgResultsTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def test_the_argument_comes_back_on_the_callers_memory(self):
        x = counting(8)
        r = self.c.call("scale", x=x, k=3)
        self.assertEqual(r.data_ptr(), x.data_ptr())
        self.assertEqual(r.tolist(), [3.0 * i for i in range(8)])
        x[1] = 100.0
        self.assertEqual(r[1].item(), 100.0)

    def test_a_window_is_at_its_offset(self):
        x = counting(8)
        r = self.c.call("window", x=x)
        self.assertEqual(r.data_ptr(), x.data_ptr() + 2 * 4)
        self.assertEqual(r.tolist(), [2.0, 3.0, 4.0])
        # A view passed as the argument: the window is inside the view.
        v = x[1:]
        r2 = self.c.call("window", x=v)
        self.assertEqual(r2.data_ptr(), v.data_ptr() + 2 * 4)
        self.assertEqual(r2.tolist(), [3.0, 4.0, 5.0])

    def test_a_result_that_is_not_the_argument_is_its_own_memory(self):
        x = counting(4)
        r = self.c.call("copy", x=x)
        self.assertNotEqual(r.data_ptr(), x.data_ptr())
        x[3] = 50.0
        self.assertEqual(r.tolist(), [0.0, 1.0, 2.0, 3.0])
        both = self.c.call("both", x=x)
        self.assertEqual(both["arg"].data_ptr(), x.data_ptr())
        self.assertNotEqual(both["new"].data_ptr(), x.data_ptr())
        self.assertEqual(both["new"].tolist(), [9.0, 9.0])

    def test_the_result_keeps_the_allocation(self):
        x = counting(4)
        r = self.c.call("scale", x=x, k=2)
        del x
        gc.collect()
        self.assertEqual(r.tolist(), [0.0, 2.0, 4.0, 6.0])
        r.add_(1)
        self.assertEqual(r.tolist(), [1.0, 3.0, 5.0, 7.0])

    def test_the_result_is_the_callers_own_tensor(self):
        x = counting(8)
        self.assertIs(self.c.call("scale", x=x, k=2), x)
        v = x[2:6]
        self.assertIs(self.c.call("scale", x=v, k=-1), v)
        self.assertEqual(x.tolist(), [0.0, 2.0, -4.0, -6.0, -8.0, -10.0, 12.0, 14.0])
        both = self.c.call("both", x=x)
        self.assertIs(both["arg"], x)
        # Not torch tensors: a SharedTensor on the same memory.
        s = self.c.call("scale", x=x, k=1, as_torch=False)
        self.assertIsInstance(s, st.SharedTensor)
        self.assertEqual(s.data_ptr, x.data_ptr())

    def test_a_window_is_a_view_of_the_argument(self):
        x = counting(12).view(3, 4)
        r = self.c.call("cols", x=x)
        self.assertEqual((tuple(r.shape), r.stride(), r.storage_offset()), ((3, 2), (4, 1), 1))
        self.assertEqual(storage_ptr(r), storage_ptr(x))
        self.assertEqual(r.tolist(), [[1.0, 2.0], [5.0, 6.0], [9.0, 10.0]])
        r[2, 1] = -1.0
        self.assertEqual(x[2, 2].item(), -1.0)
        t = self.c.call("flip", x=x)
        self.assertEqual((tuple(t.shape), t.stride(), t.storage_offset()), ((4, 3), (1, 4), 0))
        self.assertEqual(t.tolist(), x.t().tolist())
        # The window of a view: offsets count from the allocation.
        v = x[1:]
        w = self.c.call("cols", x=v)
        self.assertEqual((tuple(w.shape), w.stride(), w.storage_offset()), ((2, 2), (4, 1), 5))
        self.assertEqual(w.data_ptr(), x.data_ptr() + 5 * 4)
        self.assertEqual(w.tolist(), [[5.0, 6.0], [9.0, -1.0]])
        # A transposed argument's window.
        u = self.c.call("cols", x=x.t())
        self.assertEqual((tuple(u.shape), u.stride(), u.storage_offset()), ((4, 2), (1, 4), 4))
        self.assertEqual(u.tolist(), x.t()[:, 1:3].tolist())

    def test_an_argument_that_requires_grad(self):
        x = counting(8).requires_grad_()
        self.assertIs(self.c.call("echo", x=x), x)   # itself, as it is
        self.assertTrue(x.requires_grad)
        r = self.c.call("window", x=x)        # a view of its memory, not in autograd
        self.assertFalse(r.requires_grad)
        self.assertEqual((r.data_ptr(), r.storage_offset()), (x.data_ptr() + 2 * 4, 2))
        self.assertEqual(r.tolist(), [2.0, 3.0, 4.0])
        # A subclass (nn.Parameter) comes back itself; a window of it as
        # a tensor of its own on the same memory.
        p = torch.nn.Parameter(counting(8))
        self.assertIs(self.c.call("echo", x=p), p)
        w = self.c.call("window", x=p)
        self.assertNotIsInstance(w, torch.nn.Parameter)
        self.assertEqual((w.data_ptr(), w.tolist()), (p.data_ptr() + 2 * 4, [2.0, 3.0, 4.0]))

    def test_a_freed_tensors_address_reused_by_another(self):
        # Each tensor is freed before the next is made: the next one
        # usually gets the same address (a new allocation, of another
        # size), often the same id too, and must be sent as it is.
        prev, reused = None, 0
        for i in range(50):
            n = 6 if i % 2 else 10
            x = st.empty(n, dtype=torch.float32)
            x.copy_(torch.arange(n, dtype=torch.float32) + 100 * i)
            reused += x.data_ptr() == prev
            prev = x.data_ptr()
            seen = self.c.call("look", x=x)
            self.assertEqual(seen["shape"], [n])
            self.assertEqual(seen["values"], x.tolist())
            r = self.c.call("scale", x=x, k=2)
            self.assertIs(r, x)
            self.assertEqual(x.tolist(), [2.0 * (k + 100 * i) for k in range(n)])
            del x, r
        self.assertGreater(reused, 0, "no tensor got the address of the one before: "
                                      "the case is not exercised")

    def test_a_tensor_changed_in_place_is_sent_as_it_is_now(self):
        x, y = counting(4), counting(6)
        self.c.call("scale", x=x, k=2)
        x.set_(y)                     # the same object, another allocation
        self.assertIs(self.c.call("scale", x=x, k=3), x)
        self.assertEqual(y.tolist(), [0.0, 3.0, 6.0, 9.0, 12.0, 15.0])
        x.resize_(2)                  # the same memory, another shape
        self.assertEqual(self.c.call("look", x=x), {"shape": [2], "values": [0.0, 3.0]})
        x.as_strided_((3,), (2,), 1)  # and another offset and stride
        self.assertEqual(self.c.call("look", x=x), {"shape": [3], "values": [3.0, 9.0, 15.0]})
        self.assertIs(self.c.call("scale", x=x, k=-1), x)
        self.assertEqual(y.tolist(), [0.0, -3.0, 6.0, -9.0, 12.0, -15.0])

    def test_descriptions_of_dead_tensors_go(self):
        from sharedtensor import targs
        x = counting(8)
        self.c.call("look", x=x)
        i = id(x)
        self.assertIn(i, targs._described)
        del x
        gc.collect()
        self.assertNotIn(i, targs._described)   # before any tensor may take its id
        x = counting(64)
        self.c.call("look", x=x)
        before = len(targs._described)
        for i in range(100):
            self.c.call("look", x=x[i % 60:])   # a new view each call
        gc.collect()
        self.assertLessEqual(len(targs._described), before + 1)


if __name__ == "__main__":
    unittest.main()
