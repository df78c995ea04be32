"""Plain-value methods read straight as marshal bytes (st_client_rpc_marshal):

  - info, metrics, endpoints and rpc() cross into the library once: the
    value comes in marshal's format straight from the reply, with no
    st_result_t, and equals what the decoder makes of the same reply;
  - every call's dict is new: mutating one changes no later reply;
  - a reply marshal cannot carry that way (a string that is not UTF-8,
    tensors) comes decoded instead, as before;
  - the client's buffer survives a large reply and serves small ones after.
"""
import copy
import ctypes
import marshal
import unittest

import st_fixture

st_fixture.add_package_path()

torch = st_fixture.optional_import("torch")

import sharedtensor as st  # noqa: E402
from sharedtensor import _lib, client as _client  # noqa: E402

ENDPOINTS = {
    "e.lua": """
return {
  st.endpoint { name = "echo", params = { value = st.required },
    build = function(a) return a.value end },
  st.endpoint { name = "bad_utf8", params = {},
    build = function(a) return { s = "ok\\255\\254", n = 1 } end },
  st.endpoint { name = "with_tensor", params = {},
    build = function(a) return { t = st.arange { 3, dtype = "float32" }, k = "v" } end },
}
""",
}

_l = _lib.lib


def raw(c, method):
    """st_client_rpc_marshal of `method`: (bytes or None, fallback result)."""
    data, size, fallback = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_void_p()
    rc = _l.st_client_rpc_marshal(c._ptr, method, None, ctypes.byref(data), ctypes.byref(size),
                                  ctypes.byref(fallback))
    if rc != 0:
        raise AssertionError("st_client_rpc_marshal(%r): %d" % (method, rc))
    blob = ctypes.string_at(data.value, size.value) if data.value else None
    return blob, fallback.value


def decoded(c, method):
    """The same method through st_client_rpc and the node-by-node conversion."""
    out = ctypes.c_void_p()
    c._do(_l.st_client_rpc, method, None, ctypes.byref(out))
    return st_fixture.slow_value(out.value)


def shape(v):
    """v with every scalar replaced by its type: replies that moved on
    between two calls (counters, uptime) compare equal."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [shape(x) for x in v]
    return type(v)


@unittest.skipIf(torch is None, "torch is needed")
class RpcMarshalTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def test_info_comes_as_marshal_bytes_without_a_result(self):
        blob, fallback = raw(self.c, b"info")
        self.assertIsNotNone(blob)
        self.assertIsNone(fallback)
        v = marshal.loads(blob)
        want = decoded(self.c, b"info")
        self.assertEqual(shape(v), shape(want))
        for k in ("server_id", "version", "protocol", "pid", "devices", "cuda", "sockets",
                  "limits", "workers"):
            self.assertEqual(v[k], want[k], k)

    def test_info_endpoints_and_metrics_equal_the_decoded_reply(self):
        self.assertEqual(shape(self.c.info()), shape(decoded(self.c, b"info")))
        self.assertEqual(self.c.endpoints(), decoded(self.c, b"endpoints"))
        self.assertEqual(type(self.c.metrics()), str)
        self.assertEqual(self.c.rpc("ping"), "pong")

    def test_a_mutated_info_changes_no_later_one(self):
        first = self.c.info()
        limits, devices = copy.deepcopy(first["limits"]), copy.deepcopy(first["devices"])
        first["limits"]["max_inflight"] = -1
        first["devices"].append({"index": 99})
        first["devices"][0]["name"] = "changed"
        del first["counters"]
        again = self.c.info()
        self.assertEqual(again["limits"], limits)
        self.assertEqual(again["devices"], devices)
        self.assertIn("counters", again)
        self.assertIsNot(again["limits"], first["limits"])

    def test_a_string_that_is_not_utf8_comes_decoded(self):
        blob, fallback = raw(self.c, b"endpoints")   # any plain reply first
        self.assertIsNotNone(blob)
        v = self.c.rpc("call", endpoint="bad_utf8")
        self.assertEqual(v["value"], {"s": "ok\ufffd\ufffd", "n": 1})

    def test_a_reply_with_tensors_comes_decoded(self):
        v = self.c.rpc("call", endpoint="with_tensor")
        self.assertEqual(v["value"]["k"], "v")
        self.assertEqual(v["value"]["t"].tolist(), [0.0, 1.0, 2.0])

    def test_a_large_reply_then_small_ones(self):
        big = "x" * (600 * 1024)
        self.assertEqual(self.c.rpc("call", endpoint="echo", args={"value": big})["value"], big)
        self.assertEqual(self.c.rpc("ping"), "pong")
        self.assertEqual(self.c.info()["protocol"], decoded(self.c, b"info")["protocol"])

    def test_errors_are_raised_as_before(self):
        with self.assertRaises(st.errors.Error) as e:
            self.c.rpc("no_such_method")
        self.assertIn("no_such_method", str(e.exception))
        with self.assertRaises(ValueError):
            _client.Client.info(_closed(self.c))


def _closed(c):
    c.close()
    return c


if __name__ == "__main__":
    unittest.main()
