"""A cached object called again on the same connection comes back by
reference (docs/protocol.md, "Objects sent once"; docs/python.md), against
a real stserver (CPU tensors):

  - the library returns the result it already holds (the same pointer,
    the same identity), and the package gives the torch tensors of the
    first conversion;
  - once every tensor of it is gone, the next call converts afresh with
    the right values; another connection gets its own result;
  - a managed object is never returned by reference.
"""
import ctypes
import gc
import unittest

import st_fixture

st_fixture.add_package_path()

import sharedtensor as st  # noqa: E402  (run_tests.py skips without torch)
from sharedtensor import _lib  # noqa: E402

ENDPOINTS = {
    "e.lua": """
return {
  st.endpoint { name = "mod300", cache = true,
    build = function()
      local list = {}
      for i = 1, 300 do list[i] = { "layer" .. i, st.full { 4, value = i } } end
      return st.module(list, { arch = "objrefs" })
    end },
  st.endpoint { name = "managed", cache = true, managed = true,
    build = function() return st.full { 4, value = 7 } end },
}
""",
}


def lib_call(c, name):
    """(result pointer, identity) of one st_client_call_summary."""
    out, summary = ctypes.c_void_p(), _lib.ResultSummary()
    rc = _lib.lib.st_client_call_summary(c._ptr, name.encode(), None, 0, ctypes.byref(out),
                                         ctypes.byref(summary))
    if rc != 0:
        raise AssertionError("call %s: %d" % (name, rc))
    return out.value, summary.identity


class ObjectRefsTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def test_the_library_returns_the_result_it_holds(self):
        p1, id1 = lib_call(self.c, "mod300")
        p2, id2 = lib_call(self.c, "mod300")
        try:
            self.assertEqual(p1, p2)
            self.assertEqual(id1, id2)
        finally:
            _lib.lib.st_result_free(p1)
            _lib.lib.st_result_free(p2)

    def test_called_again_gives_the_same_torch_tensors(self):
        h1 = self.c.call("mod300")
        h2 = self.c.call("mod300")
        self.assertEqual(len(h2.value), 300)
        for a, b in zip(h1.value.values(), h2.value.values()):
            self.assertIs(a, b)
        self.assertEqual(h2.value["layer300"].tolist(), [300.0] * 4)
        self.assertEqual(h2.value.metadata, {"arch": "objrefs"})

    def test_dropped_then_called_again_converts_afresh(self):
        h = self.c.call("mod300")
        self.assertEqual(h.value["layer7"].tolist(), [7.0] * 4)
        del h
        gc.collect()
        for _ in range(3):
            h = self.c.call("mod300")
            self.assertEqual(h.value["layer1"].tolist(), [1.0] * 4)
            self.assertEqual(h.value["layer299"].tolist(), [299.0] * 4)
            del h
            gc.collect()

    def test_another_connection_gets_its_own_result(self):
        other = st.Client(path=self.srv.socket)
        try:
            p1, _ = lib_call(self.c, "mod300")
            p2, _ = lib_call(other, "mod300")
            self.assertNotEqual(p1, p2)
            _lib.lib.st_result_free(p1)
            _lib.lib.st_result_free(p2)
        finally:
            other.close()

    def test_a_managed_object_is_never_returned_by_reference(self):
        p1, _ = lib_call(self.c, "managed")
        p2, _ = lib_call(self.c, "managed")
        try:
            self.assertNotEqual(p1, p2)
        finally:
            _lib.lib.st_result_free(p1)
            _lib.lib.st_result_free(p2)


if __name__ == "__main__":
    unittest.main()
