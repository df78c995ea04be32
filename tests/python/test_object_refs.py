"""A cached object called again on the same connection comes back by
reference (docs/protocol.md, "Objects sent once"; docs/python.md), against
a real stserver (CPU tensors):

  - the library returns the result it already holds (the same pointer,
    the same identity), and the package gives the torch tensors of the
    first conversion;
  - once every tensor of it is gone, the next call converts afresh with
    the right values; another connection gets its own result;
  - a managed object held by the connection comes back by reference
    with a lease per call (its refcount rises; each release gives one back);
  - a `same` reply costs the package one crossing (ST_CALL_LEND_SAME: no
    st_result_ref, no st_result_free) and gives the very torch tensors of
    the first conversion, whose memory another process writes into;
  - once every tensor is dropped the package's reference goes, and the
    next request tells the server: its next reply is in full; after a
    reconnect to a restarted server, the values are the new server's.
"""
import ctypes
import gc
import os
import subprocess
import sys
import unittest
from unittest import mock

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
  st.endpoint { name = "c16", cache = true,
    build = function() return st.arange { 16, dtype = "float32" } end },
}
""",
}


def lib_call(c, name, flags=0):
    """(result pointer, identity, same) of one st_client_call_summary."""
    out, summary = ctypes.c_void_p(), _lib.ResultSummary()
    rc = _lib.lib.st_client_call_summary(c._ptr, name.encode(), None, flags, ctypes.byref(out),
                                         ctypes.byref(summary))
    if rc != 0:
        raise AssertionError("call %s: %d" % (name, rc))
    return out.value, summary.identity, summary.same


class Counting:
    """Counts the calls of a library function (a mock's side effect)."""

    def __init__(self, fn):
        self.fn, self.n = fn, 0

    def __call__(self, *a):
        self.n += 1
        return self.fn(*a)


class ObjectRefsTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def test_the_library_returns_the_result_it_holds(self):
        p1, id1, _ = lib_call(self.c, "mod300")
        p2, id2, _ = lib_call(self.c, "mod300")
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
            p1, _, _ = lib_call(self.c, "mod300")
            p2, _, _ = lib_call(other, "mod300")
            self.assertNotEqual(p1, p2)
            _lib.lib.st_result_free(p1)
            _lib.lib.st_result_free(p2)
        finally:
            other.close()

    def test_a_held_managed_object_comes_back_by_reference_with_a_lease(self):
        p1, _, same1 = lib_call(self.c, "managed")
        p2, _, same2 = lib_call(self.c, "managed")
        try:
            # The second reply is `same`: the result the library holds, and
            # its object info says the lease this reply gave.
            self.assertEqual((same1, same2), (0, 1))
            self.assertEqual(p1, p2)
            info = _lib.ObjectInfo()
            self.assertEqual(_lib.lib.st_result_object(p2, ctypes.byref(info)), 0)
            self.assertTrue(info.managed and info.lease)
            self.assertEqual(info.refcount, 2)
            # Two leases, given back one at a time.
            self.assertEqual(self.c.release(info.id)["refcount"], 1)
            self.assertEqual(self.c.release(info.id)["refcount"], 0)
        finally:
            _lib.lib.st_result_free(p1)
            _lib.lib.st_result_free(p2)

    def test_managed_handles_say_their_own_lease(self):
        h1 = self.c.call("managed")
        h2 = self.c.call("managed")
        self.assertEqual(h2.object_id, h1.object_id)
        self.assertTrue(h1.lease and h2.lease)
        self.assertEqual((h1.refcount, h2.refcount), (1, 2))
        self.assertIs(h2.value, h1.value)
        self.assertEqual(h1.release()["refcount"], 1)
        self.assertEqual(h2.release()["refcount"], 0)
        self.assertEqual(h2.value.tolist(), [7.0] * 4)


class SameInOneCrossingTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def test_a_same_reply_costs_one_crossing_and_gives_the_same_tensors(self):
        h1 = self.c.call("c16")
        free = Counting(_lib.lib.st_result_free)
        ref = Counting(_lib.lib.st_result_ref)
        with mock.patch.object(_lib.lib, "st_result_free", free), \
                mock.patch.object(_lib.lib, "st_result_ref", ref), \
                mock.patch.object(st.client, "_result_ref", ref, create=True):
            handles = [self.c.call("c16") for _ in range(50)]
        self.assertEqual((free.n, ref.n), (0, 0))
        for h in handles:
            self.assertIs(h.value, h1.value)
            self.assertEqual((h.object_id, h.cache_key, h.cached, h.managed),
                             (h1.object_id, h1.cache_key, True, False))
        self.assertEqual(handles[-1].value.tolist(), [float(i) for i in range(16)])

    def test_memory_written_by_another_process_is_seen(self):
        h1 = self.c.call("c16")
        code = ("import sys; sys.path.insert(0, %r); import sharedtensor as st; "
                "c = st.Client(path=%r); c.call('c16').value.fill_(9.0); c.close()"
                % (os.path.join(st_fixture.env("ST_SOURCE_DIR"), "python"), self.srv.socket))
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout.decode(errors="replace"))
        h2 = self.c.call("c16")
        self.assertIs(h2.value, h1.value)
        self.assertEqual(h2.value.tolist(), [9.0] * 16)
        h2.value.copy_(torch_arange(16))

    def test_dropped_tensors_let_the_result_go_and_the_server_is_told(self):
        st.keep_results(0, 0)   # nothing kept past its last user
        h = self.c.call("c16")
        ptr = lib_call(self.c, "c16")[0]   # the result the connection keeps
        _lib.lib.st_result_free(ptr)
        h = self.c.call("c16")   # lent: the package holds that result
        self.assertIsNotNone(st.convert.held(ptr))
        value = h.value
        del h, value
        gc.collect()
        self.assertIsNone(st.convert.held(ptr))
        self.c.ping()            # tells the server: objects_freed
        p, _, same = lib_call(self.c, "c16", _lib.ST_CALL_LEND_SAME)
        self.assertEqual(same, 0)   # in full again
        _lib.lib.st_result_free(p)
        self.c.ping()
        h = self.c.call("c16")
        self.assertEqual(h.value.tolist(), [float(i) for i in range(16)])

    def test_a_reconnect_to_a_restarted_server_converts_afresh(self):
        h1 = self.c.call("c16")
        self.assertIs(self.c.call("c16").value, h1.value)
        h1.value.fill_(5.0)   # the old server's object, written here
        self.srv.stop()
        self.srv.start()
        with self.assertRaises(st.StaleHandleError):
            self.c.ensure_live(h1.object_id)   # reconnects: a new hello
        h2 = self.c.call("c16")
        self.assertIsNot(h2.value, h1.value)
        self.assertEqual(h2.value.tolist(), [float(i) for i in range(16)])
        self.assertIs(self.c.call("c16").value, h2.value)
        self.assertEqual(h1.value.tolist(), [5.0] * 16)   # still mapped, still its own


def torch_arange(n):
    import torch
    return torch.arange(n, dtype=torch.float32)


if __name__ == "__main__":
    unittest.main()
