"""A real stserver in a private temp dir, for the Python tests.

    srv = Server(endpoints={"e.lua": "return st.endpoint{...}"})
    ...                       # srv.socket, srv.base, srv.dir
    assert srv.stop() == 0    # SIGTERM, then the exit status

Paths come from the environment ctest sets (ST_SERVER_BIN, ST_CLI_BIN,
ST_CLIENT_LIB, ST_SOURCE_DIR). start() polls `stcli ping` with a deadline;
nothing sleeps blindly.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest


def env(name):
    v = os.environ.get(name)
    if not v:
        raise RuntimeError("%s is not set: run the tests through ctest" % name)
    return v


def add_package_path():
    """Makes `import sharedtensor` find the package of this source tree."""
    src = os.path.join(env("ST_SOURCE_DIR"), "python")
    if src not in sys.path:
        sys.path.insert(0, src)


def _loop_threads():
    """STT_LOOP_THREADS=N runs every test server on N loop threads (the
    suite runs so with 1 and 4); a test's own config comes later and wins."""
    n = os.environ.get("STT_LOOP_THREADS")
    return "  loop_threads = %d,\n" % int(n) if n else ""


class Server:
    def __init__(self, endpoints, config="", default_device="cpu"):
        self.dir = tempfile.mkdtemp(prefix="stpy-")
        self.base = os.path.join(self.dir, "st")
        self.socket = self.base + "-0.sock"
        epdir = os.path.join(self.dir, "endpoints")
        os.mkdir(epdir)
        for name, text in endpoints.items():
            with open(os.path.join(epdir, name), "w") as f:
                f.write(text)
        self.config = os.path.join(self.dir, "config.lua")
        with open(self.config, "w") as f:
            f.write("return {\n  base_path = %r,\n  endpoints = %r,\n  workers = 2,\n"
                    "  log_level = 'debug',\n  default_device = %r,\n%s\n}\n"
                    % (self.base, epdir, default_device, _loop_threads() + config))
        self.log_path = os.path.join(self.dir, "server.log")
        self.proc = None
        self.start()

    def start(self):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([env("ST_SERVER_BIN"), "--config", self.config],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            r = subprocess.run([env("ST_CLI_BIN"), "--socket", self.socket, "ping"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return
        self.stop()
        raise RuntimeError("stserver did not start; log:\n" + self.log())

    def log(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        """SIGTERM; the exit status (waits up to 10 s, then kills: -9)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        self.proc = None
        return status

    def cleanup(self):
        if not os.environ.get("STT_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)


class ServerTestCase(unittest.TestCase):
    """A test class served by one stserver for all its tests (started with
    ENDPOINTS and SERVER_OPTIONS, stopped and checked for a clean exit at
    the end), with a fresh sharedtensor.Client per test in self.c."""

    ENDPOINTS = {}
    SERVER_OPTIONS = {}

    @classmethod
    def setUpClass(cls):
        cls.srv = Server(cls.ENDPOINTS, **cls.SERVER_OPTIONS)

    @classmethod
    def tearDownClass(cls):
        status = cls.srv.stop()
        log = cls.srv.log()
        cls.srv.cleanup()
        if status != 0:
            raise AssertionError("stserver exited with %s; log:\n%s" % (status, log))

    def setUp(self):
        import sharedtensor
        # Each test starts with no kept results (docs/python.md, "Kept
        # results") and the default bound.
        sharedtensor.convert.reuse_clear()
        sharedtensor.keep_results()
        self.c = sharedtensor.Client(path=self.srv.socket)

    def tearDown(self):
        self.c.close()
