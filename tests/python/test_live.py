"""Live keys from Python (docs/views.md, section 3) against a real
stserver, CPU tensors, publishers and readers in processes of their own:

  - bind(module, key): the parameters' data_ptr stays across updates and
    the module sees the new values; wait_version wakes on the next update
    and times out cleanly;
  - update and updating in place; a reader that runs forward passes in
    consistent() attempts while another process hammers updates never
    mixes two versions;
  - a publisher SIGKILLed inside `with updating()`: StaleHandleError for
    readers until a live put of the uid recovers the key;
  - clear errors: bind to wrong names, shapes and dtypes, update of
    another connection's key, a consistent() block never entered.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402  (run_tests.py skips without torch)

import sharedtensor as st  # noqa: E402


def child(socket, code):
    """Starts `code` in a fresh Python with `c` a Client of the server."""
    prog = "import sys\nsys.path.insert(0, %r)\nimport torch\nimport sharedtensor as st\n" \
           "c = st.Client(path=%r)\n" % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"),
                                        socket) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: __import__("resource").setrlimit(
                                __import__("resource").RLIMIT_CORE, (0, 0)))


def state(value):
    """A state dict of nn.Linear(64, 64) whose every element is `value`."""
    return {"weight": torch.full((64, 64), float(value)), "bias": torch.full((64,), float(value))}


class LiveTest(st_fixture.ServerTestCase):
    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 1024 * 1024 },"}
    DELETE_KEYS = True

    def test_bind_keeps_the_pointers_and_sees_updates(self):
        self.assertEqual(self.c.put("policy", state(1), live=True), 1)
        reader = st.Client(path=self.srv.socket)
        try:
            model = torch.nn.Linear(64, 64)
            b = reader.bind(model, "policy")
            ptr = model.weight.data_ptr()
            x = torch.ones(1, 64)
            self.assertEqual(b.version, 1)
            self.assertEqual(b.read(lambda: model(x))[0, 0].item(), 65.0)
            self.assertEqual(self.c.update("policy", state(2)), 2)
            self.assertEqual(b.wait_version(2, timeout=5), 2)
            self.assertEqual(model.weight.data_ptr(), ptr)
            self.assertEqual(b.read(lambda: model(x))[0, 0].item(), 130.0)
            with self.c.updating("policy") as t:
                t["bias"].fill_(0.0)
            self.assertEqual(b.version, 3)
            for attempt in b.consistent():
                with attempt:
                    y = model(x)
            self.assertTrue(attempt.ok)
            self.assertEqual((attempt.version, y[0, 0].item()), (3, 128.0))
            with self.assertRaises(TimeoutError):
                b.wait_version(4, timeout=0.1)
            self.assertEqual(b.refresh(), 3)
            self.assertEqual(model.weight.data_ptr(), ptr)
            # only the publisher updates
            with self.assertRaisesRegex(ValueError, "published by another connection"):
                reader.update("policy", state(5))
        finally:
            reader.close()

    def test_a_rank_binds_its_shard(self):
        w = torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)
        self.c.put("tp", {"weight": w.clone(), "bias": torch.arange(64.0)}, live=True)
        reader = st.Client(path=self.srv.socket)
        try:
            view = "weight:shard(0,1,2);bias:shard(0,1,2)"
            half = torch.nn.Linear(64, 32)
            b = reader.bind(half, "tp", view=view)
            self.assertTrue(torch.equal(half.weight, w[32:]))
            self.assertTrue(torch.equal(half.bias, torch.arange(32.0, 64.0)))
            # a window of the key's own memory: no copy
            whole = reader.live("tp")
            self.assertEqual(half.weight.data_ptr(),
                             whole.tensors["weight"].data_ptr() + 32 * 64 * 4)
            ptr = half.weight.data_ptr()
            self.assertEqual(self.c.update("tp", {"weight": w * 2, "bias": torch.zeros(64)}), 2)
            self.assertEqual(b.wait_version(2, timeout=5), 2)
            self.assertEqual(half.weight.data_ptr(), ptr)
            self.assertTrue(torch.equal(b.read(lambda: half.weight.clone()), w[32:] * 2))
            self.assertTrue(torch.equal(half.bias, torch.zeros(32)))
            # a copy would not follow updates
            with self.assertRaisesRegex(st.InvalidArgumentError, "cannot end with `contiguous`"):
                reader.live("tp", view="weight:shard(1,1,2)|contiguous")
        finally:
            reader.close()

    def test_a_reader_never_mixes_two_versions(self):
        self.c.put("ham", state(0), live=True)
        self.c.close()
        # the publisher hammers from its own process: weight and bias hold
        # one value per version
        writer = child(self.srv.socket, """
            c.put("ham", {"weight": torch.zeros(64, 64), "bias": torch.zeros(64)}, live=True)
            for v in range(1, 300):
                with c.updating("ham") as t:
                    t["weight"].fill_(float(v))
                    t["bias"].fill_(float(v))
            print("done", c.live("ham").version)
        """)
        c = st.Client(path=self.srv.socket)
        try:
            model = torch.nn.Linear(64, 64)
            b = c.bind(model, "ham")
            x = torch.ones(1, 64)
            seen = set()
            running = True
            while running:
                running = writer.poll() is None   # one more read after it ended
                for attempt in b.consistent(timeout=10):
                    with attempt:
                        y = model(x)
                        w = model.weight[0, 0].item()
                # one version: every output is 64 * w + w
                self.assertTrue(bool(torch.all(y == 65 * w)), (w, y))
                seen.add(w)
            out = writer.communicate(timeout=60)[0]
            self.assertEqual(writer.returncode, 0, out)
            self.assertIn("done 301", out)
            self.assertGreaterEqual(len(seen), 2)
        finally:
            c.close()
            self.c = st.Client(path=self.srv.socket)

    def test_a_publisher_killed_mid_update_tears_the_key_until_a_new_put(self):
        p = child(self.srv.socket, """
            import os, signal
            c.put("torn", {"weight": torch.zeros(64, 64), "bias": torch.zeros(64)}, live=True)
            with c.updating("torn") as t:
                t["weight"].fill_(9.0)
                print("updating", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        """)
        self.assertEqual(p.stdout.readline().strip(), "updating")
        p.wait(timeout=60)
        self.assertEqual(p.returncode, -signal.SIGKILL)
        k, deadline = "", time.monotonic() + 10   # the server sees the close soon
        while time.monotonic() < deadline:
            try:
                self.c.get("torn")
            except st.StaleHandleError as e:
                k = str(e)
                break
            time.sleep(0.002)
        self.assertIn("is torn", k)
        self.assertEqual([x["state"] for x in self.c.keys("torn")], ["torn"])
        # a new live put of the uid recovers it in place
        self.assertEqual(self.c.put("torn", state(4), live=True), 2)
        self.assertEqual(self.c.get("torn")["weight"][5, 5].item(), 4.0)
        self.assertEqual([x["state"] for x in self.c.keys("torn")], ["live"])

    def test_clear_errors(self):
        self.c.put("e", state(1), live=True)
        with self.assertRaisesRegex(ValueError, "'weight': the module has torch.float32 "
                                                r"\(3, 64\), the key torch.float32 \(64, 64\)"):
            self.c.bind(torch.nn.Linear(64, 3), "e")
        with self.assertRaisesRegex(ValueError, "parameter 'extra' is not in key 'e'"):
            m = torch.nn.Linear(64, 64)
            m.extra = torch.nn.Parameter(torch.zeros(1))
            self.c.bind(m, "e")
        with self.assertRaisesRegex(ValueError, "'nope': no such tensor in key 'e'"):
            self.c.update("e", {"nope": torch.zeros(3)})
        # the same dict updated again goes by its prepared addresses; a
        # tensor of it resized since is checked again, and nothing moves
        new = state(2)
        self.c.update("e", new)
        v = self.c.update("e", new)
        new["weight"].resize_(3, 64)
        with self.assertRaisesRegex(ValueError, r"'weight': the key has torch.float32 "
                                                r"\(64, 64\), the update gives torch.float32 "
                                                r"\(3, 64\)"):
            self.c.update("e", new)
        self.assertEqual(self.c.live("e").version, v)
        b = self.c.bind(torch.nn.Linear(64, 64), "e")
        with self.assertRaisesRegex(RuntimeError, "inside `with attempt:`"):
            for attempt in b.consistent():
                pass
        with self.assertRaises(st.InvalidArgumentError):
            self.c.put("e", state(1), policy="evictable", live=False)
        with self.assertRaises(st.InvalidArgumentError):
            self.c.put("ev", state(1), policy="evictable", live=True)


if __name__ == "__main__":
    unittest.main()
