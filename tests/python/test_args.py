"""Call arguments from Python keep their exact values (python/sharedtensor/
args.py over the nested builder of libstclient), through a real stserver:
what comes back from an echo endpoint, and what the endpoint saw (st.null
for a None inside a list or dict). Needs no framework.
"""
import math
import os
import unittest

import st_fixture

st_fixture.add_package_path()

import sharedtensor as st  # noqa: E402

ENDPOINTS = {
    "echo.lua": st_fixture.EP_ECHO,
    # Cached: the key of the whole arguments, and a format key.
    "cached.lua": """
return {
  st.endpoint { name = "cached", cache = true, params = { value = st.required },
    build = function(a) return { v = a.value } end },
  st.endpoint { name = "fmt", cache_format_key = "k:{value}", params = { value = st.required },
    build = function(a) return { v = a.value } end },
  st.endpoint { name = "binary", params = { s = st.required },
    build = function(a)
      local b = st.bytes(a.s)
      return { b = b, n = #b, s = tostring(b), sub = b:sub(2), same = b == st.bytes(a.s),
               cat = b .. "!", again = st.bytes(b) }
    end },
}
""",
    # What the endpoint sees, rendered on the server.
    "seen.lua": open(os.path.join(st_fixture.env("ST_SOURCE_DIR"), "tests", "spec",
                                  "seen_endpoint.lua")).read(),
}


def nested(levels, inner):
    v = inner
    for _ in range(levels):
        v = [v]
    return v


class ArgumentsTest(st_fixture.ServerTestCase):
    ENDPOINTS = ENDPOINTS

    def setUp(self):
        self.c = st.Client(path=self.srv.socket, framework=None)

    def echo(self, v):
        return self.c.call("echo", value=v)

    def test_every_type_round_trips(self):
        cases = [
            42, -7, 2 ** 53, -(2 ** 63), 2 ** 62, 0.5, -1.5e300, True, False, None,
            "a\x00b", "", "gr\u00fc\u00df \u20ac", [None], [1, None, 3],
            {"a": 1, "b": None}, {"x": {"y": [1, {"z": None}]}}, [], {}, [[], {}],
            {"k\x00": 1, "": 2}, list(range(1000)), [0.5] * 100, ["a\x00", "", "b"],
            [1, "a", None, 2.5, True], [2 ** 62, -1], list(range(20)) + ["x"] * 20,
            {"k%d" % i: (i if i % 3 else "v%d" % i) for i in range(30)},
            {"k%d" % i: i * 0.5 for i in range(10)}, {"\u00e9%d" % i: "\u20ac" for i in range(10)},
        ]
        for v in cases:
            with self.subTest(value=v if not isinstance(v, list) or len(v) < 10 else len(v)):
                got = self.echo(v)
                self.assertEqual(got, v)
                self.assertEqual(type(got), type(v))
        # tuples go as lists, bytes as binary (st.bytes to the endpoint),
        # and binary comes back as bytes
        self.assertEqual(self.echo((1, None, "x")), [1, None, "x"])
        for v in (b"ab\x00c", b"\xff\x00", b"", bytes(range(256))):
            self.assertEqual(type(self.echo(v)), bytes)
            self.assertEqual(self.echo(v), v)
        self.assertEqual(self.echo(bytearray(b"\xfe")), b"\xfe")
        self.assertEqual(self.echo([b"\x00", "\x00"]), [b"\x00", "\x00"])
        self.assertEqual(self.echo({"k": b"\xff"}), {"k": b"\xff"})
        self.assertTrue(math.isnan(self.echo([float("nan")])[0]))
        self.assertEqual(self.echo(nested(27, [1])), nested(27, [1]))

    def test_the_issue_cases(self):
        self.assertEqual(self.c.call("echo", value="a\x00b"), "a\x00b")
        self.assertEqual(self.c.call("echo", value=[None]), [None])
        self.assertEqual(self.c.call("echo", value={"a": 1, "b": None}), {"a": 1, "b": None})
        self.assertEqual(self.c.call("echo", value=[1, None, 3]), [1, None, 3])

    def test_what_the_endpoint_sees(self):
        seen = lambda v: self.c.call("seen", value=v)  # noqa: E731
        self.assertEqual(seen([1, None, 3]), "[1,null,3]")
        self.assertEqual(seen([None]), "[null]")
        self.assertEqual(seen({"a": 1, "b": None}), "{a=1,b=null}")
        self.assertEqual(seen("a\x00b"), '"a\\0b"')
        self.assertEqual(seen(b"ab\x00c"), 'b"ab\\0c"')
        self.assertEqual(seen(None), "nil")     # an argument that is None itself

    def test_binary_values_in_lua(self):
        self.assertEqual(self.c.call("binary", s="abc"),
                         {"b": b"abc", "n": 3, "s": "abc", "sub": "bc", "same": True,
                          "cat": "abc!", "again": b"abc"})

    def test_cache_keys_keep_bytes_apart_and_whole(self):
        # non-UTF-8 bytes: built, cached, and every call answers
        for _ in range(2):
            with self.c.call("cached", value=b"\xff\x00") as h:
                self.assertEqual(h.value, {"v": b"\xff\x00"})
                self.assertEqual(h.cache_key, '{"value":b"\\xff\\x00"}')
        keys = {}
        for name in ("cached", "fmt"):
            for v in ("ab", b"ab", "k:a\x00b", "k:a\x00c", b"\xff", "\xff"):
                with self.c.call(name, value=v) as h:
                    self.assertEqual(h.value, {"v": v})
                    keys[name, v] = h.cache_key
        self.assertEqual(keys["fmt", "ab"], "k:ab")
        self.assertEqual(keys["fmt", b"ab"], 'k:b"ab"')
        self.assertEqual(keys["fmt", "k:a\x00b"], "k:k:a\\x00b")
        self.assertEqual(keys["fmt", b"\xff"], 'k:b"\\xff"')
        self.assertEqual(keys["cached", "ab"], '{"value":"ab"}')
        self.assertEqual(keys["cached", "k:a\x00c"], '{"value":"k:a\\u0000c"}')
        self.assertEqual(len(set(keys.values())), len(keys))   # no two share a key

    def test_nesting_limit(self):
        # A request holds 32 levels of containers, 4 of them its own.
        self.assertEqual(self.echo(nested(28, 1)), nested(28, 1))
        with self.assertRaises(st.InvalidArgumentError) as cm:
            self.echo(nested(29, 1))
        self.assertIn("argument 'value': lists and maps nested deeper than 28 levels",
                      str(cm.exception))
        loop = []
        loop.append(loop)
        with self.assertRaises(st.InvalidArgumentError):
            self.echo(loop)
        self.assertGreater(self.c.ping(), 0)   # nothing went out

    def test_what_cannot_go(self):
        cases = [
            ({1: "a"}, TypeError, "argument 'value': map keys must be str, not int"),
            (2 ** 63, OverflowError, "argument 'value': 9223372036854775808 does not fit int64"),
            ([2 ** 64], OverflowError, "argument 'value': 18446744073709551616 does not fit int64"),
            ([0] * 10 + [2 ** 64], OverflowError, "an integer of the list does not fit int64"),
            ([1, 2 ** 64, "x"], OverflowError, "does not fit int64"),
            (object(), TypeError, "argument 'value': cannot send a object"),
            ([{1, 2}], TypeError, "cannot send a set"),
            ("\ud800", ValueError, "argument 'value'"),
        ]
        for v, cls, msg in cases:
            with self.subTest(value=repr(v)):
                with self.assertRaises(cls) as cm:
                    self.echo(v)
                self.assertIn(msg, str(cm.exception))
        with self.assertRaises(ValueError):
            self.c.call("echo", **{"value\x00": 1})
        self.assertGreater(self.c.ping(), 0)


if __name__ == "__main__":
    unittest.main()
