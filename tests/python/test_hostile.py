"""The Python client against a hostile server (docs/python.md, "Who the
client trusts"): needs no framework.

  - a scripted server on a real socket sends descriptors that are not what
    their arena says (a backend other than memfd, an unsealed, short or
    read-only memfd, a pipe): each call raises ProtocolError. Every client
    runs in a child process that, should the call succeed, has the server
    truncate the file and then reads the tensor, so a SIGBUS shows as the
    child's death, never as the test runner's;
  - server_uid: a listener of another uid is refused with AuthError before
    the client sends a byte; the default (own uid or root) passes, against
    the scripted server and a real stserver;
  - a listener that never answers hello: Client(timeout=0.3) raises
    TimeoutError (sharedtensor's, a built-in TimeoutError) in about 0.3 s,
    not after the default 10 s; with no socket anywhere, the error names
    every default place tried.
"""
import fcntl
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import st_fixture

st_fixture.add_package_path()

import sharedtensor as st  # noqa: E402


# ------------------------------------------------------------ msgpack, minimal

class Ext:
    def __init__(self, code, data):
        self.code, self.data = code, data


def pack(v):
    """The msgpack bytes of None, bools, ints >= 0, str, list, dict, Ext
    (the sizes the replies below need)."""
    if v is None:
        return b"\xc0"
    if v is True or v is False:
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        return bytes([v]) if v < 128 else b"\xcf" + struct.pack(">Q", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, list):
        return bytes([0x90 | len(v)]) + b"".join(pack(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b"".join(pack(k) + pack(x) for k, x in v.items())
    if isinstance(v, Ext):
        return b"\xc7" + bytes([len(v.data), v.code]) + v.data
    raise TypeError(type(v))


TENSOR = Ext(1, pack({"arena": 0, "offset": 0, "dtype": "float32", "shape": [4],
                      "strides": [1]}))


def cpu_arena(backend="memfd", bytes_=4096, id_=1):
    return {"fd": 0, "bytes": bytes_, "device": "cpu", "backend": backend, "id": id_}


def memfd(size, seal=True):
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    os.pwrite(fd, struct.pack("<4f", 1, 2, 3, 4), 0)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


def read_only(fd):
    ro = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC)
    os.close(fd)
    return ro


def a_pipe():
    r, w = os.pipe()
    os.close(w)
    return r


# endpoint -> (arena entry, descriptor maker, part of the ProtocolError)
REPLIES = {
    "backend_file": (cpu_arena("file"), lambda: memfd(4096, seal=False),
                     "backend 'file' is not one of device 'cpu'"),
    "unsealed": (cpu_arena(id_=2), lambda: memfd(4096, seal=False),
                 "not sealed against shrinking"),
    "short": (cpu_arena(id_=3), lambda: memfd(32),
              "the descriptor says 4096 bytes but the file has 32"),
    "read_only": (cpu_arena(id_=4), lambda: read_only(memfd(4096)),
                  "not open for reading and writing"),
    "pipe": (cpu_arena(id_=5), a_pipe, "backend memfd, but the descriptor is a pipe"),
}


class FakeServer:
    """Answers hello, ping, `call` of the REPLIES endpoints, and `truncate`
    (shrinks the last memfd sent to 0 bytes), on a socket in a temp dir."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sthostile-")
        self.path = os.path.join(self.dir, "fake-0.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.requests = 0
        self.last_fd = -1
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve_conn, args=(conn,), daemon=True).start()

    def reply(self, conn, rid, result, fds=()):
        socket.send_fds(conn, [pack([1, rid, None, result])], list(fds))

    def serve_conn(self, conn):
        with conn:
            while True:
                data = conn.recv(65536)   # one small request per send
                if not data:
                    return
                with self.lock:
                    self.requests += 1
                rid = data[2]             # [0, id < 128, method, params]
                if b"hello" in data:
                    self.reply(conn, rid, {"protocol": 1, "version": "0.0.0-hostile",
                                           "server_id": "hostile", "pid": os.getpid(),
                                           "device": 0})
                elif b"truncate" in data:
                    with self.lock:
                        try:
                            os.ftruncate(self.last_fd, 0)
                            done = True
                        except OSError:         # sealed, or not writable
                            done = False
                    self.reply(conn, rid, done)
                elif b"ping" in data:
                    self.reply(conn, rid, "pong")
                else:
                    name = next(n for n in REPLIES if n.encode() in data)
                    arena, make, _ = REPLIES[name]
                    fd = make()
                    self.reply(conn, rid, {"value": TENSOR, "arenas": [arena]}, [fd])
                    with self.lock:
                        if self.last_fd >= 0:
                            os.close(self.last_fd)
                        self.last_fd = fd

    def close(self):
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.dir)
        if self.last_fd >= 0:
            os.close(self.last_fd)


# The client of a child process: the call's error, or, when the call maps
# something, the server truncates the file and the child reads the tensor.
CHILD = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import sharedtensor as st
c = st.Client(path=sys.argv[2], framework=None)
try:
    t = c.call(sys.argv[3])
except st.Error as e:
    print(type(e).__name__ + ": " + str(e))
    sys.exit(0)
c.rpc("truncate")
ctypes.string_at(t.data_ptr, 4)
print("mapped and read")
sys.exit(1)
"""


class HostileDescriptors(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.fs = FakeServer()

    @classmethod
    def tearDownClass(cls):
        cls.fs.close()

    def test_each_descriptor_is_a_protocol_error_not_a_signal(self):
        pkg = os.path.join(st_fixture.env("ST_SOURCE_DIR"), "python")
        for name, (_, _, part) in REPLIES.items():
            with self.subTest(endpoint=name):
                p = subprocess.run([sys.executable, "-c", CHILD, pkg, self.fs.path, name],
                                   capture_output=True, text=True, timeout=60)
                self.assertGreaterEqual(p.returncode, 0, "the client died of signal %d; %s"
                                        % (-p.returncode, p.stderr))
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertIn("ProtocolError: ", p.stdout)
                self.assertIn(part, p.stdout)

    def test_server_uid(self):
        me = os.geteuid()
        st.Client(path=self.fs.path, framework=None).close()
        st.Client(path=self.fs.path, framework=None, server_uid=me).close()
        with self.fs.lock:
            seen = self.fs.requests
        with self.assertRaises(st.AuthError) as cm:
            st.Client(path=self.fs.path, framework=None, server_uid=me + 1)
        self.assertIn("runs as uid %d; this client expects uid %d" % (me, me + 1),
                      str(cm.exception))
        with self.fs.lock:
            self.assertEqual(self.fs.requests, seen)   # not even hello
        for bad in (-1, "0", True):
            with self.assertRaises(ValueError):
                st.Client(path=self.fs.path, server_uid=bad)


class ConnectLimits(unittest.TestCase):

    def test_timeout_covers_connecting(self):
        with tempfile.TemporaryDirectory(prefix="stpy-") as d:
            path = os.path.join(d, "silent.sock")
            with socket.socket(socket.AF_UNIX) as l:
                l.bind(path)
                l.listen(8)            # connect succeeds; nobody reads hello
                t0 = time.monotonic()
                with self.assertRaises(st.TimeoutError) as cm:
                    st.Client(path=path, timeout=0.3, framework=None)
                took = time.monotonic() - t0
        self.assertIsInstance(cm.exception, TimeoutError)
        self.assertGreaterEqual(took, 0.29)
        self.assertLess(took, 2.3)
        self.assertIn("did not answer hello within 300 ms", str(cm.exception))
        for bad in (-1, "1", True):
            with self.assertRaises(ValueError):
                st.Client(path=path, timeout=bad)

    def test_no_socket_names_every_place_tried(self):
        with tempfile.TemporaryDirectory(prefix="stpy-") as d:
            keep = {k: os.environ.get(k) for k in
                    ("XDG_RUNTIME_DIR", "SHARED_TENSOR_TEST_RUN_DIR", "SHARED_TENSOR_BASE_PATH")}
            os.environ.pop("SHARED_TENSOR_BASE_PATH", None)
            os.environ["XDG_RUNTIME_DIR"] = d + "/xdg"
            os.environ["SHARED_TENSOR_TEST_RUN_DIR"] = d + "/run"
            try:
                with self.assertRaises(st.IoError) as cm:
                    st.Client(device=4093, framework=None)
            finally:
                for k, v in keep.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        self.assertIn("no socket at %s/xdg/sharedtensor/st-4093.sock, %s/run/sharedtensor/"
                      "st-4093.sock or /tmp/shared-tensor-4093.sock" % (d, d), str(cm.exception))


class RealServerUid(st_fixture.ServerTestCase):
    ENDPOINTS = {"t.lua": "return st.endpoint{ name = 't', build = function() return 1 end }"}

    def test_the_default_passes_and_another_uid_is_refused(self):
        self.assertEqual(self.c.call("t"), 1)
        with self.assertRaises(st.AuthError) as cm:
            st.Client(path=self.srv.socket, server_uid=os.geteuid() + 1)
        self.assertIn("the server at %s runs as uid %d" % (self.srv.socket, os.geteuid()),
                      str(cm.exception))


if __name__ == "__main__":
    unittest.main()
