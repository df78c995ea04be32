"""A call's result that is its own tensor argument (docs/protocol.md,
"Tensor arguments", `{arg: i}`; docs/python.md), against a real stserver
(CPU tensors):

  - an endpoint that returns its argument (written in place) or a window
    of it gives a torch tensor on the caller's own memory at the caller's
    own address: no second mapping; the caller's writes are the result's;
  - a result that is not the argument (a copy) is memory of its own, and
    one result may hold both;
  - the result keeps the allocation alive after the caller drops its
    tensor.
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
}
""",
}


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


if __name__ == "__main__":
    unittest.main()
