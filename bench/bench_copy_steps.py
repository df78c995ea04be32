#!/usr/bin/env python3
"""bench_copy_steps: where an in-place update spends its time, step by
step, and the copy step alone (docs/benchmarks.md, "The batched copy
kernel").

    python3 bench/bench_copy_steps.py --build build [--device cpu|cuda]
                                      [--size 1G] [--iters 30]

Starts its own stserver and puts a live key: a bfloat16 state dict of
LLM shapes (bench_views' layout) as views of one allocation. Then:

  - update steps: an update of the key timed step by step (the seqlock's
    begin, queueing the copies, the stream synchronize, the end) next to
    torch's own copy of the same bytes (queueing, synchronize), and the
    whole Client.update, back to back, after 50 ms asleep and after 50 ms
    spinning in Python (the host's first driver calls after a pause are
    slow, torch's too);
  - the copy step alone: st_copy_ranges from the state dict into one
    torch allocation per tensor (no two ranges merge), with the driver
    asked about each range and with ST_COPY_DEVICE (CUDA only), next to
    one copy_ of all the bytes and a copy_ per tensor: host time
    (queueing included) and, on CUDA, the GPU time between events
    recorded around the call.

Every figure is a p50 over --iters rounds after a few warm ones. Timings
are printed, never asserted; CTest runs it on the CPU with a tiny size
(bench_copy_steps_smoke) so that it cannot rot.
"""
import argparse
import ctypes
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from bench_percall import start_server, stop_server  # noqa: E402
from bench_views import (GIB, copy_ways, device_args, fill, import_torch, layout,  # noqa: E402
                         llama_shapes, parse_size, size_text, views)

PAUSE = 0.05
WARM = 3
COPY_SYNC, COPY_DEVICE = 1, 2      # include/st/client.h: ST_COPY_SYNC, ST_COPY_DEVICE


def p50_us(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] * 1e6


def pause(how):
    """Nothing, 50 ms asleep, or 50 ms spinning in this thread."""
    if how == "asleep":
        time.sleep(PAUSE)
    elif how == "spinning":
        end = time.perf_counter() + PAUSE
        while time.perf_counter() < end:
            pass


class Setup:
    """The key's tensors, torch sources of the same layout, one torch
    allocation per tensor, and the device's synchronize."""

    def __init__(self, torch, st, device, size):
        self.torch, self.device = torch, device
        self.places, total = layout(llama_shapes(size))
        self.names = [name for name, _, _ in self.places]
        self.key_mem = views(st.empty((total,), dtype=torch.bfloat16, device=device),
                             self.places)
        self.src_flat = fill(torch.empty(total, dtype=torch.bfloat16, device=device))
        self.src = views(self.src_flat, self.places)
        self.dst_flat = torch.empty(total, dtype=torch.bfloat16, device=device)
        self.apart = {name: torch.empty(shape, dtype=torch.bfloat16, device=device)
                      for name, shape, _ in self.places}
        self.nbytes = sum(t.numel() for t in self.src.values()) * 2
        self.cuda = device != "cpu"
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.sync()


def update_steps(s, c, key, iters):
    """The update's steps, torch's copy and the whole Client.update, for
    each kind of pause before them."""
    from sharedtensor import into as _into
    torch = s.torch
    lk = c.live(key)
    fast = _into.ranges(_into.plan_of(lk.tensors), s.src)
    if fast is None:
        sys.exit("bench_copy_steps: the key's tensors do not match the sources")
    device, theirs, mine, sizes = fast
    copies = _into.Ranges(device, mine, theirs, sizes, None)
    stream_sync = torch.cuda.current_stream().synchronize if s.cuda else (lambda: None)
    for _ in range(WARM):
        c.update(key, s.src)
    print("update steps, p50 in us (%s, %d rounds)" % (size_text(s.nbytes), iters), flush=True)
    print("  %-13s %7s %7s %7s %7s %7s | %9s %9s %9s | %9s" % (
        "before each", "begin", "queue", "sync", "end", "total", "torch q", "torch sync",
        "torch all", "update()"), flush=True)
    for how in ("nothing", "asleep", "spinning"):
        t = {k: [] for k in ("begin", "queue", "sync", "end", "total", "tq", "ts", "tall", "upd")}
        for _ in range(iters):
            pause(how)
            t0 = time.perf_counter()
            lk.begin_update()
            t1 = time.perf_counter()
            copies.run()
            t2 = time.perf_counter()
            stream_sync()
            t3 = time.perf_counter()
            lk.end_update()
            t4 = time.perf_counter()
            for k, v in (("begin", t1 - t0), ("queue", t2 - t1), ("sync", t3 - t2),
                         ("end", t4 - t3), ("total", t4 - t0)):
                t[k].append(v)
            pause(how)
            t0 = time.perf_counter()
            s.dst_flat.copy_(s.src_flat)
            t1 = time.perf_counter()
            s.sync()
            t2 = time.perf_counter()
            t["tq"].append(t1 - t0)
            t["ts"].append(t2 - t1)
            t["tall"].append(t2 - t0)
            pause(how)
            t0 = time.perf_counter()
            c.update(key, s.src)
            t["upd"].append(time.perf_counter() - t0)
        label = {"nothing": "back to back", "asleep": "50 ms asleep",
                 "spinning": "50 ms spinning"}[how]
        print("  %-13s %7.1f %7.1f %7.1f %7.1f %7.1f | %9.1f %9.1f %9.1f | %9.1f" % (
            label, p50_us(t["begin"]), p50_us(t["queue"]), p50_us(t["sync"]), p50_us(t["end"]),
            p50_us(t["total"]), p50_us(t["tq"]), p50_us(t["ts"]), p50_us(t["tall"]),
            p50_us(t["upd"])), flush=True)
    lk.close()


def copy_step(s, iters):
    """st_copy_ranges into one allocation per tensor, both ways, next to
    torch's copies of the same bytes."""
    from sharedtensor import _lib
    torch = s.torch
    n = len(s.names)
    arr = ctypes.c_uint64 * n
    dst = arr(*[s.apart[k].data_ptr() for k in s.names])
    src = arr(*[s.src[k].data_ptr() for k in s.names])
    sizes = arr(*[s.src[k].numel() * 2 for k in s.names])
    ordinal = torch.device(s.device).index or 0 if s.cuda else -1
    err = ctypes.create_string_buffer(400)

    def ranges(flags):
        def go():
            rc = _lib.lib.st_copy_ranges(ordinal, dst, src, sizes, n, None, flags, err, len(err))
            if rc != 0:
                sys.exit("bench_copy_steps: st_copy_ranges: %s" % err.value.decode())
        return go

    ways = [("st_copy_ranges, checked per range", ranges(0))]
    if s.cuda:
        ways.append(("st_copy_ranges, ST_COPY_DEVICE", ranges(COPY_DEVICE)))
    ways += [("one copy_ of all the bytes", lambda: s.dst_flat.copy_(s.src_flat)),
             ("copy_ per tensor", lambda: [s.apart[k].copy_(s.src[k]) for k in s.names])]
    host = {w: [] for w, _ in ways}
    queue = {w: [] for w, _ in ways}
    gpu = {w: [] for w, _ in ways}
    for i in range(iters + WARM):
        for what, go in ways:               # in turns: one of each per round
            e0 = e1 = None
            if s.cuda:
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
            s.sync()
            t0 = time.perf_counter()
            if e0 is not None:
                e0.record()
            go()
            t1 = time.perf_counter()
            if e1 is not None:
                e1.record()
            s.sync()
            t2 = time.perf_counter()
            if i >= WARM:
                host[what].append(t2 - t0)
                queue[what].append(t1 - t0)
                if e0 is not None:
                    gpu[what].append(e0.elapsed_time(e1) * 1e-3)
    by_kernel, by_memcpy = copy_ways(lambda: (ranges(0)(), s.sync()))
    print("the copy step alone: %d tensors into one allocation each, p50 in us "
          "(one call: %d ranges by the copy kernel, %d by cuMemcpyAsync)"
          % (n, by_kernel, by_memcpy), flush=True)
    for what, _ in ways:
        g = "  gpu %9.1f" % p50_us(gpu[what]) if gpu[what] else ""
        print("  %-36s host %9.1f (queued in %7.1f)%s" % (what, p50_us(host[what]),
                                                          p50_us(queue[what]), g), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    device_args(ap)
    ap.add_argument("--size", default=None,
                    help="the state dict's size (default: 1G on cuda, 8M on cpu)")
    ap.add_argument("--iters", type=int, default=30, help="timed rounds of each row")
    a = ap.parse_args()
    torch = import_torch(a, "bench_copy_steps")
    import sharedtensor as st
    device = "cuda:0" if a.device == "cuda" else "cpu"
    size = parse_size(a.size or ("1G" if a.device == "cuda" else "8M"))
    if size > 4 * GIB:
        sys.exit("bench_copy_steps: --size at most 4G (the key, its sources and two copies "
                 "are held at once)")
    key_bytes = layout(llama_shapes(size))[1] * 2
    budget = ("cpu = %d" % (key_bytes + (256 << 20)) if a.device == "cpu" else
              'cpu = 256 * 2^20, ["cuda:0"] = %d' % (key_bytes + GIB))
    d, sock, proc = start_server(a.build, a.device, budget=budget)
    try:
        s = Setup(torch, st, device, size)
        print("bench_copy_steps on %s (%s): %d tensors, %s bfloat16" % (
            a.device, torch.cuda.get_device_name(0) if s.cuda else "host memory",
            len(s.names), size_text(s.nbytes)), flush=True)
        with st.Client(path=sock) as c:
            key = "bench/copy_steps"
            c.put(key, s.key_mem, live=True)
            update_steps(s, c, key, a.iters)
            c.delete(key)
        copy_step(s, a.iters)
    finally:
        stop_server(d, proc)


if __name__ == "__main__":
    main()
