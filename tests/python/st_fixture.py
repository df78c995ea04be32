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


# Endpoint files that several tests serve.
# echo: returns its required argument `value`.
EP_ECHO = """
return st.endpoint { name = "echo", params = { value = st.required },
  build = function(a) return a.value end }
"""
# scale: multiplies the tensor argument x by k (2.5) in place.
EP_SCALE = """
return st.endpoint { name = "scale", params = { x = st.tensor_param {}, k = 2.5 },
  build = function(a) return a.x:mul_(a.k) end }
"""
# geometry: the shape, strides, first element, dtype and device of x.
EP_GEOMETRY = """
return st.endpoint { name = "geometry", params = { x = st.tensor_param {} },
  build = function(a)
    return { shape = a.x:shape(), stride = a.x:stride(), first = a.x:get(0, 0),
             dtype = a.x:dtype(), device = a.x:device() }
  end }
"""


def optional_import(name):
    """The module `name`, or None where it is not installed (run_tests.py
    skips a test that needs it first)."""
    try:
        return __import__(name)
    except ImportError:
        return None


def slow_value(ptr):
    """The node-by-node conversion (torch) of the st_result_t at `ptr`,
    which it frees: what the per-call shortcuts must equal."""
    from sharedtensor import client
    from sharedtensor.tensor import Result
    res = Result(ptr)
    try:
        return client._slow_value(res, "torch")
    finally:
        res.close()


def run_example(test, name, *args):
    """Runs examples/<name>/run.sh with args under this interpreter and
    build (240 s at most) and asserts (on `test`) that it exited 0.
    Returns its stdout and its stdout and stderr together."""
    script = os.path.join(env("ST_SOURCE_DIR"), "examples", name, "run.sh")
    e = dict(os.environ, ST_PYTHON=sys.executable, ST_BUILD_DIR=env("ST_BUILD_DIR"))
    out = subprocess.run(["sh", script] + list(args), capture_output=True, text=True,
                         timeout=240, env=e)
    text = out.stdout + out.stderr
    test.assertEqual(out.returncode, 0, text)
    return out.stdout, text


def start_repo_server(directory, extra_env=None):
    """The server of the README's command 1: ST_SERVER_BIN --config
    config.lua in the repository root, on the private socket base
    <directory>/st (SHARED_TENSOR_BASE_PATH), its log in
    <directory>/server.log. Returns (process, environment for the clients,
    log path) once `stcli ping` answers; raises with the log when it does
    not start."""
    src = env("ST_SOURCE_DIR")
    cenv = dict(os.environ, SHARED_TENSOR_BASE_PATH=os.path.join(directory, "st"),
                PYTHONPATH=os.path.join(src, "python"), **(extra_env or {}))
    log_path = os.path.join(directory, "server.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([env("ST_SERVER_BIN"), "--config", "config.lua"], cwd=src,
                                env=cenv, stdout=log, stderr=subprocess.STDOUT)
    sock = cenv["SHARED_TENSOR_BASE_PATH"] + "-0.sock"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        if subprocess.run([env("ST_CLI_BIN"), "--socket", sock, "ping"],
                          capture_output=True).returncode == 0:
            return proc, cenv, log_path
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    with open(log_path, errors="replace") as f:
        raise RuntimeError("the server on config.lua did not start:\n" + f.read())


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
    # True: each test ends by deleting every key (the server outlives it).
    DELETE_KEYS = False

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
        if self.DELETE_KEYS:
            for k in self.c.keys():
                self.c.delete(k["key"])
        self.c.close()


class KeysTestCase(ServerTestCase):
    """A ServerTestCase for tests of published keys: a 64 MiB CPU budget,
    two versions a key, and every key deleted after each test."""

    SERVER_OPTIONS = {"config": "memory_budget = { cpu = 64 * 1024 * 1024 }, "
                                "keys = { max_versions = 2 },"}
    DELETE_KEYS = True
