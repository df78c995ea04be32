"""bench_fresh: a fresh result's call from Python in a process that does
nothing else, next to ping (docs/benchmarks.md, "Per-call rows").

    python3 bench/bench_fresh.py [--build build] [--iters N] [--device cpu|cuda]

bench_percall.py measures the same `fresh4` endpoint (a 4-float tensor
built per call in the connection's result pool) row after row with C and
Lua clients on one server; this measures it alone, and splits what the
Python side adds:
  - the result dropped at once (the tensor dies inside the timed call);
  - results kept (64 at a time, so their frees fall outside most calls);
  - the same with Python's collector off;
  - as_torch=False (SharedTensor objects, no torch conversion).
Timings are printed, never asserted.
"""
import argparse
import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def percentiles(us):
    us.sort()
    n = len(us)
    return us[n // 2], us[n // 10], us[9 * n // 10]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--device", choices=("cpu", "cuda"), action="append")
    o = ap.parse_args()
    build = os.path.abspath(o.build)
    os.environ.setdefault("ST_CLIENT_LIB", os.path.join(build, "lib", "libstclient.so.0"))
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import bench_percall
    import torch
    import sharedtensor as st

    for dev in o.device or (["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]):
        d, sock, proc = bench_percall.start_server(build, dev, None, 1)
        c = st.Client(path=sock)
        keep = []

        def kept():
            keep.append(c.call("fresh4"))
            if len(keep) > 64:
                keep.clear()

        def run(label, fn):
            for _ in range(200):
                fn()
            us = []
            for _ in range(o.iters):
                t0 = time.perf_counter()
                fn()
                us.append((time.perf_counter() - t0) * 1e6)
            print("%-5s %-42s p50 %7.1f  p10 %7.1f  p90 %7.1f us" % ((dev, label) + percentiles(us)),
                  flush=True)

        try:
            run("ping", c.ping)
            run("fresh 4-float, dropped at once", lambda: c.call("fresh4"))
            run("fresh 4-float, kept (64 at a time)", kept)
            keep.clear()
            gc.disable()
            try:
                run("fresh 4-float, dropped, collector off", lambda: c.call("fresh4"))
            finally:
                gc.enable()
            run("fresh 4-float, as_torch=False", lambda: c.call("fresh4", as_torch=False))
        finally:
            c.close()
            bench_percall.stop_server(d, proc)


if __name__ == "__main__":
    main()
