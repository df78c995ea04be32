"""Buffers and streams from Python (sharedtensor.buffer_create / open / Buffer)
against a real stserver, CPU memory, other handles in processes of their
own: write/read (torch and numpy, out=, safe=False), write_sequence and
write_time, read_new waking on a write from another process and timing
out, the writer lock freed when its owner is SIGKILLed, read-only handles
refusing writes (and a write through a view killing its own process),
unlink while handles hold the memory, clear errors on bad arguments and
closed handles."""
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest

import st_fixture
from st_fixture import ServerTestCase

st_fixture.add_package_path()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sharedtensor as st  # noqa: E402
from sharedtensor import errors  # noqa: E402


def run_child(code, socket, wait=True):
    """A python process running `code` with `sock` and `st` defined."""
    prog = "import sys, time, sharedtensor as st, torch\nsock = %r\n" % socket + \
        textwrap.dedent(code)
    envv = dict(os.environ)
    envv["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=envv)
    if not wait:
        return p
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


class BufferTest(ServerTestCase):
    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 1024 * 1024 },"}

    def make(self, name, shape=(4, 8), dtype="float32", **kw):
        b = st.buffer_create(name, shape, dtype, path=self.srv.socket, **kw)
        self.addCleanup(self.drop, b)
        return b

    def drop(self, b):
        if not b.closed:
            try:
                b.unlink()
            except errors.Error:
                pass
            b.close()

    def test_write_read_torch_and_numpy(self):
        b = self.make("py1", slots=2)
        self.assertEqual((b.shape, b.dtype, b.slots, b.nbytes, b.device, b.readonly),
                         ((4, 8), torch.float32, 2, 128, "cpu", False))
        self.assertEqual((b.write_sequence, b.write_time), (0, 0.0))
        self.assertTrue(torch.equal(b.read(), torch.zeros(4, 8)))
        x = torch.arange(32, dtype=torch.float32).reshape(4, 8)
        t0 = time.time()
        self.assertEqual(b.write(x), 1)
        self.assertEqual(b.write_sequence, 1)
        self.assertTrue(t0 - 1 <= b.write_time <= time.time() + 1)
        y = b.read()
        self.assertTrue(torch.equal(x, y))
        y[0, 0] = 99                                 # a copy: the buffer keeps x
        self.assertTrue(torch.equal(b.read(), x))
        out = torch.empty(4, 8)
        self.assertIs(b.read(out=out), out)
        self.assertTrue(torch.equal(out, x))
        view = b.read(safe=False)                    # the newest slot, no copy
        self.assertTrue(torch.equal(view, x))
        with st.buffer_open("py1", framework="numpy", path=self.srv.socket) as n:
            a = n.read()
            self.assertIsInstance(a, np.ndarray)
            self.assertTrue(np.array_equal(a, x.numpy()))
            self.assertEqual(n.write(np.full((4, 8), 7, np.float32)), 2)
        self.assertTrue(torch.equal(b.read(), torch.full((4, 8), 7.0)))
        self.assertEqual(b.last_sequence, 2)
        with self.assertRaises(ValueError):
            b.write(torch.zeros(3))                  # another size
        with self.assertRaises(TypeError):
            b.write([1, 2, 3])

    def test_read_new_wakes_on_a_write_of_another_process_and_times_out(self):
        b = self.make("py2")
        for ro, spin in ((False, 0), (True, 0), (False, 2000000 // 2)):
            p = run_child("""
                b = st.buffer_open("py2", readonly=%r, path=sock)
                b.set_spin(%d)
                print("ready", flush=True)
                x = b.read_new(timeout=20)
                print("got", b.last_sequence, float(x[0, 0]), flush=True)
                t0 = time.monotonic()
                try:
                    b.read_new(timeout=0.15)
                    print("no timeout")
                except st.TimeoutError as e:
                    print("timeout %%.3f %%s" %% (time.monotonic() - t0, e))
                b.close()
            """ % (ro, spin), self.srv.socket, wait=False)
            self.assertEqual(p.stdout.readline().strip(), "ready")
            seq = b.write(torch.full((4, 8), 5.0 + ro))
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
            lines = out.splitlines()
            self.assertEqual(lines[0], "got %d %s" % (seq, 5.0 + ro), err)
            self.assertTrue(lines[1].startswith("timeout "), out)
            self.assertGreaterEqual(float(lines[1].split()[1]), 0.14)
            self.assertLess(float(lines[1].split()[1]), 0.9)   # a poll ends at the timeout
            self.assertIn("no write after %d within 150 ms" % seq, lines[1])
        with self.assertRaises(st.InvalidArgumentError):
            b.set_spin(-2)

    def test_the_lock_of_a_killed_owner_is_freed(self):
        b = self.make("py3")
        p = run_child("""
            b = st.buffer_open("py3", path=sock)
            assert b.acquire(timeout=5)
            print("locked", b.connection, flush=True)
            time.sleep(600)
        """, self.srv.socket, wait=False)
        line = p.stdout.readline().split()
        self.assertEqual(line[0], "locked")
        self.assertTrue(b.locked())
        self.assertEqual(b.owner, (int(line[1]), p.pid, False))
        self.assertFalse(b.acquire(timeout=0.05))
        with self.assertRaises(st.TimeoutError):
            b.write(torch.zeros(4, 8), timeout=0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        t0 = time.monotonic()
        self.assertTrue(b.acquire(timeout=10))
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(b.owner[2], True)
        b.write(torch.ones(4, 8))
        b.release()
        self.assertFalse(b.locked())
        with self.assertRaises(errors.InvalidArgumentError):
            b.release()

    def test_read_only_handles_refuse_writes(self):
        b = self.make("py4")
        b.write(torch.ones(4, 8))
        with st.buffer_open("py4", readonly=True, path=self.srv.socket) as r:
            self.assertTrue(r.readonly)
            self.assertTrue(torch.equal(r.read(), torch.ones(4, 8)))
            with self.assertRaises(errors.InvalidArgumentError) as e:
                r.write(torch.zeros(4, 8))
            self.assertIn("opened read-only", str(e.exception))
            with self.assertRaises(errors.InvalidArgumentError):
                r.acquire()
        # a write through a read-only view faults in the writer's process
        code, out, err = run_child("""
            r = st.buffer_open("py4", readonly=True, path=sock, framework="numpy")
            v = r.read(safe=False)
            print("view", v.flags.writeable, flush=True)
            import ctypes
            ctypes.memset(v.__array_interface__["data"][0], 0, 4)
            print("wrote")
        """, self.srv.socket)
        self.assertEqual(code, -signal.SIGSEGV, out + err)
        self.assertIn("view", out)
        self.assertNotIn("wrote", out)
        self.c.ping()                                # the server lives
        self.assertTrue(torch.equal(b.read(), torch.ones(4, 8)))

    def test_unlink_while_handles_hold_it(self):
        b = self.make("py5")
        o = st.buffer_open("py5", path=self.srv.socket)
        self.addCleanup(o.close)
        b.write(torch.full((4, 8), 3.0))
        st.buffer_unlink("py5", path=self.srv.socket)
        with self.assertRaises(errors.NotFoundError):
            st.buffer_open("py5", path=self.srv.socket)
        o.write(torch.full((4, 8), 4.0))
        self.assertTrue(torch.equal(b.read(), torch.full((4, 8), 4.0)))
        n = self.make("py5", shape=(2,))             # the name is free again
        self.assertEqual(n.write_sequence, 0)

    def test_clear_errors(self):
        with self.assertRaises(errors.InvalidArgumentError) as e:
            st.buffer_create("a/b", (2,), path=self.srv.socket)
        self.assertIn("a buffer name is 1 to 64 characters", str(e.exception))
        with self.assertRaises(errors.InvalidArgumentError) as e:
            st.buffer_create("z", (2, 0), path=self.srv.socket)
        self.assertIn("'shape' dimension 1 is 0", str(e.exception))
        with self.assertRaises(TypeError):
            st.buffer_create("z", (2,), "complex128", path=self.srv.socket)
        with self.assertRaises(errors.InvalidArgumentError):
            st.buffer_create("z", (2,), slots=5000, path=self.srv.socket)
        with self.assertRaises(errors.NotFoundError) as e:
            st.buffer_open("none", path=self.srv.socket)
        self.assertIn("no buffer named 'none'", str(e.exception))
        b = self.make("py6")
        with self.assertRaises(errors.InvalidArgumentError) as e:
            st.buffer_create("py6", (1,), path=self.srv.socket)
        self.assertIn("a buffer named 'py6' exists", str(e.exception))
        b.unlink()
        b.close()
        b.close()                                    # twice is fine
        for call in (b.read, lambda: b.write(torch.zeros(4, 8)), b.acquire, b.release,
                     b.locked, b.unlink, lambda: b.write_sequence):
            with self.assertRaises(ValueError) as e:
                call()
            self.assertIn("buffer 'py6' is closed", str(e.exception))


if __name__ == "__main__":
    unittest.main()
