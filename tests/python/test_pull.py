"""Client.pull and sharedtensor.Task (docs/python.md, "Keys between
servers") against two stservers on loopback that are peers: "alpha"
listens and exports the keys under w/, "beta" dials it; the bytes move
over UCX on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo). A pull waited for and
its result and bytes checked; a key not exported raising AuthError from
task.result(); a peer that is not one raising NotFoundError at once;
arguments checked before anything is sent."""
import os
import shutil
import tempfile
import time
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402

import sharedtensor as st  # noqa: E402


# The uid beta takes alpha's pushes as: ours, or nobody's for root (which
# as_uid may not name; root reads either).
PUSH_UID = os.getuid() or 65534


def start_pair(cls):
    """Starts alpha and beta for test class cls, sharing a cluster key,
    and waits for their link; skips when UCX is not usable between them.
    Sets cls.alpha, cls.beta and cls.keydir."""
    os.environ["UCX_TLS"] = "tcp"
    os.environ["UCX_NET_DEVICES"] = "lo"
    cls.keydir = tempfile.mkdtemp(prefix="stpy-key-")
    key = os.path.join(cls.keydir, "cluster.key")
    with open(key, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    os.chmod(key, 0o600)
    budget = "memory_budget = { cpu = 256 * 1024 * 1024 }, "
    cls.alpha = st_fixture.Server({}, config=budget + (
        "peer = { id = 'alpha', listen = '127.0.0.1:0', secret = %r, "
        "peers = { beta = {} }, export = { 'w/*' } }," % key))
    with st.Client(path=cls.alpha.socket) as c:
        addr = c.info()["peer"]["listen"]
    cls.beta = st_fixture.Server({}, config=budget + (
        "peer = { id = 'beta', secret = %r, peers = { alpha = { addr = %r, as_uid = %d } }, "
        "export = { 'w/*' } }," % (key, addr, PUSH_UID)))
    deadline = time.monotonic() + 20
    ucx, peers = [], {}
    with st.Client(path=cls.beta.socket) as c:
        while time.monotonic() < deadline:
            peers = {p["id"]: p for p in c.peers()}
            ucx = [e for e in peers["alpha"]["engines"] if e["name"] == "ucx"]
            if peers["alpha"]["state"] == "up" and ucx:
                break
            time.sleep(0.05)
    if not ucx:
        stop_pair(cls)
        raise AssertionError("beta's link to alpha did not come up: %r" % peers)
    if not ucx[0]["usable"]:
        stop_pair(cls)
        raise unittest.SkipTest("ucx is not usable: %s" % ucx[0]["why"])


def stop_pair(cls):
    """Stops both servers; fails on an unclean exit."""
    statuses = [cls.beta.stop(), cls.alpha.stop()]
    logs = cls.beta.log() + cls.alpha.log()
    cls.beta.cleanup()
    cls.alpha.cleanup()
    shutil.rmtree(cls.keydir, ignore_errors=True)
    if statuses != [0, 0]:
        raise AssertionError("stserver exited with %s; logs:\n%s" % (statuses, logs))


class PullTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        start_pair(cls)

    @classmethod
    def tearDownClass(cls):
        stop_pair(cls)

    def setUp(self):
        self.a = st.Client(path=self.alpha.socket)
        self.b = st.Client(path=self.beta.socket)

    def tearDown(self):
        for c in (self.a, self.b):
            for k in c.keys():
                c.delete(k["key"])
            c.close()

    def test_pull_wait_result(self):
        w = torch.arange(1 << 20, dtype=torch.float32)
        b = torch.full((3, 5), 7, dtype=torch.int64)
        self.assertEqual(self.a.put("w/model", {"w": w, "b": b, "step": 12}), 1)
        task = self.b.pull("w/model", "alpha", as_="copy/model")
        self.assertIsInstance(task, st.Task)
        self.assertIsInstance(task, int)
        info = task.wait(60)
        self.assertEqual(info["status"], "completed", info)
        self.assertTrue(task.done)
        self.assertEqual(task.status, "completed")
        r = task.result()
        self.assertEqual(r["key"], "copy/model")
        self.assertEqual(r["version"], 1)
        self.assertEqual(r["origin"], {"peer": "alpha", "key": "w/model", "version": 1})
        self.assertGreaterEqual(r["bytes"], w.numel() * 4 + b.numel() * 8)
        self.assertGreaterEqual(r["seconds"], 0)
        self.assertIs(task.result(), r)          # kept: asked again, the same
        got = self.b.get("copy/model")
        self.assertTrue(torch.equal(got["w"], w))
        self.assertTrue(torch.equal(got["b"], b))
        self.assertEqual(got["step"], 12)
        (entry,) = self.b.keys("copy/")
        self.assertEqual(entry["origin"], {"peer": "alpha", "key": "w/model", "version": 1})
        # The Task is its id for the Client's task methods.
        self.assertEqual(self.b.status(task)["status"], "completed")
        self.assertEqual(self.b.status(task.id)["id"], task)

    def test_result_waits_and_options(self):
        self.a.put("w/v", {"x": torch.ones(1000)})
        self.a.put("w/v", {"x": torch.zeros(1000)})
        task = self.b.pull("w/v", "alpha", version=1, device="cpu", policy="evictable",
                           readers={"uids": [4242]})
        r = task.result(timeout=60)
        self.assertEqual((r["key"], r["origin"]["version"]), ("w/v", 1))
        self.assertTrue(torch.equal(self.b.get("w/v")["x"], torch.ones(1000)))
        self.assertEqual(self.b.keys("w/v")[0]["policy"], "evictable")

    def test_live_pull_follows_updates(self):
        self.a.put("w/lv", {"w": torch.full((1 << 16,), 1.0)}, live=True)
        pub = self.a.live("w/lv")
        r = self.b.pull("w/lv", "alpha", live=True).result(timeout=60)
        self.assertEqual((r["key"], r["version"], r["live"]), ("w/lv", 1, True))
        mine = self.b.live("w/lv")
        self.assertFalse(mine.publisher)
        for v in range(2, 12):
            with pub.updating() as t:
                t["w"].fill_(float(v))
        self.assertEqual(pub.version, 11)
        mine.wait_version(11, timeout=30)
        seq = mine.read_begin(timeout=5)
        self.assertTrue(torch.all(mine.tensors["w"] == 11.0))
        self.assertTrue(mine.read_end(seq))
        rep = self.b.replicas("w/lv")
        self.assertEqual((rep["source"]["peer"], rep["source"]["version"],
                          rep["source"]["lost"]), ("alpha", 11, False))
        self.assertEqual([s["peer"] for s in self.a.replicas("w/lv")["subscribers"]], ["beta"])
        with self.assertRaises(st.InvalidArgumentError):
            self.b.put("w/lv", {"w": torch.zeros(1 << 16)}, live=True)
        self.assertEqual(self.b.unsubscribe("w/lv"), 11)
        with self.assertRaises(st.NotFoundError):
            self.b.unsubscribe("w/lv")
        self.assertIsNone(self.b.replicas("w/lv")["source"])
        mine.close()
        pub.close()

    def test_not_exported_raises_auth(self):
        self.a.put("secret", {"x": torch.ones(10)})
        task = self.b.pull("secret", "alpha")
        with self.assertRaises(st.AuthError) as cm:
            task.result(timeout=60)
        self.assertIn("key 'secret' is not exported to peers (peer.export of server 'alpha')",
                      str(cm.exception))
        self.assertIsInstance(cm.exception, PermissionError)
        self.assertEqual(task.status, "failed")
        self.assertEqual(task.info()["error"]["name"], "AUTH")
        with self.assertRaises(st.NotFoundError):
            self.b.get("secret")

    def test_refused_at_once(self):
        with self.assertRaises(st.NotFoundError) as cm:
            self.b.pull("w/model", "gamma")
        self.assertIn("'gamma' is not a peer of this server", str(cm.exception))
        for kwargs in ({"version": 0}, {"policy": "sticky"}, {"as_": ""}, {"device": "gpu"},
                       {"readers": {"users": [1]}}):
            with self.subTest(**kwargs):
                with self.assertRaises(st.InvalidArgumentError):
                    self.b.pull("w/model", "alpha", **kwargs)
        with self.assertRaises(st.InvalidArgumentError):
            self.b.pull("", "alpha")
        with self.assertRaises(st.InvalidArgumentError):
            self.b.replicate("w/model", [])

    def test_replicate(self):
        x = torch.arange(5000, dtype=torch.int32)
        self.a.put("w/r", {"x": x})
        task = self.a.replicate("w/r", ["beta"], as_="w/pushed")
        r = task.result(timeout=60)
        self.assertEqual((r["key"], r["version"]), ("w/r", 1))
        self.assertEqual(r["peers"], {"beta": {"ok": True, "version": 1}})
        self.assertTrue(torch.equal(self.b.get("w/pushed")["x"], x))
        # alpha takes no pushes: the task fails naming the peer.
        self.b.put("w/back", {"x": x})
        with self.assertRaises(st.AuthError) as cm:
            self.b.replicate("w/back", "alpha").result(timeout=60)
        self.assertIn("1 of 1 peers failed", str(cm.exception))
        with self.assertRaises(st.NotFoundError):
            self.b.replicate("w/back", ["gamma"])

    def test_submit_returns_a_task_too(self):
        with self.assertRaises(st.UnknownEndpointError):
            self.b.submit("no_such_endpoint")
        self.assertEqual(repr(st.Task(self.b, 7)), "Task(7)")


if __name__ == "__main__":
    unittest.main()
