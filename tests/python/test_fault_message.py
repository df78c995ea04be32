"""A write to read-only memory says what it hit before the process dies
(docs/python.md, "A write to read-only memory"; docs/client.md), against a
real stserver, each writer a Python process of its own:

  - an in-place op on a tensor of a key got read-only: the process dies of
    SIGSEGV as before, and stderr names the key, its version and what to do
    (get_into, .clone());
  - an optimizer step on a module bound to a live key another connection
    publishes: stderr names the live key and says it changes through its
    publisher's update;
  - Python's faulthandler, enabled first, still prints its traceback (the
    library's handler chains to it);
  - ST_NO_FAULT_HANDLER=1: the death as before, without the message.
"""
import os
import signal
import subprocess
import sys
import textwrap
import unittest

import st_fixture

st_fixture.add_package_path()

import torch  # noqa: E402  (run_tests.py skips without torch)

import sharedtensor as st  # noqa: E402


def in_child(socket, code, args=(), env=None):
    """Runs `code` in a fresh Python (extra interpreter `args`) with `c` a
    Client of the server; its return code (negative: the signal that ended
    it) and stderr."""
    prog = "import sys\nsys.path.insert(0, %r)\nimport torch\nimport sharedtensor as st\n" \
           "c = st.Client(path=%r)\n" % (os.path.join(os.environ["ST_SOURCE_DIR"], "python"),
                                        socket) + textwrap.dedent(code)
    r = subprocess.run([sys.executable] + list(args) + ["-c", prog], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, **(env or {})),
                       preexec_fn=lambda: __import__("resource").setrlimit(
                           __import__("resource").RLIMIT_CORE, (0, 0)))
    return r.returncode, r.stderr


WRITE_READONLY = """
    v = c.get("fw", readonly=True)
    v["w"].add_(1.0)
"""


class FaultMessageTest(st_fixture.KeysTestCase):

    def test_an_inplace_op_on_a_readonly_get_names_the_key(self):
        self.assertEqual(self.c.put("fw", {"w": st.zeros((16,))}), 1)
        rc, err = in_child(self.srv.socket, WRITE_READONLY)
        self.assertEqual(rc, -signal.SIGSEGV, err)
        self.assertIn("sharedtensor: write to read-only memory of key 'fw' (version 1) at 0x", err)
        self.assertIn("get_into", err)
        self.assertIn(".clone()", err)
        self.assertEqual(self.c.get("fw")["w"][0].item(), 0.0)

    def test_an_optimizer_step_on_a_bound_module_names_the_live_key(self):
        model = torch.nn.Linear(8, 2)
        self.c.put("policy", {k: v.detach().clone() for k, v in model.state_dict().items()},
                   live=True)
        rc, err = in_child(self.srv.socket, """
            model = torch.nn.Linear(8, 2)
            c.bind(model, "policy")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(4, 8)).sum().backward()
            opt.step()
        """)
        self.assertEqual(rc, -signal.SIGSEGV, err)
        self.assertIn("sharedtensor: write to read-only memory of live key 'policy' at 0x", err)
        self.assertIn("publisher's update", err)

    def test_faulthandler_enabled_first_still_prints(self):
        self.assertEqual(self.c.put("fw", {"w": st.zeros((16,))}), 1)
        rc, err = in_child(self.srv.socket, WRITE_READONLY, args=["-X", "faulthandler"])
        self.assertEqual(rc, -signal.SIGSEGV, err)
        self.assertIn("of key 'fw' (version 1)", err)
        self.assertIn("Passing the signal to the previous handler.", err)
        self.assertIn("Fatal Python error: Segmentation fault", err)
        self.assertLess(err.index("of key 'fw'"), err.index("Fatal Python error"))

    def test_the_message_is_turned_off_by_the_environment(self):
        self.assertEqual(self.c.put("fw", {"w": st.zeros((16,))}), 1)
        rc, err = in_child(self.srv.socket, WRITE_READONLY, env={"ST_NO_FAULT_HANDLER": "1"})
        self.assertEqual(rc, -signal.SIGSEGV, err)
        self.assertNotIn("sharedtensor:", err)


if __name__ == "__main__":
    unittest.main()
