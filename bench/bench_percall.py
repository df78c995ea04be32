#!/usr/bin/env python3
"""bench_percall: one call's cost through the Python package, next to C.

    build/bench/bench_percall.sh [--device cpu|cuda] [--iters N] [--server STSERVER]
    python3 bench/bench_percall.py --build build [--device cpu|cuda] [--iters N]

Starts its own stserver (a temp dir, a small memory_budget, the endpoints
below on --device), runs build/bench/bench_percall (the same rows through
libstclient from C, and the raw Unix-socket ping-pong, the floor) against
it, then times each row through sharedtensor (torch tensors) and, on the
CPU when luajit is installed, through the Lua client (bench_percall.lua),
and prints one table: p50 and p99 of each side in microseconds, and
Python/C and Lua/C at p50.

Rows (issues 12 and 32): ping; a cached 16-float tensor with one result kept (the
mapping is reused); the same with every result dropped (mapped and
unmapped each call, unless the client keeps arenas); a plain endpoint
returning a fresh 4-float tensor; a managed and cached call + release; a
managed call with a fresh result + release; submit + wait; a 4 KiB tensor
argument returned, and the same call with an integer argument; a
300-tensor module called again with its mapping cached; a managed call
of a held 300-tensor module + release; info(); info() with the task table
full (tasks.capacity = TASKS_FULL: two tasks of a serialized endpoint
that sleeps, one running and one waiting for its turn, the rest finished
quick tasks; the C side fills it, or the Python side when it runs that
row alone). Python alone: the cached call kept through ctypes only
(st_client_call_summary with ST_CALL_LEND_SAME, no conversion; with an
older library, + st_result_free: what the package's own Python adds is
the row above minus this one). After the table, whether the rows that
keep a result reused its torch tensors (the same objects, no DLPack:
docs/python.md, "What a call costs"): a "no"
there means every call converted afresh. --profile NAME runs one Python
row under cProfile instead. --server runs another stserver binary (an
older build's, say) against the same clients; $ST_CLIENT_LIB and
--package pick the library and the Python package. Timings are printed,
never asserted.
"""
import argparse
import ctypes
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

ENDPOINTS = """
local function t(n) return st.arange { n, dtype = "float32" } end
return {
  st.endpoint { name = "cached16", cache = true, build = function() return t(16) end },
  st.endpoint { name = "fresh4", build = function() return t(4) end },
  st.endpoint { name = "mcached16", managed = true, cache = true, build = function() return t(16) end },
  st.endpoint { name = "managed16", managed = true, build = function() return t(16) end },
  st.endpoint { name = "quick", build = function() return 1 end },
  st.endpoint { name = "echo", params = { x = st.tensor_param {} },
                build = function(a) return a.x end },
  st.endpoint { name = "echo_int", params = { x = 0 }, build = function(a) return a.x end },
  st.endpoint { name = "module300", cache = true, build = function()
    local list = {}
    for i = 1, 300 do list[i] = { "layer" .. i, t(4) } end
    return st.module(list, { arch = "bench" })
  end },
  st.endpoint { name = "mmodule300", managed = true, cache = true, build = function()
    local list = {}
    for i = 1, 300 do list[i] = { "layer" .. i, t(4) } end
    return st.module(list, { arch = "bench" })
  end },
  st.endpoint { name = "slow", concurrency = "serialized",
                build = function() st.sleep(3600) return 1 end },
}
"""

# tasks.capacity of the server: the table info_full fills.
TASKS_FULL = 10000

PYTHON_ONLY = {"cached_kept_lib", "cached_dropped_nokeep"}
C_ONLY = {"managed_call", "release_only"}   # managed_release in its two parts

ROWS = [
    ("raw", "raw Unix-socket ping-pong 64 B (floor)"),
    ("ping", "ping"),
    ("cached_kept", "cached 16-float tensor, result kept"),
    ("cached_dropped", "the same, result dropped each call"),
    ("cached_dropped_nokeep", "the same, dropped, keep_results(0, 0)"),
    ("cached_kept_lib", "cached kept, Python through ctypes only"),
    ("fresh", "fresh 4-float tensor, call"),
    ("mcached_release", "managed cached call + release"),
    ("managed_release", "managed call, fresh result + release"),
    ("submit_wait", "submit + wait"),
    ("targ_4k", "tensor argument 4 KiB, returned"),
    ("int_arg", "the same call, an integer argument"),
    ("module300", "300-tensor module, mapping cached, again"),
    ("mmodule300_held_release", "managed 300-tensor module, held, + release"),
    ("info", "info()"),
    ("managed_call", "  managed fresh: the call alone (C)"),
    ("release_only", "  managed fresh: the release alone (C)"),
    ("info_full", "info(), task table full, one task waiting"),
]


def start_server(build, device, spin_us=None, loop_threads=None, budget=None, server=None):
    """stserver (`server`, default the build's) in a temp dir serving
    ENDPOINTS on `device`, tasks.capacity TASKS_FULL; budget (Lua text,
    the fields of memory_budget) replaces the default 256 MiB CPU (and
    1 GiB cuda:0). (dir, socket path, process)."""
    d = tempfile.mkdtemp(prefix="st-percall-")
    os.mkdir(os.path.join(d, "endpoints"))
    with open(os.path.join(d, "endpoints", "bench.lua"), "w") as f:
        f.write(ENDPOINTS)
    cfg = os.path.join(d, "config.lua")
    with open(cfg, "w") as f:
        f.write("return { base_path = %r, endpoints = %r, workers = 2, log_level = 'warn',\n"
                "  tasks = { capacity = %d },\n"
                "  default_device = %r, memory_budget = { %s }%s }\n"
                % (os.path.join(d, "st"), os.path.join(d, "endpoints"), TASKS_FULL,
                   "socket" if device == "cuda" else "cpu",
                   budget or "cpu = 256 * 2^20" + (', ["cuda:0"] = 2^30' if device == "cuda"
                                                  else ""),
                   ("" if spin_us is None else ", spin_us = %d" % spin_us) +
                   ("" if loop_threads is None else ", loop_threads = %d" % loop_threads)))
    log = open(os.path.join(d, "server.log"), "wb")
    proc = subprocess.Popen([server or os.path.join(build, "bin", "stserver"), "--config", cfg],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    sock = os.path.join(d, "st-0.sock")
    deadline = time.monotonic() + 20
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            with open(os.path.join(d, "server.log"), errors="replace") as f:
                tail = f.read()[-2000:]
            sys.exit("stserver did not start; %s/server.log ends:\n%s" % (d, tail))
        time.sleep(0.01)
    return d, sock, proc


def stop_server(d, proc):
    """Stops a start_server's stserver (SIGTERM, SIGKILL after 10 s) and
    removes its dir."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(d, ignore_errors=True)


def c_rows(build, sock, d, device, iters, keys):
    # The C rows use the library the Python rows use.
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.environ["ST_CLIENT_LIB"]))
    out = subprocess.run([os.path.join(build, "bench", "bench_percall"), "--socket", sock,
                          "--dir", d, "--device", device, "--iters", str(iters),
                          "--rows", ",".join(keys), "--tasks", str(TASKS_FULL)],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit("bench_percall (C) failed:\n" + out.stderr)
    rows = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 6 and f[0] == "row":
            rows[f[1]] = (float(f[3]), float(f[4]))
    return rows


def lua_rows(sock, iters, keys):
    """The rows of bench_percall.lua (st.client on LuaJIT), when luajit runs."""
    luajit = shutil.which("luajit")
    if not luajit:
        return {}
    out = subprocess.run([luajit, os.path.join(HERE, "bench_percall.lua"), sock, str(iters),
                          ",".join(keys)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench_percall.lua failed:\n" + out.stderr)
    rows = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "row":
            rows[f[1]] = (float(f[3]), float(f[4]))
    return rows


def python_rows(st, torch, sock, device, iters):
    """{key: function doing one call} on a fresh client, plus its teardown."""
    c = st.Client(path=sock)
    keep = {}

    def ping():
        c.ping()

    def cached():
        c.call("cached16")

    def fresh():
        c.call("fresh4")

    def managed(name):
        def f():
            with c.call(name):
                pass
        return f

    def submit_wait():
        c.wait(c.submit("quick"))

    x = st.empty(1024, dtype=torch.float32, device=device)

    def targ():
        c.call("echo", x=x)

    def int_arg():
        c.call("echo_int", x=1024)

    def module():
        c.call("module300")

    def info():
        c.info()

    def fill_tasks():
        """The table full, as bench_percall.c's info_full row makes it
        (when that row did not run first)."""
        t = c.info()["tasks"]
        if t["total"] >= TASKS_FULL and t["pending"] >= 1:
            return
        c.submit("slow")
        c.submit("slow")
        for _ in range(TASKS_FULL - 2):
            c.wait(c.submit("quick"))

    lib = st._lib.lib
    out, summary = ctypes.c_void_p(), st._lib.ResultSummary()
    out_ref, summary_ref = ctypes.byref(out), ctypes.byref(summary)

    lend = getattr(st._lib, "ST_CALL_LEND_SAME", None)

    def cached_lib():
        # The package's own crossing: a `same` reply lent (nothing to
        # free). A library older than ST_CALL_LEND_SAME: call + free.
        if lend is None:
            if lib.st_client_call_summary(c._ptr, b"cached16", None, out_ref, summary_ref) != 0:
                sys.exit("st_client_call_summary failed")
            lib.st_result_free(out.value)
            return
        if lib.st_client_call_summary(c._ptr, b"cached16", None, lend, out_ref, summary_ref) != 0:
            sys.exit("st_client_call_summary failed")
        if not summary.same:
            lib.st_result_free(out.value)

    def prepare(key):
        h = keep.get("h")
        if h is not None and getattr(h, "lease", False):
            h.release()
        keep.clear()
        if hasattr(st, "keep_results"):   # kept results: on but in one row
            st.keep_results(*((0, 0) if key == "cached_dropped_nokeep" else (8, 256 << 20)))
        if key in ("cached_kept", "cached_kept_lib"):
            keep["h"] = c.call("cached16")
        elif key == "module300":
            keep["h"] = c.call("module300")
        elif key == "mmodule300_held_release":
            keep["h"] = c.call("mmodule300")   # held, with its lease
        elif key == "info_full":
            fill_tasks()


    def reused(key):
        """Whether one more call of row `key` gives the kept result's own
        torch tensors (None for rows that keep nothing)."""
        h = keep.get("h")
        if key == "cached_kept" and h is not None:
            return c.call("cached16").value is h.value
        if key == "module300" and h is not None:
            again = c.call("module300").value.values()
            return all(a is b for a, b in zip(again, h.value.values()))
        if key == "mmodule300_held_release" and h is not None:
            with c.call("mmodule300") as again:
                return all(a is b for a, b in zip(again.value.values(), h.value.values()))
        return None

    fns = {"ping": ping, "cached_kept": cached, "cached_kept_lib": cached_lib,
           "cached_dropped": cached, "cached_dropped_nokeep": cached, "fresh": fresh,
           "mcached_release": managed("mcached16"), "managed_release": managed("managed16"),
           "submit_wait": submit_wait, "targ_4k": targ, "int_arg": int_arg,
           "module300": module, "mmodule300_held_release": managed("mmodule300"),
           "info": info, "info_full": info}
    return c, fns, prepare, reused


def measure(fn, iters):
    clock = time.perf_counter
    us = []
    for i in range(iters + 100):
        t0 = clock()
        fn()
        t1 = clock()
        if i >= 100:
            us.append((t1 - t0) * 1e6)
    us.sort()
    return us[len(us) // 2], us[int(len(us) * 0.99)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                    help="the build tree (bin/stserver, lib/, bench/bench_percall)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--spin-us", type=int, metavar="N",
                    help="the server's spin_us (default: the server's own default)")
    ap.add_argument("--loop-threads", type=int, metavar="N",
                    help="the server's loop_threads (default: the server's own default)")
    ap.add_argument("--profile", metavar="ROW", help="profile one Python row with cProfile")
    ap.add_argument("--server", metavar="STSERVER",
                    help="the stserver binary to measure (default: the build's bin/stserver)")
    ap.add_argument("--package", default=os.path.join(HERE, "..", "python"),
                    help="the directory holding the sharedtensor package (to compare versions; "
                         "$ST_CLIENT_LIB picks the library)")
    o = ap.parse_args()
    build = os.path.abspath(o.build)
    os.environ.setdefault("ST_CLIENT_LIB", os.path.join(build, "lib", "libstclient.so.0"))
    sys.path.insert(0, os.path.abspath(o.package))
    import torch
    import sharedtensor as st

    d, sock, proc = start_server(build, o.device, o.spin_us, o.loop_threads,
                                 server=o.server and os.path.abspath(o.server))
    try:
        c, fns, prepare, reused = python_rows(st, torch, sock, o.device, o.iters)
        if o.profile:
            import cProfile
            import pstats
            prepare(o.profile)
            fn = fns[o.profile]
            for _ in range(100):
                fn()
            cProfile.runctx("for _ in range(n): fn()", {}, {"fn": fn, "n": o.iters},
                            os.path.join(d, "prof"))
            pstats.Stats(os.path.join(d, "prof")).sort_stats("tottime").print_stats(25)
            return
        # Row by row, C then Lua then Python, so that each row meets the
        # server in the same state from every side (tasks kept, objects).
        crow, lrow, prow = c_rows(build, sock, d, o.device, o.iters, ["raw"]), {}, {}
        reuse = []
        for key, _ in ROWS[1:]:
            if key not in PYTHON_ONLY:
                crow.update(c_rows(build, sock, d, o.device, o.iters, [key]))
                if o.device == "cpu" and key not in C_ONLY:
                    lrow.update(lua_rows(sock, o.iters, [key]))
            if key in C_ONLY:
                continue
            n = o.iters // 4 if key.startswith(("module300", "mmodule300")) else o.iters
            prepare(key)
            gc.collect()
            prow[key] = measure(fns[key], max(n, 1))
            r = reused(key)
            if r is not None:
                reuse.append("%s %s" % (key, "yes" if r else "NO"))
            prepare(None)
        c.close()
        print("bench_percall: device %s, %d CPUs, %d iterations per row (module300: a quarter), "
              "torch %s, spin_us %s, loop_threads %s"
              % (o.device, os.cpu_count(), o.iters, torch.__version__,
                 "default" if o.spin_us is None else o.spin_us,
                 "default" if o.loop_threads is None else o.loop_threads))
        print("%-42s %10s %8s %10s %8s %10s %8s %7s %7s" % (
            "row (us)", "Python p50", "p99", "C p50", "p99", "Lua p50", "p99", "Py/C", "Lua/C"))
        for key, label in ROWS:
            cells = []
            for side in (prow, crow, lrow):
                v = side.get(key)
                cells.append("%10.1f %8.1f" % v if v else "%10s %8s" % ("", ""))
            cr = crow.get(key)
            for side in (prow, lrow):
                v = side.get(key)
                cells.append("%7.2f" % (v[0] / cr[0]) if v and cr and cr[0] > 0 else "%7s" % "")
            print("%-42s %s" % (label, " ".join(cells)))
        print("Python reused the kept result's torch tensors: " + ", ".join(reuse))
    finally:
        stop_server(d, proc)


if __name__ == "__main__":
    main()
