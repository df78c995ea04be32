#!/usr/bin/env python3
"""bench_streams: named buffers (sharedtensor.buffer_create / buffer_open) from Python
next to C, each row next to its floor in the same run.

    python3 bench/bench_streams.py --build build [--device cpu|cuda] [--iters N]

Starts its own stserver (a temp dir, a small memory_budget), runs
build/bench/bench_streams (the C rows: memcpy floor, st_buffer write+read,
read_new wake-up p50/p99 between two processes) against it, then:
  - CPU, a 128x128 float32 frame: the floor (numpy copyto and torch copy_
    in and out again), then Buffer.write + Buffer.read(out=...) round
    trips with numpy arrays and with torch tensors, and read() with a new
    tensor each time, in kHz;
  - with --device cuda, a 1000x1000 float32 frame on cuda:0: the floor (a
    device-to-device copy_ and a stream synchronize, what cudaMemcpy
    costs), then Buffer.write of a device tensor and Buffer.read(out=) of
    one, in GB/s.
Timings are printed, never asserted (docs/streams.md, "Measured").
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from bench_percall import start_server, stop_server  # noqa: E402


def rate(what, n, seconds):
    print("%-44s %8.1f kHz   %6.2f us per round trip" % (what, n / seconds / 1e3,
                                                          seconds / n * 1e6))


def timed(fn, n):
    for _ in range(max(n // 10, 1)):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t0


def cpu_rows(st, sock, n):
    import numpy as np
    import torch
    src = np.arange(128 * 128, dtype=np.float32).reshape(128, 128)
    mid, dst = np.empty_like(src), np.empty_like(src)

    def floor_np():
        np.copyto(mid, src)
        np.copyto(dst, mid)
    rate("numpy copyto in + out (floor)", n, timed(floor_np, n))
    ts = torch.from_numpy(src.copy())
    tm, td = torch.empty_like(ts), torch.empty_like(ts)

    def floor_torch():
        tm.copy_(ts)
        td.copy_(tm)
    rate("torch copy_ in + out (floor)", n, timed(floor_torch, n))
    for fw, s, o in (("numpy", src, dst), ("torch", ts, td)):
        b = st.buffer_create("bench_py_%s" % fw, (128, 128), "float32", path=sock, framework=fw)
        write, read = b.write, b.read

        def rt():
            write(s)
            read(out=o)
        rate("Buffer write + read(out=) (%s)" % fw, n, timed(rt, n))
        if fw == "torch":
            def rt_new():
                write(s)
                read()
            rate("Buffer write + read() new tensor (torch)", n, timed(rt_new, n))
        b.unlink()
        b.close()


def gpu_rows(st, sock, n):
    import torch
    dev = torch.device("cuda:0")
    src = torch.rand(1000, 1000, device=dev)
    out = torch.empty_like(src)
    nbytes = src.numel() * 4

    def gbs(what, fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print("%-44s %8.1f GB/s   %6.1f us per frame" % (what, n * nbytes / dt / 1e9,
                                                         dt / n * 1e6))

    def floor():
        out.copy_(src)
        torch.cuda.current_stream().synchronize()
    gbs("copy_ + synchronize 1000x1000 f32 (floor)", floor)
    b = st.buffer_create("bench_gpu", (1000, 1000), "float32", device="cuda:0", path=sock)
    gbs("Buffer write (device tensor)", lambda: b.write(src))
    gbs("Buffer read(out=device tensor)", lambda: b.read(out=out))
    b.unlink()
    b.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="the build tree (bin/stserver, lib/, bench/)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--iters", type=int, default=100000)
    a = ap.parse_args()
    os.environ.setdefault("ST_CLIENT_LIB", os.path.join(a.build, "lib", "libstclient.so.0"))
    d, sock, proc = start_server(a.build, a.device)
    try:
        print("-- C (build/bench/bench_streams)", flush=True)
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.environ["ST_CLIENT_LIB"]))
        subprocess.run([os.path.join(a.build, "bench", "bench_streams"), "--socket", sock,
                        "--iters", str(a.iters)], env=env, check=True)
        import sharedtensor as st
        print("-- Python (sharedtensor %s)" % st.__version__, flush=True)
        cpu_rows(st, sock, a.iters)
        if a.device == "cuda":
            gpu_rows(st, sock, max(a.iters // 100, 100))
    finally:
        stop_server(d, proc)


if __name__ == "__main__":
    main()
