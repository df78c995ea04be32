#!/usr/bin/env python3
"""bench_views: loading a published state dict into caller-owned tensors
(Client.get_into, st_get_into) next to a plain copy of the same bytes, in
one run (docs/views.md, sections 2 and 5).

    python3 bench/bench_views.py --build build [--device cpu|cuda]
                                 [--sizes 1G,14G] [--iters N]

Starts its own stserver (a temp dir, a memory_budget that fits the largest
size). For each size, a publisher process puts a bfloat16 state dict of
LLM shapes (Llama-like: embedding, per layer q/k/v/o, gate/up/down and two
norms, lm_head; the layer count fits the size) as views of one allocation,
and exits. This process then times, into tensors it allocated with torch:

  - one copy (floor): one dst.copy_(src) of all the bytes between two
    torch allocations, then a synchronize: a plain device-to-device copy
    (cudaMemcpy) of the same bytes, the baseline of every ratio;
  - copy_ per tensor: the same bytes copied tensor by tensor between
    torch-allocated tensors of the state dict's shapes;
  - get_into, first: Client.get_into on a new client, the mapping of the
    key included;
  - get_into: again (the mapping kept, the version unchanged);
  - st_get_into (C): the library's one call (the copies of st_copy_ranges,
    one stream synchronize);
  - get_into into one torch allocation per tensor (no two copies merge:
    the batched copy kernel), with how many ranges went each way.

The four repeated rows are timed in turns, one of each per round, and
each prints the median of --iters rounds, with GB/s and the ratio to the
floor (target on CUDA: >= 80%).
Then a zero-copy shard request's latency (target 50 us) and an in-place
update of the state dict (a live key, up to 1 GiB) until 8 consumer
processes holding it saw the new version (target 1.25x the copy).

On the CPU (CI has no GPU) it runs with small sizes as a smoke test; CTest
runs it with tiny ones (bench_views_smoke) so that it cannot rot. Timings
are printed, never asserted.
"""
import argparse
import collections
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from bench_percall import start_server, stop_server  # noqa: E402

GIB = 1 << 30
ALIGN = 128          # elements (256 bytes of bfloat16) between tensors


def parse_size(text):
    """'14G', '512M', '64K' or bytes."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": GIB}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def size_text(n):
    for unit, m in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return "%.3g %s" % (n / m, unit)
    return "%d B" % n


def llama_shapes(target_bytes):
    """[(name, shape)] of a Llama-like bfloat16 state dict of about
    target_bytes: the width by size (4096 from 4 GiB, 2048 from 256 MiB,
    else 256), layers as many as fit (at least 1)."""
    if target_bytes >= 4 * GIB:
        h, i, v = 4096, 11008, 32000
    elif target_bytes >= 256 << 20:
        h, i, v = 2048, 5632, 32000
    else:
        h, i, v = 256, 688, 1024
    per_layer = 2 * (4 * h * h + 3 * h * i + 2 * h)
    fixed = 2 * (2 * v * h + h)
    layers = max(1, round((target_bytes - fixed) / per_layer))
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(layers):
        p = "model.layers.%d." % n
        out += [(p + "self_attn.%s_proj.weight" % x, (h, h)) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i)),
                (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def layout(shapes):
    """[(name, shape, offset)] in elements of one flat buffer, and its
    length: tensors 256-byte aligned, as a loader places them."""
    out, at = [], 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        out.append((name, shape, at))
        at += -(-n // ALIGN) * ALIGN
    return out, at


def views(flat, places):
    return collections.OrderedDict(
        (name, flat[off:off + _numel(shape)].view(shape)) for name, shape, off in places)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def fill(flat):
    """Random bfloat16 values (normal_ on the GPU; through float32 on the
    CPU, in chunks)."""
    import torch
    if flat.is_cuda:
        return flat.normal_()
    step = 1 << 24
    for at in range(0, flat.numel(), step):
        part = flat[at:at + step]
        part.copy_(torch.randn(part.numel()))
    return flat


def publish(sock, key, size, device):
    """--publish: puts key as views of one sharedtensor allocation, then
    exits (the server keeps the memory)."""
    import torch
    import sharedtensor as st
    places, total = layout(llama_shapes(size))
    flat = fill(st.empty((total,), dtype=torch.bfloat16, device=device))
    if device != "cpu":
        torch.cuda.synchronize()
    with st.Client(path=sock) as c:
        c.put(key, views(flat, places))


def timed(fn, sync):
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


class Ctx:
    """What each row gets: the socket, the device, the key, the caller's
    tensors (dst), torch-allocated sources of the same shapes (src), the
    bytes, --iters, a synchronize for the device and the floor's time."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def row(what, nbytes, seconds, floor):
    gbs = nbytes / seconds / 1e9
    ratio = "" if floor is None else "%6.0f%%" % (100.0 * floor / seconds)
    print("  %-40s %9.2f ms %9.1f GB/s %s" % (what, seconds * 1e3, gbs, ratio), flush=True)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _warm_median(ctx, go):
    for _ in range(3):      # warm: the GPU's clocks, the allocator
        go()
    ctx.sync()
    return _median([timed(go, ctx.sync) for _ in range(ctx.iters)])


def rows_copies(ctx):
    """The floor (one copy of all the bytes: cudaMemcpy on CUDA), copy_
    per tensor, get_into and st_get_into, timed in turns (one of each per
    round, --iters rounds, the median of each), so that the host's noise
    and the GPU's clocks fall on all of them alike. Sets ctx.floor."""
    import torch
    import sharedtensor as st
    from sharedtensor import _lib, targs

    def one_copy():
        ctx.dst_flat.copy_(ctx.src_flat)

    def per_tensor():
        for name, d in ctx.dst.items():
            d.copy_(ctx.src[name])

    keep, structs = [], (_lib.Tensor * len(ctx.dst))()
    for k, (name, d) in enumerate(ctx.dst.items()):
        (t, dims), _ = targs._from_torch(name, d)
        t.name = name.encode()
        keep.append(dims)
        structs[k] = t
    stream = torch.cuda.current_stream().cuda_stream if ctx.device == "cuda" else None
    with st.Client(path=ctx.sock) as py, st.Client(path=ctx.sock) as cc, \
            st.Client(path=ctx.sock) as apart:
        def c_get_into():
            # st_get_into through ctypes: one call, the copies on the
            # current stream and one synchronize (the library's)
            rc = _lib.lib.st_get_into(cc._ptr, ctx.key.encode(), 0, None, structs,
                                      len(ctx.dst), stream, None)
            if rc != 0:
                cc._fail(rc)

        for _ in range(3):
            one_copy()
        ctx.sync()
        first = timed(lambda: py.get_into(ctx.key, ctx.dst), ctx.sync)
        c_get_into()
        apart.get_into(ctx.key, ctx.dst_apart)
        turns = [("one copy of the bytes (floor)", one_copy),
                 ("copy_ per tensor, torch to torch", per_tensor),
                 ("get_into (mapping kept)", lambda: py.get_into(ctx.key, ctx.dst)),
                 ("st_get_into (C, mapping kept)", c_get_into),
                 ("get_into, one allocation per tensor",
                  lambda: apart.get_into(ctx.key, ctx.dst_apart))]
        took = {what: [] for what, _ in turns}
        for _ in range(ctx.iters):
            for what, go in turns:
                took[what].append(timed(go, ctx.sync))
        ways = copy_ways(lambda: apart.get_into(ctx.key, ctx.dst_apart))
    ctx.floor = _median(took[turns[0][0]])
    row(turns[0][0], ctx.nbytes, ctx.floor, None)
    row(turns[1][0], ctx.nbytes, _median(took[turns[1][0]]), ctx.floor)
    row("get_into, first (mapping included)", ctx.nbytes, first, ctx.floor)
    for what, _ in turns[2:]:
        row(what, ctx.nbytes, _median(took[what]), ctx.floor)
    if ctx.device == "cuda":
        print("  %-40s %d ranges by the copy kernel, %d by cuMemcpyAsync"
              % ("  (one allocation per tensor: per call)", ways[0], ways[1]), flush=True)


def copy_ways(go):
    """(ranges the batched copy kernel copied, ranges cuMemcpyAsync
    copied) during go() (st_copy_stats)."""
    import ctypes
    from sharedtensor import _lib
    before = [ctypes.c_uint64(), ctypes.c_uint64()]
    after = [ctypes.c_uint64(), ctypes.c_uint64()]
    _lib.lib.st_copy_stats(before[0], before[1])
    go()
    _lib.lib.st_copy_stats(after[0], after[1])
    return after[0].value - before[0].value, after[1].value - before[1].value


def row_shard_request(ctx):
    """A zero-copy shard request: `get` with a view that shards every
    tensor of the state dict (rank 1 of 8 along dim 0), a strided window
    of the same arena (target 50 us). Through the library (one
    st_client_get_view: the request, the server's rewrite of the
    descriptors, the reply decoded, the mapping already held) and through
    the package (get(view=): the same plus a torch tensor per tensor)."""
    import ctypes
    import torch
    import sharedtensor as st
    from sharedtensor import _lib
    view = b"*:shard(0,1,8)"
    n = 200
    # One tensor of its own key too: the largest 2-D weight but the
    # embedding's (a q_proj-like [hidden, hidden] one).
    name, big = max(((k, t) for k, t in ctx.dst.items() if t.dim() == 2 and "embed" not in k),
                    key=lambda kt: kt[1].numel())
    one = st.empty(tuple(big.shape), dtype=big.dtype, device=big.device)
    one.copy_(big)
    ctx.sync()
    with st.Client(path=ctx.sock) as c:
        c.put(ctx.key + "/one", {name: one})
        keep = [c.get(k, view=view.decode(), readonly=True)        # hold the mappings
                for k in (ctx.key, ctx.key + "/one")]
        out, got = ctypes.c_void_p(), ctypes.c_uint64()

        def lib_row(key, what):
            def call():
                rc = _lib.lib.st_client_get_view(c._ptr, key.encode(), 0, 1, view,
                                                 ctypes.byref(out), ctypes.byref(got))
                if rc != 0:
                    c._fail(rc)
                _lib.lib.st_result_free(out.value)
            us = []
            for i in range(n + 20):
                t0 = time.perf_counter()
                call()
                if i >= 20:
                    us.append((time.perf_counter() - t0) * 1e6)
            us.sort()
            print("  %-40s %9.1f us p50 %9.1f us p99 (C library)"
                  % (what, us[len(us) // 2], us[int(len(us) * 0.99)]), flush=True)
        lib_row(ctx.key + "/one", "zero-copy shard request, 1 tensor")
        lib_row(ctx.key, "the same, all %d tensors" % len(ctx.dst))
        us = []
        for i in range(n // 4 + 5):
            t0 = time.perf_counter()
            c.get(ctx.key, view=view.decode(), readonly=True)
            if i >= 5:
                us.append((time.perf_counter() - t0) * 1e6)
        us.sort()
        print("  %-40s %9.1f us p50 (torch tensors)" % ("all, through the package",
                                                        us[len(us) // 2]), flush=True)
        del keep
        c.delete(ctx.key + "/one")


CONSUMER = """
import json, sys, time
sys.path.insert(0, %(pkg)r)
import sharedtensor as st
c = st.Client(path=%(sock)r)
lk = c.live(%(key)r)
v, last, seen = lk.version, %(last)d, {}
print("ready", flush=True)
while v < last:
    if %(poll)r:                   # a rollout checking between forward passes
        got = lk.version
        while got <= v:
            got = lk.version
    else:                          # asleep in the futex until the version moves
        got = lk.wait_version(v + 1, timeout=120)
    now = time.monotonic()
    for k in range(v + 1, got + 1):
        seen[k] = now
    v = got
print(json.dumps(seen), flush=True)
"""


def _updates_seen(ctx, c, key, consumers, iters, poll, pause=0.05):
    """`iters` updates of key, `pause` seconds apart (0: back to back, the
    GPU and host kept busy), each seen by `consumers` processes: ([seconds
    each update took], [seconds from each update's start until the last
    consumer saw it])."""
    import json
    code = CONSUMER % {"pkg": os.path.join(HERE, "..", "python"), "sock": ctx.sock,
                       "key": key, "last": c.live(key).version + iters, "poll": poll}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              text=True) for _ in range(consumers)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                sys.exit("bench_views: a consumer did not start")
        began, took = {}, []
        for _ in range(iters):
            if pause:
                time.sleep(pause)
            t0 = time.monotonic()
            v = c.update(key, ctx.src)  # complete (synchronized) when it returns
            took.append(time.monotonic() - t0)
            began[v] = t0
        seen = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1])
                for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return took, [max(s[str(v)] for s in seen) - t0 for v, t0 in began.items()]


def row_bound_update(ctx, consumers=8):
    """An in-place update of the state dict (live key) seen by `consumers`
    processes that hold its tensors (LiveKey, the core of bind): from the
    start of Client.update (the copy, then the stream synchronize, then
    the version moves) until the last consumer saw the new version, next
    to the floor (target 1.25x) and to the same copy after the same 50 ms
    pause. Consumers either sleep in wait_version (the host's wake-up from
    idle included) or poll the version as a rollout does between forward
    passes. Sizes above 1 GiB are skipped (the key would be a second copy
    of the largest size under the budget)."""
    import torch
    import sharedtensor as st
    if ctx.nbytes > GIB + (GIB >> 4):
        print("  %-40s skipped above 1 GiB" % ("in-place update, %d consumers" % consumers),
              flush=True)
        return
    key = ctx.key + "/live"
    dev = "cuda:0" if ctx.device == "cuda" else "cpu"
    places, total = layout([(name, tuple(t.shape)) for name, t in ctx.dst.items()])
    mem = views(st.empty((total,), dtype=torch.bfloat16, device=dev), places)
    for name, t in mem.items():
        t.copy_(ctx.src[name])
    ctx.sync()
    iters = max(ctx.iters, 5)
    polling = (os.cpu_count() or 1) >= consumers + 2
    with st.Client(path=ctx.sock) as c:
        c.put(key, mem, live=True)
        took, waited = _updates_seen(ctx, c, key, consumers, iters, poll=False)
        polled = _updates_seen(ctx, c, key, consumers, iters, poll=True)[1] if polling else None
        busy = (_updates_seen(ctx, c, key, consumers, iters, poll=True, pause=0)[1]
                if polling else None)
        # The same update back to back, with no consumer and no pause: the
        # copy's own cost, the GPU kept busy as a training loop keeps it.
        again = _warm_median(ctx, lambda: c.update(key, ctx.src))
        # The same from one allocation per tensor, as a trainer's own
        # parameters are (no two copies merge).
        apart = _warm_median(ctx, lambda: c.update(key, ctx.dst_apart))
        c.delete(key)
    # The floor under the same conditions as the updates: after the same
    # pause (an idle GPU and host take longer to start a copy).
    paused = []
    for _ in range(iters):
        time.sleep(0.05)
        paused.append(timed(lambda: ctx.dst_flat.copy_(ctx.src_flat), ctx.sync))
    paused = _median(paused)
    row("update in place (Client.update)", ctx.nbytes, _median(took), ctx.floor)
    row("update in place, back to back", ctx.nbytes, again, ctx.floor)
    row("the same from one allocation per tensor", ctx.nbytes, apart, ctx.floor)
    row("one copy of the bytes after 50 ms idle", ctx.nbytes, paused, None)
    for how, visible in (("waiting", waited), ("polling", polled),
                         ("polling, back to back", busy)):
        what = "seen by all %d consumers %s" % (consumers, how)
        if visible is None:
            print("  %-40s skipped (needs %d CPUs)" % (what, consumers + 2), flush=True)
            continue
        t = _median(visible)
        print("  %-40s %9.2f ms %9.1f GB/s %6.2fx the floor, %.2fx the copy after idle"
              % (what, t * 1e3, ctx.nbytes / t / 1e9, t / ctx.floor, t / paused), flush=True)


ROWS = [rows_copies, row_shard_request, row_bound_update]


def run_size(a, sock, size, n):
    import torch
    key = "bench/views/%d" % n
    places, total = layout(llama_shapes(size))
    env = dict(os.environ)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--publish", key, "--socket", sock,
                    "--device", a.device, "--sizes", str(size)], check=True, env=env)
    dev = "cuda:0" if a.device == "cuda" else "cpu"
    # Destinations laid out as the key is (one allocation), and one
    # allocation per tensor, as a module's parameters often are.
    dst_apart = collections.OrderedDict(
        (name, torch.empty(shape, dtype=torch.bfloat16, device=dev)) for name, shape, _ in places)
    dst_flat = torch.empty(total, dtype=torch.bfloat16, device=dev)
    src_flat = fill(torch.empty(total, dtype=torch.bfloat16, device=dev))
    dst, src = views(dst_flat, places), views(src_flat, places)
    nbytes = sum(_numel(s) for _, s, _ in places) * 2
    print("%s: %d tensors, %s bfloat16 (%d layers)" %
          (size_text(size), len(places), size_text(nbytes),
           sum(1 for name, _, _ in places if name.endswith("q_proj.weight"))), flush=True)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    ctx = Ctx(sock=sock, device=a.device, key=key, dst=dst, src=src, nbytes=nbytes,
              dst_flat=dst_flat[:nbytes // 2], src_flat=src_flat[:nbytes // 2], dst_apart=dst_apart,
              iters=a.iters, sync=sync, floor=None)
    for r in ROWS:
        r(ctx)
    import sharedtensor as st
    with st.Client(path=sock) as c:
        c.delete(key)
    del ctx, dst, src, dst_flat, src_flat, dst_apart
    if a.device == "cuda":
        torch.cuda.empty_cache()


def device_args(ap):
    """--build and --device, as the torch benches take them."""
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                    help="the build tree (bin/stserver, lib/)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda when torch sees a GPU, else cpu")


def import_torch(a, name):
    """torch, once the package is pointed at the build's library and
    a.device is set (cuda when torch sees a GPU); exits 77 (CTest's
    skipped) where torch is not installed."""
    os.environ.setdefault("ST_CLIENT_LIB", os.path.join(a.build, "lib", "libstclient.so.0"))
    try:
        import torch
    except ImportError:
        print("%s: torch is not installed; skipped" % name)
        sys.exit(77)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    device_args(ap)
    ap.add_argument("--sizes", default=None,
                    help="state dict sizes, e.g. 1G,14G (default: 1G,14G on cuda, 8M,32M on cpu)")
    ap.add_argument("--iters", type=int, default=10, help="timed repetitions of each row")
    ap.add_argument("--publish", metavar="KEY", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch = import_torch(a, "bench_views")
    if a.publish:
        publish(a.socket, a.publish, parse_size(a.sizes), a.device)
        return
    sizes = [parse_size(s) for s in (a.sizes or ("1G,14G" if a.device == "cuda" else "8M,32M"))
             .split(",")]
    largest = max(layout(llama_shapes(s))[1] * 2 for s in sizes)
    live = min(largest, GIB + (GIB >> 4))      # row_bound_update's key
    budget = ("cpu = %d" % (largest + live + (256 << 20)) if a.device == "cpu" else
              'cpu = 256 * 2^20, ["cuda:0"] = %d' % (largest + live + GIB))
    d, sock, proc = start_server(a.build, a.device, budget=budget)
    try:
        print("bench_views on %s (%s), %d iterations per row" %
              (a.device, torch.cuda.get_device_name(0) if a.device == "cuda" else "host memory",
               a.iters), flush=True)
        for n, size in enumerate(sizes):
            run_size(a, sock, size, n)
    finally:
        stop_server(d, proc)


if __name__ == "__main__":
    main()
