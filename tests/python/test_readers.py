"""Read grants from Python (docs/python.md, "Published keys";
docs/protocol.md, "Owners") against a real stserver with two uids: the
test (root) and a child process that becomes uid 65534 and connects
(allow_uids admits it):

  - put(..., readers={"uids": [65534]}): the child gets the key (read-only)
    and may not delete it; a key without the grant is NOT_FOUND to it;
  - buffer_create(..., readers=...): the child opens the buffer read-only
    and reads the frame; read-write is AUTH; an ungranted buffer is
    NOT_FOUND;
  - Handoff.create(..., readers=...): the child opens it as a consumer; an
    ungranted hand-off is NOT_FOUND;
  - a put with readers={} revokes the grant;
  - malformed readers are InvalidArgumentError before anything is sent.
Needs root (to become uid 65534); skipped otherwise.
"""
import os
import subprocess
import sys
import textwrap
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402  (run_tests.py skips without torch)

import sharedtensor as st  # noqa: E402
from sharedtensor.handoff import Handoff  # noqa: E402

NOBODY = 65534


def _become_nobody():
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


@unittest.skipUnless(os.getuid() == 0, "needs root to become uid 65534")
class ReadersTest(st_fixture.ServerTestCase):
    SERVER_OPTIONS = {"config": "allow_uids = { 65534 }, "
                                "memory_budget = { cpu = 64 * 1024 * 1024 },"}
    DELETE_KEYS = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        os.chmod(cls.srv.dir, 0o711)
        os.chmod(cls.srv.socket, 0o666)

    def as_nobody(self, code):
        """Runs `code` in a fresh Python as uid 65534 with `c` a Client of
        the server and `st` the package; its printed lines."""
        prog = ("import sys\nsys.path.insert(0, %r)\nimport torch\nimport sharedtensor as st\n"
                "from sharedtensor.handoff import Handoff\nc = st.Client(path=%r)\n"
                "def code_of(f):\n"
                "    try:\n"
                "        f()\n"
                "        return 'OK'\n"
                "    except st.Error as e:\n"
                "        return e.name\n"
                % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"), self.srv.socket)
                + textwrap.dedent(code))
        env = dict(os.environ, HOME="/tmp")
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                           timeout=120, preexec_fn=_become_nobody, env=env, cwd="/")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout.split()

    def test_key_granted_to_a_uid(self):
        v1 = self.c.put("granted", {"w": st.zeros(4) + 7}, readers={"uids": [NOBODY]})
        self.c.put("private", {"w": st.zeros(4)})
        out = self.as_nobody("""
            print(int(c.get("granted")["w"].sum().item()))
            print(code_of(lambda: c.get("private")))
            print(code_of(lambda: c.delete("granted")))
            print(code_of(lambda: c.put("granted", {"w": torch.ones(4)})))
        """)
        self.assertEqual(out, ["28", "NOT_FOUND", "AUTH", "AUTH"])
        # A put without readers keeps the grant; readers={} revokes it.
        self.assertEqual(self.c.put("granted", {"w": st.zeros(4) + 1}), v1 + 1)
        self.assertEqual(self.as_nobody('print(int(c.get("granted")["w"].sum().item()))'),
                         ["4"])
        self.c.put("granted", {"w": st.zeros(4)}, readers={})
        self.assertEqual(self.as_nobody('print(code_of(lambda: c.get("granted")))'),
                         ["NOT_FOUND"])

    def test_key_granted_to_a_group(self):
        self.c.put("bygroup", {"w": st.zeros(2) + 3}, readers={"gids": [NOBODY]})
        self.assertEqual(self.as_nobody('print(int(c.get("bygroup")["w"].sum().item()))'),
                         ["6"])

    def test_buffer_granted(self):
        b = st.buffer_create("rbuf", [4], dtype="int32", path=self.srv.socket,
                             readers={"uids": [NOBODY]})
        p = st.buffer_create("pbuf", [4], dtype="int32", path=self.srv.socket)
        try:
            b.write(torch.arange(4, dtype=torch.int32))
            out = self.as_nobody("""
                r = st.buffer_open("rbuf", readonly=True, path=%r)
                print(int(r.read().sum().item()))
                r.close()
                print(code_of(lambda: st.buffer_open("rbuf", path=%r)))
                print(code_of(lambda: st.buffer_open("pbuf", readonly=True, path=%r)))
            """ % (self.srv.socket, self.srv.socket, self.srv.socket))
            self.assertEqual(out, ["6", "AUTH", "NOT_FOUND"])
        finally:
            b.close()
            p.close()
            st.buffer_unlink("rbuf", path=self.srv.socket)
            st.buffer_unlink("pbuf", path=self.srv.socket)

    def test_handoff_granted(self):
        h = Handoff.create(self.c, "rho", 64, 2, 1, readers={"uids": [NOBODY]})
        p = Handoff.create(self.c, "pho", 64, 2, 1)
        try:
            out = self.as_nobody("""
                h = Handoff.open(c, "rho")
                print(h.slot)
                h.close()
                print(code_of(lambda: Handoff.open(c, "pho")))
            """)
            self.assertEqual(out, ["0", "NOT_FOUND"])
        finally:
            h.close()
            p.close()

    def test_bad_readers(self):
        for bad in ({"uids": 5}, {"users": [1]}, [1], {"uids": [-1]}, {"gids": ["x"]}):
            with self.assertRaises(st.InvalidArgumentError, msg=repr(bad)):
                self.c.put("bad", {"w": st.zeros(1)}, readers=bad)
        with self.assertRaisesRegex(st.InvalidArgumentError, "at most 16"):
            self.c.put("bad", {"w": st.zeros(1)}, readers={"uids": list(range(17))})
        self.assertEqual(self.c.keys(), [])


if __name__ == "__main__":
    unittest.main()
