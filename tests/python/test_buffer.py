"""Buffers and streams from Python (sharedtensor.buffer_create / open / Buffer)
against a real stserver, CPU memory, other handles in processes of their
own: write/read (torch and numpy, out=, safe=False), write_sequence and
write_time, read_new waking on a write from another process and timing
out, the writer lock freed when its owner is SIGKILLed, read-only handles
refusing writes (and a write through a view killing its own process),
unlink while handles hold the memory, clear errors on bad arguments and
closed handles."""
import ctypes
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


class BufferCase(ServerTestCase):
    """Buffers the test makes on its server, unlinked and closed at its end."""

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


class BufferTest(BufferCase):
    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 1024 * 1024 },"}


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
        with b.locked():
            view = b.read(safe=False)                # the newest slot, no copy
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
            from sharedtensor import _lib
            p = _lib.lib.st_buffer_slot(r._ptr, 0)
            print("view", bool(p), flush=True)
            import ctypes
            ctypes.memset(p, 0, 4)
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
                     b.locked, b.unlink, lambda: b.write_sequence, b.clear):
            with self.assertRaises(ValueError) as e:
                call()
            self.assertIn("buffer 'py6' is closed", str(e.exception))



class PyshmemParityTest(BufferCase):
    """What pyshmem's suite expects of a stream: unsigned dtypes, clear(),
    a re-entrant writer lock, read(safe=False) only under the lock, and
    locked() both a query and a context manager (docs/migration.md)."""

    ENDPOINTS = {"u.lua": """return st.endpoint {
        name = "u",
        params = { dtype = "uint16" },
        build = function(a)
          local t = st.zeros { 3, dtype = a.dtype }
          t:set(0, 65535) t:set(1, 7)
          return t
        end }"""}


    def test_unsigned_dtypes(self):
        for name, top in (("uint16", 2**16 - 1), ("uint32", 2**32 - 1), ("uint64", 2**64 - 1)):
            npd = np.dtype(name)
            x = np.array([[0, 1, top, top - 1]], npd)
            b = self.make("u_" + name, (1, 4), name, framework="numpy")
            self.assertEqual((b.dtype, b.nbytes), (npd, 4 * npd.itemsize))
            b.write(x)
            y = b.read()
            self.assertEqual(y.dtype, npd)
            self.assertTrue(np.array_equal(y, x), (name, y))
            t = st.buffer_open("u_" + name, path=self.srv.socket)   # framework="torch"
            with t:
                if isinstance(getattr(torch, name, None), torch.dtype):
                    self.assertEqual(t.dtype, getattr(torch, name))
                else:                                # torch < 2.3: numpy frames
                    self.assertEqual((t.framework, t.dtype), ("numpy", npd))
                    self.assertTrue(np.array_equal(t.read(), x))
            a = st.empty((2,), name, framework="numpy")
            self.assertEqual((a.dtype, a.tolist()), (npd, [0, 0]))
            s = st.empty((2,), name, framework=None)
            self.assertEqual(s.dtype, name)
            if not isinstance(getattr(torch, name, None), torch.dtype):
                self.assertIsInstance(self.c.call("u", dtype=name), st.SharedTensor)
            r = self.c.call("u", dtype=name, as_torch=False)
            self.assertEqual(r.dtype, name)
            self.assertEqual(np.from_dlpack(r).tolist(), [65535, 7, 0])
        with self.assertRaises(TypeError) as e:
            st.empty((2,), "uint128")
        self.assertIn("uint16, uint32, uint64", str(e.exception))

    def test_clear_zeroes_every_slot_as_one_more_write(self):
        b = self.make("clr", slots=3)
        for k in range(4):
            b.write(torch.full((4, 8), k + 1.0))
        r = st.buffer_open("clr", readonly=True, path=self.srv.socket)
        self.addCleanup(r.close)
        self.assertEqual(r.read()[0, 0].item(), 4.0)
        self.assertEqual(b.clear(), 5)
        self.assertEqual(b.write_sequence, 5)
        self.assertTrue(torch.equal(r.read_new(timeout=1), torch.zeros(4, 8)))
        from sharedtensor import _lib
        for i in range(3):                           # no slot keeps an old frame
            raw = (ctypes.c_float * 32).from_address(_lib.lib.st_buffer_slot(b._ptr, i))
            self.assertEqual(list(raw), [0.0] * 32, i)
        with self.assertRaises(errors.InvalidArgumentError):
            r.clear()                                # read-only
        self.assertTrue(b.acquire())                 # under a held lock too
        self.assertEqual(b.clear(), 6)
        b.release()

    def test_the_writer_lock_is_reentrant_per_handle(self):
        b = self.make("rl")
        self.assertTrue(b.acquire(timeout=1))
        self.assertTrue(b.acquire(timeout=1))        # counts: no error
        self.assertEqual(b.held, 2)
        b.write(torch.ones(4, 8))
        b.release()
        self.assertTrue(b.locked())                  # one acquire still open
        with st.buffer_open("rl", path=self.srv.socket) as o:
            self.assertFalse(o.acquire(timeout=0.05))
            b.release()
            self.assertFalse(b.locked())
            self.assertTrue(o.acquire(timeout=1))
            o.release()
        with self.assertRaises(errors.InvalidArgumentError) as e:
            b.release()
        self.assertIn("does not hold the writer lock", str(e.exception))

    def test_read_unsafe_needs_the_lock(self):
        b = self.make("rv")
        b.write(torch.full((4, 8), 2.0))
        with self.assertRaises(errors.InvalidArgumentError) as e:
            b.read(safe=False)
        self.assertIn("take it first (b.acquire()", str(e.exception))
        b.acquire()
        v = b.read(safe=False)
        self.assertTrue(torch.equal(v, torch.full((4, 8), 2.0)))
        b.release()
        with st.buffer_open("rv", readonly=True, path=self.srv.socket) as r:
            with self.assertRaises(errors.InvalidArgumentError) as e:
                r.read(safe=False)
            self.assertIn("a read-only handle cannot hold the lock", str(e.exception))

    def test_locked_is_a_query_and_a_context_manager(self):
        b = self.make("lk")
        self.assertFalse(b.locked())
        self.assertEqual(b.locked(), False)
        with b.locked() as h:
            self.assertIs(h, b)
            self.assertTrue(b.locked())
            self.assertEqual(b.locked(), True)
            self.assertEqual(b.held, 1)
            v = b.read(safe=False)
            self.assertEqual(v.shape, (4, 8))
            with b.locked():                         # nested: re-entrant
                self.assertEqual(b.held, 2)
        self.assertFalse(b.locked())
        self.assertEqual(b.held, 0)
        with st.buffer_open("lk", path=self.srv.socket) as o:
            o.acquire()
            with self.assertRaises(st.TimeoutError):
                with b.locked(timeout=0.05):
                    pass
            o.release()


if __name__ == "__main__":
    unittest.main()
